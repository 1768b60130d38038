//! NCCL's collectives against a stand-in libnccl.so.2 (the real names and signatures; its
//! collectives block until every rank has arrived, through shared memory, and then run one
//! "kernel" whose device time is how long the rank waited): a 4-rank Python job in which rank 2
//! does three times the work of the others before each collective. Real BPF, real processes;
//! run as root.

mod common;

use std::collections::BTreeMap;

use common::agent::{agent, assert_clean, serial};
use common::receiver::Receiver;
use common::*;
use gpuflame::output::pprof;
use gpuflame::profile::Profile;

const STEPS: u64 = 12;
const SLOW_RANK: u32 = 2;

/// What each rank printed: pid → its `key=value` pairs (rank, pid, the calls and bytes it made).
fn ranks_of(stdout: &str) -> BTreeMap<u32, BTreeMap<String, String>> {
    let mut by_rank: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in stdout.lines() {
        let kv: BTreeMap<String, String> = line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if let Some(rank) = kv.get("rank") {
            by_rank.entry(rank.clone()).or_default().extend(kv);
        }
    }
    by_rank.into_values().map(|kv| (kv["pid"].parse().expect("a pid"), kv)).collect()
}

/// The function names of a sample's stack, root first.
fn frames(p: &Profile, s: &gpuflame::profile::Sample) -> Vec<String> {
    s.stack.iter().flat_map(|&l| p.locations[l].lines.iter().map(|line| line.function.clone())).collect()
}

/// A Python frame's function without its class (`Rank.compute` is `compute`) or line.
fn python_function(frame: &str) -> &str {
    let name = frame.split(" (").next().unwrap_or(frame);
    name.rsplit('.').next().unwrap_or(name)
}

/// Sum of value `i` over the samples of `pid` whose stack holds `function` and ends in `leaf`
/// (or holds it anywhere, when `leaf` is empty).
fn sum(p: &Profile, pid: u32, function: &str, leaf: &str, i: usize) -> i64 {
    p.samples
        .iter()
        .filter(|s| s.labels.pid == Some(pid))
        .filter(|s| {
            let f = frames(p, s);
            f.iter().any(|n| python_function(n) == function) && (leaf.is_empty() || f.last().is_some_and(|l| l.starts_with(leaf)))
        })
        .map(|s| s.values[i])
        .sum()
}

fn describe_profile(p: &Profile) -> String {
    let mut lines: Vec<String> = p.samples.iter().map(|s| format!("pid {:?} {:?}: {}", s.labels.pid, s.values, frames(p, s).join(" → "))).collect();
    lines.sort();
    lines.truncate(60);
    lines.join("\n")
}

#[test]
fn each_ranks_collectives_are_exact_and_the_fast_ranks_wait_for_the_slow_one() {
    let (dir, nccl, python) = common::cuda::nccl_stand_ins();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let script = common::cuda::source("ranks.py");
    let out = path("job.pb.gz");
    let steps = STEPS.to_string();
    let slow = SLOW_RANK.to_string();
    let env = [
        format!("NCCL={}", nccl.display()),
        format!("CUDA={}", path("libcuda.so.1")),
        format!("GPUFLAME_CUPTI_PATH={}", path("libcupti.so.13")),
    ];
    let mut args = vec!["record", "--profiles", "cpu,collectives,collective-time", "-F", "199", "-o", &out, "--", "env"];
    args.extend(env.iter().map(String::as_str));
    args.extend([python, &script, "4", &steps, &slow]);
    let run = gpuflame_ok(&args, 0);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let ranks = ranks_of(&stdout);
    assert_eq!(ranks.len(), 4, "four ranks reported:\n{stdout}\n{stderr}");

    let read = |kind: &str| pprof::read(&std::fs::read(path(&format!("job.{kind}.pb.gz"))).unwrap()).unwrap();
    let calls = read("collectives");
    let time = read("collective-time");
    let cpu = read("cpu");
    let ctx = format!("{}\n--- time\n{}\n--- stderr\n{stderr}", describe_profile(&calls), describe_profile(&time));

    let mut waits = BTreeMap::new();
    for (&pid, kv) in &ranks {
        let rank: u32 = kv["rank"].parse().unwrap();
        let n = |k: &str| -> i64 { kv[k].parse().unwrap() };
        // Every call, under the Python function that made it, with its bytes: exact.
        assert_eq!(sum(&calls, pid, "all_reduce_gradients", "ncclAllReduce", 0), n("allreduce_calls"), "rank {rank}\n{ctx}");
        assert_eq!(sum(&calls, pid, "all_reduce_gradients", "ncclAllReduce", 1), n("allreduce_bytes"), "rank {rank}\n{ctx}");
        assert_eq!(sum(&calls, pid, "gather_metrics", "ncclAllGather", 0), n("allgather_calls"), "rank {rank}\n{ctx}");
        assert_eq!(sum(&calls, pid, "gather_metrics", "ncclAllGather", 1), n("allgather_bytes"), "rank {rank}\n{ctx}");
        assert_eq!(n("allreduce_calls"), STEPS as i64);
        assert_eq!(n("allreduce_bytes"), STEPS as i64 * 4 * 1024 * 1024);
        // Device time under the same lines.
        let reduce = sum(&time, pid, "all_reduce_gradients", "[gpu] ncclDevKernel_AllReduce", 0);
        assert!(reduce > 0, "rank {rank} has all-reduce time\n{ctx}");
        waits.insert(rank, reduce + sum(&time, pid, "gather_metrics", "[gpu] ncclDevKernel_AllGather", 0));
    }
    eprintln!("collective time by rank (ns): {waits:?}");
    // The ranks that wait for rank 2 spend at least twice its time in collectives.
    let slow_wait = waits[&SLOW_RANK];
    for (&rank, &w) in &waits {
        if rank != SLOW_RANK {
            assert!(w >= 2 * slow_wait, "rank {rank} waited {w} ns, rank {SLOW_RANK} {slow_wait} ns: {waits:?}\n{ctx}");
        }
    }
    // Every sample of a rank carries its rank, in every profile.
    for p in [&calls, &time, &cpu] {
        for (&pid, kv) in &ranks {
            let labels = p.process_labels.get(&pid).unwrap_or_else(|| panic!("pid {pid} has no labels: {:?}", p.process_labels));
            assert!(labels.contains(&("rank".to_string(), kv["rank"].clone())) && labels.contains(&("world_size".to_string(), "4".to_string())), "{labels:?}");
        }
    }
    // Two ranks of the recording compared as two runs: rank 0 waited where rank 2 did not.
    let diff = path("wait.folded");
    let collective_time = path("job.collective-time.pb.gz");
    gpuflame_ok(&["diff", &collective_time, &collective_time, "--base-where", "rank=2", "--new-where", "rank=0", "-o", &diff], 0);
    let (mut base, mut new) = (0i64, 0i64);
    for line in std::fs::read_to_string(&diff).unwrap().lines() {
        let mut numbers = line.rsplitn(3, ' ');
        new += numbers.next().unwrap().parse::<i64>().unwrap();
        base += numbers.next().unwrap().parse::<i64>().unwrap();
    }
    assert!(base > 0 && new >= 2 * base, "diff of rank 2 (base, {base} ns) against rank 0 ({new} ns)");
    // A flame graph of one rank says whose it is.
    let svg = path("rank2.svg");
    gpuflame_ok(&["convert", &path("job.cpu.pb.gz"), "--where", "rank=2", "-o", &svg], 0);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("rank 2") && svg.contains("world_size 4"), "the subtitle names the rank");
    // And rank 2's CPU profile shows why: more of its time in compute than any other rank's.
    let computing: BTreeMap<u32, i64> = ranks.iter().map(|(&pid, kv)| (kv["rank"].parse().unwrap(), sum(&cpu, pid, "compute", "", 0))).collect();
    eprintln!("CPU samples in compute by rank: {computing:?}");
    for (&rank, &c) in &computing {
        if rank != SLOW_RANK {
            assert!(computing[&SLOW_RANK] > 2 * c, "compute time by rank: {computing:?}");
        }
    }
}

