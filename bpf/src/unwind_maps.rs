//! The unwind maps seen from user space: rules and tables of rows (each process's executable
//! mappings and Python interpreter: `process_maps.rs`). Only these modules know how they are laid
//! out.

use std::collections::HashMap;

use gpuflame_pyframes::PyOffsets;
use std::os::fd::{AsFd, AsRawFd};

use gpuflame_unwind::{CfaRule, CompactTable, RbpRule, RuleTable, UnwindRule};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapMut, MapType};

use crate::blocks::BlockAllocator;
use crate::pod::as_bytes;
use crate::skel::types;
use crate::error::BpfError;

/// Rows per block (ROWS_PER_BLOCK in events.h).
pub(crate) const ROWS_PER_BLOCK: usize = 16;
/// Blocks per shard: 1M rows, 6 MiB of kernel memory.
pub(crate) const BLOCKS_PER_SHARD: u32 = types::shard_layout::SHARD_BLOCKS.0;
const MAX_SHARDS: u32 = types::shard_layout::SHARD_MAX.0;
pub(crate) const MAX_PROCESS_MAPPINGS: usize = 1024;
const MAX_TABLES: u32 = 16384;

/// A table loaded into BPF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TableId(pub(crate) u32);

/// A table whose rows are being written, not yet visible to BPF; finished or aborted by the
/// sampler.
#[derive(Debug)]
pub struct PendingTable {
    id: u32,
    base: u64,
    first_slot: u32,
    pages: Vec<u32>,
    rows: usize,
}

impl PendingTable {
    /// Rows written so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows of the budget it holds (whole pages).
    pub fn budget_rows(&self) -> u64 {
        (self.pages.len() * PAGE_ROWS) as u64
    }
}

/// Page-index entries a table may take: twice the 16M rows a file may have (elfread's
/// MAX_UNWIND_ROWS; its gaps add rows), in pages of 4,096 rows.
const MAX_TABLE_PAGES: u32 = 8192;

/// An executable mapping of a process, as the unwinder needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecMapping {
    pub begin: u64,
    pub end: u64,
    /// Runtime address minus the ELF file's virtual address.
    pub load_bias: u64,
    pub table: MappingTable,
}

/// What the unwinder has for a mapping's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MappingTable {
    Loaded(TableId),
    /// The file has unwind information that is not loaded: a sample that meets it asks for it.
    Pending,
    /// No unwind information (anonymous code, JIT, a file without CFI): the caller is found by
    /// frame pointer or stack scan.
    None,
}

/// Where a process's CPython interpreter is, for the Python walker.
#[derive(Debug, Clone)]
pub struct PythonProcess {
    pub runtime: u64,
    /// `_PyEval_EvalFrameDefault` and its cold part.
    pub eval_ranges: Vec<(u64, u64)>,
    /// None's address (3.13+; 0 when unknown), which the shim frame of each eval-loop call holds.
    pub none_addr: u64,
    pub offsets: PyOffsets,
}

/// How full the unwind maps are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindCapacity {
    pub rows_used: u64,
    /// Rows the memory budget allows.
    pub rows_total: u64,
    /// Kernel memory of the shards created so far, in bytes.
    pub shard_bytes: u64,
    pub tables: u32,
    pub rules: u32,
}

/// Blocks per page: tables take whole pages, listed in `page_index`.
const BLOCKS_PER_PAGE: u32 = types::shard_layout::PAGE_BLOCKS.0;
/// Rows per page: 4,096.
const PAGE_ROWS: usize = ROWS_PER_BLOCK * BLOCKS_PER_PAGE as usize;
const PAGE_INDEX_SIZE: u32 = types::shard_layout::PAGE_INDEX_SIZE.0;

pub(crate) struct UnwindMaps {
    /// Pages free for tables, lowest last, so that low pages (and so few shards) are used first.
    free_pages: Vec<u32>,
    capacity_pages: u32,
    /// Ranges of `page_index` entries.
    slots: BlockAllocator,
    /// The inner maps of `unwind_shards`, created as allocations reach them.
    shards: Vec<MapHandle>,
    /// Table id → its first `page_index` entry and its pages.
    tables: HashMap<u32, (u32, Vec<u32>)>,
    free_ids: Vec<u32>,
    next_id: u32,
    rules_loaded: usize,
}

pub(crate) fn map_err(map: &'static str) -> impl Fn(libbpf_rs::Error) -> BpfError {
    move |source| BpfError::Map { map, source }
}

/// CFA_DEREF_RSP's two numbers in its one field (events.h): the slot low, the addend high.
fn deref_rsp_offset(slot: u16, addend: i16) -> i32 {
    (i32::from(addend) << 16) | i32::from(slot)
}

