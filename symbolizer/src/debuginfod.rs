//! Downloads from debuginfod servers (DEBUGINFOD_URLS), in a thread of their own, so that
//! neither sampling nor the end of a recording waits on the network: symbolization waits for a
//! download at most [`DebugConfig::wait`](crate::DebugConfig) and once per build-id, then goes on
//! without it. Each build-id is asked for once per process; what was downloaded stays in an
//! on-disk cache for the next run.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config::config;
use crate::copy::MAX_COPY;

/// Downloads at once; the others queue.
const PARALLEL: usize = 4;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) enum Outcome {
    Pending,
    Found(PathBuf),
    Missing,
}

enum Fetch {
    /// `waited`: symbolization waited for it once already.
    Pending { waited: bool },
    Found(PathBuf),
    Missing,
}

struct Fetcher {
    fetches: Mutex<Fetches>,
    changed: Condvar,
    requests: tokio::sync::mpsc::UnboundedSender<String>,
}

struct Fetches {
    by_id: HashMap<String, Fetch>,
    /// One warning per process about servers that fail or are slow; the rest is debug.
    warned: bool,
}

static FETCHER: OnceLock<Option<Fetcher>> = OnceLock::new();

fn fetcher() -> Option<&'static Fetcher> {
    FETCHER.get_or_init(start).as_ref()
}

fn start() -> Option<Fetcher> {
    let config = config();
    if config.debuginfod_urls.is_empty() {
        return None;
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new().name("debuginfod".into()).spawn(move || run(rx));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the debuginfod thread; no downloads");
        return None;
    }
    Some(Fetcher { fetches: Mutex::new(Fetches { by_id: HashMap::new(), warned: false }), changed: Condvar::new(), requests: tx })
}

fn cached(id: &str) -> PathBuf {
    config().cache_dir.join(id).join("debuginfo")
}

/// Asks for the debug file of a build-id (lowercase hex). Some(id) while it may still come;
/// None when no server is configured.
pub(crate) fn request(id: &str) -> Option<String> {
    let f = fetcher()?;
    let mut fetches = f.fetches.lock().unwrap_or_else(|p| p.into_inner());
    if !fetches.by_id.contains_key(id) {
        let path = cached(id);
        if path.is_file() {
            fetches.by_id.insert(id.to_string(), Fetch::Found(path));
        } else {
            fetches.by_id.insert(id.to_string(), Fetch::Pending { waited: false });
            if f.requests.send(id.to_string()).is_err() {
                fetches.by_id.insert(id.to_string(), Fetch::Missing);
            }
        }
    }
    Some(id.to_string())
}

/// What became of a request. With `deadline`, waits for it until then, unless it was waited
/// for before; a wait that runs out is warned about, once.
pub(crate) fn result(id: &str, deadline: Option<Instant>) -> Outcome {
    let Some(f) = fetcher() else { return Outcome::Missing };
    let mut fetches = f.fetches.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        match fetches.by_id.get_mut(id) {
            None | Some(Fetch::Missing) => return Outcome::Missing,
            Some(Fetch::Found(path)) => return Outcome::Found(path.clone()),
            Some(Fetch::Pending { waited }) => {
                let now = Instant::now();
                let Some(deadline) = deadline.filter(|d| !*waited && *d > now) else {
                    if deadline.is_some() && !*waited {
                        *waited = true;
                        if !std::mem::replace(&mut fetches.warned, true) {
                            tracing::warn!(
                                servers = %config().debuginfod_urls.join(" "),
                                wait_s = config().wait.as_secs_f64(),
                                "debuginfod has not answered in time: frames it would name stay unnamed"
                            );
                        }
                    }
                    return Outcome::Pending;
                };
                fetches = f.changed.wait_timeout(fetches, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
    }
}

fn finish(id: &str, outcome: Result<Option<PathBuf>, String>) {
    let Some(f) = fetcher() else { return };
    let mut fetches = f.fetches.lock().unwrap_or_else(|p| p.into_inner());
    let fetch = match outcome {
        Ok(Some(path)) => Fetch::Found(path),
        Ok(None) => {
            tracing::debug!(build_id = id, "no debuginfod server has this build");
            Fetch::Missing
        }
        Err(e) => {
            if std::mem::replace(&mut fetches.warned, true) {
                tracing::debug!(build_id = id, error = %e, "debuginfod download failed");
            } else {
                tracing::warn!(build_id = id, error = %e, "debuginfod download failed; frames it would name stay unnamed");
            }
            Fetch::Missing
        }
    };
    fetches.by_id.insert(id.to_string(), fetch);
    f.changed.notify_all();
}

fn run(mut rx: tokio::sync::mpsc::UnboundedReceiver<String>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the debuginfod runtime; no downloads");
            while let Some(id) = rx.blocking_recv() {
                finish(&id, Ok(None));
            }
            return;
        }
    };
    runtime.block_on(async move {
        let config = config();
        let client = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).read_timeout(config.stall_timeout).build();
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot make an HTTP client; no debuginfod downloads");
                while let Some(id) = rx.recv().await {
                    finish(&id, Ok(None));
                }
                return;
            }
        };
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(PARALLEL));
        while let Some(id) = rx.recv().await {
            let (client, slots) = (client.clone(), slots.clone());
            tokio::spawn(async move {
                let _slot = slots.acquire().await;
                let outcome = download_any(&client, &config.debuginfod_urls, &id).await;
                finish(&id, outcome);
            });
        }
    });
}

/// Tries each server in turn: Ok(None) when none has the build, Err when one failed and none
/// had it.
async fn download_any(client: &reqwest::Client, urls: &[String], id: &str) -> Result<Option<PathBuf>, String> {
    let dest = cached(id);
    let mut failure = None;
    for url in urls {
        let url = format!("{url}/buildid/{id}/debuginfo");
        match download(client, &url, &dest).await {
            Ok(true) => return Ok(Some(dest)),
            Ok(false) => {}
            Err(e) => failure = Some(format!("{url}: {e}")),
        }
    }
    failure.map_or(Ok(None), Err)
}

#[derive(Debug, thiserror::Error)]
enum DownloadError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("larger than {MAX_COPY} bytes")]
    TooLarge,
    #[error("cache: {0}")]
    Cache(#[from] std::io::Error),
}

/// Streams one file into the cache (through a temporary name). Ok(false): the server does not
/// have it.
async fn download(client: &reqwest::Client, url: &str, dest: &Path) -> Result<bool, DownloadError> {
    let mut response = client.get(url).send().await?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(false);
    }
    if !response.status().is_success() {
        return Err(DownloadError::Status(response.status().as_u16()));
    }
    if response.content_length().is_some_and(|n| n > MAX_COPY) {
        return Err(DownloadError::TooLarge);
    }
    let dir = dest.parent().unwrap_or(Path::new("/"));
    make_private_dir(dir)?;
    let tmp = dir.join(format!(".debuginfo.{}.tmp", std::process::id()));
    let mut out = std::fs::File::create(&tmp)?;
    let mut written = 0u64;
    let copied: Result<(), DownloadError> = async {
        while let Some(chunk) = response.chunk().await? {
            written += chunk.len() as u64;
            if written > MAX_COPY {
                return Err(DownloadError::TooLarge);
            }
            out.write_all(&chunk)?;
        }
        Ok(())
    }
    .await;
    match copied.and_then(|()| std::fs::rename(&tmp, dest).map_err(DownloadError::from)) {
        Ok(()) => Ok(true),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The cache holds what root downloaded: its directories are root's alone.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}
