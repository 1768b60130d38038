//! Tables built before a process runs: the files a command started by `record` will map first
//! (its executable, the dynamic loader, the libraries it links) are built and loaded while the
//! command waits to exec, and published by file, so that its stacks are whole from its first
//! sample instead of from the first read of its maps. They stay loaded while the process lives.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use gpuflame_bpf::CpuSampler;
use gpuflame_elfread::FileId;
use gpuflame_unwind::{ElfProbe, ExecutableKey};

use super::{Executable, ProcessTracker, TableState};
use crate::process::maps::parse_maps;
use crate::process::builder::BuildJob;

impl ProcessTracker {
    /// Builds the tables of `paths` for `pid` (a process about to exec them), waiting up to
    /// `timeout`, and keeps them while `pid` lives. Returns how many files have their tables in
    /// (or have none to build).
    pub fn preload(&mut self, sampler: &mut CpuSampler, pid: u32, paths: &[PathBuf], timeout: Duration) -> usize {
        let mut keys = Vec::new();
        for path in paths {
            if let Some(key) = self.preload_file(path) {
                if let Some(exe) = self.executables.get_mut(&key) {
                    exe.users.insert(pid);
                }
                keys.push(key);
            }
        }
        // The vDSO: the same image in every process, gpuflame's own included.
        let own = std::process::id();
        let vdso = std::fs::read_to_string("/proc/self/maps")
            .ok()
            .and_then(|text| parse_maps(&text).into_iter().find(|e| e.path == "[vdso]"))
            .and_then(|entry| self.vdso(own, &entry));
        if let Some(key) = vdso {
            if let Some(exe) = self.executables.get_mut(&key) {
                exe.users.insert(pid);
            }
            keys.push(key);
        }
        self.publish_new_inodes(sampler);
        self.wait_for_tables(sampler, timeout);
        let ready = keys.iter().filter(|k| matches!(self.executables.get(k).map(|e| e.state), Some(TableState::Loaded(_) | TableState::NoTable))).count();
        self.pinned.insert(pid, keys);
        ready
    }

    /// The key of the file at `path`, known or probed and queued now at normal priority.
    fn preload_file(&mut self, path: &PathBuf) -> Option<ExecutableKey> {
        let inode = match std::fs::metadata(path) {
            Ok(m) => FileId::from(&m),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot stat a file of the command");
                return None;
            }
        };
        if let Some(key) = self.keys_by_inode.get(&inode).filter(|k| self.executables.contains_key(*k)) {
            return Some(key.clone());
        }
        let probe = match ElfProbe::of_file(path) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot read a file of the command");
                return None;
            }
        };
        let key = probe.key.clone();
        self.keys_by_inode.insert(inode, key.clone());
        if self.executables.contains_key(&key) {
            self.new_inodes.push(inode);
            return Some(key);
        }
        let state = if probe.cfi_bytes == 0 {
            self.stats.files_without_cfi += 1;
            TableState::NoTable
        } else {
            self.builder.urgent(BuildJob { key: key.clone(), paths: vec![path.clone()], cfi_bytes: probe.cfi_bytes, image: None, urgent: true, startup: true });
            TableState::Queued { urgent: true }
        };
        let exe = Executable {
            state,
            segments: probe.segments,
            cfi_bytes: probe.cfi_bytes,
            users: HashSet::new(),
            paths: vec![path.clone()],
            name: path.display().to_string(),
            retry_after: None,
        };
        self.executables.insert(key.clone(), exe);
        Some(key)
    }
}
