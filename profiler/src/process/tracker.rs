//! Keeps BPF's view of target processes current: their executable mappings, and one unwind table
//! per executable file, shared by every process that maps it, built once, evicted when no process
//! maps it any more.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuflame_bpf::{CpuSampler, ExecMapping, ProcessEvent, ProcessEventKind, PythonProcess, TableId};
use gpuflame_pyframes::{find_interpreter_with, Interpreter, Mapping};
use gpuflame_symbolizer::{MappedFile, ModuleFile};
use gpuflame_unwind::{load_bias, CompactTable, ExecutableKey, LoadSegment, RuleTable, UnwindTable};

use super::maps::{parse_maps, MapsEntry};

/// An executable file known to the tracker.
struct Executable {
    /// None when the file has no usable unwind information (or it did not fit): frame pointers.
    table: Option<TableId>,
    segments: Vec<LoadSegment>,
    users: HashSet<u32>,
}

/// What the tracker did, for the summary and the benchmarks.
#[derive(Debug, Clone, Default)]
pub struct TrackerStats {
    pub tables_built: usize,
    pub rows_loaded: u64,
    pub build_time: Duration,
    pub tables_evicted: usize,
    pub table_failures: usize,
    pub mappings_dropped: usize,
}

#[derive(Default)]
pub struct ProcessTracker {
    rules: RuleTable,
    executables: HashMap<ExecutableKey, Executable>,
    /// (dev, inode) from /proc/PID/maps → key, so known files are not opened again.
    keys_by_inode: HashMap<(String, u64), ExecutableKey>,
    processes: HashMap<u32, Vec<ExecutableKey>>,
    /// Each process's file mappings as last read, for symbolization after it exits; exited
    /// processes stay a while, since their last samples may still be in flight.
    files: HashMap<u32, Vec<MappedFile>>,
    /// The CPython interpreter of each Python process.
    pythons: HashMap<u32, Interpreter>,
    /// Each live process's executable mappings as last read.
    entries: HashMap<u32, Vec<MapsEntry>>,
    python_warned: HashSet<u32>,
    exited: Vec<(Instant, u32)>,
    pub stats: TrackerStats,
}

/// How long the mappings of an exited process are kept for its last samples.
const EXITED_GRACE: Duration = Duration::from_secs(5);

impl ProcessTracker {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn handle(&mut self, sampler: &mut CpuSampler, event: ProcessEvent) {
        match event.kind {
            ProcessEventKind::Exec | ProcessEventKind::Unknown | ProcessEventKind::MmapExec => self.refresh(sampler, event.pid),
            ProcessEventKind::Exit => self.exited(sampler, event.pid),
        }
    }

