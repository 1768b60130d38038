//! Opening files of other processes without blocking, and only when they are regular files.

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file but a {0}; refused")]
    NotRegular(&'static str),
}

/// Opens `path` for reading, refusing anything that is not a regular file. O_NONBLOCK: a FIFO
/// put at a mapped file's path (or reached through a symlink) must not block the open; the type
/// is checked before and, against a swap in between, after opening.
pub fn open_regular(path: &Path) -> Result<File, OpenError> {
    check_regular(&std::fs::metadata(path)?)?;
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY).open(path)?;
    check_regular(&file.metadata()?)?;
    Ok(file)
}

fn check_regular(meta: &Metadata) -> Result<(), OpenError> {
    let t = meta.file_type();
    let kind = if t.is_file() {
        return Ok(());
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_dir() {
        "directory"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    };
    Err(OpenError::NotRegular(kind))
}

/// A file's identity on disk: two files at one path in two mount namespaces differ here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

impl FileId {
    pub fn of(file: &File) -> std::io::Result<FileId> {
        Ok(FileId::from(&file.metadata()?))
    }
}

impl From<&Metadata> for FileId {
    fn from(m: &Metadata) -> Self {
        FileId { dev: m.dev(), ino: m.ino(), size: m.size(), mtime_ns: m.mtime().saturating_mul(1_000_000_000).saturating_add(m.mtime_nsec()) }
    }
}

/// The soft RLIMIT_NOFILE before [`raise_fd_limit`], for commands gpuflame starts.
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(0);

/// Raises the soft limit on open files to the hard limit: the files of every module sampled
/// stay open until the recording is symbolized. Returns the new soft limit.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = ORIGINAL_SOFT.compare_exchange(0, lim.rlim_cur, Ordering::SeqCst, Ordering::SeqCst);
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// Puts the soft limit back as it was before [`raise_fd_limit`]. Async-signal-safe: meant for
/// a command's pre-exec step, so that it does not inherit gpuflame's raised limit.
pub fn restore_fd_limit() -> std::io::Result<()> {
    let soft = ORIGINAL_SOFT.load(Ordering::SeqCst);
    if soft == 0 {
        return Ok(());
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only access the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = soft.min(lim.rlim_max);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// How many files of other processes gpuflame keeps open at once: a third of the soft limit
/// (each symbolized file may take three descriptors: the file, a private copy, and blazesym's
/// own), less room for everything else, within [32, 16384].
pub fn max_open_files() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    (soft.saturating_sub(256) / 3).clamp(32, 16384) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("elfread-fifo-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_regular(&fifo).unwrap_err();
        assert!(matches!(err, OpenError::NotRegular("FIFO")), "{err}");
        assert!(matches!(open_regular(&dir), Err(OpenError::NotRegular("directory"))));
        assert!(matches!(open_regular(Path::new("/dev/null")), Err(OpenError::NotRegular("character device"))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn regular_file_opens_with_its_identity() {
        let exe = std::env::current_exe().unwrap();
        let f = open_regular(&exe).unwrap();
        let id = FileId::of(&f).unwrap();
        assert_eq!(id, FileId::from(&std::fs::metadata(&exe).unwrap()));
    }
}
