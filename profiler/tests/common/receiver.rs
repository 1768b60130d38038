//! A Pyroscope push endpoint for the tests that applies Pyroscope's own rules (written from
//! grafana/pyroscope pkg/distributor, pkg/validation/validate.go, pkg/pprof Normalize and
//! pkg/model/pprofsplit), so that what it stores is what Pyroscope would store:
//!
//! - every series of a request is taken or refused on its own, and the answer is the first
//!   error (a request refused in part and resent stores its accepted series twice);
//! - labels: at most 30 names, `service_name` not empty, names non-empty and at most 1,024 bytes,
//!   values at most 2,048, no name twice;
//! - profiles: at most 4 MiB uncompressed and 16,000 samples, at most 100 labels a sample, valid
//!   UTF-8 strings, string 0 empty, no `-` in sample types;
//! - numeric sample labels are dropped, and samples are split by their string labels into series
//!   whose labels are the series' plus those (the series' win), each checked again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gpuflame::output::pprof;
use gpuflame::profile::{Profile, ProfileCopy};
use gpuflame_server_upload::PushRequest;
use prost::Message;

pub const MAX_LABEL_NAMES: usize = 30;
pub const MAX_NAME_BYTES: usize = 1024;
pub const MAX_VALUE_BYTES: usize = 2048;
pub const MAX_PROFILE_BYTES: usize = 4 << 20;
pub const MAX_SAMPLES: usize = 16_000;
pub const MAX_SAMPLE_LABELS: usize = 100;

/// One series as stored, after the split by sample labels.
#[derive(Debug, Clone)]
pub struct Received {
    /// The stored series' labels: the pushed ones and the sample labels turned into labels.
    pub labels: BTreeMap<String, String>,
    /// The labels as pushed.
    pub sent_labels: BTreeMap<String, String>,
    pub id: String,
    pub raw: Vec<u8>,
    /// The samples of this series, their numeric labels dropped.
    pub profile: Profile,
    /// The longest string of the pushed profile, in bytes.
    pub longest_string: usize,
    /// The keys of the pushed profile's string sample labels (which Pyroscope makes series
    /// labels).
    pub string_label_keys: BTreeSet<String>,
    /// Samples of the pushed profile, before the split.
    pub pushed_samples: usize,
    /// Bytes of the pushed profile, uncompressed.
    pub uncompressed: usize,
    pub headers: BTreeMap<String, String>,
    pub at: Instant,
}

/// The status to answer request number `n` (from 0) with, before any series is looked at.
pub type Policy = Box<dyn Fn(usize) -> u16 + Send + Sync>;

/// The status for one series: its pushed labels, and how many times this series (labels and
/// id) was offered before.
pub type SeriesPolicy = Box<dyn Fn(&BTreeMap<String, String>, usize) -> u16 + Send + Sync>;

/// A series refused by the rules (a 400), with why.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub labels: BTreeMap<String, String>,
    pub reason: String,
}

/// A series as offered: its pushed labels and its sample id.
pub type SeriesKey = (BTreeMap<String, String>, String);

#[derive(Default)]
struct State {
    received: Vec<Received>,
    rejected: Vec<Rejection>,
    /// Per series (pushed labels and id): how many times it was offered, when first and last.
    offers: HashMap<SeriesKey, (usize, Instant, Instant)>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start(policy: Policy) -> Self {
        Self::start_on("127.0.0.1:0", policy)
    }

    pub fn start_on(addr: &str, policy: Policy) -> Self {
        Self::with_policies(addr, policy, Box::new(|_, _| 200))
    }

    /// A receiver that answers each series as `series` says.
    pub fn per_series(series: SeriesPolicy) -> Self {
        Self::with_policies("127.0.0.1:0", Box::new(|_| 200), series)
    }

