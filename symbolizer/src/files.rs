//! The files of modules, opened while the processes that map them live, so that they can be
//! symbolized later: after the process exited, when the file was deleted or replaced at its
//! path, and when it lives in another mount namespace (a container), where the path text from
//! /proc/PID/maps names another file, or none, on the host.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use gpuflame_elfread::{max_open_files, open_regular, ElfFile, FileId, OpenError};

/// An open executable file (program or library) and its identity.
pub struct ModuleFile {
    file: File,
    id: FileId,
    build_id: Option<Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{0}")]
    Open(#[from] OpenError),
    #[error("{0} files of other processes are open already (RLIMIT_NOFILE); this one is left unnamed")]
    TooMany(usize),
}

/// Files open now, by identity: the tracker (per process) and the symbolizer (per module) share
/// one descriptor per file however many processes map it.
struct Registry {
    open: HashMap<FileId, Weak<ModuleFile>>,
    limit: usize,
    warned: bool,
}

static REGISTRY: LazyLock<Mutex<Registry>> =
    LazyLock::new(|| Mutex::new(Registry { open: HashMap::new(), limit: max_open_files(), warned: false }));

impl ModuleFile {
    /// Opens the file that process `pid` maps at [start, end), through
    /// /proc/PID/map_files/START-END: the mapped file itself, whatever its path names now.
    pub fn open_mapping(pid: u32, start: u64, end: u64) -> Result<Arc<ModuleFile>, FileError> {
        Self::open(Path::new(&format!("/proc/{pid}/map_files/{start:x}-{end:x}")))
    }

    /// The file with identity `id`, if it is open already: what a caller that has just stat'ed
    /// the file gets without a second stat.
    pub fn already_open(id: &FileId) -> Option<Arc<ModuleFile>> {
        let reg = REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        reg.open.get(id).and_then(Weak::upgrade)
    }

    /// Opens a regular file without blocking, or returns the one already open with the same
    /// identity.
    pub fn open(path: &Path) -> Result<Arc<ModuleFile>, FileError> {
        // stat follows the map_files link without opening anything.
        let id = FileId::from(&std::fs::metadata(path).map_err(OpenError::from)?);
        let mut reg = REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(file) = reg.open.get(&id).and_then(Weak::upgrade) {
            return Ok(file);
        }
        if reg.open.len() >= reg.limit {
            reg.open.retain(|_, f| f.strong_count() > 0);
            if reg.open.len() >= reg.limit {
                if !reg.warned {
                    reg.warned = true;
                    tracing::warn!(limit = reg.limit, "too many files of other processes open; further ones are left unnamed");
                }
                return Err(FileError::TooMany(reg.limit));
            }
        }
        let file = open_regular(path)?;
        let id = FileId::of(&file).map_err(OpenError::from)?;
        let build_id = ElfFile::parse(&file).ok().and_then(|elf| elf.build_id());
        let module = Arc::new(ModuleFile { file, id, build_id });
        reg.open.insert(id, Arc::downgrade(&module));
        Ok(module)
    }

    pub fn id(&self) -> FileId {
        self.id
    }

    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl std::fmt::Debug for ModuleFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleFile").field("id", &self.id).field("build_id", &self.build_id).finish()
    }
}

impl PartialEq for ModuleFile {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for ModuleFile {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_descriptor_per_file_and_fifos_refused() {
        let exe = std::env::current_exe().unwrap();
        let a = ModuleFile::open(&exe).unwrap();
        let b = ModuleFile::open(&exe).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.build_id().is_some());
        assert!(matches!(ModuleFile::open(Path::new("/dev/null")), Err(FileError::Open(OpenError::NotRegular(_)))));
    }
}
