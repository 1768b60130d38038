//! ELF unwind information turned into compact unwind tables for x86-64, for the BPF unwinder.
//!
//! [`UnwindTable::from_elf`] reads `.eh_frame` (and `.debug_frame` where `.eh_frame` does not
//! cover code) with gimli and produces rows sorted by address, each saying how to find the
//! caller's frame from this one: the CFA rule, where RBP was saved, and (fixed on x86-64) the
//! return address at CFA-8. Rules the BPF unwinder cannot follow are kept as
//! [`CfaRule::Unsupported`], never guessed. [`CompactTable`] is the form that goes to BPF.

mod build;
mod compact;
mod elf;
mod probe;
mod rule;

pub use compact::{CompactTable, RuleTable};
pub use compact::CompactError;
pub use elf::ExecutableKey;
pub use probe::{ElfProbe, ProbeError};
pub use rule::{CfaRule, RbpRule, UnwindRule};

use std::fs::File;
use std::path::Path;

use gpuflame_elfread::{open_regular, ElfError, ElfFile};

/// One row: from `pc` up to the next row's `pc`, `rule` applies. `pc` is a virtual address of
/// the ELF file (as in its program headers and symbol table, before load bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u64,
    pub rule: UnwindRule,
}

/// The unwind rows of one executable file, sorted by `pc`, with consecutive duplicates merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnwindTable {
    pub rows: Vec<UnwindRow>,
    /// The file's loadable segments, to turn runtime addresses into file addresses.
    pub segments: Vec<LoadSegment>,
    pub stats: TableStats,
}

/// A PT_LOAD segment: `file_size` bytes at `file_offset` are mapped at virtual address `vaddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
}

/// The load bias of a mapping that maps the file at `file_offset` to `start`: runtime address
/// minus the file's virtual address. None when no segment holds that offset.
///
/// The loader maps each segment from its page-aligned offset, so a segment that does not start
/// on a page boundary shares its first page with the one before: the segment whose aligned start
/// is the mapping's offset is the one mapped there (OpenBLAS's text starts at 0x288800, in the
/// last page of its read-only segment).
pub fn load_bias(segments: &[LoadSegment], start: u64, file_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let aligned = segments.iter().find(|s| s.file_offset & !(PAGE - 1) == file_offset && s.file_size > 0);
    let seg = aligned.or_else(|| {
        segments.iter().find(|s| s.file_offset <= file_offset && file_offset < s.file_offset + s.file_size.max(1))
    })?;
    let vaddr = seg.vaddr.wrapping_sub(seg.file_offset).wrapping_add(file_offset);
    Some(start.wrapping_sub(vaddr))
}

/// What went into a table, for reports and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    pub fdes: usize,
    /// Rows as the CFI programs produced them, before merging.
    pub raw_rows: usize,
    pub unsupported_rows: usize,
    pub from_debug_frame: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Read { path: String, source: ElfError },
    #[error("not a usable ELF file: {0}")]
    Elf(#[from] ElfError),
    #[error("unsupported ELF machine {0} (x86-64 only)")]
    Architecture(u16),
    #[error("malformed call frame information: {0}")]
    Cfi(#[from] gimli::Error),
    #[error("more than {limit} {what}: refused")]
    Limit { what: &'static str, limit: usize },
}

impl UnwindError {
    /// Whether the file broke one of the size limits (hostile or absurd, never a real binary).
    pub fn is_limit(&self) -> bool {
        match self {
            UnwindError::Limit { .. } => true,
            UnwindError::Read { source, .. } | UnwindError::Elf(source) => source.is_limit(),
            _ => false,
        }
    }
}

impl UnwindTable {
    /// Reads and builds the table of the ELF file at `path` (a /proc/PID/map_files/… path for
    /// a mapped file: it reaches the mapped file itself). Only a regular file is opened, without
    /// blocking, and it is read with pread: a file truncated meanwhile gives an error.
    pub fn from_path(path: &Path) -> Result<Self, UnwindError> {
        let read = |source: ElfError| UnwindError::Read { path: path.display().to_string(), source };
        let file = open_regular(path).map_err(|e| read(e.into()))?;
        Self::from_file(&file).map_err(|e| match e {
            UnwindError::Elf(source) => read(source),
            e => e,
        })
    }

    /// Builds the table of an open ELF file.
    pub fn from_file(file: &File) -> Result<Self, UnwindError> {
        build::from_elf(&ElfFile::parse(file)?)
    }

    /// Builds the table from the bytes of an ELF file.
    pub fn from_elf(data: &[u8]) -> Result<Self, UnwindError> {
        build::from_elf(&ElfFile::parse(data)?)
    }

    /// The rule for `pc`, if a row covers it.
    pub fn lookup(&self, pc: u64) -> Option<UnwindRule> {
        let i = self.rows.partition_point(|r| r.pc <= pc);
        i.checked_sub(1).map(|i| self.rows[i].rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_bias_of_pie_and_non_pie_mappings() {
        // A PIE's text segment: file offset 0x1000 at vaddr 0x1000, mapped at 0x5555_5555_5000.
        let pie = [LoadSegment { file_offset: 0, vaddr: 0, file_size: 0x1000 }, LoadSegment { file_offset: 0x1000, vaddr: 0x1000, file_size: 0x2000 }];
        assert_eq!(load_bias(&pie, 0x5555_5555_5000, 0x1000), Some(0x5555_5555_4000));
        // A non-PIE executable maps at its link address: no bias.
        let exe = [LoadSegment { file_offset: 0x1000, vaddr: 0x401000, file_size: 0x5000 }];
        assert_eq!(load_bias(&exe, 0x401000, 0x1000), Some(0));
        assert_eq!(load_bias(&exe, 0x401000, 0x9000), None);
        // OpenBLAS: text at offset 0x288800, vaddr 0x289800, mapped from offset 0x288000, which
        // the read-only segment before it also covers.
        let blas = [LoadSegment { file_offset: 0, vaddr: 0, file_size: 0x2887dc }, LoadSegment { file_offset: 0x288800, vaddr: 0x289800, file_size: 0x133fe70 }];
        assert_eq!(load_bias(&blas, 0x7f00_0028_8000, 0x288000), Some(0x7f00_0028_8000 - 0x289000));
    }
}
