//! A profiling session: the BPF programs, the process tracker that keeps their unwind tables
//! current, the CUDA hooks, and the sources of the profiles asked for, fed in one loop. Windows
//! are closed here (`window.rs`): `record` runs one window, the agent one after another.

mod collector;
mod kernel;
mod late;
mod live_set;
mod order;
mod processes;
mod run_window;
mod threads_now;
mod waiting;
mod window;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfError, BpfPrograms, Event, OffCpuSampling, ThreadState, OptionalPrograms, TrapCost, ProcessEventKind, RingUse, SamplerConfig, Targets};

pub use collector::Collector;
pub use processes::{CudaState, Gone, ProcessView, Processes};
pub use threads_now::ThreadsNow;
pub use waiting::WaitingStats;
pub use window::{Flow, Oom, Window, WindowStats};
use waiting::WaitingThreads;
use late::LateStacks;
use live_set::LiveSet;
pub use late::{LateStats, UnwinderCheck};
use order::{record_sample, reports_first_for_new_processes};

use crate::cuda::ready::WaitingProcesses;
use crate::cuda::{CudaHookManager, DutyCycle};
use crate::process::ProcessTracker;
use crate::profile_kind::{needs_of, CudaHooks, ProfileKind};
use crate::sources::{Input, SourceStats};
use crate::workload::rank::{RankLabels, RankReader, RankStats};
use crate::workload::service::{ServiceNamer, Services};
use crate::UserError;

/// How long a session waits for the tables of small files before sampling starts.
const PRELOAD_WAIT: Duration = Duration::from_millis(1000);
/// How often the work of a window's caller runs, between polls.
const TICK: Duration = Duration::from_millis(100);

/// How long a dump waits for the tables its walks still need.
const DUMP_TABLES_WAIT: Duration = Duration::from_secs(3);

pub struct SessionConfig {
    pub targets: Targets,
    pub frequency_hz: u64,
    /// Kernel memory for unwind tables, in bytes.
    pub unwind_memory: u64,
    /// The profiles to make: they say what is attached (see `profile_kind::Needs`).
    pub profiles: Vec<ProfileKind>,
    /// When the duty-cycled CUDA hooks are attached; None keeps them attached (exact counts).
    pub cuda_duty: Option<DutyCycle>,
    /// The labels read from each process's environment (its rank in a distributed job).
    pub rank_labels: RankLabels,
    /// Keep device memory over time, to draw it at the end.
    pub memory_timeline: bool,
    /// Byte sampling of tensors' stacks: the interval, 0 for every stack (`SamplerConfig`).
    pub tensor_sample_bytes: u64,
    /// The most allocations the live set of device memory holds.
    pub max_live_allocations: u32,
    /// Follow tensors by hooks on the allocator's functions where it has no USDT probes.
    pub tensors_by_hooks: bool,
    /// Name each process's service, pod and container at its first record (the agent).
    pub service_names: Option<ServiceNamer>,
    /// Tests: every CPU sample's stack is unwound again in user space from a copy and compared
    /// with BPF's walk (`late::UnwinderCheck`).
    pub check_unwinder: bool,
    /// Load the task iterator that reports the targets' threads (`gpuflame dump`), whatever the
    /// profiles; off-CPU and wall load it anyway.
    pub thread_reports: bool,
}

pub struct Session {
    sampler: BpfPrograms,
    processes: Processes,
    collector: Collector,
    profiles: Vec<ProfileKind>,
    window: window::OpenWindow,
    /// Samples that wait for their table, to be finished from their copies.
    late: LateStacks,
    /// `check_unwinder`: the comparison of both unwinders.
    check: Option<UnwinderCheck>,
    /// Threads that wait now, reported at each window's end (off-CPU and wall).
    waiting: WaitingThreads,
    /// The off-CPU sampling period: a wait this long at a window's end is counted there.
    off_cpu_period_ns: u64,
    /// While `gpuflame dump` waits for the running threads' stacks: each thread's last CPU sample.
    tap: Option<std::collections::HashMap<u32, gpuflame_bpf::Sample>>,
    /// The live set of device memory: which processes' allocations leave it after the window.
    live: LiveSet,
}