    /// Reads the process's mappings again and loads what is new. A process that is gone is
    /// forgotten.
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
        let mut mappings = Vec::with_capacity(entries.len());
        let mut keys = Vec::new();
        let mut files = Vec::new();
        for entry in &entries {
            let (table, bias, key) = match self.executable_for(sampler, pid, entry) {
                Some(key) => {
                    let exe = &self.executables[&key];
                    match load_bias(&exe.segments, entry.start, entry.offset) {
                        Some(bias) => (exe.table, bias, Some(key)),
                        None => (None, 0, Some(key)),
                    }
                }
                None => (None, 0, None),
            };
            if let Some(key) = key {
                if entry.path.starts_with('/') {
                    let build_id = match &key {
                        ExecutableKey::BuildId(id) => Some(id.clone()),
                        ExecutableKey::File { .. } => None,
                    };
                    let path = PathBuf::from(entry.path.strip_suffix(" (deleted)").unwrap_or(&entry.path));
                    let file = open_mapped_file(pid, entry);
                    files.push(MappedFile { start: entry.start, end: entry.end, offset: entry.offset, path, build_id, file });
                }
                keys.push(key);
            }
            mappings.push(ExecMapping { begin: entry.start, end: entry.end, load_bias: bias, table });
        }
        match sampler.set_process(pid, &mappings) {
            Ok(0) => {}
            Ok(dropped) => {
                self.stats.mappings_dropped += dropped;
                tracing::warn!(pid, dropped, "process has more executable mappings than the unwinder holds");
            }
            Err(e) => tracing::warn!(pid, error = %e, "cannot load the process's mappings"),
        }
        for key in &keys {
            if let Some(exe) = self.executables.get_mut(key) {
                exe.users.insert(pid);
            }
        }
        self.files.insert(pid, files);
        self.find_python(sampler, pid, &entries);
        self.entries.insert(pid, entries);
        let old = self.processes.insert(pid, keys);
        if let Some(old) = old {
            self.release_unused(sampler, pid, &old);
        }
    }

    /// Forgets a process; evicts tables no other process uses.
    pub fn exited(&mut self, sampler: &mut CpuSampler, pid: u32) {
        sampler.remove_process(pid);
        self.entries.remove(&pid);
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
                if let Some(table) = exe.table {
                    if let Err(e) = sampler.remove_table(table) {
                        tracing::warn!(error = %e, "cannot evict an unwind table");
                    }
                }
                self.executables.remove(key);
                self.keys_by_inode.retain(|_, k| k != key);
                self.stats.tables_evicted += 1;
            }
        }
    }

    /// The executable behind a mapping, its table built and loaded if it is new.
    fn executable_for(&mut self, sampler: &mut CpuSampler, pid: u32, entry: &MapsEntry) -> Option<ExecutableKey> {
        let inode_key = (entry.dev.clone(), entry.inode);
        let vdso = entry.path == "[vdso]";
        if entry.inode == 0 && !vdso {
            return None; // anonymous code (JIT): frame pointers only
        }
        if !vdso {
            if let Some(key) = self.keys_by_inode.get(&inode_key) {
                if self.executables.contains_key(key) {
                    return Some(key.clone());
                }
            }
        }
        // map_files reaches the mapped file even when it was deleted or is in another mount
        // namespace (a container).
        let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end));
        let (key, data) = if vdso {
            let data = read_process_memory(pid, entry.start, entry.end - entry.start)?;
            let table = UnwindTable::from_elf(&data).ok()?;
            // The vDSO is the same image in every process of this kernel.
            (ExecutableKey::File { dev: 0, ino: 0, size: data.len() as u64, mtime_ns: 0 }, Some(table))
        } else {
            (ExecutableKey::of_file(&path).ok()?, None)
        };
        if !vdso {
            self.keys_by_inode.insert(inode_key, key.clone());
        }
        if !self.executables.contains_key(&key) {
            let started = Instant::now();
            let built = match data {
                Some(t) => Ok(t),
                None => UnwindTable::from_path(&path),
            };
            let exe = match built {
                Ok(table) => {
                    let segments = table.segments.clone();
                    let loaded = self.load(sampler, &table);
                    if loaded.is_none() {
                        self.stats.table_failures += 1;
                    }
                    Executable { table: loaded, segments, users: HashSet::new() }
                }
                Err(e) => {
                    tracing::debug!(path = %entry.path, error = %e, "no unwind table");
                    self.stats.table_failures += 1;
                    Executable { table: None, segments: Vec::new(), users: HashSet::new() }
                }
            };
            self.stats.build_time += started.elapsed();
            self.executables.insert(key.clone(), exe);
        }
        Some(key)
    }

    fn load(&mut self, sampler: &mut CpuSampler, table: &UnwindTable) -> Option<TableId> {
        let compact = match CompactTable::new(table, &mut self.rules) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot compact an unwind table");
                return None;
            }
        };
        if let Err(e) = sampler.load_rules(&self.rules) {
            tracing::warn!(error = %e, "cannot load unwind rules");
            return None;
        }
        match sampler.insert_table(&compact) {
            Ok(id) => {
                self.stats.tables_built += 1;
                self.stats.rows_loaded += compact.len() as u64;
                Some(id)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot load an unwind table");
                None
            }
        }
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

fn read_process_memory(pid: u32, addr: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    f.seek(SeekFrom::Start(addr)).ok()?;
    let mut buf = vec![0; usize::try_from(len).ok()?];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The file behind a mapping, opened now while the process lives, for symbolization later.
fn open_mapped_file(pid: u32, entry: &MapsEntry) -> Option<std::sync::Arc<ModuleFile>> {
    match ModuleFile::open_mapping(pid, entry.start, entry.end) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(pid, path = %entry.path, error = %e, "cannot open a mapped file");
            None
        }
    }
}

/// The mapped file that starts at `start`, through /proc/PID/map_files.
fn open_map_file(pid: u32, entries: &[MapsEntry], start: u64) -> Result<fs::File, gpuflame_elfread::OpenError> {
    let entry = entries.iter().find(|e| e.start == start).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    gpuflame_elfread::open_regular(std::path::Path::new(&format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end)))
}
