//! The unwind table of one executable file and the load segments that relate its addresses to a
//! process's; built from the file's CFI in `build`.

use crate::rule_table::RuleTable;
use crate::error::UnwindError;
use crate::rule::UnwindRule;

/// One row: from `pc` up to the next row's `pc`, `rule` applies. `pc` is a virtual address of
/// the ELF file (as in its program headers and symbol table, before load bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u64,
    pub rule: UnwindRule,
}

/// The unwind rows of one executable file, sorted by `pc`, with consecutive duplicates merged.
#[derive(Debug, Clone, Default)]
pub struct UnwindTable {
    pub(crate) rows: PackedRows,
    /// The file's loadable segments, to turn runtime addresses into file addresses.
    pub segments: Vec<LoadSegment>,
    pub stats: TableStats,
}

/// Rows as they are built and kept: an address relative to `base` and the index of its rule
/// among the file's own rules, 6 bytes a row. Held as [`UnwindRow`]s (24 bytes), libtorch_cpu.so's
/// 2.66M rows took 64 MiB of the 99 MiB its build peaked at; the compact form that goes to BPF
/// was then made from them, a copy more.
#[derive(Debug, Clone, Default)]
pub(crate) struct PackedRows {
    pub(crate) base: u64,
    pub(crate) pcs: Vec<u32>,
    pub(crate) ids: Vec<u16>,
    pub(crate) rules: RuleTable,
}

impl PackedRows {
    /// Rows at `base` or after it.
    #[cfg(test)]
    pub(crate) fn new(base: u64) -> Self {
        PackedRows { base, ..Default::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.pcs.len()
    }

    pub(crate) fn get(&self, i: usize) -> Option<UnwindRow> {
        let (&pc, &id) = (self.pcs.get(i)?, self.ids.get(i)?);
        Some(UnwindRow { pc: self.base + u64::from(pc), rule: self.rules.get(id)? })
    }

    /// The index of the first row after `pc`.
    pub(crate) fn after(&self, pc: u64) -> usize {
        match pc.checked_sub(self.base) {
            None => 0,
            Some(rel) => self.pcs.partition_point(|&p| u64::from(p) <= rel),
        }
    }

    pub(crate) fn pack(&mut self, row: UnwindRow) -> Result<(u32, u16), UnwindError> {
        let pc = row.pc.checked_sub(self.base).and_then(|p| u32::try_from(p).ok()).ok_or(UnwindError::TooLarge)?;
        Ok((pc, self.rules.intern(row.rule).ok_or(UnwindError::RulesFull)?))
    }

    #[cfg(test)]
    pub(crate) fn push(&mut self, row: UnwindRow) -> Result<(), UnwindError> {
        let (pc, id) = self.pack(row)?;
        self.pcs.push(pc);
        self.ids.push(id);
        Ok(())
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.pcs.shrink_to_fit();
        self.ids.shrink_to_fit();
    }
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
    /// Functions without CFI given rows from their prologues (prologue.rs).
    pub synthesized_functions: usize,
}

impl UnwindTable {
    /// The rule for `pc`, if a row covers it.
    pub fn lookup(&self, pc: u64) -> Option<UnwindRule> {
        self.rows.after(pc).checked_sub(1).and_then(|i| self.rows.get(i)).map(|r| r.rule)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.len() == 0
    }

    /// The rows in address order.
    pub fn rows(&self) -> impl Iterator<Item = UnwindRow> + '_ {
        (0..self.rows.len()).filter_map(|i| self.rows.get(i))
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