/// The agent, with ranks started with gpuflame's CUPTI library as a user would start them: one
/// series per rank and profile, labelled with the rank, within Pyroscope's rules; the ranks that
/// wait have the collective time.
#[test]
fn the_agent_pushes_each_rank_as_its_own_series() {
    let _serial = serial();
    let (dir, nccl, python) = common::cuda::nccl_stand_ins();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let injection = path("libgpuflame_cupti.so");
    gpuflame_ok(&["cupti-library", &injection], 0);
    let receiver = Receiver::start(Box::new(|_| 200));
    let agent = agent(&["--server", &receiver.url(), "--window", "2", "-F", "49", "--profiles", "cpu,collectives,collective-time"]);
    let ranks = std::process::Command::new(python)
        .args([&common::cuda::source("ranks.py"), "4", &STEPS.to_string(), &SLOW_RANK.to_string()])
        .env("NCCL", &nccl)
        .env("CUDA", path("libcuda.so.1"))
        .env("CUDA_INJECTION64_PATH", &injection)
        .env("GPUFLAME_CUPTI_PATH", path("libcupti.so.13"))
        // The library waits for the agent to have its tables and hooks, as record -- CMD has it.
        .env("GPUFLAME_CUPTI_WAIT_MS", "5000")
        .output()
        .unwrap();
    let log = agent.stop();
    let stdout = String::from_utf8_lossy(&ranks.stdout);
    assert!(ranks.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&ranks.stderr));
    assert_clean(&receiver);

    let got = receiver.received();
    let of = |name: &str| -> BTreeMap<String, i64> {
        let mut by_rank = BTreeMap::new();
        for r in got.iter().filter(|r| r.labels.get("__name__").map(String::as_str) == Some(name)) {
            if let Some(rank) = r.labels.get("rank") {
                *by_rank.entry(rank.clone()).or_default() += r.profile.total();
            }
        }
        by_rank
    };
    let calls = of("nccl_collectives");
    let time = of("nccl_collective_time");
    let series: std::collections::BTreeSet<String> = got.iter().map(|r| format!("{:?}", r.labels)).collect();
    let ctx = format!("calls {calls:?}, time {time:?}\nseries: {series:#?}\n{log}");
    let ranks: Vec<String> = (0..4).map(|r| r.to_string()).collect();
    assert_eq!(calls.keys().cloned().collect::<Vec<_>>(), ranks, "a collectives series per rank: {ctx}");
    assert_eq!(time.keys().cloned().collect::<Vec<_>>(), ranks, "a collective-time series per rank: {ctx}");
    let slow = time[&SLOW_RANK.to_string()];
    for (rank, &t) in &time {
        if *rank != SLOW_RANK.to_string() {
            assert!(t >= 2 * slow, "rank {rank} waited {t} ns, the slow rank {slow} ns: {ctx}");
        }
    }
}
