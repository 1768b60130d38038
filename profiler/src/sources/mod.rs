//! Sources: one per profile (or pair of profiles that share their state), each behind
//! [`Source`]. A source takes the session's records one at a time, with their stacks already
//! made by [`Stacks`], and when a window closes gives the values of its profiles by stack. It
//! knows nothing of BPF maps, files or the network.
//!
//! To add a profile: its descriptor in `profile_kind.rs`, a file here, a line in
//! [`for_profiles`]; see docs/ARCHITECTURE.md.

mod collectives;
mod cpu;
mod cuda_api;
mod cycled;
mod gpu_time;
pub mod hbm;
mod launches;
pub mod offcpu;
pub mod oom;
mod scaling;
pub mod source;
mod timeline_chart;

use gpuflame_bpf::TrapCost;

use crate::profile_kind::ProfileKind;
pub use oom::OomReport;
pub use source::{Closed, Input, Source, SourceStats, WindowInfo};

/// The sources that make `kinds`. `trap_cost`: what the traps of one hooked call cost, as
/// calibrated, to correct the counts of duty-cycled hooks; `tensor_sample_bytes`: the interval
/// of tensors' byte sampling, by which their stacks are weighed (0: every stack taken).
pub fn for_profiles(kinds: &[ProfileKind], trap_cost: TrapCost, tensor_sample_bytes: u64) -> Vec<Box<dyn Source>> {
    let wants = |k| kinds.contains(&k);
    let mut out: Vec<Box<dyn Source>> = Vec::new();
    if wants(ProfileKind::Cpu) {
        out.push(Box::new(cpu::Cpu::default()));
    }
    if wants(ProfileKind::OffCpu) || wants(ProfileKind::Wall) {
        out.push(Box::new(offcpu::OffCpu::new(wants(ProfileKind::OffCpu), wants(ProfileKind::Wall))));
    }
    // Memory is followed whenever CUDA is hooked: an out-of-memory failure is reported with
    // what was in use, whatever the profiles.
    if kinds.iter().any(|k| k.descriptor().needs.cuda.is_some()) {
        let memory = ProfileKind::MEMORY.map(wants);
        out.push(Box::new(hbm::HbmSource::new(memory, tensor_sample_bytes)));
    }
    if wants(ProfileKind::GpuLaunches) || wants(ProfileKind::CudaApi) {
        out.push(Box::new(cycled::CycledHooks::new(trap_cost, wants(ProfileKind::GpuLaunches), wants(ProfileKind::CudaApi))));
    }
    if wants(ProfileKind::GpuTime) {
        out.push(Box::new(gpu_time::GpuTimeSource::default()));
    }
    if wants(ProfileKind::Collectives) || wants(ProfileKind::CollectiveTime) {
        out.push(Box::new(collectives::Collectives::new(wants(ProfileKind::Collectives), wants(ProfileKind::CollectiveTime))));
    }
    out
}
