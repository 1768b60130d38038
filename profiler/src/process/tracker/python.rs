//! The CPython interpreter of each process, for the walker's Python frames.

use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, PythonProcess};
use gpuflame_pyframes::{find_interpreter_with, Interpreter, Mapping, PyError};

use super::ProcessTracker;
use crate::process::maps::{read_maps, MapsEntry};
use crate::process::procfs::{open_map_file, read_process_memory};

/// A Python whose libpython was caught half mapped is asked again this long after, doubling.
const STILL_MAPPING_RETRY: Duration = Duration::from_millis(5);
/// Tries before it is given up on (about 1.3 s of waiting in all).
const STILL_MAPPING_TRIES: u32 = 8;

impl ProcessTracker {
    /// Finds CPython in the process and tells the walker; a Python it cannot support is profiled
    /// natively, with one warning. `entries` are all of the process's mappings, not only code.
    pub(super) fn find_python(&mut self, sampler: &mut BpfPrograms, pid: u32, entries: &[MapsEntry]) {
        // Found once per program: an import maps hundreds of extensions, each a refresh, and
        // finding the interpreter reads megabytes of symbols.
        if self.processes.get(&pid).is_some_and(|p| p.python.is_some() || p.python_warned) {
            return;
        }
        let maps: Vec<Mapping<'_>> = entries.iter().filter(|e| e.path.starts_with('/')).map(|e| Mapping { start: e.start, end: e.end, offset: e.offset, path: &e.path }).collect();
        // The files are read through map_files: the paths are the process's, which in a container
        // name other files (or none) here.
        let open = |m: &Mapping<'_>| open_map_file(pid, entries, m.start);
        let found = find_interpreter_with(&maps, open, |addr, len| read_process_memory(pid, addr, len as u64));
        match found {
            Ok(Some(interp)) => {
                let py = PythonProcess { runtime: interp.runtime_addr, eval_ranges: interp.eval_ranges.clone(), none_addr: interp.none_addr, offsets: interp.offsets };
                match sampler.set_python(pid, &py) {
                    Ok(()) => {
                        tracing::debug!(pid, version = ?interp.version, "Python process");
                        let (major, minor) = interp.version;
                        // Said once per version.
                        if let Some((known_major, known_minor)) = interp.past_known_layouts() {
                            if self.python_newer_named.insert(interp.version) {
                                tracing::info!(pid, "Python {major}.{minor} is newer than gpuflame's tables (up to {known_major}.{known_minor}): its frames are read where its _Py_DebugOffsets header shows them");
                            }
                        }
                        self.set_python(pid, Some(interp));
                        if let Some(p) = self.processes.get_mut(&pid) {
                            p.python_retry = None;
                        }
                    }
                    Err(e) => tracing::warn!(pid, error = %e, "cannot describe the Python interpreter to the walker"),
                }
            }
            Ok(None) => {}
            // Caught between two mmaps of ld.so: a sign of nothing. Asked again soon, since the
            // process may map nothing more that would have it read again.
            Err(PyError::StillMapping(path)) => {
                let Some(p) = self.processes.get_mut(&pid) else { return };
                let tries = p.python_retry.map_or(0, |(_, tries)| tries + 1);
                if tries < STILL_MAPPING_TRIES {
                    tracing::debug!(pid, path, tries, "libpython is still being mapped: its interpreter is looked for again");
                    let at = Instant::now() + STILL_MAPPING_RETRY * (1 << tries);
                    p.python_retry = Some((at, tries));
                    self.python_retries.push((at, pid));
                    return;
                }
                p.python_retry = None;
                if !std::mem::replace(&mut p.python_warned, true) {
                    tracing::warn!(pid, "{path}: _PyRuntime's address has not shown the file's data in {tries} tries; the process is profiled without Python frames");
                }
            }
            Err(e) => {
                let Some(p) = self.processes.get_mut(&pid) else { return };
                p.python_retry = None;
                if !std::mem::replace(&mut p.python_warned, true) {
                    tracing::warn!(pid, "{e}; the process is profiled without Python frames");
                }
            }
        }
    }

    /// Looks again for the interpreters of processes caught while their libpython was being
    /// mapped, those whose time has come.
    pub fn retry_pythons(&mut self, sampler: &mut BpfPrograms) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.python_retries.iter().partition(|&&(at, _)| at <= now);
        self.python_retries = later;
        for (at, pid) in due {
            // Found since, exec'd, exited, or due again later: not this entry's to do.
            if self.processes.get(&pid).and_then(|p| p.python_retry).is_none_or(|(when, _)| when != at) {
                continue;
            }
            match read_maps(pid) {
                Some(maps) => self.find_python(sampler, pid, &maps),
                // Gone: its exit event tidies up the rest.
                None => {
                    if let Some(p) = self.processes.get_mut(&pid) {
                        p.python_retry = None;
                    }
                }
            }
        }
    }

    /// How long until a process's interpreter is next looked for again, if one is to be.
    pub fn next_python_retry(&self, now: Instant) -> Option<Duration> {
        self.python_retries.iter().map(|&(at, _)| at.saturating_duration_since(now)).min()
    }

    /// The CPython interpreter of a process, also for a while after it exited.
    pub fn python(&self, pid: u32) -> Option<&Interpreter> {
        self.processes.get(&pid)?.python.as_ref()
    }

    /// Whether a Python interpreter runs in some tracked process.
    pub fn has_python(&self) -> bool {
        self.pythons > 0
    }
}
