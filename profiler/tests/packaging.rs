//! The ways gpuflame is installed, checked without building them: deploy/Dockerfile (no container
//! engine runs in CI, so it is linted here), the DaemonSet and systemd unit that run the agent
//! (their arguments parsed by the binary), and scripts that must need nothing outside the
//! repository. No BPF, no root.

use std::path::{Path, PathBuf};
use std::process::Command;

const GPUFLAME: &str = env!("CARGO_BIN_EXE_gpuflame");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// One Dockerfile instruction: the keyword and the rest, continuation lines joined.
struct Instruction {
    line: usize,
    keyword: String,
    rest: String,
}

fn instructions(text: &str) -> Vec<Instruction> {
    let mut out: Vec<Instruction> = Vec::new();
    let mut pending: Option<Instruction> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        // Comments may sit between continuation lines too; Docker drops them.
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (body, continued) = match trimmed.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (trimmed, false),
        };
        match pending.as_mut() {
            Some(i) => {
                i.rest.push(' ');
                i.rest.push_str(body);
            }
            None => {
                let (keyword, rest) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
                pending = Some(Instruction { line: n + 1, keyword: keyword.to_string(), rest: rest.trim().to_string() });
            }
        }
        if !continued {
            out.extend(pending.take());
        }
    }
    assert!(pending.is_none(), "the Dockerfile ends in a continuation line");
    out
}

/// `--flag=value` options first, then the words (no quoting: none of ours needs it).
fn flags_and_words(rest: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut flags = Vec::new();
    let mut words = Vec::new();
    for w in rest.split_whitespace() {
        match w.strip_prefix("--").and_then(|f| f.split_once('=')) {
            Some((k, v)) if words.is_empty() => flags.push((k.to_string(), v.to_string())),
            _ => words.push(w.to_string()),
        }
    }
    (flags, words)
}

/// `*` matching within one path component, as COPY's wildcards do.
fn glob_matches(pattern: &str, path: &str) -> bool {
    let (p, s) = (pattern.split('/').collect::<Vec<_>>(), path.split('/').collect::<Vec<_>>());
    p.len() == s.len()
        && p.iter().zip(&s).all(|(p, s)| {
            let parts: Vec<&str> = p.split('*').collect();
            if parts.len() == 1 {
                return p == s;
            }
            let (first, last) = (parts[0], parts[parts.len() - 1]);
            let mut rest = match s.strip_prefix(first).and_then(|r| r.strip_suffix(last)) {
                Some(r) if s.len() >= first.len() + last.len() => r,
                _ => return false,
            };
            parts[1..parts.len() - 1].iter().all(|mid| match rest.find(mid) {
                Some(at) => {
                    rest = &rest[at + mid.len()..];
                    true
                }
                None => false,
            })
        })
}

