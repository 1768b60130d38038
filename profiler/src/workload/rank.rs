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

use super::environ::{self, Environ};
use crate::agent::labels::valid_name;

/// The labels read by default, each from the first of its variables that holds a valid value.
pub const DEFAULT: &[(&str, &[&str])] = &[
    ("rank", &["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
    ("local_rank", &["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"]),
    ("world_size", &["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]),
    ("group_rank", &["GROUP_RANK", "SLURM_NODEID"]),
];

/// Bytes of a value read: more than any number kept, few enough that a hostile value costs
/// nothing.
const MAX_VALUE: usize = 256;
/// Digits of a value kept at most: every rank of the largest job there is, and a u32.
const MAX_DIGITS: usize = 9;
/// Names of the sample labels that pprof output has already.
const SAMPLE_LABELS: &[&str] = &["pid", "tid", "comm", "thread_name", "device"];
/// A label name longer than this is surely a mistake.
const MAX_LABEL_NAME: usize = 128;

/// Which labels are read, and from which variables, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankLabels {
    labels: Vec<(String, Vec<String>)>,
}

impl Default for RankLabels {
    fn default() -> Self {
        RankLabels { labels: DEFAULT.iter().map(|(l, vars)| (l.to_string(), vars.iter().map(|v| v.to_string()).collect())).collect() }
    }
}

impl RankLabels {
    /// No rank labels: environments are not read.
    pub fn none() -> Self {
        RankLabels { labels: Vec::new() }
    }

    /// `--rank-label LABEL=VAR[,VAR…]`, each given: none, the default list; `none` alone, no
    /// labels; else exactly the labels given.
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        match specs {
            [] => return Ok(Self::default()),
            [one] if one == "none" => return Ok(Self::none()),
            _ => {}
        }
        let mut labels: Vec<(String, Vec<String>)> = Vec::new();
        for spec in specs {
            let (label, vars) = spec.split_once('=').ok_or_else(|| format!("--rank-label {spec:?} is not LABEL=VAR[,VAR…] (or none, alone)"))?;
            if !valid_name(label) || label.starts_with("__") || label.len() > MAX_LABEL_NAME {
                return Err(format!("--rank-label {spec:?}: {label:?} is not a label name (letters, digits and _, not starting with a digit nor __)"));
            }
            if SAMPLE_LABELS.contains(&label) {
                return Err(format!("--rank-label {spec:?}: {label} is a sample label gpuflame writes already"));
            }
            if labels.iter().any(|(l, _)| l == label) {
                return Err(format!("--rank-label {spec:?}: the label {label} is given twice"));
            }
            let vars: Vec<String> = vars.split(',').map(str::to_string).collect();
            if let Some(bad) = vars.iter().find(|v| v.is_empty() || v.len() > environ::MAX_NAME || v.contains(['=', '\0'])) {
                return Err(format!("--rank-label {spec:?}: {bad:?} is not an environment variable's name"));
            }
            labels.push((label.to_string(), vars));
        }
        Ok(RankLabels { labels })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.labels.iter().map(|(l, _)| l.as_str())
    }

    /// The list as `--rank-label` takes it, one entry per label.
    pub fn specs(&self) -> Vec<String> {
        self.labels.iter().map(|(l, vars)| format!("{l}={}", vars.join(","))).collect()
    }

    fn vars(&self) -> Vec<&str> {
        let mut vars: Vec<&str> = Vec::new();
        for v in self.labels.iter().flat_map(|(_, vars)| vars) {
            if !vars.contains(&v.as_str()) {
                vars.push(v);
            }
        }
        vars
    }

    /// The labels `env` gives, in the order of the list, and how many values were left out.
    fn identity(&self, env: &Environ) -> (Vec<(String, String)>, u64) {
        let mut left_out = 0;
        let mut out = Vec::new();
        for (label, vars) in &self.labels {
            for var in vars {
                let Some(raw) = env.get(var) else { continue };
                match Some(raw).filter(|r| !r.longer).and_then(|r| value(&r.bytes)) {
                    Some(v) => {
                        out.push((label.clone(), v));
                        break;
                    }
                    None => left_out += 1,
                }
            }
        }
        (out, left_out)
    }
}

/// A value as a label takes it: a decimal integer of at most [`MAX_DIGITS`] digits, surrounding
/// whitespace trimmed and leading zeros dropped (`07` and `7` are one rank); else none.
fn value(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?.trim_matches(|c: char| c.is_ascii_whitespace());
    if s.is_empty() || s.len() > MAX_DIGITS || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().map(|n| n.to_string())
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

/// Reads each process's identity when its records first arrive, and again after it execs.
pub struct RankReader {
    labels: RankLabels,
    /// The processes read, with the name of their main thread since then when known: a new name
    /// means a new program (exec), which may have a new environment.
    known: HashMap<u32, Option<String>>,
    /// Processes whose environment could not be read, with when it was last tried: tried again
    /// at a record after [`RETRY_UNREADABLE`], not at every one (a dead rank's last records
    /// arrive after its exit, each of them a failed open).
    unreadable: HashMap<u32, Instant>,
    stats: RankStats,
}

/// How soon an environment that could not be read is tried again.
const RETRY_UNREADABLE: Duration = Duration::from_millis(200);

impl RankReader {
    pub fn new(labels: RankLabels) -> Self {
        RankReader { labels, known: HashMap::new(), unreadable: HashMap::new(), stats: RankStats::default() }
    }

    /// A record of thread `tid` (named `comm`) of process `pid` arrived: the process's labels
    /// when they are to be set now (read for the first time, or again), else none. A failed read
    /// gives none: the labels read before stay (a record read after its process exited is no
    /// news of who the process was).
    pub fn on_record(&mut self, pid: u32, tid: u32, comm: &str) -> Option<Vec<(String, String)>> {
        if self.labels.is_empty() || pid == 0 {
            return None;
        }
        // Called for every record: the name is copied only when it is news.
        let main = (tid == pid).then_some(comm);
        match self.known.get_mut(&pid) {
            None => {
                if self.unreadable.get(&pid).is_some_and(|t| t.elapsed() < RETRY_UNREADABLE) {
                    return None;
                }
            }
            Some(seen) => match (seen.as_deref(), main) {
                (Some(old), Some(new)) if old != new => {}
                (None, Some(new)) => {
                    *seen = Some(new.to_string());
                    return None;
                }
                _ => return None,
            },
        }
        let labels = self.read(pid)?;
        self.known.insert(pid, main.map(str::to_string));
        Some(labels)
    }

    /// `pid` exec'd: it is read now, while it surely lives (a rank that lives a second can be
    /// gone by the time a loaded agent reads its first record, and its labels with it), and its
    /// main thread's name is taken from its next record.
    pub fn exec(&mut self, pid: u32) -> Option<Vec<(String, String)>> {
        self.known.remove(&pid);
        self.unreadable.remove(&pid);
        if self.labels.is_empty() || pid == 0 {
            return None;
        }
        let labels = self.read(pid)?;
        self.known.insert(pid, None);
        Some(labels)
    }

    /// `pid` exited; a process that reuses it is read anew.
    pub fn forget(&mut self, pid: u32) {
        self.known.remove(&pid);
        self.unreadable.remove(&pid);
    }

    /// Keeps only the processes `keep` says are still there (exits can be lost).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.known.retain(|&pid, _| keep(pid));
        self.unreadable.retain(|&pid, _| keep(pid));
    }

    pub fn stats(&self) -> RankStats {
        self.stats
    }

    /// The process's labels, or none when its environment cannot be read.
    fn read(&mut self, pid: u32) -> Option<Vec<(String, String)>> {
        let env = match environ::read(pid, &self.labels.vars(), MAX_VALUE) {
            Ok(env) => env,
            Err(e) => {
                self.stats.unreadable += 1;
                tracing::debug!(pid, error = %e, "no rank labels: the environment cannot be read");
                // Tried again at a later record: an exec report can be read before /proc shows
                // the process.
                self.unreadable.insert(pid, Instant::now());
                return None;
            }
        };
        self.unreadable.remove(&pid);
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

    fn specs(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn labels(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn values_are_small_decimal_integers() {
        assert_eq!(value(b"3").as_deref(), Some("3"));
        assert_eq!(value(b" 12\n").as_deref(), Some("12"));
        assert_eq!(value(b"007").as_deref(), Some("7"));
        assert_eq!(value(b"999999999").as_deref(), Some("999999999"));
        for bad in [&b""[..], b"  ", b"-1", b"+1", b"1.0", b"0x10", b"1234567890", b"2\x1b[31m", b"\x002", b"\xff", "٣".as_bytes()] {
            assert_eq!(value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn flags_replace_the_default_list_or_turn_it_off() {
        assert_eq!(RankLabels::parse(&[]).unwrap(), RankLabels::default());
        assert!(RankLabels::parse(&specs(&["none"])).unwrap().is_empty());
        let custom = RankLabels::parse(&specs(&["rank=MY_RANK,RANK", "node_rank=NODE"])).unwrap();
        assert_eq!(custom.names().collect::<Vec<_>>(), ["rank", "node_rank"]);
        assert_eq!(custom.specs(), ["rank=MY_RANK,RANK", "node_rank=NODE"]);
        assert_eq!(RankLabels::parse(&RankLabels::default().specs()).unwrap(), RankLabels::default());
        let err = |s: &[&str]| RankLabels::parse(&specs(s)).unwrap_err();
        assert!(err(&["rank"]).contains("LABEL=VAR"));
        assert!(err(&["none", "rank=RANK"]).contains("LABEL=VAR"));
        assert!(err(&["2rank=RANK"]).contains("not a label name"));
        assert!(err(&["ra-nk=RANK"]).contains("not a label name"));
        assert!(err(&["__rank=RANK"]).contains("not a label name"));
        assert!(err(&["pid=RANK"]).contains("sample label"));
        assert!(err(&["rank=RANK", "rank=SLURM_PROCID"]).contains("twice"));
        assert!(err(&["rank="]).contains("environment variable"));
        assert!(err(&["rank=RANK,,X"]).contains("environment variable"));
        assert!(err(&["rank=A=B"]).contains("environment variable"));
    }

    #[test]
    fn the_first_valid_variable_gives_the_label_and_the_others_are_counted() {
        let env = environ::scan(&b"RANK=x\0SLURM_PROCID=4\0LOCAL_RANK=-1\0WORLD_SIZE=8\0"[..], &["RANK", "SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE"], 16, 1 << 20).unwrap();
        let (got, left_out) = RankLabels::default().identity(&env);
        assert_eq!(got, labels(&[("rank", "4"), ("world_size", "8")]));
        assert_eq!(left_out, 2, "RANK=x and LOCAL_RANK=-1");
    }

    /// The identity of a `sleep` with `envs`, read as the session reads it, and what was counted.
    fn identity_of(envs: &[(&str, &str)]) -> (Option<Vec<(String, String)>>, RankStats) {
        let mut child = sleeper(envs);
        let mut reader = RankReader::new(RankLabels::default());
        let got = reader.on_record(child.id(), child.id(), "sleep");
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
        assert_eq!(reader.on_record(pid, pid, "true"), None);
        assert_eq!(reader.exec(pid), None);
        // Its further records do not each try /proc again.
        assert_eq!(reader.on_record(pid, pid, "true"), None);
        assert_eq!(reader.stats(), RankStats { unreadable: 2, ..Default::default() });
    }

    /// A rank's records can be read after its exit was (they come by other ring buffers): they
    /// must not take its labels away, as an empty read did.
    #[test]
    fn records_read_after_the_exit_keep_the_labels() {
        let mut child = sleeper(&[("RANK", "2")]);
        let pid = child.id();
        let mut reader = RankReader::new(RankLabels::default());
        assert_eq!(reader.exec(pid), Some(labels(&[("rank", "2")])));
        let _ = child.kill();
        let _ = child.wait();
        reader.forget(pid);
        assert_eq!(reader.on_record(pid, pid, "sleep"), None);
        assert_eq!(reader.on_record(pid, pid + 1, "worker"), None);
        assert_eq!(reader.stats().unreadable, 1);
    }

    #[test]
    fn a_process_is_read_once_and_again_after_exec() {
        let mut child = sleeper(&[("RANK", "3")]);
        let pid = child.id();
        let mut reader = RankReader::new(RankLabels::default());
        // First seen in another thread's record: read; the main thread's name is learnt after.
        assert_eq!(reader.on_record(pid, pid + 1, "worker"), Some(labels(&[("rank", "3")])));
        assert_eq!(reader.on_record(pid, pid, "sleep"), None);
        assert_eq!(reader.on_record(pid, pid + 1, "other"), None);
        // A new name of its main thread: read again. An exec report: read at once, not at the
        // next record.
        assert_eq!(reader.on_record(pid, pid, "python3"), Some(labels(&[("rank", "3")])));
        assert_eq!(reader.exec(pid), Some(labels(&[("rank", "3")])));
        assert_eq!(reader.on_record(pid, pid + 1, "worker"), None);
        assert_eq!(reader.on_record(pid, pid, "python3"), None);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(reader.stats().environments_read, 3);
        // Turned off: nothing is read.
        let mut off = RankReader::new(RankLabels::none());
        assert_eq!(off.on_record(pid, pid, "sleep"), None);
        assert_eq!(off.stats(), RankStats::default());
    }
}
