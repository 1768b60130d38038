//! Series labels as Pyroscope takes them (pkg/validation/validate.go): the agent's own, the
//! user's, and the checks that keep a series from being refused with a 400.
//!
//! Pyroscope refuses a whole series when one of its labels breaks a rule: a name that is empty,
//! longer than 1,024 bytes or not a valid name, a value longer than 2,048 bytes, two labels of
//! the same name, more than 30 names with `__name__`, or no `service_name`. The user's labels
//! are checked once at start so that the mistake is a clear error, not a stream of refused
//! pushes; what the agent computes per process (service names) is made to fit.

use std::collections::BTreeMap;

use crate::workload::label_name::valid_name;

pub use crate::workload::label_name::{fit_value, MAX_NAME_BYTES, MAX_VALUE_BYTES};

/// Pyroscope's default `validation.max-label-names-per-series`, `__name__` included.
pub const MAX_NAMES: usize = 30;

/// Labels that the agent sets on every series (or may set, like `device`): a user label of the
/// same name would make every series a duplicate and have it refused.
pub const RESERVED: &[(&str, &str)] = &[
    ("__name__", "it names the profile type"),
    ("service_name", "use --service-name rules or GPUFLAME_SERVICE_NAME in the process's environment"),
    ("hostname", "use --hostname to change it"),
    ("device", "the agent sets it on the GPU profiles of each device"),
    ("thread_name", "the agent sets it with --thread-names label"),
    ("namespace", "the agent sets it from the Kubernetes pod"),
    ("pod", "the agent sets it from the Kubernetes pod"),
    ("container", "the agent sets it from the Kubernetes pod"),
    ("node", "the agent sets it from NODE_NAME in Kubernetes"),
    ("app", "the agent sets it from the pod's app.kubernetes.io/name or app label"),
    ("pod_uid", "the agent sets it from the process's cgroup"),
    ("container_id", "the agent sets it from the process's cgroup"),
    ("rank", "the agent sets it from the process's environment (RANK, SLURM_PROCID…; see --rank-label)"),
    ("local_rank", "the agent sets it from the process's environment (LOCAL_RANK, SLURM_LOCALID…; see --rank-label)"),
    ("world_size", "the agent sets it from the process's environment (WORLD_SIZE, SLURM_NTASKS…; see --rank-label)"),
    ("group_rank", "the agent sets it from the process's environment (GROUP_RANK, SLURM_NODEID; see --rank-label)"),
];

/// How many names the agent itself may put on a series besides the rank labels: `__name__`,
/// `service_name`, `hostname`, `device`, `thread_name` (a sample label Pyroscope makes a series
/// label) and a workload's five at most (`namespace`, `pod`, `container` or `container_id`,
/// `node`, `app`). The user's labels get what the rank labels leave of the rest.
pub const AGENT_NAMES: usize = 10;

