//! The registry of processes: every fact gpuflame keeps about a process, with one way in (its
//! process events, and the first record of it) and one way out (its exit, heard or found).
//!
//! - its mappings, unwind tables and Python: the tracker (`process/`);
//! - who it is: its rank in a distributed job, read once per program while it lives, for `record`
//!   and the agent alike; its service, pod and container, for the agent's series; both kept past
//!   its exit by the one rule for exited processes ([`EXITED_GRACE`]: its last records are read
//!   late);
//! - the CUDA it maps, hooked (`cuda/hooks.rs`), and whether it waits for its tables at CUDA's
//!   initialisation.
//!
//! Whatever else holds something per process (the stacks' symbol caches, the sources' memory)
//! forgets it when the registry says the process is gone ([`Gone`]), or runs a new program
//! ([`News::new_program`], [`ProcessView::new_program`]): the registry alone hears exits and execs.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, CuptiStatus, ProcessEvent, ProcessEventKind, Sample};
use gpuflame_pyframes::Interpreter;
use gpuflame_symbolizer::MappedFile;

use crate::cuda::ready::{WaitingProcesses, STATUS_WAITING};
use crate::cuda::CudaHookManager;
use process::{labels_now, Process, Records};
use programs::identify;
use crate::process::{ProcessTracker, TrackerStats, EXITED_GRACE};
use crate::workload::rank::{LabelsByPid, ProcessLabels, RankReader, RankStats};
use crate::workload::service::{ServiceNamer, Services};

mod process;
mod programs;

/// How often the event loop looks for finished tables while some are being built.
const TABLE_POLL: Duration = Duration::from_millis(10);
/// How long samples of a Python process wait to be read at most. Its code objects are named from
/// its memory when their samples are read, so a function made and freed within the wait (a
/// generated one, a lambda of a loop) could no longer be named: with 100 ms, 29–31 of 60
/// functions of 50 ms each were (19 in a CI run), with 20 ms 53–60.
const PYTHON_POLL: Duration = Duration::from_millis(20);

pub struct CudaState {
    pub hooks: CudaHookManager,
    /// Programs held at CUDA initialisation until their tables are in.
    pub waiting: WaitingProcesses,
}

/// Processes that exited, or were found gone: what holds anything of theirs lets it go.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Gone(pub Vec<u32>);

/// At a window's close: processes found gone (their exit was lost), and processes forgotten,
/// exited [`EXITED_GRACE`] ago or more, whose records can no longer come: what a window is built
/// with of them goes, after this one was built.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Closed {
    pub gone: Gone,
    pub forgotten: Vec<u32>,
}

/// What a process event told the registry that others must hear: a process that runs a new
/// program (exec), or processes gone.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct News {
    pub new_program: Option<u32>,
    pub gone: Gone,
}

/// A record's process, as the registry knows it at the record.
#[derive(Clone, Copy, Default)]
pub struct ProcessView<'a> {
    /// The mappings it was unwound with: a forked child's may be its parent's, while its own are
    /// a new program's by now.
    pub files: Option<&'a [MappedFile]>,
    pub python: Option<&'a Interpreter>,
    /// The record is the first the registry saw of a new program in its process, whose exec
    /// event did not come first: what named the old program's frames goes.
    pub new_program: bool,
}

pub struct Processes {
    tracker: ProcessTracker,
    ranks: RankReader,
    /// Each process: who it is, the program it runs, whether its records were seen, and its exit
    /// (`process.rs`); the tracker holds its mappings.
    records: Records,
    /// Exits, oldest first: their labels and names stay until the first window close
    /// [`EXITED_GRACE`] after (a loaded agent reads a short-lived rank's last records seconds
    /// after it exited: its collectives went out unlabelled, its CPU samples labelled).
    exits: VecDeque<(Instant, u32)>,
    /// Service, pod and container names (the agent's series), when asked for.
    names: Option<ServiceNamer>,
    cuda: Option<CudaState>,
}

impl Processes {
    pub fn new(tracker: ProcessTracker, ranks: RankReader, names: Option<ServiceNamer>, cuda: Option<CudaState>) -> Self {
        Processes { tracker, ranks, records: HashMap::new(), exits: VecDeque::new(), names, cuda }
    }

