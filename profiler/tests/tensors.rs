//! PyTorch's caching allocator against a stand-in libc10_cuda.so with the real mangled names
//! (tests/programs/cuda/fake_c10_cuda.cpp): tensor stacks exact in bytes, frees by pointer, a
//! reused block given to its second owner, reserved against allocated, the out-of-memory report
//! naming what holds the memory, the memory timeline, attaching late. Real BPF, real processes.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use gpuflame::output::pprof;

const MIB: u64 = 1 << 20;

struct Fixture {
    dir: tempfile::TempDir,
    app: PathBuf,
}

impl Fixture {
    /// The stand-ins, libc10_cuda.so with PyTorch's USDT probes.
    fn build() -> Fixture {
        Fixture::build_with(true)
    }

    /// `notes`: libc10_cuda.so with the probes, or without them (followed by hooks).
    fn build_with(notes: bool) -> Fixture {
        Fixture::build_shaped(notes, &[])
    }

    fn build_shaped(notes: bool, defines: &[&str]) -> Fixture {
        require_bpf();
        let dir = tempfile::tempdir().unwrap();
        common::cuda::build_stand_ins(dir.path());
        let app = common::cuda::build_c10_with(dir.path(), notes, defines);
        Fixture { app, dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `gpuflame -v record ARGS -- PROGRAM…` with the program held at the gate until its tables
    /// are in; gpuflame's stderr and the program's key=value lines.
    fn record(&self, args: &[&str], env: &[(&str, &str)], program: &[&str]) -> (String, BTreeMap<String, String>) {
        self.record_on(None, args, env, program)
    }

    /// The same, with gpuflame acting as if the kernel lacked `lacks` (common::PRETEND_KERNEL_LACKS).
    fn record_on(&self, lacks: Option<&str>, args: &[&str], env: &[(&str, &str)], program: &[&str]) -> (String, BTreeMap<String, String>) {
        let gate = Gate::new(self.dir.path(), "gate");
        let result = self.path("result.txt");
        // exec keeps the program's pid, which the gate waits for.
        let script = format!("exec \"$@\" > {result}");
        let mut cmd: Vec<&str> = vec!["record"];
        cmd.extend_from_slice(args);
        cmd.extend_from_slice(&["--", "env"]);
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        cmd.extend(env.iter().map(String::as_str));
        cmd.extend_from_slice(&["sh", "-c", &script, "sh"]);
        cmd.extend_from_slice(program);
        let (status, stderr) = record_gated_with_env(&gate, &cmd, 1, &[(PRETEND_KERNEL_LACKS, lacks)]);
        assert!(status.success(), "{stderr}");
        (stderr, common::cuda::key_values(&std::fs::read_to_string(&result).unwrap_or_default()))
    }
}

fn num(kv: &BTreeMap<String, String>, key: &str) -> u64 {
    kv.get(key).unwrap_or_else(|| panic!("the program printed no {key}: {kv:?}")).parse().unwrap()
}

/// Bytes of the stacks through a frame that starts with `function`, ending at the allocator.
fn under(stacks: &[Stack], function: &str) -> u64 {
    stacks
        .iter()
        .filter(|s| s.user().iter().any(|f| f.starts_with(function)) && s.user().last() == Some(&"CUDACachingAllocator::malloc"))
        .map(|s| s.count)
        .sum()
}

/// What record's summary says of a device, as `DeviceUse` words it.
fn device_line(device: u32, reserved: u64, allocated: u64, outside: u64) -> String {
    use gpuflame::cuda::human_bytes as h;
    format!("device {device}: reserved {}, allocated {}, cached {}; outside the allocator {}", h(reserved), h(allocated), h(reserved - allocated), h(outside))
}

/// The argument specs of the library's pytorch:malloc note.
fn malloc_probe_args(lib: &str) -> Vec<String> {
    let data = std::fs::read(lib).unwrap();
    let probes = gpuflame_elfread::ElfFile::parse(&data[..]).unwrap().sdt_probes().unwrap();
    let malloc = probes.iter().find(|p| p.provider == "pytorch" && p.name == "malloc").unwrap_or_else(|| panic!("no pytorch:malloc note in {lib}: {probes:?}"));
    malloc.args.split_whitespace().map(str::to_string).collect()
}

/// Through the probes, with pointer and device in registers (as the real library's note has
/// them) and in the frame (as another build may), and by the hooks where the library has no
/// notes: the same figures.
#[test]
fn tensor_stacks_are_exact_and_a_reused_block_belongs_to_its_second_owner() {
    for (notes, in_frame) in [(true, false), (true, true), (false, false)] {
        tensor_stacks_are_exact(notes, in_frame, None);
    }
}

/// Kernels before uprobe sessions (6.13): the hooks of the copy without notes are an entry probe,
/// a return probe, and an entry probe at the instructions after a call; the probes the same.
#[test]
fn tensor_stacks_are_exact_through_entry_and_return_probes() {
    for notes in [false, true] {
        tensor_stacks_are_exact(notes, false, Some("sessions"));
    }
}

fn tensor_stacks_are_exact(notes: bool, in_frame: bool, lacks: Option<&str>) {
    let fx = Fixture::build_shaped(notes, if in_frame { &["-DGF_SDT_ARGS_IN_FRAME"] } else { &[] });
    if notes {
        // Pointer, device, size: what is read of the probe; the stream is not.
        let args = malloc_probe_args(&fx.path("libc10_cuda.so"));
        let in_memory: Vec<bool> = args.iter().take(3).map(|a| a.contains('(')).collect();
        let expected = if in_frame { [true, true, false] } else { [false, false, false] };
        assert_eq!(in_memory, expected, "the note's arguments are not of the shape this run tests: {args:?}");
    }
    let out = fx.path("t.folded");
    let app = fx.app.display().to_string();
    let (stderr, kv) = fx.record_on(lacks, &["--profiles", "tensor-inuse,tensor-alloc,hbm-inuse", "-o", &out], &[], &[&app, "exact"]);
    assert_eq!(kv["reused"], "1", "the stand-in gave the freed block to the second tensor");
    let probes = stderr.contains("lacks uprobe sessions (Linux 6.13): the CUDA call hooks use entry and return probes instead");
    assert_eq!(probes, lacks.is_some(), "the way of hooking is said exactly when it is the older one: {stderr}");
    let inuse = read_folded(Path::new(&fx.path("t.tensor-inuse.folded")));
    let alloc = read_folded(Path::new(&fx.path("t.tensor-alloc.folded")));
    let ctx = format!("{}\n{stderr}", describe(&inuse));
    for function in ["load_weights", "activations", "second_owner", "raw", "on_device_two"] {
        assert_eq!(under(&inuse, function), num(&kv, &format!("live_{function}_bytes")), "{function}: {ctx}");
    }
    // Freed through NativeCachingAllocator::free, raw_delete and the tensor deleter: nothing left.
    assert_eq!(under(&inuse, "direct_free"), 0, "{ctx}");
    // reuse() freed a weight and called second_owner(), which got its block: only the second
    // owner holds anything under reuse().
    assert_eq!(under(&inuse, "reuse()"), under(&inuse, "second_owner"), "{ctx}");
    assert_eq!(total(&inuse), num(&kv, "expected_allocated") + num(&kv, "expected_allocated_dev2"), "{ctx}");
    // Everything allocated, freed or not: 4 weights, 10 activations, 1 + 2 raw, 1 direct, 3 on device 2.
    assert_eq!(under(&alloc, "load_weights"), 4 * 8 * MIB, "{}", describe(&alloc));
    assert_eq!(under(&alloc, "activations"), 10 * MIB);
    assert_eq!(under(&alloc, "raw"), 5 * MIB);
    assert_eq!(under(&alloc, "direct_free"), 5 * MIB);
    assert!(stderr.contains("tensors: 21 allocated, 9 freed"), "{stderr}");
    let way = if notes { "through its USDT probes (pytorch:malloc, pytorch:free)" } else { "by hooks on its functions (it has no USDT notes)" };
    assert!(stderr.contains(&format!("tensors followed in {} {way}", fx.path("libc10_cuda.so"))), "{way}: {stderr}");
    assert!(!stderr.contains("before gpuflame attached"), "{stderr}");
    // Reserved (the stand-in's segments) against allocated, per device.
    let dev0 = device_line(0, num(&kv, "reserved"), num(&kv, "allocated"), 0);
    let dev2 = device_line(2, num(&kv, "reserved_dev2"), num(&kv, "allocated_dev2"), 0);
    assert!(stderr.contains(&format!("HBM at the end: {dev0}")) && stderr.contains(&format!("HBM at the end: {dev2}")), "{dev0}\n{dev2}\n{stderr}");
    assert_eq!(total(&read_folded(Path::new(&fx.path("t.hbm-inuse.folded")))), num(&kv, "reserved") + num(&kv, "reserved_dev2"));
}

/// Byte sampling (the agent's default, here through record's flag): tensors of the interval or
/// more keep exact stacks, smaller ones are drawn and weighed, every tensor is counted.
#[test]
fn byte_sampling_keeps_big_tensors_exact_and_counts_every_tensor() {
    let fx = Fixture::build();
    let out = fx.path("s.folded");
    let app = fx.app.display().to_string();
    let interval = (2 * MIB).to_string();
    let (stderr, kv) = fx.record(&["--profiles", "tensor-inuse,tensor-alloc", "--tensor-sample-bytes", &interval, "-o", &out], &[], &[&app, "sampled"]);
    let inuse = read_folded(Path::new(&fx.path("s.tensor-inuse.folded")));
    let alloc = read_folded(Path::new(&fx.path("s.tensor-alloc.folded")));
    let ctx = format!("{}\n{}\n{stderr}", describe(&inuse), describe(&alloc));
    // 4 MiB tensors: always drawn, weight 1.
    assert_eq!(under(&inuse, "keep_big"), num(&kv, "live_keep_big_bytes"), "{ctx}");
    assert_eq!(under(&alloc, "keep_big"), num(&kv, "live_keep_big_bytes"), "{ctx}");
    // 800 MiB in 4 KiB tensors: each drawn with a chance of 1 - exp(-4096 / 2 MiB) = 0.195%,
    // about 400 of them, weighed 512.5 each: the estimate's standard error is 5%.
    let churned = num(&kv, "churned_bytes") as f64;
    let estimate = under(&alloc, "churn_small") as f64;
    assert!((estimate / churned - 1.0).abs() < 0.25, "churn_small: {estimate} estimated for {churned}: {ctx}");
    // 20 MiB kept in 4 KiB tensors: about 10 drawn; only that the estimate is of that order.
    let small = under(&inuse, "keep_small") as f64;
    assert!(small < 5.0 * num(&kv, "live_keep_small_bytes") as f64, "keep_small: {small}: {ctx}");
    // Every tensor counted, and the totals exact.
    assert!(stderr.contains("tensors: 205008 allocated, 200000 freed"), "{stderr}");
    let drawn: u64 = stderr.split("byte sampling took the stacks of ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{stderr}"));
    eprintln!("byte sampling: churn_small {estimate} for {churned} ({:+.1}%), keep_small {small} for {}, {drawn} stacks taken", 100.0 * (estimate / churned - 1.0), num(&kv, "live_keep_small_bytes"));
    assert!((8 + 250..=8 + 600).contains(&drawn), "{drawn} stacks taken of 205,008 tensors (8 big, ~410 small expected): {stderr}");
    let dev0 = device_line(0, num(&kv, "reserved"), num(&kv, "allocated"), 0);
    assert!(stderr.contains(&format!("HBM at the end: {dev0}")), "{dev0}\n{stderr}");
}

#[test]
fn tensor_pprof_has_objects_devices_and_reserved_against_allocated() {
    let fx = Fixture::build();
    let out = fx.path("t.pb.gz");
    let app = fx.app.display().to_string();
    let (_, kv) = fx.record(&["--profiles", "tensor-inuse", "-o", &out], &[], &[&app, "exact"]);
    let profile = pprof::read(&std::fs::read(&out).unwrap()).unwrap();
    let types: Vec<_> = profile.sample_types.iter().map(|t| (t.kind.as_str(), t.unit.as_str())).collect();
    assert_eq!(types, [("inuse_space", "bytes"), ("inuse_objects", "count")]);
    let on = |d: u32, i: usize| -> i64 { profile.samples.iter().filter(|s| s.labels.device == Some(d)).map(|s| s.values[i]).sum() };
    assert_eq!((on(2, 0), on(2, 1)), (num(&kv, "allocated_dev2") as i64, 3));
    assert_eq!(on(0, 0), num(&kv, "allocated") as i64);
    let line = device_line(0, num(&kv, "reserved"), num(&kv, "allocated"), 0);
    assert!(profile.comments.iter().any(|c| c == &line), "{line}\n{:?}", profile.comments);
}

/// A vLLM-shaped program in Python: weights, a KV cache layer by layer, then requests that keep
/// a prefix cache and sample logits until an allocation fails.
#[test]
fn the_oom_report_names_the_kv_cache_first_and_the_timeline_marks_it() {
    let fx = Fixture::build();
    let python = "/usr/bin/python3.11";
    assert!(Path::new(python).exists(), "Debian's python3.11 is needed (scripts/setup.sh installs python3)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cuda/vllm_tensors.py").display().to_string();
    let out = fx.path("v.folded");
    let timeline = fx.path("memory.svg");
    let c10 = fx.path("libc10_cuda.so");
    let budget = (300 * MIB).to_string();
    let env = [("FAKE_CUDA_BUDGET", budget.as_str()), ("C10_CUDA", c10.as_str()), ("LINGER_MS", "300")];
    let (stderr, kv) = fx.record(&["--profiles", "tensor-inuse", "-o", &out, "--memory-timeline", &timeline], &env, &[python, &script]);
    let start = stderr.find("out of memory in pid").unwrap_or_else(|| panic!("no OOM report:\n{stderr}"));
    let report: Vec<&str> = stderr[start..].lines().take_while(|l| l.starts_with("out of memory") || l.starts_with("gpuflame:   ")).collect();
    let ctx = format!("{}\n---\n{stderr}", report.join("\n"));
    let head = report[0];
    assert!(head.contains(&format!("CUDACachingAllocator::malloc of {}", gpuflame::cuda::human_bytes(num(&kv, "oom_requested")))), "{ctx}");
    // Reserved, allocated and cached at the OOM: the allocator's own figures, and ours.
    let (allocated, reserved) = (num(&kv, "allocated"), num(&kv, "reserved"));
    assert!(head.contains(&device_line(0, reserved, allocated, 0)), "{ctx}");
    let says = format!("PyTorch's allocator says: allocated {}, reserved {}", gpuflame::cuda::human_bytes(allocated), gpuflame::cuda::human_bytes(reserved));
    assert!(report.iter().any(|l| l.contains(&says)), "{says}\n{ctx}");
    let holders: Vec<&&str> = report.iter().filter(|l| l.contains(" held by ")).collect();
    let kv_bytes = gpuflame::cuda::human_bytes(num(&kv, "kv_cache_bytes"));
    assert!(holders[0].contains(&format!("{kv_bytes} held by allocate_kv_cache (vllm_tensors.py:")), "{ctx}");
    assert!(holders.iter().any(|l| l.contains("load_model (vllm_tensors.py:")), "{ctx}");

    // The timeline: valid SVG; at every point the bands add up to the bytes in use; the OOM is
    // marked at a point whose total is what the tensors held then.
    let svg = std::fs::read_to_string(&timeline).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("not XML: {e}"));
    let points: Vec<(f64, u64, u64)> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("point"))
        .map(|n| {
            let bands: u64 = n.attribute("data-bands").unwrap().split(',').map(|v| v.parse::<u64>().unwrap()).sum();
            (n.attribute("data-t-s").unwrap().parse().unwrap(), n.attribute("data-total").unwrap().parse().unwrap(), bands)
        })
        .collect();
    assert!(points.len() > 10, "{} points", points.len());
    assert!(points.iter().all(|&(_, total, bands)| total == bands), "bands do not add up");
    assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
    let oom = doc.descendants().find(|n| n.attribute("class") == Some("oom")).expect("an OOM marker");
    let t: f64 = oom.attribute("data-t-s").unwrap().parse().unwrap();
    let at = points.iter().find(|p| (p.0 - t).abs() < 1e-6).unwrap_or_else(|| panic!("no point at the OOM's time {t}"));
    assert_eq!(at.1, allocated, "in use when it failed");
    // Then the program printed its figures and exited, and the driver took its memory back.
    assert_eq!(points.iter().rev().find(|p| p.1 != 0).unwrap().1, allocated, "in use before the exit");
    assert_eq!(points.last().unwrap().1, 0, "in use after the exit");
    assert!(svg.contains("allocate_kv_cache (vllm_tensors.py:"), "bands are named by their Python line");
}

