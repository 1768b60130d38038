//! The folded, pprof and SVG output of a fixed recording, against files kept in
//! `profiler/tests/golden/`: what the writers make of the same events may not change when the
//! code that aggregates them does. `GPUFLAME_BLESS=1 cargo test -p gpuflame --test golden_outputs` writes
//! the files anew (only when a change of output is meant).
//!
//! The events name no file and no live process, so that nothing on the machine changes them:
//! native frames are unmapped addresses, and the kernel and Python frames come in a second input,
//! a profile built by hand.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use gpuflame_bpf::{LiveAllocation, LiveKind, MemoryChange, MemoryEvent, CudaApi, CudaCall, CuptiLaunch, Event, GpuKernel, HookTraps, TrapCost, GpuKernelBatch, GpuKernelName, KernelName, OffCpuEnd, OffCpuStack, OffCpuState, Sample, StackRead, UnwindStatus, UserFrame};

use gpuflame::cuda::Coverage;
use gpuflame::frame::FrameKind;
use gpuflame::output::{self, Detail, Format, Rendering};
use gpuflame::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, KERNEL_MAPPING, PYTHON_MAPPING};
use gpuflame::profile_kind::ProfileKind;
use gpuflame::session::{Collector, ProcessView};
use gpuflame::sources::Input;

/// No process has this PID (above the kernel's largest, 2^22).
const PID: u32 = 4_300_001;
const TID: u32 = 4_300_002;

fn sample(tid: u32, comm: &str, user: &[u64], unwind: UnwindStatus) -> Sample {
    Sample {
        timestamp_ns: 1_000,
        pid: PID,
        tid,
        cpu: 0,
        comm: comm.into(),
        kernel_stack: StackRead::Frames(Vec::new()),
        user_stack: user.iter().map(|&a| UserFrame::Native(a)).collect(),
        unwind,
        leaf_file: None,
        forked_from: None,
        by_file: false,
        stack_copy: None,
    }
}

fn call(api: CudaApi, user: &[u64], size: u64, addr: u64, result: i32, duration_ns: u64) -> Event {
    Event::Cuda(CudaCall {
        sample: sample(PID, "trainer", user, UnwindStatus::EndOfStack),
        api,
        result,
        device: 1,
        duration_ns,
        size,
        addr,
        handle: 0,
        hook_ns: 500,
        traps: HookTraps::default(),
        in_allocator: false,
        stack_sampled_out: false,
        stack_id: 0,
    })
}

/// A successful allocation as the programs send it: its record with its stack (the first of
/// its stack id), then its memory record.
fn allocation(api: CudaApi, user: &[u64], size: u64, addr: u64, stack_id: u64) -> [Event; 2] {
    let Event::Cuda(c) = call(api, user, size, addr, 0, 1_000) else { unreachable!() };
    let kind = LiveKind { api: Some(api), device: 1, ..Default::default() };
    let memory = MemoryEvent { pid: PID, tid: PID, timestamp_ns: 0, addr, size, stack: stack_id, kind, change: MemoryChange::Allocated { replaced: false, untracked: false } };
    [Event::Cuda(CudaCall { stack_id, ..c }), Event::Memory(memory)]
}

/// The live set as the programs keep it, from the memory records: what `recorded` gives the
/// collector at an out-of-memory and at the window's end.
#[derive(Default)]
struct LiveModel(std::collections::BTreeMap<(bool, u64), LiveAllocation>);

impl LiveModel {
    /// Applies a memory record; a free is sent with what it freed.
    fn apply(&mut self, e: &mut MemoryEvent) {
        // A tensor and the segment it starts have one address: the set tells them apart.
        let key = (e.kind.api.is_some_and(CudaApi::is_tensor), e.addr);
        match e.change {
            MemoryChange::Allocated { .. } => {
                self.0.insert(key, LiveAllocation { pid: e.pid, tid: e.tid, addr: e.addr, size: e.size, stack: e.stack, t_ns: 0, stream: 0, freed_ns: 0, kind: e.kind });
            }
            _ => match self.0.remove(&key) {
                Some(a) => {
                    (e.size, e.stack, e.kind, e.change) = (a.size, a.stack, a.kind, MemoryChange::Freed);
                }
                None => e.change = MemoryChange::UnknownFree,
            },
        }
    }

    fn live(&self) -> Vec<LiveAllocation> {
        self.0.values().cloned().collect()
    }
}

/// A free, as the memory record says it: the programs fill in what was freed.
fn free(api: CudaApi, addr: u64) -> Event {
    let kind = LiveKind { api: Some(api), ..Default::default() };
    Event::Memory(MemoryEvent { pid: PID, tid: PID, timestamp_ns: 0, addr, size: 0, stack: 0, kind, change: MemoryChange::Freed })
}

