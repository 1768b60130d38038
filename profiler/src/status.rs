//! The one-line live status on stderr while recording, as perf and py-spy show it.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct StatusLine {
    enabled: bool,
    last: Option<Instant>,
}

impl Default for StatusLine {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusLine {
    /// Drawn only on a terminal: logs and pipes get the summary line alone.
    pub fn new() -> Self {
        StatusLine { enabled: std::io::stderr().is_terminal(), last: None }
    }

    pub fn due(&self) -> bool {
        self.enabled && self.last.is_none_or(|t| t.elapsed() >= Duration::from_millis(250))
    }

    pub fn show(&mut self, elapsed: Duration, samples: u64, lost: u64) {
        self.last = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K[gpuflame] recording {:.1}s  {samples} samples  {lost} lost  (Ctrl-C to stop)", elapsed.as_secs_f64());
        let _ = err.flush();
    }

    pub fn clear(&mut self) {
        if self.enabled && self.last.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}