pub(crate) fn rule_value(rule: UnwindRule) -> types::unwind_rule {
    let (cfa_kind, cfa_offset, mut rbp_offset) = match rule.cfa {
        CfaRule::NoInfo => (types::cfa_kind::CFA_NO_INFO, 0, 0),
        CfaRule::RspOffset(o) => (types::cfa_kind::CFA_RSP_OFFSET, o, 0),
        CfaRule::RbpOffset(o) => (types::cfa_kind::CFA_RBP_OFFSET, o, 0),
        CfaRule::Plt { threshold } => (types::cfa_kind::CFA_PLT, 0, i16::from(threshold)),
        CfaRule::DerefRbp(o) => (types::cfa_kind::CFA_DEREF_RBP, o, 0),
        CfaRule::DerefRsp { slot, addend } => (types::cfa_kind::CFA_DEREF_RSP, deref_rsp_offset(slot, addend), 0),
        CfaRule::EndOfStack => (types::cfa_kind::CFA_END_OF_STACK, 0, 0),
        CfaRule::Unsupported => (types::cfa_kind::CFA_UNSUPPORTED, 0, 0),
    };
    let rbp_kind = match rule.rbp {
        RbpRule::Unchanged => types::rbp_kind::RBP_UNCHANGED,
        RbpRule::CfaOffset(o) => match i16::try_from(o) {
            Ok(o) if !matches!(rule.cfa, CfaRule::Plt { .. }) => {
                rbp_offset = o;
                types::rbp_kind::RBP_CFA_OFFSET
            }
            _ => types::rbp_kind::RBP_UNSUPPORTED,
        },
        RbpRule::AtRbp(o) => match i16::try_from(o) {
            Ok(o) if !matches!(rule.cfa, CfaRule::Plt { .. }) => {
                rbp_offset = o;
                types::rbp_kind::RBP_AT_RBP
            }
            _ => types::rbp_kind::RBP_UNSUPPORTED,
        },
        RbpRule::Unsupported => types::rbp_kind::RBP_UNSUPPORTED,
    };
    types::unwind_rule { cfa_kind: cfa_kind.0 as u8, rbp_kind: rbp_kind.0 as u8, rbp_offset, cfa_offset }
}

impl UnwindMaps {
    pub(crate) fn new(block_capacity: u32) -> Self {
        let capacity_pages = (block_capacity.min(MAX_SHARDS * BLOCKS_PER_SHARD) / BLOCKS_PER_PAGE).max(1);
        UnwindMaps {
            free_pages: (0..capacity_pages).rev().collect(),
            capacity_pages,
            slots: BlockAllocator::new(PAGE_INDEX_SIZE),
            shards: Vec::new(),
            tables: HashMap::new(),
            free_ids: Vec::new(),
            next_id: 0,
            rules_loaded: 0,
        }
    }

    /// Creates the shards up to the one that holds block `last`.
    fn ensure_shards(&mut self, outer: &MapMut<'_>, last: u32) -> Result<(), BpfError> {
        let block_bytes = std::mem::size_of::<types::unwind_block>() as u32;
        while self.shards.len() as u32 <= last / BLOCKS_PER_SHARD {
            let index = self.shards.len() as u32;
            let opts = libbpf_sys::bpf_map_create_opts { sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _, ..Default::default() };
            let shard = MapHandle::create(MapType::Array, Some(format!("unwind_shard{index}")), 4, block_bytes, BLOCKS_PER_SHARD, &opts)
                .map_err(map_err("unwind_shards"))?;
            let fd = shard.as_fd().as_raw_fd() as u32;
            outer.update(&index.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).map_err(map_err("unwind_shards"))?;
            self.shards.push(shard);
        }
        Ok(())
    }

    /// Writes a table's blocks into its pages (a page never spans shards).
    /// Writes the table's rows into `pages`, a page's blocks at a time: the blocks of a whole
    /// table were a copy of all its rows (16 MiB for libtorch_cpu.so) beside the table itself.
    fn write_pages(&self, pages: &[u32], table: &CompactTable) -> Result<(), BpfError> {
        for (&page, (pcs, rules)) in pages.iter().zip(table.pcs.chunks(PAGE_ROWS).zip(table.rules.chunks(PAGE_ROWS))) {
            let chunk: Vec<types::unwind_block> = pcs
                .chunks(ROWS_PER_BLOCK)
                .zip(rules.chunks(ROWS_PER_BLOCK))
                .map(|(pcs, rules)| {
                    let mut block = types::unwind_block { pc: [u32::MAX; ROWS_PER_BLOCK], rule: [0; ROWS_PER_BLOCK] };
                    block.pc[..pcs.len()].copy_from_slice(pcs);
                    block.rule[..rules.len()].copy_from_slice(rules);
                    block
                })
                .collect();
            let chunk = &chunk[..];
            let first = page * BLOCKS_PER_PAGE;
            let shard = &self.shards[(first / BLOCKS_PER_SHARD) as usize];
            let mut keys = Vec::with_capacity(chunk.len() * 4);
            let mut values = Vec::with_capacity(std::mem::size_of_val(chunk));
            for (i, block) in chunk.iter().enumerate() {
                keys.extend_from_slice(&((first % BLOCKS_PER_SHARD) + i as u32).to_ne_bytes());
                values.extend_from_slice(as_bytes(block));
            }
            shard.update_batch(&keys, &values, chunk.len() as u32, MapFlags::ANY, MapFlags::ANY).map_err(map_err("unwind_shards"))?;
        }
        Ok(())
    }

