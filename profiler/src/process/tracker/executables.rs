//! Which executable file is behind a mapping, probed once per file. A file is known by what it
//! is (its build ID, else what stat says of it), not by the path a process maps it at: paths
//! differ between containers, and a deleted file's path and inode are reused by new files.

use std::collections::HashSet;
use std::path::PathBuf;

use gpuflame_elfread::FileId;
use gpuflame_unwind::{ElfProbe, ExecutableKey};

use super::{Executable, ProcessTracker, TableState};
use crate::process::builder::BuildJob;
use crate::process::maps::MapsEntry;
use crate::process::procfs::read_process_memory;

/// Files with at most this much CFI are built as soon as they are seen (~150k rows, ~10 ms: libc,
/// libstdc++, libpython, a distribution's python executable); bigger ones (OpenBLAS 1.5 MiB,
/// libtorch_cpu.so 17 MiB) only when a sample needs them, which keeps the builder's CPU off a
/// `torch` import that maps 71 files.
const EAGER_CFI_BYTES: u64 = 1 << 20;
/// Paths kept per file for the builder: one per process that maps it, the latest first.
const PATHS_PER_FILE: usize = 4;

impl ProcessTracker {
    /// The executable behind a mapping: known, or probed now and queued for its table; with
    /// what stat said of the file (none for the vDSO), so that the caller need not ask again.
    pub(super) fn executable_for(&mut self, pid: u32, entry: &MapsEntry) -> Option<(ExecutableKey, Option<FileId>)> {
        let vdso = entry.path == "[vdso]";
        if entry.inode == 0 && !vdso {
            return None; // anonymous code (JIT): frame pointers and stack scans only
        }
        // map_files reaches the mapped file even when it was deleted or is in another mount
        // namespace (a container).
        let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end));
        if vdso {
            return self.vdso(pid, entry).map(|key| (key, None));
        }
        self.file_at(path, &entry.path).map(|(key, inode)| (key, Some(inode)))
    }

    /// The executable file at `path` (`name` in messages): known, or probed now and queued for its
    /// table; with what stat said of it.
    pub(super) fn file_at(&mut self, path: PathBuf, name: &str) -> Option<(ExecutableKey, FileId)> {
        let inode_key = match std::fs::metadata(&path) {
            Ok(m) => FileId::from(&m),
            Err(e) => {
                tracing::debug!(path = %name, error = %e, "cannot stat the mapped file");
                return None;
            }
        };
        if let Some(key) = self.keys_by_inode.get(&inode_key).cloned() {
            if let Some(exe) = self.executables.get_mut(&key) {
                if !exe.paths.contains(&path) {
                    exe.paths.insert(0, path);
                    exe.paths.truncate(PATHS_PER_FILE);
                }
                return Some((key, inode_key));
            }
        }
        let probe = match ElfProbe::of_file(&path) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(path = %name, error = %e, "cannot read the mapped file");
                return None;
            }
        };
        let key = probe.key.clone();
        self.keys_by_inode.insert(inode_key, key.clone());
        if let Some(exe) = self.executables.get_mut(&key) {
            // The same file at another inode (another container's copy): its table is there.
            self.new_inodes.push(inode_key);
            if !exe.paths.contains(&path) {
                exe.paths.insert(0, path);
                exe.paths.truncate(PATHS_PER_FILE);
            }
            return Some((key, inode_key));
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
            name: name.to_string(),
            retry_after: None,
        };
        self.executables.insert(key.clone(), exe);
        Some((key, inode_key))
    }

    /// The vDSO exists only in memory: its table is built from the process's copy, once.
    pub(super) fn vdso(&mut self, pid: u32, entry: &MapsEntry) -> Option<ExecutableKey> {
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
}