/// The same shape in C++, out of memory by the allocator's own limit (as
/// `torch.cuda.set_per_process_memory_fraction` makes it): no CUDA call fails, the allocator's
/// report is the one.
#[test]
fn the_allocators_own_limit_is_an_oom_with_the_same_report() {
    let fx = Fixture::build();
    let out = fx.path("c.folded");
    let app = fx.app.display().to_string();
    let limit = (300 * MIB).to_string();
    let (stderr, kv) = fx.record(&["--profiles", "tensor-inuse,hbm-inuse", "-o", &out, "--memory-timeline", "none"], &[("C10_LIMIT", &limit), ("LINGER_MS", "300")], &[&app, "oom"]);
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("out of memory in pid")).collect();
    assert_eq!(reports.len(), 1, "one report for one failure:\n{stderr}");
    let (allocated, reserved) = (num(&kv, "allocated"), num(&kv, "reserved"));
    assert!(reports[0].contains("CUDACachingAllocator::malloc of 30.0 MiB") && reports[0].contains(&device_line(0, reserved, allocated, 0)), "{stderr}");
    assert!(reports[0].contains("sample_logits()"), "the failing stack: {stderr}");
    let holders: Vec<&str> = stderr.lines().filter(|l| l.contains(" held by ")).collect();
    assert!(holders[0].contains(&format!("{} held by allocate_kv_cache() ← oom", gpuflame::cuda::human_bytes(num(&kv, "kv_cache_bytes")))), "{stderr}");
    assert!(!stderr.contains("memory_timeline") && !Path::new(&fx.path("c.memory-timeline.svg")).exists(), "--memory-timeline none");
}

