//! Keeps BPF's view of target processes current: their executable mappings, and one unwind table
//! per executable file, shared by every process that maps it. Tables are built on threads of
//! their own ([`TableBuilder`]): small files ahead of need, big ones when a sample first needs
//! them; the least recently used are evicted when the memory budget is reached.
//!
//! This file keeps the processes; what a mapping's file is (`executables`), getting tables built
//! and loaded (`tables`), making room for them (`room`), Python (`python`) and when a process is
//! whole (`ready`) are each a file of their own, all of them one `ProcessTracker`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, ExecMapping, MappingTable, PendingTable, ProcessEvent, ProcessEventKind, TableId};
use gpuflame_elfread::FileId;
use gpuflame_pyframes::Interpreter;
use gpuflame_symbolizer::{MappedFile, ModuleFile};
use gpuflame_unwind::{load_bias, ExecutableKey, LoadSegment};

use super::builder::TableBuilder;
use super::maps::{read_maps, MapsEntry};
use super::procfs::open_mapped_file;

mod executables;
mod fork;
mod idle;
mod lazy;
mod preload;
mod published;
mod python;
mod ready;
mod room;
mod stats;
mod tables;
mod tracked;

pub use stats::TrackerStats;
use tracked::{Mapped, Tracked};
pub use tracked::EXITED_GRACE;

/// A table that found no room is not asked for again before this.
const NO_ROOM_RETRY: Duration = Duration::from_secs(10);
/// Tables used this recently are not evicted: they are the working set.
const WORKING_SET: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TableState {
    /// Not built: built when a sample asks.
    Unbuilt,
    Queued { urgent: bool },
    Loaded(TableId),
    /// No unwind information: callers are found by frame pointer or stack scan.
    NoTable,
}

/// An executable file known to the tracker.
struct Executable {
    state: TableState,
    segments: Vec<LoadSegment>,
    cfi_bytes: u64,
    users: HashSet<u32>,
    /// map_files paths that reach the file, for the builder.
    paths: Vec<PathBuf>,
    /// The path as /proc/PID/maps names it, for messages.
    name: String,
    retry_after: Option<Instant>,
}

pub struct ProcessTracker {
    builder: TableBuilder,
    /// Big tables whose pieces are being written into BPF, by file; None: its pieces are dropped
    /// (no room, or a second build of a loaded table).
    in_pieces: HashMap<ExecutableKey, Option<PendingTable>>,
    executables: HashMap<ExecutableKey, Executable>,
    /// (dev, inode) from /proc/PID/maps → key, so known files are not opened again.
    /// Files already probed, by what stat says of them (size and modification time too: an inode
    /// is reused once its file is deleted, and a new library must not get an old table).
    keys_by_inode: HashMap<FileId, ExecutableKey>,
    /// Inodes found for files whose tables were loaded already, to publish (`published`).
    new_inodes: Vec<FileId>,
    /// Every process the tracker knows, live or exited a short while: the one map keyed by pid.
    processes: HashMap<u32, Tracked>,
    /// Loaded tables of files that no process maps any more, kept a while for the next process
    /// that does (`idle`): when they became idle, oldest first.
    idle: VecDeque<(Instant, ExecutableKey)>,
    keep_idle: bool,
    /// Processes with an interpreter in their record.
    pythons: usize,
    /// When Pythons caught half mapped are due to be looked for again (`python.rs`): a schedule,
    /// each entry good while its record still says so.
    python_retries: Vec<(Instant, u32)>,
    /// Pythons newer than the tables, named once each.
    python_newer_named: HashSet<(u8, u8)>,
    /// Exits, oldest first, whose records go once [`EXITED_GRACE`] has passed.
    exited: VecDeque<(Instant, u32)>,
    /// With lazy reads (`lazy.rs`): how long a new program lives before its maps are read.
    read_delay: Option<Duration>,
    /// Programs exec'd, oldest first, to be read when due: each entry good while its record is
    /// still deferred since then.
    deferred: VecDeque<(Instant, u32)>,
    last_lazy_pass: Instant,
    started: Instant,
    pub stats: TrackerStats,
}