impl Session {
    /// Loads the programs, the unwind tables of the processes that run now (all of them when
    /// `targets` is the whole machine), hooks the CUDA they map, then starts sampling.
    pub fn start(mut config: SessionConfig) -> anyhow::Result<Self> {
        let preload: Option<Vec<u32>> = match &config.targets {
            Targets::All => None,
            Targets::Processes { pids, .. } => Some(pids.clone()),
        };
        let frequency_hz = config.frequency_hz;
        // Descendants followed: a command started with the recording (record -- CMD).
        let command = matches!(config.targets, Targets::Processes { follow_forks: true, .. });
        let needs = needs_of(&config.profiles);
        // CPU samples alone come at a rate known now; switches and CUDA calls at any. Tensors
        // come in bursts (a training step's thousands in milliseconds, each malloc and free a
        // record even under byte sampling): a 4 MiB ring lost records of a 205,000-tensor burst
        // on the stand-in, so memory takes the largest ring too.
        let ring = if needs.switches || needs.cuda.is_some() { RingUse::Any } else { RingUse::CpuSamplesOnly };
        // A whole machine at a low frequency reads a new program only once its samples may need
        // it. Launch hooks need a program's libraries as soon as they are mapped; memory's (the
        // agent's defaults) are hooked when it is read, a fifth of a sample later, long before a
        // program that just mapped CUDA allocates.
        let whole_machine = matches!(config.targets, Targets::All);
        let read_delay = ProcessTracker::read_delay(frequency_hz).filter(|_| whole_machine && needs.cuda != Some(CudaHooks::DutyCycled));
        let sampler_config = SamplerConfig {
            frequency_hz,
            targets: config.targets,
            unwind_memory: config.unwind_memory,
            off_cpu: OffCpuSampling::at(frequency_hz),
            ring,
            lazy_process_events: read_delay.is_some(),
            tensor_sample_bytes: config.tensor_sample_bytes,
            memory_timeline: config.memory_timeline,
            tensor_allocation_records: config.profiles.contains(&ProfileKind::TensorAlloc),
            // Its buckets are allocated with the map (16 bytes an entry of the bound).
            max_live_allocations: if config.profiles.iter().any(|p| ProfileKind::MEMORY.contains(p)) { config.max_live_allocations } else { 1 },
            copy_every_stack: config.check_unwinder,
            programs: OptionalPrograms { off_cpu: needs.switches, cuda: needs.cuda.is_some() || needs.cupti, threads: config.thread_reports },
        };
        let loading = Instant::now();
        let mut sampler = BpfPrograms::start(&sampler_config).map_err(user_facing)?;
        tracing::debug!(ms = loading.elapsed().as_millis() as u64, "BPF programs loaded");
        config.profiles = kernel::runnable_profiles(&sampler, &config.profiles, config.cuda_duty.is_some())?;
        if !kernel::duty_cycles(&sampler) {
            config.cuda_duty = None;
        }
        let needs = needs_of(&config.profiles);
        let mut tracker = ProcessTracker::new();
        tracker.read_lazily(read_delay);
        tracker.demand_tables_at_low_priority(command);
        // On a whole machine a file's next process is often a moment away (a shell loop's
        // commands): its tables stay a while after its last process exits.
        tracker.keep_idle_tables(preload.is_none());
        let started = Instant::now();
        match preload {
            None => tracker.refresh_all(&mut sampler),
            Some(pids) => pids.iter().for_each(|&pid| tracker.refresh(&mut sampler, pid)),
        }
        // Small files' tables come in tens of ms: waiting a little for them makes the first
        // samples complete; big ones load when samples ask, while sampling runs.
        tracker.wait_for_tables(&mut sampler, PRELOAD_WAIT);
        let mut cuda = needs.cuda.map(|hooks| CudaState {
            hooks: CudaHookManager::new(hooks == CudaHooks::DutyCycled, config.cuda_duty)
                .with_tensors(config.profiles.iter().any(|k| matches!(k, ProfileKind::TensorAlloc | ProfileKind::TensorInUse)), config.tensors_by_hooks),
            waiting: WaitingProcesses::default(),
        });
        if let Some(c) = cuda.as_mut() {
            c.hooks.calibrate(&sampler);
            for pid in tracker.pids() {
                if let Some(entries) = tracker.exec_entries(pid) {
                    c.hooks.process_mapped(&sampler, pid, entries, Instant::now());
                }
            }
        }
        tracing::info!(
            processes = tracker.processes(),
            tables = tracker.stats.tables_built,
            rows = tracker.stats.rows_loaded,
            cuda_files = cuda.as_ref().map_or(0, |c| c.hooks.files_hooked()),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "unwind tables loaded"
        );
        if needs.cpu_samples {
            sampler.enable(frequency_hz)?;
        }
        for kind in &config.profiles {
            if let Some(h) = kind.descriptor().needs.stack_hook {
                sampler.attach_stack_hook(h.program, h.category, h.tracepoint, kind.origin()).map_err(user_facing)?;
            }
        }
        if needs.switches {
            sampler.enable_off_cpu()?;
        }
        let trap_cost = cuda.as_ref().map_or(TrapCost::default(), |c| c.hooks.trap_cost());
        let mut collector = Collector::new(&config.profiles, frequency_hz, trap_cost, config.tensor_sample_bytes);
        if config.memory_timeline {
            collector.keep_memory_timeline();
        }
        let mut processes = Processes::new(tracker, RankReader::new(config.rank_labels), config.service_names, cuda);
        processes.report_ready();
        let check = config.check_unwinder.then(UnwinderCheck::default);
        let off_cpu_period_ns = OffCpuSampling::at(frequency_hz).period_ns();
        let mut session = Session {
            sampler,
            processes,
            collector,
            profiles: config.profiles,
            window: window::OpenWindow::now(),
            late: LateStacks::default(),
            check,
            waiting: WaitingThreads::default(),
            off_cpu_period_ns,
            tap: None,
            live: LiveSet::default(),
        };
        // Threads that wait since before now are followed from here, their stacks read now,
        // before they may wake.
        if needs.switches {
            session.report_waiting_threads();
        }
        Ok(session)
    }

