//! Small readers of /proc that the tracker uses: a process's memory, its mapped files
//! through map_files.

use std::fs;

use gpuflame_symbolizer::ModuleFile;

use super::maps::MapsEntry;

pub(super) fn read_process_memory(pid: u32, addr: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    f.seek(SeekFrom::Start(addr)).ok()?;
    let mut buf = vec![0; usize::try_from(len).ok()?];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// The file behind a mapping, opened now while the process lives, for symbolization later. A
/// process that exited before its events were handled leaves no map_files: the path it named is
/// taken then, but only if it is the very file that was mapped (device and inode as the maps
/// line gave them), so a file put at the path since cannot lend its names.
pub(super) fn open_mapped_file(pid: u32, entry: &MapsEntry) -> Option<std::sync::Arc<ModuleFile>> {
    let error = match ModuleFile::open_mapping(pid, entry.start, entry.end) {
        Ok(f) => return Some(f),
        Err(e) => e,
    };
    let same_file = |f: &ModuleFile| Some((f.id().dev, f.id().ino)) == device_of(&entry.dev).map(|dev| (dev, entry.inode));
    match ModuleFile::open(std::path::Path::new(&entry.path)) {
        Ok(f) if entry.path.starts_with('/') && same_file(&f) => Some(f),
        _ => {
            tracing::debug!(pid, path = %entry.path, %error, "cannot open a mapped file");
            None
        }
    }
}

/// A device as /proc/PID/maps prints it ("major:minor", hex), as stat gives it.
fn device_of(text: &str) -> Option<u64> {
    let (major, minor) = text.split_once(':')?;
    Some(libc::makedev(u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?))
}

/// The mapped file that starts at `start`, through /proc/PID/map_files.
pub(super) fn open_map_file(pid: u32, entries: &[MapsEntry], start: u64) -> Result<fs::File, gpuflame_elfread::OpenError> {
    let entry = entries.iter().find(|e| e.start == start).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    gpuflame_elfread::open_regular(std::path::Path::new(&format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end)))
}
