//! The BPF side of gpuflame: the programs (C, under `src/bpf/`) and the Rust code that loads,
//! attaches and reads them. This is the only crate that knows map and event layouts; everything
//! above it sees typed values such as [`Sample`] and [`Counters`].

mod blocks;
mod calibrate;
mod config;
mod counters;
mod cuda;
mod error;
mod events;
mod features;
mod live_set;
mod perf;
mod pod;
mod process_maps;
mod programs;
mod skel;
mod python_threads;
mod ring_lag;
mod threads;
mod unwind_maps;
mod unwind_view;

pub use calibrate::{symbol_offset, HookTraps, TrapCost};
pub use config::{tensor_stack_chance, OffCpuSampling, OptionalPrograms, RingUse, SamplerConfig, Targets};
pub use counters::{Counter, Counters, CudaCounters, OffCpuCounters, PythonCounters, UnwindCounters};
pub use cuda::{CudaApi, CudaClass};
pub use error::BpfError;
pub use live_set::LiveAllocation;
pub use events::{python_name_tag, CudaCall, LiveKind, MemoryChange, MemoryEvent, CuptiLaunch, CuptiStatus, Event, HookedStack, GpuKernel, GpuKernelBatch, GpuKernelName, KernelName, LeafFile, OffCpuEnd, OffCpuStack, OffCpuState, ProcessEvent, ProcessEventKind, Sample, StackCopy, StackRead, UnwindStatus, UserFrame, STACK_COPY_BYTES, STACK_COPY_RECORD_BYTES};
pub use programs::hooks::TorchProbes;
pub use features::{CallHooks, Feature, KernelFeatures, UPROBE_SESSION};
pub use programs::load::{ProgramGroup, Unavailable};
pub use programs::cuda_hooks::{CudaFunctions, CudaHookLink};
pub use programs::BpfPrograms;
pub use python_threads::PythonThreads;
pub use ring_lag::boottime_ns;
pub use threads::{FollowedWait, ThreadReport, ThreadState, UserRegs};
pub use unwind_view::{ProcessUnwindView, PythonEval};
pub use unwind_maps::{monotonic_ns, ExecMapping, MappingTable, PendingTable, PythonProcess, TableId, UnwindCapacity};
