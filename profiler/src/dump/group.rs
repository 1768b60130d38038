//! A dump's threads, and their stacks grouped: threads whose stacks are the same, across
//! processes, are one group with their count, so that the odd rank out stands apart (seven ranks
//! in `ncclAllReduce`, one still loading data).

use std::collections::{BTreeMap, HashMap};

use gpuflame_bpf::{ThreadReport, ThreadState};

use crate::frame::FrameKind;
use crate::profile::Profile;
use crate::session::ThreadsNow;
use crate::workload::rank::ProcessLabels;

/// One frame of a thread's stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub kind: FrameKind,
}

/// A thread as it is now.
#[derive(Debug, Clone)]
pub struct Thread {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub state: ThreadState,
    /// How long it has not run (not while it runs).
    pub waited_ns: Option<u64>,
    /// The system call it waits in, or the kernel function.
    pub waits_in: Option<String>,
    /// The outermost CUDA or NCCL call on its stack.
    pub call: Option<String>,
    /// Its group in [`Dump::groups`]; None when its stack could not be had.
    pub group: Option<usize>,
    /// Why it has no stack.
    pub no_stack: Option<&'static str>,
}

/// Threads with the same stack.
#[derive(Debug, Clone)]
pub struct Group {
    /// Root first.
    pub frames: Vec<Frame>,
    /// Indices into [`Dump::threads`].
    pub threads: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Process {
    pub pid: u32,
    pub command: String,
    pub labels: Vec<(String, String)>,
}

pub struct Dump {
    pub processes: Vec<Process>,
    pub threads: Vec<Thread>,
    /// The most threads first.
    pub groups: Vec<Group>,
}

impl Dump {
    pub fn new(now: ThreadsNow, pids: &[u32]) -> Dump {
        let stacks = stacks_by_thread(&now.stacks);
        let mut threads: Vec<Thread> = now.threads.iter().map(|r| thread(r, stacks.get(&(r.pid, r.tid)))).collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        let mut by_frames: HashMap<Vec<Frame>, usize> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        for (i, t) in threads.iter().enumerate() {
            let Some(frames) = stacks.get(&(t.pid, t.tid)) else { continue };
            let g = *by_frames.entry(frames.clone()).or_insert_with(|| {
                groups.push(Group { frames: frames.clone(), threads: Vec::new() });
                groups.len() - 1
            });
            groups[g].threads.push(i);
        }
        groups.sort_by_key(|g| (std::cmp::Reverse(g.threads.len()), g.threads.first().copied()));
        for (g, group) in groups.iter().enumerate() {
            for &i in &group.threads {
                threads[i].group = Some(g);
            }
        }
        let processes = pids.iter().map(|&pid| process(pid, &now.labels)).collect();
        Dump { processes, threads, groups }
    }
}

fn process(pid: u32, labels: &ProcessLabels) -> Process {
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let command = crate::names::sanitize(&command).into_owned();
    let labels = labels.get(&pid).cloned().unwrap_or_default();
    Process { pid, command, labels }
}

/// Each thread's frames, root first, from the profile whose sample values are thread indices.
fn stacks_by_thread(profile: &Profile) -> HashMap<(u32, u32), Vec<Frame>> {
    let mut out = HashMap::new();
    for s in &profile.samples {
        let (Some(pid), Some(tid)) = (s.labels.pid, s.labels.tid) else { continue };
        let mut frames = Vec::new();
        for &l in &s.stack {
            let Some(loc) = profile.locations.get(l) else { continue };
            if loc.kind == FrameKind::Thread {
                continue;
            }
            for line in &loc.lines {
                frames.push(Frame { function: line.function.clone(), file: line.file.clone(), line: line.line, kind: loc.kind });
            }
        }
        out.insert((pid, tid), frames);
    }
    out
}

fn thread(r: &ThreadReport, frames: Option<&Vec<Frame>>) -> Thread {
    let running = r.state == ThreadState::Running;
    let no_stack = match (frames, r.regs) {
        (Some(_), _) => None,
        (None, _) if running => Some("running: no CPU sample came while the dump waited"),
        (None, None) => Some("no user registers (a thread in the kernel only)"),
        (None, Some(_)) => Some("its stack could not be read or unwound"),
    };
    Thread {
        pid: r.pid,
        tid: r.tid,
        name: crate::names::sanitize(&r.comm).into_owned(),
        state: r.state,
        waited_ns: (!running).then(|| r.waited_ns()),
        waits_in: if running { None } else { waits_in(r) },
        call: frames.and_then(|f| api_call(f)),
        group: None,
        no_stack,
    }
}

/// The outermost CUDA or NCCL call of a stack: the one the application made.
fn api_call(frames: &[Frame]) -> Option<String> {
    frames.iter().find(|f| f.kind != FrameKind::Python && is_api(&f.function)).map(|f| f.function.clone())
}

fn is_api(name: &str) -> bool {
    let name = name.strip_prefix('p').filter(|n| n.starts_with("nccl")).unwrap_or(name);
    let after = |prefix: &str| name.strip_prefix(prefix).and_then(|r| r.chars().next()).is_some_and(|c| c.is_ascii_uppercase());
    after("nccl") || after("cuda") || after("cu")
}

/// What a thread that does not run waits in: its system call.
fn waits_in(r: &ThreadReport) -> Option<String> {
    r.syscall.map(|n| syscall_name(n).map_or_else(|| format!("syscall {n}"), str::to_string))
}

/// x86-64 system call numbers a waiting thread is commonly in.
fn syscall_name(nr: u64) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        7 => "poll",
        16 => "ioctl",
        17 => "pread64",
        19 => "readv",
        23 => "select",
        24 => "sched_yield",
        34 => "pause",
        35 => "nanosleep",
        42 => "connect",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        61 => "wait4",
        72 => "fcntl",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        247 => "waitid",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        299 => "recvmmsg",
        441 => "epoll_pwait2",
        449 => "futex_waitv",
        _ => return None,
    })
}

/// Ranks (or pids) of a group's threads, in order: `rank 0, 1, 3` or `pid 12, 13`.
pub fn who(dump: &Dump, threads: &[usize]) -> String {
    let mut ranks: BTreeMap<String, ()> = BTreeMap::new();
    let mut pids: Vec<u32> = threads.iter().map(|&i| dump.threads[i].pid).collect();
    pids.sort_unstable();
    pids.dedup();
    for &pid in &pids {
        if let Some(p) = dump.processes.iter().find(|p| p.pid == pid) {
            if let Some((_, rank)) = p.labels.iter().find(|(k, _)| k == "rank") {
                ranks.insert(rank.clone(), ());
            }
        }
    }
    let pid_list = pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    if ranks.len() == pids.len() && !ranks.is_empty() {
        let mut r: Vec<&String> = ranks.keys().collect();
        r.sort_by_key(|v| v.parse::<u64>().unwrap_or(u64::MAX));
        format!("rank {} (pid {pid_list})", r.into_iter().cloned().collect::<Vec<_>>().join(", "))
    } else {
        format!("pid {pid_list}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_and_nccl_calls_are_known_by_their_names() {
        for n in ["ncclAllReduce", "pncclAllReduce", "cudaStreamSynchronize", "cuLaunchKernelEx", "cuStreamSynchronize"] {
            assert!(is_api(n), "{n}");
        }
        for n in ["cudnn_conv", "nccl", "custom_op", "current", "pthread_cond_wait"] {
            assert!(!is_api(n), "{n}");
        }
        assert_eq!(syscall_name(202), Some("futex"));
    }
}
