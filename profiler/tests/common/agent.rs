//! The agent under test: a running `gpuflame agent` with its stderr collected, the workloads it
//! profiles, and what its summary and pushes say.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::receiver::{Received, Receiver};
use super::{build_c, FP_FLAGS, GPUFLAME};

pub struct Workload(pub Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spinner(dir: &std::path::Path, name: &str, env: Option<(&str, &str)>) -> Workload {
    let exe = build_c(dir, "chain", FP_FLAGS);
    let named = dir.join(name);
    std::fs::copy(&exe, &named).unwrap();
    let mut cmd = Command::new(&named);
    cmd.arg("60");
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    Workload(cmd.spawn().unwrap())
}

/// The agents profile the whole machine and spin CPUs: one at a time, or they skew each other.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running agent whose stderr is collected as it comes.
pub struct Agent {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    pub fn start(cmd: &mut Command) -> Agent {
        let mut child = cmd.stderr(Stdio::piped()).spawn().expect("starting the agent");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            })
        };
        let agent = Agent { child, lines, reader: Some(reader) };
        // Loading the programs and every process's unwind tables takes a moment.
        let started = Instant::now();
        while !agent.lines.lock().unwrap().iter().any(|l| l.contains("profiling the whole machine")) {
            assert!(started.elapsed() < super::HANG, "the agent did not start:\n{}", agent.lines.lock().unwrap().join("\n"));
            sleep(Duration::from_millis(50));
        }
        agent
    }

    /// SIGTERM, then the agent's whole stderr once it has exited successfully.
    pub fn stop(mut self) -> String {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        // Its last window symbolized and delivered within --shutdown-timeout (10 s): only a
        // hang runs past this.
        let status = super::wait_bounded(&mut self.child, super::HANG)
            .unwrap_or_else(|| panic!("the agent still ran {:?} after SIGTERM (hung):\n{}", super::HANG, self.lines.lock().unwrap().join("\n")));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let log = self.lines.lock().unwrap().join("\n");
        assert!(status.success(), "agent exited with {status:?}:\n{log}");
        log
    }
}

/// An agent that a failed test let go of is stopped: one left running profiled the whole
/// machine for the rest of the suite.
impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn agent(args: &[&str]) -> Agent {
    Agent::start(Command::new(GPUFLAME).arg("agent").args(args))
}

/// The numbers of the agent's summary line.
pub fn summary(stderr: &str) -> std::collections::HashMap<String, u64> {
    let line = stderr.lines().find(|l| l.starts_with("gpuflame agent:") && l.contains(" windows, ")).unwrap_or_else(|| panic!("no summary in:\n{stderr}"));
    let words: Vec<&str> = line.trim_start_matches("gpuflame agent:").split(',').map(str::trim).collect();
    words
        .iter()
        .filter_map(|w| {
            let (n, what) = w.split_once(' ')?;
            Some((what.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// The window a sample id belongs to.
pub fn window_seq(id: &str) -> u64 {
    id.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad sample id {id}"))
}

/// The first frame of every stack: where thread names go by default.
pub fn root_frames(profile: &gpuflame::profile::Profile) -> std::collections::BTreeSet<String> {
    profile.samples.iter().filter_map(|s| s.stack.first()).map(|&l| profile.locations[l].lines[0].function.clone()).collect()
}

pub fn service<'a>(got: &'a [Received], name: &str) -> Vec<&'a Received> {
    got.iter().filter(|r| r.labels.get("service_name").map(String::as_str) == Some(name)).collect()
}

/// No series refused by Pyroscope's rules, and none stored twice.
pub fn assert_clean(receiver: &Receiver) {
    let rejected = receiver.rejected();
    assert!(rejected.is_empty(), "series Pyroscope would refuse: {rejected:#?}");
    let mut seen = std::collections::BTreeSet::new();
    for r in receiver.received() {
        assert!(seen.insert((r.labels.clone(), r.id.clone())), "stored twice: {:?} {}", r.labels, r.id);
    }
}

/// The agent's metrics page, from --metrics-addr 127.0.0.1:PORT.
pub fn http_get(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// One metric's value in the metrics page.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}