impl Default for ProcessTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessTracker {
    pub fn new() -> Self {
        ProcessTracker {
            builder: TableBuilder::start(),
            in_pieces: HashMap::new(),
            executables: HashMap::new(),
            keys_by_inode: HashMap::new(),
            new_inodes: Vec::new(),
            processes: HashMap::new(),
            idle: VecDeque::new(),
            keep_idle: false,
            pythons: 0,
            python_retries: Vec::new(),
            python_newer_named: HashSet::new(),
            exited: VecDeque::new(),
            read_delay: None,
            deferred: VecDeque::new(),
            last_lazy_pass: Instant::now(),
            started: Instant::now(),
            stats: TrackerStats::default(),
        }
    }

    pub fn handle(&mut self, sampler: &mut BpfPrograms, event: ProcessEvent) {
        match event.kind {
            ProcessEventKind::Exec => {
                // A new program: whatever interpreter ran before is gone.
                if let Some(p) = self.processes.get_mut(&event.pid) {
                    p.python_warned = false;
                    p.python_retry = None;
                }
                self.set_python(event.pid, None);
                match self.read_delay {
                    Some(_) => self.defer(sampler, event.pid),
                    None => self.refresh(sampler, event.pid),
                }
            }
            // A program not read yet is read whole when it is due: its libraries with it.
            ProcessEventKind::MmapExec if self.deferred(event.pid) => {}
            ProcessEventKind::Unknown | ProcessEventKind::MmapExec => self.refresh(sampler, event.pid),
            ProcessEventKind::NeedTable { addr } => self.need_table(sampler, event.pid, addr),
            ProcessEventKind::Exit => self.exited(sampler, event.pid),
            ProcessEventKind::Fork { parent } => self.forked(sampler, event.pid, parent),
        }
    }

    /// The record of `pid`, made if there is none, and live: an event of the process is news that
    /// it lives, whoever had the pid before.
    fn live(&mut self, pid: u32) -> &mut Tracked {
        let p = self.processes.entry(pid).or_default();
        p.exited_at = None;
        p
    }