    pub fn with_policies(addr: &str, policy: Policy, series: SeriesPolicy) -> Self {
        let listener = TcpListener::bind(addr).expect("binding the test receiver");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, requests, stop) = (Arc::clone(&state), Arc::clone(&requests), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => handle(conn, &policy, &series, &state, &requests),
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Receiver { addr, state, requests, stop, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// How many times each series (pushed labels and id) was offered.
    pub fn offers(&self) -> HashMap<SeriesKey, usize> {
        self.state.lock().unwrap().offers.iter().map(|(k, v)| (k.clone(), v.0)).collect()
    }

    /// When the first series with sample id `id` was first offered.
    pub fn first_offer(&self, id: &str) -> Option<Instant> {
        self.state.lock().unwrap().offers.iter().filter(|((_, i), _)| i == id).map(|(_, v)| v.1).min()
    }

    /// When the series of service `service` with sample id `id` was first and last offered.
    pub fn offer_times(&self, service: &str, id: &str) -> Option<(Instant, Instant)> {
        let state = self.state.lock().unwrap();
        state.offers.iter().find(|((l, i), _)| i == id && l.get("service_name").map(String::as_str) == Some(service)).map(|(_, v)| (v.1, v.2))
    }

    /// Series refused by Pyroscope's rules.
    pub fn rejected(&self) -> Vec<Rejection> {
        self.state.lock().unwrap().rejected.clone()
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

fn handle(conn: TcpStream, policy: &Policy, series_policy: &SeriesPolicy, state: &Mutex<State>, requests: &AtomicUsize) {
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
    let (status, message) = if !request_line.starts_with("POST /push.v1.PusherService/Push ") {
        (404, "not found".to_string())
    } else {
        match policy(n) {
            200 => push(&body, &headers, series_policy, state),
            other => (other, "refused by the test".to_string()),
        }
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Error",
    };
    let code = match status {
        400 => "invalid_argument",
        401 => "unauthenticated",
        429 => "resource_exhausted",
        _ => "internal",
    };
    let body = if status == 200 { String::new() } else { format!("{{\"code\":\"{code}\",\"message\":{message:?}}}") };
    let mut conn = reader.into_inner();
    let _ = write!(
        conn,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        if status == 200 { "application/proto" } else { "application/json" },
        body.len()
    );
    let _ = conn.flush();
}

/// Takes each series of a push request on its own; the first error is the answer.
fn push(body: &[u8], headers: &BTreeMap<String, String>, series_policy: &SeriesPolicy, state: &Mutex<State>) -> (u16, String) {
    let Ok(req) = PushRequest::decode(body) else { return (400, "not a PushRequest".into()) };
    let mut first_error: Option<(u16, String)> = None;
    let mut state = state.lock().unwrap();
    for series in req.series {
        let sent: BTreeMap<String, String> = series.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
        for sample in &series.samples {
            let now = Instant::now();
            let offers = state.offers.entry((sent.clone(), sample.id.clone())).or_insert((0, now, now));
            let offered_before = offers.0;
            offers.0 += 1;
            offers.2 = now;
            let outcome = match check_labels(series.labels.iter().map(|l| (l.name.as_str(), l.value.as_str()))) {
                Err(reason) => Err((400, reason)),
                Ok(()) => match series_policy(&sent, offered_before) {
                    200 => ingest(&sent, &sample.raw_profile, &sample.id, headers),
                    status => Err((status, format!("series {sent:?} refused by the test"))),
                },
            };
            match outcome {
                Ok(stored) => state.received.extend(stored),
                Err((status, reason)) => {
                    if status == 400 {
                        state.rejected.push(Rejection { labels: sent.clone(), reason: reason.clone() });
                    }
                    first_error.get_or_insert((status, reason));
                }
            }
        }
    }
    first_error.unwrap_or((200, String::new()))
}

/// Pyroscope's ValidateLabels (with its default of UTF-8 names).
pub fn check_labels<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> Result<(), String> {
    let mut labels: Vec<(&str, &str)> = labels.collect();
    if labels.is_empty() {
        return Err("no labels".into());
    }
    labels.sort();
    if labels.len() > MAX_LABEL_NAMES {
        return Err(format!("{} label names; limit {MAX_LABEL_NAMES}", labels.len()));
    }
    if !labels.iter().any(|(n, v)| *n == "service_name" && !v.is_empty()) {
        return Err("service name is not provided".into());
    }
    if let Some((_, name)) = labels.iter().find(|(n, _)| *n == "__name__") {
        let ok = !name.is_empty() && name.chars().enumerate().all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()));
        if !ok {
            return Err(format!("invalid metric name {name:?}"));
        }
    }
    let mut last = None;
    for (name, value) in &labels {
        if name.len() > MAX_NAME_BYTES {
            return Err(format!("label name too long: {} bytes", name.len()));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!("label value too long: {name} has {} bytes", value.len()));
        }
        if name.is_empty() {
            return Err("invalid label name ''".into());
        }
        if last == Some(*name) {
            return Err(format!("duplicate label name: '{name}'"));
        }
        last = Some(*name);
    }
    Ok(())
}

/// The parts of profile.proto that the rules look at, decoded on their own (not with the
/// profiler's decoder, so that the rules check what was sent, not what the profiler reads).
mod raw {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }
}

