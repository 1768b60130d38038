//! What BPF holds to unwind one process, read back from the maps: its mappings, the rows of its
//! tables and its interpreter's eval loop. User space unwinds the stacks BPF copied with exactly
//! this (and checks the BPF walk with it), so that both walks see the same tables.

use std::collections::HashMap;

use gpuflame_unwind::{CfaRule, CodeAt, RbpRule, UnwindRule};
use libbpf_rs::{MapCore, MapFlags};

use crate::pod::read_pod;
use crate::programs::BpfPrograms;
use crate::skel::types;
use crate::unwind_maps::{BLOCKS_PER_SHARD, ROWS_PER_BLOCK};

/// One process's unwind state in the maps, read when made; rows are read as the walk needs
/// them, and kept for the view's life.
pub struct ProcessUnwindView<'a> {
    programs: &'a BpfPrograms,
    mappings: Vec<types::exec_mapping>,
    tables: HashMap<u32, Option<types::table_info>>,
    blocks: HashMap<u32, Option<types::unwind_block>>,
    rules: HashMap<u16, Option<UnwindRule>>,
}

/// The evaluation loop of a Python process, as the walker knows it (pyframes' splicing rule).
pub use gpuflame_pyframes::PythonEval;

impl BpfPrograms {
    /// The unwind state BPF has for `pid`, or None when it has none.
    pub fn unwind_view(&self, pid: u32) -> Option<ProcessUnwindView<'_>> {
        let bytes = self.skel().maps.processes.lookup(&pid.to_ne_bytes(), MapFlags::ANY).ok()??;
        let info: types::process_info = read_pod(&bytes)?;
        let n = (info.mapping_count as usize).min(info.mappings.len());
        Some(ProcessUnwindView { programs: self, mappings: info.mappings[..n].to_vec(), tables: HashMap::new(), blocks: HashMap::new(), rules: HashMap::new() })
    }

    /// The evaluation loop of `pid` as the Python walker has it, when it walks the process.
    pub fn python_eval(&self, pid: u32) -> Option<PythonEval> {
        let bytes = self.skel().maps.python_processes.lookup(&pid.to_ne_bytes(), MapFlags::ANY).ok()??;
        let p: types::py_process = read_pod(&bytes)?;
        let ranges = p.eval_lo.iter().zip(p.eval_hi.iter()).filter(|(lo, hi)| lo < hi).map(|(&lo, &hi)| (lo, hi)).collect();
        Some(PythonEval { ranges, by_shim: p.o.eval_by_shim != 0 })
    }
}

