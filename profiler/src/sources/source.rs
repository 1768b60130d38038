//! What a source is: what it takes ([`Input`]), and what it gives when a window closes
//! ([`Closed`]).

use std::time::Duration;

use gpuflame_bpf::{CudaCall, LiveAllocation, MemoryEvent, CuptiLaunch, CuptiStatus, GpuKernelBatch, HookedStack, GpuKernelName, KernelName, OffCpuEnd, OffCpuStack, Sample, ThreadReport};
use gpuflame_symbolizer::MappedFile;

use crate::cuda::hbm::HbmStats;
use crate::cuda::memory::DeviceUse;
use crate::cuda::Coverage;
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, StackValues, Stacks};

/// One record of the session, as sources see it.
pub enum Input<'a> {
    /// A CPU sample and its stack.
    Sample { sample: &'a Sample, stack: &'a StackKey },
    /// A thread left the CPU here; its time comes with the [`OffCpuEnd`] of the same wait.
    OffCpu { record: &'a OffCpuStack, stack: &'a StackKey },
    OffCpuEnd(&'a OffCpuEnd),
    /// A thread of a target as it is at a window's end (or when following starts): a wait going
    /// on is counted up to now.
    Waiting(&'a ThreadReport),
    /// A hooked CUDA call returned; `stack` is its caller's, without the call itself.
    CudaCall { call: &'a CudaCall, stack: &'a StackKey, files: Option<&'a [MappedFile]> },
    /// An allocation or free of the live set of device memory (tensors and segments).
    Memory(&'a MemoryEvent),
    /// The live set as the kernel keeps it, read at the window's end, before it closes.
    LiveAtWindowEnd(&'a [LiveAllocation]),
    /// The live set of a process as it was at its out-of-memory, read before its record.
    LiveAtOom { pid: u32, live: &'a [LiveAllocation] },
    /// A launch seen by CUPTI's callback: the correlation id its kernels' times will carry, and
    /// the launch's stack (the injection library's frames at its leaf).
    CuptiLaunch { launch: &'a CuptiLaunch, stack: &'a StackKey },
    /// The CUPTI injection library said how it is doing.
    CuptiStatus(&'a CuptiStatus),
    /// A stack from a profile's own hook, with what it weighs.
    HookedStack { record: &'a HookedStack, stack: &'a StackKey },
    KernelName(&'a KernelName),
    GpuKernels(&'a GpuKernelBatch),
    GpuKernelName(&'a GpuKernelName),
    ProcessExited(u32),
}

/// What a window's profiles are closed with.
pub struct WindowInfo {
    pub frequency_hz: u64,
    /// How much of the window the duty-cycled CUDA hooks were attached.
    pub coverage: Coverage,
    pub length: Duration,
}

/// One profile of a closed window, before symbolization.
pub struct Closed {
    pub kind: ProfileKind,
    pub values: StackValues,
    /// For the reader: how values were scaled or attributed.
    pub comments: Vec<String>,
}

impl Closed {
    pub fn new(kind: ProfileKind, values: StackValues) -> Self {
        Closed { kind, values, comments: Vec::new() }
    }
}

/// What the sources counted, for `-v` and the agent's metrics.
#[derive(Debug, Clone, Default)]
pub struct SourceStats {
    pub hbm: HbmStats,
    /// Tensors of PyTorch's caching allocator.
    pub tensors: HbmStats,
    /// Segment allocations that failed inside the allocator, which retried.
    pub allocator_retries: u64,
    /// Reserved against allocated, per device, now.
    pub devices: Vec<DeviceUse>,
    pub launches_seen: u64,
}

/// A source: records in, a window's profiles out. Device memory's out-of-memory reports and
/// timeline are its own (`DeviceMemorySource`), not every source's.
pub trait Source {
    /// Takes one record.
    fn add(&mut self, input: &Input<'_>, stacks: &mut Stacks);
    /// The window's profiles of the kinds asked for; a new window starts.
    fn close(&mut self, window: &WindowInfo, stacks: &mut Stacks) -> Vec<Closed>;
    /// What it counted, for `-v` and the agent's metrics.
    fn stats(&self, _into: &mut SourceStats) {}
}
