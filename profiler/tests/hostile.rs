//! Files that unprivileged users control, read by gpuflame running as root: truncated while
//! they are read, or replaced by a FIFO at the path of a mapped executable. gpuflame must
//! survive, end on time, and keep profiling everything else. Run as root.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::others::*;
use common::*;

/// The tests here load the machine on purpose (a storm of short processes, a flood of mappings,
/// files that change under gpuflame) and count whole stacks over time: they run one at a time
/// (two at once, library A lost 10-13% of its samples to its table arriving late, 3 runs in 4;
/// alone it loses 1-3).
static STORM: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone_with_the_machine() -> std::sync::MutexGuard<'static, ()> {
    STORM.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn files_truncated_while_read_do_not_crash_gpuflame() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let dir = OpenDir::with_mode("gpuflame-trunc-", 0o777);
    let truncator = build_c(dir.path(), "truncator", &["-O2"]);
    let gate = Gate::new(dir.path(), "gate");
    let control = gate.spawn(Command::new(build_c(dir.path(), "chain", FP_FLAGS)).arg("60"));
    // A big real ELF file: gpuflame's own debug build (over 100 MiB, MiBs of .eh_frame).
    let big = dir.path().join("big.elf");
    std::fs::copy(GPUFLAME, &big).unwrap();
    std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o644)).unwrap();
    let rounds = 8;
    let hostile = Killed(
        as_nobody(&truncator, &[big.as_os_str(), dir.path().as_os_str(), rounds.to_string().as_ref()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) is needed"),
    );
    let (hostile_pid, control_pid) = (hostile.0.id().to_string(), control.0.id().to_string());
    let out = dir.path().join("trunc.folded");
    let recording = Recording::start(&["record", "-F", "99", "-d", "14", "-p", &hostile_pid, "-p", &control_pid, "-o", out.to_str().unwrap()]);
    gate.open_when_ready(&recording, &[control.0.id()]);
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

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo {}", path.display());
}

#[test]
fn deleted_executable_replaced_by_a_fifo_does_not_hang_the_recording() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let dir = tempfile::Builder::new().prefix("gpuflame-fifo-").tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let gate = Gate::new(dir.path(), "gate");
    // Two victims: one named like a Python interpreter, which gpuflame inspects for CPython.
    let mut victims = Vec::new();
    for name in ["victim", "python3.11"] {
        let exe = dir.path().join(name);
        std::fs::copy(&chain, &exe).unwrap();
        let child = gate.spawn(Command::new(&exe).arg("60"));
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
    // A hang on the FIFO fails the start, the wait for the tables or the end (Recording).
    let recording = Recording::start(&args);
    gate.open_when_ready(&recording, &victims.iter().map(|v| v.0.id()).collect::<Vec<_>>());
    let (status, stderr) = recording.finish();
    assert!(status.success(), "{status:?}:\n{stderr}");
    // The deleted programs are still named, from the mapped files.
    let stacks = read_folded(&out);
    control_samples_complete(&stacks, "victim", 100);
    control_samples_complete(&stacks, "python3.11", 100);
}

