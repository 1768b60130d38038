//! The ranks of a distributed job, read from each process's environment (RANK, LOCAL_RANK,
//! WORLD_SIZE): string sample labels of each rank's samples in `record`, a series per rank in the
//! agent. Run as root.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::process::Command;

use common::agent::*;
use common::receiver::Receiver;
use common::*;
use gpuflame::output::pprof_proto as pb;
use prost::Message;

/// Each sample of a pprof file (a stack with its labels): its pid, its string labels and how
/// many times it was sampled.
fn samples_by_pid(path: &std::path::Path) -> Vec<(u32, BTreeMap<String, String>, i64)> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_end(&mut raw).unwrap();
    let p = pb::Profile::decode(raw.as_slice()).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample
        .iter()
        .map(|sample| {
            let pid = sample.label.iter().find(|l| s(l.key) == "pid").map_or(0, |l| l.num as u32);
            let strings = sample.label.iter().filter(|l| l.str != 0).map(|l| (s(l.key), s(l.str))).collect();
            (pid, strings, sample.value[0] / p.period)
        })
        .collect()
}

fn pid_in(path: &std::path::Path) -> u32 {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.trim().parse().unwrap_or_else(|_| panic!("{}: {text:?}", path.display()))
}

#[test]
fn record_labels_every_sample_of_a_rank_with_its_rank_and_the_launchers_with_none() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let out = dir.path().join("ranks.pb.gz");
    let d = dir.path().display();
    let c = chain.display();
    // A launcher: two ranks (a second of CPU each, once the recording has their tables), then
    // work of its own, then it waits for them.
    let script = format!(
        "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 {c} 1 & echo $! > {d}/rank0; \
         RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 {c} 1 & echo $! > {d}/rank1; \
         echo $$ > {d}/launcher; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; wait"
    );
    let gate = Gate::new(dir.path(), "gate");
    let (status, stderr) = record_gated(&gate, &["record", "-F", "199", "--format", "pprof", "-o", out.to_str().unwrap(), "--", "sh", "-c", &script], 2);
    assert!(status.success(), "{stderr}");
    let (rank0, rank1, launcher) = (pid_in(&dir.path().join("rank0")), pid_in(&dir.path().join("rank1")), pid_in(&dir.path().join("launcher")));
    let at_gate: BTreeSet<u32> = gate.arrivals(2).into_iter().collect();
    assert_eq!(at_gate, [rank0, rank1].into(), "the ranks are the programs that reached the gate");

    let samples = samples_by_pid(&out);
    let of = |pid: u32| samples.iter().filter(|(p, _, _)| *p == pid).map(|(_, l, n)| (l, *n)).collect::<Vec<_>>();
    let count = |of: &[(&BTreeMap<String, String>, i64)]| of.iter().map(|(_, n)| n).sum::<i64>();
    for (pid, rank) in [(rank0, "0"), (rank1, "1")] {
        let mine = of(pid);
        // A second of CPU at 199 Hz: ~199 samples; enough to say each carries the labels.
        assert!(count(&mine) >= 100, "{} samples of rank {rank} (pid {pid})\n{stderr}", count(&mine));
        let want: BTreeMap<String, String> = [("rank", rank), ("local_rank", rank), ("world_size", "2")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for (labels, _) in &mine {
            let got: BTreeMap<String, String> = labels.iter().filter(|(k, _)| *k != "comm").map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(got, want, "a sample of rank {rank} (pid {pid})");
        }
    }
    let launcher_samples = of(launcher);
    assert!(count(&launcher_samples) > 0, "no samples of the launcher (pid {launcher}):\n{stderr}");
    for (labels, _) in launcher_samples {
        assert!(labels.keys().all(|k| k == "comm"), "the launcher has no rank: {labels:?}");
    }
    // -v counts what was read.
    let line = stderr.lines().find(|l| l.contains("rank labels")).unwrap_or_else(|| panic!("no rank labels line:\n{stderr}"));
    let labelled: u64 = line.split_whitespace().find_map(|w| w.strip_prefix("processes_labelled=")?.parse().ok()).unwrap_or(0);
    assert!(labelled >= 2, "{line}");
}