    /// Waits up to `timeout` for events and handles them; attaches and detaches the duty-cycled
    /// CUDA hooks on time.
    pub fn pump(&mut self, timeout: Duration) -> Result<(), BpfError> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            // Tables being built are loaded as they come, not at the end of the wait; a program
            // waiting for them is answered as soon as they are in.
            let wait = deadline.saturating_duration_since(now).min(self.processes.next_work(now));
            let events = self.sampler.poll(wait)?;
            self.handle(events);
            self.processes.after_batch(&mut self.sampler);
            self.release_late(false);
            if Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Handles whatever is already in the buffers.
    pub fn drain(&mut self) -> Result<(), BpfError> {
        let events = self.sampler.drain()?;
        self.handle(events);
        Ok(())
    }

    /// Process events go to the registry, records to the collector with their process's view.
    fn handle(&mut self, events: Vec<Event>) {
        let mut refreshed: Vec<u32> = Vec::new();
        // An exit can be read before the process's last records, which sit in the other ring
        // buffer: exits are handled after everything else of the batch.
        let (exits, events): (Vec<Event>, Vec<Event>) =
            events.into_iter().partition(|e| matches!(e, Event::Process(p) if p.kind == ProcessEventKind::Exit));
        let events = reports_first_for_new_processes(events, |pid| self.processes.known(pid));
        for (i, event) in events.into_iter().chain(exits).enumerate() {
            // A window of duty-cycled hooks must end on time even while a burst of its records
            // is being handled.
            if i % 64 == 63 {
                self.processes.tick(&self.sampler);
            }
            match event {
                Event::Process(ev) => {
                    let news = self.processes.event(&mut self.sampler, ev, &mut refreshed);
                    self.live.gone(&news.gone);
                    self.collector.heard(&news);
                }
                Event::CuptiStatus(status) => {
                    self.processes.cupti_status(&mut self.sampler, &status);
                    self.collector.offer(&Input::CuptiStatus(&status));
                }
                Event::Cuda(_) if self.processes.cuda().is_none() => {}
                Event::Cuda(call) if call.is_out_of_memory() && self.collector.wants_memory() => {
                    // What held the memory then, before the report that reads it.
                    let pid = call.sample.pid;
                    match self.sampler.live_at_oom(pid) {
                        Ok(live) => self.collector.offer(&Input::LiveAtOom { pid, live: &live }),
                        Err(e) => tracing::warn!("reading the live set at an out-of-memory of pid {pid}: {e}"),
                    }
                    self.collect(Event::Cuda(call));
                }
                Event::Sample(mut s) if s.stack_copy.is_some() => {
                    if let Some(check) = self.check.as_mut() {
                        check.check(&self.sampler, &s);
                        s.stack_copy = None;
                    }
                    if let Some(s) = self.late.offer(s) {
                        self.collect(Event::Sample(s));
                    }
                }
                Event::Sample(s) if self.tap.is_some() => {
                    if let Some(tap) = self.tap.as_mut() {
                        tap.insert(s.tid, s.clone());
                    }
                    self.collect(Event::Sample(s));
                }
                Event::OffCpu(o) if !o.sample.unwind.is_complete() => {
                    self.waiting.cut_short(o.sample.tid, o.since);
                    self.collect(Event::OffCpu(o));
                }
                other => self.collect(other),
            }
        }
    }

