//! `gpuflame agent`'s series against the Pyroscope rules of common/receiver.rs: services and
//! their labels, HBM profiles per device, 429s per series, reserved labels, and the limits on
//! names and stacks; and the agent at 5,000 Hz. Run as root (the agent profiles the whole
//! machine).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::agent::*;
use common::receiver::{Received, Receiver};
use common::*;

/// An HBM workload (the CUDA stand-ins) under an agent with `args`; what was stored.
fn hbm_run(args: &[&str]) -> (Receiver, String) {
    let dir = tempfile::tempdir().unwrap();
    let app = common::cuda::build_stand_ins(dir.path());
    let receiver = Receiver::start(Box::new(|_| 200));
    let mut all = vec!["--server", receiver.url().leak(), "--once", "--window", "4", "--profiles", "hbm-alloc,hbm-inuse", "-v"];
    all.extend_from_slice(args);
    let agent = agent(&all);
    // Started after the agent: its allocations are seen from the first; it lives past the window.
    let app = Workload(Command::new(&app).arg("memory").env("LINGER_MS", "8000").env("GPUFLAME_SERVICE_NAME", "kv-server").stdout(Stdio::null()).spawn().unwrap());
    let started = Instant::now();
    while receiver.received().is_empty() && started.elapsed() < HANG {
        sleep(Duration::from_millis(100));
    }
    let log = agent.stop();
    drop(app);
    assert_clean(&receiver);
    (receiver, log)
}

/// The kv-server series of profile `name`: (device, total) each.
fn hbm_series(got: &[Received], name: &str) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = got
        .iter()
        .filter(|r| r.labels.get("__name__").map(String::as_str) == Some(name) && r.labels.get("service_name").map(String::as_str) == Some("kv-server"))
        .map(|r| (r.labels.get("device").cloned().unwrap_or_default(), r.profile.total()))
        .collect();
    out.sort();
    out
}

#[test]
fn hbm_profiles_are_pushed_per_service_and_device_with_their_own_names() {
    require_bpf();
    let _serial = serial();
    let (receiver, log) = hbm_run(&[]);
    let got = receiver.received();
    let all: Vec<_> = got.iter().map(|r| (&r.labels, r.profile.total())).collect();
    // The stand-in program allocates on devices 1 and 3. The device is a series label by
    // default: it survives Pyroscope, which drops numeric sample labels.
    let inuse = hbm_series(&got, "hbm_inuse");
    assert_eq!(inuse.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(), ["1", "3"], "{all:#?}\n{log}");
    assert_eq!(inuse.iter().map(|d| d.1).sum::<i64>(), 222_298_112, "what the program holds at the end of the window: {all:#?}");
    let alloc = hbm_series(&got, "hbm_alloc");
    assert_eq!(alloc.iter().map(|d| d.1).sum::<i64>(), 352_321_536, "{all:#?}");
    for r in got.iter().filter(|r| r.labels.get("service_name").map(String::as_str) == Some("kv-server")) {
        assert!(r.sent_labels.contains_key("device"), "pushed as a series label: {:?}", r.sent_labels);
        assert_eq!(r.profile.sample_type().kind, if r.labels["__name__"] == "hbm_inuse" { "inuse_space" } else { "alloc_space" });
    }
    assert!(got.iter().all(|r| r.labels.get("__name__").map(String::as_str) != Some("process_cpu")), "cpu was not asked for");
}

#[test]
fn hbm_device_as_a_string_sample_label_becomes_a_series_label_in_pyroscope() {
    require_bpf();
    let _serial = serial();
    let (receiver, log) = hbm_run(&["--device-label", "sample"]);
    let got = receiver.received();
    let all: Vec<_> = got.iter().map(|r| (&r.sent_labels, &r.labels, r.profile.total())).collect();
    // One series pushed, split by Pyroscope into one per device by the string sample label.
    let inuse = hbm_series(&got, "hbm_inuse");
    assert_eq!(inuse.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(), ["1", "3"], "{all:#?}\n{log}");
    assert_eq!(inuse.iter().map(|d| d.1).sum::<i64>(), 222_298_112);
    for r in got.iter().filter(|r| r.labels.get("service_name").map(String::as_str) == Some("kv-server")) {
        assert!(!r.sent_labels.contains_key("device"), "pushed as a sample label, not a series label: {:?}", r.sent_labels);
    }
}

