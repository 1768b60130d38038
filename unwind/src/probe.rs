//! What the process tracker needs to know of an executable file before (and often instead of)
//! building its table: its identity, its load segments and how much unwind information it has.
//! Read through elfread (pread into owned buffers): a file that another user truncates meanwhile
//! gives an error here, never a fault.

use std::path::Path;

use gpuflame_elfread::{open_regular, ElfError, ElfFile, ReadAt};

use crate::elf::ExecutableKey;
use crate::table::LoadSegment;

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
    #[error("{0}")]
    Elf(#[from] ElfError),
}

fn load_segments<R: ReadAt + ?Sized>(elf: &ElfFile<&R>) -> Vec<LoadSegment> {
    elf.load_segments().map(|s| LoadSegment { file_offset: s.offset, vaddr: s.vaddr, file_size: s.file_size }).collect()
}

impl ElfProbe {
    pub fn of_file(path: &Path) -> Result<Self, ProbeError> {
        let file = open_regular(path)?;
        let elf = ElfFile::parse(&file)?;
        let cfi_bytes = elf.sections().iter().filter(|s| s.name == ".eh_frame" || s.name == ".debug_frame").map(|s| s.size).sum();
        Ok(ElfProbe { key: ExecutableKey::of_open(&file)?, segments: load_segments(&elf), cfi_bytes })
    }

    /// The load segments of an ELF image in memory (the vDSO).
    pub fn segments_of(data: &[u8]) -> Option<Vec<LoadSegment>> {
        ElfFile::parse(data).ok().map(|elf| load_segments(&elf))
    }
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
        assert!(matches!(ElfProbe::of_file(&text), Err(ProbeError::Elf(_)) | Err(ProbeError::Io(_))));
        assert!(matches!(ElfProbe::of_file(dir.path()), Err(ProbeError::Open(_)) | Err(ProbeError::Io(_))));
    }
}
