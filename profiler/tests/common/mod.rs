//! Helpers for the integration tests: build test programs, run gpuflame, read folded stacks.
#![allow(dead_code)]

pub mod agent;
pub mod bounded;
pub mod cuda;
mod folded;
pub mod others;
pub mod receiver;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

// Each test binary uses some of these: the rest would be unused imports there.
#[allow(unused_imports)]
pub use folded::{describe, parse_folded, read_folded, total, Stack};

pub const GPUFLAME: &str = env!("CARGO_BIN_EXE_gpuflame");

/// gpuflame acts as if the kernel lacked these BPF features (`gpuflame_bpf::PRETEND_VAR`): the
/// older ways a kernel before them takes are tested on this one.
pub const PRETEND_KERNEL_LACKS: &str = "GPUFLAME_PRETEND_KERNEL_LACKS";

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

/// tests/programs, where the test programs and their gate (gate.h, gate.py) are.
pub fn program_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").to_str().unwrap().to_string()
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
    gpuflame_env_ok(args, &[], code)
}

/// The same, with environment variables for gpuflame.
pub fn gpuflame_env_ok(args: &[&str], env: &[(&str, &str)], code: i32) -> Output {
    let out = Command::new(GPUFLAME).args(args).envs(env.iter().copied()).output().expect("running gpuflame");
    assert_eq!(
        out.status.code(),
        Some(code),
        "gpuflame {args:?} exited with {:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A `gpuflame -v record …` that runs in the background; `start` returns once sampling runs
/// (loading every process's unwind tables takes a while in a debug build).
pub struct Recording {
    pub child: std::process::Child,
    log: std::sync::Arc<Log>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// What gpuflame wrote to stderr so far, and whether it ended.
#[derive(Default)]
struct Log {
    lines: std::sync::Mutex<(Vec<String>, bool)>,
    grew: std::sync::Condvar,
}

impl Log {
    /// Waits for a line that `found` accepts, or for the end; true when found. Only a hang
    /// runs out `limit`: what is waited for comes in well under a second on a quiet machine.
    fn wait_for(&self, limit: std::time::Duration, found: impl Fn(&str) -> bool) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut guard = self.lines.lock().unwrap();
        let mut seen = 0;
        loop {
            if guard.0[seen..].iter().any(|l| found(l)) {
                return true;
            }
            seen = guard.0.len();
            let now = std::time::Instant::now();
            if guard.1 || now >= deadline {
                return false;
            }
            guard = self.grew.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().0.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// How long a test waits for what a recording reports before it calls the recording hung.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(120);

impl Recording {
    pub fn start(args: &[&str]) -> Recording {
        Self::start_with_env(args, &[])
    }

    /// The same, with environment variables set (a name with no value: removed).
    pub fn start_with_env(args: &[&str], env: &[(&str, Option<&str>)]) -> Recording {
        let mut command = Command::new(GPUFLAME);
        // -v, and the lines that say when a process's tables are in (see `wait_ready`).
        command.env("RUST_LOG", "info,gpuflame::ready=debug");
        for (name, value) in env {
            match value {
                Some(v) => command.env(name, v),
                None => command.env_remove(name),
            };
        }
        let mut child = command.arg("-v").args(args).stderr(std::process::Stdio::piped()).spawn().expect("running gpuflame");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(Log::default());
        let writer = log.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
                writer.lines.lock().unwrap().0.push(line);
                writer.grew.notify_all();
            }
            writer.lines.lock().unwrap().1 = true;
            writer.grew.notify_all();
        });
        let recording = Recording { child, log, reader: Some(reader) };
        assert!(recording.log.wait_for(HANG, |l| l.contains("unwind tables loaded")), "the recording did not start:\n{}", recording.log.text());
        recording
    }

    /// Waits for a line of the log that contains `needle`; its position among the lines.
    pub fn wait_for_line(&self, needle: &str) -> usize {
        assert!(self.log.wait_for(HANG, |l| l.contains(needle)), "the recording never said {needle:?} (it ended or hung):\n{}", self.log.text());
        self.position(needle).unwrap()
    }

    /// Everything the recording wrote to stderr so far.
    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// The position of the first line of the log so far that contains `needle`.
    pub fn position(&self, needle: &str) -> Option<usize> {
        self.log.lines.lock().unwrap().0.iter().position(|l| l.contains(needle))
    }

    /// Waits until the recording says every file `pid` maps now has its unwind table in: its
    /// stacks are whole from then on. The process must not map more code meanwhile (it waits
    /// at a [`Gate`]): the report names how many executable mappings it covers, and only one
    /// of the mappings as they are now counts.
    pub fn wait_ready(&self, pid: u32) -> usize {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_else(|e| panic!("pid {pid}'s maps: {e}"));
        let mappings = maps.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.as_bytes().get(2) == Some(&b'x'))).count();
        let line = format!("unwind tables ready pid={pid} mappings={mappings}");
        let found = self.log.wait_for(HANG, |l| l.ends_with(&line));
        assert!(found, "the recording never said {line:?} (it ended or hung):\n{}", self.log.text());
        self.log.lines.lock().unwrap().0.iter().position(|l| l.ends_with(&line)).unwrap()
    }

    /// Ends the recording as Ctrl-C does, and waits for the end (see [`Self::finish`]).
    pub fn interrupt(self) -> (std::process::ExitStatus, String) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.finish()
    }

    /// Waits for the end; the exit status and everything gpuflame wrote to stderr. A recording
    /// still running [`HANG`] after its own end was asked for (its duration, its command's exit
    /// or a signal) is killed, and the test fails: it hung.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = wait_bounded(&mut self.child, HANG).unwrap_or_else(|| panic!("the recording still ran {HANG:?} after it was due to end (hung):\n{}", self.log.text()));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.log.text())
    }
}

