//! Builds unwind tables on threads of their own, so that neither sampling nor the event loop waits
//! for a 100 MB `.eh_frame`. Files that samples need come first; small files are built ahead of
//! need, smallest first; big files only when a sample asks for them. Small and big files have a
//! thread each, so that a table of milliseconds never waits seconds behind a big one (an 80 MiB
//! `.eh_frame` that any user can map took 2.7 s, and stacks of every other new program stopped at
//! their leaf for as long).

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpuflame_unwind::{CompactTable, ExecutableKey, RuleTable, TablePiece, TableSummary, UnwindError, UnwindTable};

/// A table to build: the file's key, and paths that reach it (the map_files entries of the
/// processes that map it; the first that still opens is read).
#[derive(Debug, Clone)]
pub struct BuildJob {
    pub key: ExecutableKey,
    pub paths: Vec<PathBuf>,
    /// Bytes of CFI, for the order of background builds.
    pub cfi_bytes: u64,
    /// The file's bytes when it exists only in memory (the vDSO).
    pub image: Option<Vec<u8>>,
    /// A sample waits for it (set by [`TableBuilder::urgent`]).
    pub urgent: bool,
    /// One of the targets' tables at the start of a session (set by
    /// [`TableBuilder::promote_all`]): built at normal priority.
    pub startup: bool,
}

/// What a builder thread says.
pub enum BuildMsg {
    /// The next rows of a big file's table, which is built and loaded in pieces: its rows are
    /// never all in memory.
    Piece { key: ExecutableKey, rows: CompactTable },
    Done(Built),
}

/// A finished build.
pub struct Built {
    pub key: ExecutableKey,
    pub table: Result<BuiltTable, String>,
    /// The shared rules as they are after this build, when it added any.
    pub rules: Option<RuleTable>,
    pub elapsed: Duration,
    /// Functions without CFI that got rows from their prologues.
    pub from_prologues: usize,
}

pub enum BuiltTable {
    Whole(CompactTable),
    /// Its rows came before, in [`BuildMsg::Piece`]s.
    Pieces { rows: usize },
}

