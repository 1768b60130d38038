//! Identity of executable files, so that one table serves every process that maps the file.

use std::fs::File;
use std::path::Path;

use gpuflame_elfread::{open_regular, ElfFile, FileId, OpenError};

/// What a table is cached under: the GNU build-id when the file has one, with a digest of the
/// unwind sections (a build-id is only a claim: a file of another user that copies a victim's
/// build-id must not get, or give, the victim's table), else the file's identity on disk
/// (device, inode, size, modification time).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutableKey {
    BuildId { id: Vec<u8>, cfi_digest: u64 },
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

    /// The key of an open file: its build-id and unwind sections read with pread (no mapping
    /// that a truncation could fault), else its identity.
    pub fn of_open(file: &File) -> std::io::Result<Self> {
        let id = FileId::of(file)?;
        if let Ok(elf) = ElfFile::parse(file) {
            if let Some(build_id) = elf.build_id() {
                if let Some(cfi_digest) = cfi_digest(&elf) {
                    return Ok(ExecutableKey::BuildId { id: build_id, cfi_digest });
                }
            }
        }
        Ok(ExecutableKey::File { dev: id.dev, ino: id.ino, size: id.size, mtime_ns: id.mtime_ns })
    }

    /// The GNU build-id, when the key has one.
    pub fn build_id(&self) -> Option<&[u8]> {
        match self {
            ExecutableKey::BuildId { id, .. } => Some(id),
            ExecutableKey::File { .. } => None,
        }
    }
}

/// Bytes of unwind sections hashed per read: the whole sections are hashed, a chunk at a time.
const DIGEST_CHUNK: u64 = 4 << 20;

/// A keyed hash (SipHash with this run's random key, so that nobody can aim a collision at it)
/// of the sections a table is built from, and of where they are. `None` when they cannot be read.
fn cfi_digest<R: gpuflame_elfread::ReadAt + ?Sized>(elf: &ElfFile<&R>) -> Option<u64> {
    use std::hash::{BuildHasher, Hasher};
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    let mut h = KEY.get_or_init(Default::default).build_hasher();
    for s in elf.sections().iter().filter(|s| matches!(s.name.as_str(), ".eh_frame" | ".eh_frame_hdr" | ".debug_frame")) {
        h.write(s.name.as_bytes());
        h.write_u64(s.addr);
        h.write_u64(s.size);
        let mut done = 0;
        while done < s.size {
            let len = (s.size - done).min(DIGEST_CHUNK);
            h.write(&elf.read(s.offset + done, len, "unwind section", DIGEST_CHUNK).ok()?);
            done += len;
        }
    }
    Some(h.finish())
}