#[test]
fn tensors_allocated_before_attaching_are_counted_not_guessed() {
    let fx = Fixture::build();
    let gate = Gate::new(fx.dir.path(), "gate");
    let result = fx.path("late.txt");
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &format!("exec \"$0\" late > {result}"), &fx.app.display().to_string()]);
    let child = gate.spawn(&mut cmd);
    let pid = child.0.id();
    let out = fx.path("late.folded");
    let pid_arg = pid.to_string();
    let recording = Recording::start(&["record", "--profiles", "tensor-inuse", "-o", &out, "-p", &pid_arg]);
    gate.open_when_ready(&recording, &[pid]);
    let (status, stderr) = recording.finish();
    assert!(status.success(), "{stderr}");
    let kv = common::cuda::key_values(&std::fs::read_to_string(&result).unwrap());
    let inuse = read_folded(Path::new(&out));
    assert_eq!(under(&inuse, "after_attach"), num(&kv, "live_after_attach_bytes"), "{}", describe(&inuse));
    assert_eq!(total(&inuse), 4 * MIB, "nothing is guessed for the tensors from before");
    assert!(stderr.contains("tensors: 2 allocated, 0 freed, 5 frees of tensors allocated before gpuflame attached (their bytes are unknown"), "{stderr}");
}

#[test]
fn a_stripped_allocator_is_said_in_one_line_and_segments_still_hold() {
    let fx = Fixture::build();
    let lib = fx.path("libc10_cuda.so");
    let out = std::process::Command::new("strip").args(["--strip-all", &lib]).output().expect("strip (binutils)");
    assert!(out.status.success());
    let folded = fx.path("s.folded");
    let app = fx.app.display().to_string();
    let (stderr, kv) = fx.record(&["--profiles", "hbm-inuse,tensor-inuse", "-o", &folded], &[], &[&app, "exact"]);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("caching allocator cannot be followed")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("CUDACachingAllocator::malloc") && lines[0].contains("stripped"), "{}", lines[0]);
    assert!(stderr.contains("tensors not followed in"), "{stderr}");
    assert_eq!(total(&read_folded(Path::new(&fx.path("s.tensor-inuse.folded")))), 0);
    assert_eq!(total(&read_folded(Path::new(&fx.path("s.hbm-inuse.folded")))), num(&kv, "reserved") + num(&kv, "reserved_dev2"));
}