/// A training step's worth of everything: CPU samples (whole, cut at a gap, truncated),
/// off-CPU waits (unwound and not), allocations and frees, launches by stub and by handle, an
/// out-of-memory failure, CUPTI launches and their kernels, NCCL's collectives.
pub(crate) fn events() -> Vec<Event> {
    let main = [0x40_1010, 0x40_2020, 0x40_3030];
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(Event::Sample(sample(PID, "trainer", &main, UnwindStatus::EndOfStack)));
    }
    out.push(Event::Sample(sample(TID, "loader", &[0x50_0000, 0x50_0100], UnwindStatus::EndOfStack)));
    let mut gap = sample(TID, "loader", &[0x50_0000], UnwindStatus::NoTableYet);
    gap.user_stack.push(UserFrame::Gap);
    out.push(Event::Sample(gap));
    out.push(Event::Sample(sample(PID, "trainer", &[0x40_9999], UnwindStatus::Truncated)));
    out.push(Event::Sample(sample(PID, "trainer", &[0x40_8888], UnwindStatus::NoRow)));

    out.push(Event::OffCpu(OffCpuStack { sample: sample(TID, "loader", &[0x50_0200, 0x50_0100], UnwindStatus::EndOfStack), wait: 1, since: 1_000, state: OffCpuState::Sleeping }));
    let end = |pid, tid, comm: &str, wait, since, duration_ns, short_rest_ns| {
        Event::OffCpuEnd(OffCpuEnd { pid, tid, comm: comm.into(), wait, since, duration_ns, chance: if wait > 0 { 1 << 32 } else { 0 }, short_rest_ns })
    };
    // The loader's unwound 30 ms wait, and a wait of 20 ms not unwound (a period and more: its
    // end comes on its own), which the unwound one carries.
    out.push(end(PID, TID, "loader", 1, 1_000, 30_000_000, 0));
    out.push(end(PID, TID, "loader", 0, 40_000_000, 20_000_000, 0));
    // The trainer has no unwound wait: its process's (the loader's) carries its 3 ms of short
    // waits; its 20 ms one stays under [off-cpu: waits not unwound].
    out.push(end(PID, PID, "trainer", 0, 0, 0, 3_000_000));
    out.push(end(PID, PID, "trainer", 0, 60_000_000, 20_000_000, 0));
    // Nothing of another process was unwound: its 4 ms stay under [off-cpu: waits not unwound].
    out.push(end(PID + 10, PID + 10, "worker", 0, 0, 0, 4_000_000));

    let alloc_site = [0x40_4040, 0x40_2020, 0x40_3030];
    // Segments: every record goes whole (the CUDA API profile counts them), with its memory
    // record; the same site twice, one stack id.
    let timed = |e: [Event; 2], duration_ns| e.map(|e| if let Event::Cuda(c) = e { Event::Cuda(CudaCall { duration_ns, ..c }) } else { e });
    out.extend(timed(allocation(CudaApi::CudaMalloc, &alloc_site, 1 << 20, 0x7000_0000, 0xa1), 2_000));
    out.extend(timed(allocation(CudaApi::CudaMalloc, &alloc_site, 4 << 20, 0x7010_0000, 0xa1), 2_000));
    out.extend(timed(allocation(CudaApi::CuMemAlloc, &[0x40_5050, 0x40_3030], 2 << 20, 0x7100_0000, 0xa2), 3_000));
    out.push(call(CudaApi::CudaFree, &[0x40_6060, 0x40_3030], 0, 0x7000_0000, 0, 1_000));
    out.push(free(CudaApi::CudaFree, 0x7000_0000));
    // PyTorch's allocator: two tensors, the second freed by its deleter (a pointer, no stack).
    out.extend(allocation(CudaApi::C10Malloc, &[0x40_4141, 0x40_2020, 0x40_3030], 3 << 20, 0x7010_0000, 0xa3));
    out.extend(allocation(CudaApi::C10Malloc, &[0x40_4242, 0x40_3030], 1 << 20, 0x7013_0000, 0xa4));
    out.push(free(CudaApi::C10LocalRawDelete, 0x7013_0000));
    out.push(Event::KernelName(KernelName { pid: PID, handle: 0xabc0, name: "gemm_kernel".into() }));
    for _ in 0..2 {
        out.push(call(CudaApi::CuLaunchKernel, &[0x40_7070, 0x40_3030], 0, 0xabc0, 0, 4_000));
    }
    out.push(call(CudaApi::CudaLaunchKernel, &[0x40_7171, 0x40_3030], 0, 0x40_0500, 0, 4_000));
    out.push(call(CudaApi::CudaDeviceSynchronize, &[0x40_7272, 0x40_3030], 0, 0, 0, 9_000_000));
    // Out of memory: 8 GiB asked for while 6 MiB are held.
    out.push(call(CudaApi::CudaMalloc, &alloc_site, 8 << 30, 0, 2, 5_000));

    out.push(Event::GpuKernelName(GpuKernelName { pid: PID, id: 3, name: "flash_attn_fwd".into() }));
    // A sampled launch with CUPTI's correlation id 77.
    out.push(Event::CuptiLaunch(CuptiLaunch { sample: sample(PID, "trainer", &[0x40_8080, 0x40_3030], UnwindStatus::EndOfStack), correlation: 77, callback: 0 }));
    let kernel = |correlation, name_id, ns: u64| GpuKernel { start: 1_000, end: 1_000 + ns, correlation, device: 0, stream: 7, name_id, graph: 0, graph_node: 0 };
    out.push(Event::GpuKernels(GpuKernelBatch {
        pid: PID,
        comm: "trainer".into(),
        // One by correlation, one by kernel and call site, one never seen launched.
        kernels: vec![kernel(77, 3, 500_000), kernel(78, 3, 250_000), kernel(90, 4, 125_000)],
        dropped_total: 2,
    }));

    // Two all-reduces of 1 Mi float32 from one site, one of a datatype NCCL does not define from
    // another, and the device time of their kernel.
    let nccl = |user: &[u64], datatype| match call(CudaApi::NcclAllReduce, user, 1 << 20, 0, 0, 6_000) {
        Event::Cuda(c) => Event::Cuda(CudaCall { handle: datatype, ..c }),
        other => other,
    };
    out.push(nccl(&[0x40_a0a0, 0x40_3030], 7));
    out.push(nccl(&[0x40_a0a0, 0x40_3030], 7));
    out.push(nccl(&[0x40_b0b0, 0x40_3030], 99));
    out.push(Event::GpuKernelName(GpuKernelName { pid: PID, id: 5, name: "ncclDevKernel_AllReduce_Sum_f32_RING_LL".into() }));
    out.push(Event::GpuKernels(GpuKernelBatch { pid: PID, comm: "trainer".into(), kernels: vec![kernel(91, 5, 300_000)], dropped_total: 2 }));
    out
}

