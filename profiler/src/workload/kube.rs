//! The pods of this node from the Kubernetes API: listed once, then watched (never a request per
//! process), on a thread of its own so that an API server that is slow or down never holds up
//! sampling or pushing. Plain reqwest and the few typed fields of pods.rs rather than kube-rs
//! and k8s-openapi: those would add hundreds of generated types to the binary for one list and
//! one watch.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::pods::{Pod, PodList, Pods, WatchEvent};

/// Where a pod's service account token and the cluster's CA are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Overrides SERVICE_ACCOUNT_DIR (for tests, or a token mounted elsewhere).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "GPUFLAME_KUBE_SERVICE_ACCOUNT_DIR";

/// A watch line longer than this (a pod of megabytes) is a broken stream: relist.
const MAX_EVENT_BYTES: usize = 4 << 20;
/// A token or CA file over this is not one.
const MAX_SECRET_BYTES: u64 = 1 << 20;

/// In-cluster configuration, as a pod gets it.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    pub base_url: String,
    pub token: String,
    pub ca_pem: Vec<u8>,
    pub node: String,
}

impl KubeConfig {
    /// None outside Kubernetes (no KUBERNETES_SERVICE_HOST); an error when inside but the
    /// service account or the node name is missing.
    pub fn from_env(hostname: &str) -> Option<Result<KubeConfig, String>> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok().filter(|h| !h.is_empty())?;
        Some(Self::read(&host, hostname))
    }

    fn read(host: &str, hostname: &str) -> Result<KubeConfig, String> {
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "443".into());
        let dir = PathBuf::from(std::env::var(SERVICE_ACCOUNT_DIR_ENV).unwrap_or_else(|_| SERVICE_ACCOUNT_DIR.into()));
        let read = |name: &str| -> Result<Vec<u8>, String> {
            let path = dir.join(name);
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?, MAX_SECRET_BYTES), &mut data)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(data)
        };
        let token = String::from_utf8(read("token")?).map_err(|_| "the service account token is not text".to_string())?.trim().to_string();
        let ca_pem = read("ca.crt")?;
        // The downward API's spec.nodeName; the host name is the node name on most clusters.
        let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| hostname.to_string());
        let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        Ok(KubeConfig { base_url: format!("https://{host}:{port}"), token, ca_pem, node })
    }
}

/// Starts watching this node's pods; `pods` fills as the API answers.
pub fn spawn_watcher(cfg: KubeConfig, pods: Pods) -> std::io::Result<()> {
    std::thread::Builder::new().name("gpuflame-kube".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the Kubernetes watcher; pods are labelled from their cgroups only");
                return;
            }
        };
        rt.block_on(watch_forever(cfg, pods));
    })?;
    Ok(())
}