    pub(crate) fn load_rules(&mut self, map: &MapMut<'_>, rules: &RuleTable) -> Result<(), BpfError> {
        for (i, rule) in rules.since(self.rules_loaded) {
            map.update(&u32::from(i).to_ne_bytes(), as_bytes(&rule_value(rule)), MapFlags::ANY).map_err(map_err("unwind_rules"))?;
        }
        self.rules_loaded = rules.len();
        Ok(())
    }

    pub(crate) fn insert_table(&mut self, shards_map: &MapMut<'_>, index_map: &MapMut<'_>, tables_map: &MapMut<'_>, table: &CompactTable, in_use: bool) -> Result<TableId, BpfError> {
        let mut pending = self.begin_table(table.base)?;
        if let Err(e) = self.add_rows(shards_map, &mut pending, table) {
            self.abort_table(pending);
            return Err(e);
        }
        self.finish_table(index_map, tables_map, pending, in_use)
    }

    fn pages_for(rows: usize) -> usize {
        rows.div_ceil(PAGE_ROWS)
    }

    /// Starts a table whose rows come in pieces ([`Self::add_rows`]): its id and a range of the
    /// page index as long as the longest table can be, the unused end given back when it is
    /// finished. Nothing is visible to BPF until then.
    pub(crate) fn begin_table(&mut self, base: u64) -> Result<PendingTable, BpfError> {
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None if self.next_id < MAX_TABLES => {
                self.next_id += 1;
                self.next_id - 1
            }
            None => return Err(BpfError::UnwindFull(format!("all {MAX_TABLES} table slots are in use"))),
        };
        let Some(first_slot) = self.slots.alloc(MAX_TABLE_PAGES) else {
            self.free_ids.push(id);
            return Err(BpfError::UnwindFull("the page index is full".into()));
        };
        Ok(PendingTable { id, base, first_slot, pages: Vec::new(), rows: 0 })
    }

    /// Writes the next rows of a pending table into pages of their own. Every piece but the last
    /// must fill whole pages. A full budget is an error that leaves the table as it was.
    pub(crate) fn add_rows(&mut self, shards_map: &MapMut<'_>, pending: &mut PendingTable, rows: &CompactTable) -> Result<(), BpfError> {
        if rows.base != pending.base || pending.rows % PAGE_ROWS != 0 {
            return Err(BpfError::UnwindFull("a table's rows came in pieces that do not fill whole pages".into()));
        }
        let count = Self::pages_for(rows.len());
        if pending.pages.len() + count > MAX_TABLE_PAGES as usize {
            return Err(BpfError::UnwindFull(format!("a table of more than {} rows", MAX_TABLE_PAGES as usize * PAGE_ROWS)));
        }
        if count > self.free_pages.len() {
            let (free, total) = (self.free_pages.len() * PAGE_ROWS, self.capacity_pages as usize * PAGE_ROWS);
            return Err(BpfError::UnwindFull(format!("{} rows do not fit: {free} of {total} rows free", rows.len())));
        }
        let pages: Vec<u32> = (0..count).filter_map(|_| self.free_pages.pop()).collect();
        let last_block = pages.iter().max().map_or(0, |&p| p * BLOCKS_PER_PAGE + BLOCKS_PER_PAGE - 1);
        if let Err(e) = self.ensure_shards(shards_map, last_block).and_then(|()| self.write_pages(&pages, rows)) {
            self.free_pages.extend(pages);
            return Err(e);
        }
        pending.pages.extend(pages);
        pending.rows += rows.len();
        Ok(())
    }

    /// Makes a pending table visible to BPF: its pages in the page index, then its entry.
    pub(crate) fn finish_table(&mut self, index_map: &MapMut<'_>, tables_map: &MapMut<'_>, pending: PendingTable, in_use: bool) -> Result<TableId, BpfError> {
        let page_count = pending.pages.len() as u32;
        let mut written = Ok(());
        if page_count > 0 {
            let keys: Vec<u8> = (0..page_count).flat_map(|i| (pending.first_slot + i).to_ne_bytes()).collect();
            let values: Vec<u8> = pending.pages.iter().flat_map(|p| p.to_ne_bytes()).collect();
            written = index_map.update_batch(&keys, &values, page_count, MapFlags::ANY, MapFlags::ANY).map_err(map_err("page_index"));
        }
        // A table a sample asked for counts as used now: with 0 it was the least recently used
        // of all until a sample reached it, and the next table asked for evicted it first (a
        // process started beside a table hog never kept libc's).
        let last_used = if in_use { monotonic_ns() } else { 0 };
        let block_count = pending.rows.div_ceil(ROWS_PER_BLOCK) as u32;
        let info = types::table_info { base: pending.base, first_page: pending.first_slot, block_count, last_used };
        let written = written.and_then(|()| tables_map.update(&pending.id.to_ne_bytes(), as_bytes(&info), MapFlags::ANY).map_err(map_err("unwind_tables")));
        if let Err(e) = written {
            self.abort_table(pending);
            return Err(e);
        }
        self.slots.release(pending.first_slot + page_count, MAX_TABLE_PAGES - page_count);
        self.tables.insert(pending.id, (pending.first_slot, pending.pages));
        Ok(TableId(pending.id))
    }

    pub(crate) fn shard(&self, index: u32) -> Option<&MapHandle> {
        self.shards.get(index as usize)
    }

    /// Gives back what a pending table took.
    pub(crate) fn abort_table(&mut self, pending: PendingTable) {
        self.slots.release(pending.first_slot, MAX_TABLE_PAGES);
        self.free_pages.extend(pending.pages);
        self.free_ids.push(pending.id);
    }

    /// When a sample last used the table (boot-time ns, to the second), or 0.
    pub(crate) fn last_used(tables_map: &MapMut<'_>, id: TableId) -> u64 {
        let Ok(Some(bytes)) = tables_map.lookup(&id.0.to_ne_bytes(), MapFlags::ANY) else { return 0 };
        crate::pod::read_pod::<types::table_info>(&bytes).map_or(0, |t| t.last_used)
    }

    /// Rows of budget a loaded table takes (whole pages).
    pub(crate) fn table_rows(&self, id: TableId) -> u64 {
        self.tables.get(&id.0).map_or(0, |(_, pages)| (pages.len() * PAGE_ROWS) as u64)
    }

    /// Whether a table of `rows` rows could fit if nothing else were loaded.
    pub(crate) fn could_fit(&self, rows: usize) -> bool {
        Self::pages_for(rows) <= self.capacity_pages as usize
    }

    pub(crate) fn remove_table(&mut self, tables_map: &MapMut<'_>, id: TableId) -> Result<(), BpfError> {
        let Some((first_slot, pages)) = self.tables.remove(&id.0) else { return Ok(()) };
        // An empty entry first, so no sample reads blocks that are being reused.
        let empty = types::table_info::default();
        tables_map.update(&id.0.to_ne_bytes(), as_bytes(&empty), MapFlags::ANY).map_err(map_err("unwind_tables"))?;
        self.slots.release(first_slot, pages.len() as u32);
        self.free_pages.extend(pages);
        self.free_ids.push(id.0);
        Ok(())
    }

    pub(crate) fn capacity(&self) -> UnwindCapacity {
        let page_rows = PAGE_ROWS as u64;
        let used = u64::from(self.capacity_pages) - self.free_pages.len() as u64;
        let shard_bytes = self.shards.len() as u64 * u64::from(BLOCKS_PER_SHARD) * std::mem::size_of::<types::unwind_block>() as u64;
        UnwindCapacity {
            rows_used: used * page_rows,
            rows_total: u64::from(self.capacity_pages) * page_rows,
            shard_bytes,
            tables: self.tables.len() as u32,
            rules: self.rules_loaded as u32,
        }
    }
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns(), which stamps the tables' use.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_encode_as_the_c_side_reads_them() {
        let r = rule_value(UnwindRule { cfa: CfaRule::RspOffset(24), rbp: RbpRule::CfaOffset(-16) });
        assert_eq!((r.cfa_kind, r.cfa_offset, r.rbp_kind, r.rbp_offset), (1, 24, 1, -16));
        let plt = rule_value(UnwindRule { cfa: CfaRule::Plt { threshold: 11 }, rbp: RbpRule::Unchanged });
        assert_eq!((plt.cfa_kind, plt.rbp_offset, plt.rbp_kind), (3, 11, 0));
        let end = rule_value(UnwindRule { cfa: CfaRule::EndOfStack, rbp: RbpRule::Unchanged });
        assert_eq!(end.cfa_kind, 5);
    }
}
