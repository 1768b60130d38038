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
    /// How switch-outs are unwound for off-CPU time (attached by [`crate::BpfPrograms::enable_off_cpu`]).
    pub off_cpu: OffCpuSampling,
    /// What goes through the ring buffer of records, which is sized for it.
    pub ring: RingUse,
    /// Process events (fork, exec, mapping, exit) wait for the reader's next wakeup instead of
    /// waking it; only a sample's requests wake it. For a reader that reads a new program's maps
    /// only once it lived a while or a sample needs them (`ProcessTracker::read_lazily`).
    pub lazy_process_events: bool,
    /// Byte sampling of PyTorch tensors' stacks (torch_allocator.h): the interval in bytes, 0 for
    /// every tensor's stack. Every tensor is still sent; see [`tensor_stack_chance`].
    pub tensor_sample_bytes: u64,
    /// Every allocation and free of device memory goes into the ring, for a memory timeline;
    /// else only allocations with a stack (the allocation profiles), frees and the rest counted.
    pub memory_timeline: bool,
    /// Where no timeline is drawn: tensors' allocations with a stack go into the ring too, for
    /// the tensor-alloc profile; else a tensor is only an insert into the live set and a count.
    pub tensor_allocation_records: bool,
    /// The most allocations (tensors and segments) the live set of device memory holds; more
    /// are counted and left out of in-use (live_allocations.h).
    pub max_live_allocations: u32,
    /// Tests: every CPU sample carries a copy of its stack from the leaf, with the walk's own
    /// stack, for the user-space unwinder to check the BPF one (stack_copy.h). Python frames are
    /// not walked then.
    pub copy_every_stack: bool,
    /// The programs loaded besides the sampler's and the process events'.
    pub programs: OptionalPrograms,
}

/// Programs loaded only for the profiles that need them: a kernel that cannot take one (a
/// feature it lacks, a verifier that refuses it) still runs the others, and a profile of CPU
/// time alone verifies less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalPrograms {
    /// The switch programs of off-CPU and wall time.
    pub off_cpu: bool,
    /// The CUDA hooks with their calibration, and PyTorch's allocator probes.
    pub cuda: bool,
    /// The task iterators that report the targets' threads (`gpuflame dump`; off-CPU loads
    /// them too), without the switch programs.
    pub threads: bool,
}

impl OptionalPrograms {
    pub const ALL: OptionalPrograms = OptionalPrograms { off_cpu: true, cuda: true, threads: true };
}

/// The chance that the stack of a tensor of `size` bytes was taken, under byte sampling with
/// `interval` (0: none): 1 for a tensor of the interval or more, else 1 - exp(-size / interval).
/// A drawn tensor stands for 1/chance of its kind.
pub fn tensor_stack_chance(size: u64, interval: u64) -> f64 {
    if interval == 0 || size >= interval {
        return 1.0;
    }
    -(-(size as f64) / interval as f64).exp_m1()
}

/// The countdowns the BPF side restarts at (TENSOR_DRAWS of them): -ln(u) * interval at evenly
/// spaced u in (0, 1), an exponential distribution of mean `interval` when picked at random.
pub fn tensor_draws(interval: u64, n: usize) -> Vec<u64> {
    (0..n).map(|i| ((-((i as f64 + 0.5) / n as f64).ln()) * interval as f64).round().max(1.0) as u64).collect()
}

/// What the records' ring buffer carries: CPU samples alone come at a rate known ahead
/// ([`SamplerConfig::samples_ring_bytes`]); switches and hooked calls at any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingUse {
    CpuSamplesOnly,
    Any,
}

impl SamplerConfig {
    /// 256 MiB, 44M rows: tables load on demand, so this holds the hot files of many different
    /// PyTorch builds at once (all 71 files of one torch process take 11M rows, 66 MiB).
    pub const DEFAULT_UNWIND_MEMORY: u64 = 256 << 20;
    /// Bytes of kernel memory per unwind row.
    pub const BYTES_PER_ROW: u64 = 6;
    /// The largest ring of records, and the one for sessions whose records come at no rate
    /// known ahead (switches, CUDA calls).
    pub const MAX_RING_BYTES: u32 = 16 << 20;
    const MIN_RING_BYTES: u32 = 1 << 20;
    /// The live set's bound: a vLLM server holds tens of thousands of tensors; a million is
    /// ~100 MiB of kernel memory when full (BENCHMARKS.md), nothing while unused.
    pub const DEFAULT_LIVE_ALLOCATIONS: u32 = 1 << 20;
    /// Freed allocations the live set keeps for the next allocation at their address, on top of
    /// its bound (live_allocations.h): a caching allocator's working set of addresses. ~8 MiB of
    /// kernel memory when all are kept.
    pub const FREED_KEPT: u32 = 1 << 16;