/// A build-id is a claim anyone can make: an unprivileged program linked with the build-id of a
/// victim program must not lend it its unwind table or its names, nor borrow the victim's.
#[test]
fn a_copied_build_id_lends_neither_table_nor_names() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let dir = OpenDir::new("gpuflame-buildid-");
    // No frame pointers: only the right table unwinds these.
    let claim = "-Wl,--build-id=0x6770756666c616d6500000000000000000000042";
    let victim = build_c(dir.path(), "chain", &["-O2", "-fomit-frame-pointer", claim]);
    let impostor = build_c(dir.path(), "impostor", &["-O2", "-fomit-frame-pointer", claim]);
    for exe in [&victim, &impostor] {
        std::fs::set_permissions(exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The impostor starts first, so that under a build-id key its table and names would be the
    // ones shared.
    let gate = Gate::new(dir.path(), "gate");
    let hostile = gate.spawn(&mut as_nobody(&impostor, &["30"]));
    let control = gate.spawn(Command::new(&victim).arg("30"));
    let out = dir.path().join("claim.folded");
    let (h, c) = (hostile.0.id().to_string(), control.0.id().to_string());
    let recording = Recording::start(&["record", "-F", "199", "-p", &h, "-p", &c, "-o", out.to_str().unwrap()]);
    gate.open_when_ready(&recording, &[hostile.0.id(), control.0.id()]);
    // CPU time, not wall time: 4 s of wall beside two CPU hogs and a build gave the control 232
    // samples of the 300 asked for.
    wait_cpu_all(&[hostile.0.id(), control.0.id()], 2.0);
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "gpuflame failed: {stderr}");
    let stacks = read_folded(&out);
    control_samples_complete(&stacks, "chain", 300);
    let named_by_impostor: Vec<Stack> = stacks.iter().filter(|s| s.comm() == "chain" && s.user().iter().any(|f| f.contains("PWNED"))).cloned().collect();
    assert!(named_by_impostor.is_empty(), "the victim's frames were named from the impostor's file:\n{}", describe(&named_by_impostor));
    let own: Vec<Stack> = stacks.iter().filter(|s| s.comm() == "impostor").cloned().collect();
    let all: u64 = own.iter().map(|s| s.count).sum();
    let right: u64 = own.iter().filter(|s| s.has_sequence(&["main", "PWNED_spin"])).map(|s| s.count).sum();
    assert!(all >= 300 && right * 100 >= all * 95, "the impostor's own stacks ({right} of {all} right):\n{}", describe(&own));
}