    fn collect(&mut self, event: Event) {
        let view = record_sample(&event).map(|s| self.processes.record(s)).unwrap_or_default();
        self.collector.record(&event, view);
    }

    /// Finishes the held samples whose tables came (`all`: every one, as far as it can) and
    /// asks for the tables they still need.
    fn release_late(&mut self, all: bool) {
        if self.late.is_empty() {
            return;
        }
        let (samples, needs) = self.late.release(&self.sampler, all);
        for n in needs {
            self.processes.tracker_mut().need_table(&mut self.sampler, n.pid, n.addr);
        }
        for s in samples {
            self.collect(Event::Sample(s));
        }
    }

    /// Reports the targets' threads: the stacks of waits not unwound read, then the waits going
    /// on given to the sources, which count them up to now.
    fn report_waiting_threads(&mut self) {
        let Some(mut pass) = self.waiting.pass(&self.sampler, self.off_cpu_period_ns) else { return };
        for &(pid, ip) in &pass.needs {
            self.processes.tracker_mut().need_table(&mut self.sampler, pid, ip);
        }
        for stack in std::mem::take(&mut pass.stacks) {
            self.collect(Event::OffCpu(stack));
        }
        for r in pass.waiting() {
            self.collector.offer(&Input::Waiting(r));
        }
    }