impl ProcessUnwindView<'_> {
    /// What the unwinder finds at `ip` (at `ip - 1` for a return address): unwind_one's lookups.
    pub fn code_at(&mut self, ip: u64, adjust: bool) -> CodeAt {
        let i = self.mappings.partition_point(|m| m.begin <= ip);
        let Some(m) = i.checked_sub(1).map(|i| self.mappings[i]).filter(|m| ip < m.end) else { return CodeAt::NoMapping };
        if m.flags & types::exec_mapping_flags::MAPPING_TABLE_PENDING.0 != 0 {
            return CodeAt::Pending;
        }
        if m.flags & types::exec_mapping_flags::MAPPING_HAS_TABLE.0 == 0 {
            return CodeAt::NoRow;
        }
        let pc = ip.wrapping_sub(u64::from(adjust)).wrapping_sub(m.load_bias);
        self.rule(m.table_id, pc).map_or(CodeAt::NoRow, CodeAt::Rule)
    }

    fn table(&mut self, id: u32) -> Option<types::table_info> {
        let maps = &self.programs.skel().maps;
        *self.tables.entry(id).or_insert_with(|| read_pod(&maps.unwind_tables.lookup(&id.to_ne_bytes(), MapFlags::ANY).ok()??))
    }

    /// Block `i` of the table whose pages start at `first_page` (table_block, lookup_block).
    fn block(&mut self, first_page: u32, i: u32) -> Option<types::unwind_block> {
        let maps = &self.programs.skel().maps;
        let per_page = types::shard_layout::PAGE_BLOCKS.0;
        let slot = first_page + i / per_page;
        let page = u32::from_ne_bytes(maps.page_index.lookup(&slot.to_ne_bytes(), MapFlags::ANY).ok()??.get(..4)?.try_into().ok()?);
        let key = page * per_page + i % per_page;
        let programs = self.programs;
        *self.blocks.entry(key).or_insert_with(|| {
            let shard = programs.unwind_shard(key / BLOCKS_PER_SHARD)?;
            let index = key % BLOCKS_PER_SHARD;
            read_pod(&shard.lookup(&index.to_ne_bytes(), MapFlags::ANY).ok()??)
        })
    }

    /// find_rule: the last block starting at or before pc, its last row at or before pc.
    fn rule(&mut self, table_id: u32, elf_pc: u64) -> Option<UnwindRule> {
        let t = self.table(table_id)?;
        if t.block_count == 0 || elf_pc < t.base || elf_pc - t.base > 0xffff_fffe {
            return None;
        }
        let rel = (elf_pc - t.base) as u32;
        let (mut lo, mut hi) = (0u32, t.block_count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.block(t.first_page, mid)?.pc[0] <= rel {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let block = self.block(t.first_page, lo.checked_sub(1)?)?;
        let row = (1..ROWS_PER_BLOCK).take_while(|&r| block.pc[r] <= rel).last().unwrap_or(0);
        self.rule_of(block.rule[row])
    }

    fn rule_of(&mut self, index: u16) -> Option<UnwindRule> {
        let maps = &self.programs.skel().maps;
        *self.rules.entry(index).or_insert_with(|| {
            let bytes = maps.unwind_rules.lookup(&u32::from(index).to_ne_bytes(), MapFlags::ANY).ok()??;
            Some(rule_of_value(read_pod(&bytes)?))
        })
    }
}

/// The rule as BPF reads it (the inverse of what `rule_value` writes).
fn rule_of_value(v: types::unwind_rule) -> UnwindRule {
    use types::{cfa_kind as c, rbp_kind as r};
    let cfa = match u32::from(v.cfa_kind) {
        k if k == c::CFA_NO_INFO.0 => CfaRule::NoInfo,
        k if k == c::CFA_RSP_OFFSET.0 => CfaRule::RspOffset(v.cfa_offset),
        k if k == c::CFA_RBP_OFFSET.0 => CfaRule::RbpOffset(v.cfa_offset),
        k if k == c::CFA_PLT.0 => CfaRule::Plt { threshold: v.rbp_offset as u8 },
        k if k == c::CFA_DEREF_RBP.0 => CfaRule::DerefRbp(v.cfa_offset),
        k if k == c::CFA_DEREF_RSP.0 => CfaRule::DerefRsp { slot: v.cfa_offset as u16, addend: (v.cfa_offset >> 16) as i16 },
        k if k == c::CFA_END_OF_STACK.0 => CfaRule::EndOfStack,
        _ => CfaRule::Unsupported,
    };
    let rbp = match u32::from(v.rbp_kind) {
        k if k == r::RBP_UNCHANGED.0 => RbpRule::Unchanged,
        k if k == r::RBP_CFA_OFFSET.0 => RbpRule::CfaOffset(i32::from(v.rbp_offset)),
        k if k == r::RBP_AT_RBP.0 => RbpRule::AtRbp(i32::from(v.rbp_offset)),
        _ => RbpRule::Unsupported,
    };
    UnwindRule { cfa, rbp }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind_maps::rule_value;

    /// What user space writes for each kind of rule reads back as the same rule: the BPF walk and
    /// the checking walk (`--check-unwinder`) follow one rule.
    #[test]
    fn rules_read_back_as_written() {
        let saved = RbpRule::CfaOffset(-0x40);
        for rule in [
            UnwindRule { cfa: CfaRule::RspOffset(0x48), rbp: saved },
            UnwindRule { cfa: CfaRule::RbpOffset(16), rbp: RbpRule::CfaOffset(-16) },
            UnwindRule { cfa: CfaRule::DerefRbp(-8), rbp: RbpRule::AtRbp(0) },
            UnwindRule { cfa: CfaRule::DerefRsp { slot: 0x98, addend: 0x48 }, rbp: saved },
            UnwindRule { cfa: CfaRule::DerefRsp { slot: 0xfff8, addend: -8 }, rbp: RbpRule::Unchanged },
            UnwindRule { cfa: CfaRule::Plt { threshold: 11 }, rbp: RbpRule::Unchanged },
            UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged },
        ] {
            assert_eq!(rule_of_value(rule_value(rule)), rule);
        }
    }
}