/// Writes `chunk` bytes to a file and syncs, over and over, until `stop`: the kernel's flusher
/// threads (kworker) write them back.
fn kernel_writeback(dir: &Path, stop: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<()> {
    let path = dir.join("writeback");
    std::thread::spawn(move || {
        let chunk = vec![0x5au8; 8 << 20];
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = std::fs::write(&path, &chunk);
            // SAFETY: sync has no preconditions.
            unsafe { libc::sync() };
        }
        let _ = std::fs::remove_file(&path);
    })
}

#[test]
fn a_process_is_one_service_whatever_its_threads_are_named_and_kernel_threads_one_more() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "named_threads", &["-O2", "-g", "-fno-omit-frame-pointer", "-pthread"]);
    let named = dir.path().join("mtproc");
    std::fs::copy(&exe, &named).unwrap();
    let _w = Workload(Command::new(&named).arg("600").spawn().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = kernel_writeback(dir.path(), Arc::clone(&stop));
    sleep(Duration::from_millis(300));

    let receiver = Receiver::start(Box::new(|_| 200));
    let out = gpuflame_ok(&["agent", "--server", &receiver.url(), "--once", "--window", "3", "-F", "199"], 0);
    let got = receiver.received();
    assert_clean(&receiver);
    let names: std::collections::BTreeSet<&str> = got.iter().map(|r| r.labels["service_name"].as_str()).collect();
    let mt = service(&got, "mtproc");
    assert_eq!(mt.len(), 1, "one series for the process, services: {names:?}\n{}", String::from_utf8_lossy(&out.stderr));
    let roots = root_frames(&mt[0].profile);
    for t in ["thread:worker-a", "thread:worker-b", "thread:worker-c"] {
        assert!(roots.contains(t), "{t} missing from the roots {roots:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("worker-") || n.starts_with("kworker") || n.starts_with("ksoftirqd")), "thread names as services: {names:?}");
    // Only the agent's labels: no thread name or pid turned into a series label.
    for r in &got {
        let keys: Vec<&str> = r.labels.keys().map(String::as_str).collect();
        assert_eq!(keys, ["__name__", "hostname", "service_name"], "{:?}", r.labels);
    }
    let kernel = service(&got, "kernel");
    assert_eq!(kernel.len(), 1, "one series for the kernel threads, services: {names:?}");
    let kroots = root_frames(&kernel[0].profile);
    assert!(kroots.iter().all(|r| r.starts_with("thread:")), "{kroots:?}");
    eprintln!("services: {names:?}\nkernel threads: {kroots:?}");

    // Left out, and thread names as a label (which Pyroscope makes a series label).
    let receiver = Receiver::start(Box::new(|_| 200));
    gpuflame_ok(&["agent", "--server", &receiver.url(), "--once", "--window", "2", "-F", "199", "--no-kernel-threads", "--thread-names", "label"], 0);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = writer.join();
    let got = receiver.received();
    assert_clean(&receiver);
    assert!(service(&got, "kernel").is_empty(), "kernel threads were to be left out");
    let threads: std::collections::BTreeSet<&str> = service(&got, "mtproc").iter().filter_map(|r| r.labels.get("thread_name").map(String::as_str)).collect();
    assert!(["worker-a", "worker-b", "worker-c"].iter().all(|t| threads.contains(t)), "{threads:?}");
    assert!(service(&got, "mtproc").iter().all(|r| !r.sent_labels.contains_key("thread_name")), "a sample label, not a pushed series label");
}

#[test]
fn series_refused_with_429_are_retried_alone_bounded_and_never_stored_twice() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = [spinner(dir.path(), "steady", None), spinner(dir.path(), "flaky", None), spinner(dir.path(), "doomed", None)];
    // Pyroscope answers a request with its first error, having stored the series that passed.
    let receiver = Receiver::per_series(Box::new(|labels, before| match labels.get("service_name").map(String::as_str) {
        Some("doomed") => 429,
        Some("flaky") if before < 2 => 429,
        _ => 200,
    }));
    // Backoffs long enough that waiting behind the refused series would show: 4 attempts are
    // at least 0.25 + 0.5 + 1 s apart.
    let child = agent(&["--server", &receiver.url(), "--window", "1", "-F", "49", "--max-retries", "4", "--max-backoff", "2"]);
    sleep(Duration::from_secs(6));
    let stats = summary(&child.stop());
    assert_clean(&receiver);
    let got = receiver.received();
    let windows = stats["windows"];

    // Refused twice, then taken: every window's flaky series stored once.
    let flaky: Vec<u64> = service(&got, "flaky").iter().map(|r| window_seq(&r.id)).collect();
    assert!(flaky.len() as u64 + 1 >= windows, "{} of {windows} flaky windows: {flaky:?}", flaky.len());
    // Refused every time: offered exactly --max-retries times, then dropped and counted.
    let offers = receiver.offers();
    let doomed: Vec<usize> = offers.iter().filter(|((l, _), _)| l.get("service_name").map(String::as_str) == Some("doomed")).map(|(_, &n)| n).collect();
    assert!(service(&got, "doomed").is_empty());
    assert!(doomed.len() as u64 + 1 >= windows && doomed.iter().all(|&n| n == 4), "offers of the doomed series: {doomed:?}");
    assert_eq!(stats["dropped retries exhausted"], doomed.len() as u64, "{stats:?}");
    assert_eq!(stats["dropped"], stats["dropped retries exhausted"], "{stats:?}");
    // The others are not held back: each window's steady series (queued after its doomed one:
    // series go in the order of their names) is stored while the doomed one is still being
    // retried, right after the window's first series reached the server.
    let mut steady = Vec::new();
    for r in service(&got, "steady") {
        let first = receiver.first_offer(&r.id).unwrap();
        let (doomed_first, doomed_last) = receiver.offer_times("doomed", &r.id).expect("the window's doomed series");
        assert!(r.at < doomed_last, "window {}'s steady series waited for the doomed one's retries", r.id);
        steady.push((window_seq(&r.id), (r.at - first).as_secs_f64(), (doomed_last - doomed_first).as_secs_f64()));
    }
    steady.sort_by_key(|s| s.0);
    assert!(steady.len() as u64 + 1 >= windows && !steady.is_empty(), "{steady:?}");
    eprintln!("windows {windows}; steady (window, stored s after the window's first series, doomed retried over s) {steady:?}; doomed offers {doomed:?}; {stats:?}");
}

#[test]
fn a_label_the_agent_sets_is_a_clear_error_and_a_rule_that_names_nothing_falls_back() {
    require_bpf();
    let _serial = serial();
    for (args, expect) in [
        (vec!["--label", "hostname=x"], "hostname is set by the agent"),
        (vec!["--label", "service_name=x"], "service_name is set by the agent"),
        (vec!["--label", "9lives=x"], "not valid"),
        (vec!["--service-name", "train="], "empty name"),
        (vec!["--rank-label", "pod=RANK"], "clash with the agent's own label"),
        (vec!["--label", "rank=3"], "rank is set by the agent"),
    ] {
        let out = gpuflame(&[&["agent", "--server", "http://127.0.0.1:9"], args.as_slice()].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect) && err.lines().count() == 1, "{args:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let _a = spinner(dir.path(), "emptyrule", None);
    let _b = spinner(dir.path(), "ruled_bin", None);
    sleep(Duration::from_millis(300));
    let receiver = Receiver::start(Box::new(|_| 200));
    // The group of the first rule matches nothing for emptyrule: its name falls back to comm.
    gpuflame_ok(
        &["agent", "--server", &receiver.url(), "--once", "--window", "2", "-F", "49", "--service-name", "emptyrule(-never)?=$1", "--service-name", "(ruled)_bin=svc-$1"],
        0,
    );
    assert_clean(&receiver);
    let got = receiver.received();
    assert_eq!(service(&got, "emptyrule").len(), 1, "{:?}", got.iter().map(|r| &r.labels["service_name"]).collect::<Vec<_>>());
    assert_eq!(service(&got, "svc-ruled").len(), 1);
}

/// A C program whose spinning function's name is `len` bytes long.
fn long_name_program(dir: &Path, len: usize) -> (std::path::PathBuf, String) {
    let name = format!("start_{}_tail_marker", "x".repeat(len - "start__tail_marker".len()));
    let src = format!(
        "#include <stdlib.h>\n#include <time.h>\nstatic volatile unsigned long sink;\n\
         __attribute__((noinline)) void {name}(double end) {{ struct timespec t; do {{ for (int i = 0; i < 100000; i++) sink += i; \
         clock_gettime(CLOCK_MONOTONIC, &t); }} while (t.tv_sec + t.tv_nsec / 1e9 < end); }}\n\
         int main(int argc, char **argv) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); {name}(t.tv_sec + t.tv_nsec / 1e9 + atof(argv[1])); return 0; }}\n"
    );
    std::fs::write(dir.join("longname.c"), src).unwrap();
    common::cuda::cc_in(dir, &["-O2", "-g", "-fno-omit-frame-pointer", "-o", "longname", "longname.c"]);
    (dir.join("longname"), name)
}

#[test]
fn a_70000_byte_function_name_arrives_capped() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (exe, name) = long_name_program(dir.path(), 70_000);
    assert_eq!(name.len(), 70_000);
    let _w = Workload(Command::new(&exe).arg("60").spawn().unwrap());
    sleep(Duration::from_millis(300));
    let receiver = Receiver::start(Box::new(|_| 200));
    gpuflame_ok(&["agent", "--server", &receiver.url(), "--once", "--window", "2", "-F", "99"], 0);
    assert_clean(&receiver);
    let got = receiver.received();
    let r = service(&got, "longname");
    assert_eq!(r.len(), 1);
    // Pyroscope cuts names over 64 KiB (keeping the end); the agent already capped them at 4096.
    assert!(r[0].longest_string <= 4096, "a string of {} bytes was pushed", r[0].longest_string);
    let capped = format!("…{}", &name[name.len() - 4093..]);
    let p = &r[0].profile;
    let hits: i64 = p.samples.iter().filter(|s| s.stack.iter().any(|&l| p.locations[l].lines.iter().any(|line| line.function == capped))).map(|s| s.value()).sum();
    assert!(hits * 2 > p.total(), "the capped name holds {hits} of {}", p.total());
}

#[test]
fn a_window_of_32768_distinct_stacks_arrives_within_pyroscopes_limits() {
    require_bpf();
    let _serial = serial();
    // Allocation stacks, not CPU samples: every one is recorded, whatever CPU the machine has.
    let dir = tempfile::tempdir().unwrap();
    common::cuda::build_stand_ins(dir.path());
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let src = common::cuda::source("many_allocs.c");
    common::cuda::cc_in(dir.path(), &["-O0", "-g", "-fno-omit-frame-pointer", "-o", "many_allocs", &src, "-L.", "-l:libcudart.so.13", "-l:libcuda.so.1", &rpath]);
    let receiver = Receiver::start(Box::new(|_| 200));
    let agent = agent(&["--server", &receiver.url(), "--once", "--window", "15", "--profiles", "hbm-alloc", "-v"]);
    let gate = dir.path().join("go");
    let app = Workload(Command::new(dir.path().join("many_allocs")).env("GATE", &gate).env("LINGER_MS", "20000").stdout(Stdio::null()).spawn().unwrap());
    // Its allocations count once the hooks are in.
    let hooked = format!("pid={}", app.0.id());
    let started = Instant::now();
    while !agent.lines.lock().unwrap().iter().any(|l| l.contains("CUDA found and hooked") && l.contains(&hooked)) {
        assert!(started.elapsed() < HANG, "the program was not hooked:\n{}", agent.lines.lock().unwrap().join("\n"));
        sleep(Duration::from_millis(50));
    }
    std::fs::write(&gate, b"").unwrap();
    while receiver.received().is_empty() && started.elapsed() < HANG {
        sleep(Duration::from_millis(200));
    }
    let log = agent.stop();
    drop(app);
    assert_clean(&receiver);
    let got = receiver.received();
    let r = service(&got, "many_allocs");
    assert_eq!(r.len(), 1, "{log}");
    let p = &r[0].profile;
    assert!(r[0].pushed_samples <= 16_000 && r[0].uncompressed <= 4 << 20, "{} samples, {} bytes", r[0].pushed_samples, r[0].uncompressed);
    let trimmed_frame = p.locations.iter().flat_map(|l| &l.lines).find(|l| l.function.starts_with("[trimmed: ")).map(|l| l.function.clone());
    let trimmed: u64 = trimmed_frame.as_deref().and_then(|f| f.trim_start_matches("[trimmed: ").split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    let stacks = p.samples.len() as u64 - u64::from(trimmed > 0) + trimmed;
    let stats = summary(&log);
    eprintln!("{stacks} distinct stacks: {} pushed, {trimmed} trimmed; {} uncompressed bytes; {stats:?}", r[0].pushed_samples, r[0].uncompressed);
    assert_eq!(stacks, 1 << 15, "every allocation stack of the window");
    assert_eq!(stats["stacks trimmed"], trimmed, "counted");
    assert_eq!(stats["profiles trimmed"], 1);
    // The trimmed stacks' bytes are kept, under one [trimmed …] stack.
    assert_eq!(p.total(), (1 << 15) * 4096);
}

/// Runs `gpuflame agent -F 5000` for `secs` seconds, `runs` times, while C programs are compiled
/// and run over and over beside it (files written, mapped, replaced: what a build does); fails
/// on a run that does not exit by itself with success. Returns each run's wall time.
fn high_frequency_runs(runs: usize, secs: u64) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let builder = {
        let (dir, stop) = (dir.path().to_path_buf(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for prog in ["chain", "threads", "recursion"] {
                    let exe = build_c(&dir, prog, FP_FLAGS);
                    let _ = Command::new(&exe).arg("0.2").status();
                    n += 1;
                }
            }
            n
        })
    };
    let receiver = Receiver::start(Box::new(|_| 200));
    let mut times = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let out = Command::new(GPUFLAME)
            .args(["agent", "--server", &receiver.url(), "--once", "--window", &secs.to_string(), "-F", "5000"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        times.push(started.elapsed().as_secs_f64());
        assert!(out.status.success(), "run {run} ended with {:?}:\n{log}", out.status);
        summary(&log);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let builds = builder.join().unwrap();
    eprintln!("{runs} runs of {secs} s at 5000 Hz beside {builds} compile-and-run rounds: wall times {times:?}");
    times
}

#[test]
fn five_thousand_hertz_survives_builds_beside_it() {
    require_bpf();
    let _serial = serial();
    high_frequency_runs(3, 15);
}

/// The long form of the check above (10 runs of 60 s, about 12 minutes): run by hand with
/// `cargo test -p gpuflame --test agent -- --ignored --test-threads=1 five_thousand`.
#[test]
#[ignore]
fn five_thousand_hertz_for_a_minute_ten_times() {
    require_bpf();
    let _serial = serial();
    high_frequency_runs(10, 60);
}
