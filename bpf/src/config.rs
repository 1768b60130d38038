//! What a sampler is started with. Kept apart from the loading code: the profiler builds and
//! checks a configuration (from flags and files) long before, and without, any BPF.

use std::time::Duration;

/// Which processes are sampled. The filter runs in BPF: samples of other processes never reach
/// user space.
#[derive(Debug, Clone)]
pub enum Targets {
    /// Every process on the machine (the idle task excluded).
    All,
    /// These processes with all their threads; with `follow_forks`, every process they start too.
    Processes { pids: Vec<u32>, follow_forks: bool },
}

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second on each CPU.
    pub frequency_hz: u64,
    pub targets: Targets,
    /// Kernel memory the unwind tables may take, in bytes (6 per row). Shards of 6 MiB are
    /// created as tables load, so an idle or small machine uses far less.
    pub unwind_memory: u64,
    /// How switch-outs are unwound for off-CPU time (attached by [`crate::CpuSampler::enable_off_cpu`]).
    pub off_cpu: OffCpuSampling,
}

impl SamplerConfig {
    /// 256 MiB, 44M rows: tables load on demand, so this holds the hot files of many different
    /// PyTorch builds at once (all 71 files of one torch process take 11M rows, 66 MiB).
    pub const DEFAULT_UNWIND_MEMORY: u64 = 256 << 20;
    /// Bytes of kernel memory per unwind row.
    pub const BYTES_PER_ROW: u64 = 6;
}

/// Which switch-outs of target threads are unwound; the others' time is still counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuSampling {
    /// A thread has `thread_burst` unwinds, and gets one back each `thread_interval`: a thread
    /// that switches out less often than that has every wait unwound.
    pub thread_interval: Duration,
    pub thread_burst: u64,
    /// Unwinds per second and CPU at most, over all threads.
    pub cpu_rate: u64,
    /// Unwinds a CPU may do at once after an idle spell.
    pub cpu_burst: u64,
}

impl Default for OffCpuSampling {
    fn default() -> Self {
        OffCpuSampling { thread_interval: Duration::from_millis(10), thread_burst: 16, cpu_rate: 2000, cpu_burst: 64 }
    }
}
