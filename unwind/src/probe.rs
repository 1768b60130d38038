//! What the process tracker needs to know of an executable file before (and often instead of)
//! building its table: its identity, its load segments and how much unwind information it has.
//! Read with `pread` into small owned buffers: a file that another user truncates meanwhile gives
//! an error here, never a fault.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::{ExecutableKey, LoadSegment};

/// Program and section headers beyond these counts are not from a real linker.
const MAX_PROGRAM_HEADERS: usize = 4096;
const MAX_SECTION_HEADERS: usize = 1 << 16;
const MAX_SECTION_NAMES: u64 = 1 << 20;
const MAX_NOTE_BYTES: u64 = 1 << 16;

/// An executable file as seen without reading its unwind information.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfProbe {
    pub key: ExecutableKey,
    pub segments: Vec<LoadSegment>,
    /// Bytes of `.eh_frame` plus `.debug_frame`: what building the table will read, and roughly
    /// 1 row per 4 bytes.
    pub cfi_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Open(#[from] gpuflame_elfread::OpenError),
    #[error("not a 64-bit little-endian ELF file")]
    NotElf,
    #[error("malformed ELF headers: {0}")]
    Malformed(&'static str),
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn read_at(file: &File, offset: u64, len: u64) -> Result<Vec<u8>, ProbeError> {
    let mut buf = vec![0; usize::try_from(len).map_err(|_| ProbeError::Malformed("size"))?];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

impl ElfProbe {
    pub fn of_file(path: &Path) -> Result<Self, ProbeError> {
        let file = gpuflame_elfread::open_regular(path)?;
        let meta = file.metadata()?;
        let header = read_at(&file, 0, 64)?;
        if header.get(..4) != Some(b"\x7fELF") || header[4] != 2 || header[5] != 1 {
            return Err(ProbeError::NotElf);
        }
        let field = |v: Option<u64>| v.ok_or(ProbeError::Malformed("header"));
        let phoff = field(u64_at(&header, 32))?;
        let shoff = field(u64_at(&header, 40))?;
        let phentsize = u64::from(field(u16_at(&header, 54).map(u64::from))? as u16);
        let phnum = field(u16_at(&header, 56).map(u64::from))? as usize;
        let shentsize = field(u16_at(&header, 58).map(u64::from))?;
        let shnum = field(u16_at(&header, 60).map(u64::from))? as usize;
        let shstrndx = field(u16_at(&header, 62).map(u64::from))? as usize;
        if phentsize < 56 || phnum > MAX_PROGRAM_HEADERS || (shnum > 0 && shentsize < 64) || shnum > MAX_SECTION_HEADERS {
            return Err(ProbeError::Malformed("header sizes"));
        }

        let phdrs = read_at(&file, phoff, phentsize * phnum as u64)?;
        let mut segments = Vec::new();
        let mut build_id = None;
        for i in 0..phnum {
            let at = i * phentsize as usize;
            let kind = u32_at(&phdrs, at).ok_or(ProbeError::Malformed("program header"))?;
            let offset = u64_at(&phdrs, at + 8).ok_or(ProbeError::Malformed("program header"))?;
            let vaddr = u64_at(&phdrs, at + 16).ok_or(ProbeError::Malformed("program header"))?;
            let file_size = u64_at(&phdrs, at + 32).ok_or(ProbeError::Malformed("program header"))?;
            match kind {
                1 => segments.push(LoadSegment { file_offset: offset, vaddr, file_size }),
                4 if build_id.is_none() && file_size <= MAX_NOTE_BYTES => {
                    if let Ok(notes) = read_at(&file, offset, file_size) {
                        build_id = gnu_build_id(&notes);
                    }
                }
                _ => {}
            }
        }

        let mut cfi_bytes = 0;
        if shnum > 0 && shstrndx < shnum {
            let shdrs = read_at(&file, shoff, shentsize * shnum as u64)?;
            let section = |i: usize| -> Option<(u32, u64, u64)> {
                let at = i * shentsize as usize;
                Some((u32_at(&shdrs, at)?, u64_at(&shdrs, at + 24)?, u64_at(&shdrs, at + 32)?))
            };
            let (_, names_offset, names_size) = section(shstrndx).ok_or(ProbeError::Malformed("section header"))?;
            let names = read_at(&file, names_offset, names_size.min(MAX_SECTION_NAMES))?;
            for i in 0..shnum {
                let Some((name, _, size)) = section(i) else { continue };
                let name = names.get(name as usize..).and_then(|n| n.split(|&c| c == 0).next()).unwrap_or_default();
                if name == b".eh_frame" || name == b".debug_frame" {
                    cfi_bytes += size;
                }
            }
        }
        let key = match build_id {
            Some(id) => ExecutableKey::BuildId(id),
            None => ExecutableKey::File { dev: meta.dev(), ino: meta.ino(), size: meta.size(), mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec() },
        };
        Ok(ElfProbe { key, segments, cfi_bytes })
    }
}

impl ElfProbe {
    /// The load segments of an ELF image in memory (the vDSO).
    pub fn segments_of(data: &[u8]) -> Option<Vec<LoadSegment>> {
        if data.get(..4)? != b"\x7fELF" {
            return None;
        }
        let phoff = usize::try_from(u64_at(data, 32)?).ok()?;
        let phentsize = usize::from(u16_at(data, 54)?);
        let phnum = usize::from(u16_at(data, 56)?);
        (0..phnum.min(MAX_PROGRAM_HEADERS))
            .filter_map(|i| {
                let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
                (u32_at(data, at)? == 1).then(|| Some(LoadSegment { file_offset: u64_at(data, at + 8)?, vaddr: u64_at(data, at + 16)?, file_size: u64_at(data, at + 32)? }))?
            })
            .map(Some)
            .collect()
    }
}

/// The GNU build-id in a PT_NOTE segment's bytes.
fn gnu_build_id(notes: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0usize;
    while at + 12 <= notes.len() {
        let namesz = u32_at(notes, at)? as usize;
        let descsz = u32_at(notes, at + 4)? as usize;
        let kind = u32_at(notes, at + 8)?;
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.div_ceil(4) * 4)?;
        let end = desc_at.checked_add(descsz.div_ceil(4) * 4)?;
        if kind == 3 && notes.get(name_at..name_at + namesz)? == b"GNU\0" {
            let id = notes.get(desc_at..desc_at + descsz)?;
            return (!id.is_empty()).then(|| id.to_vec());
        }
        at = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let probe = ElfProbe::of_file(&exe).unwrap();
        assert!(!probe.segments.is_empty());
        assert!(probe.cfi_bytes > 0);
    }

    #[test]
    fn truncated_and_foreign_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let cut = dir.path().join("cut");
        std::fs::write(&cut, &exe[..100]).unwrap();
        assert!(ElfProbe::of_file(&cut).is_err());
        let text = dir.path().join("text");
        std::fs::write(&text, b"#!/bin/sh\n").unwrap();
        assert!(matches!(ElfProbe::of_file(&text), Err(ProbeError::NotElf) | Err(ProbeError::Io(_))));
        assert!(matches!(ElfProbe::of_file(dir.path()), Err(ProbeError::Open(_)) | Err(ProbeError::Io(_))));
    }

    #[test]
    fn finds_a_gnu_build_id_note() {
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&3u32.to_le_bytes());
        note.extend_from_slice(b"GNU\0");
        note.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(gnu_build_id(&note), Some(vec![1, 2, 3, 4]));
        assert_eq!(gnu_build_id(&note[..10]), None);
    }
}
