//! `gpuflame record` on real processes, with real BPF programs. Run as root.

mod common;

use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use common::*;

#[test]
fn frame_pointer_chain_is_complete_and_symbolized() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let out = dir.path().join("chain.folded");
    let gate = Gate::new(dir.path(), "gate");
    let (status, stderr) = record_gated(&gate, &["record", "-F", "199", "-o", out.to_str().unwrap(), "--", chain.to_str().unwrap(), "3"], 1);
    assert_eq!(status.code(), Some(3), "the command's exit code passes through:\n{stderr}");

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.comm() == "chain").collect();
    let all = total(&stacks);
    assert!(all >= 300, "expected ~600 samples of a 3 s spin at 199 Hz, got {all}:\n{}", describe(&stacks));
    assert!(stacks.iter().all(Stack::kernel_below_user), "kernel frames above user frames:\n{}", describe(&stacks));
    complete(&stacks, &["main", "a", "b", "c"]);
}

#[test]
fn syscall_heavy_program_shows_kernel_frames_under_the_syscall() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "syscalls", FP_FLAGS);
    let child = Killed(Command::new(&exe).arg("60").spawn().unwrap());
    let out = dir.path().join("sys.folded");
    let pid = child.0.id().to_string();
    // 1 s of its CPU time at 199 Hz, however loaded the machine.
    let (status, stderr) = record_for_cpu(&["record", "-F", "199", "-p", &pid, "-o", out.to_str().unwrap()], child.0.id(), 1.0);
    drop(child);
    assert!(status.success(), "{stderr}");

    let stacks = read_folded(&out);
    let all = total(&stacks);
    assert!(all >= 100, "expected ~200 samples, got {all}:\n{}", describe(&stacks));
    assert!(stacks.iter().all(|s| s.comm() == "syscalls"), "-p must record only that process:\n{}", describe(&stacks));
    let in_read: u64 = stacks
        .iter()
        .filter(|s| {
            s.has_sequence(&["main", "do_reads"])
                && s.user().last().is_some_and(|f| f.contains("read"))
                && s.kernel_below_user()
                && s.kernel().iter().any(|f| matches!(*f, "ksys_read" | "__x64_sys_read" | "vfs_read"))
        })
        .map(|s| s.count)
        .sum();
    assert!(in_read * 100 >= all * 30, "only {in_read} of {all} samples show the read syscall in the kernel:\n{}", describe(&stacks));
}

#[test]
fn command_and_its_grandchild_are_profiled_and_exit_code_passes_through() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "forker", FP_FLAGS);
    let out = dir.path().join("fork.folded");
    gpuflame_ok(&["record", "-F", "199", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap()], 7);

    let stacks = read_folded(&out);
    let count = |f: &str| -> u64 { stacks.iter().filter(|s| s.has_sequence(&["main", f, "spin"])).map(|s| s.count).sum() };
    let (parent, grandchild) = (count("parent_work"), count("grandchild_work"));
    assert!(parent >= 50 && grandchild >= 50, "parent {parent}, grandchild {grandchild} samples:\n{}", describe(&stacks));
}

#[test]
fn process_that_exits_during_the_recording_is_symbolized() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "short_lived", FP_FLAGS);
    let out = dir.path().join("machine.folded");
    // The whole machine, with a process that starts after the recording and exits before its end.
    let recording = Recording::start(&["record", "-o", out.to_str().unwrap()]);
    let gate = Gate::new(dir.path(), "gate");
    let mut program = gate.spawn(Command::new(&exe).arg("1"));
    gate.open_when_ready(&recording, &[program.0.id()]);
    assert!(program.0.wait().unwrap().success());
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.comm() == "short_lived").collect();
    let all = total(&stacks);
    assert!(all >= 50, "expected ~99 samples of short_lived, got {all}");
    // Named: the leaf, from the file, after the process is gone.
    let named: u64 = stacks.iter().filter(|s| s.user().last() == Some(&"short_lived_work")).map(|s| s.count).sum();
    assert!(named * 100 >= all * 95, "only {named} of {all} samples were symbolized:\n{}", describe(&stacks));
    // Whole: it ran once its table was in.
    let whole: u64 = stacks.iter().filter(|s| s.user().first() == Some(&"_start") && s.has_sequence(&["main", "short_lived_work"])).map(|s| s.count).sum();
    assert!(whole * 100 >= all * 95, "only {whole} of {all} samples were whole stacks:\n{}", describe(&stacks));
}

#[test]
fn ctrl_c_stops_early_and_still_writes_the_output() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "chain", FP_FLAGS);
    let mut spinner = Command::new(&exe).arg("60").spawn().unwrap();
    let out = dir.path().join("interrupted.svg");
    let recording = Recording::start(&["record", "-o", out.to_str().unwrap()]);
    sleep(Duration::from_millis(1500));
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(recording.child.id() as i32, libc::SIGINT) };
    let (status, stderr) = recording.finish();
    spinner.kill().ok();
    spinner.wait().ok();
    assert!(status.success(), "exit {status:?}: {stderr}");
    assert!(stderr.contains("samples from") && stderr.contains("lost"), "no summary line:\n{stderr}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains("<svg") && svg.contains("chain"), "the flame graph lacks the spinning program");
}

