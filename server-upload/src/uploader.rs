//! Delivery of queued push requests to Pyroscope.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::queue::{DropReason, Next, PushItem, Queue};

const PUSH_PATH: &str = "/push.v1.PusherService/Push";

/// A credential: never shown by Debug or Display.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Basic { user: String, password: Secret },
    Bearer(Secret),
}

#[derive(Debug, Clone)]
pub struct PushConfig {
    /// The server's base URL, such as `http://pyroscope:4040`.
    pub url: String,
    pub auth: Auth,
    /// Sent as X-Scope-OrgID (multi-tenant Pyroscope, Grafana Cloud).
    pub tenant: Option<String>,
    /// PEM file with the CA certificate(s) to trust besides the system roots.
    pub ca_cert: Option<PathBuf>,
    pub request_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Attempts of one item that may fail with a retryable answer before it is dropped.
    pub max_attempts: u32,
    /// Age (since it was queued) after which a failing item is no longer retried.
    pub max_age: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("invalid server URL {0:?} (expected http:// or https://, without credentials: use the auth options)")]
    BadUrl(String),
    #[error("reading the CA certificate {path}: {reason}")]
    CaCert { path: String, reason: String },
    #[error("setting up the HTTP client: {0}")]
    Client(String),
}

enum Outcome {
    Delivered,
    /// The server answered that it may take the item later: 5xx, 429.
    Retry(String),
    /// The server could not be reached or did not answer in time: nothing else would get
    /// through either, so all items wait.
    Unreachable(String),
    /// The server refused this request for good (4xx).
    Refused(u16, String),
}

pub struct Uploader {
    client: reqwest::Client,
    push_url: String,
    config: PushConfig,
    queue: Arc<Queue>,
    auth_reported: bool,
}

