//! Files gpuflame writes as root at paths that may lie in directories other users can write to
//! (/tmp, a shared output folder): profiles, converted profiles, out-of-memory snapshots.
//!
//! - A new file is created with O_EXCL and O_NOFOLLOW: nothing another user planted at the path
//!   (a symlink to /etc/shadow, a FIFO) is followed or opened.
//! - An existing path is written only if it is a regular file with no other hard links, and not
//!   another user's file in a sticky world-writable directory (what `fs.protected_regular=2`
//!   refuses too). Devices, FIFOs, sockets, directories and symlinks are refused: `-o /dev/null`
//!   is an error rather than a silent loss, and a FIFO without a reader cannot block gpuflame.
//! - An existing file is truncated only when its new content is written, so a recording that
//!   fails before that leaves it as it was; only a file gpuflame created is removed on failure.

use std::fs::{self, File, FileType, Metadata, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write the output {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot write the output {}: it is {what}; refused", path.display())]
    Refused { path: PathBuf, what: String },
}

/// An output file, opened before recording so that a bad path fails at once.
#[derive(Debug)]
pub struct Output {
    file: File,
    path: PathBuf,
    /// (dev, inode) of a file this opening created, which gpuflame may remove again.
    created: Option<(u64, u64)>,
}

/// O_NONBLOCK: opening a FIFO that was swapped in must not wait for a reader. O_NOCTTY: a
/// terminal must not become gpuflame's controlling terminal.
const FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// Creates `path`, failing if anything (even a dangling symlink) is there.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(FLAGS).open(path)
}

/// Creates the first of `path_for(n)` for n = `first`, `first + 1`, … that does not exist yet;
/// returns the file, its path and n.
pub fn create_next(path_for: impl Fn(u32) -> PathBuf, first: u32) -> io::Result<(File, PathBuf, u32)> {
    const TRIES: u32 = 1000;
    for n in first..first.saturating_add(TRIES) {
        let path = path_for(n);
        match create_new(&path, 0o644) {
            Ok(f) => return Ok((f, path, n)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{TRIES} names after {} are taken", path_for(first).display())))
}

pub(crate) fn kind(t: FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Why an existing file at `path` must not be written, if it must not.
fn refusal(path: &Path, meta: &Metadata) -> Option<String> {
    let t = meta.file_type();
    if !t.is_file() {
        return Some(format!("{}, not a regular file", kind(t)));
    }
    if meta.nlink() > 1 {
        return Some(format!("a file with {} hard links, one of which may be another user's file", meta.nlink()));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let sticky_shared = fs::metadata(parent).is_ok_and(|d| d.permissions().mode() & 0o1002 == 0o1002);
    if sticky_shared && meta.uid() != euid() {
        return Some(format!("owned by uid {} in a world-writable sticky directory", meta.uid()));
    }
    None
}

impl Output {
    pub fn open(path: &Path) -> Result<Output, OutputError> {
        let io_err = |source: io::Error| OutputError::Io { path: path.to_path_buf(), source };
        let refused = |what: String| OutputError::Refused { path: path.to_path_buf(), what };
        match create_new(path, 0o644) {
            Ok(file) => {
                let meta = file.metadata().map_err(io_err)?;
                return Ok(Output { file, path: path.to_path_buf(), created: Some((meta.dev(), meta.ino())) });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(e)),
        }
        let before = fs::symlink_metadata(path).map_err(io_err)?;
        if let Some(why) = refusal(path, &before) {
            return Err(refused(why));
        }
        let file = OpenOptions::new().write(true).custom_flags(FLAGS).open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("a symbolic link, which gpuflame does not write through".into()),
            Some(libc::ENXIO) => refused("a FIFO, not a regular file".into()),
            _ => io_err(e),
        })?;
        let after = file.metadata().map_err(io_err)?;
        if (after.dev(), after.ino()) != (before.dev(), before.ino()) {
            return Err(refused("a file that was replaced while it was opened".into()));
        }
        if let Some(why) = refusal(path, &after) {
            return Err(refused(why));
        }
        Ok(Output { file, path: path.to_path_buf(), created: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's content with what `write` writes.
    pub fn write_with(&self, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
        if self.created.is_none() {
            self.file.set_len(0)?;
        }
        let mut w = BufWriter::new(&self.file);
        write(&mut w)?;
        w.flush()
    }

    /// Removes the file if this opening created it and it still is that file; anything else at
    /// the path is left alone.
    pub fn discard(self) {
        let Some(id) = self.created else { return };
        if fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_and_links_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        let link = dir.path().join("link.svg");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(matches!(Output::open(&link), Err(OutputError::Refused { .. })));
        let hard = dir.path().join("hard.svg");
        fs::hard_link(&victim, &hard).unwrap();
        assert!(Output::open(&hard).unwrap_err().to_string().contains("hard links"));
        assert!(Output::open(Path::new("/dev/null")).unwrap_err().to_string().contains("character device"));
        assert!(Output::open(dir.path()).is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    }

    #[test]
    fn an_existing_file_changes_only_when_written_and_is_never_removed() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.folded");
        fs::write(&old, "previous profile, longer than the new one").unwrap();
        let out = Output::open(&old).unwrap();
        assert_eq!(fs::read_to_string(&old).unwrap(), "previous profile, longer than the new one");
        out.write_with(|w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read_to_string(&old).unwrap(), "new");
        Output::open(&old).unwrap().discard();
        assert!(old.exists(), "a file gpuflame did not create stays");
        let new = dir.path().join("new.folded");
        Output::open(&new).unwrap().discard();
        assert!(!new.exists(), "a file gpuflame created goes");
    }

    #[test]
    fn create_next_skips_taken_names() {
        let dir = tempfile::tempdir().unwrap();
        let at = |n: u32| dir.path().join(format!("s-{n}"));
        std::os::unix::fs::symlink("/etc/passwd", at(1)).unwrap();
        let (_, path, n) = create_next(at, 1).unwrap();
        assert_eq!((path, n), (at(2), 2));
    }
}
