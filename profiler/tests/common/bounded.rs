//! Bounded runs of gpuflame for the safety tests: under `timeout`, which kills the whole process
//! group and fails the test, and /usr/bin/time, which reports the peak RSS.

use std::fs;
use std::process::{Command, Stdio};

use super::GPUFLAME;

/// One bounded run of a command (gpuflame, or a wrapper that ends in it).
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub max_rss_mib: u64,
}

impl Run {
    pub fn context(&self) -> String {
        format!("exit {}, peak RSS {} MiB\nstdout:\n{}\nstderr:\n{}", self.code, self.max_rss_mib, self.stdout, self.stderr)
    }

    /// Exit code 2 and one line `gpuflame: error: …` containing `needle`.
    pub fn assert_user_error(&self, needle: &str) {
        assert_eq!(self.code, 2, "{}", self.context());
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert!(lines.len() == 1 && lines[0].starts_with("gpuflame: error: ") && lines[0].contains(needle), "expected one line with {needle:?}: {}", self.context());
    }
}

/// Runs `prefix… gpuflame args…` under `timeout` (which kills the whole process group) and
/// /usr/bin/time; fails the test if it runs past `limit_s`.
pub fn run_bounded(limit_s: u32, prefix: &[&str], args: &[&str]) -> Run {
    let rss = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("timeout")
        .args(["-k", "5", &limit_s.to_string(), "/usr/bin/time", "-f", "%M", "-o", rss.path().to_str().unwrap()])
        .args(prefix)
        .arg(GPUFLAME)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("timeout (coreutils) and /usr/bin/time (GNU time) are needed");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        max_rss_mib: fs::read_to_string(rss.path()).ok().and_then(|t| t.lines().last()?.trim().parse::<u64>().ok()).unwrap_or(0) >> 10,
    };
    assert!(run.code != 124 && run.code != 137, "gpuflame {args:?} ran past {limit_s} s (hung):\n{}", run.context());
    run
}
