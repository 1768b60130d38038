//! Helpers for the integration tests: build test programs, run gpuflame, read folded stacks.
#![allow(dead_code)]

pub mod agent;
pub mod bounded;
pub mod cuda;
pub mod receiver;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

pub const GPUFLAME: &str = env!("CARGO_BIN_EXE_gpuflame");

/// These tests load real BPF programs; without root and BTF they fail, saying why.
pub fn require_bpf() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test loads BPF programs and must run as root (euid is {euid}); run the suite with sudo");
    assert!(
        Path::new("/sys/kernel/btf/vmlinux").exists(),
        "this test needs kernel BTF at /sys/kernel/btf/vmlinux (a kernel built with CONFIG_DEBUG_INFO_BTF=y)"
    );
}

/// Compiles tests/programs/NAME.c with `flags` into `dir`.
pub fn build_c(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(format!("{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("a C compiler (cc) is needed to build the test programs");
    assert!(out.status.success(), "compiling {name}.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// Frame-pointer builds of the test programs, as the CPU-profile tests need them.
pub const FP_FLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"];

pub fn gpuflame(args: &[&str]) -> Output {
    Command::new(GPUFLAME).args(args).output().expect("running gpuflame")
}

/// Runs gpuflame and fails the test, with its output, unless it exits with `code`.
pub fn gpuflame_ok(args: &[&str], code: i32) -> Output {
    let out = gpuflame(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "gpuflame {args:?} exited with {:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One folded line: frames root first (the first is the command name) and its count.
#[derive(Debug, Clone)]
pub struct Stack {
    pub frames: Vec<String>,
    pub count: u64,
}

impl Stack {
    pub fn comm(&self) -> &str {
        &self.frames[0]
    }

    /// User frames, root first (everything after the command name that is not a kernel frame).
    pub fn user(&self) -> Vec<&str> {
        self.frames[1..].iter().filter(|f| !f.ends_with("_[k]")).map(String::as_str).collect()
    }

    pub fn kernel(&self) -> Vec<&str> {
        self.frames[1..].iter().filter(|f| f.ends_with("_[k]")).map(|f| f.trim_end_matches("_[k]")).collect()
    }

    /// Kernel frames come after every user frame, as the folded format puts them.
    pub fn kernel_below_user(&self) -> bool {
        let first_kernel = self.frames.iter().position(|f| f.ends_with("_[k]")).unwrap_or(self.frames.len());
        self.frames[first_kernel..].iter().all(|f| f.ends_with("_[k]"))
    }

    /// The stack stopped where the program's files were not known to the unwinder yet: its maps
    /// not read, or a table not loaded (marked at the root). A program started with the
    /// recording has such stacks for its first ~10-200 ms, depending on the machine's load.
    pub fn before_tables(&self) -> bool {
        matches!(self.user().first(), Some(&"[native: unwind table not loaded yet]" | &"[native: unknown code]"))
    }

    pub fn has_sequence(&self, seq: &[&str]) -> bool {
        let user = self.user();
        user.windows(seq.len()).any(|w| w == seq)
    }
}

pub fn parse_folded(text: &str) -> Vec<Stack> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, count) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad folded line {l:?}"));
            Stack {
                frames: stack.split(';').map(str::to_string).collect(),
                count: count.parse().unwrap_or_else(|_| panic!("bad count in {l:?}")),
            }
        })
        .collect()
}

pub fn read_folded(path: &Path) -> Vec<Stack> {
    parse_folded(&std::fs::read_to_string(path).expect("reading the folded output"))
}

pub fn total(stacks: &[Stack]) -> u64 {
    stacks.iter().map(|s| s.count).sum()
}

pub fn describe(stacks: &[Stack]) -> String {
    let mut v: Vec<_> = stacks.iter().collect();
    v.sort_by_key(|s| std::cmp::Reverse(s.count));
    v.iter().take(15).map(|s| format!("{} {}", s.frames.join(";"), s.count)).collect::<Vec<_>>().join("\n")
}

/// A `gpuflame -v record …` that runs in the background; `start` returns once sampling runs
/// (loading every process's unwind tables takes a while in a debug build).
pub struct Recording {
    pub child: std::process::Child,
    reader: Option<std::thread::JoinHandle<String>>,
}

impl Recording {
    pub fn start(args: &[&str]) -> Recording {
        Self::start_with_env(args, &[])
    }

    /// The same, with environment variables set (a name with no value: removed).
    pub fn start_with_env(args: &[&str], env: &[(&str, Option<&str>)]) -> Recording {
        let mut command = Command::new(GPUFLAME);
        for (name, value) in env {
            match value {
                Some(v) => command.env(name, v),
                None => command.env_remove(name),
            };
        }
        let mut child = command.arg("-v").args(args).stderr(std::process::Stdio::piped()).spawn().expect("running gpuflame");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
                if line.contains("unwind tables loaded") {
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the recording did not start");
        Recording { child, reader: Some(reader) }
    }

    /// Waits for the end; the exit status and everything gpuflame wrote to stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().expect("waiting for gpuflame");
        let stderr = self.reader.take().map(|r| r.join().unwrap_or_default()).unwrap_or_default();
        (status, stderr)
    }
}

/// A child process killed and reaped when the test lets go of it, even on a failed assertion.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The control process `comm` (tests/programs/chain.c) has at least `min` samples, and 95% of
/// them carry main;a;b;c; see [`complete_once_tables_are_in`].
pub fn control_samples_complete(stacks: &[Stack], comm: &str, min: u64) {
    let control: Vec<Stack> = stacks.iter().filter(|s| s.comm() == comm).cloned().collect();
    assert!(total(&control) >= min, "expected samples of the control process {comm}, got {}", total(&control));
    complete_once_tables_are_in(&control, &["main", "a", "b", "c"]);
}

/// The samples of `stacks` marked as taken before their program's tables were in, which must be
/// at most 15% of them.
pub fn samples_before_tables(stacks: &[Stack]) -> u64 {
    let (all, early) = (total(stacks), stacks.iter().filter(|s| s.before_tables()).map(|s| s.count).sum::<u64>());
    assert!(early * 100 <= all * 15, "{early} of {all} samples before the tables were in:\n{}", describe(stacks));
    early
}

/// 95% of `stacks` carry `seq`, not counting those marked as taken before the program's tables
/// were in (a matter of how soon they come, which depends on the machine's load: 34 samples of
/// 393 in one CI run, 0-3 on a quiet machine), and those are at most 15%.
pub fn complete_once_tables_are_in(stacks: &[Stack], seq: &[&str]) {
    let all = total(stacks);
    let early = samples_before_tables(stacks);
    let good: u64 = stacks.iter().filter(|s| !s.before_tables() && s.has_sequence(seq)).map(|s| s.count).sum();
    eprintln!("{good} of {all} samples carry {}; {early} before the tables", seq.join(";"));
    assert!(good * 100 >= (all - early) * 95, "only {good} of {all} samples carry {} ({early} before the tables):\n{}", seq.join(";"), describe(stacks));
}