/// What a stack of a command started by `record` began with, if it is not whole.
fn incomplete_of(stacks: &[Stack]) -> (Vec<Stack>, u64) {
    let incomplete: Vec<Stack> = stacks.iter().filter(|s| s.user().first().is_some_and(|f| f.starts_with("[native:"))).cloned().collect();
    let waited = incomplete.iter().filter(|s| s.user().first() == Some(&"[native: unwind table not loaded yet]")).map(|s| s.count).sum();
    (incomplete, waited)
}

/// No gate: what a user sees. The tables of the command's executable, its loader, its libraries
/// and the vDSO are built while it waits to exec, and BPF walks its first milliseconds (ld.so,
/// then main, before user space has read its maps) with them. A sample may stop where it crosses
/// into a mapping that no sample looked up yet (one VMA lookup a sample): 0 to 2 of ~1000 in
/// runs beside two CPU hogs. Before, 2-3% waited for their tables.
#[test]
fn a_command_started_by_record_is_whole_from_its_first_sample() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", &["-O2", "-g", "-fomit-frame-pointer"]);
    let out = dir.path().join("first.folded");
    gpuflame_ok(&["record", "-F", "999", "-o", out.to_str().unwrap(), "--", chain.to_str().unwrap(), "1"], 3);

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.comm() == "chain").collect();
    let all = total(&stacks);
    let (incomplete, waited) = incomplete_of(&stacks);
    eprintln!("first samples: {} of {all} incomplete, {waited} waited for a table", total(&incomplete));
    assert!(all >= 500, "expected ~1000 samples of 1 s of CPU at 999 Hz, got {all}:\n{}", describe(&stacks));
    assert_eq!(waited, 0, "samples waited for a table built only once the command ran:\n{}", describe(&incomplete));
    assert!(total(&incomplete) * 100 <= all, "{} of {all} samples incomplete:\n{}", total(&incomplete), describe(&incomplete));
    complete(&stacks, &["main", "a", "b", "c"]);
}

/// A starved reader says how far behind it fell: gpuflame stopped (SIGSTOP) for 2 s while a
/// spinner is sampled, then let go.
#[test]
fn a_recording_stopped_for_two_seconds_says_how_long_records_waited_in_the_ring() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "chain", FP_FLAGS);
    let mut spinner = Command::new(&exe).arg("60").spawn().unwrap();
    let out = dir.path().join("lag.folded");
    let recording = Recording::start(&["record", "-F", "199", "-p", &spinner.id().to_string(), "-d", "4", "-o", out.to_str().unwrap()]);
    let pid = recording.child.id() as i32;
    sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    sleep(Duration::from_secs(2));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let (status, stderr) = recording.finish();
    spinner.kill().ok();
    spinner.wait().ok();
    assert!(status.success(), "exit {status:?}: {stderr}");
    let line = stderr.lines().find(|l| l.contains("records waited in the ring")).unwrap_or_else(|| panic!("no ring lag line:\n{stderr}"));
    let longest: u64 = line.split("longest_ms=").nth(1).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"));
    // Samples written just after the stop waited all of it, less the wake-up's batching.
    assert!((1_800..=10_000).contains(&longest), "longest {longest} ms for a reader stopped 2 s:\n{stderr}");
    assert!(stderr.contains("gpuflame fell behind"), "no warning:\n{stderr}");
}

/// A record that finds almost nothing on the CPU says so and what to try; one that finds work does
/// not. (An idle whole machine cannot be had beside other tests: its rule is a unit test in
/// record/hint.rs; a busy one is tested here.)
#[test]
fn a_target_that_slept_gets_a_hint_and_busy_ones_do_not() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("h.folded");
    let sleeper = Killed(Command::new("sleep").arg("60").spawn().unwrap());
    let pid = sleeper.0.id().to_string();
    let run = gpuflame_ok(&["record", "-p", &pid, "-d", "2", "-o", out.to_str().unwrap()], 0);
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(log.contains("gpuflame: the target barely ran on a CPU (0 samples in 2.0 s at 99 Hz): where it waited shows with `--profiles off-cpu,wall`"), "{log}");
    drop(sleeper);

    // A spinning target, and the whole machine while it spins: no hint.
    let spinner = Killed(Command::new(build_c(dir.path(), "chain", FP_FLAGS)).arg("60").spawn().unwrap());
    let pid = spinner.0.id().to_string();
    for args in [vec!["record", "-p", &pid, "-d", "2"], vec!["record", "-d", "2"]] {
        let run = gpuflame_ok(&[&args[..], &["-o", out.to_str().unwrap()]].concat(), 0);
        let log = String::from_utf8_lossy(&run.stderr);
        assert!(!log.contains("barely ran") && !log.contains("nearly idle"), "{args:?}:\n{log}");
    }
}
