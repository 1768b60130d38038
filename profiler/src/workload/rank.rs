//! Which rank of a distributed job a process is. torchrun, DeepSpeed, Megatron, vLLM, SLURM and
//! MPI launch every rank with its identity in its environment (RANK, LOCAL_RANK, WORLD_SIZE, …);
//! those become labels of its profiles, so that the one slow rank of a job stands apart: a series
//! of its own in the agent, string sample labels and a subtitle in `record`.
//!
//! The values are the launcher's, but the environment is the process's to fill, and a label
//! value that is not a small number would make a series per value or break Pyroscope's limits:
//! only decimal integers are kept.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::environ;
pub use super::rank_labels::{RankLabels, DEFAULT};

/// Bytes of a value read: more than any number kept, few enough that a hostile value costs
/// nothing.
const MAX_VALUE: usize = 256;

/// Each process's labels (its rank in a job), by pid, as they were at one moment.
pub type ProcessLabels = HashMap<u32, Vec<(String, String)>>;

/// Each process's labels, as whoever holds the processes knows them: the registry's records of
/// them (`session/process.rs`), or a [`ProcessLabels`] taken from those.
pub trait LabelsByPid {
    /// `pid`'s labels; none when it has none.
    fn labels_of(&self, pid: u32) -> Option<&[(String, String)]>;
}

impl LabelsByPid for ProcessLabels {
    fn labels_of(&self, pid: u32) -> Option<&[(String, String)]> {
        self.get(&pid).map(Vec::as_slice)
    }
}

/// What reading identities counted, for `-v` and the agent's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RankStats {
    /// Environments read: once a process, again after an exec.
    pub environments_read: u64,
    /// Of those, the ones that gave at least one label.
    pub processes_labelled: u64,
    /// Values of the variables that were not a number (the label came from a later variable,
    /// or was left out).
    pub values_left_out: u64,
    /// Environments that could not be read: the process was gone, or access was denied.
    pub unreadable: u64,
    /// Environments read only up to [`environ::MAX_TOTAL`] bytes.
    pub cut: u64,
}

/// Where reading one process's identity stands; kept in the registry's record of the process
/// (`session/process.rs`), so that it goes with the process.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum RankRead {
    /// Not read since its last exec.
    #[default]
    Unread,
    Read,
    /// Its environment could not be read, last tried then: tried again at a record after
    /// [`RETRY_UNREADABLE`], not at every one (a dead rank's last records arrive after its exit,
    /// each of them a failed open).
    Unreadable { at: Instant },
}

impl RankRead {
    /// The process exited or runs a new program: a process that reuses the pid, or the new
    /// program, is read anew.
    pub fn forget(&mut self) {
        *self = RankRead::Unread;
    }
}

/// Reads each process's identity when its records first arrive, and again when the registry
/// says it runs a new program (which may have a new environment). Where each process's read
/// stands is the process's ([`RankRead`]).
pub struct RankReader {
    labels: RankLabels,
    stats: RankStats,
}

/// How soon an environment that could not be read is tried again.
const RETRY_UNREADABLE: Duration = Duration::from_millis(200);

impl RankReader {
    pub fn new(labels: RankLabels) -> Self {
        RankReader { labels, stats: RankStats::default() }
    }

    /// A record of process `pid` arrived: the process's labels when they are to be set now (read
    /// for the first time since its exec), else none. A failed read gives none: the labels read
    /// before stay (a record read after its process exited is no news of who the process was).
    pub fn on_record(&mut self, pid: u32, state: &mut RankRead) -> Option<Vec<(String, String)>> {
        if self.labels.is_empty() || pid == 0 {
            return None;
        }
        match *state {
            RankRead::Read => None,
            RankRead::Unreadable { at } if at.elapsed() < RETRY_UNREADABLE => None,
            _ => self.read(pid, state),
        }
    }

    /// `pid` exec'd: it is read now, while it surely lives (a rank that lives a second can be
    /// gone by the time a loaded agent reads its first record, and its labels with it).
    pub fn exec(&mut self, pid: u32, state: &mut RankRead) -> Option<Vec<(String, String)>> {
        state.forget();
        if self.labels.is_empty() || pid == 0 {
            return None;
        }
        self.read(pid, state)
    }

    pub fn stats(&self) -> RankStats {
        self.stats
    }

