//! `gpuflame agent` against a Pyroscope push endpoint in the test: labels, totals, faults.
//! Run as root (the agent profiles the whole machine).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::receiver::Receiver;
use common::*;

struct Workload(Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spinner(dir: &std::path::Path, name: &str, env: Option<(&str, &str)>) -> Workload {
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

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running agent whose stderr is collected as it comes.
struct Agent {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start(cmd: &mut Command) -> Agent {
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
            assert!(started.elapsed() < Duration::from_secs(60), "the agent did not start:\n{}", agent.lines.lock().unwrap().join("\n"));
            sleep(Duration::from_millis(50));
        }
        agent
    }

    /// SIGTERM, then the agent's whole stderr once it has exited successfully.
    fn stop(mut self) -> String {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let log = self.lines.lock().unwrap().join("\n");
        assert!(status.success(), "agent exited with {status:?}:\n{log}");
        log
    }
}

fn agent(args: &[&str]) -> Agent {
    Agent::start(Command::new(GPUFLAME).arg("agent").args(args))
}

/// The numbers of the agent's summary line.
fn summary(stderr: &str) -> std::collections::HashMap<String, u64> {
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

fn window_seq(id: &str) -> u64 {
    id.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad sample id {id}"))
}

#[test]
fn known_workload_arrives_with_its_labels_and_totals() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let workload = spinner(dir.path(), "trainer_bin", Some(("GPUFLAME_SERVICE_NAME", "llm-trainer")));
    let plain = spinner(dir.path(), "plainspin", None);
    sleep(Duration::from_millis(300));
    let receiver = Receiver::start(Box::new(|_| 200));
    let child = Command::new(GPUFLAME)
        .args(["agent", "--server", &receiver.url(), "--once", "--window", "3", "-F", "99", "--label", "cluster=test", "--tenant-id", "team-a", "-v"])
        .env("GPUFLAME_BEARER_TOKEN", "tok-s3cret")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("tok-s3cret"), "the token leaked into the log:\n{stderr}");
    drop((workload, plain));

    let got = receiver.received();
    let trainer: Vec<_> = got.iter().filter(|r| r.labels.get("service_name").map(String::as_str) == Some("llm-trainer")).collect();
    assert_eq!(trainer.len(), 1, "one series for the service, got {:?}", got.iter().map(|r| &r.labels).collect::<Vec<_>>());
    let r = trainer[0];
    assert_eq!(r.labels.get("__name__").map(String::as_str), Some("process_cpu"));
    assert_eq!(r.labels.get("cluster").map(String::as_str), Some("test"));
    assert!(r.labels.contains_key("hostname"));
    assert_eq!(r.headers.get("authorization").map(String::as_str), Some("Bearer tok-s3cret"));
    assert_eq!(r.headers.get("x-scope-orgid").map(String::as_str), Some("team-a"));
    assert_eq!((r.profile.sample_type().kind.as_str(), r.profile.sample_type().unit.as_str()), ("cpu", "nanoseconds"));
    // A process spinning for the 3 s window at 99 Hz: about 297 samples of 1e9/99 ns, on a
    // machine where it shares two CPUs with the other spinner.
    let samples = r.profile.total() / r.profile.period;
    assert!((200..=320).contains(&samples), "{samples} samples for a 3 s window at 99 Hz");
    assert!(r.profile.samples.iter().all(|s| s.labels.pid.is_some() && s.labels.comm.as_deref() == Some("trainer_bin")));
    // The process without the variable is named by its comm.
    assert!(got.iter().any(|r| r.labels.get("service_name").map(String::as_str) == Some("plainspin")));

    // Every pushed profile decodes with go tool pprof.
    for (i, r) in got.iter().enumerate() {
        let path = dir.path().join(format!("pushed-{i}.pb.gz"));
        std::fs::write(&path, &r.raw).unwrap();
        let out = Command::new("go").args(["tool", "pprof", "-raw"]).arg(&path).output().expect("go is needed (apt-get install golang-go)");
        assert!(out.status.success(), "go tool pprof failed on the profile of {:?}: {}", r.labels, String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn server_errors_then_recovery_deliver_every_window_exactly_once() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = spinner(dir.path(), "steady", None);
    // The first five requests fail with 500.
    let receiver = Receiver::start(Box::new(|n| if n < 5 { 500 } else { 200 }));
    let child = agent(&["--server", &receiver.url(), "--window", "0.5", "-F", "49", "--max-backoff", "0.3"]);
    sleep(Duration::from_secs(5));
    let stats = summary(&child.stop());
    let mut seqs: Vec<u64> = receiver.received().iter().filter(|r| r.labels["service_name"] == "steady").map(|r| window_seq(&r.id)).collect();
    seqs.sort();
    let queued = stats["profiles queued"];
    assert!(queued >= 4, "{stats:?}");
    assert_eq!(stats["pushed"], queued, "every window delivered: {stats:?}");
    assert_eq!(stats["dropped"], 0);
    assert!(stats["retries"] >= 5);
    // The steady process is in every window: each window exactly once, none missing.
    assert_eq!(seqs, (0..queued).collect::<Vec<_>>(), "windows received: {seqs:?}");
}

#[test]
fn server_down_longer_than_the_queue_bound_drops_exactly_and_keeps_running() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = spinner(dir.path(), "steady", None);
    // A port with nothing listening on it, for now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bound = 10_000;
    let child = agent(&[
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--window",
        "0.3",
        "-F",
        "49",
        "--queue-bytes",
        &bound.to_string(),
        "--max-backoff",
        "0.5",
        "--metrics-addr",
        &metrics_port.to_string(),
    ]);
    sleep(Duration::from_secs(6));
    let metrics = http_get(metrics_port);
    let max_bytes: u64 = metric(&metrics, "gpuflame_queue_bytes_max");
    let dropped_while_down = metric(&metrics, "gpuflame_profiles_dropped_total");
    assert!(max_bytes <= bound, "queue held {max_bytes} bytes, bound {bound}");
    assert!(dropped_while_down > 0, "the bound was never reached:\n{metrics}");
    // The server comes back.
    let receiver = Receiver::start_on(&format!("127.0.0.1:{port}"), Box::new(|_| 200));
    sleep(Duration::from_secs(3));
    let stats = summary(&child.stop());
    let received: std::collections::BTreeSet<String> = receiver.received().iter().map(|r| r.id.clone()).collect();
    assert_eq!(received.len() as u64, stats["pushed"], "{stats:?}");
    assert_eq!(stats["pushed"] + stats["dropped"] + stats["failed"], stats["profiles queued"], "every window is either delivered or counted as dropped: {stats:?}");
    assert!(stats["dropped"] >= dropped_while_down);
}

#[test]
fn sigterm_mid_window_flushes_the_partial_window() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = spinner(dir.path(), "steady", None);
    let receiver = Receiver::start(Box::new(|_| 200));
    let child = agent(&["--server", &receiver.url(), "--window", "60", "-F", "49"]);
    sleep(Duration::from_secs(3));
    let stopped = Instant::now();
    child.stop();
    assert!(stopped.elapsed() < Duration::from_secs(5), "shutdown took {:?}", stopped.elapsed());
    let got = receiver.received();
    let steady: Vec<_> = got.iter().filter(|r| r.labels["service_name"] == "steady").collect();
    assert_eq!(steady.len(), 1);
    let secs = steady[0].profile.duration_nanos as f64 / 1e9;
    assert!((1.0..8.0).contains(&secs), "the flushed window lasted {secs} s");
    assert!(steady[0].profile.total() > 0);
}

