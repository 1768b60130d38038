//! The CPU sampler: a perf_event program per online CPU, samples through a ring buffer.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, UprobeMultiOpts};

use gpuflame_unwind::{CompactTable, RuleTable};

use crate::cuda::CudaApi;
use crate::error::{is_permission, BpfError};
use crate::events::{self, Event};
use crate::perf;
use crate::skel::{types, CpuSamplerSkel, CpuSamplerSkelBuilder};
use crate::unwind_maps::{ExecMapping, PythonProcess, TableId, UnwindCapacity, UnwindMaps};

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Which processes are sampled. The filter runs in BPF: samples of other processes never reach
/// user space.
#[derive(Debug, Clone)]
pub enum Targets {
    /// Every process on the machine (the idle task excluded).
    All,
    /// These processes with all their threads; with `follow_forks`, every process they start too.
    Processes { pids: Vec<u32>, follow_forks: bool },
}

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second on each CPU.
    pub frequency_hz: u64,
    pub targets: Targets,
    /// Kernel memory the unwind tables may take, in bytes (6 per row). Shards of 6 MiB are
    /// created as tables load, so an idle or small machine uses far less.
    pub unwind_memory: u64,
    /// How switch-outs are unwound for off-CPU time (attached by [`CpuSampler::enable_off_cpu`]).
    pub off_cpu: OffCpuSampling,
}

/// Which switch-outs of target threads are unwound; the others' time is still counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuSampling {
    /// A thread has `thread_burst` unwinds, and gets one back each `thread_interval`: a thread
    /// that switches out less often than that has every wait unwound.
    pub thread_interval: Duration,
    pub thread_burst: u64,
    /// Unwinds per second and CPU at most, over all threads.
    pub cpu_rate: u64,
    /// Unwinds a CPU may do at once after an idle spell.
    pub cpu_burst: u64,
}

impl Default for OffCpuSampling {
    fn default() -> Self {
        OffCpuSampling { thread_interval: Duration::from_millis(10), thread_burst: 16, cpu_rate: 2000, cpu_burst: 64 }
    }
}

/// The off-CPU programs' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuCounters {
    /// Switch-outs of target threads.
    pub switches: u64,
    /// Of them, unwound.
    pub unwound: u64,
    /// Not unwound because their CPU's budget was spent.
    pub over_budget: u64,
    /// Records dropped: the ring buffer was full.
    pub lost: u64,
    /// Threads not followed: their state could not be made (no memory).
    pub threads_full: u64,
    /// Threads given off-CPU state, and of them released at their exit.
    pub followed: u64,
    pub released: u64,
}

impl SamplerConfig {
    /// 256 MiB, 44M rows: tables load on demand, so this holds the hot files of many different
    /// PyTorch builds at once (all 71 files of one torch process take 11M rows, 66 MiB).
    pub const DEFAULT_UNWIND_MEMORY: u64 = 256 << 20;
    /// Bytes of kernel memory per unwind row.
    pub const BYTES_PER_ROW: u64 = 6;
}

/// The sampler's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Samples of target processes taken in BPF.
    pub samples: u64,
    /// Samples dropped because the ring buffer was full.
    pub lost: u64,
    pub kernel_stack_failed: u64,
    pub user_stack_failed: u64,
    /// New descendants that did not fit into the target map.
    pub targets_full: u64,
    pub unwind: UnwindCounters,
    /// Process events dropped because their ring buffer was full.
    pub process_events_lost: u64,
    /// Code mappings not reported because their process mapped code faster than its budget.
    pub mmap_throttled: u64,
    pub python: PythonCounters,
    pub cuda: CudaCounters,
    pub off_cpu: OffCpuCounters,
}

/// The CUDA hooks' counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaCounters {
    /// Outermost hooked calls seen returning.
    pub calls: u64,
    /// Records dropped because the ring buffer was full.
    pub lost: u64,
    /// Calls not followed because the table of calls in flight was full.
    pub table_full: u64,
    /// Records dropped because another hook reused their scratch space (preemption).
    pub races: u64,
}

/// Hooks on the CUDA functions of one file, in every process that maps it. Dropping it detaches
/// them.
pub struct CudaHooks {
    _link: Link,
}

impl CudaHooks {
    /// Detaches without waiting. The kernel takes the breakpoints out at once, then waits for an
    /// RCU grace period (~100 ms) before the call returns; that wait happens on a thread of its
    /// own, so that the caller does not wait for it.
    pub fn detach_in_background(self) {
        let spawned = std::thread::Builder::new().name("gpuflame-detach".into()).spawn(move || drop(self));
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "cannot detach on a thread of its own");
        }
    }
}

