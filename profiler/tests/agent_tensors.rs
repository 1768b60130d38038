//! PyTorch's tensors under the agent, on the stand-in caching allocator
//! (tests/programs/cuda/fake_c10_cuda.cpp): their own series, followed at the agent's defaults
//! with stacks sampled by bytes, an allocator without probes left alone, and what was in use at an
//! out-of-memory failure pushed as a series of its own. Real BPF, real processes, a local receiver.

mod common;

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::agent::*;
use common::receiver::{Received, Receiver};
use common::*;

/// One window of the agent (`args` after its server and `--once --window 4 -v`) beside tensor_app
/// `mode` on the stand-in allocator (`notes`: with PyTorch's USDT probes), named `trainer` and
/// held at its gate until the agent has hooked `hooked_file`: what the receiver got (checked
/// clean) and the agent's log.
fn agent_beside_tensor_app(args: &[&str], mode: &str, env: &[(&str, &str)], notes: bool, hooked_file: &str) -> (Vec<Received>, String) {
    let dir = tempfile::tempdir().unwrap();
    common::cuda::build_stand_ins(dir.path());
    let app = common::cuda::build_c10_with(dir.path(), notes, &[]);
    let receiver = Receiver::start(Box::new(|_| 200));
    let url = receiver.url();
    let mut all = vec!["--server", url.as_str(), "--once", "--window", "4", "-v"];
    all.extend_from_slice(args);
    let agent = agent(&all);
    let gate = Gate::new(dir.path(), "gate");
    let (var, path) = gate.env();
    let app = Workload(
        Command::new(&app).arg(mode).envs(env.iter().copied()).env("LINGER_MS", "8000").env("GPUFLAME_SERVICE_NAME", "trainer").env(var, path).stdout(Stdio::null()).spawn().unwrap(),
    );
    // Its first tensor comes as soon as the gate opens: once the allocator is hooked.
    let hooked = format!("CUDA found and hooked pid={}", app.0.id());
    let started = Instant::now();
    while !agent.lines.lock().unwrap().iter().any(|l| l.contains(&hooked) && l.contains(hooked_file)) {
        assert!(started.elapsed() < HANG, "{hooked_file} was not hooked:\n{}", agent.lines.lock().unwrap().join("\n"));
        sleep(Duration::from_millis(20));
    }
    std::fs::write(&gate.path, b"").unwrap();
    while receiver.received().is_empty() && started.elapsed() < HANG {
        sleep(Duration::from_millis(100));
    }
    let log = agent.stop();
    drop(app);
    assert_clean(&receiver);
    (receiver.received(), log)
}

/// The profiles of series `name` of the service `trainer`.
fn trainer_series<'a>(got: &'a [Received], name: &str) -> Vec<&'a Received> {
    service(got, "trainer").into_iter().filter(|r| r.labels.get("__name__").map(String::as_str) == Some(name)).collect()
}

/// PyTorch's tensors (the stand-in caching allocator) under the agent: their own series,
/// `tensor_inuse` and `tensor_alloc`, per device.
#[test]
fn tensor_profiles_are_pushed_as_series_of_their_own() {
    require_bpf();
    let _serial = serial();
    // Every stack taken: exact bytes per stack (the defaults sample them, below).
    let (got, log) = agent_beside_tensor_app(&["--profiles", "tensor-inuse,tensor-alloc", "--tensor-sample-bytes", "0"], "exact", &[], true, "libc10_cuda.so");
    let series = |name: &str| -> Vec<(String, i64)> {
        let mut out: Vec<(String, i64)> = service(&got, "trainer")
            .into_iter()
            .filter(|r| r.labels.get("__name__").map(String::as_str) == Some(name))
            .map(|r| (r.labels.get("device").cloned().unwrap_or_default(), r.profile.total()))
            .collect();
        out.sort();
        out
    };
    let all: Vec<_> = got.iter().map(|r| (&r.labels, r.profile.total())).collect();
    // tensor_app exact: 38 MiB live on device 0, 12 MiB on device 2; 72 MiB allocated in all.
    assert_eq!(series("tensor_inuse"), [("0".to_string(), 39_845_888), ("2".to_string(), 12_582_912)], "{all:#?}\n{log}");
    assert_eq!(series("tensor_alloc").iter().map(|s| s.1).sum::<i64>(), 72 << 20, "{all:#?}");
    assert!(series("hbm_inuse").is_empty(), "hbm-inuse was not asked for");
}

