//! pprof output checked with an independent decoder, `go tool pprof -raw`. Run as root.

mod common;

use std::process::Command;

use common::*;

/// Sample values and location lines of `go tool pprof -raw` output.
fn go_pprof_raw(path: &std::path::Path) -> (Vec<i64>, String) {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(path)
        .output()
        .expect("`go` is needed to decode pprof independently (Debian: apt-get install golang-go)");
    assert!(out.status.success(), "go tool pprof failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let samples = text.split("Samples:").nth(1).and_then(|s| s.split("Locations").next()).expect("a Samples section");
    let values = samples
        .lines()
        .filter_map(|l| l.trim().split_once(':').filter(|(v, _)| v.chars().all(|c| c.is_ascii_digit()) && !v.is_empty()))
        .map(|(v, _)| v.parse().unwrap())
        .collect();
    (values, text)
}

#[test]
fn pprof_decodes_with_go_tool_pprof_and_totals_equal_folded() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let chain = build_c(dir.path(), "chain", FP_FLAGS);
    let pprof = dir.path().join("cpu.pb.gz");
    gpuflame_ok(&["record", "-F", "99", "-o", pprof.to_str().unwrap(), "--", chain.to_str().unwrap(), "2"], 3);

    let (values, text) = go_pprof_raw(&pprof);
    assert!(text.contains("PeriodType: cpu nanoseconds"), "{text}");
    assert!(text.contains("Period: 10101010"), "{text}");
    // Functions carry file and line.
    for f in ["main", "a", "b", "c"] {
        assert!(
            text.lines().any(|l| l.contains(&format!(" {f} ")) && l.contains("chain.c:")),
            "no location of {f} with chain.c:LINE in\n{text}"
        );
    }
    assert!(text.contains("pid:[") && text.contains("tid:[") && text.contains("comm:[chain]"), "labels missing:\n{text}");

    let folded = dir.path().join("cpu.folded");
    gpuflame_ok(&["convert", pprof.to_str().unwrap(), "-o", folded.to_str().unwrap()], 0);
    let stacks = read_folded(&folded);
    let go_total: i64 = values.iter().sum();
    assert!(go_total > 0);
    assert_eq!(go_total, total(&stacks) as i64 * 10_101_010, "pprof total vs folded samples × period");
}

#[test]
fn convert_makes_every_format_from_folded() {
    let dir = tempfile::tempdir().unwrap();
    let folded = dir.path().join("in.folded");
    std::fs::write(&folded, "app;main;read;ksys_read_[k] 10\napp;main;work 30\n").unwrap();
    let pprof = dir.path().join("out.pb.gz");
    let svg = dir.path().join("out.svg");
    let back = dir.path().join("back.folded");
    gpuflame_ok(&["convert", folded.to_str().unwrap(), "-o", pprof.to_str().unwrap(), "-F", "100"], 0);
    gpuflame_ok(&["convert", pprof.to_str().unwrap(), "-o", svg.to_str().unwrap()], 0);
    gpuflame_ok(&["convert", pprof.to_str().unwrap(), "-o", back.to_str().unwrap()], 0);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), std::fs::read_to_string(&folded).unwrap());
    let (values, _) = go_pprof_raw(&pprof);
    assert_eq!(values.iter().sum::<i64>(), 40 * 10_000_000);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("ksys_read") && svg.contains("work"));
}