/// The Python walker's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PythonCounters {
    pub frames: u64,
    /// Samples of Python processes whose thread state was not found.
    pub no_thread: u64,
    pub read_faults: u64,
    /// Samples whose Python frames were kept after the native walk stopped early.
    pub after_gap: u64,
    /// Samples that had no room for all their Python frames.
    pub truncated: u64,
}

/// Why user stacks ended early, by reason; and frames stepped by frame pointers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindCounters {
    pub no_process: u64,
    pub no_mapping: u64,
    pub no_row: u64,
    pub bad_cfa: u64,
    pub read_fault: u64,
    pub truncated: u64,
    /// Stacks that stopped at a file whose table was not built yet.
    pub no_table_yet: u64,
    /// Stacks that stopped at code without CFI whose caller was not found.
    pub bad_frame: u64,
    pub frame_pointer_steps: u64,
    /// Frame-pointer steps refused: rbp did not lead to a return address.
    pub frame_pointer_rejected: u64,
    /// Callers of code without CFI found by scanning the stack.
    pub scanned_frames: u64,
}

/// A loaded and attached sampler. Dropping it detaches everything.
pub struct CpuSampler {
    // Field order is drop order: detach and stop reading before the object goes.
    _links: Vec<Link>,
    ring: RingBuffer<'static>,
    inbox: Rc<RefCell<Vec<Event>>>,
    malformed: Rc<RefCell<u64>>,
    unwind: UnwindMaps,
    skel: CpuSamplerSkel<'static>,
}