#[test]
fn the_dockerfile_builds_the_packaged_binary_into_an_agent_image() {
    const KNOWN: &[&str] = &[
        "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL",
        "HEALTHCHECK", "SHELL",
    ];
    let text = read("deploy/Dockerfile");
    let ignored: Vec<String> = read(".dockerignore").lines().map(|l| l.trim().trim_matches('/').to_string()).filter(|l| !l.is_empty()).collect();
    assert!(ignored.iter().any(|l| l == "target"), "the build context would carry target/ (gigabytes): .dockerignore should name it");

    // (name, WORKDIR, RUN commands, ENV lines) of each stage.
    let mut stages: Vec<(String, String, Vec<String>, Vec<String>)> = Vec::new();
    let mut copies_from = Vec::new();
    let mut copied_here = Vec::new();
    let mut entrypoint = None;
    for i in instructions(&text) {
        let at = format!("deploy/Dockerfile:{}: {} {}", i.line, i.keyword, i.rest);
        assert!(KNOWN.contains(&i.keyword.as_str()), "unknown instruction (or not upper case) at {at}");
        if i.keyword == "FROM" {
            let words: Vec<&str> = i.rest.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            assert!(words.len() == 3 && words[1].eq_ignore_ascii_case("AS"), "a stage without a name (FROM IMAGE AS NAME) at {at}");
            assert!(stages.iter().all(|s| s.0 != words[2]), "stage {} named twice", words[2]);
            stages.push((words[2].to_string(), "/".into(), Vec::new(), Vec::new()));
            continue;
        }
        assert!(!stages.is_empty(), "{at} comes before any FROM");
        let last = stages.len() - 1;
        let (earlier, stage) = stages.split_at_mut(last);
        let stage = &mut stage[0];
        match i.keyword.as_str() {
            "WORKDIR" => stage.1 = i.rest.clone(),
            "RUN" => stage.2.push(i.rest.clone()),
            "ENV" | "ARG" => stage.3.push(i.rest.clone()),
            "ENTRYPOINT" => entrypoint = Some((stage.0.clone(), i.rest.clone())),
            "COPY" | "ADD" => {
                let (flags, words) = flags_and_words(&i.rest);
                assert!(words.len() >= 2, "{at}: sources and a destination");
                let (sources, dest) = words.split_at(words.len() - 1);
                match flags.iter().find(|(k, _)| k == "from") {
                    Some((_, from)) => {
                        let earlier = earlier.iter().find(|s| &s.0 == from).unwrap_or_else(|| panic!("{at}: no stage {from} before it"));
                        copies_from.push((earlier.clone(), sources.to_vec(), dest[0].clone(), stage.0.clone()));
                    }
                    None => {
                        for src in sources {
                            let path = src.trim_start_matches("./").trim_end_matches('/');
                            assert!(!path.contains('*') && !path.contains(".."), "{at}: {src} should be a plain path in the repository");
                            assert!(path == "." || repo().join(path).exists(), "{at}: {src} is not in the repository");
                            let top = path.split('/').next().unwrap();
                            assert!(!ignored.iter().any(|l| l == top), "{at}: {src} is left out of the context by .dockerignore");
                            copied_here.push(path.to_string());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    assert!(stages.len() >= 2, "a builder stage and a runtime stage");

    // The builder has every workspace member (cargo reads them all) and what package.sh packs.
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    for needed in members.iter().map(|m| m.as_str().unwrap()).chain(["Cargo.toml", "Cargo.lock", "scripts", "README.md", "deploy"]) {
        assert!(copied_here.iter().any(|c| c == needed || c == "."), "the builder does not copy {needed}");
    }

    // The runtime stage takes the binary package.sh makes, from where package.sh makes it.
    let package = read("scripts/package.sh");
    let naming = ["target=${CARGO_TARGET_DIR:-$root/target}", "out=\"$target/package\"", "name=\"gpuflame-$version-$(uname -m)-linux\"", "\"$out/$name/gpuflame\""];
    for line in naming {
        assert!(package.contains(line), "scripts/package.sh no longer has {line}: update this test and deploy/Dockerfile with it");
    }
    let runtime = stages.last().unwrap().0.clone();
    let binary = copies_from.iter().find(|c| c.3 == runtime && c.1.iter().any(|s| s.ends_with("/gpuflame")));
    let binary = binary.expect("the runtime stage copies the gpuflame binary from the builder");
    let ((builder, workdir, runs, env), sources, dest, _) = binary;
    assert!(runs.iter().any(|r| r.split_whitespace().any(|w| w == "scripts/package.sh")), "stage {builder} does not run scripts/package.sh");
    assert!(env.iter().all(|e| !e.contains("CARGO_TARGET_DIR")), "stage {builder} moves the target directory: {env:?}");
    let produced = format!("{}/target/package/gpuflame-{VERSION}-x86_64-linux/gpuflame", workdir.trim_end_matches('/'));
    assert!(glob_matches(&sources[0], &produced), "the runtime copies {} but {builder} makes {produced}", sources[0]);
    assert_eq!(dest, "/usr/local/bin/gpuflame");

    // The builder installs what setup-build.sh would, so that package.sh installs nothing.
    let setup = read("scripts/setup-build.sh");
    let wanted = setup.lines().find_map(|l| l.trim().strip_prefix("for pkg in")?.split(';').next()).expect("the package list of setup-build.sh");
    let install = runs.iter().find(|r| r.contains("apt-get install")).expect("the builder installs the build dependencies");
    for pkg in wanted.split_whitespace() {
        assert!(install.split_whitespace().any(|w| w == pkg), "the builder does not install {pkg}, which scripts/setup-build.sh wants");
    }

    // Exec form, so that the agent is PID 1 and gets the SIGTERM that flushes its queue.
    let (stage, entry) = entrypoint.expect("an ENTRYPOINT");
    assert_eq!(stage, runtime, "the ENTRYPOINT is not in the last stage");
    let entry: Vec<String> = serde_json::from_str(&entry).unwrap_or_else(|e| panic!("ENTRYPOINT {entry} is not exec-form JSON: {e}"));
    assert_eq!(entry, ["gpuflame", "agent"], "the DaemonSet's args follow `gpuflame agent`");
}

/// The list under `key:` (`- item` lines, more indented) in a YAML document, quotes removed.
fn yaml_list(doc: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = doc.lines().collect();
    let start = lines.iter().position(|l| l.trim() == format!("{key}:")).unwrap_or_else(|| panic!("no {key}: in\n{doc}"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    lines[start + 1..]
        .iter()
        .take_while(|l| indent(l) > indent(lines[start]) && l.trim_start().starts_with("- "))
        .map(|l| l.trim_start()[2..].trim().trim_matches('"').to_string())
        .collect()
}

/// Runs `gpuflame ARGS --print-config` with /etc/gpuflame standing for `etc`.
fn print_config(args: &[String], etc: &Path) -> String {
    let args: Vec<String> = args.iter().map(|a| a.replace("/etc/gpuflame", etc.to_str().unwrap())).collect();
    let out = Command::new(GPUFLAME).args(&args).arg("--print-config").env("GPUFLAME_HOSTNAME", "node-1").output().unwrap();
    assert!(out.status.success(), "gpuflame {args:?} --print-config: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_daemonset_runs_the_image_with_arguments_and_a_config_the_agent_accepts() {
    let yaml = read("deploy/daemonset.yaml");
    let docs: Vec<&str> = yaml.split("\n---").collect();
    let doc = |kind: &str| *docs.iter().find(|d| d.contains(&format!("kind: {kind}\n"))).unwrap_or_else(|| panic!("no {kind}"));
    let ds = doc("DaemonSet");
    let image = ds.lines().find_map(|l| l.trim().strip_prefix("image:")).expect("an image").trim();
    assert_eq!(image.rsplit_once(':').map(|t| t.1), Some(VERSION), "the DaemonSet's image is not this version's ({VERSION})");
    let dockerfile = read("deploy/Dockerfile");
    assert!(dockerfile.contains(&format!("-t {image} ")), "deploy/Dockerfile does not say how to build {image}");
    assert!(read("README.md").contains(image), "the README does not say how to build {image}");

    // The ConfigMap's agent.toml, where the DaemonSet mounts it.
    assert!(ds.contains("mountPath: /etc/gpuflame,") && ds.contains("configMap: {name: gpuflame-agent}"), "{ds}");
    let cm = doc("ConfigMap");
    let lines: Vec<&str> = cm.lines().collect();
    let key = lines.iter().position(|l| l.trim() == "agent.toml: |").expect("agent.toml in the ConfigMap");
    let body: Vec<&str> = lines[key + 1..].iter().take_while(|l| l.starts_with("    ") || l.trim().is_empty()).map(|l| l.get(4..).unwrap_or("")).collect();
    let etc = tempfile::tempdir().unwrap();
    std::fs::write(etc.path().join("agent.toml"), body.join("\n")).unwrap();

    let mut args = vec!["agent".to_string()];
    args.extend(yaml_list(ds, "args"));
    let config = print_config(&args, etc.path());
    let wanted = ["server = \"http://pyroscope.monitoring.svc:4040\"", "metrics_addr = \"0.0.0.0:9464\"", "spool_dir = \"/var/lib/gpuflame/spool\""];
    for want in wanted.into_iter().chain(["\"cluster\" = \"my-cluster\""]) {
        assert!(config.contains(want), "{want} not in the effective settings:\n{config}");
    }
}

#[test]
fn the_systemd_unit_runs_arguments_the_agent_accepts() {
    let unit = read("deploy/gpuflame-agent.service");
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let mut words = exec.split_whitespace().map(str::to_string);
    assert_eq!(words.next().as_deref(), Some("/usr/local/bin/gpuflame"), "the README installs the binary there");
    let etc = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("deploy/agent.toml"), etc.path().join("agent.toml")).unwrap();
    let config = print_config(&words.collect::<Vec<_>>(), etc.path());
    assert!(config.contains("metrics_addr = \"127.0.0.1:9464\""), "{config}");
}

/// The README's first command sets up from this repository alone (see tests/first_run.rs).
#[test]
fn the_build_setup_needs_nothing_outside_the_repository() {
    let setup = read("scripts/setup-build.sh");
    for (n, line) in setup.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with('#')) {
        assert!(!line.contains("..") && !line.contains("shared"), "scripts/setup-build.sh:{}: {line}", n + 1);
    }
}