    /// The process's labels, or none when its environment cannot be read.
    fn read(&mut self, pid: u32, state: &mut RankRead) -> Option<Vec<(String, String)>> {
        let env = match environ::read(pid, &self.labels.vars(), MAX_VALUE) {
            Ok(env) => env,
            Err(e) => {
                self.stats.unreadable += 1;
                tracing::debug!(pid, error = %e, "no rank labels: the environment cannot be read");
                // Tried again at a later record: an exec report can be read before /proc shows
                // the process.
                *state = RankRead::Unreadable { at: Instant::now() };
                return None;
            }
        };
        *state = RankRead::Read;
        self.stats.environments_read += 1;
        if env.cut {
            self.stats.cut += 1;
            tracing::debug!(pid, bytes = environ::MAX_TOTAL, "environment read only in part: its rank variables may be after the part read");
        }
        let (labels, left_out) = self.labels.identity(&env);
        self.stats.values_left_out += left_out;
        if left_out > 0 {
            tracing::debug!(pid, left_out, "rank variables whose value is not a number were left out");
        }
        self.stats.processes_labelled += u64::from(!labels.is_empty());
        Some(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::environ::tests::sleeper;

    fn labels(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The identity of a `sleep` with `envs`, read as the session reads it, and what was counted.
    fn identity_of(envs: &[(&str, &str)]) -> (Option<Vec<(String, String)>>, RankStats) {
        let mut child = sleeper(envs);
        let mut reader = RankReader::new(RankLabels::default());
        let got = reader.on_record(child.id(), &mut RankRead::default());
        let _ = child.kill();
        let _ = child.wait();
        (got, reader.stats())
    }

    #[test]
    fn a_torchrun_rank_is_labelled() {
        let (got, stats) = identity_of(&[("RANK", "2"), ("LOCAL_RANK", "2"), ("WORLD_SIZE", "4"), ("GROUP_RANK", "0")]);
        assert_eq!(got, Some(labels(&[("rank", "2"), ("local_rank", "2"), ("world_size", "4"), ("group_rank", "0")])));
        assert_eq!(stats, RankStats { environments_read: 1, processes_labelled: 1, ..Default::default() });
    }

    #[test]
    fn a_rank_after_a_mebibyte_of_other_variables_is_found() {
        let filler = "y".repeat(64 << 10);
        let names: Vec<String> = (0..16).map(|i| format!("A_FILLER_{i:02}")).collect();
        let mut envs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), filler.as_str())).collect();
        envs.push(("RANK", "1"));
        let (got, stats) = identity_of(&envs);
        assert_eq!(got, Some(labels(&[("rank", "1")])));
        assert_eq!((stats.processes_labelled, stats.cut), (1, 0));
    }

    #[test]
    fn hostile_values_are_left_out_and_counted() {
        let huge = "1".repeat(10_000);
        let (got, stats) = identity_of(&[("RANK", &huge), ("LOCAL_RANK", "1\x1b[2J"), ("WORLD_SIZE", "2")]);
        assert_eq!(got, Some(labels(&[("world_size", "2")])));
        assert_eq!((stats.values_left_out, stats.processes_labelled), (2, 1));
        let (got, stats) = identity_of(&[("RANK", "\u{7}3\u{7}")]);
        assert_eq!(got, Some(Vec::new()));
        assert_eq!(stats, RankStats { environments_read: 1, values_left_out: 1, ..Default::default() });
    }

    #[test]
    fn a_process_that_is_gone_changes_no_labels_and_is_counted_once() {
        let mut child = std::process::Command::new("true").env("RANK", "1").spawn().expect("true");
        let pid = child.id();
        child.wait().expect("wait");
        let mut reader = RankReader::new(RankLabels::default());
        let mut state = RankRead::default();
        assert_eq!(reader.on_record(pid, &mut state), None);
        assert_eq!(reader.exec(pid, &mut state), None);
        // Its further records do not each try /proc again.
        assert_eq!(reader.on_record(pid, &mut state), None);
        assert_eq!(reader.stats(), RankStats { unreadable: 2, ..Default::default() });
    }

    /// A rank's records can be read after its exit was (they come by other ring buffers): they
    /// must not take its labels away, as an empty read did.
    #[test]
    fn records_read_after_the_exit_keep_the_labels() {
        let mut child = sleeper(&[("RANK", "2")]);
        let pid = child.id();
        let mut reader = RankReader::new(RankLabels::default());
        let mut state = RankRead::default();
        assert_eq!(reader.exec(pid, &mut state), Some(labels(&[("rank", "2")])));
        let _ = child.kill();
        let _ = child.wait();
        state.forget();
        assert_eq!(reader.on_record(pid, &mut state), None);
        assert_eq!(reader.on_record(pid, &mut state), None);
        assert_eq!(reader.stats().unreadable, 1);
    }
}
