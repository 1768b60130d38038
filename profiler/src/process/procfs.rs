//! Small readers of /proc and clocks that the tracker uses: a process's memory, its mapped files
//! through map_files.

use std::fs;

use gpuflame_symbolizer::ModuleFile;

use super::maps::MapsEntry;

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns(), which stamps the tables' use.
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

pub(super) fn read_process_memory(pid: u32, addr: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    f.seek(SeekFrom::Start(addr)).ok()?;
    let mut buf = vec![0; usize::try_from(len).ok()?];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The file behind a mapping, opened now while the process lives, for symbolization later.
pub(super) fn open_mapped_file(pid: u32, entry: &MapsEntry) -> Option<std::sync::Arc<ModuleFile>> {
    match ModuleFile::open_mapping(pid, entry.start, entry.end) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(pid, path = %entry.path, error = %e, "cannot open a mapped file");
            None
        }
    }
}

/// The mapped file that starts at `start`, through /proc/PID/map_files.
pub(super) fn open_map_file(pid: u32, entries: &[MapsEntry], start: u64) -> Result<fs::File, gpuflame_elfread::OpenError> {
    let entry = entries.iter().find(|e| e.start == start).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    gpuflame_elfread::open_regular(std::path::Path::new(&format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end)))
}
