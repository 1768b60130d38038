//! Where debug information is looked for, set once for the process: the symbolizers and the
//! debuginfod thread all read the same settings.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Where separate debug information is looked for.
#[derive(Debug, Clone)]
pub struct DebugConfig {
    /// Directories laid out like /usr/lib/debug: `.build-id/xx/rest.debug`, and debug-link
    /// targets under the module's own directory.
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod servers (DEBUGINFOD_URLS); none: no network.
    pub debuginfod_urls: Vec<String>,
    /// Downloaded debug files, as `<cache>/<build-id>/debuginfo` (elfutils' layout).
    pub cache_dir: PathBuf,
    /// The longest symbolization waits for downloads still running, once per build-id.
    pub wait: Duration,
    /// A download is abandoned when the server sends nothing for this long.
    pub stall_timeout: Duration,
}

impl DebugConfig {
    /// /usr/lib/debug, DEBUGINFOD_URLS, and a cache under $XDG_CACHE_HOME or /var/cache.
    pub fn from_env() -> Self {
        let urls = std::env::var("DEBUGINFOD_URLS").unwrap_or_default();
        let cache_dir = match std::env::var_os("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
            Some(dir) => PathBuf::from(dir).join("gpuflame/debuginfod"),
            None => PathBuf::from("/var/cache/gpuflame/debuginfod"),
        };
        DebugConfig {
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            debuginfod_urls: parse_urls(&urls),
            cache_dir,
            // Under a second: with the rest of a recording's end (symbolizing, writing) a server
            // that never answers still leaves the recording ending within a second of its duration.
            wait: Duration::from_millis(800),
            stall_timeout: Duration::from_secs(15),
        }
    }
}

/// DEBUGINFOD_URLS is a space-separated list; only http and https are fetched.
fn parse_urls(text: &str) -> Vec<String> {
    text.split_whitespace()
        .filter(|u| {
            let ok = u.starts_with("http://") || u.starts_with("https://");
            if !ok {
                tracing::warn!(url = u, "DEBUGINFOD_URLS: only http:// and https:// servers are used");
            }
            ok
        })
        .map(|u| u.trim_end_matches('/').to_string())
        .collect()
}

static CONFIG: OnceLock<DebugConfig> = OnceLock::new();

/// Sets where debug information is looked for, before the first symbolizer is made; later
/// calls change nothing and return false.
pub fn configure(config: DebugConfig) -> bool {
    CONFIG.set(config).is_ok()
}

pub(crate) fn config() -> &'static DebugConfig {
    CONFIG.get_or_init(DebugConfig::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_only() {
        assert_eq!(parse_urls(" http://a:1/ https://b  file:///x "), ["http://a:1", "https://b"]);
    }
}