/// Waits for the child; None if it runs past `limit` (it is killed then).
pub fn wait_bounded(child: &mut Child, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A recording that a failed test let go of is killed, not left to profile the rest of the suite.
impl Drop for Recording {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Holds test programs at the start of their work until the recording has their tables
/// (tests/programs/gate.h, and `gate()` in the Python programs): each program that reaches it
/// with GPUFLAME_TEST_GATE=PATH set creates PATH.PID, then waits for PATH to exist.
pub struct Gate {
    pub path: PathBuf,
}

impl Gate {
    /// A closed gate in a directory DIR/NAME of its own, which programs of any user may reach.
    pub fn new(dir: &Path, name: &str) -> Gate {
        use std::os::unix::fs::PermissionsExt;
        let home = dir.join(name);
        std::fs::create_dir(&home).unwrap_or_else(|e| panic!("{}: {e}", home.display()));
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
        Gate { path: home.join("open") }
    }

    pub fn env(&self) -> (&'static str, &str) {
        ("GPUFLAME_TEST_GATE", self.path.to_str().unwrap())
    }

    /// The same, as [`Recording::start_with_env`] takes it.
    pub fn env_var(&self) -> (&'static str, Option<&str>) {
        ("GPUFLAME_TEST_GATE", Some(self.path.to_str().unwrap()))
    }

    fn arrived(&self) -> Vec<u32> {
        std::fs::read_dir(self.path.parent().unwrap())
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("open.")?.parse().ok())
            .collect()
    }

    /// The pids of the first `n` programs to reach the gate.
    pub fn arrivals(&self, n: usize) -> Vec<u32> {
        let deadline = std::time::Instant::now() + HANG;
        loop {
            let pids = self.arrived();
            if pids.len() >= n {
                return pids;
            }
            assert!(std::time::Instant::now() < deadline, "{} of {n} programs reached the gate", pids.len());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Starts `command` with the gate in its environment, once it waits there.
    pub fn spawn(&self, command: &mut Command) -> Killed {
        let child = Killed(command.env(self.env().0, self.env().1).spawn().expect("starting a test program"));
        let deadline = std::time::Instant::now() + HANG;
        while !self.arrived().contains(&child.0.id()) {
            assert!(std::time::Instant::now() < deadline, "{command:?} did not reach the gate");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child
    }

    /// Lets the programs at the gate go on, once `recording` has the tables of each.
    pub fn open_when_ready(&self, recording: &Recording, pids: &[u32]) {
        for &pid in pids {
            recording.wait_ready(pid);
        }
        std::fs::write(&self.path, b"").unwrap();
    }
}

/// `gpuflame -v record ARGS` with `programs` test programs (the command, or processes waiting
/// at `gate` already) held at the gate until the recording has their tables; the exit status and
/// stderr.
pub fn record_gated(gate: &Gate, args: &[&str], programs: usize) -> (std::process::ExitStatus, String) {
    record_gated_with_env(gate, args, programs, &[])
}

/// The same, with environment variables for gpuflame and the command it starts.
pub fn record_gated_with_env(gate: &Gate, args: &[&str], programs: usize, env: &[(&str, Option<&str>)]) -> (std::process::ExitStatus, String) {
    let env: Vec<(&str, Option<&str>)> = [gate.env_var()].into_iter().chain(env.iter().copied()).collect();
    let recording = Recording::start_with_env(args, &env);
    let pids = gate.arrivals(programs);
    gate.open_when_ready(&recording, &pids);
    recording.finish()
}

/// utime + stime of a live process, in seconds: a program's samples follow its CPU time, which
/// a loaded machine stretches out over more wall time.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_comm = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map(|f| f.iter().filter_map(|x| x.parse::<f64>().ok()).sum()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Waits until `pid` has used `seconds` more of CPU time than it had at the call.
pub fn wait_cpu(pid: u32, seconds: f64) {
    wait_cpu_all(&[pid], seconds);
}

/// Waits until each of `pids` has used `seconds` more of CPU time than it had at the call.
pub fn wait_cpu_all(pids: &[u32], seconds: f64) {
    let deadline = std::time::Instant::now() + HANG;
    let start: Vec<f64> = pids.iter().map(|&p| cpu_seconds(p)).collect();
    for (&pid, start) in pids.iter().zip(start) {
        while cpu_seconds(pid) < start + seconds {
            assert!(std::time::Instant::now() < deadline, "pid {pid} did not get {seconds} s of CPU");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// `gpuflame -v record ARGS` (with no duration) ended by Ctrl-C once `pid` has used `seconds`
/// of CPU time: as many samples of it on a loaded machine as on a quiet one.
pub fn record_for_cpu(args: &[&str], pid: u32, seconds: f64) -> (std::process::ExitStatus, String) {
    record_for_cpu_all(args, &[pid], seconds)
}

/// The same, until each of `pids` has used `seconds` of CPU time.
pub fn record_for_cpu_all(args: &[&str], pids: &[u32], seconds: f64) -> (std::process::ExitStatus, String) {
    let recording = Recording::start(args);
    wait_cpu_all(pids, seconds);
    recording.interrupt()
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
/// them carry main;a;b;c; see [`complete`].
pub fn control_samples_complete(stacks: &[Stack], comm: &str, min: u64) {
    let control: Vec<Stack> = stacks.iter().filter(|s| s.comm() == comm).cloned().collect();
    assert!(total(&control) >= min, "expected samples of the control process {comm}, got {}", total(&control));
    complete(&control, &["main", "a", "b", "c"]);
}

/// 95% of `stacks` carry `seq`: the program did its work once the recording had its tables
/// ([`Gate`]), so none of its samples came before them.
pub fn complete(stacks: &[Stack], seq: &[&str]) {
    let all = total(stacks);
    let good: u64 = stacks.iter().filter(|s| s.has_sequence(seq)).map(|s| s.count).sum();
    eprintln!("{good} of {all} samples carry {}", seq.join(";"));
    assert!(good * 100 >= all * 95, "only {good} of {all} samples carry {}:\n{}", seq.join(";"), describe(stacks));
}

/// The interpreters: pyenv's 3.8 to 3.13, Debian's python3.11, and Debian's 3.13, 3.14 and 3.15 that
/// scripts/setup.sh installs.
pub fn python_interpreters() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for minor in 8..=13 {
        let found = std::fs::read_dir("/root/.pyenv/versions").ok().and_then(|d| {
            d.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("3.{minor}.")))).max()
        });
        v.push(found.map(|p| p.join(format!("bin/python3.{minor}"))).unwrap_or_else(|| PathBuf::from(format!("/root/.pyenv/versions/3.{minor}.x/bin/python3.{minor}"))));
    }
    v.push(PathBuf::from("/usr/bin/python3.11"));
    let debian = std::env::var("GPUFLAME_TEST_PYTHONS").unwrap_or_else(|_| "/opt/gpuflame-pythons".into());
    for minor in [13, 14, 15] {
        v.push(Path::new(&debian).join(format!("3.{minor}/usr/bin/python3.{minor}")));
    }
    v
}