/// Bytes of the samples of `profile` whose stack holds a function starting with `function`.
fn bytes_under(profile: &gpuflame::profile::Profile, function: &str) -> i64 {
    profile
        .samples
        .iter()
        .filter(|s| s.stack.iter().any(|&l| profile.locations[l].lines.iter().any(|line| line.function.starts_with(function))))
        .map(|s| s.value())
        .sum()
}

/// At its defaults the agent follows tensors wherever PyTorch's allocator is, their stacks sampled
/// by bytes: the big ones exact, every tensor counted in the device's figures.
#[test]
fn the_agent_follows_tensors_at_its_defaults() {
    require_bpf();
    let _serial = serial();
    let (got, log) = agent_beside_tensor_app(&[], "sampled", &[], true, "libc10_cuda.so");
    let of = |name: &str| trainer_series(&got, name);
    let names: Vec<_> = got.iter().map(|r| (&r.labels["service_name"], &r.labels["__name__"])).collect();
    let inuse = of("tensor_inuse");
    assert_eq!(inuse.len(), 1, "one tensor_inuse series, device 0: {names:?}\n{log}");
    // tensor_app sampled: 8 tensors of 4 MiB kept, drawn every one.
    assert_eq!(bytes_under(&inuse[0].profile, "keep_big"), 32 << 20, "{log}");
    // 800 MiB allocated in 4 KiB tensors: estimated from the ~410 drawn.
    let churned = bytes_under(&of("tensor_alloc")[0].profile, "churn_small") as f64;
    assert!((churned / 819_200_000.0 - 1.0).abs() < 0.25, "churn_small: {churned}\n{log}");
    assert!(!of("hbm_inuse").is_empty(), "hbm-inuse is a default too: {names:?}");
    assert!(!of("process_cpu").is_empty(), "{names:?}");
}

/// Where the allocator has no USDT probes, its hooks (16-22 us a tensor) are not the agent's
/// default: one line says so, and segments are still followed.
#[test]
fn an_allocator_without_probes_is_not_hooked_at_the_agents_defaults() {
    require_bpf();
    let _serial = serial();
    let (got, log) = agent_beside_tensor_app(&[], "exact", &[], false, "");
    let of = |name: &str| trainer_series(&got, name).iter().map(|r| r.profile.total()).sum::<i64>();
    let said: Vec<&str> = log.lines().filter(|l| l.contains("not followed for tensors") && l.contains("libc10_cuda.so") && l.contains("no USDT probes")).collect();
    assert_eq!(said.len(), 1, "one line says why:\n{log}");
    assert_eq!(of("tensor_inuse") + of("tensor_alloc"), 0, "{log}");
    assert!(of("hbm_inuse") > 0, "segments are followed: {log}");
}

/// An out-of-memory failure the agent sees at its defaults: logged with what held the memory, and
/// its in-use picture pushed as a series of its own, the KV cache (8 MiB tensors: always drawn)
/// exact in it.
#[test]
fn the_agent_pushes_what_was_in_use_at_an_oom() {
    require_bpf();
    let _serial = serial();
    let limit = (300u64 << 20).to_string();
    let (got, log) = agent_beside_tensor_app(&[], "oom", &[("C10_LIMIT", &limit)], true, "libc10_cuda.so");
    let logged: Vec<&str> = log.lines().filter(|l| l.contains("out of memory")).collect();
    let names: Vec<_> = got.iter().map(|r| (r.labels["service_name"].clone(), r.labels["__name__"].clone(), r.profile.total())).collect();
    assert_eq!(logged.len(), 1, "{log}\n{names:?}");
    assert!(logged[0].contains("128.0 MiB allocate_kv_cache"), "the KV cache first among the holders: {}", logged[0]);
    let at_oom = trainer_series(&got, "memory_at_oom");
    assert_eq!(at_oom.len(), 1, "one memory_at_oom series: {:?}", got.iter().map(|r| &r.labels).collect::<Vec<_>>());
    let p = &at_oom[0].profile;
    assert_eq!(at_oom[0].labels.get("device").map(String::as_str), Some("0"));
    assert_eq!(bytes_under(p, "allocate_kv_cache"), 128 << 20);
    assert_eq!(bytes_under(p, "load_weights"), 64 << 20);
    assert_eq!(bytes_under(p, "[out of memory] 30.0 MiB requested"), 30 << 20, "the failing call, with what it asked for");
}

