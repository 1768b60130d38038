//! Calls seen through the duty-cycled hooks stand for more than themselves: what each thread's
//! calls are scaled by, from the time the hooks were attached and what they cost it.

use std::collections::HashMap;
use gpuflame_bpf::{CudaCall, TrapCost};

use crate::cuda::{Coverage, ThreadRate};

pub(super) struct CycledCalls {
    threads: HashMap<u32, ThreadRate>,
    trap_cost: TrapCost,
}

impl CycledCalls {
    pub(super) fn new(trap_cost: TrapCost) -> Self {
        CycledCalls { threads: HashMap::new(), trap_cost }
    }

    /// Notes a call, if it came through a cycled hook.
    pub(super) fn saw(&mut self, call: &CudaCall) {
        if !call.api.always_on() {
            self.threads.entry(call.sample.tid).or_default().add(call.sample.timestamp_ns, call.hook_ns, call.traps, self.trap_cost);
        }
    }

    /// What each thread's calls of the window stand for; a new window starts.
    pub(super) fn take_scales(&mut self, coverage: Coverage) -> ThreadScales {
        let threads = std::mem::take(&mut self.threads).into_iter().map(|(tid, mut rate)| (tid, coverage.thread_scale(&mut rate))).collect();
        ThreadScales { threads, default: coverage.scale() }
    }
}

pub(super) struct ThreadScales {
    threads: HashMap<u32, f64>,
    default: f64,
}

impl ThreadScales {
    pub(super) fn scaled(&self, tid: u32, v: i64) -> i64 {
        (v as f64 * self.threads.get(&tid).copied().unwrap_or(self.default)).round() as i64
    }
}

/// The comment of a profile whose counts were scaled.
pub(super) fn sampling_comment(coverage: &Coverage) -> Option<String> {
    if coverage.exact {
        return None;
    }
    let scale = coverage.scale();
    Some(format!(
        "sampled: launch and synchronisation hooks were attached {:.2}% of the time ({:.0} ms of {:.1} s); counts and times are scaled by {:.1}, more for threads the hooks slowed down ({} ns of traps per call, {} where the first instruction is stepped)",
        100.0 / scale,
        coverage.attached.as_secs_f64() * 1e3,
        coverage.elapsed.as_secs_f64(),
        scale,
        coverage.trap_cost.emulated.as_nanos(),
        coverage.trap_cost.stepped.as_nanos()
    ))
}
