//! `gpuflame dump`: where every thread of some processes is now, as py-spy dump answers it, with
//! Python, native and kernel frames, for every rank of a job at once, without stopping anything:
//! no ptrace, no signal. Threads that wait are read where they lie (their registers as the
//! kernel saved them, their stacks from their memory); threads that run give their next CPU
//! sample. Threads and ranks with the same stack are grouped.

mod group;
mod print;

use std::time::{Duration, Instant};

use gpuflame_bpf::{SamplerConfig, Targets};

use crate::profile_kind::ProfileKind;
use crate::session::{Session, SessionConfig};
use crate::workload::rank::RankLabels;
use crate::{preflight, target, UserError};

/// How long the running threads' CPU samples are waited for.
const RUNNING_WAIT: Duration = Duration::from_millis(250);
/// The CPU sampler's frequency while it waits: a running thread is sampled within milliseconds.
const FREQUENCY_HZ: u64 = 997;

#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub pids: Vec<u32>,
    /// Every process whose command line contains one of these.
    pub matching: Vec<String>,
    pub json: bool,
    pub rank_labels: RankLabels,
}

/// The processes a dump names: its pids, and those whose command line matches.
fn targets(opts: &DumpOptions) -> anyhow::Result<Vec<u32>> {
    for &pid in &opts.pids {
        target::check_pid(pid)?;
    }
    let mut pids = opts.pids.clone();
    if !opts.matching.is_empty() {
        let own = std::process::id();
        let entries = std::fs::read_dir("/proc").map_err(|e| UserError(format!("cannot list /proc: {e}")))?;
        for pid in entries.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if pid != own && !cmdline.is_empty() && opts.matching.iter().any(|m| cmdline.contains(m.as_str())) && target::process_alive(pid) {
                pids.push(pid);
            }
        }
        if pids.is_empty() {
            return Err(UserError(format!("no process's command line contains {}", opts.matching.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>().join(" or "))).into());
        }
    }
    if pids.is_empty() {
        return Err(UserError("name the processes: -p PID (repeatable) or --match TEXT".into()).into());
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

pub fn run(opts: &DumpOptions) -> anyhow::Result<i32> {
    preflight::check_privileges()?;
    preflight::check_btf()?;
    let pids = targets(opts)?;
    let started = Instant::now();
    let mut session = Session::start(SessionConfig {
        targets: Targets::Processes { pids: pids.clone(), follow_forks: false },
        frequency_hz: FREQUENCY_HZ,
        unwind_memory: SamplerConfig::DEFAULT_UNWIND_MEMORY,
        profiles: vec![ProfileKind::Cpu],
        cuda_duty: None,
        rank_labels: opts.rank_labels.clone(),
        memory_timeline: false,
        tensor_sample_bytes: 0,
        max_live_allocations: 1,
        tensors_by_hooks: false,
        service_names: None,
        check_unwinder: false,
        thread_reports: true,
    })?;
    tracing::info!(ms = started.elapsed().as_millis() as u64, "session started");
    let now = session.threads_now(RUNNING_WAIT)?;
    tracing::info!(ms = started.elapsed().as_millis() as u64, "threads read and symbolized");
    let dump = group::Dump::new(now, &pids);
    let elapsed = started.elapsed();
    if opts.json {
        println!("{}", print::json(&dump, elapsed));
    } else {
        print!("{}", print::text(&dump, elapsed));
    }
    Ok(0)
}
