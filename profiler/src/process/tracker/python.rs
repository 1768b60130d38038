//! The CPython interpreter of each process, for the walker's Python frames.

use gpuflame_bpf::{BpfPrograms, PythonProcess};
use gpuflame_pyframes::{find_interpreter_with, Interpreter, Mapping, NEWEST_KNOWN};

use super::ProcessTracker;
use crate::process::maps::MapsEntry;
use crate::process::procfs::{open_map_file, read_process_memory};

impl ProcessTracker {
    /// Finds CPython in the process and tells the walker; a Python it cannot support is profiled
    /// natively, with one warning.
    pub(super) fn find_python(&mut self, sampler: &mut BpfPrograms, pid: u32, entries: &[MapsEntry]) {
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
                let py = PythonProcess { runtime: interp.runtime_addr, eval_ranges: interp.eval_ranges.clone(), none_addr: interp.none_addr, offsets: interp.offsets };
                match sampler.set_python(pid, &py) {
                    Ok(()) => {
                        tracing::debug!(pid, version = ?interp.version, "Python process");
                        let (major, minor) = interp.version;
                        if interp.version > NEWEST_KNOWN && self.python_newer_named.insert(interp.version) {
                            tracing::info!(pid, "Python {major}.{minor} is newer than gpuflame's tables (up to {}.{}): its frames are read where its _Py_DebugOffsets header shows them", NEWEST_KNOWN.0, NEWEST_KNOWN.1);
                        }
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
}