async fn watch_forever(cfg: KubeConfig, pods: Pods) {
    let warned = Arc::new(AtomicBool::new(false));
    let client = match client(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot set up the Kubernetes API client; pods are labelled from their cgroups only");
            return;
        }
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        match list_and_watch(&client, &cfg, &pods).await {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(e) => {
                // Said once: a down API server would otherwise fill the log.
                if !warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(server = %cfg.base_url, error = %e, "Kubernetes API unavailable; pods are labelled from their cgroups only until it answers");
                } else {
                    tracing::debug!(error = %e, "Kubernetes API");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

fn client(cfg: &KubeConfig) -> Result<reqwest::Client, reqwest::Error> {
    let mut b = reqwest::Client::builder().tls_built_in_root_certs(false).connect_timeout(Duration::from_secs(5));
    for cert in reqwest::Certificate::from_pem_bundle(&cfg.ca_pem)? {
        b = b.add_root_certificate(cert);
    }
    b.build()
}

fn pods_url(cfg: &KubeConfig) -> String {
    format!("{}/api/v1/pods?fieldSelector=spec.nodeName%3D{}", cfg.base_url, urlencode(&cfg.node))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// Lists, then follows the watch until it ends (the server closes watches every few minutes):
/// Ok to list again at once, Err to back off.
async fn list_and_watch(client: &reqwest::Client, cfg: &KubeConfig, pods: &Pods) -> Result<(), String> {
    let list = client.get(pods_url(cfg)).bearer_auth(&cfg.token).timeout(Duration::from_secs(30)).send().await.map_err(|e| e.to_string())?;
    if !list.status().is_success() {
        return Err(format!("listing pods: HTTP {}", list.status()));
    }
    let body = list.bytes().await.map_err(|e| e.to_string())?;
    let list: PodList = serde_json::from_slice(&body).map_err(|e| format!("listing pods: {e}"))?;
    let mut version = list.metadata.resource_version.clone().unwrap_or_default();
    pods.replace_all(list.items);
    tracing::info!(pods = pods.len(), node = %cfg.node, "Kubernetes pods of this node listed");
    let url = format!("{}&watch=1&allowWatchBookmarks=true&resourceVersion={}", pods_url(cfg), urlencode(&version));
    let mut watch = client.get(url).bearer_auth(&cfg.token).send().await.map_err(|e| e.to_string())?;
    if !watch.status().is_success() {
        return Err(format!("watching pods: HTTP {}", watch.status()));
    }
    let mut line = Vec::new();
    while let Some(chunk) = watch.chunk().await.map_err(|e| e.to_string())? {
        for piece in chunk.split_inclusive(|&b| b == b'\n') {
            line.extend_from_slice(piece);
            if line.len() > MAX_EVENT_BYTES {
                return Err("a watch event over 4 MiB".into());
            }
            if line.ends_with(b"\n") {
                if !apply(&line, pods, &mut version)? {
                    return Ok(());
                }
                line.clear();
            }
        }
    }
    Ok(())
}

/// Applies one watch event; false when the watch must start over (its version expired).
fn apply(line: &[u8], pods: &Pods, version: &mut String) -> Result<bool, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(true);
    }
    let event: WatchEvent = serde_json::from_slice(line).map_err(|e| format!("a watch event: {e}"))?;
    if event.kind == "ERROR" {
        // 410 Gone: the version is too old; anything else is as good a reason to relist.
        tracing::debug!(status = %event.object, "watch ended by the API server");
        return Ok(false);
    }
    let pod: Pod = serde_json::from_value(event.object).map_err(|e| format!("a watched pod: {e}"))?;
    if let Some(v) = &pod.metadata.resource_version {
        version.clone_from(v);
    }
    match event.kind.as_str() {
        "ADDED" | "MODIFIED" => pods.upsert(pod),
        "DELETED" => {
            tracing::info!(uid = %pod.metadata.uid.as_deref().unwrap_or(""), "Kubernetes pod deleted: its processes are labelled from their cgroups");
            pods.remove(&pod);
        }
        _ => {} // BOOKMARK: only the version
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_events_change_the_pods() {
        let pods = Pods::default();
        let mut v = String::new();
        let added = br#"{"type":"ADDED","object":{"metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"7"},"status":{}}}
"#;
        assert!(apply(added, &pods, &mut v).unwrap());
        assert_eq!((pods.len(), v.as_str()), (1, "7"));
        let bookmark = br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#;
        assert!(apply(bookmark, &pods, &mut v).unwrap());
        assert_eq!((pods.len(), v.as_str()), (1, "9"));
        let deleted = br#"{"type":"DELETED","object":{"metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"10"}}}"#;
        assert!(apply(deleted, &pods, &mut v).unwrap());
        assert_eq!(pods.len(), 0);
        assert!(!apply(br#"{"type":"ERROR","object":{"code":410}}"#, &pods, &mut v).unwrap());
        assert!(apply(b"not json\n", &pods, &mut v).is_err());
        assert_eq!(urlencode("node-1.example"), "node-1.example");
        assert_eq!(urlencode("a b=c"), "a%20b%3Dc");
    }
}
