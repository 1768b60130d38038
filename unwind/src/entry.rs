//! The code at a file's entry point is the outermost frame of every stack that reaches it.
//!
//! The ABI says so with `DW_CFA_undefined rip`, and a program's own `_start` (crt1.o) carries that
//! CFI ([`CfaRule::EndOfStack`] from `rule.rs`). The dynamic loader's `_start` and
//! `_dl_start_user` (glibc's `RTLD_START`, hand-written assembly) have no CFI at all: the kernel
//! jumps there with the stack holding argc, argv and the environment, and no return address. Left
//! as a gap, the unwinder took it for code whose caller it could not find, and every sample of a
//! program before `main` (most of a short command's life) ended `[native: no unwind info]` just
//! where it was whole.

use crate::error::UnwindError;
use crate::rule::{CfaRule, RbpRule, UnwindRule};
use crate::table::UnwindRow;

/// How far past the entry point code without CFI counts as entry code: `RTLD_START` is 61 bytes
/// on x86-64 (glibc 2.36), and a gap that goes on much further holds other code without CFI,
/// whose callers must still be searched for.
pub(crate) const ENTRY_CODE_MAX: u64 = 256;

const OUTERMOST: UnwindRule = UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged };

/// Marks the code at `entry` (`e_entry`) outermost when no CFI describes it, up to the next row
/// or [`ENTRY_CODE_MAX`] bytes, as the table's final rows pass through it in address order (a
/// table is never held whole to be marked). A file without rows, or without an entry point (a
/// shared library), is left alone.
pub(crate) struct EntryMarker {
    entry: u64,
    /// The last row at or below the entry, held back: a gap that starts at the entry itself
    /// gives its row to the entry's.
    before: Option<UnwindRow>,
    any: bool,
    done: bool,
    pub(crate) marked: bool,
}

impl EntryMarker {
    pub(crate) fn new(entry: u64) -> Self {
        EntryMarker { entry, before: None, any: false, done: entry == 0, marked: false }
    }

    /// Passes `row` (the next in address order) on to `out`, with the entry's rows before it
    /// when it is the first past the entry.
    pub(crate) fn pass(&mut self, row: UnwindRow, out: &mut dyn FnMut(UnwindRow) -> Result<(), UnwindError>) -> Result<(), UnwindError> {
        if self.done {
            return out(row);
        }
        self.any = true;
        if row.pc <= self.entry {
            if let Some(b) = self.before.replace(row) {
                out(b)?;
            }
            return Ok(());
        }
        self.resolve(Some(row.pc), out)?;
        out(row)
    }

    /// After the last row.
    pub(crate) fn finish(&mut self, out: &mut dyn FnMut(UnwindRow) -> Result<(), UnwindError>) -> Result<(), UnwindError> {
        if self.done || !self.any {
            self.done = true;
            return Ok(());
        }
        self.resolve(None, out)
    }