/// An unprivileged process that maps code hundreds of thousands of times a second is reported
/// within a budget: a victim started meanwhile is still found and unwound, and gpuflame's CPU
/// stays bounded (before the budget: 2-4.5M process events lost, 5-8 s of CPU in 14 s, the
/// victim never unwound).
#[test]
fn a_flood_of_code_mappings_starves_no_other_process() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let dir = OpenDir::new("gpuflame-flood-");
    let flood = build_c(dir.path(), "mmap_flood", &["-O2"]);
    let victim = build_c(dir.path(), "chain", &["-O2", "-fomit-frame-pointer"]);
    for exe in [&flood, &victim] {
        std::fs::set_permissions(exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.path().join("flood.folded");
    let recording = Recording::start(&["record", "-F", "99", "-o", out.to_str().unwrap()]);
    let gpuflame_pid = recording.child.id();
    let gate = Gate::new(dir.path(), "gate");
    let mut flooder = Killed(
        as_nobody(&flood, &[flood.as_os_str(), "6".as_ref()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) is needed"),
    );
    sleep(Duration::from_millis(1500));
    let (cpu_before, since) = (cpu_seconds(gpuflame_pid), Instant::now());
    let mut victim_run = gate.spawn(Command::new(&victim).arg("3"));
    // Found and its tables loaded while the flood goes on (a wait that only a hang runs out).
    gate.open_when_ready(&recording, &[victim_run.0.id()]);
    victim_run.0.wait().unwrap();
    let (cpu_during, during) = (cpu_seconds(gpuflame_pid) - cpu_before, since.elapsed().as_secs_f64());
    let (status, stderr) = recording.interrupt();
    let mut report = String::new();
    flooder.0.stdout.take().unwrap().read_to_string(&mut report).unwrap();
    let _ = flooder.0.wait();
    eprintln!("flooder: {report}gpuflame CPU over {during:.1} s of flood and victim: {cpu_during:.2} s");
    assert!(status.success(), "gpuflame failed under the flood ({status:?}):\n{stderr}");
    let mappings: u64 = report.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(mappings >= 150_000, "the flood was too slow to test anything: {report}");
    assert!(stderr.contains("mmap_reports_throttled"), "the throttled reports were not said:\n{stderr}");
    control_samples_complete(&read_folded(&out), "chain", 200);
    // A share of one CPU, not a time: the flood lasts as long as it takes the victim to be
    // found and run. Before the budget, 5-8 s of CPU in 14 s.
    assert!(cpu_during < 0.57 * during, "gpuflame used {cpu_during:.2} s of CPU in {during:.1} s of flood");
}

/// An unprivileged storm of processes that live ~300 µs each, started one after another: each is
/// gone before its maps can be read, so its samples are named from the identity of the file under
/// their leaf that the sampler takes (before: 8% of such samples named, 67% `[unknown] (0x…)`),
/// and samples taken in execve carry no user frame (their registers are the old program's).
#[test]
fn processes_of_300_microseconds_are_named() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let dir = OpenDir::new("gpuflame-storm-");
    let brief = build_c(dir.path(), "brief", &["-O2", "-g"]);
    let storm = build_c(dir.path(), "spawn_storm", &["-O2"]);
    for exe in [&brief, &storm] {
        std::fs::set_permissions(exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.path().join("storm.folded");
    // 1,200 processes one after another (2-3 s here), recorded until the storm is over.
    let recording = Recording::start(&["record", "-F", "999", "-o", out.to_str().unwrap()]);
    let run = as_nobody(&storm, &[brief.as_os_str(), "1200".as_ref()])
        .output()
        .expect("setpriv (util-linux) is needed");
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");
    let report = String::from_utf8_lossy(&run.stdout);
    let mut words = report.split_whitespace();
    let started: u64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let secs: f64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0.0);
    eprintln!("{started} processes in {secs:.2} s ({:.0}/s)", started as f64 / secs.max(0.001));
    assert_eq!(started, 1200, "the storm did not run: {report}");

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.comm() == "brief").collect();
    let all = total(&stacks);
    let unknown: u64 = stacks.iter().filter(|s| s.user().iter().any(|f| f.starts_with("[unknown]"))).map(|s| s.count).sum();
    let in_work: u64 = stacks.iter().filter(|s| s.user().last() == Some(&"brief_work")).map(|s| s.count).sum();
    eprintln!("brief: {all} samples, {in_work} in brief_work, {unknown} with an [unknown] frame");
    assert!(all >= 200, "too few samples of the storm's processes: {all}");
    // 1.7% at 408 processes/s on the machine of 2026-12-01; on a faster one (460-610/s) 17-19%
    // at the same commit, 7-9% once a leaf in a file whose table is pending is identified too.
    // What stays unnamed: samples whose VMA lookup found the mmap lock taken (the storm maps and
    // exits all the time), and stacks unwound with the maps of the parent's fork. The issue
    // measured 67%.
    assert!(unknown * 100 <= all * 12, "{unknown} of {all} samples have an [unknown] frame:\n{}", describe(&stacks));
    assert!(in_work * 100 >= all * 15, "only {in_work} of {all} samples named brief_work:\n{}", describe(&stacks));
}

/// Library A runs at DIR/plugins/plugin.so, is dlclosed and deleted, and library B (plugin.c,
/// each built with its defines) runs at the same path: the stacks of `inode_reuse`, and what it
/// printed (the inodes, and where each lib_work was).
fn two_libraries_at_one_path(a_defines: &[&str], b_defines: &[&str]) -> (Vec<Stack>, String) {
    let dir = tempfile::Builder::new().prefix("gpuflame-inode-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/plugin.c");
    let lib = |name: &str, defines: &[&str]| {
        let out = dir.path().join(name);
        let status = Command::new("cc").args(["-O2", "-g", "-shared", "-fPIC", "-fomit-frame-pointer"]).args(defines).arg(&src).arg("-o").arg(&out).status().unwrap();
        assert!(status.success(), "building {name}");
        out
    };
    let a = lib("liba.so", a_defines);
    let b = lib("libb.so", b_defines);
    let exe = build_c(dir.path(), "inode_reuse", &["-O2"]);
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let out = dir.path().join("reuse.folded");
    // Until the program has done its work (1.5 s of CPU time in each library), however long a
    // loaded machine makes that take.
    let recording = Recording::start(&["record", "-F", "199", "-o", out.to_str().unwrap()]);
    let run = Command::new(&exe).arg(&plugins).arg(&a).arg(&b).arg("1.5").output().unwrap();
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");
    let printed = String::from_utf8_lossy(&run.stdout).into_owned();
    let stacks = read_folded(&out).into_iter().filter(|s| s.comm() == "inode_reuse").collect();
    (stacks, printed)
}

/// Of the samples whose leaf is `leaf`: those under `_start` with `chain`, and all.
fn whole_under(stacks: &[Stack], leaf: &str, chain: [&str; 3]) -> (Vec<Stack>, u64, u64) {
    let of: Vec<Stack> = stacks.iter().filter(|s| s.user().last() == Some(&leaf)).cloned().collect();
    let good = of.iter().filter(|s| s.user().first() == Some(&"_start") && s.has_sequence(&chain)).map(|s| s.count).sum();
    let all = total(&of);
    (of, good, all)
}

/// A library is dlclosed and deleted, and another is written at its path: its samples are unwound
/// with a table of its own and named after its own functions (before: a library that got the
/// freed inode was unwound with the old file's table, 0% complete). While gpuflame holds the old
/// file open (it does, from the first sample of it) the file system cannot hand its inode out
/// again; files are told apart by device, inode, size and modification time besides.
#[test]
fn a_new_library_at_a_deleted_librarys_path_gets_its_own_table_and_names() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let (stacks, printed) = two_libraries_at_one_path(&["-DPREFIX(x)=a_##x"], &["-DPREFIX(x)=b_##x", "-DPAD"]);
    let inodes: Vec<&str> = printed.lines().next().unwrap_or("").split_whitespace().skip(1).collect();
    assert_eq!(inodes.len(), 2, "the program did not run both libraries: {printed:?}");
    let (in_a, good_a, all_a) = whole_under(&stacks, "a_inner", ["lib_work", "a_outer", "a_inner"]);
    let (in_b, good_b, all_b) = whole_under(&stacks, "b_inner", ["lib_work", "b_outer", "b_inner"]);
    eprintln!("inodes {inodes:?} (reused: {}): library A {good_a} of {all_a} whole, library B {good_b} of {all_b} whole", inodes[0] == inodes[1]);
    assert!(all_a >= 100 && all_b >= 100, "too few samples: A {all_a}, B {all_b}:\n{}", describe(&stacks));
    assert!(good_a * 100 >= all_a * 90, "library A: {good_a} of {all_a} whole:\n{}", describe(&in_a));
    assert!(good_b * 100 >= all_b * 90, "library B at A's path: {good_b} of {all_b} whole:\n{}", describe(&in_b));
    let misnamed: u64 = stacks.iter().filter(|s| s.user().iter().any(|f| f.starts_with("a_")) && s.user().iter().any(|f| f.starts_with("b_"))).map(|s| s.count).sum();
    assert_eq!(misnamed, 0, "stacks mixing the two libraries' names:\n{}", describe(&stacks));
}

