//! A profiling session: the BPF programs, the process tracker that keeps their unwind tables
//! current, the CUDA hooks, and the aggregators, fed in one loop. `record` runs one for a
//! recording, `agent` forever.

use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfError, CpuSampler, Event, ProcessEventKind, SamplerConfig, Targets};

use crate::aggregate::CpuAggregator;
use crate::cuda::{CudaHookManager, CudaProfiles, DutyCycle, OomReport};
use crate::process::ProcessTracker;
use crate::UserError;

/// How long a session waits for the tables of small files before sampling starts.
const PRELOAD_WAIT: Duration = Duration::from_millis(1000);
/// How often the event loop looks for finished tables while some are being built.
const TABLE_POLL: Duration = Duration::from_millis(10);

/// What the CUDA hooks are for.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Hook launches and synchronisations too (gpu-launches, cuda-api).
    pub launches: bool,
    /// When their hooks are attached; None keeps them attached (exact counts).
    pub duty: Option<DutyCycle>,
}

pub struct SessionConfig {
    pub targets: Targets,
    pub frequency_hz: u64,
    /// Kernel memory for unwind tables, in bytes.
    pub unwind_memory: u64,
    /// Sample CPU time.
    pub cpu: bool,
    pub cuda: Option<CudaOptions>,
}

pub struct CudaState {
    pub hooks: CudaHookManager,
    pub profiles: CudaProfiles,
}

pub struct Session {
    pub sampler: CpuSampler,
    pub tracker: ProcessTracker,
    pub aggregator: CpuAggregator,
    pub cuda: Option<CudaState>,
    /// Out-of-memory failures not yet reported.
    pub ooms: Vec<OomReport>,
    pub frequency_hz: u64,
}

impl Session {
    /// A CPU-only session.
    pub fn start_cpu(targets: Targets, frequency_hz: u64, unwind_memory: u64) -> anyhow::Result<Self> {
        Self::start(SessionConfig { targets, frequency_hz, unwind_memory, cpu: true, cuda: None })
    }

    /// Loads the programs, the unwind tables of the processes that run now (all of them when
    /// `targets` is the whole machine), hooks the CUDA they map, then starts sampling.
    pub fn start(config: SessionConfig) -> anyhow::Result<Self> {
        let preload: Option<Vec<u32>> = match &config.targets {
            Targets::All => None,
            Targets::Processes { pids, .. } => Some(pids.clone()),
        };
        let frequency_hz = config.frequency_hz;
        let sampler_config = SamplerConfig { frequency_hz, targets: config.targets, unwind_memory: config.unwind_memory };
        let mut sampler = CpuSampler::start(&sampler_config).map_err(user_facing)?;
        let mut tracker = ProcessTracker::new();
        let started = Instant::now();
        match preload {
            None => tracker.refresh_all(&mut sampler),
            Some(pids) => pids.iter().for_each(|&pid| tracker.refresh(&mut sampler, pid)),
        }
        // Small files' tables come in tens of ms: waiting a little for them makes the first
        // samples complete; big ones load when samples ask, while sampling runs.
        tracker.wait_for_tables(&mut sampler, PRELOAD_WAIT);
        let mut cuda = config.cuda.map(|c| CudaState { hooks: CudaHookManager::new(c.launches, c.duty), profiles: CudaProfiles::default() });
        if let Some(c) = cuda.as_mut() {
            c.hooks.calibrate(&sampler);
            c.profiles.set_trap_cost(c.hooks.trap_cost());
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
        if config.cpu {
            sampler.enable(frequency_hz)?;
        }
        Ok(Session { sampler, tracker, aggregator: CpuAggregator::new(), cuda, ooms: Vec::new(), frequency_hz })
    }

    /// Waits up to `timeout` for events and handles them; attaches and detaches the duty-cycled
    /// CUDA hooks on time.
    pub fn pump(&mut self, timeout: Duration) -> Result<(), BpfError> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            let toggle = self.cuda.as_ref().and_then(|c| c.hooks.next_toggle(now));
            // Tables being built are loaded as they come, not at the end of the wait.
            let tables = if self.tracker.building() { TABLE_POLL } else { Duration::MAX };
            let wait = deadline.saturating_duration_since(now).min(toggle.unwrap_or(Duration::MAX)).min(tables);
            let events = self.sampler.poll(wait)?;
            self.handle(events);
            self.tracker.poll_tables(&mut self.sampler);
            if let Some(c) = self.cuda.as_mut() {
                c.hooks.tick(&self.sampler);
            }
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

    fn handle(&mut self, events: Vec<Event>) {
        let mut refreshed: Vec<u32> = Vec::new();
        // An exit can be read before the process's last records, which sit in the other ring
        // buffer: exits are handled after everything else of the batch.
        let (exits, events): (Vec<Event>, Vec<Event>) =
            events.into_iter().partition(|e| matches!(e, Event::Process(p) if p.kind == ProcessEventKind::Exit));
        for (i, event) in events.into_iter().chain(exits).enumerate() {
            // A window of duty-cycled hooks must end on time even while a burst of its records
            // is being handled.
            if i % 64 == 63 {
                if let Some(c) = self.cuda.as_mut() {
                    c.hooks.tick(&self.sampler);
                }
            }
            match event {
                Event::Sample(sample) => self.aggregator.add(&sample, self.tracker.files(sample.pid), self.tracker.python(sample.pid)),
                Event::Process(ev) if matches!(ev.kind, ProcessEventKind::NeedTable { .. }) => self.tracker.handle(&mut self.sampler, ev),
                Event::Process(ev) => {
                    // A burst of mmaps (a Python importing extensions) needs one refresh.
                    if ev.kind != ProcessEventKind::Exit && refreshed.contains(&ev.pid) {
                        continue;
                    }
                    let seen = Instant::now();
                    self.tracker.handle(&mut self.sampler, ev);
                    tracing::debug!(pid = ev.pid, kind = ?ev.kind, "process event");
                    let Some(c) = self.cuda.as_mut() else { continue };
                    if ev.kind == ProcessEventKind::Exit {
                        refreshed.retain(|&p| p != ev.pid);
                        c.hooks.process_exited(ev.pid);
                        c.profiles.process_exited(ev.pid);
                    } else if let Some(entries) = self.tracker.exec_entries(ev.pid) {
                        refreshed.push(ev.pid);
                        c.hooks.process_mapped(&self.sampler, ev.pid, entries, seen);
                    }
                }
                Event::Cuda(call) => {
                    let Some(c) = self.cuda.as_mut() else { continue };
                    let pid = call.sample.pid;
                    if let Some(oom) = c.profiles.add(&call, &mut self.aggregator, self.tracker.files(pid), self.tracker.python(pid)) {
                        self.ooms.push(oom);
                    }
                }
                Event::KernelName(k) => {
                    if let Some(c) = self.cuda.as_mut() {
                        c.profiles.kernel_named(k);
                    }
                }
                Event::GpuKernels(batch) => {
                    if let Some(c) = self.cuda.as_mut() {
                        c.profiles.gpu_kernels(&batch);
                    }
                }
                Event::GpuKernelName(n) => {
                    if let Some(c) = self.cuda.as_mut() {
                        c.profiles.gpu_kernel_named(n);
                    }
                }
            }
        }
    }
}

/// BPF failures that the user can act on become one-line usage errors.
pub fn user_facing(e: BpfError) -> anyhow::Error {
    match e {
        BpfError::PermissionDenied | BpfError::NoBtf(_) => UserError(e.to_string()).into(),
        other => other.into(),
    }
}
