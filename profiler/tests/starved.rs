//! Device memory when gpuflame falls behind: the recording process is stopped (SIGSTOP) for 2 s
//! in the middle of a burst of tensors and segments that fills its ring many times over, then
//! let go. In-use is read from the live set the kernel keeps, so its totals stay exact; what a
//! full ring costs is stacks, under `[stacks lost: ring full]`, and the OOM report is read from
//! the live set as it was at the failure. Real BPF, the stand-in allocator
//! (tests/programs/cuda/tensor_app.cpp, mode `burst`).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

fn num(kv: &std::collections::BTreeMap<String, String>, key: &str) -> u64 {
    kv.get(key).unwrap_or_else(|| panic!("the program printed no {key}: {kv:?}")).parse().unwrap()
}

/// Bytes of the stacks through a frame that starts with `function`.
fn under(stacks: &[Stack], function: &str) -> u64 {
    stacks.iter().filter(|s| s.frames.iter().any(|f| f.starts_with(function))).map(|s| s.count).sum()
}

#[test]
fn in_use_stays_exact_when_gpuflame_is_stopped_mid_burst() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    common::cuda::build_stand_ins(dir.path());
    let app = common::cuda::build_c10_with(dir.path(), true, &[]).display().to_string();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (mark, stopped, done, result, out) = (path("mark"), path("stopped"), path("done"), path("result.txt"), path("b.folded"));
    let gate = Gate::new(dir.path(), "gate");
    let script = format!("exec \"$@\" > {result}");
    let env = [format!("BURST_MARK={mark}"), format!("BURST_STOPPED={stopped}"), format!("BURST_DONE={done}"), "LINGER_MS=300".to_string()];
    let mut args = vec!["record", "--profiles", "tensor-inuse,hbm-inuse", "-o", &out, "--", "env"];
    args.extend(env.iter().map(String::as_str));
    args.extend(["sh", "-c", &script, "sh", &app, "burst"]);
    let recording = Recording::start_with_env(&args, &[gate.env_var()]);
    let pids = gate.arrivals(1);
    gate.open_when_ready(&recording, &pids);

    // 1,000 tensors in: gpuflame stops, and the program goes on without it, 2 s and until the
    // burst is over (a machine beside other work may take longer over it).
    let wait_for = |file: &str, what: &str| {
        let deadline = Instant::now() + HANG;
        while !Path::new(file).exists() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(&mark, "the program never began its burst");
    let gpuflame = recording.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(gpuflame, libc::SIGSTOP) };
    let stopped_at = Instant::now();
    std::fs::write(&stopped, "").unwrap();
    wait_for(&done, "the program never ended its burst");
    std::thread::sleep(Duration::from_secs(2).saturating_sub(stopped_at.elapsed()));
    let held = stopped_at.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(gpuflame, libc::SIGCONT) };
    let (status, stderr) = recording.finish();
    assert!(status.success(), "{stderr}");
    let kv = common::cuda::key_values(&std::fs::read_to_string(&result).unwrap_or_default());
    let tensors = read_folded(Path::new(&path("b.tensor-inuse.folded")));
    let segments = read_folded(Path::new(&path("b.hbm-inuse.folded")));
    let ctx = format!("{}\n---\n{}\n---\n{stderr}", describe(&tensors), describe(&segments));

    // The ring did overflow: what this test is about happened.
    assert!(stderr.contains("a full ring lost"), "the burst did not fill the ring: {ctx}");
    // Tensors: the total is what the allocator says it hands out, to the byte; the 4 MiB ones
    // kept before the stop and the burst's survivors under their stacks; what was freed is gone.
    assert_eq!(total(&tensors), num(&kv, "allocated"), "{ctx}");
    assert_eq!(under(&tensors, "keep_big"), num(&kv, "live_keep_big_bytes"), "{ctx}");
    assert_eq!(under(&tensors, "burst_tensors"), num(&kv, "live_burst_tensors_bytes"), "{ctx}");
    // Stacks first seen while the ring was full are lost, their bytes are not: the rest of
    // in-use is theirs, or under the stacks the ring still took.
    let lost = under(&tensors, "[stacks lost: ring full]");
    let after = under(&tensors, "keep_after_burst") + under(&tensors, "fill_until_oom");
    assert_eq!(lost + after, num(&kv, "live_keep_after_burst_bytes") + num(&kv, "live_fill_until_oom_bytes"), "{ctx}");
    assert!(tensors.iter().all(|s| ["keep_big", "burst_tensors", "keep_after_burst", "fill_until_oom", "[stacks lost: ring full]"].iter().any(|f| s.frames.iter().any(|x| x.starts_with(f)))), "a stack from nowhere: {ctx}");
    // Segments: the allocator's reserve and the 1,000 kept of 20,000 cudaMalloc'd, exact.
    assert_eq!(total(&segments), num(&kv, "reserved") + num(&kv, "segments_kept_bytes"), "{ctx}");
    eprintln!("gpuflame stopped {held:?}; lost to the full ring: {lost} bytes of tensors under [stacks lost: ring full]; {}", stderr.lines().filter(|l| l.contains("a full ring lost")).collect::<Vec<_>>().join(" "));

    // The OOM, while gpuflame was stopped: reported, with what the process held at the failure
    // (before half of it was freed), however late the report was read.
    let report: Vec<&str> = stderr.lines().skip_while(|l| !l.contains("out of memory in pid")).take_while(|l| l.contains("out of memory") || l.starts_with("gpuflame:   ")).collect();
    assert!(!report.is_empty(), "no OOM report: {ctx}");
    let (allocated, reserved) = (num(&kv, "allocated_at_oom"), num(&kv, "reserved_at_oom"));
    let line = {
        use gpuflame::cuda::human_bytes as h;
        format!("device 0: reserved {}, allocated {}, cached {}; outside the allocator {}", h(reserved), h(allocated), h(reserved - allocated), h(num(&kv, "segments_kept_bytes")))
    };
    assert!(report[0].contains(&line), "{line}\n{}\n{ctx}", report.join("\n"));
    assert!(report[0].contains(&format!("of {}", gpuflame::cuda::human_bytes(4 * MIB))), "{}", report.join("\n"));
}

