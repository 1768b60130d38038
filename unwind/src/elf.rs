//! Identity of executable files, so that one table serves every process that maps the file.

use std::fs::File;
use std::path::Path;

use gpuflame_elfread::{open_regular, ElfFile, FileId, OpenError};

/// What a table is cached under: the GNU build-id when the file has one, else the file's identity
/// on disk (device, inode, size, modification time).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutableKey {
    BuildId(Vec<u8>),
    File { dev: u64, ino: u64, size: u64, mtime_ns: i64 },
}

impl ExecutableKey {
    /// The key of the file at `path` (for a mapped file, /proc/PID/map_files/… works too). Only
    /// a regular file is opened, without blocking.
    pub fn of_file(path: &Path) -> std::io::Result<Self> {
        let file = open_regular(path).map_err(|e| match e {
            OpenError::Io(e) => e,
            e => std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        })?;
        Self::of_open(&file)
    }

    /// The key of an open file: its build-id read with pread (no mapping that a truncation could
    /// fault), else its identity.
    pub fn of_open(file: &File) -> std::io::Result<Self> {
        let id = FileId::of(file)?;
        if let Some(build_id) = ElfFile::parse(file).ok().and_then(|elf| elf.build_id()) {
            return Ok(ExecutableKey::BuildId(build_id));
        }
        Ok(ExecutableKey::File { dev: id.dev, ino: id.ino, size: id.size, mtime_ns: id.mtime_ns })
    }
}
