//! Which service a process belongs to: the `service_name` label of its profiles.

use std::fs;

use regex::Regex;

use super::cgroup::CgroupWorkload;
use super::environ;
use super::pods::{PodInfo, Pods};

/// The environment variable a process can set to name its own service.
pub const SERVICE_NAME_ENV: &str = "GPUFLAME_SERVICE_NAME";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NameFrom {
    /// The command name (comm) of the process's main thread, as `ps` shows it.
    Comm,
    /// The program in the command line (argv[0], its file name), or the script for interpreters.
    Cmdline,
}

/// A regex on the command line and the service name it gives (`$1` etc. may refer to groups).
#[derive(Debug, Clone)]
pub struct NameRule {
    pub pattern: Regex,
    pub name: String,
}

/// The service that kernel threads (kworker, ksoftirqd, …) are pushed under.
pub const KERNEL_SERVICE: &str = "kernel";

/// Whose samples these are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A process, by its service name.
    Process(String),
    /// A kernel thread, or the idle task.
    Kernel,
}

/// What the samples of a process say about it, for when /proc no longer does.
#[derive(Debug, Clone, Copy)]
pub struct Hint<'a> {
    /// The comm of its main thread, when a sample of the main thread was taken.
    pub leader_comm: Option<&'a str>,
    /// The comm of one of its threads.
    pub thread_comm: &'a str,
}

/// The kernel marks its own threads with PF_KTHREAD in the task flags.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What /proc/PID/stat says of the process (its group leader): a process is the same one while
/// its start time and command name stay (a new name means exec, a new start time a reused pid).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    comm: String,
    kernel: bool,
    start_time: u64,
}

fn read_stat(pid: u32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces and parentheses.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state ppid pgrp session tty_nr tpgid flags … starttime (the 20th).
    let flags: u64 = fields.get(6)?.parse().ok()?;
    let start_time: u64 = fields.get(19)?.parse().ok()?;
    Some(Stat { comm, kernel: flags & PF_KTHREAD != 0, start_time })
}

/// What is known of a live process's service: read once, and again after an exec or a reuse of
/// its pid. Kept where the process is ([`ServiceStore`]: the registry's record of it).
#[derive(Debug)]
pub struct ProcessService {
    stat: Stat,
    /// From its environment or a rule: wins over everything else.
    explicit: Option<String>,
    /// From its comm or command line: the name when nothing else says more.
    default: String,
    workload: CgroupWorkload,
}

/// Where each process's [`ProcessService`] is kept while the process is known: the registry's
/// records of processes, or a map of its own.
pub trait ServiceStore {
    /// The place of `pid`'s, when a place is kept for it (none for a process the registry
    /// forgot: it is read for the moment, and not kept).
    fn place(&mut self, pid: u32) -> Option<&mut Option<ProcessService>>;
}

/// A store of its own, for the tests of what uses one.
#[cfg(test)]
impl ServiceStore for std::collections::HashMap<u32, Option<ProcessService>> {
    fn place(&mut self, pid: u32) -> Option<&mut Option<ProcessService>> {
        Some(self.entry(pid).or_default())
    }
}

/// The agent's naming of services, with where each process's is kept.
pub struct Services<'a> {
    pub namer: &'a ServiceNamer,
    pub store: &'a mut dyn ServiceStore,
}

impl Services<'_> {
    /// The owner of `pid`'s samples and its workload labels ([`ServiceNamer::owner`],
    /// [`ServiceNamer::labels`]).
    pub fn of(&mut self, pid: u32, hint: Hint<'_>) -> (Owner, Vec<(String, String)>) {
        let mut none = None;
        let place = self.store.place(pid).unwrap_or(&mut none);
        (self.namer.owner(pid, hint, place), self.namer.labels(place.as_ref()))
    }
}

pub struct ServiceNamer {
    from: NameFrom,
    rules: Vec<NameRule>,
    /// This node's pods, when the agent runs in Kubernetes.
    pods: Option<(Pods, String)>,
}

impl ServiceNamer {
    pub fn new(from: NameFrom, rules: Vec<NameRule>) -> Self {
        ServiceNamer { from, rules, pods: None }
    }

    /// Names and labels the processes of this node's pods after them (`NAMESPACE/CONTAINER`).
    pub fn with_pods(mut self, pods: Pods, node: String) -> Self {
        self.pods = Some((pods, node));
        self
    }