#[test]
fn unauthorized_is_reported_once_and_clearly() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = spinner(dir.path(), "steady", None);
    let receiver = Receiver::start(Box::new(|_| 401));
    let child = Agent::start(
        Command::new(GPUFLAME)
            .args(["agent", "--server", &receiver.url(), "--window", "0.5", "-F", "49", "--basic-auth-user", "agent"])
            .env("GPUFLAME_BASIC_AUTH_PASSWORD", "pw-s3cret"),
    );
    sleep(Duration::from_secs(4));
    let stderr = child.stop();
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("401")).collect();
    assert_eq!(reports.len(), 1, "expected one report of the 401:\n{stderr}");
    assert!(reports[0].contains("refused the credentials"), "{}", reports[0]);
    assert!(!stderr.contains("pw-s3cret"));
    let stats = summary(&stderr);
    assert!(stats["failed"] >= 3, "{stats:?}");
    assert!(receiver.requests.load(std::sync::atomic::Ordering::SeqCst) >= 3);
}

fn http_get(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics endpoint");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn spooled_windows_survive_a_restart() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _w = spinner(dir.path(), "steady", None);
    let spool = dir.path().join("spool");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    // The server is down for the whole first run: its windows go to the spool at exit.
    let first = agent(&["--server", &url, "--window", "0.5", "-F", "49", "--spool-dir", spool.to_str().unwrap(), "--shutdown-timeout", "1", "--max-backoff", "0.3"]);
    sleep(Duration::from_secs(3));
    let log = first.stop();
    let stats = summary(&log);
    assert_eq!(stats["pushed"], 0, "{log}");
    let spooled = std::fs::read_dir(&spool).unwrap().filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "pushreq"))).count() as u64;
    assert_eq!(spooled, stats["profiles queued"], "every undelivered window is spooled:\n{log}");
    assert!(spooled >= 2);

    // The server is back; the next run delivers the spooled windows first, then its own.
    let receiver = Receiver::start_on(&format!("127.0.0.1:{port}"), Box::new(|_| 200));
    let out = Command::new(GPUFLAME)
        .args(["agent", "--server", &url, "--once", "--window", "1", "-F", "49", "--spool-dir", spool.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: std::collections::BTreeSet<String> = receiver.received().iter().map(|r| r.id.clone()).collect();
    assert!(ids.len() as u64 > spooled, "{spooled} spooled windows and one new, got {ids:?}");
    let left = std::fs::read_dir(&spool).unwrap().count();
    assert_eq!(left, 0, "delivered spool files are removed");
}

#[test]
fn tls_with_a_given_ca_and_refused_without_it() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _w = spinner(d, "steady", None);
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(d).output().expect("openssl is needed for the TLS test");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // A CA of the test's own, and a server certificate for 127.0.0.1 that it signs.
    openssl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=gpuflame test CA"]);
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf"]);
    let sink = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/tls_sink.py");
    let mut server = Workload(
        Command::new("python3")
            .arg(&sink)
            .args([d.join("server.pem"), d.join("server.key"), d.join("port"), d.join("count")])
            .spawn()
            .expect("python3 runs the HTTPS sink"),
    );
    let started = Instant::now();
    while !d.join("port").exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "the HTTPS sink did not start");
        sleep(Duration::from_millis(50));
    }
    sleep(Duration::from_millis(100));
    let url = format!("https://127.0.0.1:{}", std::fs::read_to_string(d.join("port")).unwrap().trim());
    let pushes = || std::fs::read_to_string(d.join("count")).map(|c| c.lines().count()).unwrap_or(0);

    // Without the CA the certificate is not trusted: nothing is delivered.
    let out = Command::new(GPUFLAME).args(["agent", "--server", &url, "--once", "--window", "1", "-F", "49", "--shutdown-timeout", "1"]).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(summary(&log)["pushed"], 0, "{log}");
    assert_eq!(pushes(), 0);

    // With it, the push goes through.
    let ca = d.join("ca.pem");
    let out = Command::new(GPUFLAME).args(["agent", "--server", &url, "--once", "--window", "1", "-F", "49", "--ca-cert", ca.to_str().unwrap()]).output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(summary(&log)["pushed"], 1, "{log}");
    assert_eq!(pushes(), 1);
    let _ = server.0.kill();
}

