//! Names for stripped programs: from a separate debug file (build-id directory and debug link),
//! from MiniDebugInfo, and from a local debuginfod; a debuginfod that is down or silent costs a
//! recording at most a second and one warning. Run as root; needs binutils, xz and debuginfod
//! (scripts/setup.sh).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpuflame_elfread::{consts, ElfFile};

/// Runs a shell command in `dir`, failing the test with its output.
fn sh(dir: &Path, script: &str) {
    let out = Command::new("bash").arg("-ec").arg(script).current_dir(dir).output().expect("running bash");
    assert!(
        out.status.success(),
        "`{script}` failed (binutils and xz-utils come with scripts/setup.sh):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A build-id no other file on this machine has: each run's programs are new builds.
fn fresh_build_id(variant: u8) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    format!("{nanos:016x}{:08x}{variant:02x}{:014x}", std::process::id(), nanos.rotate_left(17) >> 8)
}

/// tests/programs/chain.c built as `name` with its own build-id, with symbols and DWARF.
fn build_chain(dir: &Path, name: &str, variant: u8) -> (PathBuf, String) {
    let id = fresh_build_id(variant);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/chain.c");
    let exe = dir.join(name);
    let out = Command::new("cc").args(FP_FLAGS).arg(format!("-Wl,--build-id=0x{id}")).arg("-o").arg(&exe).arg(&src).output().expect("a C compiler (cc)");
    assert!(out.status.success(), "compiling chain.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
    (exe, id)
}

fn sections(exe: &Path) -> Vec<(String, u32)> {
    let data = std::fs::read(exe).unwrap();
    let elf = ElfFile::parse(&data[..]).unwrap();
    elf.sections().iter().map(|s| (s.name.clone(), s.kind)).collect()
}

fn assert_stripped(exe: &Path, has: &[&str], lacks: &[&str]) {
    let s = sections(exe);
    assert!(!s.iter().any(|(_, k)| *k == consts::SHT_SYMTAB), "{} still has a symbol table", exe.display());
    for name in has {
        assert!(s.iter().any(|(n, _)| n == name), "{} lacks {name}", exe.display());
    }
    for name in lacks {
        assert!(!s.iter().any(|(n, _)| n == name), "{} has {name}", exe.display());
    }
}

/// (a) debug info moved to DEBUG/.build-id/xx/rest.debug, linked by .gnu_debuglink.
fn split_to_build_id_dir(dir: &Path, exe: &Path, id: &str, debug: &Path) {
    let target = debug.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let (e, t) = (exe.display(), target.display());
    sh(dir, &format!("objcopy --only-keep-debug {e} {t}; strip -s {e}; objcopy --add-gnu-debuglink={t} {e}"));
    assert_stripped(exe, &[".gnu_debuglink"], &[".gnu_debugdata"]);
}

/// (b) MiniDebugInfo, the recipe of gdb's manual: the function symbols that .dynsym lacks, as an
/// xz-compressed ELF in .gnu_debugdata.
fn add_minidebuginfo(dir: &Path, exe: &Path) {
    let e = exe.display();
    sh(
        dir,
        &format!(
            "nm -D {e} --format=posix --defined-only | awk '{{print $1}}' | sort > dynsyms
             nm {e} --format=posix --defined-only | awk '{{ if ($2 == \"T\" || $2 == \"t\") print $1 }}' | sort > funcsyms
             comm -13 dynsyms funcsyms > keep_symbols
             objcopy --only-keep-debug {e} mini.full
             objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols=keep_symbols mini.full mini
             strip --strip-all -R .comment {e}
             rm -f mini.xz; xz mini
             objcopy --add-section .gnu_debugdata=mini.xz {e}"
        ),
    );
    assert_stripped(exe, &[".gnu_debugdata"], &[".gnu_debuglink"]);
}

/// (c) debug info only where a debuginfod serves it from: SERVED/NAME.debug.
fn split_for_debuginfod(dir: &Path, exe: &Path, served: &Path) {
    std::fs::create_dir_all(served).unwrap();
    let e = exe.display();
    let t = served.join(format!("{}.debug", exe.file_name().unwrap().to_string_lossy()));
    sh(dir, &format!("objcopy --only-keep-debug {e} {}; strip -s {e}", t.display()));
    assert_stripped(exe, &[], &[".gnu_debuglink", ".gnu_debugdata"]);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The HTTP status of a GET, or None when nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// `debuginfod -F DIR` on 127.0.0.1, once it serves `build_id`.
struct Debuginfod {
    child: Child,
    port: u16,
}

impl Debuginfod {
    fn start(served: &Path, db: &Path, build_id: &str) -> Debuginfod {
        let port = free_port();
        let child = Command::new("debuginfod")
            .arg("-F")
            .arg(served)
            .args(["-p", &port.to_string(), "-d"])
            .arg(db)
            // No federation: it serves what it indexed, nothing from the internet.
            .env_remove("DEBUGINFOD_URLS")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("debuginfod is needed (Debian's debuginfod package; scripts/setup.sh installs it)");
        let server = Debuginfod { child, port };
        let path = format!("/buildid/{build_id}/debuginfo");
        let deadline = Instant::now() + HANG;
        while http_status(port, &path) != Some(200) {
            assert!(Instant::now() < deadline, "debuginfod on port {port} did not serve {path}");
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Samples of `comm` in the folded output, and how many of those carry main;a;b;c. The
/// programs ran once their tables were in ([`Gate`]): a stack that is not named is not named.
fn named_chain(stacks: &[Stack], comm: &str) -> (u64, u64) {
    let mine: Vec<Stack> = stacks.iter().filter(|s| s.comm() == comm).cloned().collect();
    let named = mine.iter().filter(|s| s.has_sequence(&["main", "a", "b", "c"])).map(|s| s.count).sum();
    (total(&mine), named)
}

#[test]
fn stripped_programs_are_named_from_debug_files_minidebuginfo_and_debuginfod() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let debug = d.join("debug");
    let served = d.join("served");
    let (link, link_id) = build_chain(d, "sym_link", 1);
    let (mini, _) = build_chain(d, "sym_mini", 2);
    let (dfd, dfd_id) = build_chain(d, "sym_dfd", 3);
    split_to_build_id_dir(d, &link, &link_id, &debug);
    add_minidebuginfo(d, &mini);
    split_for_debuginfod(d, &dfd, &served);
    let server = Debuginfod::start(&served, &d.join("debuginfod.sqlite"), &dfd_id);

    let script = format!("{} 3 & {} 3 & {} 3 & wait", link.display(), mini.display(), dfd.display());
    let record = |out: &Path, debug_dir: &Path, urls: Option<&str>| {
        let cache = d.join(format!("cache-{}", out.file_name().unwrap().to_string_lossy()));
        let gate = Gate::new(d, &format!("gate-{}", out.file_name().unwrap().to_str().unwrap()));
        let env = [("XDG_CACHE_HOME", cache.to_str()), ("DEBUGINFOD_URLS", urls), gate.env_var()];
        let args = ["record", "-F", "199", "--debug-dir", debug_dir.to_str().unwrap(), "-o", out.to_str().unwrap(), "--", "sh", "-c", &script];
        let recording = Recording::start_with_env(&args, &env);
        gate.open_when_ready(&recording, &gate.arrivals(3));
        let (status, stderr) = recording.finish();
        assert!(status.success(), "gpuflame {args:?}: {status:?}\n{stderr}");
        read_folded(out)
    };

    // Without the debug directory and the server, nothing names the two whose debug info is
    // elsewhere: their names below come from what each of them points to.
    let bare = record(&d.join("bare.folded"), &d.join("empty"), None);
    let url = format!("http://127.0.0.1:{}", server.port);
    let named = record(&d.join("named.folded"), &debug, Some(&url));
    for comm in ["sym_link", "sym_mini", "sym_dfd"] {
        let (all, with_names) = named_chain(&bare, comm);
        println!("{comm} without debug info: {with_names} of {all} samples (once its tables were in) named main;a;b;c");
        assert!(all >= 50, "expected up to 600 samples of {comm} (fewer on a busy machine), got {all}:\n{}", describe(&bare));
        if comm == "sym_mini" {
            // Its MiniDebugInfo is inside the file (checked above: no .symtab, a .gnu_debugdata),
            // so it is named from that with no debug directory or server at all.
            assert!(with_names * 100 >= all * 95, "only {with_names} of {all} samples of {comm} named from its MiniDebugInfo:\n{}", describe(&bare));
        } else {
            assert_eq!(with_names, 0, "{comm} is stripped, yet named without its debug info:\n{}", describe(&bare));
        }
        let (all, with_names) = named_chain(&named, comm);
        println!("{comm} with debug info: {with_names} of {all} samples (once its tables were in) named main;a;b;c");
        assert!(all >= 50, "expected up to 600 samples of {comm} (fewer on a busy machine), got {all}:\n{}", describe(&named));
        assert!(with_names * 100 >= all * 95, "only {with_names} of {all} samples of {comm} carry main;a;b;c:\n{}", describe(&named));
    }
    // The download went to the cache, under the build-id.
    let cached = d.join("cache-named.folded/gpuflame/debuginfod").join(&dfd_id).join("debuginfo");
    assert!(cached.is_file(), "{} is missing", cached.display());
}

/// A TCP listener that never accepts: connections complete (the kernel's backlog) and then no
/// byte ever comes.
fn silent_server() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

#[test]
fn debuginfod_down_or_silent_costs_one_bounded_wait_and_one_warning() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (dfd, _) = build_chain(d, "sym_dfd", 4);
    split_for_debuginfod(d, &dfd, &d.join("served"));
    let (_silent, silent_port) = silent_server();
    let down_port = free_port();
    let empty = d.join("empty");

    // The end of a recording waits for downloads still running until one deadline (0.8 s),
    // whatever the number of files and servers; a server that never answers is said once.
    // How long a recording takes is the machine's business: only a hang fails the test
    // (Recording::finish), and which warning comes says whether the wait ended at the deadline.
    for (what, port) in [("none configured", None), ("down", Some(down_port)), ("silent", Some(silent_port))] {
        let gate = Gate::new(d, &format!("gate-{}", what.replace(' ', "-")));
        let target = gate.spawn(Command::new(&dfd).arg("60"));
        let out = d.join(format!("{}.folded", what.replace(' ', "-")));
        let cache = d.join(format!("cache-{}", what.replace(' ', "-")));
        let url = port.map(|p| format!("http://127.0.0.1:{p}"));
        let pid = target.0.id().to_string();
        let args = ["record", "-p", &pid, "-d", "3", "--debug-dir", empty.to_str().unwrap(), "-o", out.to_str().unwrap()];
        let recording = Recording::start_with_env(&args, &[("DEBUGINFOD_URLS", url.as_deref()), ("XDG_CACHE_HOME", cache.to_str())]);
        gate.open_when_ready(&recording, &[target.0.id()]);
        let (status, stderr) = recording.finish();
        drop(target);
        assert!(status.success(), "{stderr}");

        let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN") && l.contains("debuginfod")).collect();
        let (all, with_names) = named_chain(&read_folded(&out), "sym_dfd");
        println!("debuginfod {what}: {} warnings; {with_names} of {all} samples named", warnings.len());
        assert!(all >= 50, "expected up to 600 samples (fewer on a busy machine), got {all}");
        assert_eq!(with_names, 0, "no server has the debug info, yet the program was named");
        let expected = usize::from(port.is_some());
        assert_eq!(warnings.len(), expected, "debuginfod {what}: expected {expected} warning(s):\n{stderr}");
        if what == "silent" {
            // Not the download's own stall timeout (15 s), which would end a wait without one.
            assert!(warnings[0].contains("debuginfod has not answered in time"), "the end did not stop waiting at its deadline:\n{stderr}");
        }
    }
}