/// A deleter that frees through NativeCachingAllocator::free (a build that did not inline it):
/// each tensor's free passes two followed functions, and is one free. Before, under `record --
/// CMD`, which attached before any tensor existed: `9 freed, 7 frees of tensors allocated before
/// gpuflame attached`.
#[test]
fn a_free_through_two_followed_functions_is_counted_once() {
    for notes in [true, false] {
        let fx = Fixture::build_shaped(notes, &["-DGF_DELETER_CALLS_FREE"]);
        let out = fx.path("twice.folded");
        let app = fx.app.display().to_string();
        let (stderr, kv) = fx.record(&["--profiles", "tensor-inuse", "-o", &out], &[], &[&app, "exact"]);
        assert!(stderr.contains("tensors: 21 allocated, 9 freed\n") || stderr.trim_end().ends_with("tensors: 21 allocated, 9 freed"), "notes {notes}: {stderr}");
        assert!(!stderr.contains("before gpuflame attached"), "notes {notes}: {stderr}");
        assert_eq!(total(&read_folded(Path::new(&out))), num(&kv, "expected_allocated") + num(&kv, "expected_allocated_dev2"), "notes {notes}: {stderr}");
    }
}

/// The program's own copy of a probe semaphore: libc10_cuda.so's mapping at file offset 0 plus
/// the symbol's address (a shared library's first segment is at address 0).
fn semaphore(pid: u32, lib: &str, symbol: &str) -> u16 {
    let nm = std::process::Command::new("nm").arg(lib).output().expect("nm (binutils)");
    let text = String::from_utf8_lossy(&nm.stdout);
    let addr = text.lines().find(|l| l.ends_with(&format!(" {symbol}"))).and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok()).unwrap_or_else(|| panic!("{symbol} not in {lib}"));
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let base = maps
        .lines()
        .find(|l| l.ends_with(lib) && l.split_whitespace().nth(2) == Some("00000000"))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .unwrap_or_else(|| panic!("{lib} not mapped:\n{maps}"));
    let mut value = [0u8; 2];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut value, base + addr).unwrap();
    u16::from_ne_bytes(value)
}

