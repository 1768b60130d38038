//! Which rank labels are read, from which of a process's environment variables, and what value a
//! label takes: `--rank-label LABEL=VAR[,VAR…]` and the config file's `rank_labels`, checked as
//! flags are. [`super::rank`] reads the environments.

use super::environ::{self, Environ};
use super::label_name::valid_name;

/// The labels read by default, each from the first of its variables that holds a valid value.
pub const DEFAULT: &[(&str, &[&str])] = &[
    ("rank", &["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
    ("local_rank", &["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"]),
    ("world_size", &["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]),
    ("group_rank", &["GROUP_RANK", "SLURM_NODEID"]),
];

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

    pub(super) fn vars(&self) -> Vec<&str> {
        let mut vars: Vec<&str> = Vec::new();
        for v in self.labels.iter().flat_map(|(_, vars)| vars) {
            if !vars.contains(&v.as_str()) {
                vars.push(v);
            }
        }
        vars
    }

    /// The labels `env` gives, in the order of the list, and how many values were left out.
    pub(super) fn identity(&self, env: &Environ) -> (Vec<(String, String)>, u64) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::environ;

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
}
