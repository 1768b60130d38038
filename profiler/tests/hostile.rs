//! Files that unprivileged users control, read by gpuflame running as root: truncated while
//! they are read, or replaced by a FIFO at the path of a mapped executable. gpuflame must
//! survive, end on time, and keep profiling everything else. Run as root.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn control_samples_complete(stacks: &[Stack], comm: &str, min: u64) {
    let control: Vec<Stack> = stacks.iter().filter(|s| s.comm() == comm).cloned().collect();
    let all: u64 = control.iter().map(|s| s.count).sum();
    let good: u64 = control.iter().filter(|s| s.has_sequence(&["main", "a", "b", "c"])).map(|s| s.count).sum();
    assert!(all >= min, "expected samples of the control process {comm}, got {all}");
    assert!(good * 100 >= all * 95, "only {good} of {all} samples of {comm} carry main;a;b;c:\n{}", describe(&control));
}

#[test]
fn files_truncated_while_read_do_not_crash_gpuflame() {
    require_bpf();
    let dir = tempfile::Builder::new().prefix("gpuflame-trunc-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let truncator = build_c(dir.path(), "truncator", &["-O2"]);
    let control = Killed(Command::new(build_c(dir.path(), "chain", FP_FLAGS)).arg("60").spawn().unwrap());
    // A big real ELF file: gpuflame's own debug build (over 100 MiB, MiBs of .eh_frame).
    let big = dir.path().join("big.elf");
    std::fs::copy(GPUFLAME, &big).unwrap();
    std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o644)).unwrap();
    let rounds = 8;
    let hostile = Killed(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&truncator)
            .arg(&big)
            .arg(dir.path())
            .arg(rounds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) is needed"),
    );
    let (hostile_pid, control_pid) = (hostile.0.id().to_string(), control.0.id().to_string());
    let out = dir.path().join("trunc.folded");
    let recording = Recording::start(&["record", "-F", "99", "-d", "14", "-p", &hostile_pid, "-p", &control_pid, "-o", out.to_str().unwrap()]);
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let (status, stderr) = recording.finish();
    let mut hostile = hostile;
    let mut report = String::new();
    hostile.0.stdout.take().unwrap().read_to_string(&mut report).unwrap();
    let hostile_status = hostile.0.wait().unwrap();
    assert!(status.success(), "gpuflame did not survive the truncated files ({status:?}):\n{stderr}\ntruncator:\n{report}");
    assert!(hostile_status.success(), "the truncator failed ({hostile_status:?}):\n{report}");
    let opened = report.lines().filter(|l| l.contains("opened by another process")).count();
    eprintln!("{report}");
    assert_eq!(report.lines().count(), rounds, "{report}");
    assert!(opened * 2 >= rounds, "gpuflame read only {opened} of {rounds} copies: the race was not run\n{report}");
    control_samples_complete(&read_folded(&out), "chain", 300);
}

/// Waits for the child; None if it runs past `limit` (it is killed then).
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        sleep(Duration::from_millis(100));
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo {}", path.display());
}

#[test]
fn deleted_executable_replaced_by_a_fifo_does_not_hang_the_recording() {
    require_bpf();
    let dir = tempfile::Builder::new().prefix("gpuflame-fifo-").tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    // Two victims: one named like a Python interpreter, which gpuflame inspects for CPython.
    let mut victims = Vec::new();
    for name in ["victim", "python3.11"] {
        let exe = dir.path().join(name);
        std::fs::copy(&chain, &exe).unwrap();
        let child = Killed(Command::new(&exe).arg("60").spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{}/maps", child.0.id())).unwrap_or_default().contains(exe.to_str().unwrap()) {
            assert!(Instant::now() < deadline, "{name} did not start");
            sleep(Duration::from_millis(20));
        }
        std::fs::remove_file(&exe).unwrap();
        mkfifo(&exe);
        victims.push(child);
    }
    let out = dir.path().join("fifo.folded");
    let pids: Vec<String> = victims.iter().map(|v| v.0.id().to_string()).collect();
    let mut args = vec!["record", "-F", "199", "-d", "3", "-o", out.to_str().unwrap()];
    for pid in &pids {
        args.extend(["-p", pid]);
    }
    let mut gpuflame = Command::new(GPUFLAME).args(&args).stderr(Stdio::piped()).spawn().unwrap();
    let status = wait_bounded(&mut gpuflame, Duration::from_secs(90));
    let mut stderr = String::new();
    if let Some(mut e) = gpuflame.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = status.unwrap_or_else(|| panic!("a 3 s recording still ran after 90 s: hung on the FIFO\n{stderr}"));
    assert!(status.success(), "{status:?}:\n{stderr}");
    // The deleted programs are still named, from the mapped files.
    let stacks = read_folded(&out);
    control_samples_complete(&stacks, "victim", 100);
    control_samples_complete(&stacks, "python3.11", 100);
}
