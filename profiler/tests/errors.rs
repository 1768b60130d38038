//! Clear one-line errors with exit code 2.

mod common;


use common::*;

fn assert_usage_error(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "expected exit code 2, stderr:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got:\n{stderr}");
    assert!(lines[0].starts_with("gpuflame: error: ") && lines[0].contains(needle), "{stderr:?} lacks {needle:?}");
}

#[test]
fn unknown_format() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.png");
    assert_usage_error(&gpuflame(&["record", "-d", "1", "-o", out.to_str().unwrap()]), "unknown output format 'png'");
    assert_usage_error(&gpuflame(&["record", "-d", "1", "--format", "jpeg", "-o", "x.svg"]), "unknown output format 'jpeg'");
}

#[test]
fn bad_rank_labels() {
    assert_usage_error(&gpuflame(&["record", "-d", "1", "--rank-label", "my-rank=RANK", "-o", "x.svg"]), "\"my-rank\" is not a label name");
    assert_usage_error(&gpuflame(&["record", "-d", "1", "--rank-label", "pid=RANK", "-o", "x.svg"]), "pid is a sample label");
    assert_usage_error(&gpuflame(&["record", "-d", "1", "--rank-label", "rank", "-o", "x.svg"]), "is not LABEL=VAR");
}

#[test]
fn pid_not_found() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.svg");
    // PIDs stop below pid_max (at most 2^22), so this one cannot exist.
    assert_usage_error(&gpuflame(&["record", "-p", "99999999", "-o", out.to_str().unwrap()]), "PID 99999999 not found");
}

#[test]
fn unwritable_output() {
    require_bpf();
    assert_usage_error(&gpuflame(&["record", "-d", "1", "-o", "/nonexistent-dir/out.svg"]), "cannot write the output /nonexistent-dir/out.svg");
}

#[test]
fn not_root() {
    require_bpf();
    // The same binary as an unprivileged user (nobody), with no capabilities.
    let dir = common::others::OpenDir::new("gpuflame-not-root-");
    let binary = dir.copy(std::path::Path::new(GPUFLAME));
    // setpriv's own option goes before the program, so it stands in the program's place here.
    let out = common::others::as_nobody("--inh-caps=-all", &[binary.to_str().unwrap(), "record", "-d", "1", "-o", "/tmp/never-written.svg"])
        .output()
        .expect("setpriv (util-linux) is needed to run gpuflame unprivileged");
    assert_usage_error(&out, "needs root, or the CAP_BPF and CAP_PERFMON capabilities");
}

#[test]
fn unreadable_input_to_convert() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pb.gz");
    std::fs::write(&bad, [0x1f, 0x8b, 0x08, 0, 0, 0]).unwrap();
    let out = gpuflame(&["convert", bad.to_str().unwrap(), "-o", dir.path().join("o.svg").to_str().unwrap()]);
    assert_usage_error(&out, "bad.pb.gz");
}
