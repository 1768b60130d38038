//! Sources: one per profile (or pair of profiles that share their state), each behind
//! [`Source`]. A source takes the session's records one at a time, with their stacks already
//! made by [`Stacks`], and when a window closes gives the values of its profiles by stack. It
//! knows nothing of BPF maps, files or the network.
//!
//! To add a profile: its descriptor in `profile_kind.rs` (which names its source), a file here, a
//! line in [`for_profiles`]; a profile with a hook of its own needs no file here (`hooked.rs`).
//! See docs/ARCHITECTURE.md.

mod collectives;
mod cpu;
mod cuda_api;
mod cycled;
mod gpu_time;
mod hooked;
pub mod device_memory;
mod launches;
pub mod offcpu;
pub mod oom;
mod scaling;
pub mod source;
mod memory_chart;

use gpuflame_bpf::TrapCost;

use crate::profile_kind::{ProfileKind, SourceKind};
pub use oom::OomReport;
pub use source::{Closed, Input, Source, SourceStats, WindowInfo};

/// The sources of a session: device memory, concretely (its out-of-memory reports and timeline
/// are asked of it), and the others behind [`Source`].
pub struct Sources {
    pub others: Vec<Box<dyn Source>>,
    pub memory: Option<device_memory::DeviceMemorySource>,
}

impl Sources {
    /// Every source, for what all of them take and give.
    pub fn all(&mut self) -> impl Iterator<Item = &mut dyn Source> {
        let memory = self.memory.as_mut().map(|m| m as &mut dyn Source);
        self.others.iter_mut().map(|s| s.as_mut() as &mut dyn Source).chain(memory)
    }
}

/// The sources that make `kinds`, as their descriptors name them. `trap_cost`: what the traps of
/// one hooked call cost, as calibrated, to correct the counts of duty-cycled hooks;
/// `tensor_sample_bytes`: the interval of tensors' byte sampling, by which their stacks are
/// weighed (0: every stack taken).
pub fn for_profiles(kinds: &[ProfileKind], frequency_hz: u64, trap_cost: TrapCost, tensor_sample_bytes: u64) -> Sources {
    let wants = |k| kinds.contains(&k);
    let mut made: Vec<SourceKind> = kinds.iter().map(|k| k.descriptor().source).collect();
    made.sort();
    made.dedup();
    let others = made
        .into_iter()
        .filter_map(|source| -> Option<Box<dyn Source>> {
            Some(match source {
                SourceKind::Cpu => Box::new(cpu::Cpu::default()),
                SourceKind::OffCpu => Box::new(offcpu::OffCpu::new(wants(ProfileKind::OffCpu), wants(ProfileKind::Wall), frequency_hz)),
                SourceKind::DeviceMemory => return None,
                SourceKind::CudaCalls => Box::new(cycled::CycledHooks::new(trap_cost, wants(ProfileKind::GpuLaunches), wants(ProfileKind::CudaApi))),
                SourceKind::GpuTime => Box::new(gpu_time::GpuTimeSource::default()),
                SourceKind::Collectives => Box::new(collectives::Collectives::new(wants(ProfileKind::Collectives), wants(ProfileKind::CollectiveTime))),
                SourceKind::HookedStacks => Box::new(hooked::HookedStacks::new(kinds.iter().copied().filter(|k| k.descriptor().source == SourceKind::HookedStacks))),
            })
        })
        .collect();
    // Memory is followed whenever CUDA is hooked: an out-of-memory failure is reported with
    // what was in use, whatever the profiles.
    let memory = kinds
        .iter()
        .any(|k| k.descriptor().needs.cuda.is_some())
        .then(|| device_memory::DeviceMemorySource::new(ProfileKind::MEMORY.map(wants), tensor_sample_bytes));
    Sources { others, memory }
}