#[test]
fn hbm_profiles_are_pushed_per_service_with_their_own_names() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let app = common::cuda::build_stand_ins(dir.path());
    let receiver = Receiver::start(Box::new(|_| 200));
    let agent = agent(&["--server", &receiver.url(), "--once", "--window", "4", "--profiles", "hbm-alloc,hbm-inuse", "-v"]);
    // Started after the agent: its allocations are seen from the first; it lives past the window.
    let app = Workload(Command::new(&app).arg("memory").env("LINGER_MS", "8000").env("GPUFLAME_SERVICE_NAME", "kv-server").stdout(Stdio::null()).spawn().unwrap());
    let started = Instant::now();
    while receiver.received().is_empty() && started.elapsed() < Duration::from_secs(20) {
        sleep(Duration::from_millis(100));
    }
    let log = agent.stop();
    drop(app);
    let got = receiver.received();
    let series = |name: &str| got.iter().find(|r| r.labels.get("__name__").map(String::as_str) == Some(name) && r.labels.get("service_name").map(String::as_str) == Some("kv-server"));
    let inuse = series("hbm_inuse").unwrap_or_else(|| panic!("no hbm_inuse series: {:?}\n{log}", got.iter().map(|r| &r.labels).collect::<Vec<_>>()));
    assert_eq!(inuse.profile.sample_type().kind, "inuse_space");
    assert_eq!(inuse.profile.total(), 222_298_112, "what the program holds at the end of the window");
    let alloc = series("hbm_alloc").expect("an hbm_alloc series");
    assert_eq!(alloc.profile.total(), 352_321_536);
    assert!(got.iter().all(|r| r.labels.get("__name__").map(String::as_str) != Some("process_cpu")), "cpu was not asked for");
}
