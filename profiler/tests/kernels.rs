//! What gpuflame does on a kernel that lacks what it prefers: the kernels GPU fleets run (5.15,
//! 6.1, 6.8, 6.12) are booted by scripts/kernel-matrix.sh; here, on the kernel at hand, gpuflame
//! acts as if features were missing (common::PRETEND_KERNEL_LACKS), so that each line it says
//! then, and the profiles that still run, are tested in every run of the suite.

mod common;

use std::path::Path;

use common::*;

#[test]
fn a_profile_this_kernel_cannot_run_is_said_in_one_line_and_the_cpu_profile_still_runs() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS).display().to_string();
    let out = dir.path().join("p.folded").display().to_string();
    // chain.c exits with 3; record passes the command's code on.
    let run = gpuflame_env_ok(&["record", "--profiles", "cpu,off-cpu,wall", "-F", "199", "-o", &out, "--", &chain, "1"], &[(PRETEND_KERNEL_LACKS, "task-storage")], 3);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let line = format!("gpuflame: off-cpu, wall cannot run: this kernel ({}) lacks task storage in tracing programs (Linux 5.11); the other profiles run", release());
    assert_eq!(stderr.lines().filter(|l| l.contains("cannot run")).collect::<Vec<_>>(), vec![line.as_str()], "{stderr}");
    // The outputs are named for the profiles asked for; those that could not run leave none.
    let cpu = read_folded(&dir.path().join("p.cpu.folded"));
    assert!(cpu.iter().any(|s| s.has_sequence(&["main", "a", "b", "c"])), "{}\n{stderr}", describe(&cpu));
    assert!(!dir.path().join("p.off-cpu.folded").exists() && !dir.path().join("p.wall.folded").exists(), "{stderr}");
}

#[test]
fn a_kernel_without_what_the_sampler_needs_is_refused_in_one_line_naming_it() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.folded").display().to_string();
    let run = gpuflame_env_ok(&["record", "-d", "1", "-o", &out], &[(PRETEND_KERNEL_LACKS, "bpf-loop")], 2);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let line = format!(
        "gpuflame: error: this kernel ({}) lacks bpf_loop (Linux 5.17), which gpuflame's sampler and unwinder need: gpuflame runs on Linux 5.17 or later",
        release()
    );
    assert_eq!(stderr.trim_end(), line, "{stderr}");
    assert!(!Path::new(&out).exists(), "nothing written: {stderr}");
}

#[test]
fn when_no_profile_asked_for_can_run_the_line_is_the_error() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.folded").display().to_string();
    let run = gpuflame_env_ok(&["record", "--profiles", "off-cpu", "-d", "1", "-o", &out], &[(PRETEND_KERNEL_LACKS, "task-storage")], 2);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let line = format!("gpuflame: error: off-cpu cannot run: this kernel ({}) lacks task storage in tracing programs (Linux 5.11)", release());
    assert_eq!(stderr.trim_end(), line, "{stderr}");
}

fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string()
}
