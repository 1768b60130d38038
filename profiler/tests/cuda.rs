//! CUDA hooks against stand-in libcudart.so.13 and libcuda.so.1 that the tests build: exact HBM
//! totals per stack, out-of-memory snapshots, launch counts, CUDA-API time, a vLLM-like Python
//! start-up. Real BPF, real processes; run as root.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use gpuflame::output::pprof;

const MIB: u64 = 1 << 20;

/// The stand-ins and the C program that drives them, built into `dir`.
struct Fixture {
    dir: tempfile::TempDir,
    app: PathBuf,
}

impl Fixture {
    fn build() -> Fixture {
        require_bpf();
        let dir = tempfile::tempdir().unwrap();
        let app = common::cuda::build_stand_ins(dir.path());
        Fixture { app, dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `gpuflame record ARGS -- ENV… cuda_app APP_ARGS`; the app's stdout as key=value pairs.
    fn record(&self, args: &[&str], env: &[(&str, String)], app_args: &[&str]) -> (BTreeMap<String, String>, String) {
        self.record_on(&[], args, env, app_args)
    }

    /// The same, with `gpuflame_env` for gpuflame itself.
    fn record_on(&self, gpuflame_env: &[(&str, &str)], args: &[&str], env: &[(&str, String)], app_args: &[&str]) -> (BTreeMap<String, String>, String) {
        let mut cmd = vec!["record"];
        cmd.extend_from_slice(args);
        cmd.push("--");
        cmd.push("env");
        let env_args: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        cmd.extend(env_args.iter().map(String::as_str));
        let app = self.app.display().to_string();
        cmd.push(&app);
        cmd.extend_from_slice(app_args);
        let out = gpuflame_env_ok(&cmd, gpuflame_env, 0);
        (common::cuda::key_values(&String::from_utf8_lossy(&out.stdout)), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Total of the stacks whose user frames end with `suffix`.
fn under(stacks: &[Stack], suffix: &[&str]) -> u64 {
    stacks.iter().filter(|s| s.user().ends_with(suffix)).map(|s| s.count).sum()
}

#[test]
fn hbm_totals_per_stack_are_exact_and_frees_leave_in_use() {
    hbm_totals_are_exact(&[]);
}

/// Kernels before uprobe sessions (6.13): an entry and a return probe a function, the same totals.
#[test]
fn hbm_totals_are_exact_through_entry_and_return_probes() {
    hbm_totals_are_exact(&[(PRETEND_KERNEL_LACKS, "sessions")]);
}

fn hbm_totals_are_exact(gpuflame_env: &[(&str, &str)]) {
    let fx = Fixture::build();
    let out = fx.path("mem.folded");
    let (kv, stderr) = fx.record_on(gpuflame_env, &["--profiles", "hbm-alloc,hbm-inuse", "-o", &out], &[], &["memory"]);
    let probes = stderr.contains("lacks uprobe sessions (Linux 6.13): the CUDA call hooks use entry and return probes instead");
    assert_eq!(probes, !gpuflame_env.is_empty(), "the way of hooking is said exactly when it is the older one: {stderr}");
    let alloc = read_folded(Path::new(&fx.path("mem.hbm-alloc.folded")));
    let inuse = read_folded(Path::new(&fx.path("mem.hbm-inuse.folded")));
    let ctx = format!("alloc:\n{}\nin use:\n{}\nstderr:\n{stderr}", describe(&alloc), describe(&inuse));
    // cudaMalloc calls cuMemAlloc_v2 inside: each byte is counted once, under the runtime call.
    assert_eq!(under(&alloc, &["main", "run_memory", "alloc_weights", "cudaMalloc"]), 192 * MIB, "{ctx}");
    assert_eq!(under(&alloc, &["alloc_activations", "cudaMallocAsync"]), 64 * MIB, "{ctx}");
    assert_eq!(under(&alloc, &["alloc_driver", "cuMemAlloc_v2"]), 16 * MIB, "{ctx}");
    // Expandable segments: 3 x 20 MiB of physical memory; the 1 GiB address reservation is not memory.
    assert_eq!(under(&alloc, &["expandable_segment", "cuMemCreate"]), 60 * MIB, "{ctx}");
    assert_eq!(under(&alloc, &["alloc_managed", "cudaMallocManaged"]), 4 * MIB, "{ctx}");
    assert_eq!(total(&alloc), kv["alloc_bytes"].parse::<u64>().unwrap(), "{ctx}");
    // In use at the end: one weight freed, two activations freed, one driver block freed, one
    // physical piece unmapped and released.
    assert_eq!(under(&inuse, &["alloc_weights", "cudaMalloc"]), 128 * MIB, "{ctx}");
    assert_eq!(under(&inuse, &["alloc_activations", "cudaMallocAsync"]), 32 * MIB, "{ctx}");
    assert_eq!(under(&inuse, &["alloc_driver", "cuMemAlloc_v2"]), 8 * MIB, "{ctx}");
    assert_eq!(under(&inuse, &["expandable_segment", "cuMemCreate"]), 40 * MIB, "{ctx}");
    assert_eq!(total(&inuse), kv["inuse_bytes"].parse::<u64>().unwrap(), "{ctx}");
    assert!(alloc.iter().all(|s| !s.frames.iter().any(|f| f.contains("cuMemAlloc_v2")) || s.has_sequence(&["alloc_driver", "cuMemAlloc_v2"])), "driver calls nested in runtime calls are not counted: {ctx}");
}

#[test]
fn cuda_linked_into_another_library_is_found_by_its_symbols() {
    // The runtime built into a library of another name, as static cudart ends up inside
    // framework libraries: found by the functions it defines, not by its file name.
    let fx = Fixture::build();
    let d = fx.dir.path();
    common::cuda::cc_in(d, &["-O2", "-g", "-shared", "-fPIC", "-Wl,-soname,libframework.so", "-o", "libframework.so", &common::cuda::source("fake_cudart.c"), "-L.", "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread"]);
    common::cuda::cc_in(d, &["-O2", "-g", "-rdynamic", "-o", "framework_app", &common::cuda::source("cuda_app.c"), "-L.", "-l:libframework.so", "-l:libcuda.so.1", &format!("-Wl,-rpath,{}", d.display())]);
    let out = fx.path("fw.folded");
    let app = fx.path("framework_app");
    gpuflame_ok(&["record", "--profiles", "hbm-alloc", "-o", &out, "--", &app, "memory"], 0);
    let stacks = read_folded(Path::new(&out));
    assert_eq!(under(&stacks, &["alloc_weights", "cudaMalloc"]), 192 * MIB, "{}", describe(&stacks));
}

#[test]
fn hbm_pprof_has_both_values_and_the_device() {
    let fx = Fixture::build();
    let out = fx.path("mem.pb.gz");
    fx.record(&["--profiles", "hbm-inuse", "-o", &out], &[], &["memory"]);
    let profile = pprof::read(&std::fs::read(&out).unwrap()).unwrap();
    let types: Vec<(&str, &str)> = profile.sample_types.iter().map(|t| (t.kind.as_str(), t.unit.as_str())).collect();
    assert_eq!(types, vec![("inuse_space", "bytes"), ("inuse_objects", "count")]);
    let objects: i64 = profile.samples.iter().map(|s| s.values[1]).sum();
    // 2 weights, 2 activations, 1 driver block, 2 physical pieces, 1 managed block.
    assert_eq!(objects, 8);
    let by_device = |d: u32| -> i64 { profile.samples.iter().filter(|s| s.labels.device == Some(d)).map(|s| s.values[0]).sum() };
    // cudaSetDevice(1) before the allocations; cuMemCreate asks for device 3 in its properties.
    assert_eq!(by_device(3), (40 * MIB) as i64);
    assert_eq!(by_device(1), ((128 + 32 + 8 + 4) * MIB) as i64);
    assert!(profile.samples.iter().all(|s| s.labels.pid.is_some()));
}

#[test]
fn out_of_memory_writes_a_snapshot_with_the_failing_stack() {
    let fx = Fixture::build();
    let out = fx.path("oom.folded");
    // The program lives on for 300 ms after its OOM, as a real one does (a traceback, a log
    // line). One CI run of a program that exited within a millisecond of it had none of its
    // frames placed in a file (not seen here in 150 runs, with CPU hogs, cold caches, or
    // gpuflame frozen for 1.5 s at points of the run); if its records come after its maps are
    // gone, a warning says so, and the assertion below prints it.
    let env = [("FAKE_CUDA_BUDGET", (100 * MIB).to_string()), ("LINGER_MS", "300".to_string())];
    let (kv, stderr) = fx.record(&["--profiles", "hbm-inuse", "-o", &out], &env, &["oom"]);
    assert_eq!(kv["kv_cache_result"], "2", "the stand-in failed the allocation with cudaErrorMemoryAllocation");
    let line = stderr.lines().find(|l| l.contains("out of memory in pid")).unwrap_or_else(|| panic!("no OOM line:\n{stderr}"));
    assert!(line.contains("cudaMalloc of 128.0 MiB") && line.contains("holding 64.0 MiB") && line.contains("allocate_kv_cache"), "{line}\n{stderr}");
    let snapshot_path = line.rsplit("→ ").next().unwrap().trim();
    let snapshot = read_folded(Path::new(snapshot_path));
    let ctx = describe(&snapshot);
    assert_eq!(under(&snapshot, &["load_model", "cudaMalloc"]), 64 * MIB, "{ctx}");
    assert_eq!(under(&snapshot, &["allocate_kv_cache", "cudaMalloc", "[out of memory] 128.0 MiB requested"]), 128 * MIB, "{ctx}");
    assert!(snapshot_path.contains(".oom-"), "{snapshot_path}");
}

#[test]
fn exact_launch_counts_match_what_the_program_did() {
    exact_launch_counts(&[], &["--cuda-exact"]);
}

/// Kernels before uprobe sessions (6.13): launch hooks stay attached even at the defaults (a
/// window's links cannot be attached and detached in time), and count exactly, said in a line.
#[test]
fn launches_at_defaults_are_counted_exactly_through_entry_and_return_probes() {
    let stderr = exact_launch_counts(&[(PRETEND_KERNEL_LACKS, "sessions")], &[]);
    assert!(stderr.contains("the CUDA call hooks use entry and return probes instead, and launches are hooked all the time"), "{stderr}");
}

fn exact_launch_counts(gpuflame_env: &[(&str, &str)], flags: &[&str]) -> String {
    let fx = Fixture::build();
    let out = fx.path("l.folded");
    let mut args = vec!["--profiles", "gpu-launches", "-o", &out];
    args.extend_from_slice(flags);
    let (kv, stderr) = fx.record_on(gpuflame_env, &args, &[], &["launches", "2000"]);
    let stacks = read_folded(Path::new(&out));
    let ctx = format!("{}\n{stderr}", describe(&stacks));
    // The runtime launch calls the driver's cuLaunchKernel: counted once, named by its host stub.
    assert_eq!(under(&stacks, &["train_step", "cudaLaunchKernel", "[gpu] vector_add_kernel"]), kv["runtime_launches"].parse::<u64>().unwrap(), "{ctx}");
    // A driver launch is named by the kernel handle that cuLibraryGetKernel returned (cuBLAS 13's
    // way; the runtime's lookups use cuModuleGetFunction).
    assert_eq!(under(&stacks, &["gemm", "cuLaunchKernelEx", "[gpu] sm90_xmma_gemm_bf16"]), kv["ex_launches"].parse::<u64>().unwrap(), "{ctx}");
    assert_eq!(under(&stacks, &["replay_graph", "cudaGraphLaunch"]), kv["graph_launches"].parse::<u64>().unwrap(), "{ctx}");
    assert_eq!(total(&stacks), 2000 + 1000 + 200, "{ctx}");
    stderr
}

#[test]
fn kernels_of_a_stripped_library_are_named_by_the_driver_launch_the_runtime_made() {
    let fx = Fixture::build();
    let out = fx.path("s.folded");
    // The program lives on for 300 ms after its launches, as a real one does. The launches follow
    // the dlopen at once, so their stacks stop at `[native: unknown code]` above the library (as
    // README says), and its frame is named from the maps read after the dlopen: one CI run of a
    // program that exited within milliseconds of its dlopen (and 1 in 30 here beside two CPU hogs)
    // was gone before they could be read, and the frame stayed `[unknown]`.
    let env = [("LINGER_MS", "300".to_string())];
    let (kv, stderr) = fx.record(&["--profiles", "gpu-launches", "--cuda-exact", "-o", &out], &env, &["stripped", "300"]);
    let stacks = read_folded(Path::new(&out));
    let ctx = format!("{}\n{stderr}", describe(&stacks));
    // The host stub has no symbol; the runtime launched it through cuLaunchKernel with the handle
    // cuModuleGetFunction gave for its registered name, which is demangled. The name is what this
    // test is about.
    let named = under(&stacks, &["launch_softmax", "cudaLaunchKernel", "[gpu] softmax_kernel(float*)"]);
    assert_eq!(named, kv["stripped_launches"].parse::<u64>().unwrap(), "{ctx}");
    assert_eq!(total(&stacks), 300, "{ctx}");
}

#[test]
fn sampled_launch_counts_are_scaled_and_labelled() {
    let fx = Fixture::build();
    let out = fx.path("l.pb.gz");
    // About 5 s of launches at 20 us each: five duty-cycle windows. With three, the one that fell
    // in the program's start, before its first launch, weighed a third and put the estimate at
    // 0.37x in one run of three.
    let (kv, stderr) = fx.record(&["-v", "--profiles", "gpu-launches", "-o", &out], &[("FAKE_CUDA_LAUNCH_NS", "20000".into())], &["launches", "200000"]);
    let profile = pprof::read(&std::fs::read(&out).unwrap()).unwrap();
    let truth: i64 = ["runtime_launches", "ex_launches", "graph_launches"].iter().map(|k| kv[*k].parse::<i64>().unwrap()).sum();
    let estimate = profile.total();
    // Hooks cost this VM about as much as these launches, which makes the estimate coarse (see
    // BENCHMARKS.md); what must hold is that the windows' counts are scaled up to the right order
    // (unscaled they are ~1/50 of the truth). Within 4x: with three or four 10 ms windows, a
    // program preempted inside one by the parallel tests came out at 0.43x once in 11 runs, and
    // at 0.317x once in a clean clone's CI (2026-12-06); 4x is still 12x from unscaled.
    let observed = stderr.lines().find_map(|l| l.split("launches_seen=").nth(1)?.split_whitespace().next()?.parse::<i64>().ok()).unwrap_or(0);
    assert!(observed > 0 && observed < truth / 5, "the hooks saw {observed} of {truth} launches: they were not duty-cycled\n{stderr}");
    eprintln!("estimated {estimate} launches for {truth} ({:.2}x)", estimate as f64 / truth as f64);
    assert!((truth / 4..=truth * 4).contains(&estimate), "estimated {estimate} launches for {truth}\n{stderr}");
    assert!(profile.comments.iter().any(|c| c.starts_with("sampled:")), "{:?}", profile.comments);
}

#[test]
fn cuda_api_time_is_under_the_waiting_stack() {
    let fx = Fixture::build();
    let out = fx.path("api.folded");
    fx.record(&["--profiles", "cuda-api", "-o", &out, "--cuda-exact"], &[("FAKE_CUDA_SYNC_US", "2000".into())], &["sync", "50"]);
    let stacks = read_folded(Path::new(&out));
    let ns = under(&stacks, &["wait_for_gpu", "cudaDeviceSynchronize"]);
    // 50 synchronisations of at least 2 ms each, counted once although the runtime calls the driver.
    assert!((100_000_000..200_000_000).contains(&ns), "{ns} ns\n{}", describe(&stacks));
}

#[test]
fn vllm_like_kv_cache_is_under_the_python_function_that_made_it() {
    let fx = Fixture::build();
    let python = "/usr/bin/python3.11";
    assert!(Path::new(python).exists(), "Debian's python3.11 is needed (scripts/setup.sh installs python3)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cuda/vllm_like.py");
    let out = fx.path("vllm.folded");
    let budget = (512 * MIB).to_string();
    let cudart = fx.path("libcudart.so.13");
    let script = script.display().to_string();
    let args = ["record", "--profiles", "hbm-inuse", "-o", &out, "--", "env", &format!("FAKE_CUDA_BUDGET={budget}"), "FAKE_CUDA_SYNC_US=5000", &format!("CUDART={cudart}"), python, &script];
    let run = gpuflame_ok(&args, 0);
    let kv = common::cuda::key_values(&String::from_utf8_lossy(&run.stdout));
    let stacks = read_folded(Path::new(&out));
    let ctx = format!("{}\n{}", describe(&stacks), String::from_utf8_lossy(&run.stderr));
    let kv_cache: u64 = kv["kv_cache_bytes"].parse().unwrap();
    let in_fn = |name: &str| -> u64 {
        stacks
            .iter()
            .filter(|s| s.user().iter().any(|f| f.starts_with(&format!("{name} (vllm_like.py"))) && s.user().last() == Some(&"cudaMalloc"))
            .map(|s| s.count)
            .sum()
    };
    assert_eq!(in_fn("allocate_kv_cache"), kv_cache, "{ctx}");
    assert_eq!(in_fn("load_weights"), kv["weights_bytes"].parse::<u64>().unwrap(), "{ctx}");
    assert_eq!(in_fn("profile_run"), 0, "the profile run's activations were freed: {ctx}");
    let kv_stack = stacks.iter().find(|s| s.user().iter().any(|f| f.starts_with("allocate_kv_cache ("))).unwrap();
    let user = kv_stack.user();
    let main = user.iter().position(|f| f.starts_with("main (vllm_like.py")).expect("main above allocate_kv_cache");
    assert!(user[main + 1].starts_with("allocate_kv_cache (vllm_like.py"), "{ctx}");
}

/// The stand-in CUPTI gives each kernel record 1000 ns per character of the kernel's name.
fn kernel_ns(name: &str) -> u64 {
    1000 * name.len() as u64
}

/// GPU time per launching stack, from `launches N` of cuda_app: N runtime launches of
/// vector_add_kernel, N/2 cuLaunchKernelEx of sm90_xmma_gemm_bf16, N/10 graph launches of two
/// kernels each.
fn check_gpu_time(stacks: &[Stack], n: u64, ctx: &str) {
    let runtime = under(stacks, &["[gpu] vector_add_kernel"]);
    assert_eq!(runtime, n * kernel_ns("vector_add_kernel"), "{ctx}");
    assert!(stacks.iter().filter(|s| s.user().last() == Some(&"[gpu] vector_add_kernel")).all(|s| s.has_sequence(&["main", "run_launches", "train_step", "cudaLaunchKernel"])), "{ctx}");
    assert_eq!(under(stacks, &["gemm", "cuLaunchKernelEx", "report_kernel", "[gpu] sm90_xmma_gemm_bf16"]), n / 2 * kernel_ns("sm90_xmma_gemm_bf16"), "{ctx}");
    // A graph's kernels go to the stack that launched the graph.
    for node in ["graph_node_a", "graph_node_bb"] {
        let leaf = format!("[gpu] {node}");
        assert_eq!(under(stacks, &["replay_graph", "cudaGraphLaunch", "cuGraphLaunch", "report_launch", &leaf]), n / 10 * kernel_ns(node), "{ctx}");
    }
    assert_eq!(total(stacks), n * 17_000 + n / 2 * 19_000 + n / 10 * 25_000, "nothing else, nothing unattributed: {ctx}");
}

#[test]
fn gpu_time_is_exact_under_the_launching_stacks() {
    let fx = Fixture::build();
    let out = fx.path("g.folded");
    let cupti = fx.path("libcupti.so.13");
    let (_, stderr) = fx.record(&["--profiles", "gpu-time", "--cuda-exact", "-o", &out], &[("GPUFLAME_CUPTI_PATH", cupti)], &["launches", "200"]);
    let stacks = read_folded(Path::new(&fx.path("g.gpu-time.folded")));
    check_gpu_time(&stacks, 200, &format!("{}\n{stderr}", describe(&stacks)));
    // The stand-ins for when CUPTI is missing come along.
    assert_eq!(total(&read_folded(Path::new(&fx.path("g.gpu-launches.folded")))), 200 + 100 + 20);
}

#[test]
fn gpu_time_of_unsampled_launches_goes_to_their_call_sites() {
    let fx = Fixture::build();
    let out = fx.path("g.pb.gz");
    let cupti = fx.path("libcupti.so.13");
    // About 3 s of launches at 20 us each: the launch hooks see a few windows of them.
    let env = [("GPUFLAME_CUPTI_PATH", cupti), ("FAKE_CUDA_LAUNCH_NS", "20000".to_string())];
    let (_, stderr) = fx.record(&["--profiles", "gpu-time", "-o", &out], &env, &["launches", "60000"]);
    let profile = pprof::read(&std::fs::read(fx.path("g.gpu-time.pb.gz")).unwrap()).unwrap();
    let comment = profile.comments.iter().find(|c| c.starts_with("gpu time of")).cloned().unwrap_or_default();
    let mut folded = Vec::new();
    gpuflame::output::folded::write(&profile, gpuflame::output::Detail::Lines, &mut folded).unwrap();
    let stacks = parse_folded(&String::from_utf8(folded).unwrap());
    check_gpu_time(&stacks, 60000, &format!("{comment}\n{}\n{stderr}", describe(&stacks)));
    assert_eq!(profile.sample_type().kind, "gpu");
    let by_site = comment.split("% by kernel and call site").next().and_then(|s| s.rsplit(' ').next()).and_then(|p| p.parse::<f64>().ok());
    assert!(by_site.is_some_and(|p| p > 50.0), "most launches were not sampled: {comment}");
}

#[test]
fn gpu_time_of_a_short_burst_at_defaults_goes_to_its_launching_stacks() {
    let fx = Fixture::build();
    let out = fx.path("g.folded");
    let cupti = fx.path("libcupti.so.13");
    // 200 launches in about a millisecond, which no 10 ms window of the launch hooks would see
    // (on an H200, a 5 s program's 2,611 kernels all went unattributed that way): the injection
    // library passes each kernel's first launches on itself.
    let (_, stderr) = fx.record(&["--profiles", "gpu-time", "-o", &out], &[("GPUFLAME_CUPTI_PATH", cupti)], &["launches", "200"]);
    let stacks = read_folded(Path::new(&fx.path("g.gpu-time.folded")));
    check_gpu_time(&stacks, 200, &format!("{}\n{stderr}", describe(&stacks)));
}

#[test]
fn another_cupti_subscriber_means_no_gpu_time_and_one_line() {
    let fx = Fixture::build();
    let out = fx.path("g.folded");
    let cupti = fx.path("libcupti.so.13");
    let env = [("GPUFLAME_CUPTI_PATH", cupti), ("FAKE_CUPTI_BUSY", "1".to_string())];
    let (kv, stderr) = fx.record(&["--profiles", "gpu-time", "--cuda-exact", "-o", &out], &env, &["launches", "100"]);
    assert_eq!(kv["failures"], "0", "the program is not disturbed");
    // Said by the injection library in the program's own stderr, and by gpuflame once. The
    // library reports it at once, not only from a thread that a program exiting at once never
    // ran (gpuflame missed it in half the runs then).
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("no GPU time: another CUPTI subscriber is active")).collect();
    let library: Vec<&str> = stderr.lines().filter(|l| l.starts_with("gpuflame CUPTI: another CUPTI subscriber is active")).collect();
    assert!(ours.len() == 1 && library.len() == 1, "{stderr}");
    assert_eq!(total(&read_folded(Path::new(&fx.path("g.gpu-time.folded")))), 0);
    assert_eq!(total(&read_folded(Path::new(&fx.path("g.gpu-launches.folded")))), 100 + 50 + 10, "gpu-launches stands in");
}

#[test]
fn without_gpuflame_the_injection_library_waits_only_as_long_as_asked() {
    // A service started by hand with GPUFLAME_CUPTI_WAIT_MS, and no gpuflame running to answer.
    let fx = Fixture::build();
    let lib = fx.path("libgpuflame_cupti.so");
    gpuflame_ok(&["cupti-library", &lib], 0);
    let started = std::time::Instant::now();
    let out = std::process::Command::new(&fx.app)
        .args(["launches", "10"])
        .env("CUDA_INJECTION64_PATH", &lib)
        .env("GPUFLAME_CUPTI_PATH", fx.path("libcupti.so.13"))
        .env("GPUFLAME_CUPTI_WAIT_MS", "400")
        .env("FAKE_CUDA_INIT_MS", "0")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // At least as long as asked (no clock runs fast); that the wait ended at its deadline, and
    // not at the library's cap of 10 s or never, the library says.
    assert!(took >= std::time::Duration::from_millis(400), "took {took:?}");
    let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("gpuflame CUPTI: no answer from gpuflame")).collect();
    assert_eq!(said, ["gpuflame CUPTI: no answer from gpuflame within 400 ms; going on"], "{stderr}");
    // Unset, it does not wait at all.
    let out = std::process::Command::new(&fx.app).args(["launches", "10"]).env("CUDA_INJECTION64_PATH", &lib).env("GPUFLAME_CUPTI_PATH", fx.path("libcupti.so.13")).env("FAKE_CUDA_INIT_MS", "0").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("no answer from gpuflame"), "it waited:\n{stderr}");
}