    /// Names `pid` from /proc while it lives, into `known`: once, and again after an exec or a
    /// reuse of the pid. Called as soon as a process shows in the samples, since short-lived ones
    /// are gone by the end of the window.
    pub fn observe(&self, pid: u32, known: &mut Option<ProcessService>) {
        if pid == 0 {
            return;
        }
        let Some(stat) = read_stat(pid) else { return };
        if known.as_ref().is_some_and(|k| k.stat == stat) {
            return;
        }
        *known = Some(if stat.kernel {
            ProcessService { stat, explicit: None, default: String::new(), workload: CgroupWorkload::default() }
        } else {
            let (explicit, default) = self.resolve(pid, &stat.comm);
            ProcessService { stat, explicit, default, workload: CgroupWorkload::of_pid(pid) }
        });
    }

    /// The owner of `pid`'s samples: its service (the process's own name, never a thread's,
    /// unless a rule or its environment says otherwise), or the kernel. A process that exited
    /// before it could be read is named from its main thread's samples, else from a thread's.
    pub fn owner(&self, pid: u32, hint: Hint<'_>, known: &mut Option<ProcessService>) -> Owner {
        if pid == 0 {
            return Owner::Kernel;
        }
        self.observe(pid, known);
        let Some(k) = known.as_ref() else { return Owner::Process(finish(hint.leader_comm.unwrap_or(hint.thread_comm))) };
        if k.stat.kernel {
            return Owner::Kernel;
        }
        if let Some(name) = &k.explicit {
            return Owner::Process(name.clone());
        }
        // Looked up now, not when first seen: a pod deleted since no longer names its processes.
        match self.pod_of(k) {
            Some((pod, Some(container))) => Owner::Process(finish(&format!("{}/{container}", pod.namespace))),
            _ => Owner::Process(k.default.clone()),
        }
    }

    fn pod_of(&self, k: &ProcessService) -> Option<(PodInfo, Option<String>)> {
        let (pods, _) = self.pods.as_ref()?;
        let pod = pods.get(k.workload.pod_uid.as_deref()?)?;
        let container = k.workload.container_id.as_ref().and_then(|id| pod.containers.get(id).cloned());
        Some((pod, container))
    }

    /// The workload labels of a process's series: namespace, pod, container, node and app for a
    /// pod's process the API knows; else what its cgroup says (pod_uid, container_id).
    pub fn labels(&self, known: Option<&ProcessService>) -> Vec<(String, String)> {
        let Some(k) = known.filter(|k| !k.stat.kernel) else { return Vec::new() };
        let mut out = Vec::new();
        let mut put = |name: &str, value: &str| out.push((name.to_string(), finish(value)));
        match self.pod_of(k) {
            Some((pod, container)) => {
                put("namespace", &pod.namespace);
                put("pod", &pod.name);
                match container {
                    Some(c) => put("container", &c),
                    None => k.workload.container_id.iter().for_each(|id| put("container_id", id)),
                }
                if let Some((_, node)) = &self.pods {
                    put("node", node);
                }
                if let Some(app) = &pod.app {
                    put("app", app);
                }
            }
            None => {
                if let Some(uid) = &k.workload.pod_uid {
                    put("pod_uid", uid);
                }
                if let Some(id) = &k.workload.container_id {
                    put("container_id", id);
                }
            }
        }
        out
    }

    /// The service of process `pid`, whose main thread's command name is `comm`. In order: the
    /// process's GPUFLAME_SERVICE_NAME, the first matching rule (unless it expands to nothing)
    /// — the explicit name —, then (the default) comm or the command line; between the two, for
    /// a pod's process, `NAMESPACE/CONTAINER` (see [`ServiceNamer::owner`]).
    fn resolve(&self, pid: u32, comm: &str) -> (Option<String>, String) {
        // Twice the longest label value: a longer name is cut to it by `finish` all the same.
        let env = environ::read(pid, &[SERVICE_NAME_ENV], 2 * super::label_name::MAX_VALUE_BYTES);
        if let Some(v) = env.as_ref().ok().and_then(|e| e.get(SERVICE_NAME_ENV)).filter(|v| !v.bytes.is_empty()) {
            return (Some(finish(&String::from_utf8_lossy(&v.bytes))), String::new());
        }
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>())
            .unwrap_or_default();
        let joined = cmdline.join(" ");
        if let Some(rule) = self.rules.iter().find(|r| r.pattern.is_match(&joined)) {
            let mut name = String::new();
            if let Some(caps) = rule.pattern.captures(&joined) {
                caps.expand(&rule.name, &mut name);
            }
            if !name.trim().is_empty() {
                return (Some(finish(&name)), String::new());
            }
            // A group that matched nothing: the rule has no name for this process.
            tracing::debug!(pid, rule = %rule.pattern, "service-name rule expanded to an empty name; using the default");
        }
        let default = match self.from {
            NameFrom::Comm => comm.to_string(),
            NameFrom::Cmdline => program_name(&cmdline).unwrap_or_else(|| comm.to_string()),
        };
        (None, finish(&default))
    }
}

