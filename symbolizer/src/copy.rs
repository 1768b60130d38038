//! Private copies of what symbolization reads from a module file.
//!
//! blazesym maps the files it symbolizes; a file that another user truncates meanwhile would
//! raise SIGBUS in gpuflame. It is handed instead a memfd that only gpuflame holds: a sparse
//! file of the module's size with, at their own offsets, the ELF and section headers, the symbol
//! and string tables, notes, debug links and (within a budget) the DWARF sections, read with
//! pread. Code and data sections stay holes, which cost nothing. The layout is the original's,
//! so file offsets and addresses mean the same in the copy.
//!
//! Debug links (`.gnu_debuglink`) are followed by gpuflame itself (debuginfo.rs: checked
//! against the build-id, and copied like this), never by blazesym: they are unlinked in the copy
//! (their section loses its name). An alternate debug file (dwz) is left to blazesym only where
//! it cannot lead out of root's debug directories: a link in a file someone else controls could
//! otherwise name a FIFO or a file they truncate at will.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use gpuflame_elfread::{consts, ElfError, ElfFile, Section};

use crate::files::ModuleFile;

/// Symbols and DWARF of one module copied at most: 13× the largest seen (libtriton.so: 253 MiB
/// of DWARF, libtorch_cpu.so: 94 MiB of symbol and string tables). The DWARF is left out when
/// it would not fit (names stay, lines go).
pub(crate) const MAX_COPY: u64 = 1 << 30;
const CHUNK: u64 = 1 << 20;

pub(crate) struct PrivateCopy {
    memfd: File,
    /// Whatever DWARF the file has was copied: blazesym may look for lines, inlined functions
    /// and debug links (a stripped libc's names are in its separate debug file).
    pub dwarf: bool,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    #[error("{0}")]
    Elf(#[from] ElfError),
    #[error("private copy: {0}")]
    Memfd(std::io::Error),
}

#[derive(PartialEq)]
enum Part {
    Symbols,
    Dwarf,
    Skip,
}

fn part(s: &Section) -> Part {
    if s.kind == consts::SHT_NOBITS {
        return Part::Skip;
    }
    match s.kind {
        consts::SHT_SYMTAB | consts::SHT_DYNSYM | consts::SHT_STRTAB | consts::SHT_NOTE | consts::SHT_GNU_VERSYM | consts::SHT_GNU_VERDEF | consts::SHT_GNU_VERNEED => Part::Symbols,
        _ if matches!(s.name.as_str(), ".gnu_debuglink" | ".gnu_debugaltlink" | ".gnu_debugdata") => Part::Symbols,
        _ if s.name.starts_with(".debug_") || s.name.starts_with(".zdebug_") => Part::Dwarf,
        _ => Part::Skip,
    }
}

impl PrivateCopy {
    pub(crate) fn make(module: &ModuleFile) -> Result<Self, CopyError> {
        let elf = ElfFile::parse(module.file())?;
        let sections: Vec<(&Section, Part)> = elf.sections().iter().map(|s| (s, part(s))).collect();
        let size_of = |p: Part| sections.iter().filter(|(_, q)| *q == p).fold(0u64, |n, (s, _)| n.saturating_add(s.size));
        let (symbols, dwarf) = (size_of(Part::Symbols), size_of(Part::Dwarf));
        if symbols > MAX_COPY {
            return Err(ElfError::TooLarge { what: "symbol tables".into(), size: symbols, limit: MAX_COPY }.into());
        }
        let with_dwarf = dwarf > 0 && symbols.saturating_add(dwarf) <= MAX_COPY;
        if dwarf > 0 && !with_dwarf {
            tracing::debug!(dwarf, "DWARF over the copy budget: symbol names only");
        }
        let memfd = memfd().map_err(CopyError::Memfd)?;
        memfd.set_len(elf.len()).map_err(CopyError::Memfd)?;
        let mut ranges: Vec<(u64, u64)> = elf.header_ranges().to_vec();
        ranges.extend(sections.iter().filter(|(_, p)| *p == Part::Symbols || (*p == Part::Dwarf && with_dwarf)).map(|(s, _)| (s.offset, s.size)));
        let mut bytes = 0;
        for (offset, len) in ranges {
            // A section header pointing past the end describes nothing to copy.
            if offset.checked_add(len).is_none_or(|end| end > elf.len()) {
                continue;
            }
            let mut done = 0;
            while done < len {
                let n = (len - done).min(CHUNK);
                let at = offset.saturating_add(done);
                let chunk = elf.read(at, n, "a section", CHUNK)?;
                memfd.write_all_at(&chunk, at).map_err(CopyError::Memfd)?;
                done += n;
            }
            bytes += len;
        }
        unlink_unsafe_links(&elf, &memfd)?;
        Ok(PrivateCopy { memfd, dwarf: dwarf == 0 || with_dwarf, bytes })
    }

