//! The CPython interpreter of each process, for the walker's Python frames.

use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, PythonProcess};
use gpuflame_pyframes::{find_interpreter_with, Interpreter, Mapping, PyError, NEWEST_KNOWN};

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
        if self.pythons.contains_key(&pid) || self.python_warned.contains(&pid) {
            return;
        }
        let maps: Vec<Mapping<'_>> = entries.iter().filter(|e| e.path.starts_with('/')).map(|e| Mapping { start: e.start, end: e.end, offset: e.offset, path: &e.path }).collect();
        // The files are read through map_files: the paths are the process's, which in a container
        // name other files (or none) here.
        let open = |m: &Mapping<'_>| open_map_file(pid, entries, m.start);
        let found = find_interpreter_with(&maps, open, |addr, len| read_process_memory(pid, addr, len as u64));
        match found {
            Ok(Some(interp)) => {
                if self.pythons.get(&pid) == Some(&interp) {
                    return;
                }
                let py = PythonProcess { runtime: interp.runtime_addr, eval_ranges: interp.eval_ranges.clone(), none_addr: interp.none_addr, offsets: interp.offsets };
                match sampler.set_python(pid, &py) {
                    Ok(()) => {
                        tracing::debug!(pid, version = ?interp.version, "Python process");
                        let (major, minor) = interp.version;
                        if interp.version > NEWEST_KNOWN && self.python_newer_named.insert(interp.version) {
                            tracing::info!(pid, "Python {major}.{minor} is newer than gpuflame's tables (up to {}.{}): its frames are read where its _Py_DebugOffsets header shows them", NEWEST_KNOWN.0, NEWEST_KNOWN.1);
                        }
                        self.pythons.insert(pid, interp);
                        self.python_retry.remove(&pid);
                    }
                    Err(e) => tracing::warn!(pid, error = %e, "cannot describe the Python interpreter to the walker"),
                }
            }
            Ok(None) => {}
            // Caught between two mmaps of ld.so: a sign of nothing. Asked again soon, since the
            // process may map nothing more that would have it read again.
            Err(PyError::StillMapping(path)) => {
                let tries = self.python_retry.get(&pid).map_or(0, |&(_, tries)| tries + 1);
                if tries < STILL_MAPPING_TRIES {
                    tracing::debug!(pid, path, tries, "libpython is still being mapped: its interpreter is looked for again");
                    self.python_retry.insert(pid, (Instant::now() + STILL_MAPPING_RETRY * (1 << tries), tries));
                    return;
                }
                self.python_retry.remove(&pid);
                if self.python_warned.insert(pid) {
                    tracing::warn!(pid, "{path}: _PyRuntime's address has not shown the file's data in {tries} tries; the process is profiled without Python frames");
                }
            }
            Err(e) => {
                self.python_retry.remove(&pid);
                if self.python_warned.insert(pid) {
                    tracing::warn!(pid, "{e}; the process is profiled without Python frames");
                }
            }
        }
    }

    /// Looks again for the interpreters of processes caught while their libpython was being
    /// mapped, those whose time has come.
    pub fn retry_pythons(&mut self, sampler: &mut BpfPrograms) {
        let now = Instant::now();
        let due: Vec<u32> = self.python_retry.iter().filter(|(_, &(at, _))| at <= now).map(|(&pid, _)| pid).collect();
        for pid in due {
            match read_maps(pid) {
                Some(maps) => self.find_python(sampler, pid, &maps),
                // Gone: its exit event tidies up the rest.
                None => {
                    self.python_retry.remove(&pid);
                }
            }
        }
    }

    /// How long until a process's interpreter is next looked for again, if one is to be.
    pub fn next_python_retry(&self, now: Instant) -> Option<Duration> {
        self.python_retry.values().map(|&(at, _)| at.saturating_duration_since(now)).min()
    }

    /// The CPython interpreter of a process, also for a while after it exited.
    pub fn python(&self, pid: u32) -> Option<&Interpreter> {
        self.pythons.get(&pid)
    }

    /// Whether a Python interpreter runs in some tracked process.
    pub fn has_python(&self) -> bool {
        !self.pythons.is_empty()
    }
}