impl CpuSampler {
    /// Loads the programs, opens one CPU-clock event per online CPU and starts sampling.
    pub fn start(config: &SamplerConfig) -> Result<Self, BpfError> {
        if !Path::new(BTF_PATH).exists() {
            return Err(BpfError::NoBtf(BTF_PATH.into()));
        }
        // The skeleton borrows its object storage for its whole life; one small allocation per
        // sampler is leaked so that the sampler can own the skeleton.
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = CpuSamplerSkelBuilder::default().open(storage).map_err(BpfError::load)?;
        let (mode, follow) = match &config.targets {
            Targets::All => (types::target_mode::TARGET_ALL, false),
            Targets::Processes { follow_forks, .. } => (types::target_mode::TARGET_PIDS, *follow_forks),
        };
        let rodata = open.maps.rodata_data.as_deref_mut().ok_or_else(|| {
            BpfError::Load(libbpf_rs::Error::from(std::io::Error::other("the skeleton has no .rodata")))
        })?;
        rodata.target_mode = mode;
        rodata.follow_forks = u8::from(follow);
        let sampling = config.off_cpu;
        rodata.offcpu_interval_ns = sampling.thread_interval.as_nanos().min(u128::from(u64::MAX)) as u64;
        rodata.offcpu_cpu_burst = sampling.cpu_burst.max(1);
        rodata.offcpu_thread_burst = sampling.thread_burst.max(1);
        rodata.offcpu_cpu_refill_ns = 1_000_000_000 / sampling.cpu_rate.max(1);
        let rows = config.unwind_memory / SamplerConfig::BYTES_PER_ROW;
        let blocks = u32::try_from(rows.div_ceil(16).max(1)).unwrap_or(u32::MAX);
        let skel = open.load().map_err(BpfError::load)?;

        let mut sampler_links = Vec::new();
        for prog in [&skel.progs.on_process_exec, &skel.progs.on_process_exit, &skel.progs.on_mmap] {
            let link = prog.attach().map_err(|source| attach_error("the exec, mmap and exit hooks", source))?;
            sampler_links.push(link);
        }
        if follow {
            let link = skel.progs.on_process_fork.attach().map_err(|source| attach_error("the fork tracepoint", source))?;
            sampler_links.push(link);
        }

        let inbox = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let ring = {
            let (sample_inbox, sample_malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let (process_inbox, process_malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let mut builder = RingBufferBuilder::new();
            builder
                .add(&skel.maps.samples, move |data: &[u8]| {
                    match events::decode_record(data) {
                        Some(event) => sample_inbox.borrow_mut().push(event),
                        None => *sample_malformed.borrow_mut() += 1,
                    }
                    0
                })
                .map_err(BpfError::RingBuffer)?
                .add(&skel.maps.process_events, move |data: &[u8]| {
                    match events::decode_process_event(data) {
                        Some(ev) => process_inbox.borrow_mut().push(Event::Process(ev)),
                        None => *process_malformed.borrow_mut() += 1,
                    }
                    0
                })
                .map_err(BpfError::RingBuffer)?;
            builder.build().map_err(BpfError::RingBuffer)?
        };

        let sampler = CpuSampler {
            _links: sampler_links,
            ring,
            inbox,
            malformed,
            unwind: UnwindMaps::new(blocks),
            skel,
        };
        if let Targets::Processes { pids, .. } = &config.targets {
            for &pid in pids {
                sampler.add_target(pid)?;
            }
        }
        Ok(sampler)
    }

    /// Starts sampling: one CPU-clock event per online CPU. Separate from [`CpuSampler::start`]
    /// so that unwind tables of known processes can be loaded first.
    pub fn enable(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        self.attach_perf_events(frequency_hz)
    }

    /// Starts following target threads' switches for off-CPU time.
    pub fn enable_off_cpu(&mut self) -> Result<(), BpfError> {
        for prog in [&self.skel.progs.on_sched_switch, &self.skel.progs.on_thread_exit] {
            let link = prog.attach().map_err(|source| attach_error("the off-CPU tracepoints", source))?;
            self._links.push(link);
        }
        Ok(())
    }

    /// Threads with off-CPU state now (each target thread that has switched out, until it
    /// exits): followed less released. Task storage cannot be listed from user space.
    pub fn off_cpu_threads(&self) -> Result<u64, BpfError> {
        let c = self.counters()?.off_cpu;
        Ok(c.followed.saturating_sub(c.released))
    }

    fn attach_perf_events(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        for cpu in perf::online_cpus().map_err(BpfError::OnlineCpus)? {
            let fd = perf::open_cpu_clock(cpu, frequency_hz).map_err(|source| {
                if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
                    BpfError::PermissionDenied
                } else {
                    BpfError::PerfEventOpen { cpu, source }
                }
            })?;
            let link = self
                .skel
                .progs
                .on_cpu_sample
                .attach_perf_event(fd.as_raw_fd())
                .map_err(|source| attach_error(&format!("the sampler to CPU {cpu}"), source))?;
            // The link owns the perf event from here on: libbpf closes it when the link goes.
            let _ = fd.into_raw_fd();
            self._links.push(link);
        }
        Ok(())
    }

    /// Adds a process (all its threads) to the targets.
    pub fn add_target(&self, pid: u32) -> Result<(), BpfError> {
        self.skel
            .maps
            .targets
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .map_err(|source| BpfError::Map { map: "targets", source })
    }

    /// Waits up to `timeout` for events and returns those that arrived. Samples do not wake the
    /// reader until their buffer is a quarter full, so this always drains after waiting.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Event>, BpfError> {
        match self.ring.poll(timeout) {
            Ok(()) => {}
            // A signal (Ctrl-C) interrupts the wait; that is not an error.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
            Err(e) => return Err(BpfError::RingBuffer(e)),
        }
        self.drain()
    }

    /// Reads whatever is in the ring buffer without waiting.
    pub fn drain(&mut self) -> Result<Vec<Event>, BpfError> {
        self.ring.consume().map_err(BpfError::RingBuffer)?;
        Ok(std::mem::take(&mut *self.inbox.borrow_mut()))
    }

    /// Records that did not have the size of a sample (a layout mismatch; should stay 0).
    pub fn malformed_records(&self) -> u64 {
        *self.malformed.borrow()
    }

