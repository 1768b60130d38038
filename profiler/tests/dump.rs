//! `gpuflame dump`: every thread of some processes, where it is now, without stopping them. Real
//! BPF; run as root.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A process group killed when dropped (a job's launcher and its ranks).
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: signalling the group of our own child.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_group(cmd: &mut Command) -> Job {
    use std::os::unix::process::CommandExt;
    Job(cmd.process_group(0).stdout(Stdio::piped()).spawn().expect("starting the program"))
}

/// Reads the job's stdout until `n` lines contain `what`.
fn wait_lines(job: &mut Job, n: usize, what: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut out = BufReader::new(job.0.stdout.take().unwrap());
    while lines.iter().filter(|l: &&String| l.contains(what)).count() < n {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the program ended early: {lines:?}");
        lines.push(line.trim().to_string());
    }
    // Keep reading so that the program never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    lines
}

fn dump_json(args: &[&str]) -> (Value, String) {
    let mut all = vec!["dump", "--format", "json"];
    all.extend_from_slice(args);
    let out = gpuflame_ok(&all, 0);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}")), text)
}

fn functions(group: &Value) -> Vec<String> {
    group["frames"].as_array().unwrap().iter().map(|f| f["function"].as_str().unwrap_or_default().to_string()).collect()
}

fn rank_of(dump: &Value, pid: u64) -> Option<String> {
    dump["processes"].as_array()?.iter().find(|p| p["pid"] == pid)?["labels"]["rank"].as_str().map(str::to_string)
}

/// The ranks (by label) of a group's threads.
fn ranks_in(dump: &Value, group: &Value) -> Vec<String> {
    let mut r: Vec<String> = group["threads"].as_array().unwrap().iter().filter_map(|t| rank_of(dump, t["pid"].as_u64()?)).collect();
    r.sort();
    r
}

#[test]
fn the_rank_that_never_reaches_all_reduce_stands_apart_from_the_three_in_nccl() {
    let (dir, nccl, python) = common::cuda::nccl_stand_ins();
    let script = common::cuda::source("ranks.py");
    let mut job = spawn_group(
        Command::new(python)
            .args([script.as_str(), "4", "1", "0"])
            .env("NCCL", &nccl)
            .env("CUDA", dir.path().join("libcuda.so.1"))
            .env("STUCK_RANK", "2")
            .env("FAKE_NCCL_TIMEOUT_S", "120"),
    );
    wait_lines(&mut job, 4, "=1");
    std::thread::sleep(Duration::from_millis(500));

    let (dump, text) = dump_json(&["--match", &script]);
    let groups = dump["groups"].as_array().unwrap();
    let in_nccl: Vec<&Value> = groups.iter().filter(|g| g["call"].as_str().is_some_and(|c| c.ends_with("ncclAllReduce"))).collect();
    assert_eq!(in_nccl.len(), 1, "one group of threads in ncclAllReduce:\n{text}");
    assert_eq!(ranks_in(&dump, in_nccl[0]), ["0", "1", "3"], "ranks 0, 1 and 3 wait in ncclAllReduce together:\n{text}");
    assert!(functions(in_nccl[0]).iter().any(|f| f.ends_with("all_reduce_gradients")), "under the Python line that called it:\n{text}");
    let apart: Vec<&Value> = groups.iter().filter(|g| ranks_in(&dump, g) == ["2"] && functions(g).iter().any(|f| f == "load_batch")).collect();
    assert_eq!(apart.len(), 1, "rank 2 apart, in load_batch:\n{text}");
    assert!(!functions(apart[0]).iter().any(|f| f.contains("ncclAllReduce")), "{text}");
    // The text says so as well, the biggest group first.
    let out = gpuflame_ok(&["dump", "--match", &script], 0);
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(human.contains("3 threads of rank 0, 1, 3") && (human.contains("in pncclAllReduce") || human.contains("in ncclAllReduce")), "{human}");

    // The wall profile, by rank label, says the same.
    let pids: Vec<String> = dump["processes"].as_array().unwrap().iter().filter(|p| !p["labels"]["rank"].is_null()).map(|p| p["pid"].to_string()).collect();
    assert_eq!(pids.len(), 4, "{text}");
    let pb = dir.path().join("job.pb.gz");
    let mut args = vec!["record", "--profiles", "wall", "-d", "2", "-o", pb.to_str().unwrap()];
    for p in &pids {
        args.extend(["-p", p.as_str()]);
    }
    gpuflame_ok(&args, 0);
    let rank = |r: &str| {
        let f = dir.path().join(format!("rank{r}.folded"));
        gpuflame_ok(&["convert", pb.to_str().unwrap(), "--where", &format!("rank={r}"), "-o", f.to_str().unwrap()], 0);
        read_folded(&f)
    };
    for r in ["0", "1", "3"] {
        let stacks = rank(r);
        let in_reduce: u64 = stacks.iter().filter(|s| s.frames.iter().any(|f| f.ends_with("ncclAllReduce"))).map(|s| s.count).sum();
        assert!(in_reduce as f64 >= 0.4 * total(&stacks) as f64, "rank {r}: {in_reduce} of {} in ncclAllReduce\n{}", total(&stacks), describe(&stacks));
    }
    let stuck = rank("2");
    let loading: u64 = stuck.iter().filter(|s| s.frames.iter().any(|f| f.starts_with("load_batch"))).map(|s| s.count).sum();
    assert!(loading as f64 >= 0.4 * total(&stuck) as f64 && !stuck.iter().any(|s| s.frames.iter().any(|f| f.ends_with("ncclAllReduce"))), "{}", describe(&stuck));
}

