//! Out-of-memory forensics: when an allocation fails for lack of device memory, what the failing
//! process held, by stack, with the failed request as a stack of its own:
//! `… → cudaMalloc → [out of memory] 128.0 MiB requested`. A snapshot, written when it happens,
//! not at the end of a window.

use std::time::{Duration, SystemTime};

use gpuflame_bpf::CudaApi;

use crate::cuda::hbm::SiteTotals;
use crate::cuda::human_bytes;
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, StackValues, Stacks, TailFrame};

/// An allocation that failed for lack of memory.
#[derive(Debug, Clone)]
pub struct OomReport {
    pub pid: u32,
    pub comm: String,
    pub api: CudaApi,
    pub requested: u64,
    pub device: u32,
    /// Bytes the process held when it failed, as far as the hooks saw.
    pub in_use: u64,
    pub stack: StackKey,
    pub in_use_by_site: SiteTotals,
}

impl OomReport {
    /// The in-use profile of the process that failed, the failed request included.
    pub fn snapshot(&self, stacks: &mut Stacks, at: SystemTime) -> Profile {
        let mut values = site_values(&self.in_use_by_site);
        let mut failing = self.stack.clone();
        failing.tail.push(TailFrame::Marker(format!("[out of memory] {} requested", human_bytes(self.requested))));
        values.push((failing, Some(self.device), vec![self.requested as i64, 1]));
        let mut profile = ProfileKind::HbmInUse.empty_profile(1);
        profile.comments.push(format!(
            "out of memory: {} of {} failed in pid {} ({}) holding {}",
            self.api.symbol(),
            human_bytes(self.requested),
            self.pid,
            self.comm,
            human_bytes(self.in_use)
        ));
        stacks.build(&mut profile, values, at, Duration::ZERO);
        profile
    }
}

/// Bytes and objects per allocating stack, with its device.
pub(super) fn site_values(totals: &SiteTotals) -> StackValues {
    totals.iter().map(|(site, &(bytes, objects))| (site.stack.clone(), Some(site.device), vec![bytes, objects])).collect()
}