impl Uploader {
    pub fn new(config: PushConfig, queue: Arc<Queue>) -> Result<Self, UploadError> {
        let url = config.url.trim_end_matches('/').to_string();
        let parsed = reqwest::Url::parse(&url).map_err(|_| UploadError::BadUrl(redact_url(&url)))?;
        if !matches!(parsed.scheme(), "http" | "https") || !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(UploadError::BadUrl(redact_url(&url)));
        }
        let mut builder = reqwest::Client::builder().timeout(config.request_timeout).user_agent(concat!("gpuflame/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_cert {
            let ca_err = |reason: String| UploadError::CaCert { path: path.display().to_string(), reason };
            let pem = std::fs::read(path).map_err(|e| ca_err(e.to_string()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ca_err(e.without_url().to_string()))?;
            if certs.is_empty() {
                return Err(ca_err("no certificate in the file".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| UploadError::Client(e.without_url().to_string()))?;
        Ok(Uploader { client, push_url: format!("{url}{PUSH_PATH}"), config, queue, auth_reported: false })
    }

    /// Delivers queued items, oldest first, until `shutdown` carries a deadline and the queue is
    /// empty or the deadline has passed. An item that fails waits out its own backoff while the
    /// ones behind it go on; it is dropped (counted) after `max_attempts` or `max_age`. Returns
    /// how many items were left undelivered.
    pub async fn run(mut self, mut shutdown: watch::Receiver<Option<Instant>>) -> usize {
        let stats = Arc::clone(&self.queue.stats);
        // While the server is unreachable, every item waits, not only the one that failed.
        let mut unreachable_until: Option<Instant> = None;
        let mut unreachable_backoff = self.config.backoff_initial;
        loop {
            let now = Instant::now();
            let deadline = *shutdown.borrow();
            if let Some(d) = deadline {
                if self.queue.is_empty() || now >= d {
                    break;
                }
            }
            let next = match unreachable_until {
                Some(t) if t > now => Next::WaitUntil(t),
                _ => self.queue.next(now),
            };
            let item = match next {
                Next::Send(item) => item,
                Next::Empty => {
                    tokio::select! {
                        _ = self.queue.notify.notified() => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
                Next::WaitUntil(t) => {
                    let until = deadline.map_or(t, |d| t.min(d));
                    tokio::select! {
                        _ = tokio::time::sleep_until(until.into()) => {}
                        _ = self.queue.notify.notified() => {}
                        _ = shutdown.changed() => {}
                    }
                    continue;
                }
            };
            match self.send(&item).await {
                Outcome::Delivered => {
                    self.queue.complete(item.seq);
                    stats.pushed.fetch_add(1, Ordering::Relaxed);
                    unreachable_backoff = self.config.backoff_initial;
                }
                Outcome::Refused(status, body) => {
                    self.queue.complete(item.seq);
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    self.report_refusal(status, &body);
                    unreachable_backoff = self.config.backoff_initial;
                }
                Outcome::Retry(reason) => {
                    unreachable_backoff = self.config.backoff_initial;
                    let wait = self.backoff(item.attempts);
                    self.retry_or_drop(&item, &reason, wait, true);
                }
                Outcome::Unreachable(reason) => {
                    let wait = jitter(unreachable_backoff);
                    unreachable_backoff = (unreachable_backoff * 2).min(self.config.backoff_max);
                    unreachable_until = Some(Instant::now() + wait);
                    // The item itself was not judged: only its age bounds its wait.
                    self.retry_or_drop(&item, &reason, wait, false);
                }
            }
        }
        self.queue.len()
    }

    /// The wait before the next attempt of an item that failed `attempts` times before.
    fn backoff(&self, attempts: u32) -> Duration {
        let b = self.config.backoff_initial.saturating_mul(1u32 << attempts.min(20)).min(self.config.backoff_max);
        jitter(b)
    }

    fn retry_or_drop(&self, item: &PushItem, reason: &str, wait: Duration, counts: bool) {
        let stats = &self.queue.stats;
        let attempts = item.attempts + u32::from(counts);
        let age = item.queued_at.elapsed();
        if counts && attempts >= self.config.max_attempts.max(1) {
            tracing::warn!(%reason, attempts, "push failed as often as allowed (--max-retries): the profile is dropped");
            self.queue.give_up(item.seq, DropReason::RetriesExhausted);
        } else if age + wait >= self.config.max_age {
            tracing::warn!(%reason, age_s = age.as_secs_f64(), "push failed and the profile is too old to retry (--max-age): dropped");
            self.queue.give_up(item.seq, DropReason::TooOld);
        } else if self.queue.retry_later(item.seq, Instant::now() + wait, counts) {
            stats.retries.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%reason, attempts, wait_ms = wait.as_millis() as u64, "push failed, will retry");
        }
    }

    fn report_refusal(&mut self, status: u16, body: &str) {
        if status == 401 || status == 403 {
            if !self.auth_reported {
                self.auth_reported = true;
                tracing::error!(
                    status,
                    "the server refused the credentials ({}): check the basic-auth or bearer-token settings and the tenant; profiles are dropped until it accepts them",
                    if status == 401 { "401 Unauthorized" } else { "403 Forbidden" }
                );
            }
            return;
        }
        tracing::warn!(status, body = %body.chars().take(200).collect::<String>(), "the server refused a profile; it is dropped");
    }

    async fn send(&self, item: &PushItem) -> Outcome {
        let mut req = self
            .client
            .post(&self.push_url)
            .header("Content-Type", "application/proto")
            .header("Connect-Protocol-Version", "1")
            .body(item.body.clone());
        req = match &self.config.auth {
            Auth::None => req,
            Auth::Basic { user, password } => req.basic_auth(user, Some(password.expose())),
            Auth::Bearer(token) => req.bearer_auth(token.expose()),
        };
        if let Some(tenant) = &self.config.tenant {
            req = req.header("X-Scope-OrgID", tenant);
        }
        match req.send().await {
            Err(e) => Outcome::Unreachable(e.without_url().to_string()),
            Ok(resp) => {
                let status = resp.status().as_u16();
                if resp.status().is_success() {
                    Outcome::Delivered
                } else if status == 429 || resp.status().is_server_error() {
                    Outcome::Retry(format!("HTTP {status}"))
                } else {
                    Outcome::Refused(status, resp.text().await.unwrap_or_default())
                }
            }
        }
    }
}

/// `d` spread over [d/2, 3d/2), so that the retries of many agents after a server restart do not
/// arrive together.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + fastrand::f64())
}

/// The URL without any user:password part, for messages.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("<redacted>");
                let _ = u.set_password(None);
            }
            u.to_string()
        }
        Err(_) => "<unparsable URL>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let auth = Auth::Basic { user: "u".into(), password: Secret::new("hunter2") };
        assert!(!format!("{auth:?}").contains("hunter2"));
        assert!(!format!("{:?}", Auth::Bearer(Secret::new("tok3n"))).contains("tok3n"));
    }

    #[test]
    fn urls_with_credentials_are_refused_and_redacted() {
        let cfg = |url: &str| PushConfig {
            url: url.into(),
            auth: Auth::None,
            tenant: None,
            ca_cert: None,
            request_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            max_attempts: 10,
            max_age: Duration::from_secs(300),
        };
        let q = Arc::new(Queue::new(10));
        let err = Uploader::new(cfg("http://user:hunter2@host:4040"), Arc::clone(&q)).err().unwrap().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(Uploader::new(cfg("ftp://host"), Arc::clone(&q)).is_err());
        assert!(Uploader::new(cfg("http://127.0.0.1:4040/"), q).is_ok());
    }
}
