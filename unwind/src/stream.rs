//! Where a table's rows go as the build makes them, final and in address order: merged
//! (repeats dropped, gaps marked), through the entry-code marker, into a sink that keeps them
//! whole ([`PackedRows`]) or hands them out in pieces ([`PieceSink`]).

use crate::entry::EntryMarker;
use crate::error::UnwindError;
use crate::rule::UnwindRule;
use crate::rule_table::RuleTable;
use crate::table::{LoadSegment, PackedRows, TableStats, UnwindRow};

/// A piece of a table being built: rows relative to `base`, each with the index of its rule in
/// `rules`, the file's own numbering, which grows as the build goes on.
pub struct TablePiece<'a> {
    pub base: u64,
    pub pcs: &'a [u32],
    pub ids: &'a [u16],
    pub rules: &'a RuleTable,
}

/// What a build in pieces made besides its rows.
#[derive(Debug, Clone, Default)]
pub struct TableSummary {
    pub rows: usize,
    pub segments: Vec<LoadSegment>,
    pub stats: TableStats,
}

/// Where a build's rows go, final and in address order.
pub(crate) trait RowSink {
    /// The rows to come are at `base` or after it.
    fn start(&mut self, base: u64);
    fn row(&mut self, row: UnwindRow) -> Result<(), UnwindError>;
}

impl RowSink for PackedRows {
    fn start(&mut self, base: u64) {
        self.base = base;
    }

    fn row(&mut self, row: UnwindRow) -> Result<(), UnwindError> {
        let (pc, id) = self.pack(row)?;
        self.pcs.push(pc);
        self.ids.push(id);
        Ok(())
    }
}

pub(crate) struct PieceSink<'f> {
    rows: PackedRows,
    per_piece: usize,
    total: usize,
    each: &'f mut dyn FnMut(TablePiece<'_>) -> Result<(), UnwindError>,
}

impl<'f> PieceSink<'f> {
    pub(crate) fn new(rows_per_piece: usize, each: &'f mut dyn FnMut(TablePiece<'_>) -> Result<(), UnwindError>) -> Self {
        PieceSink { rows: PackedRows::default(), per_piece: rows_per_piece.max(1), total: 0, each }
    }

    /// Rows handed out so far.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn flush(&mut self) -> Result<(), UnwindError> {
        if self.rows.len() == 0 {
            return Ok(());
        }
        self.total += self.rows.len();
        (self.each)(TablePiece { base: self.rows.base, pcs: &self.rows.pcs, ids: &self.rows.ids, rules: &self.rows.rules })?;
        self.rows.pcs.clear();
        self.rows.ids.clear();
        Ok(())
    }
}

impl RowSink for PieceSink<'_> {
    fn start(&mut self, base: u64) {
        self.rows.base = base;
        self.rows.pcs.reserve(self.per_piece.min(1 << 16));
        self.rows.ids.reserve(self.per_piece.min(1 << 16));
    }

    fn row(&mut self, row: UnwindRow) -> Result<(), UnwindError> {
        self.rows.row(row)?;
        if self.rows.len() >= self.per_piece {
            self.flush()?;
        }
        Ok(())
    }
}

/// The table as FDEs are added in address order: consecutive rows with the same rule merged, a
/// row at the same address as the one before replacing it, and the gaps between FDEs marked as
/// having no information. A row is final, and goes on to the entry marker and the sink, once a
/// row at a higher address comes.
pub(crate) struct Merged<'s> {
    /// The last row, which a row at its address may still replace.
    last: Option<UnwindRow>,
    /// The end of the last FDE added: a gap if the next one starts after it.
    pub(crate) pending_gap: Option<u64>,
    entry: EntryMarker,
    sink: &'s mut dyn RowSink,
    /// A row that could not be packed (code over 4 GiB, too many rules) or that the sink
    /// refused: the file is refused.
    error: Option<UnwindError>,
}

impl<'s> Merged<'s> {
    pub(crate) fn new(entry: EntryMarker, sink: &'s mut dyn RowSink) -> Self {
        Merged { last: None, pending_gap: None, entry, sink, error: None }
    }

    pub(crate) fn push(&mut self, row: UnwindRow) {
        if self.error.is_some() {
            return;
        }
        match self.last.as_mut() {
            Some(last) if last.pc == row.pc => last.rule = row.rule,
            Some(last) if last.rule == row.rule => {}
            _ => {
                if let Some(done) = self.last.replace(row) {
                    self.emit(done);
                }
            }
        }
    }

    fn emit(&mut self, row: UnwindRow) {
        let sink = &mut *self.sink;
        if let Err(e) = self.entry.pass(row, &mut |r| sink.row(r)) {
            self.error = Some(e);
        }
    }

    pub(crate) fn finish(&mut self) -> Result<(), UnwindError> {
        if let Some(end) = self.pending_gap.take() {
            self.push(UnwindRow { pc: end, rule: UnwindRule::NO_INFO });
        }
        if let Some(last) = self.last.take() {
            self.emit(last);
        }
        if self.error.is_none() {
            let sink = &mut *self.sink;
            if let Err(e) = self.entry.finish(&mut |r| sink.row(r)) {
                self.error = Some(e);
            }
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{CfaRule, RbpRule};

    fn rule(off: i32) -> UnwindRule {
        UnwindRule { cfa: CfaRule::RspOffset(off), rbp: RbpRule::Unchanged }
    }

    #[test]
    fn merge_marks_gaps_and_drops_repeats() {
        let mut rows = PackedRows::default();
        let mut merged = Merged::new(EntryMarker::new(0), &mut rows);
        for (pc, off) in [(0x100, 8), (0x101, 16), (0x1f0, 8)] {
            merged.push(UnwindRow { pc, rule: rule(off) });
        }
        merged.pending_gap = Some(0x200);
        // The next FDE starts where the last ended: no gap; its first row repeats the rule.
        merged.push(UnwindRow { pc: 0x200, rule: rule(8) });
        merged.pending_gap = Some(0x210);
        merged.finish().unwrap();
        let pcs: Vec<u64> = (0..rows.len()).filter_map(|i| rows.get(i)).map(|r| r.pc).collect();
        assert_eq!(pcs, [0x100, 0x101, 0x1f0, 0x210]);
        assert_eq!(rows.get(3).unwrap().rule, UnwindRule::NO_INFO);
    }
}
