//! What the calls seen through the duty-cycled hooks stand for: the share of time the hooks were
//! attached, and each thread's slowdown by them in each window.

use std::time::Duration;

use gpuflame_bpf::{HookTraps, TrapCost};

/// How the counts of cycled hooks relate to what happened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coverage {
    /// Time the cycled hooks were attached, over the time they could have been.
    pub attached: Duration,
    pub elapsed: Duration,
    pub exact: bool,
    /// What the traps of a hooked call cost on this machine.
    pub trap_cost: TrapCost,
    /// How long each window of the cycled hooks lasts (zero when exact).
    pub window: Duration,
}

impl Coverage {
    /// What one observed call stands for, ignoring what the hooks slowed the caller down by.
    pub fn scale(&self) -> f64 {
        if self.exact || self.attached.is_zero() {
            1.0
        } else {
            self.elapsed.as_secs_f64() / self.attached.as_secs_f64()
        }
    }

}

/// A thread's calls through the cycled hooks, to correct its count for the hooks' own cost.
///
/// Hooks slow a launch-bound thread down: each hooked call costs two traps and the programs'
/// time, during which the thread would have made more calls. Of a window, only what the hooks
/// did not take was the thread's own, and the calls seen in it stand for that: each window's
/// calls are corrected by its own slowdown, since a thread launches in some phases of a run and
/// not in others.
#[derive(Debug, Clone, Default)]
pub struct ThreadRate {
    burst_first_ns: u64,
    burst_last_ns: u64,
    burst_calls: u64,
    burst_overhead_ns: u64,
    /// Closed bursts (about one per window).
    bursts: Vec<Burst>,
    /// All calls seen.
    pub calls: u64,
}

#[derive(Debug, Clone, Copy)]
struct Burst {
    calls: u64,
    /// From its first call to its last.
    span_ns: u64,
    /// The hooks' cost inside it.
    overhead_ns: u64,
}

/// Bursts kept per thread and window; more are merged into the last (a window of the agent
/// has 15 at the default duty cycle).
const MAX_BURSTS: usize = 1024;

/// Calls further apart than this belong to different windows.
const BURST_GAP_NS: u64 = 50_000_000;

impl ThreadRate {
    /// A call that returned at `ts_ns` whose hooks' programs took `hook_ns` and that trapped so.
    pub fn add(&mut self, ts_ns: u64, hook_ns: u64, traps: HookTraps, trap_cost: TrapCost) {
        if self.burst_calls > 0 && ts_ns.saturating_sub(self.burst_last_ns) > BURST_GAP_NS {
            self.close_burst();
        }
        if self.burst_calls == 0 {
            self.burst_first_ns = ts_ns;
        } else {
            // The previous call's hook cost lies between it and this one.
            self.burst_overhead_ns += hook_ns + trap_cost.of(traps).as_nanos() as u64;
        }
        self.burst_last_ns = ts_ns;
        self.burst_calls += 1;
        self.calls += 1;
    }

    fn close_burst(&mut self) {
        if self.burst_calls == 0 {
            return;
        }
        let burst = Burst { calls: self.burst_calls, span_ns: self.burst_last_ns.saturating_sub(self.burst_first_ns), overhead_ns: self.burst_overhead_ns };
        let full = self.bursts.len() >= MAX_BURSTS;
        match self.bursts.last_mut() {
            Some(last) if full => {
                last.calls += burst.calls;
                last.span_ns += burst.span_ns;
                last.overhead_ns += burst.overhead_ns;
            }
            _ => self.bursts.push(burst),
        }
        self.burst_calls = 0;
        self.burst_overhead_ns = 0;
    }
}

impl Coverage {
    /// What one observed call of this thread stands for.
    pub fn thread_scale(&self, rate: &mut ThreadRate) -> f64 {
        rate.close_burst();
        if self.exact || rate.calls == 0 || self.attached.is_zero() {
            return self.scale();
        }
        // Each window stands for its share of the run, those in which the thread made no call
        // too. Taking the thread's bursts for all it was watched took one that launched for 4 s
        // of a 14 s recording for one that launched all through it: 3.4M launches for 600,000
        // (an H200). A window's calls stand for the thread's own time in it, which is its burst
        // less the hooks' cost: a burst outlasts its window while the hooks detach in the
        // background (16 ms for 10 there; counted as 10, 1.6 times the truth).
        let window = self.window.as_nanos() as f64;
        let corrected: f64 = rate
            .bursts
            .iter()
            .map(|b| {
                let watched = window.max(b.span_ns as f64);
                // A small difference of large numbers when a call costs much less than its
                // hooks: kept within what a fourfold slowdown would explain.
                let own = (watched - b.overhead_ns as f64).max(watched / 4.0);
                b.calls as f64 * window / own
            })
            .sum();
        let span_ms = rate.bursts.iter().map(|b| b.span_ns).sum::<u64>() as f64 / 1e6;
        let overhead_ms = rate.bursts.iter().map(|b| b.overhead_ns).sum::<u64>() as f64 / 1e6;
        tracing::debug!(attached_ms = self.attached.as_secs_f64() * 1e3, elapsed_ms = self.elapsed.as_secs_f64() * 1e3, window_ms = window / 1e6, trap_ns = self.trap_cost.emulated.as_nanos() as u64, stepped_trap_ns = self.trap_cost.stepped.as_nanos() as u64, bursts = rate.bursts.len(), calls = rate.calls, span_ms, overhead_ms, corrected, "calls through cycled hooks");
        self.scale() * corrected / rate.calls as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate of a thread watched by 14 windows of 10 ms in 14 s, which launches (a call
    /// every 20 µs, 10 µs of it the hooks') only during 4 of them, `calls_per_burst` seen each.
    fn estimate(calls_per_burst: u64) -> f64 {
        let coverage = Coverage { attached: Duration::from_millis(140), elapsed: Duration::from_secs(14), exact: false, trap_cost: TrapCost { emulated: Duration::from_micros(4), stepped: Duration::from_micros(8), nested_return: false }, window: Duration::from_millis(10) };
        let mut rate = ThreadRate::default();
        for window in 0..4u64 {
            for i in 0..calls_per_burst {
                rate.add(window * 1_000_000_000 + i * 20_000, 6_000, HookTraps::default(), coverage.trap_cost);
            }
        }
        rate.calls as f64 * coverage.thread_scale(&mut rate)
    }

    /// The thread launches in one phase of the program and not in the others.
    #[test]
    fn a_thread_that_launches_in_some_windows_stands_for_that_part_of_the_run() {
        // Its natural pace is a call every 10 µs, for the 4 s in which it launched: 400,000 calls.
        let estimate = estimate(500);
        assert!((350_000.0..=450_000.0).contains(&estimate), "{estimate}");
    }

    /// The same thread where each window's hooks fire for 16 ms (detached in the background):
    /// 800 calls a burst, of which the hooks took 8 ms.
    #[test]
    fn calls_after_a_window_ends_do_not_count_twice() {
        let estimate = estimate(800);
        assert!((350_000.0..=450_000.0).contains(&estimate), "{estimate}");
    }
}
