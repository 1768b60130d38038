//! Where the agent's windows go: each series of a window, one profile type of one service, is
//! given to a [`Sink`]. Pyroscope's push is one; another output (OTLP, a directory of files, a
//! second server) is one more implementation, and `agent/mod.rs` picks the sinks.

use gpuflame_server_upload::{LabelPair, PushItem, PushRequest, Queue, RawProfileSeries, RawSample};
use prost::Message;

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
