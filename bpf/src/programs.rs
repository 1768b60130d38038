//! The CPU sampler: a perf_event program per online CPU, samples through a ring buffer.

use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
use std::path::Path;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::{Link, MapCore, MapFlags, RingBuffer, RingBufferBuilder};

use gpuflame_unwind::{CompactTable, LoadSegment, RuleTable};

use crate::config::{SamplerConfig, Targets};
use crate::counters::{self, Counters};
use crate::error::{attach_error, BpfError};
use crate::events::{self, Event};
use crate::features::KernelFeatures;
use crate::perf;
use crate::skel::CpuSamplerSkel;
use load::Unavailable;
use crate::unwind_maps::{ExecMapping, PendingTable, PythonProcess, TableId, UnwindCapacity, UnwindMaps};

pub(crate) mod cuda_hooks;
pub(crate) mod hooks;
pub(crate) mod load;

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// The USDT links a sampler holds, by the id of the handle that asked for them.
#[derive(Default)]
struct UsdtLinks {
    next: u64,
    links: HashMap<u64, [Link; 2]>,
}

/// The BPF object, loaded and attached: the CPU sampler, the switch and process-event programs, the
/// unwinder's maps, the CUDA hooks and probes, the ring buffers. Dropping it detaches everything.
pub struct BpfPrograms {
    // Field order is drop order: detach and stop reading before the object goes.
    _links: Vec<Link>,
    usdt: Rc<RefCell<UsdtLinks>>,
    ring: RingBuffer<'static>,
    inbox: Rc<RefCell<Vec<Event>>>,
    malformed: Rc<RefCell<u64>>,
    /// How long records waited in the samples ring before they were read.
    lag: Rc<crate::ring_lag::RingLag>,
    unwind: UnwindMaps,
    skel: CpuSamplerSkel<'static>,
    features: KernelFeatures,
    /// The groups of programs asked for that this kernel did not take.
    unavailable: Vec<Unavailable>,
}