/// The agent starved: a CPU hog on every core beside it and the vLLM-shaped stand-in for 60 s.
/// Every window's tensor_inuse is what the stand-in's allocator held at the window's end: the
/// live set is read from the kernel, not rebuilt from records a starved reader may lose. The
/// stand-in logs its quiet times (no tensor allocated or freed) with what it held; a window whose
/// end falls in none (a batch running then) is said, not counted.
#[test]
fn a_starved_agent_pushes_the_in_use_the_program_has_at_every_windows_end() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    common::cuda::build_stand_ins(dir.path());
    common::cuda::build_c10_with(dir.path(), true, &[]);
    let c10 = dir.path().join("libc10_cuda.so");
    let python = "/usr/bin/python3.11";
    assert!(std::path::Path::new(python).exists(), "Debian's python3.11 is needed (scripts/setup.sh installs python3)");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cuda/vllm_tensors.py");
    let quiet_log = dir.path().join("quiet.log");
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let _hogs: Vec<Workload> = (0..cpus).map(|_| Workload(Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap())).collect();
    let receiver = Receiver::start(Box::new(|_| 200));
    let url = receiver.url();
    let agent = agent(&["--server", &url, "--window", "5", "--profiles", "tensor-inuse", "-v"]);
    let gate = Gate::new(dir.path(), "gate");
    let (var, path) = gate.env();
    let app = Workload(
        Command::new(python)
            .arg(&script)
            .args(["serve-for", "60"])
            .env("C10_CUDA", &c10)
            .env("QUIET_LOG", &quiet_log)
            .env("GPUFLAME_SERVICE_NAME", "trainer")
            .env(var, path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let hooked = format!("CUDA found and hooked pid={}", app.0.id());
    let started = Instant::now();
    while !agent.lines.lock().unwrap().iter().any(|l| l.contains(&hooked) && l.contains("libc10_cuda.so")) {
        assert!(started.elapsed() < HANG, "libc10_cuda.so was not hooked:\n{}", agent.lines.lock().unwrap().join("\n"));
        sleep(Duration::from_millis(20));
    }
    std::fs::write(&gate.path, b"").unwrap();
    let mut app = app;
    let ran = wait_bounded(&mut app.0, Duration::from_secs(60) + HANG).expect("the stand-in ran past its 60 s");
    assert!(ran.success(), "the stand-in failed");
    // The window the stand-in's last quiet time ends in.
    sleep(Duration::from_secs(6));
    let log = agent.stop();
    assert_clean(&receiver);
    let quiet: Vec<(f64, f64, i64)> = std::fs::read_to_string(&quiet_log)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    let (first, last) = (quiet[0].0, quiet[quiet.len() - 1].1);
    let got = receiver.received();
    let mut windows: Vec<(f64, i64)> = trainer_series(&got, "tensor_inuse").iter().map(|r| ((r.profile.time_nanos + r.profile.duration_nanos) as f64 / 1e9, r.profile.total())).collect();
    windows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut checked, mut in_batch) = (Vec::new(), Vec::new());
    for &(end, bytes) in windows.iter().filter(|w| w.0 > first && w.0 < last) {
        // Read at most a moment before the window's end was taken.
        match quiet.iter().find(|q| q.0 <= end - 0.05 && end + 0.005 <= q.1) {
            Some(q) => checked.push((end, bytes, q.2)),
            None => in_batch.push(end),
        }
    }
    let wrong: Vec<_> = checked.iter().filter(|c| c.1 != c.2).collect();
    eprintln!("{} windows checked, {} ended during a batch; agent CPU beside {cpus} hogs", checked.len(), in_batch.len());
    assert!(wrong.is_empty(), "windows whose in-use is not what the program held: {wrong:?}\n{log}");
    assert!(checked.len() >= 8, "{} of the ~12 windows ended in a quiet time: {checked:?} {in_batch:?}\n{log}", checked.len());
}
