//! Where is it stuck: waits that outlast a window, and threads that waited since before gpuflame
//! attached, are counted in the windows they span, under their whole stacks. Real BPF; run as
//! root.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A program started and run until it says "ready" on stdout (then a moment, so that it is
/// blocked); killed when dropped.
struct Stuck(Child);

impl Stuck {
    fn start(cmd: &mut Command) -> Stuck {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting the stuck program");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the program did not start");
        std::thread::sleep(Duration::from_millis(300));
        Stuck(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its stderr so far: it is killed first.
    fn stderr(mut self) -> String {
        let _ = self.0.kill();
        let out = std::mem::replace(&mut self.0, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn holds(s: &Stack, frames: &[&str]) -> bool {
    let mut it = s.frames.iter();
    frames.iter().all(|want| it.any(|f| f == want || f.starts_with(&format!("{want} ("))))
}

fn under(stacks: &[Stack], frames: &[&str]) -> u64 {
    stacks.iter().filter(|s| holds(s, frames)).map(|s| s.count).sum()
}

/// `record --profiles off-cpu,wall -p PID -d SECONDS` to pprof; each profile as folded stacks,
/// and the window's start and length (ns).
fn record_pid(dir: &Path, pid: u32, seconds: &str) -> (Vec<Stack>, Vec<Stack>, (i64, i64), String) {
    let out = dir.join("out.pb.gz");
    let o = gpuflame_ok(&["-v", "record", "--profiles", "off-cpu,wall", "-p", &pid.to_string(), "-d", seconds, "-o", out.to_str().unwrap()], 0);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let folded = |kind: &str| {
        let pb = dir.join(format!("out.{kind}.pb.gz"));
        let f = dir.join(format!("{kind}.folded"));
        gpuflame_ok(&["convert", pb.to_str().unwrap(), "-o", f.to_str().unwrap()], 0);
        read_folded(&f)
    };
    let wall = gpuflame::output::load::load(&dir.join("out.wall.pb.gz"), 1).expect("the wall profile reads back");
    (folded("off-cpu"), folded("wall"), (wall.time_nanos, wall.duration_nanos), stderr)
}

fn debian_python() -> &'static str {
    let python = "/usr/bin/python3.11";
    assert!(Path::new(python).exists(), "Debian's python3.11 is needed (scripts/setup.sh installs python3)");
    python
}

/// Debian's python3.11 has no local symbols: the lock's own functions are `[unknown]`.
const LOCK_WAIT: &[&str] = &["all_reduce_like", "wait_for_peer", "PyThread_acquire_lock_timed", "futex_wait_[k]", "[off-cpu: sleeping]"];

#[test]
fn a_thread_waiting_since_before_the_attach_holds_the_window_under_its_python_chain() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let program = format!("{}/stuck.py", program_dir());
    let stuck = Stuck::start(Command::new(debian_python()).args([program.as_str(), "before", "spin"]));
    let (off, wall, (_, window), stderr) = record_pid(dir.path(), stuck.pid(), "5");
    // The main thread's wait began before the attach: all of the window is under it.
    let main: Vec<Stack> = wall.iter().filter(|s| s.comm() == "python3.11" || s.comm() == "python3").cloned().collect();
    let waited = under(&main, LOCK_WAIT);
    eprintln!("{waited} ns of a {window} ns window under the lock's chain ({:.2}%)", waited as f64 * 100.0 / window as f64);
    assert!(waited as f64 >= 0.95 * window as f64, "{waited} ns of a {window} ns window under the lock's chain:\n{}\n{stderr}", describe(&wall));
    assert!(waited as f64 <= 1.01 * window as f64, "{waited} ns counted for a {window} ns window:\n{}", describe(&wall));
    assert_eq!(under(&off, LOCK_WAIT), waited, "off-CPU holds the same wait");
    // Whole, from _start through the futex's kernel frames.
    assert!(main.iter().any(|s| holds(s, &["_start", "<module>", "all_reduce_like", "wait_for_peer", "futex_wait_[k]", "[off-cpu: sleeping]"])), "{}", describe(&main));
    // The spinner's wall time is its window, as before: CPU samples and its preemptions.
    let spinner = under(&wall, &["spin"]);
    assert!(spinner as f64 >= 0.9 * window as f64 && spinner as f64 <= 1.05 * window as f64, "spinner: {spinner} ns of {window}\n{}", describe(&wall));
}

#[test]
fn a_wait_begun_inside_the_window_counts_from_then_to_the_windows_end() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let program = format!("{}/stuck.py", program_dir());
    let stuck = Stuck::start(Command::new(debian_python()).args([program.as_str(), "after", "2.5"]));
    let (_, wall, (start, window), stderr) = record_pid(dir.path(), stuck.pid(), "5");
    let said = stuck.stderr();
    let blocked_at: i64 = said.split("BLOCKING_AT=").nth(1).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no BLOCKING_AT in {said}"));
    let expected = start + window - blocked_at;
    assert!(expected > 1_000_000_000, "the lock wait began {expected} ns before the window's end: too late to measure");
    let waited = under(&wall, LOCK_WAIT) as i64;
    let off = (waited - expected).abs() as f64 / expected as f64;
    eprintln!("lock wait {waited} ns, its time to the window's end {expected} ns ({:+.2}%)", (waited - expected) as f64 * 100.0 / expected as f64);
    assert!(off <= 0.02, "lock wait {waited} ns, expected {expected} ns ({:.1}% off)\n{}\n{stderr}", off * 100.0, describe(&wall));
    // The sleep before it, begun before the attach, is there too.
    assert!(under(&wall, &["<module>", "main", "[off-cpu: sleeping]"]) > waited as u64, "{}", describe(&wall));
}

#[test]
fn a_c_program_blocked_in_read_since_before_the_attach_has_its_stack_to_start() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "pipe_reader", &["-O2", "-g", "-fomit-frame-pointer", "-fasynchronous-unwind-tables"]);
    let stuck = Stuck::start(&mut Command::new(&exe));
    let (off, _, (_, window), stderr) = record_pid(dir.path(), stuck.pid(), "3");
    let chain = ["_start", "main", "wait_for_input", "read_all", "vfs_read_[k]", "[off-cpu: sleeping]"];
    let waited = under(&off, &chain);
    assert!(waited as f64 >= 0.95 * window as f64 && waited as f64 <= 1.01 * window as f64, "{waited} ns of {window} under {chain:?}:\n{}\n{stderr}", describe(&off));
}