/// Checks the user's labels (`--label`, the config file's `[labels]`) as Pyroscope would, and
/// that they leave the agent's own labels alone, the rank labels `rank_names` among them.
pub fn check_user_labels(labels: &BTreeMap<String, String>, rank_names: &[&str]) -> Result<(), String> {
    for (name, value) in labels {
        if let Some((_, hint)) = RESERVED.iter().find(|(r, _)| r == name) {
            return Err(format!("the label {name} is set by the agent ({hint})"));
        }
        if rank_names.contains(&name.as_str()) {
            return Err(format!("the label {name} is set by the agent from the process's environment (--rank-label)"));
        }
        if name.is_empty() {
            return Err("a label needs a name: --label NAME=VALUE".into());
        }
        if name.starts_with("__") {
            return Err(format!("the label name {name:?} is reserved: names that start with __ are Pyroscope's own"));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(format!("the label name {}… is {} bytes long; Pyroscope takes at most {MAX_NAME_BYTES}", short(name), name.len()));
        }
        if !valid_name(name) {
            return Err(format!("the label name {name:?} is not valid: use letters, digits and _, not starting with a digit"));
        }
        if value.is_empty() {
            return Err(format!("the label {name} has an empty value (Pyroscope would treat it as absent)"));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!("the value of the label {name} is {} bytes long; Pyroscope takes at most {MAX_VALUE_BYTES}", value.len()));
        }
    }
    let agent = AGENT_NAMES + rank_names.len();
    if labels.len() + agent > MAX_NAMES {
        return Err(format!(
            "{} labels given; Pyroscope takes {MAX_NAMES} names a series and the agent uses up to {agent} ({} of them rank labels), so at most {}",
            labels.len(),
            rank_names.len(),
            MAX_NAMES.saturating_sub(agent)
        ));
    }
    Ok(())
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The first rule of Pyroscope's that `labels` break, if any: the last check before a series is
/// queued, for labels that come from processes.
pub fn check_series(labels: &[(String, String)]) -> Result<(), String> {
    if labels.len() > MAX_NAMES {
        return Err(format!("{} label names, Pyroscope takes {MAX_NAMES}", labels.len()));
    }
    let mut names: Vec<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("duplicate label name {}", w[0]));
    }
    for (name, value) in labels {
        if (name != "__name__" && !valid_name(name)) || name.len() > MAX_NAME_BYTES {
            return Err(format!("invalid label name {:?}", short(name)));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!("the value of {name} is {} bytes", value.len()));
        }
        if name == "service_name" && value.is_empty() {
            return Err("empty service_name".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn user_labels_follow_pyroscopes_rules() {
        let ranks = ["rank", "local_rank", "world_size", "group_rank"];
        assert!(check_user_labels(&labels(&[("env", "prod"), ("zone_2", "a")]), &ranks).is_ok());
        let err = |kv: &[(&str, &str)]| check_user_labels(&labels(kv), &ranks).unwrap_err();
        assert!(err(&[("hostname", "x")]).contains("set by the agent"));
        assert!(err(&[("service_name", "x")]).contains("set by the agent"));
        assert!(err(&[("namespace", "x")]).contains("set by the agent"));
        assert!(err(&[("container_id", "x")]).contains("set by the agent"));
        assert!(err(&[("world_size", "x")]).contains("set by the agent"));
        assert!(check_user_labels(&labels(&[("node_rank", "x")]), &["node_rank"]).unwrap_err().contains("--rank-label"));
        assert!(err(&[("__meta", "x")]).contains("reserved"));
        assert!(err(&[("2x", "x")]).contains("not valid"));
        assert!(err(&[("a-b", "x")]).contains("not valid"));
        assert!(err(&[("a.b", "x")]).contains("not valid"));
        assert!(err(&[("env", "")]).contains("empty"));
        assert!(err(&[(&"n".repeat(1025), "x")]).contains("1024"));
        assert!(err(&[("env", &"v".repeat(2049))]).contains("2048"));
        // 30 names: the agent's 10, the 4 rank labels, 16 of the user's.
        let many = |n: usize| (0..n).map(|i| (format!("l{i}"), "v".to_string())).collect::<BTreeMap<String, String>>();
        assert!(check_user_labels(&many(16), &ranks).is_ok());
        assert!(check_user_labels(&many(17), &ranks).unwrap_err().contains("at most 16"));
        assert!(check_user_labels(&many(20), &[]).is_ok(), "no rank labels leave room for 20");
    }

    #[test]
    fn every_label_the_agent_may_set_and_the_users_fit_in_one_series() {
        let agent = ["__name__", "service_name", "hostname", "device", "thread_name", "namespace", "pod", "container", "node", "app"];
        assert_eq!(agent.len(), AGENT_NAMES);
        let ranks = ["rank", "local_rank", "world_size", "group_rank"];
        let user: BTreeMap<String, String> = (0..16).map(|i| (format!("l{i}"), "v".to_string())).collect();
        check_user_labels(&user, &ranks).unwrap();
        let mut series: Vec<(String, String)> = agent.iter().chain(&ranks).map(|n| (n.to_string(), "1".to_string())).collect();
        series[0].1 = "process_cpu".into();
        series.extend(user);
        assert_eq!(check_series(&series), Ok(()));
    }

    #[test]
    fn values_are_cut_to_fit() {
        assert_eq!(fit_value("svc"), "svc");
        let long = "é".repeat(2000);
        let fitted = fit_value(&long);
        assert!(fitted.len() <= MAX_VALUE_BYTES && fitted.ends_with('…'), "{}", fitted.len());
    }

    #[test]
    fn series_checks_catch_duplicates_and_empty_services() {
        let s = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert!(check_series(&s(&[("__name__", "process_cpu"), ("service_name", "a"), ("hostname", "h")])).is_ok());
        assert!(check_series(&s(&[("service_name", "a"), ("hostname", "h"), ("hostname", "x")])).unwrap_err().contains("duplicate"));
        assert!(check_series(&s(&[("service_name", "")])).is_err());
    }
}