    pub fn counters(&self) -> Result<Counters, BpfError> {
        let read = |c: types::counter| -> Result<u64, BpfError> {
            let values = self
                .skel
                .maps
                .counters
                .lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY)
                .map_err(|source| BpfError::Map { map: "counters", source })?
                .unwrap_or_default();
            Ok(values
                .iter()
                .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes))
                .sum())
        };
        Ok(Counters {
            samples: read(types::counter::COUNTER_SAMPLES)?,
            lost: read(types::counter::COUNTER_LOST)?,
            kernel_stack_failed: read(types::counter::COUNTER_KSTACK_FAILED)?,
            user_stack_failed: read(types::counter::COUNTER_USTACK_FAILED)?,
            targets_full: read(types::counter::COUNTER_TARGETS_FULL)?,
            unwind: UnwindCounters {
                no_process: read(types::counter::COUNTER_UNWIND_NO_PROCESS)?,
                no_mapping: read(types::counter::COUNTER_UNWIND_NO_MAPPING)?,
                no_row: read(types::counter::COUNTER_UNWIND_NO_ROW)?,
                bad_cfa: read(types::counter::COUNTER_UNWIND_BAD_CFA)?,
                read_fault: read(types::counter::COUNTER_UNWIND_READ_FAULT)?,
                truncated: read(types::counter::COUNTER_UNWIND_TRUNCATED)?,
                no_table_yet: read(types::counter::COUNTER_UNWIND_NO_TABLE_YET)?,
                bad_frame: read(types::counter::COUNTER_UNWIND_BAD_FRAME)?,
                frame_pointer_steps: read(types::counter::COUNTER_UNWIND_FP_FALLBACK)?,
                frame_pointer_rejected: read(types::counter::COUNTER_UNWIND_FP_REJECTED)?,
                scanned_frames: read(types::counter::COUNTER_UNWIND_SCANNED)?,
            },
            process_events_lost: read(types::counter::COUNTER_PROCESS_EVENTS_LOST)?,
            mmap_throttled: read(types::counter::COUNTER_MMAP_THROTTLED)?,
            python: PythonCounters {
                frames: read(types::counter::COUNTER_PY_FRAMES)?,
                no_thread: read(types::counter::COUNTER_PY_NO_THREAD)?,
                read_faults: read(types::counter::COUNTER_PY_READ_FAULT)?,
                after_gap: read(types::counter::COUNTER_PY_AFTER_GAP)?,
                truncated: read(types::counter::COUNTER_PY_TRUNCATED)?,
            },
            cuda: CudaCounters {
                calls: read(types::counter::COUNTER_CUDA_CALLS)?,
                lost: read(types::counter::COUNTER_CUDA_LOST)?,
                table_full: read(types::counter::COUNTER_CUDA_CALLS_FULL)?,
                races: read(types::counter::COUNTER_CUDA_RACE)?,
            },
            off_cpu: OffCpuCounters {
                switches: read(types::counter::COUNTER_OFFCPU_SWITCHES)?,
                unwound: read(types::counter::COUNTER_OFFCPU_UNWOUND)?,
                over_budget: read(types::counter::COUNTER_OFFCPU_BUDGET)?,
                lost: read(types::counter::COUNTER_OFFCPU_LOST)?,
                threads_full: read(types::counter::COUNTER_OFFCPU_FULL)?,
                followed: read(types::counter::COUNTER_OFFCPU_FOLLOWED)?,
                released: read(types::counter::COUNTER_OFFCPU_RELEASED)?,
            },
        })
    }

    /// Loads the rules added to `rules` since the last call; call before inserting tables that
    /// use them.
    pub fn load_rules(&mut self, rules: &RuleTable) -> Result<(), BpfError> {
        self.unwind.load_rules(&self.skel.maps.unwind_rules, rules)
    }

    /// Loads an executable's table; its rules must be loaded.
    /// `in_use`: a sample asked for it, so it counts as used now; a table built ahead of need
    /// counts as never used, the first to make room.
    pub fn insert_table(&mut self, table: &CompactTable, in_use: bool) -> Result<TableId, BpfError> {
        self.unwind.insert_table(&self.skel.maps.unwind_shards, &self.skel.maps.page_index, &self.skel.maps.unwind_tables, table, in_use)
    }

    /// When a sample last used the table (boot-time ns, to the second), or 0 if never.
    pub fn table_last_used(&self, id: TableId) -> u64 {
        UnwindMaps::last_used(&self.skel.maps.unwind_tables, id)
    }

    /// Rows of the budget a loaded table takes.
    pub fn table_rows(&self, id: TableId) -> u64 {
        self.unwind.table_rows(id)
    }

    /// Whether a table of `rows` rows fits in the budget at all (with everything else evicted).
    pub fn table_could_fit(&self, rows: usize) -> bool {
        self.unwind.could_fit(rows)
    }

    pub fn remove_table(&mut self, id: TableId) -> Result<(), BpfError> {
        self.unwind.remove_table(&self.skel.maps.unwind_tables, id)
    }

    /// Replaces a process's executable mappings. Returns how many did not fit (beyond 1024).
    pub fn set_process(&self, pid: u32, mappings: &[ExecMapping]) -> Result<usize, BpfError> {
        UnwindMaps::set_process(&self.skel.maps.processes, pid, mappings)
    }

    pub fn remove_process(&self, pid: u32) {
        UnwindMaps::remove_process(&self.skel.maps.processes, pid);
        UnwindMaps::remove_process(&self.skel.maps.python_processes, pid);
    }

    /// Hooks the entry and return of `functions` (file offsets) of the file at `path`, in every
    /// process that maps it now or later; the programs keep to the targets.
    pub fn attach_cuda(&self, path: &Path, functions: &[(CudaApi, u64)]) -> Result<CudaHooks, BpfError> {
        let offsets: Vec<usize> = functions.iter().map(|&(_, off)| off as usize).collect();
        let cookies: Vec<u64> = functions.iter().map(|&(api, _)| u64::from(api.raw())).collect();
        let opts = UprobeMultiOpts { offsets, cookies, session: true, ..Default::default() };
        let link = self
            .skel
            .progs
            .on_cuda_call
            .attach_uprobe_multi_with_opts(-1, path, "", opts)
            .map_err(|source| attach_error(&format!("CUDA hooks to {}", path.display()), source))?;
        Ok(CudaHooks { _link: link })
    }

    /// What a hooked call costs on this machine beyond its programs: the entry and return traps,
    /// measured on a function of this process with programs that do nothing.
    pub fn calibrate_trap_cost(&self) -> Result<std::time::Duration, BpfError> {
        const CALLS: u32 = 500;
        const BATCHES: usize = 7;
        let offset = calibration_offset().ok_or_else(|| BpfError::Attach {
            what: "the calibration probe".into(),
            source: libbpf_rs::Error::from(std::io::Error::other("gpuflame_calibration_point not found in /proc/self/exe")),
        })?;
        let time = || {
            let start = std::time::Instant::now();
            for i in 0..CALLS {
                std::hint::black_box(gpuflame_calibration_point(std::hint::black_box(i)));
            }
            start.elapsed()
        };
        let bare = (0..BATCHES).map(|_| time()).min().unwrap_or_default();
        let opts = UprobeMultiOpts { offsets: vec![offset], session: true, ..Default::default() };
        let _link = self
            .skel
            .progs
            .on_calibrate
            .attach_uprobe_multi_with_opts(-1, "/proc/self/exe", "", opts)
            .map_err(|source| attach_error("the calibration probe", source))?;
        // The median batch: a VM's traps cost more now and then.
        let mut probed: Vec<std::time::Duration> = (0..BATCHES).map(|_| time()).collect();
        probed.sort();
        Ok(probed[BATCHES / 2].saturating_sub(bare) / CALLS)
    }

    /// Tells the Python walker where the process's interpreter is.
    pub fn set_python(&self, pid: u32, py: &PythonProcess) -> Result<(), BpfError> {
        UnwindMaps::set_python(&self.skel.maps.python_processes, pid, py)
    }

    /// How often the sampling program ran and its total run time in ns, as the kernel counts it
    /// while `kernel.bpf_stats_enabled` is 1 (0 otherwise).
    pub fn sampler_run_stats(&self) -> Option<(u64, u64)> {
        run_stats(self.skel.progs.on_cpu_sample.as_fd().as_raw_fd())
    }

    /// The same for the context-switch program of off-CPU profiling.
    pub fn off_cpu_run_stats(&self) -> Option<(u64, u64)> {
        run_stats(self.skel.progs.on_sched_switch.as_fd().as_raw_fd())
    }

    pub fn unwind_capacity(&self) -> UnwindCapacity {
        self.unwind.capacity()
    }
}

