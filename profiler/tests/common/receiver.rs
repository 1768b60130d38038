//! A Pyroscope push endpoint for the tests: decodes each PushRequest as Pyroscope does, gunzips
//! and decodes every pprof with the profiler's own decoder, and answers as told.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use gpuflame::output::pprof;
use gpuflame::profile::Profile;
use gpuflame_server_upload::PushRequest;
use prost::Message;

/// One series of one push request.
#[derive(Debug, Clone)]
pub struct Received {
    pub labels: BTreeMap<String, String>,
    pub id: String,
    pub raw: Vec<u8>,
    pub profile: Profile,
    pub headers: BTreeMap<String, String>,
}

/// The status to answer request number `n` (from 0) with.
pub type Policy = Box<dyn Fn(usize) -> u16 + Send + Sync>;

pub struct Receiver {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start(policy: Policy) -> Self {
        Self::start_on("127.0.0.1:0", policy)
    }

    pub fn start_on(addr: &str, policy: Policy) -> Self {
        let listener = TcpListener::bind(addr).expect("binding the test receiver");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, requests, stop) = (Arc::clone(&received), Arc::clone(&requests), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => handle(conn, &policy, &received, &requests),
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Receiver { addr, received, requests, stop, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn handle(conn: TcpStream, policy: &Policy, received: &Mutex<Vec<Received>>, requests: &AtomicUsize) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let n = requests.fetch_add(1, Ordering::SeqCst);
    let status = if request_line.starts_with("POST /push.v1.PusherService/Push ") { policy(n) } else { 404 };
    if status == 200 {
        let req = PushRequest::decode(body.as_slice()).expect("a PushRequest");
        let mut got = received.lock().unwrap();
        for series in req.series {
            let labels: BTreeMap<String, String> = series.labels.into_iter().map(|l| (l.name, l.value)).collect();
            for sample in series.samples {
                let profile = pprof::read(&sample.raw_profile).expect("a gzipped pprof profile");
                got.push(Received { labels: labels.clone(), id: sample.id, raw: sample.raw_profile, profile, headers: headers.clone() });
            }
        }
    }
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        500 => "Internal Server Error",
        _ => "Error",
    };
    let body = if status == 200 { String::new() } else { format!("{{\"code\":\"{}\",\"message\":\"test\"}}", reason.to_lowercase()) };
    let mut conn = reader.into_inner();
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        if status == 200 { "application/proto" } else { "application/json" },
        body.len()
    );
    let _ = conn.flush();
}
