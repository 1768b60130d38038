//! Unwind tables from queue to BPF: when a file's table is asked for ahead of the background
//! builds, and what loading a finished one changes for the processes that map it.

use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, PendingTable, TableId};
use gpuflame_unwind::{CompactTable, ExecutableKey};

use super::{ProcessTracker, TableState};
use crate::process::builder::{BuildJob, BuildMsg, Built, BuiltTable};

impl ProcessTracker {
    /// See [`TableBuilder::demand_at_low_priority`](crate::process::builder::TableBuilder::demand_at_low_priority).
    pub fn demand_tables_at_low_priority(&self, low: bool) {
        self.builder.demand_at_low_priority(low);
    }

    /// A sample of `pid` met the file mapped at `addr` without its table (a process event, or a
    /// copied stack that waits for it).
    pub fn need_table(&mut self, sampler: &mut BpfPrograms, pid: u32, addr: u64) {
        let find = |t: &Self| -> Option<ExecutableKey> {
            let mapped = t.processes.get(&pid)?.mapped.as_ref()?;
            let i = mapped.entries.iter().position(|e| e.start <= addr && addr < e.end)?;
            mapped.entry_keys.get(i)?.clone()
        };
        let key = match find(self) {
            Some(k) => k,
            None => {
                self.refresh(sampler, pid);
                let Some(k) = find(self) else { return };
                k
            }
        };
        let Some(exe) = self.executables.get_mut(&key) else { return };
        if exe.retry_after.is_some_and(|t| Instant::now() < t) {
            return;
        }
        match exe.state {
            TableState::Unbuilt | TableState::Queued { urgent: false } => self.build_now(key, false),
            TableState::Queued { urgent: true } => {}
            // BPF's copy of the process is older than the table: tell it again.
            TableState::Loaded { .. } | TableState::NoTable => self.push_process(sampler, pid),
        }
    }

    /// Reads the process's mappings now and has the tables still queued for it built next, at
    /// normal priority: it waits for them (see [`Self::tables_settled`]).
    pub fn hurry(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        self.refresh(sampler, pid);
        self.build_soon(pid);
    }

    /// Has the tables queued for the process built next, at normal priority, rather than in the
    /// background at low priority: for a process whose every hooked CUDA call is a record of its
    /// own (an allocation, a launch), not a sample, and lost without a stack. Under load, a
    /// background build of libc took longer than a short CUDA program lived.
    pub fn build_soon(&mut self, pid: u32) {
        let keys = self.processes.get(&pid).and_then(|p| p.mapped.as_ref()).map(|m| m.keys.clone()).unwrap_or_default();
        for key in keys {
            if self.executables.get(&key).is_some_and(|exe| exe.state == (TableState::Queued { urgent: false })) {
                self.build_now(key, false);
            }
        }
    }

    /// Queues the file's table ahead of the background builds, at normal priority. `startup`: a
    /// command waits for it to start (`preload`), not a sample.
    pub(super) fn build_now(&mut self, key: ExecutableKey, startup: bool) {
        let Some(exe) = self.executables.get_mut(&key) else { return };
        exe.state = TableState::Queued { urgent: true };
        if startup {
            tracing::debug!(file = %exe.name, cfi_bytes = exe.cfi_bytes, "unwind table asked for by a command before it runs");
        } else {
            tracing::debug!(file = %exe.name, cfi_bytes = exe.cfi_bytes, "unwind table asked for by a sample");
        }
        self.builder.urgent(BuildJob { key, paths: exe.paths.clone(), cfi_bytes: exe.cfi_bytes, image: None, urgent: true, startup });
    }

    /// Whether no table of the process's files waits to be built. Files big enough to be built
    /// only on demand do not count: their tables come when a stack first needs them.
    pub fn tables_settled(&self, pid: u32) -> bool {
        let queued = |k: &ExecutableKey| matches!(self.executables.get(k).map(|e| e.state), Some(TableState::Queued { .. }));
        self.processes.get(&pid).and_then(|p| p.mapped.as_ref()).is_none_or(|m| !m.keys.iter().any(queued))
    }

    /// Loads the tables built since the last call and tells the processes that map them.
    pub fn poll_tables(&mut self, sampler: &mut BpfPrograms) {
        for msg in self.builder.finished() {
            self.from_builder(sampler, msg);
        }
        self.expire_idle(sampler);
    }

    /// Whether tables are being built.
    pub fn building(&self) -> bool {
        self.builder.busy()
    }

