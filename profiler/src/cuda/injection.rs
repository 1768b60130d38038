//! gpuflame's CUPTI injection library: built with the binary, written out when a recording
//! starts a command with GPU time wanted, or on request for services started by hand.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The library's bytes (cupti/gpuflame_cupti.c, built by build.rs).
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libgpuflame_cupti.so"));

/// The environment variable through which the CUDA driver loads an injection library.
pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";

/// Writes the library to `path` (readable by every user: the profiled program may not be root).
pub fn write_to(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("so.tmp");
    fs::write(&tmp, LIBRARY)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, path)
}

/// Where a recording puts its copy: one per version of gpuflame, shared by recordings.
pub fn install_default() -> io::Result<PathBuf> {
    let dir = PathBuf::from(format!("/tmp/gpuflame-{}", env!("CARGO_PKG_VERSION")));
    let path = dir.join("libgpuflame_cupti.so");
    if fs::read(&path).map(|b| b == LIBRARY).unwrap_or(false) {
        return Ok(path);
    }
    write_to(&path)?;
    Ok(path)
}
