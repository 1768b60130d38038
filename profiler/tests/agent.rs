//! `gpuflame agent` against a Pyroscope push endpoint in the test that applies Pyroscope's rules
//! (common/receiver.rs): what arrives and when, through server faults, restarts, TLS and
//! SIGTERM. Run as root (the agent profiles the whole machine). Series, labels and limits:
//! agent_series.rs.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::agent::*;
use common::receiver::Receiver;
use common::*;

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
    // A process spinning for the 3 s window at 99 Hz: samples of 1e9/99 ns each, at most one
    // CPU's worth (297), about that on a quiet machine; a loaded one shares the CPUs with it,
    // so the floor is a tenth of that, enough to tell a profile from an empty one.
    assert_eq!(r.profile.period, 1_000_000_000 / 99);
    let samples = r.profile.total() / r.profile.period;
    assert!((30..=320).contains(&samples), "{samples} samples for a 3 s window at 99 Hz");
    // pid and tid, which Pyroscope drops, are merged away; the thread name is a root frame.
    assert!(r.profile.samples.iter().all(|s| s.labels == Default::default()), "sample labels left: {:?}", r.profile.samples[0].labels);
    assert_eq!(root_frames(&r.profile), ["thread:trainer_bin".to_string()].into());
    assert_clean(&receiver);
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
    // Until two windows of the steady process are stored, past the five failures.
    let deadline = Instant::now() + HANG;
    while receiver.received().iter().filter(|r| r.labels["service_name"] == "steady").count() < 2 {
        assert!(Instant::now() < deadline, "no window delivered after the server's errors");
        sleep(Duration::from_millis(100));
    }
    let stats = summary(&child.stop());
    let mut seqs: Vec<u64> = receiver.received().iter().filter(|r| r.labels["service_name"] == "steady").map(|r| window_seq(&r.id)).collect();
    seqs.sort();
    let queued = stats["profiles queued"];
    assert!(stats["windows"] >= 2, "{stats:?}");
    assert_eq!(stats["pushed"], queued, "every series delivered: {stats:?}");
    assert_eq!(stats["dropped"], 0);
    assert!(stats["retries"] >= 5);
    // The steady process is in every window (the last, cut short by SIGTERM, may have missed
    // it): each window exactly once, none missing.
    let n = seqs.len() as u64;
    assert!(n + 1 >= stats["windows"], "{n} of {} windows: {seqs:?}", stats["windows"]);
    assert_eq!(seqs, (0..n).collect::<Vec<_>>(), "windows received: {seqs:?}");
    assert_clean(&receiver);
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
    // Windows pile up until the bound drops some: as soon as the machine lets the agent close
    // them (a loaded one closed none in 6 s).
    let deadline = Instant::now() + HANG;
    let metrics = loop {
        let metrics = http_get(metrics_port);
        if metric(&metrics, "gpuflame_profiles_dropped_total") > 0 || Instant::now() >= deadline {
            break metrics;
        }
        sleep(Duration::from_millis(200));
    };
    let max_bytes: u64 = metric(&metrics, "gpuflame_queue_bytes_max");
    let dropped_while_down = metric(&metrics, "gpuflame_profiles_dropped_total");
    assert!(max_bytes <= bound, "queue held {max_bytes} bytes, bound {bound}");
    assert!(dropped_while_down > 0, "the bound was never reached:\n{metrics}");
    // The server comes back, and gets what the queue held and the windows after.
    let receiver = Receiver::start_on(&format!("127.0.0.1:{port}"), Box::new(|_| 200));
    while receiver.received().len() < 3 {
        assert!(Instant::now() < deadline, "nothing delivered once the server was back");
        sleep(Duration::from_millis(100));
    }
    let stats = summary(&child.stop());
    assert_clean(&receiver);
    assert_eq!(receiver.received().len() as u64, stats["pushed"], "{stats:?}");
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
    // Stops within a hang bound (Agent::stop).
    child.stop();
    let got = receiver.received();
    let steady: Vec<_> = got.iter().filter(|r| r.labels["service_name"] == "steady").collect();
    assert_eq!(steady.len(), 1);
    let secs = steady[0].profile.duration_nanos as f64 / 1e9;
    // The part of the 60 s window that ran (~3 s; more on a loaded machine), not all of it.
    assert!((1.0..30.0).contains(&secs), "the flushed window lasted {secs} s");
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
    // "status=401", not "401": the server's port may hold those digits (40103 did in a CI run).
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("status=401")).collect();
    assert_eq!(reports.len(), 1, "expected one report of the 401:\n{stderr}");
    assert!(reports[0].contains("refused the credentials"), "{}", reports[0]);
    assert!(!stderr.contains("pw-s3cret"));
    let stats = summary(&stderr);
    assert!(stats["failed"] >= 3, "{stats:?}");
    assert!(receiver.requests.load(std::sync::atomic::Ordering::SeqCst) >= 3);
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
    assert_clean(&receiver);
    let got = receiver.received().len() as u64;
    assert!(got > spooled, "{spooled} spooled series and the new window's, got {got}");
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
        assert!(started.elapsed() < HANG, "the HTTPS sink did not start");
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
    let pushed = summary(&log)["pushed"];
    assert!(pushed >= 1, "{log}");
    assert_eq!(pushes() as u64, pushed);
    let _ = server.0.kill();
}

