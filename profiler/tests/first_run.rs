//! A user's first run (issues #13, #58): a clone of this repository in a directory with nothing
//! beside it, with what earlier test set-ups installed hidden, runs the README's main command
//! (`scripts/gpuflame record -o flame.svg -- python3 examples/demo.py`) and gets a flame graph
//! with Python, native and kernel frames in it; then the whole-machine command beside it
//! (`scripts/gpuflame record -d 5 -o flame.svg`), which gets samples. Run as root: the command
//! loads BPF programs.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().expect("git is needed to clone the repository");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The tooltips of the flame graph's frames, `name (1,234 samples, 12.5%)` each.
fn svg_titles(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse_with_options(svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).expect("well-formed XML");
    assert!(doc.root_element().has_tag_name("svg"), "not an SVG document");
    doc.descendants().filter(|n| n.has_tag_name("title")).filter_map(|n| n.text()).map(str::to_string).collect()
}

/// The samples of the flame graph's root frame, whose tooltip reads `all (1,234 samples, 100%)`.
fn svg_samples(svg: &str) -> u64 {
    let titles = svg_titles(svg);
    let title = titles.iter().find(|t| t.starts_with("all (")).expect("a root frame");
    let count = title["all (".len()..].split(' ').next().unwrap().replace(',', "");
    count.parse().unwrap_or_else(|_| panic!("root frame {title:?}"))
}

#[test]
fn the_readmes_first_command_works_in_a_bare_clone() {
    require_bpf();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The committed tree is what a user clones: changes not yet committed are not in it.
    let head = git(repo, &["rev-parse", "HEAD"]);
    let dir = tempfile::tempdir().unwrap();
    let clone = dir.path().join("gpuflame");
    git(dir.path(), &["clone", "--quiet", repo.to_str().unwrap(), clone.to_str().unwrap()]);
    git(&clone, &["checkout", "--quiet", "--detach", &head]);

    // A clone builds everything from scratch, in release: minutes on two cores. Its target
    // directory is kept between runs (cargo's tmp directory of this build, not the clone) so that
    // only the first run pays for the dependencies; the workspace's own crates are rebuilt every
    // time (a fresh clone's files are all new). The registry cache (CARGO_HOME) is not something
    // the product needs, so it stays too.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("first-run-target");

    // What a user has: the system's PATH and Rust, nothing of ours. Earlier test set-ups (Debian's
    // Pythons in /opt/gpuflame-pythons, …) are hidden under an empty /opt in a mount namespace of
    // the command's own; the clone's parent holds nothing else, so there is no ../shared.
    let mut path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string();
    let cargo = std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| d.join("cargo").is_file()));
    if let Some(cargo) = cargo {
        path = format!("{}:{path}", cargo.display());
    }
    let mut command = Command::new("unshare");
    command.env_clear().env("PATH", &path).env("CARGO_TARGET_DIR", &target);
    for keep in ["HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"] {
        if let Some(v) = std::env::var_os(keep) {
            command.env(keep, v);
        }
    }
    let script = r#"mount -t tmpfs -o mode=0755 gpuflame-first-run /opt && cd "$1" && scripts/gpuflame record -o flame.svg -- python3 examples/demo.py && exec scripts/gpuflame record -d 5 -o machine.svg"#;
    let started = std::time::Instant::now();
    let out = command.args(["--mount", "--propagation", "private", "sh", "-c", script, "sh"]).arg(&clone).output().expect("unshare (util-linux) is needed");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("first run: {:.0} s\n{output}", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "the README's commands exited with {:?}:\n{output}", out.status);
    // Minutes of building are not silent: the script says so, then cargo shows its progress.
    assert!(output.contains("gpuflame: building the release binary") && output.contains("Compiling gpuflame"), "the build was silent:\n{output}");

    // The demo's graph: its Python functions, zlib's deflate under them, the kernel's getrandom.
    let svg = std::fs::read_to_string(clone.join("flame.svg")).unwrap_or_else(|e| panic!("no flame.svg in the clone ({e}):\n{output}"));
    let titles = svg_titles(&svg);
    for (what, frame) in [("Python", "compress_batch (demo.py"), ("Python", "fresh_batch (demo.py"), ("native", "deflate"), ("kernel", "sys_getrandom")] {
        assert!(titles.iter().any(|t| t.contains(frame)), "no {what} frame {frame:?} in the demo's flame graph ({} samples):\n{output}", svg_samples(&svg));
    }
    // The whole machine's, beside it.
    let svg = std::fs::read_to_string(clone.join("machine.svg")).unwrap_or_else(|e| panic!("no machine.svg in the clone ({e}):\n{output}"));
    let samples = svg_samples(&svg);
    assert!(samples > 0, "a flame graph without samples:\n{output}");
    let beside = dir.path().join("shared");
    assert!(!output.contains("../shared") && !output.contains(beside.to_str().unwrap()), "the first run looked outside the clone:\n{output}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "the first run wrote beside the clone");
}