    fn resolve(&mut self, next: Option<u64>, out: &mut dyn FnMut(UnwindRow) -> Result<(), UnwindError>) -> Result<(), UnwindError> {
        self.done = true;
        let before = self.before.take();
        // CFI describes the entry: it knows better (crt1.o's `_start` says outermost itself).
        if let Some(b) = before.filter(|b| b.rule != UnwindRule::NO_INFO) {
            return out(b);
        }
        if let Some(b) = before.filter(|b| b.pc != self.entry) {
            out(b)?;
        }
        let end = next.map_or(self.entry + ENTRY_CODE_MAX, |n| n.min(self.entry + ENTRY_CODE_MAX));
        out(UnwindRow { pc: self.entry, rule: OUTERMOST })?;
        if next != Some(end) {
            out(UnwindRow { pc: end, rule: UnwindRule::NO_INFO })?;
        }
        self.marked = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(off: i32) -> UnwindRule {
        UnwindRule { cfa: CfaRule::RspOffset(off), rbp: RbpRule::Unchanged }
    }

    fn row(pc: u64, rule: UnwindRule) -> UnwindRow {
        UnwindRow { pc, rule }
    }

    /// The marker over `rows`: whether it marked, and the rows after.
    fn marked(rows: &[UnwindRow], entry: u64) -> (bool, Vec<UnwindRow>) {
        let mut out = Vec::new();
        let mut marker = EntryMarker::new(entry);
        let mut push = |r: UnwindRow| -> Result<(), UnwindError> {
            out.push(r);
            Ok(())
        };
        for r in rows {
            marker.pass(*r, &mut push).unwrap();
        }
        marker.finish(&mut push).unwrap();
        (marker.marked, out)
    }

    /// ld.so's layout: a function, the gap holding `_start` and `_dl_start_user`, the next one.
    fn loader() -> Vec<UnwindRow> {
        vec![row(0x1a660, rsp(8)), row(0x1ab6f, UnwindRule::NO_INFO), row(0x1abb0, rsp(8)), row(0x1abf2, UnwindRule::NO_INFO)]
    }

    #[test]
    fn entry_in_a_gap_is_outermost_up_to_the_next_function() {
        let (did, rows) = marked(&loader(), 0x1ab70);
        assert!(did);
        let pcs: Vec<(u64, CfaRule)> = rows.iter().map(|r| (r.pc, r.rule.cfa)).collect();
        assert_eq!(
            pcs,
            [(0x1a660, CfaRule::RspOffset(8)), (0x1ab6f, CfaRule::NoInfo), (0x1ab70, CfaRule::EndOfStack), (0x1abb0, CfaRule::RspOffset(8)), (0x1abf2, CfaRule::NoInfo)]
        );
    }

    #[test]
    fn entry_at_the_start_of_a_gap_takes_its_row() {
        let (did, rows) = marked(&loader(), 0x1ab6f);
        assert!(did);
        assert_eq!(rows[1], row(0x1ab6f, OUTERMOST));
        assert_eq!(rows[2], row(0x1abb0, rsp(8)));
        assert_eq!(rows.len(), 4);
    }

    #[test]
    fn a_long_gap_is_outermost_only_near_the_entry() {
        let (did, rows) = marked(&[row(0x1000, rsp(8)), row(0x1010, UnwindRule::NO_INFO), row(0x9000, rsp(8))], 0x2000);
        assert!(did);
        assert_eq!(rows[2], row(0x2000, OUTERMOST));
        assert_eq!(rows[3], row(0x2000 + ENTRY_CODE_MAX, UnwindRule::NO_INFO));
        assert_eq!(rows[4], row(0x9000, rsp(8)));
        // After the last row and before the first: the same bound.
        let (did, rows) = marked(&[row(0x1000, rsp(8)), row(0x1010, UnwindRule::NO_INFO)], 0x5000);
        assert!(did);
        assert_eq!(&rows[2..], [row(0x5000, OUTERMOST), row(0x5000 + ENTRY_CODE_MAX, UnwindRule::NO_INFO)]);
        let (did, rows) = marked(&[row(0x1000, rsp(8)), row(0x1010, UnwindRule::NO_INFO)], 0xff8);
        assert!(did);
        assert_eq!(&rows[..2], [row(0xff8, OUTERMOST), row(0x1000, rsp(8))]);
    }

    #[test]
    fn cfi_at_the_entry_and_files_without_entry_or_rows_are_left_alone() {
        let crt1 = vec![row(0x23d0, OUTERMOST), row(0x23f2, UnwindRule::NO_INFO)];
        for (rows, entry) in [(loader(), 0x1a700), (crt1.clone(), 0x23d0), (loader(), 0), (Vec::new(), 0x1000)] {
            assert_eq!(marked(&rows, entry), (false, rows));
        }
    }

    /// The system's dynamic loader: its entry has no CFI, and is the root once built.
    #[test]
    fn the_loaders_start_is_outermost() {
        use gpuflame_elfread::ElfFile;
        const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
        let data = std::fs::read(LOADER).unwrap();
        let entry = ElfFile::parse(&data[..]).unwrap().entry();
        let table = crate::table::UnwindTable::from_elf(&data).unwrap();
        assert_eq!(table.lookup(entry).map(|r| r.cfa), Some(CfaRule::EndOfStack));
        // `_dl_start_user`, after the call to `_dl_start`: outermost too.
        assert_eq!(table.lookup(entry + 8).map(|r| r.cfa), Some(CfaRule::EndOfStack));
        // The function before keeps its rules.
        assert!(table.lookup(entry - 16).is_some_and(|r| r.cfa != CfaRule::EndOfStack));
    }
}