/// ValidateProfile, Normalize's drop of numeric labels, and the split by string sample labels.
fn ingest(sent: &BTreeMap<String, String>, gz: &[u8], id: &str, headers: &BTreeMap<String, String>) -> Result<Vec<Received>, (u16, String)> {
    let bad = |reason: String| (400u16, reason);
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gz).take(MAX_PROFILE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| bad(format!("gzip: {e}")))?;
    if bytes.len() > MAX_PROFILE_BYTES {
        return Err(bad(format!("uncompressed profile payload size exceeds limit of {MAX_PROFILE_BYTES}")));
    }
    let p = raw::Profile::decode(bytes.as_slice()).map_err(|e| bad(format!("malformed profile (invalid UTF-8?): {e}")))?;
    if p.sample.len() > MAX_SAMPLES {
        return Err(bad(format!("the profile exceeds the samples count limit (actual: {}, limit: {MAX_SAMPLES})", p.sample.len())));
    }
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err(bad("string 0 should be empty string".into()));
    }
    let string = |i: i64| p.string_table.get(usize::try_from(i).unwrap_or(usize::MAX)).map(String::as_str);
    let mut numeric = BTreeSet::new();
    let mut string_label_keys = BTreeSet::new();
    for s in &p.sample {
        if s.label.len() > MAX_SAMPLE_LABELS {
            return Err(bad(format!("the profile exceeds the sample labels limit ({})", s.label.len())));
        }
        if s.value.len() != p.sample_type.len() {
            return Err(bad("sample value length mismatch".into()));
        }
        for l in &s.label {
            let key = string(l.key).ok_or_else(|| bad("sample label string index out of range".into()))?;
            string(l.str).ok_or_else(|| bad("sample label string index out of range".into()))?;
            if l.str == 0 {
                numeric.insert(key.to_string());
            } else {
                string_label_keys.insert(key.to_string());
            }
        }
    }
    for t in &p.sample_type {
        if string(t.r#type).is_none_or(|s| s.contains('-')) {
            return Err(bad("sample type contains -".into()));
        }
    }
    let longest_string = p.string_table.iter().map(String::len).max().unwrap_or(0);

    let mut profile = pprof::read(&bytes).map_err(|e| bad(e.to_string()))?;
    let comm_key = ["thread_name", "comm"].into_iter().find(|k| p.string_table.iter().any(|s| s == k)).unwrap_or("comm");
    for s in &mut profile.samples {
        if numeric.contains("pid") {
            s.labels.pid = None;
        }
        if numeric.contains("tid") {
            s.labels.tid = None;
        }
        if numeric.contains("device") {
            s.labels.device = None;
        }
    }
    let sample_labels = |l: &gpuflame::profile::Labels| {
        let mut out = Vec::new();
        if let Some(c) = &l.comm {
            out.push((comm_key.to_string(), c.clone()));
        }
        if let Some(d) = l.device {
            out.push(("device".to_string(), d.to_string()));
        }
        out
    };
    let groups: BTreeSet<Vec<(String, String)>> = profile.samples.iter().map(|s| sample_labels(&s.labels)).collect();
    let mut stored = Vec::new();
    for group in groups {
        let mut labels = sent.clone();
        for (k, v) in &group {
            labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        check_labels(labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(bad)?;
        let mut part = ProfileCopy::of(&profile);
        for s in profile.samples.iter().filter(|s| sample_labels(&s.labels) == group) {
            part.copy(&profile, s);
        }
        let part = part.finish();
        stored.push(Received {
            labels,
            sent_labels: sent.clone(),
            id: id.to_string(),
            raw: gz.to_vec(),
            profile: part,
            longest_string,
            string_label_keys: string_label_keys.clone(),
            pushed_samples: p.sample.len(),
            uncompressed: bytes.len(),
            headers: headers.clone(),
            at: Instant::now(),
        });
    }
    Ok(stored)
}