/// utime + stime of a thread, in clock ticks.
fn thread_cpu(pid: u32, tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let rest: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap()
}

fn tracer_pid(pid: u32, tid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")).map_or(0, |v| v.trim().parse().unwrap_or(0))
}

#[test]
fn a_dump_stops_nothing_the_spinner_spins_on_and_nothing_traces_it() {
    require_bpf();
    let python = "/usr/bin/python3.11";
    let program = format!("{}/stuck.py", program_dir());
    let mut job = spawn_group(Command::new(python).args([program.as_str(), "before", "spin"]));
    wait_lines(&mut job, 1, "ready");
    std::thread::sleep(Duration::from_millis(300));
    let pid = job.0.id();
    let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    let spinner = *tids.iter().max_by_key(|&&t| thread_cpu(pid, t)).unwrap();
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = {
        let watching = Arc::clone(&watching);
        let tids = tids.clone();
        std::thread::spawn(move || {
            let mut seen = 0;
            while watching.load(Ordering::SeqCst) {
                seen = seen.max(tids.iter().map(|&t| tracer_pid(pid, t)).max().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        })
    };
    let before = thread_cpu(pid, spinner);
    let started = Instant::now();
    let (dump, text) = dump_json(&["-p", &pid.to_string()]);
    let took = started.elapsed();
    let after = thread_cpu(pid, spinner);
    watching.store(false, Ordering::SeqCst);
    assert_eq!(watcher.join().unwrap(), 0, "TracerPid was set during the dump");
    // Clock ticks are 10 ms: a spinner running through a dump of several hundred ms gains some.
    assert!(after > before, "the spinner's CPU time did not grow during the dump ({before} -> {after} ticks, {took:?})");
    let threads = dump["threads"].as_array().unwrap();
    let waiting = threads.iter().find(|t| t["tid"] == pid).unwrap();
    assert_eq!(waiting["state"], "sleeping", "{text}");
    assert_eq!(waiting["waits_in"], "futex", "{text}");
    let group = &dump["groups"].as_array().unwrap()[waiting["group"].as_u64().unwrap() as usize - 1];
    let f = functions(group);
    assert!(["wait_for_peer", "all_reduce_like", "<module>", "_start"].iter().all(|want| f.iter().any(|g| g == want)), "{text}");
    let running = threads.iter().find(|t| t["tid"] == spinner).unwrap();
    assert!(running["group"].is_u64(), "the running spinner has a stack from its CPU samples:\n{text}");
}

#[test]
fn a_process_in_another_pid_namespace_is_dumped_by_its_host_pid() {
    require_bpf();
    let program = format!("{}/stuck.py", program_dir());
    let token = format!("ns-{}", std::process::id());
    let mut job = spawn_group(Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "/usr/bin/python3.11", program.as_str(), "before", &token]));
    wait_lines(&mut job, 1, "ready");
    std::thread::sleep(Duration::from_millis(300));
    let host_pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&token) && c.starts_with(b"/usr/bin/python3.11")))
        .expect("the namespaced Python's host pid");
    let ns_pid = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap().lines().find_map(|l| l.strip_prefix("NSpid:").map(str::to_string)).unwrap();
    assert!(ns_pid.split_whitespace().count() == 2, "in a PID namespace of its own: NSpid {ns_pid}");
    let (dump, text) = dump_json(&["-p", &host_pid.to_string()]);
    let main = dump["threads"].as_array().unwrap().iter().find(|t| t["tid"] == host_pid).unwrap_or_else(|| panic!("its main thread by its host tid:\n{text}"));
    let group = &dump["groups"].as_array().unwrap()[main["group"].as_u64().unwrap() as usize - 1];
    assert!(functions(group).iter().any(|f| f == "wait_for_peer"), "{text}");
}

#[test]
fn a_waiting_threads_python_frames_are_read_on_every_interpreter() {
    require_bpf();
    let program = format!("{}/stuck.py", program_dir());
    let mut failed = Vec::new();
    for python in python_interpreters() {
        assert!(python.exists(), "{} is missing (scripts/setup.sh installs it)", python.display());
        let mut job = spawn_group(Command::new(&python).args([program.as_str(), "before"]));
        wait_lines(&mut job, 1, "ready");
        std::thread::sleep(Duration::from_millis(300));
        let pid = job.0.id();
        let (dump, text) = dump_json(&["-p", &pid.to_string()]);
        let main = dump["threads"].as_array().unwrap().iter().find(|t| t["tid"] == pid).cloned();
        let frames = main.and_then(|t| Some(functions(&dump["groups"].as_array()?[t["group"].as_u64()? as usize - 1])));
        // Root first (the JSON's frames are innermost first): the entry point, the script's frames
        // in their order, the lock's futex.
        let wanted = ["_start", "<module>", "all_reduce_like", "wait_for_peer", "futex_wait", "[off-cpu: sleeping]"];
        let in_order = frames.as_ref().is_some_and(|f| {
            let mut it = f.iter().rev();
            wanted.iter().all(|w| it.any(|g| g == w))
        });
        if !in_order {
            failed.push(format!("{}: {frames:?}\n{text}", python.display()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