/// A service name Pyroscope takes: sanitized like every name, within the label value limit, and
/// never empty (a process may clear its own comm).
fn finish(name: &str) -> String {
    let name = super::label_name::fit_value(&crate::names::sanitize(name));
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}

/// argv[0]'s file name; for an interpreter (python, node, java…), the script or module it runs.
pub fn program_name(argv: &[String]) -> Option<String> {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let first = base(argv.first()?);
    let interpreter = ["python", "node", "ruby", "perl", "java"].iter().any(|i| first.starts_with(i));
    if interpreter {
        let mut args = argv[1..].iter();
        while let Some(a) = args.next() {
            if a == "-m" {
                return args.next().cloned();
            }
            if !a.starts_with('-') {
                return Some(base(a));
            }
        }
    }
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(program_name(&v(&["/usr/bin/python3", "-u", "/srv/train.py", "--lr", "1"])).as_deref(), Some("train.py"));
        assert_eq!(program_name(&v(&["python3", "-m", "vllm.entrypoints.api_server"])).as_deref(), Some("vllm.entrypoints.api_server"));
        assert_eq!(program_name(&v(&["/opt/app/server", "--port", "80"])).as_deref(), Some("server"));
        assert_eq!(program_name(&[]), None);
    }

    fn service(n: &mut ServiceNamer, pid: u32) -> String {
        match n.owner(pid, Hint { leader_comm: None, thread_comm: "thread" }, &mut None) {
            Owner::Process(s) => s,
            Owner::Kernel => KERNEL_SERVICE.into(),
        }
    }

    #[test]
    fn rules_and_env_win_over_comm() {
        let me = std::process::id();
        let comm = fs::read_to_string(format!("/proc/{me}/comm")).unwrap().trim().to_string();
        let mut n = ServiceNamer::new(NameFrom::Comm, vec![]);
        // The process's own name, whatever thread the test runs on.
        assert_eq!(service(&mut n, me), comm);
        let rule = NameRule { pattern: Regex::new(r"(gpuflame)").unwrap(), name: "svc-$1".into() };
        let mut n = ServiceNamer::new(NameFrom::Comm, vec![rule]);
        // The test binary's command line contains "gpuflame" (its file name).
        assert_eq!(service(&mut n, me), "svc-gpuflame");
        // A group that matched nothing leaves the rule without a name: the default is used.
        let rule = NameRule { pattern: Regex::new(r"gpuflame(-never-there)?").unwrap(), name: "$1".into() };
        let mut n = ServiceNamer::new(NameFrom::Comm, vec![rule]);
        assert_eq!(service(&mut n, me), comm);
    }

    #[test]
    fn kernel_threads_and_gone_processes() {
        let n = ServiceNamer::new(NameFrom::Comm, vec![]);
        // kthreadd is pid 2 on every Linux, unless the test runs in a pid namespace.
        if fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
            assert_eq!(n.owner(2, Hint { leader_comm: None, thread_comm: "kthreadd" }, &mut None), Owner::Kernel);
        }
        assert_eq!(n.owner(0, Hint { leader_comm: None, thread_comm: "swapper/0" }, &mut None), Owner::Kernel);
        let gone = Hint { leader_comm: Some("main"), thread_comm: "worker" };
        assert_eq!(n.owner(u32::MAX - 1, gone, &mut None), Owner::Process("main".into()));
    }

    #[test]
    fn service_names_from_the_environment_are_sanitized() {
        let mut child = std::process::Command::new("sleep").arg("5").env(SERVICE_NAME_ENV, "svc\x1b;\n").spawn().expect("sleep");
        // spawn returns once the exec began; its environment shows a moment later.
        let service = (0..200)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                service(&mut ServiceNamer::new(NameFrom::Comm, vec![]), child.id())
            })
            .find(|s| s != "sleep");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(service.as_deref(), Some(r"svc\x1b;\n"));
    }
}
