//! When a process's stacks can be whole: every file it maps has its table in BPF (or has none).
//! A program started with a recording is unwound from its first sample only after that; `-vv`
//! (or `RUST_LOG=gpuflame::ready=debug`) says when, which is what tests wait for.

use super::{ProcessTracker, TableState};

impl ProcessTracker {
    /// The processes whose mappings were read since they were last ready and whose tables are
    /// all in now, each with how many executable mappings it has (as /proc/PID/maps lists them):
    /// a reader of the maps can tell a report of its latest mappings from an earlier one.
    pub fn take_ready(&mut self) -> Vec<(u32, usize)> {
        let settled = |keys: &[Option<gpuflame_unwind::ExecutableKey>]| keys.iter().flatten().all(|k| matches!(self.executables.get(k).map(|e| e.state), Some(TableState::Loaded(_) | TableState::NoTable)));
        let ready: Vec<(u32, usize)> = self
            .processes
            .iter()
            .filter(|(_, p)| p.unready)
            .filter_map(|(&pid, p)| p.mapped.as_ref().filter(|m| settled(&m.entry_keys)).map(|m| (pid, m.entries.len())))
            .collect();
        for (pid, _) in &ready {
            if let Some(p) = self.processes.get_mut(pid) {
                p.unready = false;
            }
        }
        ready
    }
}
