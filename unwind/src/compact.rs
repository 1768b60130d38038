//! The compact form of unwind tables that goes to BPF: per row a 32-bit address (relative to the
//! table's base) and a 16-bit index into the rule table shared by all executables.

pub use crate::rule_table::RuleTable;
use crate::stream::TablePiece;
use crate::table::UnwindTable;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompactError {
    #[error("the shared rule table is full ({} rules)", RuleTable::CAPACITY)]
    RulesFull,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactTable {
    /// ELF virtual address that `pcs` are relative to.
    pub base: u64,
    pub pcs: Vec<u32>,
    pub rules: Vec<u16>,
}

impl CompactTable {
    /// The table's rows with their rules in `shared`: the table's own packed rows, moved, their
    /// rule indices renumbered in place (no copy of a file's rows is made).
    pub fn from_table(table: UnwindTable, shared: &mut RuleTable) -> Result<Self, CompactError> {
        let rows = table.rows;
        let renumber = renumbering(&rows.rules, shared)?;
        let mut rules = rows.ids;
        for id in &mut rules {
            *id = renumber[usize::from(*id)];
        }
        Ok(CompactTable { base: rows.base, pcs: rows.pcs, rules })
    }

    /// A piece of a table being built, its rules renumbered into `shared`.
    pub fn from_piece(piece: &TablePiece<'_>, shared: &mut RuleTable) -> Result<Self, CompactError> {
        let renumber = renumbering(piece.rules, shared)?;
        let rules = piece.ids.iter().map(|&id| renumber.get(usize::from(id)).copied().ok_or(CompactError::RulesFull)).collect::<Result<Vec<u16>, _>>()?;
        Ok(CompactTable { base: piece.base, pcs: piece.pcs.to_vec(), rules })
    }

    pub fn len(&self) -> usize {
        self.pcs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pcs.is_empty()
    }

    /// Bytes of row data (the shared rule table not included).
    pub fn size_bytes(&self) -> usize {
        self.pcs.len() * 4 + self.rules.len() * 2
    }

    /// The rule index for `pc`, as the BPF unwinder finds it.
    pub fn lookup(&self, pc: u64) -> Option<u16> {
        let rel = u32::try_from(pc.checked_sub(self.base)?).ok()?;
        let i = self.pcs.partition_point(|&p| p <= rel);
        i.checked_sub(1).map(|i| self.rules[i])
    }
}

/// For each of a file's own rules, its index in `shared` (added there if new).
fn renumbering(own: &RuleTable, shared: &mut RuleTable) -> Result<Vec<u16>, CompactError> {
    own.since(0).map(|(_, rule)| shared.intern(rule).ok_or(CompactError::RulesFull)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{CfaRule, RbpRule, UnwindRule};
    use crate::table::{PackedRows, UnwindRow};

    #[test]
    fn compact_lookup_agrees_with_the_table() {
        let r = |off| UnwindRule { cfa: CfaRule::RspOffset(off), rbp: RbpRule::Unchanged };
        let mut rows = PackedRows::new(0x1000);
        for row in [UnwindRow { pc: 0x1000, rule: r(8) }, UnwindRow { pc: 0x1004, rule: r(16) }, UnwindRow { pc: 0x1100, rule: UnwindRule::NO_INFO }] {
            rows.push(row).unwrap();
        }
        let table = UnwindTable { rows, segments: Vec::new(), stats: Default::default() };
        let mut shared = RuleTable::default();
        // Rules the shared table already has keep their numbers there.
        shared.intern(UnwindRule::NO_INFO);
        let c = CompactTable::from_table(table.clone(), &mut shared).unwrap();
        assert_eq!(c.size_bytes(), 18);
        for pc in [0xfff, 0x1000, 0x1003, 0x1004, 0x10ff, 0x1100, 0x2000] {
            assert_eq!(c.lookup(pc).and_then(|i| shared.get(i)), table.lookup(pc), "pc {pc:#x}");
        }
        assert_eq!(shared.len(), 3);
    }
}
