//! Keeps BPF's view of target processes current: their executable mappings, and one unwind table
//! per executable file, shared by every process that maps it. Tables are built on threads of
//! their own ([`TableBuilder`]): small files ahead of need, big ones when a sample first needs
//! them; the least recently used are evicted when the memory budget is reached.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuflame_bpf::{CpuSampler, ExecMapping, MappingTable, ProcessEvent, ProcessEventKind, PythonProcess, TableId};
use gpuflame_elfread::FileId;
use gpuflame_pyframes::{find_interpreter_with, Interpreter, Mapping};
use gpuflame_symbolizer::MappedFile;
use gpuflame_unwind::{load_bias, ElfProbe, ExecutableKey, LoadSegment};

use super::builder::{BuildJob, Built, TableBuilder};
use super::maps::{parse_maps, MapsEntry};
use super::procfs::{open_map_file, open_mapped_file, read_process_memory};

mod ready;
mod room;

/// Files with at most this much CFI are built as soon as they are seen (~150k rows, ~10 ms: libc,
/// libstdc++, libpython, a distribution's python executable); bigger ones (OpenBLAS 1.5 MiB,
/// libtorch_cpu.so 17 MiB) only when a sample needs them, which keeps the builder's CPU off a
/// `torch` import that maps 71 files.
const EAGER_CFI_BYTES: u64 = 1 << 20;
/// A table that found no room is not asked for again before this.
const NO_ROOM_RETRY: Duration = Duration::from_secs(10);
/// Tables used this recently are not evicted: they are the working set.
const WORKING_SET: Duration = Duration::from_secs(2);
/// Paths kept per file for the builder: one per process that maps it, the latest first.
const PATHS_PER_FILE: usize = 4;

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

/// What the tracker did, for the summary and the benchmarks.
#[derive(Debug, Clone, Default)]
pub struct TrackerStats {
    pub tables_built: usize,
    pub rows_loaded: u64,
    pub build_time: Duration,
    /// Tables dropped because no process maps their file any more.
    pub tables_evicted: usize,
    /// Tables dropped to make room within the memory budget.
    pub tables_evicted_for_room: usize,
    pub table_failures: usize,
    pub mappings_dropped: usize,
    /// Files without unwind information.
    pub files_without_cfi: usize,
    /// Files whose tables did not fit in the budget, by name.
    pub no_room: BTreeSet<String>,
    /// When the first table a sample asked for was loaded, after the tracker started.
    pub first_demanded_table: Option<Duration>,
}

pub struct ProcessTracker {
    builder: TableBuilder,
    executables: HashMap<ExecutableKey, Executable>,
    /// (dev, inode) from /proc/PID/maps → key, so known files are not opened again.
    /// Files already probed, by what stat says of them (size and modification time too: an inode
    /// is reused once its file is deleted, and a new library must not get an old table).
    keys_by_inode: HashMap<FileId, ExecutableKey>,
    processes: HashMap<u32, Vec<ExecutableKey>>,
    /// Each process's file mappings as last read, for symbolization after it exits; exited
    /// processes stay a while, since their last samples may still be in flight.
    files: HashMap<u32, Vec<MappedFile>>,
    /// The CPython interpreter of each Python process.
    pythons: HashMap<u32, Interpreter>,
    /// Each live process's executable mappings as last read, with the file each one maps.
    entries: HashMap<u32, Vec<MapsEntry>>,
    entry_keys: HashMap<u32, Vec<Option<ExecutableKey>>>,
    python_warned: HashSet<u32>,
    /// Processes whose mappings were read since their tables were last all in ([`Self::take_ready`]).
    unready: HashSet<u32>,
    exited: Vec<(Instant, u32)>,
    started: Instant,
    pub stats: TrackerStats,
}

impl Default for ProcessTracker {
    fn default() -> Self {
        Self::new()
    }
}

/// How long the mappings of an exited process are kept for its last samples.
const EXITED_GRACE: Duration = Duration::from_secs(5);

impl ProcessTracker {
    /// See [`TableBuilder::demand_at_low_priority`].
    pub fn demand_tables_at_low_priority(&self, low: bool) {
        self.builder.demand_at_low_priority(low);
    }

    pub fn new() -> Self {
        ProcessTracker {
            builder: TableBuilder::start(),
            executables: HashMap::new(),
            keys_by_inode: HashMap::new(),
            processes: HashMap::new(),
            files: HashMap::new(),
            pythons: HashMap::new(),
            entries: HashMap::new(),
            entry_keys: HashMap::new(),
            python_warned: HashSet::new(),
            unready: HashSet::new(),
            exited: Vec::new(),
            started: Instant::now(),
            stats: TrackerStats::default(),
        }
    }

