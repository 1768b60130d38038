//! The session's side of the live set of device memory (`gpuflame_bpf::LiveAllocation`): read
//! at each window's end, and its processes that are gone taken out of it once counted.

use std::collections::HashSet;

use gpuflame_bpf::{BpfPrograms, LiveAllocation};

use super::processes::Gone;

/// An out-of-memory's hold on its process's frees ends when its record is read; one whose record
/// the full ring lost ends after this long.
const STALE_HOLD_NS: u64 = 10_000_000_000;

#[derive(Default)]
pub(super) struct LiveSet {
    /// Processes gone since the last window's end: their allocations leave the set after it.
    gone: HashSet<u32>,
}

impl LiveSet {
    pub(super) fn gone(&mut self, gone: &Gone) {
        self.gone.extend(gone.0.iter().copied());
    }

    /// The live set now, where device memory is profiled.
    pub(super) fn read(&mut self, sampler: &mut BpfPrograms, wanted: bool) -> Option<Vec<LiveAllocation>> {
        if !wanted {
            return None;
        }
        if let Err(e) = sampler.end_stale_oom_holds(STALE_HOLD_NS) {
            tracing::warn!("ending the holds of out-of-memory reports whose record was lost: {e}");
        }
        let started = std::time::Instant::now();
        match sampler.live_allocations() {
            Ok(live) => {
                let freed = live.iter().filter(|a| a.freed_ns != 0).count();
                tracing::info!(allocations = live.len() - freed, freed_kept = freed, kept_count = sampler.live_freed_kept(), ms = started.elapsed().as_secs_f64() * 1e3, "live set of device memory read");
                Some(live)
            }
            Err(e) => {
                tracing::warn!("reading the live set of device memory: {e}");
                None
            }
        }
    }

    /// The window that counted `live` closed: the allocations of processes gone go.
    pub(super) fn forget_gone(&mut self, sampler: &mut BpfPrograms, live: Vec<LiveAllocation>) {
        let gone: Vec<LiveAllocation> = live.into_iter().filter(|a| self.gone.contains(&a.pid)).collect();
        self.gone.clear();
        if let Err(e) = sampler.forget_live(&gone) {
            tracing::warn!("taking {} allocations of exited processes out of the live set: {e}", gone.len());
        }
    }
}
