//! Where the agent's windows go: each series of a window, one profile type of one service, is
//! given to a [`Sink`]. Pyroscope's push is one, a directory of pprof files another; a further
//! output (OTLP, a second server) is one more implementation, and `agent/mod.rs` picks the sinks.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;

use gpuflame_server_upload::{LabelPair, PushItem, PushRequest, Queue, RawProfileSeries, RawSample};
use prost::Message;

use crate::outfile;

use super::labels;
use super::series::{self, Series};

/// Takes the series of each window as the agent makes them.
pub trait Sink {
    /// One series of window `window` (a run-unique id), of profile type `name` (Pyroscope's
    /// `__name__`: `process_cpu`, `memory_at_oom`…).
    fn series(&mut self, s: &Series, name: &str, window: &str);
}

/// Pyroscope's push: each series a request of its own, queued for the upload thread (which
/// retries, spools and drops as configured). Pyroscope stores the series of a request
/// independently, so a request refused in part and resent would store the accepted ones twice.
pub struct PyroscopePush<'q> {
    pub queue: &'q Queue,
    /// The sequence number of the next request, kept across runs by the spool.
    pub seq: &'q mut u64,
    pub hostname: &'q str,
    /// Labels every series gets (`--label`).
    pub labels: &'q [(String, String)],
}

impl Sink for PyroscopePush<'_> {
    fn series(&mut self, s: &Series, name: &str, window: &str) {
        if let Some(body) = self.request(s, name, window) {
            self.queue.push(PushItem::new(*self.seq, body));
            *self.seq += 1;
        }
    }
}

impl PyroscopePush<'_> {
    /// The push request of one series; none when its labels would have it refused (which the
    /// checks at start and the service names' limits should make impossible).
    fn request(&self, s: &Series, name: &str, window: &str) -> Option<Vec<u8>> {
        let mut labels = vec![("__name__".to_string(), name.to_string()), ("service_name".into(), s.service.clone()), ("hostname".into(), self.hostname.to_string())];
        if let Some(device) = s.device {
            labels.push(("device".into(), device.to_string()));
        }
        labels.extend(s.labels.iter().cloned());
        labels.extend(self.labels.iter().cloned());
        if let Err(e) = labels::check_series(&labels) {
            tracing::warn!(service = %s.service, error = %e, "a series Pyroscope would refuse is left out");
            return None;
        }
        let series = RawProfileSeries {
            labels: labels.into_iter().map(|(k, v)| LabelPair::new(k, v)).collect(),
            samples: vec![RawSample { raw_profile: series::gzip(&s.profile), id: window.to_string() }],
        };
        Some(PushRequest { series: vec![series] }.encode_to_vec())
    }
}

/// A directory of gzipped pprof files, one per series: `WINDOW-N-TYPE-SERVICE[-deviceD].pb.gz`,
/// N counting this run's files. The directory was checked at start (root's or the agent's user's,
/// writable by no one else); files are created new, never through a link, and the oldest this
/// run wrote are removed past `max_bytes`.
pub struct PprofDir {
    dir: PathBuf,
    max_bytes: u64,
    /// The files this run wrote and has not removed, oldest first, with their sizes.
    kept: VecDeque<(PathBuf, u64)>,
    bytes: u64,
    files: u64,
    /// Series that could not be written (a full disk, a name taken), each said in a warning.
    pub failed: u64,
}

impl PprofDir {
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        PprofDir { dir, max_bytes, kept: VecDeque::new(), bytes: 0, files: 0, failed: 0 }
    }

    /// Files written this run (those removed since for room included).
    pub fn written(&self) -> u64 {
        self.files - self.failed
    }
}

/// A name's characters that are safe in a file name; others become `_` (a service name is the
/// workload's to choose).
fn file_part(name: &str) -> String {
    let part: String = name.chars().take(100).map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if part.starts_with('.') || part.is_empty() {
        format!("_{part}")
    } else {
        part
    }
}

impl Sink for PprofDir {
    fn series(&mut self, s: &Series, name: &str, window: &str) {
        self.files += 1;
        let device = s.device.map(|d| format!("-device{d}")).unwrap_or_default();
        let path = self.dir.join(format!("{}-{}-{}-{}{device}.pb.gz", file_part(window), self.files, file_part(name), file_part(&s.service)));
        let body = series::gzip(&s.profile);
        let written = outfile::create_new(&path, 0o600).and_then(|mut f| {
            f.write_all(&body).inspect_err(|_| {
                // Ours, half written (a full disk): not left for a reader to take whole.
                let _ = std::fs::remove_file(&path);
            })
        });
        if let Err(e) = written {
            self.failed += 1;
            tracing::warn!(path = %path.display(), error = %e, "cannot write a series to the output directory");
            return;
        }
        self.bytes += body.len() as u64;
        self.kept.push_back((path, body.len() as u64));
        while self.bytes > self.max_bytes && self.kept.len() > 1 {
            let Some((old, len)) = self.kept.pop_front() else { break };
            self.bytes -= len;
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::debug!(path = %old.display(), error = %e, "an old output file is gone already");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::pprof_proto as pb;

    fn series(service: &str) -> Series {
        Series { service: service.into(), labels: Vec::new(), device: Some(1), profile: pb::Profile::default() }
    }

    /// Past the bound the oldest files this run wrote go; names a workload chose cannot leave the
    /// directory; a file planted at a name is neither written through nor removed.
    #[test]
    fn files_are_named_safely_and_bounded_and_a_planted_name_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let one = series::gzip(&pb::Profile::default()).len() as u64;
        let mut sink = PprofDir::new(dir.path().to_path_buf(), 2 * one);
        std::fs::write(dir.path().join("w1-1-process_cpu-a-device1.pb.gz"), "planted").unwrap();
        sink.series(&series("a"), "process_cpu", "w1");
        for _ in 0..3 {
            sink.series(&series("../../etc/x"), "process_cpu", "w1");
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["w1-1-process_cpu-a-device1.pb.gz", "w1-3-process_cpu-_.._.._etc_x-device1.pb.gz", "w1-4-process_cpu-_.._.._etc_x-device1.pb.gz"].map(String::from).to_vec());
        assert_eq!(std::fs::read_to_string(dir.path().join("w1-1-process_cpu-a-device1.pb.gz")).unwrap(), "planted");
        assert_eq!((sink.written(), sink.failed), (3, 1));
    }
}
