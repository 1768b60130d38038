//! Delivery of queued push requests to Pyroscope.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::queue::{PushItem, Queue};

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
    /// Worth trying again: the network, 5xx, 429.
    Retry(String),
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

    /// Delivers queued items in order until `shutdown` carries a deadline and the queue is empty
    /// or the deadline has passed. Returns how many items were left undelivered.
    pub async fn run(mut self, mut shutdown: watch::Receiver<Option<Instant>>) -> usize {
        let stats = Arc::clone(&self.queue.stats);
        let mut backoff = self.config.backoff_initial;
        loop {
            let deadline = *shutdown.borrow();
            if let Some(d) = deadline {
                if self.queue.is_empty() || Instant::now() >= d {
                    break;
                }
            }
            let Some(item) = self.queue.front() else {
                tokio::select! {
                    _ = self.queue.notify.notified() => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            };
            match self.send(&item).await {
                Outcome::Delivered => {
                    self.queue.complete(item.seq);
                    stats.pushed.fetch_add(1, Ordering::Relaxed);
                    backoff = self.config.backoff_initial;
                }
                Outcome::Refused(status, body) => {
                    self.queue.complete(item.seq);
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    self.report_refusal(status, &body);
                }
                Outcome::Retry(reason) => {
                    stats.retries.fetch_add(1, Ordering::Relaxed);
                    // Jitter spreads the retries of many agents after a server restart.
                    let wait = backoff.mul_f64(0.5 + fastrand::f64());
                    tracing::debug!(%reason, wait_ms = wait.as_millis() as u64, "push failed, retrying");
                    backoff = (backoff * 2).min(self.config.backoff_max);
                    let sleep = tokio::time::sleep(wait);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            _ = &mut sleep => break,
                            changed = shutdown.changed() => {
                                if changed.is_err() { break; }
                                // On shutdown the remaining wait is cut to the deadline.
                                if let Some(d) = *shutdown.borrow() {
                                    if Instant::now() >= d { break; }
                                }
                            }
                        }
                    }
                }
            }
        }
        self.queue.len()
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
            Err(e) => Outcome::Retry(e.without_url().to_string()),
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
        };
        let q = Arc::new(Queue::new(10));
        let err = Uploader::new(cfg("http://user:hunter2@host:4040"), Arc::clone(&q)).err().unwrap().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(Uploader::new(cfg("ftp://host"), Arc::clone(&q)).is_err());
        assert!(Uploader::new(cfg("http://127.0.0.1:4040/"), q).is_ok());
    }
}