    /// Reads the process's mappings again and describes them to BPF; files not seen before are
    /// queued for their tables. A process that is gone is forgotten.
    pub fn refresh(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.deferred = None;
        }
        self.stats.maps_read += 1;
        // An exiting process has no mappings left to read: what was read before stays, for its
        // last samples.
        let Some(all) = read_maps(pid) else {
            self.exited(sampler, pid);
            return;
        };
        let entries: Vec<MapsEntry> = all.iter().filter(|e| e.executable).cloned().collect();
        let mut keys = Vec::new();
        let mut entry_keys = Vec::with_capacity(entries.len());
        let mut files = Vec::new();
        for entry in &entries {
            // A file out of reach now (the process is exiting, or its files are) keeps what the
            // same mapping read before had: its symbols were lost to such reads 1 run in 5 on a
            // loaded machine. What was read before an exec is no such mapping.
            let mut file_read_before = None;
            let (key, stat) = match self.executable_for(pid, entry) {
                Some((key, stat)) => (Some(key), stat),
                None => (
                    self.read_before(pid, entry).map(|(key, file)| {
                        file_read_before = file;
                        key
                    }),
                    None,
                ),
            };
            if let Some(key) = &key {
                if let Some(file) = file_read_before {
                    files.push(file);
                } else if entry.path.starts_with('/') {
                    let build_id = key.build_id().map(<[u8]>::to_vec);
                    let path = PathBuf::from(entry.path.strip_suffix(" (deleted)").unwrap_or(&entry.path));
                    // Open already for another process (libc for every one): no second stat.
                    let file = stat.as_ref().and_then(ModuleFile::already_open).or_else(|| open_mapped_file(pid, entry));
                    files.push(MappedFile { start: entry.start, end: entry.end, offset: entry.offset, path, build_id, file });
                }
                keys.push(key.clone());
            }
            entry_keys.push(key);
        }
        for key in &keys {
            if let Some(exe) = self.executables.get_mut(key) {
                // A new process changes the shares: a table refused room may get it now.
                if exe.users.insert(pid) {
                    exe.retry_after = None;
                }
            }
        }
        self.publish_new_inodes(sampler);
        let p = self.live(pid);
        p.files = Some(files);
        // Its own mappings from now on, not its parent's copy.
        p.forked_from = None;
        self.find_python(sampler, pid, &all);
        let p = self.live(pid);
        let old = p.mapped.replace(Mapped { keys, entries, entry_keys });
        p.unready = true;
        self.push_process(sampler, pid);
        if let Some(old) = old {
            self.release_unused(sampler, pid, &old.keys);
        }
    }

    /// The key and file of `entry` as the last read of the process's maps found them: the same
    /// range of the same file at the same offset.
    fn read_before(&self, pid: u32, entry: &MapsEntry) -> Option<(ExecutableKey, Option<MappedFile>)> {
        let same = |e: &MapsEntry| (e.start, e.end, e.offset, e.inode, &e.dev) == (entry.start, entry.end, entry.offset, entry.inode, &entry.dev);
        let p = self.processes.get(&pid)?;
        let mapped = p.mapped.as_ref()?;
        let i = mapped.entries.iter().position(same)?;
        let key = mapped.entry_keys.get(i)?.clone()?;
        let file = p.files.as_ref().and_then(|files| files.iter().find(|f| (f.start, f.end) == (entry.start, entry.end)).cloned());
        Some((key, file))
    }

    /// Describes the process's executable mappings to BPF as the tables stand now.
    fn push_process(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        let Some(p) = self.processes.get(&pid) else { return };
        let Some(mapped) = &p.mapped else { return };
        let mappings: Vec<ExecMapping> = mapped
            .entries
            .iter()
            .zip(&mapped.entry_keys)
            .map(|(entry, key)| {
                let exe = key.as_ref().and_then(|k| self.executables.get(k));
                let bias = exe.and_then(|e| load_bias(&e.segments, entry.start, entry.offset));
                let table = match (exe.map(|e| e.state), bias) {
                    (Some(TableState::Loaded(id)), Some(_)) => MappingTable::Loaded(id),
                    (Some(TableState::Unbuilt | TableState::Queued { .. }), Some(_)) => MappingTable::Pending,
                    _ => MappingTable::None,
                };
                ExecMapping { begin: entry.start, end: entry.end, load_bias: bias.unwrap_or(0), table }
            })
            .collect();
        match sampler.set_process(pid, &mappings, p.forked_from) {
            Ok(0) => {}
            Ok(dropped) => {
                self.stats.mappings_dropped += dropped;
                tracing::warn!(pid, dropped, "process has more executable mappings than the unwinder holds");
            }
            Err(e) => tracing::warn!(pid, error = %e, "cannot load the process's mappings"),
        }
    }

    /// The process exited: its tables go where no other process uses them; its files and
    /// interpreter stay [`EXITED_GRACE`] for its last samples, and the records of those that
    /// exited that long ago go.
    pub fn exited(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        let now = Instant::now();
        // A program never read has no entry in BPF: its exec dropped the old one, and nothing
        // described the new one.
        let (mapped, pinned) = match self.processes.get_mut(&pid) {
            Some(p) => {
                match p.deferred.take() {
                    Some(_) => self.stats.reads_saved += 1,
                    None => sampler.remove_process(pid),
                }
                p.unready = false;
                p.forked_from = None;
                p.python_retry = None;
                p.python_warned = false;
                p.exited_at = Some(now);
                self.exited.push_back((now, pid));
                (p.mapped.take(), p.pinned.take())
            }
            None => {
                sampler.remove_process(pid);
                (None, None)
            }
        };
        self.forget_exited(now);
        // The pinned files stay users' until the mapped ones are released: a file in both is
        // released once.
        if let Some(mapped) = mapped {
            self.release(sampler, pid, &mapped.keys, pinned.as_deref().unwrap_or_default());
        }
        if let Some(pinned) = pinned {
            self.release(sampler, pid, &pinned, &[]);
        }
    }

    /// Records of processes that exited [`EXITED_GRACE`] ago go, unless their pid lives again.
    fn forget_exited(&mut self, now: Instant) {
        while let Some(&(at, pid)) = self.exited.front() {
            if now.duration_since(at) < EXITED_GRACE {
                break;
            }
            self.exited.pop_front();
            if self.processes.get(&pid).is_some_and(|p| p.forgettable(at)) {
                self.set_python(pid, None);
                self.processes.remove(&pid);
            }
        }
    }

    /// Sets or clears the interpreter of `pid`'s record, keeping the count of Pythons.
    fn set_python(&mut self, pid: u32, interp: Option<Interpreter>) {
        let Some(p) = self.processes.get_mut(&pid) else { return };
        let had = p.python.is_some();
        p.python = interp;
        self.pythons = self.pythons + usize::from(p.python.is_some()) - usize::from(had);
    }

    /// `pid` no longer maps the files of `keys` (it re-read its maps, exec'd or exited).
    fn release_unused(&mut self, sampler: &mut BpfPrograms, pid: u32, keys: &[ExecutableKey]) {
        let still: Vec<ExecutableKey> = match self.processes.get(&pid) {
            Some(p) => p.mapped.iter().flat_map(|m| &m.keys).chain(p.pinned.iter().flatten()).cloned().collect(),
            None => Vec::new(),
        };
        self.release(sampler, pid, keys, &still);
    }

    /// Drops `pid` from the users of the files of `keys` but those in `still`; a file that no
    /// process uses any more goes idle or goes.
    fn release(&mut self, sampler: &mut BpfPrograms, pid: u32, keys: &[ExecutableKey], still: &[ExecutableKey]) {
        let still: HashSet<&ExecutableKey> = still.iter().collect();
        for key in keys {
            if still.contains(key) {
                continue;
            }
            let Some(exe) = self.executables.get_mut(key) else { continue };
            exe.users.remove(&pid);
            if !exe.users.is_empty() {
                continue;
            }
            if self.keep_idle && matches!(exe.state, TableState::Loaded(_)) {
                self.idle.push_back((Instant::now(), key.clone()));
                self.expire_idle(sampler);
                continue;
            }
            self.drop_table(sampler, key);
        }
    }

    /// Forgets a file that no process maps, and takes its table out of BPF.
    fn drop_table(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey) {
        if self.unload(sampler, key) {
            self.stats.tables_evicted += 1;
        }
        self.executables.remove(key);
        self.keys_by_inode.retain(|_, k| k != key);
    }

    /// Takes the file's table out of BPF, published copy first, if it is loaded.
    fn unload(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey) -> bool {
        let Some(TableState::Loaded(id)) = self.executables.get(key).map(|e| e.state) else { return false };
        self.unpublish(sampler, key);
        if let Err(e) = sampler.remove_table(id) {
            tracing::warn!(error = %e, "cannot evict an unwind table");
        }
        true
    }

    /// Loads every process that runs now (whole-machine recordings).
    pub fn refresh_all(&mut self, sampler: &mut BpfPrograms) {
        let Ok(dir) = fs::read_dir("/proc") else { return };
        for entry in dir.flatten() {
            if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                self.refresh(sampler, pid);
            }
        }
    }

    /// The file mappings of a process (sorted by start), also for a while after it exited.
    pub fn files(&self, pid: u32) -> Option<&[MappedFile]> {
        self.processes.get(&pid)?.files.as_deref()
    }

    /// The executable mappings of a live process, as last read.
    pub fn exec_entries(&self, pid: u32) -> Option<&[MapsEntry]> {
        Some(&self.processes.get(&pid)?.mapped.as_ref()?.entries)
    }

    /// The processes whose mappings are loaded.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().filter(|(_, p)| p.mapped.is_some()).map(|(&pid, _)| pid).collect()
    }

    /// How many processes have their mappings loaded.
    pub fn processes(&self) -> usize {
        self.processes.values().filter(|p| p.mapped.is_some()).count()
    }
}