    /// Service names, when the session was started with them, each process's kept in its record.
    pub fn service_names(&mut self) -> Option<Services<'_>> {
        Some(Services { namer: self.names.as_ref()?, store: &mut self.records })
    }

    /// Processes followed now.
    pub fn tracked(&self) -> usize {
        self.tracker.processes()
    }

    /// What tracking the processes has done so far: tables, reads of maps (`rows_unaccounted` is
    /// left to [`Self::rows_unaccounted`], which walks every table).
    pub fn tracking_stats(&self) -> &TrackerStats {
        &self.tracker.stats
    }

    /// Rows in BPF that no table accounts for (0 unless a bug).
    pub fn rows_unaccounted(&self, sampler: &BpfPrograms) -> u64 {
        self.tracker.rows_unaccounted(sampler)
    }

    /// The files `pid` maps, as last read (a while after it exits too).
    pub fn files_known(&self, pid: u32) -> usize {
        self.tracker.files(pid).map_or(0, <[_]>::len)
    }

    pub(super) fn tracker_mut(&mut self) -> &mut ProcessTracker {
        &mut self.tracker
    }

    pub fn cuda(&self) -> Option<&CudaState> {
        self.cuda.as_ref()
    }

    pub(super) fn cuda_mut(&mut self) -> Option<&mut CudaState> {
        self.cuda.as_mut()
    }

    pub fn rank_stats(&self) -> RankStats {
        self.ranks.stats()
    }

    /// Every process's labels, those that exited this window's included.
    pub fn labels(&self) -> &dyn LabelsByPid {
        &self.records
    }

    /// Every process's labels now, as a value of their own.
    pub fn labels_now(&self) -> ProcessLabels {
        labels_now(&self.records)
    }

    /// The registry's record of `pid`, made if there is none.
    fn record_of(&mut self, pid: u32) -> &mut Process {
        self.records.entry(pid).or_default()
    }

    /// `pid` runs a new program, or was not read yet (lazy reads): who it is is read now.
    fn read_identity(&mut self, pid: u32) {
        let p = self.records.entry(pid).or_default();
        let labels = self.ranks.exec(pid, &mut p.rank);
        p.set_labels(labels);
    }

    /// A process event: the tracker reads or forgets the process, its rank is read at exec, the
    /// CUDA it maps is hooked. `refreshed`: processes read in this batch already (a burst of
    /// mmaps, a Python importing extensions, needs one read). An exit is the one way out.
    pub fn event(&mut self, sampler: &mut BpfPrograms, ev: ProcessEvent, refreshed: &mut Vec<u32>) -> News {
        if matches!(ev.kind, ProcessEventKind::NeedTable { .. }) {
            self.tracker.handle(sampler, ev);
            return News::default();
        }
        if matches!(ev.kind, ProcessEventKind::MmapExec | ProcessEventKind::Unknown) && refreshed.contains(&ev.pid) {
            return News::default();
        }
        let seen = Instant::now();
        tracing::debug!(pid = ev.pid, kind = ?ev.kind, "process event");
        if ev.kind != ProcessEventKind::Exit {
            if let Some(p) = self.records.get_mut(&ev.pid) {
                p.live();
            }
        }
        match ev.kind {
            ProcessEventKind::Exit => {
                refreshed.retain(|&p| p != ev.pid);
                self.exited(sampler, ev.pid);
                return News { new_program: None, gone: Gone(vec![ev.pid]) };
            }
            // Read late (lazy reads), a new program's environment is read with its maps, or at
            // its first record.
            ProcessEventKind::Exec if self.tracker.lazy() => self.record_of(ev.pid).rank.forget(),
            ProcessEventKind::Exec => self.read_identity(ev.pid),
            _ => {}
        }
        self.tracker.handle(sampler, ev);
        match ev.kind {
            // A fork reads nothing: the child's first mapping of its own is news.
            ProcessEventKind::Fork { .. } => {}
            // Not read yet (lazy reads): a sample's request in this batch still reads it.
            _ if self.tracker.deferred(ev.pid) => {}
            _ => refreshed.push(ev.pid),
        }
        self.hook_cuda(sampler, ev.pid, seen);
        let exec = ev.kind == ProcessEventKind::Exec;
        if exec {
            // Its next name is the new program's, no news.
            self.record_of(ev.pid).main_thread.forget();
        }
        News { new_program: exec.then_some(ev.pid), gone: Gone::default() }
    }

    /// The one way out: everything kept of `pid` goes, but its labels, which its last records
    /// (read late on a loaded machine) still need for a window.
    fn exited(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        let now = Instant::now();
        self.tracker.exited(sampler, pid);
        if self.records.get_mut(&pid).is_some_and(|p| !p.exited()) {
            self.records.remove(&pid);
        }
        self.exits.push_back((now, pid));
        if let Some(c) = self.cuda.as_mut() {
            c.hooks.process_exited(pid);
        }
    }

    /// A record with a stack arrived: who its process is is read if it was not (once, and again
    /// after an exec); the view of it that the record's stack is made with.
    pub fn record(&mut self, sample: &Sample) -> ProcessView<'_> {
        let mut new_program = false;
        if sample.pid != 0 {
            let p = self.records.entry(sample.pid).or_default();
            // Named at its first record while it lives: a short one is gone by the window's end.
            if !p.seen {
                p.seen = true;
                if let Some(n) = &self.names {
                    n.observe(sample.pid, &mut p.service);
                }
            }
            let labels;
            (new_program, labels) = identify(&mut p.main_thread, &mut p.rank, &mut self.ranks, sample.pid, sample.tid, &sample.comm);
            p.set_labels(labels);
        }
        ProcessView { files: self.tracker.files_of_sample(sample.pid, sample.forked_from), python: self.tracker.python(sample.pid), new_program }
    }

    /// Whether the tracker has read `pid`'s maps.
    pub fn known(&self, pid: u32) -> bool {
        self.tracker.files(pid).is_some()
    }

    /// CUPTI's handshake: a program that waits at CUDA's initialisation for its tables has them
    /// built first, and is answered once they are in.
    pub fn cupti_status(&mut self, sampler: &mut BpfPrograms, status: &CuptiStatus) {
        if let Some(c) = self.cuda.as_mut() {
            if status.code == STATUS_WAITING {
                self.tracker.hurry(sampler, status.pid);
                c.waiting.add(status.pid, status.ready_word);
            }
        }
    }

    /// How long the event loop may wait before the registry has work: tables being built, a
    /// program waiting for them, Python's code objects, a lazy read, the duty cycle's toggle.
    pub fn next_work(&self, now: Instant) -> Duration {
        let toggle = self.cuda.as_ref().and_then(|c| c.hooks.next_toggle(now)).unwrap_or(Duration::MAX);
        let waiting = self.cuda.as_ref().is_some_and(|c| !c.waiting.is_empty());
        let tables = if self.tracker.building() || waiting { TABLE_POLL } else { Duration::MAX };
        let python = if self.tracker.has_python() { PYTHON_POLL } else { Duration::MAX };
        let lazy = self.tracker.next_lazy_pass(now).unwrap_or(Duration::MAX);
        let retry = self.tracker.next_python_retry(now).unwrap_or(Duration::MAX);
        toggle.min(tables).min(python).min(lazy).min(retry)
    }

    /// After a batch of records: programs due to be read are read (after the batch's exits: one
    /// gone by now is not), finished tables loaded, waiting programs answered, the duty cycle
    /// kept on time.
    pub fn after_batch(&mut self, sampler: &mut BpfPrograms) {
        for pid in self.tracker.read_due(sampler) {
            self.read_identity(pid);
            self.hook_cuda(sampler, pid, Instant::now());
        }
        self.tracker.poll_tables(sampler);
        self.tracker.retry_pythons(sampler);
        self.report_ready();
        if let Some(c) = self.cuda.as_mut() {
            c.hooks.tick(sampler);
            let tracker = &self.tracker;
            c.waiting.answer(|pid| tracker.tables_settled(pid));
        }
    }

    /// The duty cycle's windows end on time even inside a burst of records.
    pub fn tick(&mut self, sampler: &BpfPrograms) {
        if let Some(c) = self.cuda.as_mut() {
            c.hooks.tick(sampler);
        }
    }

    /// Hooks the CUDA libraries that `pid` maps, once its maps are read (at a process event, or
    /// late under lazy reads); a program that maps CUDA has its tables built soon.
    pub(super) fn hook_cuda(&mut self, sampler: &BpfPrograms, pid: u32, seen: Instant) {
        let (Some(c), Some(entries)) = (self.cuda.as_mut(), self.tracker.exec_entries(pid)) else { return };
        c.hooks.process_mapped(sampler, pid, entries, seen);
        if c.hooks.maps_cuda(pid) {
            self.tracker.build_soon(pid);
        }
    }

    /// A window closed (and was built): processes that exited [`EXITED_GRACE`] ago or more are
    /// forgotten, and processes whose exit was lost (a full ring) are found gone and let go of by
    /// the one way out. What else holds something of theirs is told.
    pub fn window_closed(&mut self, sampler: &mut BpfPrograms) -> Closed {
        let now = Instant::now();
        let mut forgotten = Vec::new();
        while let Some(&(at, pid)) = self.exits.front() {
            if now.duration_since(at) < EXITED_GRACE {
                break;
            }
            self.exits.pop_front();
            // Unless the same process's late records came, or another's with its pid.
            if self.records.get(&pid).is_none_or(Process::forgettable) {
                self.records.remove(&pid);
                forgotten.push(pid);
            }
        }
        // Those live, or whose records came after their exit. One asleep at cuInit for seconds,
        // never seen in a record, was read again after it was gone: it is found gone too.
        let lost: Vec<u32> = self.records.iter().filter(|(_, p)| p.is_live() || p.seen).map(|(&pid, _)| pid).filter(|&pid| !crate::target::process_alive(pid)).collect();
        for &pid in &lost {
            self.exited(sampler, pid);
        }
        Closed { gone: Gone(lost), forgotten }
    }

    /// Says which processes' stacks can be whole from now on (see [`ProcessTracker::take_ready`]).
    pub(super) fn report_ready(&mut self) {
        if !tracing::enabled!(target: "gpuflame::ready", tracing::Level::DEBUG) {
            return;
        }
        for (pid, mappings) in self.tracker.take_ready() {
            tracing::debug!(target: "gpuflame::ready", pid, mappings, "unwind tables ready");
        }
    }
}