    /// A ring for CPU samples alone, at `frequency_hz` on `cpus` CPUs: room for 4 s of them
    /// (a window's close may keep the reader away that long), between 1 and 16 MiB. The reader
    /// maps the ring twice and every page of it is touched once it has wrapped: at the agent's
    /// 19 Hz on a 2-CPU machine, 16 MiB were 32 MiB of its resident memory for 0.2 MB/s.
    pub fn samples_ring_bytes(frequency_hz: u64, cpus: u64) -> u32 {
        let per_second = frequency_hz.saturating_mul(cpus).saturating_mul(crate::events::record::RECORD_BYTES as u64);
        // And 16 stack copies per CPU (stack_copy.h), for the seconds after attaching.
        let copies = cpus.saturating_mul(16 * crate::events::STACK_COPY_RECORD_BYTES as u64);
        let wanted = per_second.saturating_mul(4).saturating_add(copies).clamp(u64::from(Self::MIN_RING_BYTES), u64::from(Self::MAX_RING_BYTES));
        // A power of two (the kernel's rule for a ring) no larger than the largest, itself one.
        u32::try_from(wanted.next_power_of_two()).unwrap_or(Self::MAX_RING_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::SamplerConfig;

    #[test]
    fn the_ring_follows_the_sample_rate() {
        assert_eq!(SamplerConfig::samples_ring_bytes(19, 2), 2 << 20);
        assert_eq!(SamplerConfig::samples_ring_bytes(99, 2), 8 << 20);
        assert_eq!(SamplerConfig::samples_ring_bytes(99, 96), 16 << 20);
        assert_eq!(SamplerConfig::samples_ring_bytes(5000, 2), 16 << 20);
    }

    #[test]
    fn tensor_draws_are_exponential_with_the_interval_as_mean() {
        let draws = super::tensor_draws(2 << 20, 1024);
        let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
        assert!((mean / f64::from(2u32 << 20) - 1.0).abs() < 0.01, "{mean}");
        // Half of them below the median of the distribution, I ln 2.
        let below = draws.iter().filter(|&&d| (d as f64) < f64::from(2u32 << 20) * std::f64::consts::LN_2).count();
        assert_eq!(below, 512);
        assert!(draws.iter().all(|&d| d >= 1));
    }

    #[test]
    fn a_tensor_is_drawn_with_its_bytes_chance_and_always_from_the_interval() {
        use super::tensor_stack_chance as chance;
        assert_eq!((chance(4096, 0), chance(2 << 20, 2 << 20), chance(1 << 30, 2 << 20)), (1.0, 1.0, 1.0));
        assert!((chance(4096, 2 << 20) - 0.001_951).abs() < 1e-6);
        assert!((chance(1 << 20, 2 << 20) - 0.393_469).abs() < 1e-6);
    }
}

/// Which switch-outs of target threads are drawn for unwinding. The time of every wait is
/// measured; the unwound ones carry the others', each weighing its time over its chance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuSampling {
    /// A wait asks for a chance of its expected length (its thread's recent waits) over this,
    /// at most 1: about one stack per period of waiting, as CPU time is sampled. Under 2^32 ns.
    pub period: Duration,
    /// Unwinds per second a CPU aims at: every 50 ms it scales the chances by what its waits
    /// of the last 50 ms asked for (up, to every wait drawn, where they asked little).
    pub cpu_target: u64,
    /// Unwinds per second and CPU at most, whatever the scale (bursts within 50 ms).
    pub cpu_rate: u64,
    /// Unwinds a CPU may do at once after an idle spell.
    pub cpu_burst: u64,
}

impl OffCpuSampling {
    /// The length of the epochs over which a CPU sets its scale (offcpu.h).
    pub const EPOCH: Duration = Duration::from_millis(50);
    /// The longest period: the BPF side's chance of a nanosecond, (1 << 32) / period, is at
    /// least 1.
    pub const MAX_PERIOD: Duration = Duration::from_nanos(u32::MAX as u64);

    /// Sampled as CPU time is at `frequency_hz`: a period of 1 / frequency_hz.
    pub fn at(frequency_hz: u64) -> Self {
        OffCpuSampling { period: Duration::from_nanos(1_000_000_000 / frequency_hz.max(1)), ..Self::default() }
    }

    /// The period as the BPF side uses it, also to tell short waits from long ones.
    pub fn period_ns(&self) -> u64 {
        self.period.min(Self::MAX_PERIOD).as_nanos().max(1) as u64
    }

    /// The chance (of 1 << 32) a nanosecond of expected wait asks for: the BPF side multiplies
    /// by it rather than divide by the period on every switch.
    pub(crate) fn chance_per_ns(&self) -> u64 {
        (1u64 << 32) / self.period_ns()
    }

    /// The unwinds a CPU aims at per epoch.
    pub(crate) fn epoch_unwinds(&self) -> u64 {
        (self.cpu_target.saturating_mul(Self::EPOCH.as_millis() as u64) / 1000).clamp(1, 1 << 15)
    }
}

impl Default for OffCpuSampling {
    fn default() -> Self {
        OffCpuSampling { period: Duration::from_nanos(1_000_000_000 / 99), cpu_target: 200, cpu_rate: 2000, cpu_burst: 64 }
    }
}