/// A free keeps its element, marked, for the next allocation at its address, up to a bound
/// (gpuflame_bpf::SamplerConfig::FREED_KEPT, 65,536); past it, frees delete. 95,000 segments
/// freed at addresses never handed out again take the set past the bound: in-use stays exact.
#[test]
fn frees_past_the_bound_of_those_kept_delete_and_in_use_stays_exact() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    common::cuda::build_stand_ins(dir.path());
    let app = common::cuda::build_c10_with(dir.path(), true, &[]).display().to_string();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (result, out) = (path("result.txt"), path("k.folded"));
    let script = format!("exec \"$@\" > {result}");
    let args = ["record", "--profiles", "tensor-inuse,hbm-inuse", "-o", &out, "--", "env", "BURST_SEGMENTS=100000", "sh", "-c", &script, "sh", &app, "burst"];
    let (status, stderr) = Recording::start_with_env(&args, &[]).finish();
    assert!(status.success(), "{stderr}");
    let kv = common::cuda::key_values(&std::fs::read_to_string(&result).unwrap_or_default());
    let tensors = read_folded(Path::new(&path("k.tensor-inuse.folded")));
    let segments = read_folded(Path::new(&path("k.hbm-inuse.folded")));
    let ctx = format!("{}\n---\n{}\n---\n{stderr}", describe(&tensors), describe(&segments));
    // The bound was reached: the last read of the set found it full of freed elements.
    let kept: u64 = stderr
        .lines()
        .filter(|l| l.contains("live set of device memory read"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("freed_kept=")).and_then(|v| v.parse().ok()))
        .max()
        .unwrap_or_else(|| panic!("no read of the live set said what it kept: {ctx}"));
    assert!(kept >= 65_536, "only {kept} freed allocations kept: the bound was never reached\n{ctx}");
    assert!(kept < 65_536 + 64, "{kept} freed allocations kept, past the bound\n{ctx}");
    // Every segment freed past the bound is gone; the 5,000 kept and the allocator's reserve
    // are in use, to the byte, as are the tensors.
    assert_eq!(num(&kv, "segments_kept_bytes"), 5_000 * 65_536, "{ctx}");
    assert_eq!(total(&segments), num(&kv, "reserved") + num(&kv, "segments_kept_bytes"), "{ctx}");
    assert_eq!(total(&tensors), num(&kv, "allocated"), "{ctx}");
}