/// (runs, total ns) of a program, counted while kernel.bpf_stats_enabled=1.
fn run_stats(fd: i32) -> Option<(u64, u64)> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: info is a zeroed bpf_prog_info and len its size; the kernel fills at most len bytes.
    let ret = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
    (ret == 0).then_some((info.run_cnt, info.run_time_ns))
}

fn attach_error(what: &str, source: libbpf_rs::Error) -> BpfError {
    if is_permission(&source) {
        BpfError::PermissionDenied
    } else {
        BpfError::Attach { what: what.to_string(), source }
    }
}


/// A function for [`CpuSampler::calibrate_trap_cost`] to hook: exported so that its symbol stays.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpuflame_calibration_point(x: u32) -> u32 {
    std::hint::black_box(x.wrapping_mul(3))
}

/// The file offset of [`gpuflame_calibration_point`] in the running executable.
fn calibration_offset() -> Option<usize> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = std::fs::read("/proc/self/exe").ok()?;
    let elf = object::File::parse(&*data).ok()?;
    let sym = elf.symbols().chain(elf.dynamic_symbols()).find(|s| s.name() == Ok("gpuflame_calibration_point"))?;
    let addr = sym.address();
    elf.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        (addr >= seg.address() && addr < seg.address() + size).then(|| (addr - seg.address() + offset) as usize)
    })
}