impl BuiltTable {
    pub fn len(&self) -> usize {
        match self {
            BuiltTable::Whole(t) => t.len(),
            BuiltTable::Pieces { rows } => *rows,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Rows a piece of a big table holds: 16 pages of BPF's (4,096 rows each), 384 KiB packed.
const PIECE_ROWS: usize = 16 * 4096;
/// Messages the builders may be ahead of the event loop, which reads them every 10 ms while
/// tables are built: what bounds the rows in memory at once (3 MiB of pieces).
const MESSAGES_AHEAD: usize = 8;

#[derive(Default)]
struct Queue {
    /// Asked for by samples: first come, first built.
    urgent: VecDeque<BuildJob>,
    /// Built ahead of need, smallest first: (cfi bytes, sequence).
    background: BTreeSet<(u64, u64)>,
    jobs: Vec<Option<BuildJob>>,
    queued: HashSet<ExecutableKey>,
    /// The file being built now.
    building: Option<ExecutableKey>,
    /// Since when, if a sample waits for it and it is not at normal priority yet.
    urgent_since: Option<Instant>,
    /// The builder thread's id, for raising its priority from the event loop.
    tid: Option<libc::pid_t>,
    /// Tables samples ask for are built at low priority first (see [`TableBuilder::demand_at_low_priority`]).
    low_demand: bool,
    busy: bool,
    stop: bool,
}

impl Queue {
    /// Whether `job` is built at [`LOW_NICE`]: ahead of need always; asked for by a sample only
    /// for a command started with the recording, and only a big table. Small tables are
    /// milliseconds of work a sample waits for; big ones (libtorch_cpu.so: 17 MB of CFI, 250 ms)
    /// are what competes with the command's start-up.
    fn at_low_priority(&self, job: &BuildJob) -> bool {
        !job.urgent || (self.low_demand && !job.startup && job.cfi_bytes > SMALL_CFI_BYTES)
    }

    fn next(&mut self) -> Option<BuildJob> {
        let job = match self.urgent.pop_front() {
            Some(job) => job,
            None => {
                let first = self.background.pop_first()?;
                self.jobs.get_mut(first.1 as usize)?.take()?
            }
        };
        self.queued.remove(&job.key);
        Some(job)
    }
}

pub struct TableBuilder {
    /// Files with up to [`SMALL_CFI_BYTES`] of CFI, and in-memory images.
    small: Lane,
    big: Lane,
    results: Receiver<BuildMsg>,
}

impl TableBuilder {
    pub fn start() -> Self {
        let (tx, results) = mpsc::sync_channel(MESSAGES_AHEAD);
        // Both threads intern into one rule table, which the tables' rule indices refer to.
        let rules = Arc::new(Mutex::new(RuleTable::default()));
        let small = Lane::start("gpuflame-tables", tx.clone(), Arc::clone(&rules), false);
        let big = Lane::start("gpuflame-tables-big", tx, rules, true);
        TableBuilder { small, big, results }
    }

    fn lane(&self, job: &BuildJob) -> &Lane {
        if job.image.is_some() || job.cfi_bytes <= SMALL_CFI_BYTES {
            &self.small
        } else {
            &self.big
        }
    }

    /// Queues a table a sample needs, ahead of everything else.
    pub fn urgent(&self, job: BuildJob) {
        self.lane(&job).urgent(job);
    }

    /// See [`Lane::demand_at_low_priority`].
    pub fn demand_at_low_priority(&self, low: bool) {
        self.small.demand_at_low_priority(low);
        self.big.demand_at_low_priority(low);
    }

    /// Queues a table to build when nothing urgent waits.
    pub fn background(&self, job: BuildJob) {
        self.lane(&job).background(job);
    }

    /// See [`Lane::promote_all`].
    pub fn promote_all(&self) {
        self.small.promote_all();
        self.big.promote_all();
    }

    /// Tables built since the last call. Also raises a builder to normal priority when a table a
    /// sample waits for has been building for [`ESCALATE_AFTER`].
    pub fn finished(&self) -> Vec<BuildMsg> {
        self.small.escalate();
        self.big.escalate();
        self.results.try_iter().collect()
    }

    /// Whether anything is queued or being built.
    pub fn busy(&self) -> bool {
        self.small.busy() || self.big.busy()
    }

    /// Waits up to `timeout` for the next finished table.
    pub fn wait(&self, timeout: Duration) -> Option<BuildMsg> {
        self.results.recv_timeout(timeout).ok()
    }
}

/// One builder thread and its queue.
struct Lane {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Lane {
    /// `pieces`: its tables are built and sent in pieces (the big files').
    fn start(name: &str, results: SyncSender<BuildMsg>, rules: Arc<Mutex<RuleTable>>, pieces: bool) -> Self {
        let shared = Arc::new((Mutex::new(Queue::default()), Condvar::new()));
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || build_loop(&worker, &results, &rules, pieces))
            .map_err(|e| tracing::warn!(error = %e, "cannot start a table builder; stacks stop at files without tables"))
            .ok();
        Lane { shared, thread }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A poisoned lock means the builder panicked; its queue is still consistent.
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn urgent(&self, mut job: BuildJob) {
        job.urgent = true;
        let mut q = self.queue();
        let normal = !q.at_low_priority(&job);
        // The builder may be asleep at low priority, or building something else at it: a sample
        // waits now, for this table or for what is before it, and a thread of niceness 19 among
        // busy programs takes hundreds of ms just to be scheduled.
        if let Some(tid) = q.tid {
            if normal {
                set_nice_of(tid, demanded_nice(&job));
            } else if q.building.as_ref() == Some(&job.key) {
                q.urgent_since.get_or_insert_with(Instant::now);
            }
        }
        if q.building.as_ref() == Some(&job.key) || q.urgent.iter().any(|j| j.key == job.key) {
            return;
        }
        // Asked for while waiting in the background: the urgent entry replaces it.
        if q.queued.contains(&job.key) {
            let found = q.jobs.iter().position(|j| j.as_ref().is_some_and(|j| j.key == job.key));
            if let Some(i) = found {
                q.jobs[i] = None;
                q.background.retain(|&(_, seq)| seq != i as u64);
            }
        }
        q.queued.insert(job.key.clone());
        q.urgent.push_back(job);
        self.shared.1.notify_one();
    }

    /// Builds the big tables samples ask for at low priority, raised after [`ESCALATE_AFTER`]: for
    /// programs started with the recording, whose start-up (an `import torch` that maps 71
    /// files) competes for the CPU with the tables it makes samples ask for. Attached to running
    /// programs, their hot code is what the tables are for, at normal priority at once.
    fn demand_at_low_priority(&self, low: bool) {
        self.queue().low_demand = low;
    }

    fn background(&self, job: BuildJob) {
        let mut q = self.queue();
        if q.building.as_ref() == Some(&job.key) || !q.queued.insert(job.key.clone()) {
            return;
        }
        let seq = q.jobs.len() as u64;
        q.background.insert((job.cfi_bytes, seq));
        q.jobs.push(Some(job));
        self.shared.1.notify_one();
    }

    /// Makes everything queued urgent: at the start of a session the targets' tables are what
    /// the first samples need, and are worth the CPU at normal priority.
    fn promote_all(&self) {
        let mut q = self.queue();
        // The table being built now, begun at low priority, is one of them.
        if let Some(tid) = q.tid {
            set_nice_of(tid, 0);
        }
        let waiting: Vec<(u64, u64)> = std::mem::take(&mut q.background).into_iter().collect();
        for (_, seq) in waiting {
            if let Some(mut job) = q.jobs.get_mut(seq as usize).and_then(Option::take) {
                job.urgent = true;
                job.startup = true;
                q.urgent.push_back(job);
            }
        }
        self.shared.1.notify_one();
    }

    /// Raises the builder to normal priority when a table a sample waits for has been building
    /// for [`ESCALATE_AFTER`].
    fn escalate(&self) {
        let mut q = self.queue();
        if let (Some(since), Some(tid)) = (q.urgent_since, q.tid) {
            if since.elapsed() >= ESCALATE_AFTER {
                set_nice_of(tid, DEMANDED_NICE);
                q.urgent_since = None;
            }
        }
    }

    fn busy(&self) -> bool {
        let q = self.queue();
        q.busy || !q.urgent.is_empty() || !q.background.is_empty()
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.queue().stop = true;
        self.shared.1.notify_all();
        // A build in progress is not waited for: the process is ending or the session is over.
        drop(self.thread.take());
    }
}

/// The builder's niceness for tables built ahead of need, and for those samples ask for while
/// the programs start (record -- CMD): it takes idle CPU, not the profiled programs' (an import
/// of torch maps 71 files and samples ask for 87 tables, 6.3M rows, 0.8 s of building on a 2-CPU
/// machine: with those at normal priority the import took 14.6% longer, at 19 6.1%; medians of 8).
const LOW_NICE: i32 = 19;
/// The builder's niceness for a table samples wait for: on a node whose CPUs the profiled
/// processes saturate (4 torch ranks with 2 DataLoader workers each on 2 CPUs), libtorch_cpu.so's
/// table took 2.9 s at niceness 0, and every worker's stack stopped at it meanwhile. A table is
/// built once for every process that maps it.
const DEMANDED_NICE: i32 = -5;

/// The niceness of a job asked for ahead of the others: [`DEMANDED_NICE`] when a sample waits for
/// it, normal for the targets' tables at a session's (or a command's) start.
fn demanded_nice(job: &BuildJob) -> i32 {
    if job.startup {
        0
    } else {
        DEMANDED_NICE
    }
}
/// Tables samples ask for with at most this much CFI are built at normal priority even for a
/// command started with the recording.
const SMALL_CFI_BYTES: u64 = 1 << 20;
/// How long a table a sample waits for is built at low priority before the builder is raised to
/// normal: on a machine whose CPUs are all busy, a niceness of 19 would leave it seconds behind.
const ESCALATE_AFTER: Duration = Duration::from_millis(1000);

/// Sets a thread's niceness (root may raise it again).
fn set_nice_of(tid: libc::pid_t, nice: i32) {
    // SAFETY: setpriority changes only the priority of thread `tid`, one of this process's.
    let done = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if done != 0 {
        tracing::debug!(nice, "cannot set the table builder's priority");
    }
}

fn build_loop(shared: &(Mutex<Queue>, Condvar), results: &SyncSender<BuildMsg>, rules: &Mutex<RuleTable>, pieces: bool) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    loop {
        let (job, low) = {
            let mut q = shared.0.lock().unwrap_or_else(|e| e.into_inner());
            q.tid = Some(tid);
            q.busy = false;
            q.building = None;
            q.urgent_since = None;
            loop {
                if q.stop {
                    return;
                }
                if let Some(job) = q.next() {
                    q.busy = true;
                    q.building = Some(job.key.clone());
                    let low = q.at_low_priority(&job);
                    q.urgent_since = (job.urgent && low).then(Instant::now);
                    break (job, low);
                }
                q = shared.1.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // Set for every job: the event loop may have raised the last one.
        set_nice_of(tid, if low { LOW_NICE } else if job.urgent { demanded_nice(&job) } else { 0 });
        let started = Instant::now();
        if pieces && job.image.is_none() {
            let before = lock(rules).len();
            let table = build_in_pieces(&job, results, rules);
            let rules = lock(rules);
            let from_prologues = table.as_ref().map_or(0, |s| s.stats.synthesized_functions);
            let table = table.map(|s| BuiltTable::Pieces { rows: s.rows });
            let built = Built { key: job.key, table, rules: (rules.len() != before).then(|| rules.clone()), elapsed: started.elapsed(), from_prologues };
            drop(rules);
            if results.send(BuildMsg::Done(built)).is_err() {
                return;
            }
            continue;
        }
        let table = parse(&job);
        // Compacted and sent under the rules' lock: each result carries the rules its table
        // refers to, and the results arrive in the order the rules grew.
        let mut rules = lock(rules);
        let before = rules.len();
        let from_prologues = table.as_ref().map_or(0, |t| t.stats.synthesized_functions);
        let table = table.and_then(|t| CompactTable::from_table(t, &mut rules).map_err(|e| e.to_string()));
        let built = Built { key: job.key, table: table.map(BuiltTable::Whole), rules: (rules.len() != before).then(|| rules.clone()), elapsed: started.elapsed(), from_prologues };
        if results.send(BuildMsg::Done(built)).is_err() {
            return;
        }
    }
}

fn lock(rules: &Mutex<RuleTable>) -> std::sync::MutexGuard<'_, RuleTable> {
    rules.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the job's table and sends its rows in pieces, each renumbered into the shared rules
/// before it goes (the rules a piece refers to are in the `Done` that follows it). Returns the
/// summary; an error after some rows were sent tells the event loop to drop them.
fn build_in_pieces(job: &BuildJob, results: &SyncSender<BuildMsg>, rules: &Mutex<RuleTable>) -> Result<TableSummary, String> {
    let mut last = String::from("no process maps the file any more");
    for path in &job.paths {
        let mut sent = false;
        let mut send = |piece: TablePiece<'_>| -> Result<(), UnwindError> {
            let rows = CompactTable::from_piece(&piece, &mut lock(rules)).map_err(|_| UnwindError::RulesFull)?;
            sent = true;
            results
                .send(BuildMsg::Piece { key: job.key.clone(), rows })
                .map_err(|_| UnwindError::Io { path: path.display().to_string(), source: std::io::Error::other("the session ended") })
        };
        match UnwindTable::build_in_pieces(path, PIECE_ROWS, &mut send) {
            Ok(summary) => return Ok(summary),
            Err(e) if !sent => last = e.to_string(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(last)
}

fn parse(job: &BuildJob) -> Result<UnwindTable, String> {
    if let Some(image) = &job.image {
        return UnwindTable::from_elf(image).map_err(|e| e.to_string());
    }
    let mut last = String::from("no process maps the file any more");
    for path in &job.paths {
        match UnwindTable::from_path(path) {
            Ok(table) => return Ok(table),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
