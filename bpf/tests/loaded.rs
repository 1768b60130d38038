//! The programs loaded for real and pointed at this test process: every kind of record the rings
//! carry, built by the compiled programs and decoded here. The decoders' own tests build records
//! in Rust from the generated layout; only this shows that what the compiler made of the C and what
//! the Rust side reads agree, field by field. Stand-ins of this process take the CUDA hooks, so no
//! GPU or CUDA library is needed; loading needs root (or CAP_BPF and CAP_PERFMON).

use std::ffi::c_char;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use gpuflame_bpf::*;

mod common;
use common::spin;

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cuda_malloc(out: *mut u64, size: u64) -> i32 {
    // SAFETY: the test passes a valid pointer.
    unsafe { out.write_volatile(0x7f00_0000_0000 + size) };
    0
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cu_mem_map(ptr: u64, size: u64, offset: u64, handle: u64, flags: u64) -> i32 {
    black_box((ptr, size, offset, handle, flags));
    0
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_module_get_function(out: *mut u64, module: u64, name: *const c_char) -> i32 {
    black_box((module, name));
    // SAFETY: the test passes a valid pointer.
    unsafe { out.write_volatile(0xf00d) };
    0
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cupti_launch(correlation: u32, callback: u32) {
    black_box((correlation, callback));
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cupti_kernels(records: *const GpuKernelRecord, n: u32, dropped_total: u64) {
    black_box((records, n, dropped_total));
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cupti_name(id: u32, name: *const c_char) {
    black_box((id, name));
}

#[no_mangle]
#[inline(never)]
extern "C" fn gpuflame_test_cupti_status(code: u32, ready: *mut u32) {
    black_box((code, ready));
}

/// struct gpuflame_kernel of the injection library.
#[repr(C)]
pub struct GpuKernelRecord {
    start: u64,
    end: u64,
    correlation: u32,
    device: u32,
    stream: u32,
    name_id: u32,
    graph: u32,
    pad: u32,
    graph_node: u64,
}

/// Spins for `d` of wall time; nothing in it allocates or locks, so a forked child of this
/// many-threaded test process may run it too (loaded_fork_tests.rs).
#[inline(never)]
fn tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

#[test]
fn every_record_kind_goes_through_the_loaded_programs_and_decodes() {
    let me = std::process::id();
    let config = SamplerConfig {
        frequency_hz: 499,
        targets: Targets::Processes { pids: vec![me], follow_forks: false },
        unwind_memory: 16 << 20,
        // Few waits: the CPU's scale lets every one be drawn, with a whole chance.
        off_cpu: OffCpuSampling::default(),
        ring: RingUse::Any,
        lazy_process_events: false,
        tensor_sample_bytes: 0,
        max_live_allocations: 1024,
        memory_timeline: true,
        tensor_allocation_records: true,
        copy_every_stack: false,
        programs: OptionalPrograms::ALL,
    };
    // A test that cannot run fails, saying why: a skip would pass for a result.
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "this test loads the BPF programs: run it as root (the test command does)");
    assert!(std::path::Path::new("/sys/kernel/btf/vmlinux").exists(), "this test loads the BPF programs: the kernel has no BTF (/sys/kernel/btf/vmlinux)");
    let mut sampler = BpfPrograms::start(&config).unwrap_or_else(|e| panic!("{e}"));
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let hook = |api, name| (api, symbol_offset(name).unwrap_or_else(|| panic!("{name} in the test binary")) as u64);
    let functions = [
        hook(CudaApi::CudaMalloc, "gpuflame_test_cuda_malloc"),
        hook(CudaApi::CuMemMap, "gpuflame_test_cu_mem_map"),
        hook(CudaApi::CuModuleGetFunction, "gpuflame_test_module_get_function"),
        hook(CudaApi::CuptiLaunch, "gpuflame_test_cupti_launch"),
        hook(CudaApi::CuptiKernels, "gpuflame_test_cupti_kernels"),
        hook(CudaApi::CuptiName, "gpuflame_test_cupti_name"),
        hook(CudaApi::CuptiStatus, "gpuflame_test_cupti_status"),
    ];
    let hooks = sampler.attach_cuda(Path::new(&exe), &CudaFunctions::new(Path::new(&exe), &functions)).unwrap();
    sampler.enable(499).unwrap();
    sampler.enable_off_cpu().unwrap();

    let mut out = 0u64;
    assert_eq!(gpuflame_test_cuda_malloc(&mut out, 4096), 0);
    gpuflame_test_cu_mem_map(0x7f00_0010_0000, 2 << 20, 0, 0xbeef, 0);
    let mut handle = 0u64;
    gpuflame_test_module_get_function(&mut handle, 1, c"gemm_kernel".as_ptr());
    gpuflame_test_cupti_launch(77, 13);
    let kernel = |correlation, name_id| GpuKernelRecord { start: 10, end: 30, correlation, device: 1, stream: 7, name_id, graph: 2, pad: 0, graph_node: 5 };
    let records = [kernel(77, 3), kernel(78, 4)];
    gpuflame_test_cupti_kernels(records.as_ptr(), 2, 9);
    gpuflame_test_cupti_name(3, c"flash_attn".as_ptr());
    let mut ready = 0u32;
    gpuflame_test_cupti_status(4, &mut ready);
    black_box(spin(Duration::from_millis(300)));
    // Three sleeps must be drawn with a whole chance; beside CPU hogs the CPU's scale can draw a
    // few with less (3 runs in 40 beside three hogs missed one), so it sleeps more often.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let events = sampler.drain().unwrap();
    let counters = sampler.counters().unwrap();
    drop(hooks);

    let (me_tid, ready_addr) = (tid(), &raw mut ready as u64);
    let mut calls = Vec::new();
    let (mut launches, mut statuses) = (Vec::new(), Vec::new());
    let (mut samples, mut leaf_files, mut names, mut gpu_names, mut batches, mut unknown) = (0, 0, Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut stacks, mut ends) = (Vec::new(), Vec::new());
    for e in events {
        match e {
            Event::Sample(s) if s.pid == me => {
                samples += 1;
                assert!(!s.comm.is_empty());
                assert!(s.unwind.has_user_stack());
                leaf_files += usize::from(s.leaf_file.is_some());
            }
            Event::Cuda(c) if c.sample.tid == me_tid => calls.push(c),
            Event::CuptiLaunch(l) if l.sample.tid == me_tid => launches.push(l),
            Event::CuptiStatus(s) if s.pid == me => statuses.push(s),
            Event::KernelName(k) => names.push(k),
            Event::GpuKernelName(n) => gpu_names.push(n),
            Event::GpuKernels(b) => batches.push(b),
            Event::OffCpu(o) if o.sample.tid == me_tid => stacks.push(o),
            Event::OffCpuEnd(e) if e.tid == me_tid => ends.push(e),
            Event::Process(p) if p.pid == me && p.kind == ProcessEventKind::Unknown => unknown += 1,
            _ => {}
        }
    }
    assert_eq!(sampler.malformed_records(), 0);
    assert!(samples > 10, "{samples} samples of this process");
    assert!(leaf_files > 0, "no sample named the file under its leaf");
    assert!(unknown > 0, "no process event asked for this process's mappings");

    let call = |api| calls.iter().find(|c| c.api == api).unwrap_or_else(|| panic!("no {api:?} record: {calls:?}"));
    let malloc = call(CudaApi::CudaMalloc);
    assert_eq!((malloc.result, malloc.size, malloc.addr, malloc.handle), (0, 4096, 0x7f00_0000_1000, 0));
    assert!(malloc.duration_ns > 0 && malloc.hook_ns > 0, "{malloc:?}");
    assert_eq!((malloc.sample.pid, malloc.sample.unwind), (me, UnwindStatus::NoProcess));
    assert_eq!(malloc.sample.user_stack.len(), 1, "the leaf, then no tables: {malloc:?}");
    let map = call(CudaApi::CuMemMap);
    assert_eq!((map.addr, map.size, map.handle), (0x7f00_0010_0000, 2 << 20, 0xbeef));
    let [launch] = &launches[..] else { panic!("one launch: {launches:?}") };
    assert_eq!((launch.correlation, launch.callback), (77, 13));
    assert!(!launch.sample.user_stack.is_empty());
    let [status] = &statuses[..] else { panic!("one status: {statuses:?}") };
    assert_eq!((status.code, status.ready_word), (4, ready_addr));
    assert_eq!(names, vec![KernelName { pid: me, handle: 0xf00d, name: "gemm_kernel".into() }]);
    assert_eq!(gpu_names, vec![GpuKernelName { pid: me, id: 3, name: "flash_attn".into() }]);
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!((b.pid, b.dropped_total, b.kernels.len()), (me, 9, 2));
    assert!(!b.comm.is_empty());
    let k = GpuKernel { start: 10, end: 30, correlation: 78, device: 1, stream: 7, name_id: 4, graph: 2, graph_node: 5 };
    assert_eq!(b.kernels[1], k);

    // Sleeps: a stack where the thread left, and the end of that wait, for three at least.
    let slept: Vec<_> = stacks.iter().filter(|o| o.state == OffCpuState::Sleeping).collect();
    assert!(slept.len() >= 3, "{stacks:?}");
    for o in &slept {
        assert!(o.wait > 0);
        assert!(!o.sample.kernel_stack.frames().is_empty(), "no kernel frames: {o:?}");
        assert!(!o.sample.user_stack.is_empty());
    }
    let waited: Vec<_> = slept.iter().filter_map(|o| ends.iter().find(|e| e.wait == o.wait)).collect();
    assert!(waited.iter().filter(|e| e.duration_ns >= 15_000_000 && e.chance == 1 << 32).count() >= 3, "{ends:?}");

    assert!(counters.samples >= samples as u64);
    assert!(counters.unwind.no_process > 0);
    assert!(counters.cuda.calls >= 3, "{counters:?}");
    assert!(counters.off_cpu.switches >= 3 && counters.off_cpu.unwound >= 3);
    assert_eq!((counters.lost, counters.cuda.lost, counters.off_cpu.lost), (0, 0, 0));
}

