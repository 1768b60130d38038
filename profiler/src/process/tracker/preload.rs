//! Tables built before a process runs: the files a command started by `record` will map first
//! (its executable, the dynamic loader, the libraries it links) are built and loaded while the
//! command waits to exec, and published by file, so that its stacks are whole from its first
//! sample instead of from the first read of its maps. They stay loaded while the process lives.

use std::path::PathBuf;
use std::time::Duration;

use gpuflame_bpf::BpfPrograms;

use super::{ProcessTracker, TableState};
use crate::process::maps::read_maps;

impl ProcessTracker {
    /// Builds the tables of `paths` for `pid` (a process about to exec them), waiting up to
    /// `timeout`, and keeps them while `pid` lives. Returns how many files have their tables in
    /// (or have none to build).
    pub fn preload(&mut self, sampler: &mut BpfPrograms, pid: u32, paths: &[PathBuf], timeout: Duration) -> usize {
        let mut keys = Vec::new();
        for path in paths {
            let Some((key, _)) = self.file_at(path.clone(), &path.display().to_string()) else { continue };
            // Queued behind others, or left for a sample to ask: the command waits for it now.
            if matches!(self.executables.get(&key).map(|e| e.state), Some(TableState::Unbuilt | TableState::Queued { urgent: false })) {
                self.build_now(key.clone(), true);
            }
            keys.push(key);
        }
        // The vDSO: the same image in every process, gpuflame's own included.
        let own = std::process::id();
        let vdso = read_maps(own).and_then(|maps| maps.into_iter().find(|e| e.path == "[vdso]")).and_then(|entry| self.vdso(own, &entry));
        keys.extend(vdso);
        for key in &keys {
            if let Some(exe) = self.executables.get_mut(key) {
                exe.users.insert(pid);
            }
        }
        self.publish_new_inodes(sampler);
        self.wait_for_tables(sampler, timeout);
        let ready = keys.iter().filter(|k| matches!(self.executables.get(k).map(|e| e.state), Some(TableState::Loaded(_) | TableState::NoTable))).count();
        self.live(pid).pinned = Some(keys);
        ready
    }
}