    /// Every thread of the targets now, with its stack: read at once for those that do not run
    /// (after waiting a while for the tables their walks need), from a CPU sample within
    /// `running_wait` for those that do (`gpuflame dump`).
    pub fn threads_now(&mut self, running_wait: Duration) -> anyhow::Result<ThreadsNow> {
        let threads = self.sampler.report_threads(false).map_err(user_facing)?;
        let (mut stacks, needs) = threads_now::read_stacks(&self.sampler, &threads, None);
        if !needs.is_empty() {
            for &(i, ip) in &needs {
                self.processes.tracker_mut().need_table(&mut self.sampler, threads[i].pid, ip);
            }
            self.processes.tracker_mut().wait_for_tables(&mut self.sampler, DUMP_TABLES_WAIT);
            let again: Vec<usize> = needs.iter().map(|&(i, _)| i).collect();
            stacks.extend(threads_now::read_stacks(&self.sampler, &threads, Some(&again)).0);
        }
        let running: Vec<usize> = (0..threads.len()).filter(|&i| threads[i].state == ThreadState::Running).collect();
        if !running.is_empty() {
            self.tap = Some(std::collections::HashMap::new());
            let deadline = Instant::now() + running_wait;
            while Instant::now() < deadline && !running.iter().all(|&i| self.tap.as_ref().is_some_and(|t| t.contains_key(&threads[i].tid))) {
                self.pump(Duration::from_millis(10))?;
            }
            let mut tap = self.tap.take().unwrap_or_default();
            stacks.extend(running.iter().filter_map(|&i| Some((i, tap.remove(&threads[i].tid)?))));
        }
        let mut values = Vec::with_capacity(stacks.len());
        for (i, sample) in stacks {
            let view = self.processes.record(&sample);
            let key = self.collector.stack_key(&sample, view, threads_now::leaf_of(&threads[i]));
            values.push((key, None, vec![i as i64 + 1]));
        }
        let labels = self.processes.labels_now();
        let stacks = self.collector.symbolize(threads_now::thread_profile(), values, &labels);
        Ok(ThreadsNow { threads, stacks, labels })
    }

    /// What reading the threads that wait did so far.
    pub fn waiting_stats(&self) -> WaitingStats {
        self.waiting.stats()
    }

    /// What finishing copied stacks did so far.
    pub fn late_stats(&self) -> LateStats {
        self.late.stats()
    }

    /// `check_unwinder`: how the two unwinders compared.
    pub fn unwinder_check(&self) -> Option<&UnwinderCheck> {
        self.check.as_ref()
    }

    /// Whether target threads' switches are followed (the off-cpu and wall profiles).
    pub fn off_cpu(&self) -> bool {
        needs_of(&self.profiles).switches
    }

    /// What the sources counted so far.
    pub fn source_stats(&self) -> SourceStats {
        self.collector.stats()
    }

    /// Python frames shown as `[unknown python]`: unreadable, or no longer the code sampled.
    pub fn unknown_python_frames(&self) -> u64 {
        self.collector.unknown_python_frames()
    }

    /// What reading processes' ranks counted so far.
    pub fn rank_stats(&self) -> RankStats {
        self.processes.rank_stats()
    }

    /// Service names, when the session was started with them (the agent's series).
    pub fn service_names(&mut self) -> Option<Services<'_>> {
        self.processes.service_names()
    }

    /// The BPF programs, to read what they counted.
    pub fn programs(&self) -> &BpfPrograms {
        &self.sampler
    }

    /// What is known of the processes: tables, CUDA hooks, identities.
    pub fn processes(&self) -> &Processes {
        &self.processes
    }

    /// Follows `pid` too (a command started gated, before it runs).
    pub fn add_target(&mut self, pid: u32) -> Result<(), BpfError> {
        self.sampler.add_target(pid)
    }

    /// Builds the tables of the files a command maps first before it runs (see
    /// [`ProcessTracker::preload`]); how many are ready.
    pub fn preload(&mut self, pid: u32, files: &[PathBuf], timeout: Duration) -> usize {
        self.processes.tracker_mut().preload(&mut self.sampler, pid, files, timeout)
    }

    /// Hooks the CUDA of a library by path, before any process maps it.
    pub fn hook_library(&mut self, path: &Path) {
        if let Some(c) = self.processes.cuda_mut() {
            c.hooks.hook_path(&self.sampler, path);
        }
    }
}

/// BPF failures that the user can act on become one-line usage errors.
pub fn user_facing(e: BpfError) -> anyhow::Error {
    match e {
        BpfError::PermissionDenied | BpfError::NoBtf(_) | BpfError::KernelLacks { .. } | BpfError::Unavailable(_) => UserError(e.to_string()).into(),
        other => other.into(),
    }
}