    /// A copy of bytes made here (a decompressed MiniDebugInfo ELF).
    pub(crate) fn from_bytes(data: &[u8]) -> Result<Self, CopyError> {
        let memfd = memfd().map_err(CopyError::Memfd)?;
        memfd.write_all_at(data, 0).map_err(CopyError::Memfd)?;
        Ok(PrivateCopy { memfd, dwarf: false, bytes: data.len() as u64 })
    }

    /// A path blazesym can open, that reaches the copy for as long as it is held.
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.memfd.as_raw_fd()))
    }
}

/// Gives the link sections whose targets could lie outside root's debug directories an empty
/// name in the copy, so that blazesym does not see them.
fn unlink_unsafe_links<R: gpuflame_elfread::ReadAt>(elf: &ElfFile<R>, copy: &File) -> Result<(), CopyError> {
    let shoff = elf.header_ranges()[2].0;
    for (i, s) in elf.sections().iter().enumerate() {
        let safe = match s.name.as_str() {
            ".gnu_debuglink" => false,
            ".gnu_debugaltlink" => elf.section_data(s, 4096).is_ok_and(|d| safe_alt_path(until_nul(&d))),
            // A DWARF 5 supplementary file: a path too, rare; not followed.
            ".debug_sup" => false,
            _ => continue,
        };
        if !safe {
            tracing::debug!(section = %s.name, "debug link left out of the private copy");
            let at = shoff.saturating_add(i as u64 * 64);
            copy.write_all_at(&[0; 4], at).map_err(CopyError::Memfd)?;
        }
    }
    Ok(())
}

pub(crate) fn until_nul(d: &[u8]) -> &[u8] {
    &d[..d.iter().position(|&b| b == 0).unwrap_or(d.len())]
}

/// A debug link is a file name, looked for in the debug directories and next to the module
/// (never a path; digits alone would name descriptors next to a copy in /proc/self/fd/).
pub(crate) fn safe_link_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != b"."
        && name != b".."
        && !name.iter().all(u8::is_ascii_digit)
        && name.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'+'))
}

/// An alternate debug file (dwz) must be an absolute path inside root's debug directories.
fn safe_alt_path(path: &[u8]) -> bool {
    let Ok(path) = std::str::from_utf8(path) else { return false };
    (path.starts_with("/usr/lib/debug/") || path.starts_with("/lib/debug/"))
        && path.split('/').all(|c| c != ".." && c != ".")
        && path.chars().all(|c| c.is_ascii_graphic())
}

fn memfd() -> std::io::Result<File> {
    // SAFETY: memfd_create reads a NUL-terminated name; the descriptor it returns is owned here.
    let fd = unsafe { libc::memfd_create(c"gpuflame-symbols".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn only_links_that_stay_in_debug_directories_are_followed() {
        assert!(safe_link_name(b"libc.so.6.debug"));
        assert!(safe_link_name(b"93ac61ec5a8eb1396f9fbd350e3169a558528a40.debug"));
        for bad in [&b"/tmp/evil.debug"[..], b"../../tmp/x", b"12", b"..", b"", b"a b"] {
            assert!(!safe_link_name(bad), "{}", String::from_utf8_lossy(bad));
        }
        assert!(safe_alt_path(b"/usr/lib/debug/.dwz/x86_64-linux-gnu/libc6.debug"));
        for bad in [&b"/tmp/x.debug"[..], b"../../.dwz/x.debug", b"/usr/lib/debug/../../tmp/x", b"/usr/lib/debug/a b"] {
            assert!(!safe_alt_path(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn copy_keeps_the_layout_and_leaves_code_out() {
        let exe = std::env::current_exe().unwrap();
        let module = ModuleFile::open(&exe).unwrap();
        let copy = PrivateCopy::make(&module).unwrap();
        let meta = std::fs::metadata(copy.path()).unwrap();
        assert_eq!(meta.len(), std::fs::metadata(&exe).unwrap().len());
        // Sparse: far fewer blocks than the file's size (code is a hole).
        assert!(meta.blocks() * 512 < meta.len(), "{} blocks for {} bytes", meta.blocks(), meta.len());
        let original = std::fs::read(&exe).unwrap();
        let copied = std::fs::read(copy.path()).unwrap();
        let elf = ElfFile::parse(&original[..]).unwrap();
        let symtab = elf.sections().iter().find(|s| s.kind == consts::SHT_SYMTAB).unwrap();
        let r = symtab.offset as usize..(symtab.offset + symtab.size) as usize;
        assert_eq!(copied[r.clone()], original[r]);
        let text = elf.section(".text").unwrap();
        assert!(copied[text.offset as usize..(text.offset + text.size) as usize].iter().all(|&b| b == 0));
    }
}
