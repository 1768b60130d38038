//! One process, as the registry holds it: who it is (its rank's labels, read once per program;
//! for the agent its service, pod and container, read at its first record), the program it runs
//! (its main thread's name), whether its records were seen, and where it stands: `Live → Exited
//! → Forgotten`, by the one rule for exited processes
//! ([`EXITED_GRACE`](crate::process::EXITED_GRACE) after the exit, whose time the registry's
//! queue of exits keeps). Its mappings, tables and Python are the tracker's record of it
//! (`process/tracker/tracked.rs`), under the same rule; the registry owns both.

use std::collections::HashMap;

use super::programs::MainThreadName;
use crate::workload::rank::{LabelsByPid, ProcessLabels, RankRead};
use crate::workload::service::{ProcessService, ServiceStore};

/// One process, as the registry knows it besides its mappings.
#[derive(Debug, Default)]
pub struct Process {
    /// Its rank's labels; empty when it has none. Kept past its exit, for its last records.
    labels: Vec<(String, String)>,
    /// Where reading them stands since its last exec.
    pub(super) rank: RankRead,
    /// Its service, pod and container (the agent's series), read at its first record while it
    /// lives; kept past its exit, like its labels.
    pub(super) service: Option<ProcessService>,
    /// The program it runs, as its records show it: for execs whose event came late.
    pub(super) main_thread: MainThreadName,
    /// Records of it were seen since it was last found live: a process whose exit was lost is
    /// looked for among these.
    pub(super) seen: bool,
    /// Its exit was heard or found, and no event of it came since.
    exited: bool,
}

impl Process {
    pub fn labels(&self) -> &[(String, String)] {
        &self.labels
    }

    /// Labels read now; none read leaves the last ones (a failed read is no news of who the
    /// process is), and an empty read takes them away (a program exec'd one without labels).
    pub(super) fn set_labels(&mut self, labels: Option<Vec<(String, String)>>) {
        if let Some(l) = labels {
            self.labels = l;
        }
    }

    /// An event of the process: it lives, whoever had the pid before.
    pub(super) fn live(&mut self) {
        self.exited = false;
    }

    /// Its exit, heard or found: what is read of a program goes, its labels stay for its last
    /// records until it is forgotten. Whether anything of it is kept: a record without labels
    /// or a service goes at once (a long `record -a` on a machine that runs hundreds of
    /// processes a second has one window, closed at its end).
    pub(super) fn exited(&mut self) -> bool {
        self.rank.forget();
        self.main_thread.forget();
        self.seen = false;
        self.exited = true;
        !self.labels.is_empty() || self.service.is_some()
    }

    /// Whether, `EXITED_GRACE` after an exit, nothing can name it any more: no record of it
    /// came since (a pid taken by another process since, and not seen yet, is read anew).
    pub(super) fn forgettable(&self) -> bool {
        !self.seen
    }

    /// Whether it lives, as far as the registry heard.
    pub(super) fn is_live(&self) -> bool {
        !self.exited
    }
}

/// The registry's records, by pid: the labels of every process, the exited not yet forgotten
/// included.
pub(super) type Records = HashMap<u32, Process>;

impl LabelsByPid for Records {
    fn labels_of(&self, pid: u32) -> Option<&[(String, String)]> {
        self.get(&pid).map(Process::labels).filter(|l| !l.is_empty())
    }
}

impl ServiceStore for Records {
    fn place(&mut self, pid: u32) -> Option<&mut Option<ProcessService>> {
        self.get_mut(&pid).map(|p| &mut p.service)
    }
}

/// Every process's labels now, as a value of their own (a snapshot handed out with its stacks).
pub(super) fn labels_now(records: &Records) -> ProcessLabels {
    records.iter().filter(|(_, p)| !p.labels.is_empty()).map(|(&pid, p)| (pid, p.labels.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(n: &str) -> Vec<(String, String)> {
        vec![("rank".to_string(), n.to_string())]
    }

    #[test]
    fn an_exited_process_is_kept_only_for_what_its_last_records_need() {
        // Nothing of it is needed: it goes at its exit.
        assert!(!Process::default().exited());
        let mut p = Process { rank: RankRead::Read, seen: true, ..Default::default() };
        p.set_labels(Some(rank("1")));
        assert!(!p.main_thread.record(7, 7, "python3"));
        assert!(p.exited());
        // Read anew if its pid lives again; its labels stay for its last records.
        assert_eq!(p.rank, RankRead::Unread);
        assert!(!p.is_live() && p.forgettable());
        assert!(!p.main_thread.record(7, 7, "other"), "a first name after the exit is no news");
        assert_eq!(p.labels(), rank("1"));
        // A late record: not forgotten at the next window close.
        p.seen = true;
        assert!(!p.forgettable());
        // An event of the process: it lives (a new process with its pid).
        p.live();
        assert!(p.is_live());
    }

    #[test]
    fn a_failed_read_keeps_the_labels_and_an_empty_one_takes_them_away() {
        let mut records = Records::new();
        records.entry(3).or_default().set_labels(Some(rank("0")));
        records.entry(3).or_default().set_labels(None);
        assert_eq!(records.labels_of(3), Some(rank("0").as_slice()));
        records.entry(3).or_default().set_labels(Some(Vec::new()));
        assert_eq!(records.labels_of(3), None);
        assert_eq!(records.labels_of(4), None);
        records.entry(4).or_default().set_labels(Some(rank("1")));
        assert_eq!(labels_now(&records), ProcessLabels::from([(4, rank("1"))]));
    }
}
