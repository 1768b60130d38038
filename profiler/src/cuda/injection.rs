//! gpuflame's CUPTI injection library: built with the binary, written out when a recording
//! starts a command with GPU time wanted, or on request for services started by hand.
//!
//! The command loads whatever file `CUDA_INJECTION64_PATH` names, usually as root, so that file
//! and every directory above it must be writable by root alone: a fixed name in /tmp could be
//! created by any user first. The recording's copy goes to /run/gpuflame (or
//! $XDG_RUNTIME_DIR/gpuflame when gpuflame runs with capabilities rather than as root), created
//! with mode 0755 and checked by owner and mode before each use. A memfd (`/proc/PID/fd/N`) was
//! not taken: it lives only as long as gpuflame, and a command that drops privileges cannot open
//! another process's descriptors.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::outfile;

/// The library's bytes (cupti/gpuflame_cupti.c, built by build.rs).
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libgpuflame_cupti.so"));

/// The environment variable through which the CUDA driver loads an injection library.
pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";
/// Launch stacks the library passes on per second per process, past each kernel's first few;
/// 0 passes every launch.
pub const LAUNCH_RATE_VAR: &str = "GPUFLAME_CUPTI_LAUNCH_RATE";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("refusing {}: {why}; it must be a directory of uid {euid} that no one else can write to", path.display())]
    Unsafe { path: PathBuf, why: String, euid: u32 },
    #[error("no private directory for the CUPTI library: /run/gpuflame cannot be created ({0}) and XDG_RUNTIME_DIR is not set")]
    NoDir(io::Error),
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> InstallError + '_ {
    move |source| InstallError::Io { path: path.to_path_buf(), source }
}

/// Writes the library to `path`, which the user chose (readable by every user: the profiled
/// program may not be root). Through a new temporary file beside it, never an existing one.
pub fn write_to(path: &Path) -> Result<(), InstallError> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
            dir
        }
        None => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nonce}.tmp", std::process::id()));
    let written = outfile::create_new(&tmp, 0o600).and_then(|mut f| {
        f.write_all(LIBRARY)?;
        f.set_permissions(fs::Permissions::from_mode(0o755))?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(io_at(path)(e));
    }
    Ok(())
}

/// Why `meta` is no directory that only this user can change, if it is not.
fn not_private(meta: &fs::Metadata, owners: &[u32]) -> Option<String> {
    if !meta.file_type().is_dir() {
        return Some(format!("it is {}", outfile::kind(meta.file_type())));
    }
    if !owners.contains(&meta.uid()) {
        return Some(format!("it is owned by uid {}", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o022 != 0).then(|| format!("its mode is {mode:04o}"))
}

/// `parent/gpuflame`, created if needed, once it and `parent` are known to be writable by root
/// or this user alone.
fn private_dir(parent: &Path) -> Result<PathBuf, InstallError> {
    let euid = euid();
    let unsafe_dir = |path: &Path, why| InstallError::Unsafe { path: path.to_path_buf(), why, euid };
    let meta = fs::symlink_metadata(parent).map_err(io_at(parent))?;
    if let Some(why) = not_private(&meta, &[0, euid]) {
        return Err(unsafe_dir(parent, why));
    }
    let dir = parent.join("gpuflame");
    match fs::DirBuilder::new().mode(0o755).create(&dir) {
        // Whatever the umask: commands that are not root must be able to load the library.
        Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(io_at(&dir))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at(&dir)(e)),
    }
    let meta = fs::symlink_metadata(&dir).map_err(io_at(&dir))?;
    match not_private(&meta, &[euid]) {
        Some(why) => Err(unsafe_dir(&dir, why)),
        None => Ok(dir),
    }
}

fn library_dir() -> Result<PathBuf, InstallError> {
    match private_dir(Path::new("/run")) {
        Ok(dir) => Ok(dir),
        // Not root, only capable: /run is not ours to write.
        Err(InstallError::Io { source, .. }) if source.kind() == io::ErrorKind::PermissionDenied => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(runtime) => private_dir(Path::new(&runtime)),
            None => Err(InstallError::NoDir(source)),
        },
        Err(e) => Err(e),
    }
}

/// FNV-1a: builds of one version with different libraries get different files, so that one
/// recording never replaces the file another is using.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Whether `path` already holds the library, as a file that only this user could have written.
fn already_there(path: &Path) -> bool {
    let Ok(mut f) = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path) else {
        return false;
    };
    let Ok(meta) = f.metadata() else { return false };
    let mode = meta.permissions().mode();
    if !meta.is_file() || meta.uid() != euid() || mode & 0o022 != 0 || meta.nlink() != 1 || meta.len() != LIBRARY.len() as u64 {
        return false;
    }
    let mut bytes = Vec::with_capacity(LIBRARY.len());
    f.read_to_end(&mut bytes).is_ok() && bytes == LIBRARY
}

/// Where a recording puts its copy: one per build of gpuflame, shared by recordings.
pub fn install_default() -> Result<PathBuf, InstallError> {
    let dir = library_dir()?;
    let path = dir.join(format!("libgpuflame_cupti-{}-{:016x}.so", env!("CARGO_PKG_VERSION"), fingerprint(LIBRARY)));
    if !already_there(&path) {
        write_to(&path)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_temporary_link_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        let path = dir.path().join("lib.so");
        // The old fixed temporary name, planted: no longer used, and never followed.
        std::os::unix::fs::symlink(&victim, dir.path().join("lib.so.tmp")).unwrap();
        write_to(&path).unwrap();
        assert_eq!(fs::read(&path).unwrap(), LIBRARY);
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert!(already_there(&path));
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(private_dir(dir.path()), Err(InstallError::Unsafe { .. })));
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let made = private_dir(dir.path()).unwrap();
        assert_eq!(fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o755);
        fs::set_permissions(&made, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(private_dir(dir.path()), Err(InstallError::Unsafe { .. })), "checked again on each use");
    }
}