impl BpfPrograms {
    pub(crate) fn skel(&self) -> &CpuSamplerSkel<'static> {
        &self.skel
    }

    pub(crate) fn skel_mut(&mut self) -> &mut CpuSamplerSkel<'static> {
        &mut self.skel
    }

    /// The inner map of unwind rows number `index`, once created.
    pub(crate) fn unwind_shard(&self, index: u32) -> Option<&libbpf_rs::MapHandle> {
        self.unwind.shard(index)
    }

    /// Loads the programs, opens one CPU-clock event per online CPU and starts sampling.
    pub fn start(config: &SamplerConfig) -> Result<Self, BpfError> {
        if !Path::new(BTF_PATH).exists() {
            return Err(BpfError::NoBtf(BTF_PATH.into()));
        }
        let features = KernelFeatures::probe();
        tracing::debug!(?features, "the kernel's BPF features");
        let load::Loaded { skel, unavailable } = load::load(config, &features)?;
        if config.tensor_sample_bytes > 0 {
            let n = skel.maps.tensor_draws.max_entries() as usize;
            for (i, draw) in crate::config::tensor_draws(config.tensor_sample_bytes, n).into_iter().enumerate() {
                skel.maps.tensor_draws.update(&(i as u32).to_ne_bytes(), &draw.to_ne_bytes(), MapFlags::ANY).map_err(BpfError::load)?;
            }
        }

        let mut sampler_links = Vec::new();
        // Fork in every mode: besides following a command's descendants, it gives a forked child
        // a copy of its parent's mappings.
        for prog in [&skel.progs.on_process_fork, &skel.progs.on_process_exec, &skel.progs.on_process_exit, &skel.progs.on_mmap] {
            let link = prog.attach().map_err(|source| attach_error("the fork, exec, mmap and exit hooks", source))?;
            sampler_links.push(link);
        }

        let inbox = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let lag = Rc::new(crate::ring_lag::RingLag::default());
        let ring = {
            let sample_lag = Rc::clone(&lag);
            let (sample_inbox, sample_malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let mut copies = events::CopiesAwaitingSamples::default();
            let (process_inbox, process_malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let (oom_inbox, oom_malformed) = (Rc::clone(&inbox), Rc::clone(&malformed));
            let mut builder = RingBufferBuilder::new();
            builder
                .add(&skel.maps.samples, move |data: &[u8]| {
                    sample_lag.read(data);
                    match events::decode_ring_record(data, &mut copies) {
                        Ok(Some(event)) => sample_inbox.borrow_mut().push(event),
                        Ok(None) => {}
                        Err(()) => *sample_malformed.borrow_mut() += 1,
                    }
                    0
                })
                .map_err(BpfError::RingBuffer)?
                .add(&skel.maps.oom_records, move |data: &[u8]| {
                    match events::decode_record(data) {
                        Some(event) => oom_inbox.borrow_mut().push(event),
                        None => *oom_malformed.borrow_mut() += 1,
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

        let sampler = BpfPrograms {
            features,
            unavailable,
            _links: sampler_links,
            usdt: Rc::default(),
            ring,
            inbox,
            malformed,
            lag,
            unwind: UnwindMaps::new(u32::try_from((config.unwind_memory / SamplerConfig::BYTES_PER_ROW).div_ceil(16).max(1)).unwrap_or(u32::MAX)),
            skel,
        };
        if let Targets::Processes { pids, .. } = &config.targets {
            for &pid in pids {
                sampler.add_target(pid)?;
            }
        }
        Ok(sampler)
    }

    /// Starts sampling: one CPU-clock event per online CPU. Separate from [`BpfPrograms::start`]
    /// so that unwind tables of known processes can be loaded first.
    pub fn enable(&mut self, frequency_hz: u64) -> Result<(), BpfError> {
        self.attach_perf_events(frequency_hz)
    }

    /// Starts following target threads' switches for off-CPU time.
    pub fn enable_off_cpu(&mut self) -> Result<(), BpfError> {
        self.require(load::ProgramGroup::OffCpu)?;
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
        // epoll takes whole milliseconds: a wait under one, cut to zero, returned at once, and
        // the event loop spun until its deadline (700 wakeups a second in an idle agent).
        let timeout = Duration::from_millis(u64::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(u64::MAX));
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

    /// The longest any record waited in the samples ring before it was read, since the last call:
    /// how far behind a starved reader fell.
    pub fn take_ring_lag(&self) -> Duration {
        self.lag.take()
    }

    /// Records that did not have the size of a sample (a layout mismatch; should stay 0).
    pub fn malformed_records(&self) -> u64 {
        *self.malformed.borrow()
    }

    /// The programs' counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, BpfError> {
        counters::read_map(&self.skel.maps.counters)
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

    /// Starts a table whose rows come in pieces, each written as it comes: see
    /// [`Self::add_table_rows`], [`Self::finish_table`].
    pub fn begin_table(&mut self, base: u64) -> Result<PendingTable, BpfError> {
        self.unwind.begin_table(base)
    }

    /// Writes a piece of a pending table's rows (every piece but the last fills whole pages of
    /// 4,096 rows). A full budget is [`BpfError::UnwindFull`], the table left as it was.
    pub fn add_table_rows(&mut self, pending: &mut PendingTable, rows: &CompactTable) -> Result<(), BpfError> {
        self.unwind.add_rows(&self.skel.maps.unwind_shards, pending, rows)
    }

    /// Makes a pending table visible to the unwinder.
    pub fn finish_table(&mut self, pending: PendingTable, in_use: bool) -> Result<TableId, BpfError> {
        self.unwind.finish_table(&self.skel.maps.page_index, &self.skel.maps.unwind_tables, pending, in_use)
    }

    /// Gives back what a pending table took.
    pub fn abort_table(&mut self, pending: PendingTable) {
        self.unwind.abort_table(pending);
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
        self.unwind.remove_table(&self.skel.maps.unwind_tables, id)?;
        UnwindMaps::bump_epoch(&self.skel.maps.unwind_epoch)
    }

    /// Publishes a loaded table by the identity of its file (st_dev, st_ino, st_size), for code
    /// that no mapping of [`Self::set_process`] covers yet: a program's first milliseconds after
    /// exec, a library just mapped. Its samples say so ([`crate::Sample::by_file`]).
    pub fn publish_file_table(&self, dev: u64, ino: u64, size: u64, id: TableId, segments: &[LoadSegment]) -> Result<(), BpfError> {
        UnwindMaps::publish_file_table(&self.skel.maps.file_tables, dev, ino, size, id, segments)
    }

    /// Takes back what [`Self::publish_file_table`] published for the file; before its table goes.
    pub fn unpublish_file_table(&self, dev: u64, ino: u64, size: u64) {
        UnwindMaps::unpublish_file_table(&self.skel.maps.file_tables, dev, ino, size)
    }

    /// Replaces a process's executable mappings. Returns how many did not fit (beyond 1024).
    /// `forked_from`: they are the parent's, which a forked child runs until it execs or maps
    /// code of its own; its samples say so.
    pub fn set_process(&self, pid: u32, mappings: &[ExecMapping], forked_from: Option<u32>) -> Result<usize, BpfError> {
        let dropped = UnwindMaps::set_process(&self.skel.maps.processes, pid, mappings, forked_from)?;
        UnwindMaps::bump_epoch(&self.skel.maps.unwind_epoch)?;
        // The VMAs its samples looked up while it was not described (file_vmas.h) are stale now.
        let _ = self.skel.maps.file_vmas_of.delete(&pid.to_ne_bytes());
        Ok(dropped)
    }

    pub fn remove_process(&self, pid: u32) {
        UnwindMaps::remove_process(&self.skel.maps.processes, pid);
        UnwindMaps::remove_process(&self.skel.maps.python_processes, pid);
        if let Err(e) = UnwindMaps::bump_epoch(&self.skel.maps.unwind_epoch) {
            tracing::warn!(error = %e, "cannot move the unwinder's epoch on after a process went");
        }
    }

    /// The kernel this sampler runs on, as probed before loading.
    pub fn kernel(&self) -> &KernelFeatures {
        &self.features
    }

    /// The groups of programs asked for that this kernel did not take, and why.
    pub fn unavailable(&self) -> &[Unavailable] {
        &self.unavailable
    }

    /// An error naming why, when `group` was not loaded.
    pub(crate) fn require(&self, group: load::ProgramGroup) -> Result<(), BpfError> {
        match self.unavailable.iter().find(|u| u.group == group) {
            Some(u) => Err(BpfError::Unavailable(u.why.clone())),
            None => Ok(()),
        }
    }

    /// Tells the Python walker where the process's interpreter is.
    pub fn set_python(&self, pid: u32, py: &PythonProcess) -> Result<(), BpfError> {
        UnwindMaps::set_python(&self.skel.maps.python_processes, pid, py)?;
        // The rules kept per address say whether each is in the evaluation loop (frame_cache.h).
        UnwindMaps::bump_epoch(&self.skel.maps.unwind_epoch)
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