/// A rank whose environment is a mebibyte of variables and whose RANK is 10 KB with control
/// characters in it: profiled as any process, its RANK left out and counted, the rest of its
/// labels kept.
#[test]
fn a_hostile_environment_loses_its_bad_labels_and_nothing_else() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let out = dir.path().join("hostile.pb.gz");
    let rank = format!("1\x1b[31m\n{}", "9".repeat(10_000));
    let gate = Gate::new(dir.path(), "gate");
    let mut cmd = vec!["record".to_string(), "-v".into(), "-F".into(), "199".into(), "--format".into(), "pprof".into(), "-o".into(), out.display().to_string(), "--".into(), "env".into()];
    // 16 variables of 64 KiB (one string may not exceed 128 KiB), then the ranks.
    cmd.extend((0..16).map(|i| format!("FILLER_{i}={}", "x".repeat(64 << 10))));
    cmd.extend([format!("RANK={rank}"), "LOCAL_RANK=3".into(), "WORLD_SIZE=8".into(), chain.display().to_string(), "1".into()]);
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let (status, stderr) = record_gated(&gate, &args, 1);
    assert_eq!(status.code(), Some(3), "record exits with the program's code (chain's is 3):\n{stderr}");
    let pid = gate.arrivals(1)[0];
    let mine: Vec<_> = samples_by_pid(&out).into_iter().filter(|(p, _, _)| *p == pid).collect();
    let count: i64 = mine.iter().map(|(_, _, n)| n).sum();
    assert!(count >= 100, "{count} samples of the process (pid {pid})\n{stderr}");
    for (labels, _) in mine.iter().map(|(_, l, n)| (l, n)) {
        let got: Vec<(&str, &str)> = labels.iter().filter(|(k, _)| *k != "comm").map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("local_rank", "3"), ("world_size", "8")], "the bad RANK left out, the others kept");
    }
    let line = stderr.lines().find(|l| l.contains("rank labels")).unwrap_or_else(|| panic!("no rank labels line:\n{stderr}"));
    let left_out: u64 = line.split_whitespace().find_map(|w| w.strip_prefix("values_left_out=")?.parse().ok()).unwrap_or(0);
    assert!(left_out >= 1, "{line}");
}

#[test]
fn the_agent_pushes_each_rank_as_a_series_of_its_own() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("ranked_train");
    std::fs::copy(build_c(dir.path(), "chain", FP_FLAGS), &exe).unwrap();
    let _ranks: Vec<Workload> = ["0", "1"]
        .iter()
        .map(|r| Workload(Command::new(&exe).arg("60").env("RANK", r).env("LOCAL_RANK", r).env("WORLD_SIZE", "2").spawn().unwrap()))
        .collect();
    let receiver = Receiver::start(Box::new(|_| 200));
    // pid labels kept: a process's labels must still not be written as sample labels.
    let out = gpuflame_ok(&["agent", "--server", &receiver.url(), "--once", "--window", "3", "-F", "99", "--pid-labels"], 0);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_clean(&receiver);

    let got = receiver.received();
    let series: Vec<_> = service(&got, "ranked_train").into_iter().filter(|r| r.labels["__name__"] == "process_cpu").collect();
    let by_rank: BTreeMap<&str, _> = series.iter().map(|r| (r.sent_labels.get("rank").map_or("none", String::as_str), *r)).collect();
    assert_eq!(by_rank.keys().copied().collect::<Vec<_>>(), ["0", "1"], "one series per rank: {:?}\n{log}", series.iter().map(|r| &r.sent_labels).collect::<Vec<_>>());
    assert_eq!(series.len(), 2);
    for (rank, r) in by_rank {
        assert_eq!(r.sent_labels.get("local_rank").map(String::as_str), Some(rank));
        assert_eq!(r.sent_labels.get("world_size").map(String::as_str), Some("2"));
        let labels: Vec<(String, String)> = r.sent_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(gpuflame::agent::labels::check_series(&labels), Ok(()));
        assert!(r.profile.total() > 0, "rank {rank} has no samples");
    }
    for r in &got {
        assert!(r.string_label_keys.iter().all(|k| k == "thread_name" || k == "device"), "sample labels of {:?}: {:?}", r.sent_labels, r.string_label_keys);
    }
}