/// Kernel frames and Python frames, which events cannot give without a machine's symbols or a
/// live interpreter.
pub(crate) fn hand_built() -> Profile {
    let mut profile = Profile::cpu(99);
    profile.time_nanos = 1_700_000_000_000_000_000;
    profile.duration_nanos = 5_000_000_000;
    let mut b = ProfileBuilder::default();
    let python = b.mapping(&mut profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
    let kernel = b.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
    let libc = b.mapping(&mut profile, Mapping { path: "/usr/lib/libc.so.6".into(), build_id: Some("abcd".into()) });
    let py = |f: &str, file: &str, line| Location { mapping: Some(python), address: 0, kind: FrameKind::Python, lines: vec![Line { function: f.into(), file: Some(file.into()), line: Some(line) }] };
    let module = b.location(&mut profile, py("<module>", "/srv/app/train.py", 3));
    let step = b.location(&mut profile, py("step", "/venv/lib/python3.11/site-packages/torch/nn.py", 41));
    let unknown = b.location(&mut profile, Location { mapping: Some(python), address: 0, kind: FrameKind::Marker, lines: vec![Line::function("[unknown python]")] });
    let read = b.location(&mut profile, Location { mapping: Some(libc), address: 0x1234, kind: FrameKind::Native, lines: vec![Line { function: "read".into(), file: Some("read.c".into()), line: Some(9) }] });
    let ksys = b.location(&mut profile, Location { mapping: Some(kernel), address: 0xffff_ffff_8100_0000, kind: FrameKind::Kernel, lines: vec![Line::function("ksys_read")] });
    let malloc = b.location(&mut profile, Location::named("cudaMalloc", FrameKind::CudaApi));
    let gpu = b.location(&mut profile, Location::named("[gpu] gemm", FrameKind::GpuKernel));
    let labels = |pid| Labels { pid: Some(pid), tid: Some(pid), comm: Some("python3".into()), device: None };
    b.add(vec![module, step, read, ksys], labels(11), 5 * profile.period);
    b.add(vec![module, step, malloc], labels(11), 2 * profile.period);
    b.add(vec![module, unknown, gpu], labels(12), profile.period);
    b.finish(&mut profile);
    profile.comments.push("command: python3 train.py".into());
    profile
}

/// The profiles of [`events`], as `record` makes them at the end of a recording: every kind,
/// and the out-of-memory snapshot.
fn recorded() -> Vec<(String, Profile)> {
    let files: &[gpuflame_symbolizer::MappedFile] = &[];
    let mut collector = Collector::new(&ProfileKind::ALL, 99, TrapCost::default(), 0);
    let no_labels = gpuflame::workload::rank::ProcessLabels::new();
    let mut live = LiveModel::default();
    for mut event in events() {
        if let Event::Memory(m) = &mut event {
            live.apply(m);
        }
        if matches!(&event, Event::Cuda(c) if c.is_out_of_memory()) {
            collector.offer(&Input::LiveAtOom { pid: PID, live: &live.live() });
        }
        collector.record(&event, ProcessView { files: Some(files), python: None, new_program: false });
    }
    collector.offer(&Input::LiveAtWindowEnd(&live.live()));
    let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let duration = Duration::from_secs(5);
    let coverage = Coverage { attached: duration, elapsed: duration, exact: true, trap_cost: TrapCost { emulated: Duration::from_nanos(700), stepped: Duration::from_nanos(2_000), nested_return: false }, window: Duration::ZERO };
    let mut out: Vec<(String, Profile)> = collector.take_ooms(start, &no_labels).into_iter().map(|oom| ("oom".to_string(), oom.snapshot)).collect();
    let (profiles, _) = collector.close(Some(coverage), start, duration, &no_labels);
    out.extend(profiles.into_iter().map(|(k, p)| (k.name().to_string(), p)));
    out
}

/// A profile as text, each sample with its whole stack, in sorted order: equal for equal
/// profiles whatever order their tables are in.
fn canonical(p: &Profile) -> String {
    let mut out = format!(
        "sample types: {:?}\nperiod: {} {:?}\ntime: {} duration: {}\ncomments: {:?}\n",
        p.sample_types, p.period, p.period_type, p.time_nanos, p.duration_nanos, p.comments
    );
    let mut samples: Vec<String> = p
        .samples
        .iter()
        .map(|s| {
            let frames: Vec<String> = s
                .stack
                .iter()
                .map(|&l| {
                    let loc = &p.locations[l];
                    let mapping = loc.mapping.map(|m| &p.mappings[m]);
                    format!("{:?} {:#x} kernel={} {:?}", mapping, loc.address, loc.kind == FrameKind::Kernel, loc.lines)
                })
                .collect();
            format!("{:?} {:?}\n  {}", s.values, s.labels, frames.join("\n  "))
        })
        .collect();
    samples.sort();
    out.push_str(&samples.join("\n"));
    out.push('\n');
    out
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Every output of `profile` against its file; the names of those that differ.
fn compare(name: &str, profile: &Profile, bless: bool) -> Vec<String> {
    let mut differ = Vec::new();
    for (format, ext) in [(Format::Folded, "folded"), (Format::Pprof, "pprof.txt"), (Format::Svg, "svg")] {
        for detail in [Detail::Functions, Detail::Lines] {
            if detail == Detail::Lines && format == Format::Pprof {
                continue;
            }
            let title = format!("golden · {name}");
            let mut bytes = Vec::new();
            output::write(profile, format, &Rendering { title: &title, detail }, &mut bytes).expect("writing to memory");
            if format == Format::Pprof {
                // Locations are numbered in the order a hash map gives them: what is compared is
                // what the file says, read back.
                let read = output::pprof::read(&bytes).expect("reading the pprof back");
                bytes = canonical(&read).into_bytes();
            }
            let file = golden_dir().join(format!("{name}{}.{ext}", if detail == Detail::Lines { ".lines" } else { "" }));
            if bless {
                std::fs::create_dir_all(golden_dir()).expect("golden dir");
                std::fs::write(&file, &bytes).expect("writing a golden file");
            } else if std::fs::read(&file).ok().as_deref() != Some(bytes.as_slice()) {
                let got = std::env::temp_dir().join(format!("{name}.{ext}.got"));
                let _ = std::fs::write(&got, &bytes);
                differ.push(format!("{} (this run's output: {})", file.display(), got.display()));
            }
        }
    }
    differ
}

#[test]
fn outputs_of_a_fixed_recording_stay_the_same() {
    let bless = std::env::var_os("GPUFLAME_BLESS").is_some();
    let recorded = recorded();
    let names: Vec<&str> = recorded.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["oom", "cpu", "hbm-alloc", "hbm-inuse", "tensor-alloc", "tensor-inuse", "gpu-launches", "cuda-api", "gpu-time", "off-cpu", "wall", "collectives", "collective-time"]);
    let mut differ = compare("hand-built", &hand_built(), bless);
    for (name, profile) in &recorded {
        assert!(!profile.samples.is_empty(), "{name} has no samples");
        differ.extend(compare(name, profile, bless));
    }
    assert!(differ.is_empty(), "output changed:\n{}", differ.join("\n"));
}