    /// Waits up to `timeout` for the tables queued so far, loading each as it comes.
    pub fn wait_for_tables(&mut self, sampler: &mut BpfPrograms, timeout: Duration) {
        self.builder.promote_all();
        let deadline = Instant::now() + timeout;
        while self.builder.busy() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // Short waits: the builder may have just finished, with nothing more to send.
            if let Some(msg) = self.builder.wait(left.min(Duration::from_millis(5))) {
                self.from_builder(sampler, msg);
            }
        }
        self.poll_tables(sampler);
    }

    fn from_builder(&mut self, sampler: &mut BpfPrograms, msg: BuildMsg) {
        match msg {
            BuildMsg::Piece { key, rows } => self.piece(sampler, key, &rows),
            BuildMsg::Done(built) => self.loaded(sampler, built),
        }
    }

    /// The next rows of a big table: written into BPF now, the table made visible when its
    /// build is done.
    fn piece(&mut self, sampler: &mut BpfPrograms, key: ExecutableKey, rows: &CompactTable) {
        let state = self.executables.get(&key).map(|e| e.state);
        // A second build of a table already in, or of a file no process maps: not loaded.
        let wanted = matches!(state, Some(TableState::Unbuilt | TableState::Queued { .. }));
        let pending = match self.in_pieces.remove(&key) {
            Some(pending) => pending,
            None if wanted => match sampler.begin_table(rows.base) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::debug!(error = %e, "no room to start an unwind table");
                    None
                }
            },
            None => None,
        };
        let Some(mut pending) = pending else {
            self.in_pieces.insert(key, None);
            return;
        };
        let urgent = state == Some(TableState::Queued { urgent: true });
        if self.insert_piece(sampler, &key, &mut pending, rows, urgent) {
            self.in_pieces.insert(key, Some(pending));
        } else {
            sampler.abort_table(pending);
            self.in_pieces.insert(key, None);
        }
    }

    fn loaded(&mut self, sampler: &mut BpfPrograms, built: Built) {
        let pieces = self.in_pieces.remove(&built.key);
        if let Some(rules) = &built.rules {
            if let Err(e) = sampler.load_rules(rules) {
                tracing::warn!(error = %e, "cannot load unwind rules");
            }
        }
        self.stats.build_time += built.elapsed;
        let Some(exe) = self.executables.get(&built.key) else {
            if let Some(Some(p)) = pieces {
                sampler.abort_table(p);
            }
            return;
        };
        // A second build of a table already in (asked for by a sample while the first was
        // finished but not yet loaded): loading it too leaked the first copy's rows, which no
        // eviction could reclaim, and a table hog's churn filled the budget with them.
        if matches!(exe.state, TableState::Loaded(_) | TableState::NoTable) {
            tracing::debug!(file = %exe.name, "a second build of a loaded table dropped");
            if let Some(Some(p)) = pieces {
                sampler.abort_table(p);
            }
            return;
        }
        let urgent = exe.state == TableState::Queued { urgent: true };
        let state = match built.table {
            Ok(table) if table.is_empty() => {
                if let Some(Some(p)) = pieces {
                    sampler.abort_table(p);
                }
                self.stats.files_without_cfi += 1;
                TableState::NoTable
            }
            Ok(table) => {
                let rows = table.len();
                match self.load_built(sampler, &built.key, table, pieces, urgent) {
                    Some(id) => {
                        self.stats.tables_built += 1;
                        self.stats.rows_loaded += rows as u64;
                        self.stats.functions_from_prologues += built.from_prologues;
                        if urgent && self.stats.first_demanded_table.is_none() {
                            self.stats.first_demanded_table = Some(self.started.elapsed());
                        }
                        tracing::debug!(file = %self.executables[&built.key].name, rows, ms = built.elapsed.as_millis() as u64, urgent, "unwind table loaded");
                        TableState::Loaded(id)
                    }
                    None => TableState::Unbuilt,
                }
            }
            Err(e) => {
                if let Some(Some(p)) = pieces {
                    sampler.abort_table(p);
                }
                tracing::debug!(file = %exe.name, error = %e, "no unwind table");
                self.stats.table_failures += 1;
                TableState::NoTable
            }
        };
        let Some(exe) = self.executables.get_mut(&built.key) else { return };
        exe.state = state;
        if matches!(state, TableState::Loaded(_)) {
            self.publish(sampler, &built.key);
        }
        let Some(exe) = self.executables.get(&built.key) else { return };
        let users: Vec<u32> = exe.users.iter().copied().collect();
        for pid in users {
            self.push_process(sampler, pid);
        }
    }

    /// Loads a finished table: a whole one now, one built in pieces by finishing what they wrote
    /// (none, if they were dropped for want of room).
    fn load_built(&mut self, sampler: &mut BpfPrograms, key: &ExecutableKey, table: BuiltTable, pieces: Option<Option<PendingTable>>, urgent: bool) -> Option<TableId> {
        match table {
            BuiltTable::Whole(table) => self.insert(sampler, key, &table, urgent),
            BuiltTable::Pieces { .. } => match sampler.finish_table(pieces.flatten()?, urgent) {
                Ok(id) => {
                    self.stats.tables_in_pieces += 1;
                    Some(id)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot load an unwind table");
                    None
                }
            },
        }
    }
}
