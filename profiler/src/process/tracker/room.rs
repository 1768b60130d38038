//! Room for unwind tables in BPF's fixed budget: which loaded table gives way to one a sample
//! needs. Least recently used first, outside the working set; then a table of a process over
//! its fair share.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use gpuflame_bpf::{monotonic_ns, BpfError, BpfPrograms, PendingTable, TableId};
use gpuflame_unwind::CompactTable;

use gpuflame_unwind::ExecutableKey;

use super::{ProcessTracker, TableState, NO_ROOM_RETRY, WORKING_SET};

impl ProcessTracker {
    /// Puts a table into BPF; a table a sample needs evicts the least recently used ones outside
    /// the working set when the budget is full.
    pub(super) fn insert(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey, table: &CompactTable, urgent: bool) -> Option<TableId> {
        loop {
            match sampler.insert_table(table, urgent) {
                Ok(id) => return Some(id),
                Err(BpfError::UnwindFull(why)) => {
                    if !self.make_room(sampler, key, table.len(), urgent) {
                        self.no_room(sampler, key, urgent, &why);
                        return None;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot load an unwind table");
                    return None;
                }
            }
        }
    }

    /// Writes the next piece of a big table into BPF, evicting as [`Self::insert`] does. False
    /// when there is no room for it: the caller drops the table.
    pub(super) fn insert_piece(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey, pending: &mut PendingTable, rows: &CompactTable, urgent: bool) -> bool {
        loop {
            match sampler.add_table_rows(pending, rows) {
                Ok(()) => return true,
                Err(BpfError::UnwindFull(why)) => {
                    if !self.make_room(sampler, key, pending.rows() + rows.len(), urgent) {
                        self.no_room(sampler, key, urgent, &why);
                        return false;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot load an unwind table");
                    return false;
                }
            }
        }
    }

    /// Evicts a table to make room for `rows` rows of `key`'s, if one may give way: only for a
    /// table a sample needs, and only if it could fit at all. Whether one did.
    fn make_room(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey, rows: usize, urgent: bool) -> bool {
        let victim = if urgent && sampler.table_could_fit(rows) {
            self.lru_victim(sampler, key).or_else(|| self.fair_share_victim(sampler, key))
        } else {
            None
        };
        match victim {
            Some(victim) => {
                self.evict_for_room(sampler, &victim);
                true
            }
            None => false,
        }
    }

    /// Built ahead of need, a table waits for a sample to ask; asked for, it is not asked for
    /// again for a while.
    fn no_room(&mut self, sampler: &BpfPrograms, key: &ExecutableKey, urgent: bool, why: &str) {
        if urgent && tracing::enabled!(tracing::Level::DEBUG) {
            self.describe_room(sampler, key);
        }
        if let Some(exe) = self.executables.get_mut(key).filter(|_| urgent) {
            exe.retry_after = Some(Instant::now() + NO_ROOM_RETRY);
            tracing::debug!(file = %exe.name, %why, "no room for an unwind table");
            self.stats.no_room.insert(exe.name.clone());
        }
    }

    /// The loaded table used least recently, if it is outside the working set.
    fn lru_victim(&self, sampler: &BpfPrograms, except: &ExecutableKey) -> Option<ExecutableKey> {
        let now = monotonic_ns();
        self.executables
            .iter()
            .filter(|(k, _)| *k != except)
            .filter_map(|(k, e)| match e.state {
                TableState::Loaded(id) => Some((sampler.table_last_used(id), k)),
                _ => None,
            })
            .filter(|&(used, _)| now.saturating_sub(used) > WORKING_SET.as_nanos() as u64)
            .min_by_key(|&(used, _)| used)
            .map(|(_, k)| k.clone())
    }

    /// With the whole budget in the working set: a table of a process that holds more than its
    /// share of the budget (the budget over the processes holding tables; a table mapped by
    /// several processes counts for each in part), when none of the asking file's processes
    /// within their share uses it. So a process cannot keep others' tables out by mapping and
    /// running more code than fits, and a process over its share never evicts another's working
    /// set: it can only wait for its own tables to age. A file that both map (libc) is asked for
    /// on behalf of the one within its share: the other mapping it too does not shield that one's
    /// tables (it did, and a process started beside a table hog never got libc's table).
    fn fair_share_victim(&self, sampler: &BpfPrograms, asking: &ExecutableKey) -> Option<ExecutableKey> {
        let askers = &self.executables.get(asking)?.users;
        let mut held: HashMap<u32, u64> = HashMap::new();
        for exe in self.executables.values() {
            if let TableState::Loaded(id) = exe.state {
                // A table several processes map is held by each in part: libc's 28k rows put
                // every process over its share once three held tables.
                let rows = sampler.table_rows(id) / exe.users.len().max(1) as u64;
                for &pid in &exe.users {
                    *held.entry(pid).or_default() += rows;
                }
            }
        }
        for pid in askers {
            held.entry(*pid).or_default();
        }
        let share = sampler.unwind_capacity().rows_total / held.len().max(1) as u64;
        let within: HashSet<u32> = askers.iter().copied().filter(|pid| held.get(pid).copied().unwrap_or(0) <= share).collect();
        if within.is_empty() {
            return None;
        }
        self.executables
            .iter()
            .filter(|(k, e)| *k != asking && e.users.is_disjoint(&within))
            .filter(|(_, e)| !e.users.is_empty() && e.users.iter().all(|pid| held.get(pid).copied().unwrap_or(0) > share))
            .filter_map(|(k, e)| match e.state {
                TableState::Loaded(id) => Some((sampler.table_rows(id), k)),
                _ => None,
            })
            .max_by_key(|&(rows, _)| rows)
            .map(|(_, k)| k.clone())
    }

    fn evict_for_room(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey) {
        self.unload(sampler, key);
        let Some(exe) = self.executables.get_mut(key) else { return };
        exe.state = TableState::Unbuilt;
        tracing::debug!(file = %exe.name, "unwind table evicted for room");
        self.stats.tables_evicted_for_room += 1;
        let users: Vec<u32> = exe.users.iter().copied().collect();
        for pid in users {
            self.push_process(sampler, pid);
        }
    }

    /// Why no table gave way: each loaded table's rows, users and age, for `-vv`.
    fn describe_room(&self, sampler: &BpfPrograms, asking: &ExecutableKey) {
        let now = monotonic_ns();
        let askers: Vec<u32> = self.executables.get(asking).map(|e| e.users.iter().copied().collect()).unwrap_or_default();
        let capacity = sampler.unwind_capacity();
        tracing::debug!(?askers, rows_used = capacity.rows_used, rows_total = capacity.rows_total, "the budget when room was refused");
        for e in self.executables.values() {
            if let TableState::Loaded(id) = e.state {
                let age_ms = now.saturating_sub(sampler.table_last_used(id)) / 1_000_000;
                tracing::debug!(file = %e.name, rows = sampler.table_rows(id), users = ?e.users, age_ms, "a loaded table");
            }
        }
    }

    /// Rows of the budget in use that no table of a known file accounts for.
    pub fn rows_unaccounted(&self, sampler: &BpfPrograms) -> u64 {
        let owned: u64 = self
            .executables
            .values()
            .filter_map(|e| match e.state {
                TableState::Loaded(id) => Some(sampler.table_rows(id)),
                _ => None,
            })
            .sum();
        // Tables being written in pieces hold theirs until their build is done.
        let pending: u64 = self.in_pieces.values().flatten().map(PendingTable::budget_rows).sum();
        sampler.unwind_capacity().rows_used.saturating_sub(owned + pending)
    }
}