/// PyTorch's probes cost nothing until a tracer raises their semaphores: up while gpuflame is
/// attached to the process, 0 again once it has gone.
#[test]
fn the_probes_semaphores_are_up_while_attached_and_down_after() {
    let fx = Fixture::build();
    let lib = fx.path("libc10_cuda.so");
    let mut app = std::process::Command::new(&fx.app);
    let child = Killed(app.args(["loop", "120", "200"]).stdout(std::process::Stdio::null()).spawn().unwrap());
    let pid = child.0.id();
    // Its libraries are mapped once it has allocated (loop's first step).
    let deadline = std::time::Instant::now() + HANG;
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().contains(&lib) {
        assert!(std::time::Instant::now() < deadline, "tensor_app did not map {lib}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let names = ["pytorch_malloc_semaphore", "pytorch_free_semaphore"];
    let before: Vec<u16> = names.iter().map(|n| semaphore(pid, &lib, n)).collect();
    let out = fx.path("sem.folded");
    let pid_arg = pid.to_string();
    let recording = Recording::start(&["record", "--profiles", "tensor-inuse", "-o", &out, "-p", &pid_arg]);
    recording.wait_for_line("followed through its USDT probes");
    let during: Vec<u16> = names.iter().map(|n| semaphore(pid, &lib, n)).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");
    let after: Vec<u16> = names.iter().map(|n| semaphore(pid, &lib, n)).collect();
    eprintln!("semaphores (malloc, free): before {before:?}, attached {during:?}, after {after:?}");
    assert_eq!(before, [0, 0], "raised before gpuflame attached");
    assert!(during.iter().all(|&v| v > 0), "not raised while attached: {during:?}\n{stderr}");
    assert_eq!(after, [0, 0], "still raised after gpuflame went");
    let allocated: u64 = read_folded(Path::new(&out)).iter().map(|s| s.count).sum();
    assert!(stderr.contains("tensors followed in") && stderr.contains("through its USDT probes"), "{stderr}");
    // The loop frees each tensor it allocates: at most the one between the two probes is held.
    assert!(allocated <= 64 << 10, "{allocated} bytes in use at the end");
    assert!(!stderr.contains("tensors: 0 allocated"), "{stderr}");
}
