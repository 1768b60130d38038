//! The spool directory, as root: only a directory no one else can write to is used, and in it
//! only regular files of this user are read and only new files are written. A directory other
//! users can write to would let them plant a link to a root-only file (which would be read and
//! pushed to the server), a FIFO (which would block the agent), or a link at a temporary name
//! (which would be written through).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("the spool directory {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("refusing the spool directory {}: {why}; it must be a directory of uid {euid}, not writable by group or others, below directories only root or uid {euid} can change", path.display())]
    Unsafe { path: PathBuf, why: String, euid: u32 },
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// O_NONBLOCK: a FIFO must not block the open. O_NOFOLLOW: a link is not followed.
const FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// Creates `dir` (mode 0700) if it is missing, and checks it and every directory above it.
/// Returns its canonical path, to be used from then on: a symlink on the way cannot be re-pointed
/// later to a directory that was not checked.
pub fn prepare_spool_dir(dir: &Path) -> Result<PathBuf, SpoolError> {
    let io_err = |source| SpoolError::Io { path: dir.to_path_buf(), source };
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io_err)?;
    let canonical = fs::canonicalize(dir).map_err(io_err)?;
    let euid = euid();
    let refuse = |path: &Path, why: String| SpoolError::Unsafe { path: path.to_path_buf(), why, euid };
    let meta = fs::metadata(&canonical).map_err(io_err)?;
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_dir() {
        return Err(refuse(&canonical, "it is not a directory".into()));
    }
    if meta.uid() != euid {
        return Err(refuse(&canonical, format!("it is owned by uid {}", meta.uid())));
    }
    if mode & 0o022 != 0 {
        return Err(refuse(&canonical, format!("its mode is {mode:04o}")));
    }
    for ancestor in canonical.ancestors().skip(1) {
        let meta = fs::metadata(ancestor).map_err(|source| SpoolError::Io { path: ancestor.to_path_buf(), source })?;
        let mode = meta.permissions().mode() & 0o7777;
        let why = if meta.uid() != 0 && meta.uid() != euid {
            format!("{} above it is owned by uid {}", ancestor.display(), meta.uid())
        } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            // Sticky directories (/tmp) are fine: others cannot rename or remove what is ours.
            format!("{} above it has mode {mode:04o}", ancestor.display())
        } else {
            continue;
        };
        return Err(refuse(&canonical, why));
    }
    Ok(canonical)
}

/// Reads a spooled request: a regular file of this user of at most `limit` bytes, or an error
/// saying what it is instead.
pub(crate) fn read_spooled(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new().read(true).custom_flags(FLAGS).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.uid() != euid() {
        return Err(io::Error::other(format!("owned by uid {}", meta.uid())));
    }
    if meta.len() > limit {
        return Err(io::Error::other(format!("{} bytes, more than the queue holds", meta.len())));
    }
    let mut body = Vec::new();
    file.take(limit + 1).read_to_end(&mut body)?;
    if body.len() as u64 > limit {
        return Err(io::Error::other("grew past the queue's bound while read"));
    }
    Ok(body)
}

/// Writes `body` at `path` through a new temporary file beside it (mode 0600), never through
/// anything already at a temporary name.
pub(crate) fn write_spooled(path: &Path, body: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    for attempt in 0..100 {
        let tmp = dir.join(format!(".{name}.{attempt}.tmp"));
        let mut file: File = match OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(FLAGS).open(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = file.write_all(body).and_then(|()| file.sync_all()).and_then(|()| fs::rename(&tmp, path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        return written;
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("no free temporary name for {}", path.display())))
}

/// Creates the spool directory at exit if it went missing, private as at start.
pub(crate) fn create_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    }

    #[test]
    fn only_private_directories_are_spool_directories() {
        let base = std::env::temp_dir().join(format!("gpuflame-spooldir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        let made = prepare_spool_dir(&base.join("a/b")).unwrap();
        assert_eq!(fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o700);
        fs::set_permissions(&made, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(prepare_spool_dir(&made).unwrap_err().to_string().contains("mode is 0777"));
        // A private directory below one anyone can rename things in.
        fs::set_permissions(&made, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(base.join("a"), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(prepare_spool_dir(&made), Err(SpoolError::Unsafe { .. })));
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn links_fifos_and_oversized_files_are_not_read() {
        let dir = tempfile_dir("read");
        let secret = dir.join("secret");
        fs::write(&secret, "root only").unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("a.pushreq")).unwrap();
        mkfifo(&dir.join("b.pushreq"));
        fs::write(dir.join("c.pushreq"), vec![0; 100]).unwrap();
        assert!(read_spooled(&dir.join("a.pushreq"), 100).is_err());
        assert!(read_spooled(&dir.join("b.pushreq"), 100).is_err(), "and it did not block");
        assert_eq!(read_spooled(&dir.join("c.pushreq"), 100).unwrap().len(), 100);
        assert!(read_spooled(&dir.join("c.pushreq"), 99).is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_planted_temporary_link_is_not_written_through() {
        let dir = tempfile_dir("write");
        let victim = dir.join("victim");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".1.pushreq.0.tmp")).unwrap();
        write_spooled(&dir.join("1.pushreq"), b"body").unwrap();
        assert_eq!(fs::read(dir.join("1.pushreq")).unwrap(), b"body");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        let _ = fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpuflame-spool-{what}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }
}