/// Library B has its code at the addresses library A had, mapped where A was, with frames of
/// another size: the unwinder keeps the rule it found for an address from walk to walk
/// (frame_cache.h), and must not use A's for B. A's rule at b_outer's return address puts the
/// caller 0x1f0 bytes off: B's stacks would stop there, without lib_work.
#[test]
fn code_at_the_same_address_in_a_new_library_is_unwound_with_the_new_rules() {
    require_bpf();
    let _alone = alone_with_the_machine();
    let (stacks, printed) = two_libraries_at_one_path(&["-DPREFIX(x)=a_##x", "-DFRAME=600"], &["-DPREFIX(x)=b_##x", "-DFRAME=1100"]);
    let at: Vec<&str> = printed.lines().nth(1).unwrap_or("").split_whitespace().skip(1).collect();
    assert!(at.len() == 2 && at[0] == at[1], "library B was not mapped where A was (the case this test is for): {printed:?}");
    let (in_a, good_a, all_a) = whole_under(&stacks, "a_inner", ["lib_work", "a_outer", "a_inner"]);
    let (in_b, good_b, all_b) = whole_under(&stacks, "b_inner", ["lib_work", "b_outer", "b_inner"]);
    eprintln!("both at {}: library A {good_a} of {all_a} whole, library B {good_b} of {all_b} whole", at[0]);
    assert!(all_a >= 100 && all_b >= 100, "too few samples: A {all_a}, B {all_b}:\n{}", describe(&stacks));
    assert!(good_a * 100 >= all_a * 90, "library A: {good_a} of {all_a} whole:\n{}", describe(&in_a));
    assert!(good_b * 100 >= all_b * 90, "library B where A was: {good_b} of {all_b} whole:\n{}", describe(&in_b));
}