    pub fn handle(&mut self, sampler: &mut CpuSampler, event: ProcessEvent) {
        match event.kind {
            ProcessEventKind::Exec => {
                // A new program: whatever interpreter ran before is gone.
                self.pythons.remove(&event.pid);
                self.python_warned.remove(&event.pid);
                self.refresh(sampler, event.pid)
            }
            ProcessEventKind::Unknown | ProcessEventKind::MmapExec => self.refresh(sampler, event.pid),
            ProcessEventKind::NeedTable { addr } => self.need_table(sampler, event.pid, addr),
            ProcessEventKind::Exit => self.exited(sampler, event.pid),
        }
    }

    /// Reads the process's mappings again and describes them to BPF; files not seen before are
    /// queued for their tables. A process that is gone is forgotten.
    pub fn refresh(&mut self, sampler: &mut CpuSampler, pid: u32) {
        // An exiting process has no mappings left to read: what was read before stays, for its
        // last samples.
        let text = match fs::read_to_string(format!("/proc/{pid}/maps")) {
            Ok(t) if !t.trim().is_empty() => t,
            _ => {
                self.exited(sampler, pid);
                return;
            }
        };
        let entries: Vec<MapsEntry> = parse_maps(&text).into_iter().filter(|e| e.executable).collect();
        let mut keys = Vec::new();
        let mut entry_keys = Vec::with_capacity(entries.len());
        let mut files = Vec::new();
        for entry in &entries {
            // A file out of reach now (the process is exiting, or its files are) keeps what the
            // same mapping read before had: its symbols were lost to such reads 1 run in 5 on a
            // loaded machine. What was read before an exec is no such mapping.
            let mut file_read_before = None;
            let key = self.executable_for(pid, entry).or_else(|| {
                let (key, file) = self.read_before(pid, entry)?;
                file_read_before = file;
                Some(key)
            });
            if let Some(key) = &key {
                if let Some(file) = file_read_before {
                    files.push(file);
                } else if entry.path.starts_with('/') {
                    let build_id = key.build_id().map(<[u8]>::to_vec);
                    let path = PathBuf::from(entry.path.strip_suffix(" (deleted)").unwrap_or(&entry.path));
                    let file = open_mapped_file(pid, entry);
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
        self.files.insert(pid, files);
        self.find_python(sampler, pid, &entries);
        self.entries.insert(pid, entries);
        self.entry_keys.insert(pid, entry_keys);
        self.unready.insert(pid);
        self.push_process(sampler, pid);
        let old = self.processes.insert(pid, keys);
        if let Some(old) = old {
            self.release_unused(sampler, pid, &old);
        }
    }

    /// The key and file of `entry` as the last read of the process's maps found them: the same
    /// range of the same file at the same offset.
    fn read_before(&self, pid: u32, entry: &MapsEntry) -> Option<(ExecutableKey, Option<MappedFile>)> {
        let same = |e: &MapsEntry| (e.start, e.end, e.offset, e.inode, &e.dev) == (entry.start, entry.end, entry.offset, entry.inode, &entry.dev);
        let i = self.entries.get(&pid)?.iter().position(same)?;
        let key = self.entry_keys.get(&pid)?.get(i)?.clone()?;
        let file = self.files.get(&pid).and_then(|files| files.iter().find(|f| (f.start, f.end) == (entry.start, entry.end)).cloned());
        Some((key, file))
    }

    /// Describes the process's executable mappings to BPF as the tables stand now.
    fn push_process(&mut self, sampler: &mut CpuSampler, pid: u32) {
        let (Some(entries), Some(keys)) = (self.entries.get(&pid), self.entry_keys.get(&pid)) else { return };
        let mappings: Vec<ExecMapping> = entries
            .iter()
            .zip(keys)
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
        match sampler.set_process(pid, &mappings) {
            Ok(0) => {}
            Ok(dropped) => {
                self.stats.mappings_dropped += dropped;
                tracing::warn!(pid, dropped, "process has more executable mappings than the unwinder holds");
            }
            Err(e) => tracing::warn!(pid, error = %e, "cannot load the process's mappings"),
        }
    }

    /// A sample of `pid` met the file mapped at `addr` without its table.
    fn need_table(&mut self, sampler: &mut CpuSampler, pid: u32, addr: u64) {
        let find = |t: &Self| -> Option<ExecutableKey> {
            let i = t.entries.get(&pid)?.iter().position(|e| e.start <= addr && addr < e.end)?;
            t.entry_keys.get(&pid)?.get(i)?.clone()
        };
        let key = match find(self) {
            Some(k) => k,
            None => {
                self.refresh(sampler, pid);
                let Some(k) = find(self) else { return };
                k
            }
        };
        let Some(exe) = self.executables.get_mut(&key) else { return };
        if exe.retry_after.is_some_and(|t| Instant::now() < t) {
            return;
        }
        match exe.state {
            TableState::Unbuilt | TableState::Queued { urgent: false } => self.build_now(key),
            TableState::Queued { urgent: true } => {}
            // BPF's copy of the process is older than the table: tell it again.
            TableState::Loaded { .. } | TableState::NoTable => self.push_process(sampler, pid),
        }
    }

    /// Reads the process's mappings now and has the tables still queued for it built next, at
    /// normal priority: it waits for them (see [`Self::tables_settled`]).
    pub fn hurry(&mut self, sampler: &mut CpuSampler, pid: u32) {
        self.refresh(sampler, pid);
        self.build_soon(pid);
    }

    /// Has the tables queued for the process built next, at normal priority, rather than in the
    /// background at low priority: for a process whose every hooked CUDA call is a record of its
    /// own (an allocation, a launch), not a sample, and lost without a stack. Under load, a
    /// background build of libc took longer than a short CUDA program lived.
    pub fn build_soon(&mut self, pid: u32) {
        let keys = self.processes.get(&pid).cloned().unwrap_or_default();
        for key in keys {
            if self.executables.get(&key).is_some_and(|exe| exe.state == (TableState::Queued { urgent: false })) {
                self.build_now(key);
            }
        }
    }

    /// Queues the file's table ahead of the background builds, at normal priority.
    fn build_now(&mut self, key: ExecutableKey) {
        let Some(exe) = self.executables.get_mut(&key) else { return };
        exe.state = TableState::Queued { urgent: true };
        tracing::debug!(file = %exe.name, cfi_bytes = exe.cfi_bytes, "unwind table asked for by a sample");
        self.builder.urgent(BuildJob { key, paths: exe.paths.clone(), cfi_bytes: exe.cfi_bytes, image: None, urgent: true, startup: false });
    }

    /// Whether no table of the process's files waits to be built. Files big enough to be built
    /// only on demand do not count: their tables come when a stack first needs them.
    pub fn tables_settled(&self, pid: u32) -> bool {
        let queued = |k: &ExecutableKey| matches!(self.executables.get(k).map(|e| e.state), Some(TableState::Queued { .. }));
        self.processes.get(&pid).is_none_or(|keys| !keys.iter().any(queued))
    }

    /// Loads the tables built since the last call and tells the processes that map them.
    pub fn poll_tables(&mut self, sampler: &mut CpuSampler) {
        for built in self.builder.finished() {
            self.loaded(sampler, built);
        }
    }

    /// Whether tables are being built.
    pub fn building(&self) -> bool {
        self.builder.busy()
    }

    /// Waits up to `timeout` for the tables queued so far, loading each as it comes.
    pub fn wait_for_tables(&mut self, sampler: &mut CpuSampler, timeout: Duration) {
        self.builder.promote_all();
        let deadline = Instant::now() + timeout;
        while self.builder.busy() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // Short waits: the builder may have just finished, with nothing more to send.
            if let Some(built) = self.builder.wait(left.min(Duration::from_millis(5))) {
                self.loaded(sampler, built);
            }
        }
        self.poll_tables(sampler);
    }

    fn loaded(&mut self, sampler: &mut CpuSampler, built: Built) {
        if let Some(rules) = &built.rules {
            if let Err(e) = sampler.load_rules(rules) {
                tracing::warn!(error = %e, "cannot load unwind rules");
            }
        }
        self.stats.build_time += built.elapsed;
        let Some(exe) = self.executables.get(&built.key) else { return };
        let urgent = exe.state == TableState::Queued { urgent: true };
        let state = match built.table {
            Ok(table) if table.is_empty() => {
                self.stats.files_without_cfi += 1;
                TableState::NoTable
            }
            Ok(table) => match self.insert(sampler, &built.key, &table, urgent) {
                Some(id) => {
                    self.stats.tables_built += 1;
                    self.stats.rows_loaded += table.len() as u64;
                    if urgent && self.stats.first_demanded_table.is_none() {
                        self.stats.first_demanded_table = Some(self.started.elapsed());
                    }
                    tracing::debug!(file = %self.executables[&built.key].name, rows = table.len(), ms = built.elapsed.as_millis() as u64, urgent, "unwind table loaded");
                    TableState::Loaded(id)
                }
                None => TableState::Unbuilt,
            },
            Err(e) => {
                tracing::debug!(file = %exe.name, error = %e, "no unwind table");
                self.stats.table_failures += 1;
                TableState::NoTable
            }
        };
        let Some(exe) = self.executables.get_mut(&built.key) else { return };
        exe.state = state;
        let users: Vec<u32> = exe.users.iter().copied().collect();
        for pid in users {
            self.push_process(sampler, pid);
        }
    }

    /// Forgets a process; evicts tables no other process uses.
    pub fn exited(&mut self, sampler: &mut CpuSampler, pid: u32) {
        sampler.remove_process(pid);
        self.unready.remove(&pid);
        self.entries.remove(&pid);
        self.entry_keys.remove(&pid);
        let now = Instant::now();
        self.exited.push((now, pid));
        while let Some(&(t, old)) = self.exited.first() {
            if now.duration_since(t) < EXITED_GRACE {
                break;
            }
            self.exited.remove(0);
            if !self.processes.contains_key(&old) {
                self.files.remove(&old);
                self.pythons.remove(&old);
            }
        }
        if let Some(keys) = self.processes.remove(&pid) {
            self.release_unused(sampler, pid, &keys);
        }
    }

    fn release_unused(&mut self, sampler: &mut CpuSampler, pid: u32, keys: &[ExecutableKey]) {
        let still: HashSet<&ExecutableKey> = self.processes.get(&pid).map(|k| k.iter().collect()).unwrap_or_default();
        for key in keys {
            if still.contains(key) {
                continue;
            }
            let Some(exe) = self.executables.get_mut(key) else { continue };
            exe.users.remove(&pid);
            if exe.users.is_empty() {
                if let TableState::Loaded(id) = exe.state {
                    if let Err(e) = sampler.remove_table(id) {
                        tracing::warn!(error = %e, "cannot evict an unwind table");
                    }
                    self.stats.tables_evicted += 1;
                }
                self.executables.remove(key);
                self.keys_by_inode.retain(|_, k| k != key);
            }
        }
    }

    /// The executable behind a mapping: known, or probed now and queued for its table.
    fn executable_for(&mut self, pid: u32, entry: &MapsEntry) -> Option<ExecutableKey> {
        let vdso = entry.path == "[vdso]";
        if entry.inode == 0 && !vdso {
            return None; // anonymous code (JIT): frame pointers and stack scans only
        }
        // map_files reaches the mapped file even when it was deleted or is in another mount
        // namespace (a container).
        let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end));
        if vdso {
            return self.vdso(pid, entry);
        }
        let inode_key = match std::fs::metadata(&path) {
            Ok(m) => FileId::from(&m),
            Err(e) => {
                tracing::debug!(path = %entry.path, error = %e, "cannot stat the mapped file");
                return None;
            }
        };
        if let Some(key) = self.keys_by_inode.get(&inode_key).cloned() {
            if let Some(exe) = self.executables.get_mut(&key) {
                if !exe.paths.contains(&path) {
                    exe.paths.insert(0, path);
                    exe.paths.truncate(PATHS_PER_FILE);
                }
                return Some(key);
            }
        }
        let probe = match ElfProbe::of_file(&path) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(path = %entry.path, error = %e, "cannot read the mapped file");
                return None;
            }
        };
        let key = probe.key.clone();
        self.keys_by_inode.insert(inode_key, key.clone());
        if let Some(exe) = self.executables.get_mut(&key) {
            if !exe.paths.contains(&path) {
                exe.paths.insert(0, path);
                exe.paths.truncate(PATHS_PER_FILE);
            }
            return Some(key);
        }
        let state = if probe.cfi_bytes == 0 {
            self.stats.files_without_cfi += 1;
            TableState::NoTable
        } else if probe.cfi_bytes <= EAGER_CFI_BYTES {
            self.builder.background(BuildJob { key: key.clone(), paths: vec![path.clone()], cfi_bytes: probe.cfi_bytes, image: None, urgent: false, startup: false });
            TableState::Queued { urgent: false }
        } else {
            TableState::Unbuilt
        };
        let exe = Executable {
            state,
            segments: probe.segments,
            cfi_bytes: probe.cfi_bytes,
            users: HashSet::new(),
            paths: vec![path],
            name: entry.path.clone(),
            retry_after: None,
        };
        self.executables.insert(key.clone(), exe);
        Some(key)
    }

    /// The vDSO exists only in memory: its table is built from the process's copy, once.
    fn vdso(&mut self, pid: u32, entry: &MapsEntry) -> Option<ExecutableKey> {
        let data = read_process_memory(pid, entry.start, entry.end - entry.start)?;
        // The vDSO is the same image in every process of this kernel.
        let key = ExecutableKey::File { dev: 0, ino: 0, size: data.len() as u64, mtime_ns: 0 };
        if self.executables.contains_key(&key) {
            return Some(key);
        }
        let segments = ElfProbe::segments_of(&data).unwrap_or_default();
        self.builder.background(BuildJob { key: key.clone(), paths: Vec::new(), cfi_bytes: 0, image: Some(data), urgent: false, startup: false });
        let exe = Executable {
            state: TableState::Queued { urgent: false },
            segments,
            cfi_bytes: 0,
            users: HashSet::new(),
            paths: Vec::new(),
            name: entry.path.clone(),
            retry_after: None,
        };
        self.executables.insert(key.clone(), exe);
        Some(key)
    }

    /// Loads every process that runs now (whole-machine recordings).
    pub fn refresh_all(&mut self, sampler: &mut CpuSampler) {
        let Ok(dir) = fs::read_dir("/proc") else { return };
        for entry in dir.flatten() {
            if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                self.refresh(sampler, pid);
            }
        }
    }

    /// Finds CPython in the process and tells the walker; a Python it cannot support is profiled
    /// natively, with one warning.
    fn find_python(&mut self, sampler: &mut CpuSampler, pid: u32, entries: &[MapsEntry]) {
        // Found once per program: an import maps hundreds of extensions, each a refresh, and
        // finding the interpreter reads megabytes of symbols.
        if self.pythons.contains_key(&pid) || self.python_warned.contains(&pid) {
            return;
        }
        let maps: Vec<Mapping<'_>> = entries.iter().filter(|e| e.path.starts_with('/')).map(|e| Mapping { start: e.start, offset: e.offset, path: &e.path }).collect();
        // The files are read through map_files: the paths are the process's, which in a container
        // name other files (or none) here.
        let open = |m: &Mapping<'_>| open_map_file(pid, entries, m.start);
        let found = find_interpreter_with(&maps, open, |addr, len| read_process_memory(pid, addr, len as u64));
        match found {
            Ok(Some(interp)) => {
                if self.pythons.get(&pid) == Some(&interp) {
                    return;
                }
                let py = PythonProcess { runtime: interp.runtime_addr, eval_ranges: interp.eval_ranges.clone(), offsets: interp.offsets };
                match sampler.set_python(pid, &py) {
                    Ok(()) => {
                        tracing::debug!(pid, version = ?interp.version, "Python process");
                        self.pythons.insert(pid, interp);
                    }
                    Err(e) => tracing::warn!(pid, error = %e, "cannot describe the Python interpreter to the walker"),
                }
            }
            Ok(None) => {}
            Err(e) => {
                if self.python_warned.insert(pid) {
                    tracing::warn!(pid, "{e}; the process is profiled without Python frames");
                }
            }
        }
    }

    /// The CPython interpreter of a process, also for a while after it exited.
    pub fn python(&self, pid: u32) -> Option<&Interpreter> {
        self.pythons.get(&pid)
    }

    /// Whether a Python interpreter runs in some tracked process.
    pub fn has_python(&self) -> bool {
        !self.pythons.is_empty()
    }

    /// The file mappings of a process (sorted by start), also for a while after it exited.
    pub fn files(&self, pid: u32) -> Option<&[MappedFile]> {
        self.files.get(&pid).map(Vec::as_slice)
    }

    /// The executable mappings of a live process, as last read.
    pub fn exec_entries(&self, pid: u32) -> Option<&[MapsEntry]> {
        self.entries.get(&pid).map(Vec::as_slice)
    }

    /// The processes whose mappings are loaded.
    pub fn pids(&self) -> Vec<u32> {
        self.entries.keys().copied().collect()
    }

    pub fn processes(&self) -> usize {
        self.processes.len()
    }
}
