//! Identity of executable files, so that one table serves every process that maps the file.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use object::Object;

/// What a table is cached under: the GNU build-id when the file has one, else the file's identity
/// on disk (device, inode, size, modification time).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutableKey {
    BuildId(Vec<u8>),
    File { dev: u64, ino: u64, size: u64, mtime_ns: i64 },
}


impl ExecutableKey {
    /// The key of the file at `path` (for a mapped file, /proc/PID/map_files/… works too).
    pub fn of_file(path: &Path) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        let file = std::fs::File::open(path)?;
        // SAFETY: read-only mapping, used only to read the build-id note.
        if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
            if let Ok(Some(id)) = object::File::parse(&*map).and_then(|f| f.build_id()) {
                if !id.is_empty() {
                    return Ok(ExecutableKey::BuildId(id.to_vec()));
                }
            }
        }
        Ok(ExecutableKey::File { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec() })
    }
}