/// A starved agent says how far behind it fell: stopped (SIGSTOP) for 2 s, its metrics then show
/// records that waited that long in the ring.
#[test]
fn the_agents_metrics_say_how_long_records_waited_in_the_ring() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let _spinner = spinner(dir.path(), "lagged", None);
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = agent(&["--server", "http://127.0.0.1:9", "--window", "15", "--metrics-addr", &format!("127.0.0.1:{metrics_port}")]);
    sleep(Duration::from_secs(1));
    let pid = child.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    sleep(Duration::from_secs(2));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let lag = loop {
        let lag = metric(&http_get(metrics_port), "gpuflame_ring_lag_milliseconds");
        if lag >= 1_800 || Instant::now() >= deadline {
            break lag;
        }
        sleep(Duration::from_millis(200));
    };
    child.stop();
    assert!(lag >= 1_800, "the ring lag said {lag} ms after 2 s stopped");
}

/// Without a server, `--output-dir` is where every series goes: a gzipped pprof file each, named
/// by window, type and service, only the agent's to read, and the run's last line counts them.
#[test]
fn an_output_directory_gets_a_pprof_file_per_series_without_a_server() {
    require_bpf();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let workload = spinner(dir.path(), "dirspin_bin", Some(("GPUFLAME_SERVICE_NAME", "dir-trainer")));
    sleep(Duration::from_millis(300));
    let out_dir = dir.path().join("out");
    let out = Command::new(GPUFLAME)
        .args(["agent", "--output-dir", out_dir.to_str().unwrap(), "--once", "--window", "3", "-F", "99"])
        .env_remove("GPUFLAME_SERVER")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    drop(workload);

    let names: Vec<String> = std::fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let trainer: Vec<&String> = names.iter().filter(|n| n.ends_with("-process_cpu-dir-trainer.pb.gz")).collect();
    assert_eq!(trainer.len(), 1, "one file for the service's CPU series: {names:?}");
    let summary = stderr.lines().find(|l| l.starts_with("gpuflame agent:") && l.contains("windows")).unwrap_or_default();
    assert!(summary.contains(&format!(", {} files written, 0 files failed", names.len())), "{summary}\n{names:?}");
    let file = out_dir.join(trainer[0]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    // The file is a profile gpuflame (and so pprof) reads: the spinner's 3 s at 99 Hz.
    let folded = dir.path().join("trainer.folded");
    gpuflame_ok(&["convert", file.to_str().unwrap(), "-o", folded.to_str().unwrap()], 0);
    let stacks = read_folded(&folded);
    let samples = total(&stacks);
    assert!((30..=320).contains(&samples), "{samples} samples for a 3 s window at 99 Hz:\n{}", describe(&stacks));
    assert!(stacks.iter().all(|s| s.frames.iter().any(|f| f == "thread:dirspin_bin")), "{}", describe(&stacks));
}