/// A number the program said on stderr as `NAME=N`.
fn said(text: &str, name: &str) -> i64 {
    text.split(&format!("{name}=")).nth(1).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn the_agent_counts_a_60_s_wait_in_each_window_it_spans() {
    use common::agent::{agent, serial};
    use common::receiver::Receiver;
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "long_block", FP_FLAGS);
    let receiver = Receiver::start(Box::new(|_| 200));
    let a = agent(&["--server", &receiver.url(), "--window", "15", "--profiles", "off-cpu,wall", "-v"]);
    let blocked = Command::new(&exe).arg("60000").env("GPUFLAME_SERVICE_NAME", "blocked").stderr(Stdio::piped()).spawn().unwrap();
    let out = blocked.wait_with_output().unwrap();
    let said_text = String::from_utf8_lossy(&out.stderr).into_owned();
    let (start, end) = (said(&said_text, "BLOCK_START"), said(&said_text, "BLOCK_END"));
    // The window the wait ended in is pushed at its end, or at the agent's stop.
    std::thread::sleep(Duration::from_secs(2));
    let log = a.stop();
    let mut windows: Vec<_> = receiver
        .received()
        .into_iter()
        .filter(|r| r.labels.get("__name__").map(String::as_str) == Some("off_cpu") && r.labels.get("service_name").map(String::as_str) == Some("blocked"))
        .collect();
    windows.sort_by_key(|w| w.profile.time_nanos);
    let in_poll = |p: &gpuflame::profile::Profile| -> i64 {
        p.samples
            .iter()
            .filter(|s| {
                let names: Vec<&str> = s.stack.iter().map(|&l| p.locations[l].lines[0].function.as_str()).collect();
                ["main", "block_for", "poll"].iter().all(|f| names.iter().any(|n| n.contains(f))) && names.last() == Some(&"[off-cpu: sleeping]")
            })
            .map(|s| s.value())
            .sum()
    };
    let mut total = 0;
    let mut report = String::new();
    for w in &windows {
        let (w_start, w_end) = (w.profile.time_nanos, w.profile.time_nanos + w.profile.duration_nanos);
        let share = (end.min(w_end) - start.max(w_start)).max(0);
        let got = in_poll(&w.profile);
        report += &format!("window {w_start}+{}: {got} ns, its share {share} ns\n", w.profile.duration_nanos);
        for smp in &w.profile.samples {
            let names: Vec<&str> = smp.stack.iter().map(|&l| w.profile.locations[l].lines[0].function.as_str()).collect();
            report += &format!("  {} {}\n", names.join(";"), smp.value());
        }
        total += got;
    }
    for w in &windows {
        let (w_start, w_end) = (w.profile.time_nanos, w.profile.time_nanos + w.profile.duration_nanos);
        let share = (end.min(w_end) - start.max(w_start)).max(0);
        assert!((in_poll(&w.profile) - share).abs() as f64 <= 0.02 * w.profile.duration_nanos as f64, "a window's share is off:\n{report}\n{log}");
    }
    assert!(windows.len() >= 4, "the 60 s wait spans at least 4 windows of 15 s:\n{report}\n{log}");
    let waited = end - start;
    assert!((total - waited).abs() as f64 <= 0.02 * waited as f64, "{total} ns counted for a wait of {waited} ns:\n{report}\n{log}");
    eprintln!("{report}");
}
