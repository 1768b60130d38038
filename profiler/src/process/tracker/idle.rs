//! Tables of files that no process maps any more, kept a while on a whole machine: a shell loop
//! starts `ls` hundreds of times a second, and each `ls` exits before the next starts. Dropping
//! its tables with it (ls, libselinux, libpcre2) had every new `ls` probe the files, build and
//! load the tables again, and left its first samples without them. An idle table is dropped
//! after `IDLE_FOR`, when more than `MAX_IDLE` are idle, or first when the budget needs room
//! (it is the least recently used).

use std::time::Duration;

use gpuflame_bpf::BpfPrograms;

use super::ProcessTracker;

/// How long a table no process maps stays loaded.
const IDLE_FOR: Duration = Duration::from_secs(10);
/// Idle tables kept at most.
const MAX_IDLE: usize = 256;

impl ProcessTracker {
    /// Keeps the tables of files no process maps any more for a while (a whole-machine
    /// session), instead of dropping them with their last process (explicit targets).
    pub fn keep_idle_tables(&mut self, keep: bool) {
        self.keep_idle = keep;
    }

    /// Drops the idle tables that have been idle too long, or are too many.
    pub fn expire_idle(&mut self, sampler: &mut BpfPrograms) {
        while let Some((since, key)) = self.idle.front().cloned() {
            if self.idle.len() <= MAX_IDLE && since.elapsed() < IDLE_FOR {
                break;
            }
            self.idle.pop_front();
            // Mapped again since, or idle again later (a later entry stands for it).
            let idle_now = self.executables.get(&key).is_some_and(|e| e.users.is_empty());
            if idle_now && !self.idle.iter().any(|(_, k)| *k == key) {
                self.drop_table(sampler, &key);
            }
        }
    }
}
