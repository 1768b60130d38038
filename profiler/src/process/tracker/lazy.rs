//! Programs read when their samples may need them, not when they start (the agent at its low
//! frequencies). A shell loop's `sleep 0.005` lives 6 ms and, at 19 Hz, almost never has a
//! sample; reading its maps, stat'ing and opening its files and describing it to BPF at its
//! exec and again when ld.so mapped libc was 0.21 ms of the agent's CPU per process, all of it
//! for nothing. A new program is read once it has lived [`ProcessTracker::read_delay`] (within a pass every
//! delay), or at once when a sample of it meets code that no mapping describes (BPF asks with
//! `Unknown`); one that exits first is never read. Its samples before the read are unwound with
//! the tables published by file (`published.rs`, `file_vmas.h`), as a program's first
//! milliseconds are anyway.
//!
//! The delay is a fifth of a sampling period: a program loses its read-ahead for at most a fifth
//! of a sample on average. At 99 Hz and above (record's default, the tests) that is 2 ms or less,
//! not worth a pass of its own, and every program is read at its exec as before; so too when
//! CUDA is hooked, which needs a program's libraries before it calls them.

use std::time::{Duration, Instant};

use gpuflame_bpf::BpfPrograms;

use super::ProcessTracker;

/// Samples a program may expect before it is read, on average, at most: the delay is this many
/// sampling periods.
const SAMPLES_BEFORE_READ: f64 = 0.2;
/// Delays shorter than this are not worth a pass: programs are read at exec.
const MIN_DELAY: Duration = Duration::from_millis(5);

impl ProcessTracker {
    /// How long a new program lives before its maps are read at `frequency_hz`, or None: at
    /// exec. The session needs it before there is a tracker: BPF's events are set up with it.
    pub fn read_delay(frequency_hz: u64) -> Option<Duration> {
        let delay = Duration::from_secs_f64(SAMPLES_BEFORE_READ / frequency_hz.max(1) as f64);
        (delay >= MIN_DELAY).then_some(delay)
    }

    /// Reads new programs `delay` after their exec, or when a sample asks (None: at exec).
    pub fn read_lazily(&mut self, delay: Option<Duration>) {
        self.read_delay = delay;
    }

    /// Whether new programs are read late (see the module's comment).
    pub fn lazy(&self) -> bool {
        self.read_delay.is_some()
    }

    /// Whether `pid` runs a program whose maps are not read yet.
    pub fn deferred(&self, pid: u32) -> bool {
        self.processes.get(&pid).is_some_and(|p| p.deferred.is_some())
    }

    /// `pid` exec'd: the old program's mappings are gone (BPF dropped its entry), the new one is
    /// read when it is due.
    pub(super) fn defer(&mut self, sampler: &mut BpfPrograms, pid: u32) {
        let now = Instant::now();
        let p = self.live(pid);
        p.unready = false;
        p.forked_from = None;
        // Its samples from now on are the new program's: not to be named by the old one's files.
        p.files = None;
        p.deferred = Some(now);
        let old = p.mapped.take();
        self.deferred.push_back((now, pid));
        if let Some(old) = old {
            self.release_unused(sampler, pid, &old.keys);
        }
    }

    /// Whether the deferral of `pid` at `since` still stands: not read, exited or exec'd again.
    fn deferred_since(&self, pid: u32, since: Instant) -> bool {
        self.processes.get(&pid).is_some_and(|p| p.deferred == Some(since))
    }

    /// How long until the next pass over the programs not read yet, if there are any. Passes
    /// come a delay apart at most, so that a stream of programs costs one wakeup a delay.
    pub fn next_lazy_pass(&self, now: Instant) -> Option<Duration> {
        let delay = self.read_delay?;
        // One read or gone already leaves the queue at the pass it is due at: a pass at most a
        // delay for nothing, where a scan of the queue would cost every wait of the event loop.
        let oldest = self.deferred.front()?.0;
        let at = (oldest + delay).max(self.last_lazy_pass + delay);
        Some(at.saturating_duration_since(now))
    }

    /// Reads the programs that have lived their delay; returns those read (they live).
    pub fn read_due(&mut self, sampler: &mut BpfPrograms) -> Vec<u32> {
        let now = Instant::now();
        let Some(delay) = self.read_delay else { return Vec::new() };
        if self.next_lazy_pass(now).is_none_or(|wait| !wait.is_zero()) {
            return Vec::new();
        }
        self.last_lazy_pass = now;
        let mut due = Vec::new();
        while let Some(&(since, pid)) = self.deferred.front() {
            if now.duration_since(since) < delay {
                break;
            }
            self.deferred.pop_front();
            if self.deferred_since(pid, since) {
                due.push(pid);
            }
        }
        for &pid in &due {
            self.refresh(sampler, pid);
        }
        due.into_iter().filter(|&pid| self.exec_entries(pid).is_some()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_read_late_only_at_low_frequencies() {
        assert_eq!(ProcessTracker::read_delay(19), Some(Duration::from_secs_f64(0.2 / 19.0)));
        assert!(ProcessTracker::read_delay(40).is_some());
        for hz in [49, 99, 199, 999, 5000] {
            assert_eq!(ProcessTracker::read_delay(hz), None, "{hz} Hz");
        }
    }
}
