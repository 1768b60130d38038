//! Opening and loading the BPF object with the programs this kernel can take. The object holds
//! every program; which are loaded depends on the profiles asked for ([`OptionalPrograms`]) and
//! on the kernel ([`KernelFeatures`]): a group the kernel lacks a feature for, or whose programs
//! its verifier refuses, is left out and said so, and the others run.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

use crate::config::{OptionalPrograms, RingUse, SamplerConfig, Targets};
use crate::error::BpfError;
use crate::features::{CallHooks, KernelFeatures};
use crate::perf;
use crate::skel::{types, CpuSamplerSkel, CpuSamplerSkelBuilder, OpenCpuSamplerSkel};

/// A group of optional programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramGroup {
    /// The switch programs of off-CPU and wall time.
    OffCpu,
    /// The CUDA hooks and PyTorch's allocator probes.
    Cuda,
    /// The task iterators alone.
    Threads,
}

impl ProgramGroup {
    fn only(self) -> OptionalPrograms {
        match self {
            ProgramGroup::OffCpu => OptionalPrograms { off_cpu: true, ..Default::default() },
            ProgramGroup::Cuda => OptionalPrograms { cuda: true, ..Default::default() },
            ProgramGroup::Threads => OptionalPrograms { threads: true, ..Default::default() },
        }
    }

    fn wanted_in(self, programs: OptionalPrograms) -> bool {
        match self {
            ProgramGroup::OffCpu => programs.off_cpu,
            ProgramGroup::Cuda => programs.cuda,
            ProgramGroup::Threads => programs.threads,
        }
    }

    fn without(self, programs: OptionalPrograms) -> OptionalPrograms {
        match self {
            ProgramGroup::OffCpu => OptionalPrograms { off_cpu: false, ..programs },
            ProgramGroup::Cuda => OptionalPrograms { cuda: false, ..programs },
            ProgramGroup::Threads => OptionalPrograms { threads: false, ..programs },
        }
    }
}

/// A group the kernel could not take, and why, in words for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub group: ProgramGroup,
    pub why: String,
}

pub(crate) struct Loaded {
    pub skel: CpuSamplerSkel<'static>,
    pub unavailable: Vec<Unavailable>,
}

/// Which programs of the object a load takes: those not named here are the sampler's and the
/// process events', always loaded.
pub(crate) fn wanted(program: &str, groups: OptionalPrograms, hooks: CallHooks) -> bool {
    let sessions = hooks == CallHooks::Sessions;
    match program {
        "on_sched_switch" | "on_thread_exit" => groups.off_cpu,
        "report_threads" | "report_threads_following" => groups.off_cpu || groups.threads,
        "on_cuda_call" | "on_calibrate" => groups.cuda && sessions,
        "on_cuda_entry" | "on_cuda_return" | "on_calibrate_entry" | "on_calibrate_return" => groups.cuda && !sessions,
        "on_torch_malloc" | "on_torch_free" => groups.cuda,
        _ => true,
    }
}

/// The programs every load takes; a test checks that the object has no other program that this
/// module does not know of.
#[cfg(test)]
const ALWAYS: &[&str] = &["on_cpu_sample", "on_process_fork", "on_process_exec", "on_process_exit", "on_mmap"];

/// The groups of `asked` this kernel has the features for, and those it lacks one for.
pub(crate) fn plan(asked: OptionalPrograms, features: &KernelFeatures) -> (OptionalPrograms, Vec<Unavailable>) {
    let mut programs = asked;
    let mut unavailable = Vec::new();
    for (group, missing) in [
        (ProgramGroup::OffCpu, features.missing_for_off_cpu()),
        (ProgramGroup::Cuda, features.missing_for_cuda()),
        (ProgramGroup::Threads, features.missing_for_off_cpu()),
    ] {
        if let (true, Some(feature)) = (group.wanted_in(programs), missing) {
            unavailable.push(Unavailable { group, why: format!("this kernel ({}) lacks {feature}", features.release) });
            programs = group.without(programs);
        }
    }
    (programs, unavailable)
}

/// Loads the sampler's programs and those of `config.programs` that this kernel takes.
pub(crate) fn load(config: &SamplerConfig, features: &KernelFeatures) -> Result<Loaded, BpfError> {
    if let Some(missing) = features.missing_for_sampler() {
        return Err(BpfError::KernelLacks { kernel: features.release.clone(), feature: missing });
    }
    let (mut programs, mut unavailable) = plan(config.programs, features);
    let hooks = features.call_hooks();
    let first = match open_and_load(config, programs, hooks) {
        Ok(skel) => return Ok(Loaded { skel, unavailable }),
        Err(e) => e,
    };
    if programs == OptionalPrograms::default() {
        return Err(first);
    }
    // Something was refused. The sampler alone first: if it is refused, that is the error. Then
    // each group beside it, to say which the kernel would not take.
    tracing::warn!(error = %first, "loading every program asked for failed; trying the sampler and each group of programs alone");
    drop(open_and_load(config, OptionalPrograms::default(), hooks)?);
    for group in [ProgramGroup::OffCpu, ProgramGroup::Cuda, ProgramGroup::Threads] {
        if !group.wanted_in(programs) {
            continue;
        }
        if let Err(e) = open_and_load(config, group.only(), hooks) {
            tracing::debug!(error = %e, ?group, "refused alone");
            let why = format!("this kernel's ({}) verifier refused its BPF programs (its log is above: please report it with `uname -r`)", features.release);
            unavailable.push(Unavailable { group, why });
            programs = group.without(programs);
        }
    }
    let skel = open_and_load(config, programs, hooks)?;
    Ok(Loaded { skel, unavailable })
}

fn open_and_load(config: &SamplerConfig, programs: OptionalPrograms, hooks: CallHooks) -> Result<CpuSamplerSkel<'static>, BpfError> {
    // The skeleton borrows its object storage for its whole life; one small allocation per
    // load is leaked so that the sampler can own the skeleton.
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = CpuSamplerSkelBuilder::default().open(storage).map_err(BpfError::load)?;
    configure(&mut open, config)?;
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        prog.set_autoload(wanted(&name, programs, hooks));
    }
    open.load().map_err(BpfError::load)
}

/// The read-only settings and map sizes the programs are loaded with.
fn configure(open: &mut OpenCpuSamplerSkel<'static>, config: &SamplerConfig) -> Result<(), BpfError> {
    let (mode, follow) = match &config.targets {
        Targets::All => (types::target_mode::TARGET_ALL, false),
        Targets::Processes { follow_forks, .. } => (types::target_mode::TARGET_PIDS, *follow_forks),
    };
    let rodata = open.maps.rodata_data.as_deref_mut().ok_or_else(|| {
        BpfError::Load(libbpf_rs::Error::from(std::io::Error::other("the skeleton has no .rodata")))
    })?;
    rodata.target_mode = mode;
    rodata.follow_forks = u8::from(follow);
    let sampling = config.off_cpu;
    rodata.offcpu_cpu_burst = sampling.cpu_burst.max(1);
    rodata.offcpu_period_ns = sampling.period_ns();
    rodata.offcpu_chance_per_ns = sampling.chance_per_ns();
    rodata.offcpu_epoch_ns = crate::config::OffCpuSampling::EPOCH.as_nanos() as u64;
    rodata.offcpu_epoch_unwinds = sampling.epoch_unwinds();
    rodata.offcpu_cpu_refill_ns = 1_000_000_000 / sampling.cpu_rate.max(1);
    let ring = match config.ring {
        RingUse::CpuSamplesOnly => SamplerConfig::samples_ring_bytes(config.frequency_hz, perf::online_cpus().map_or(1, |c| c.len() as u64)),
        RingUse::Any => SamplerConfig::MAX_RING_BYTES,
    };
    rodata.samples_wakeup_bytes = u64::from(ring / 4);
    rodata.process_events_lazy = u8::from(config.lazy_process_events);
    rodata.tensor_sample_bytes = config.tensor_sample_bytes;
    rodata.memory_timeline = u8::from(config.memory_timeline);
    rodata.tensor_allocation_records = u8::from(config.tensor_allocation_records);
    rodata.copy_every_stack = u8::from(config.copy_every_stack);
    open.maps.samples.set_max_entries(ring).map_err(BpfError::load)?;
    // One entry where no memory profile is asked for; else the bound, and room for the kept.
    let kept = if config.max_live_allocations > 1 { SamplerConfig::FREED_KEPT } else { 0 };
    rodata.live_freed_kept_max = kept;
    open.maps.live_allocations.set_max_entries(config.max_live_allocations.max(1).saturating_add(kept)).map_err(BpfError::load)?;
    let cpus = libbpf_rs::num_possible_cpus().map_err(BpfError::load)?;
    open.maps.stack_copies.set_max_entries(u32::try_from(cpus).unwrap_or(u32::MAX)).map_err(BpfError::load)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_of_the_object_is_known_to_the_loader() {
        let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let open = CpuSamplerSkelBuilder::default().open(storage).expect("the object opens without a kernel");
        let ways = [CallHooks::Sessions, CallHooks::EntryAndReturn];
        for prog in open.open_object().progs() {
            let name = prog.name().to_string_lossy().into_owned();
            let optional = ways.iter().any(|&h| wanted(&name, OptionalPrograms::ALL, h)) && ways.iter().all(|&h| !wanted(&name, OptionalPrograms::default(), h));
            assert!(ALWAYS.contains(&name.as_str()) || optional, "{name}: a program the loader does not place in a group (programs/load.rs)");
        }
    }

    #[test]
    fn a_group_whose_feature_is_missing_is_left_out_and_said_so() {
        let mut k = KernelFeatures::probe();
        k.release = "5.10.0-32-cloud-amd64".into();
        k.task_storage = false;
        let (programs, unavailable) = plan(OptionalPrograms::ALL, &k);
        assert_eq!(programs, OptionalPrograms::default());
        assert_eq!(unavailable.len(), 3);
        assert_eq!(unavailable[0].group, ProgramGroup::OffCpu);
        assert_eq!(unavailable[0].why, "this kernel (5.10.0-32-cloud-amd64) lacks task storage in tracing programs (Linux 5.11)");
        k.task_storage = true;
        k.attach_cookie = false;
        let (programs, unavailable) = plan(OptionalPrograms::ALL, &k);
        assert_eq!(programs, OptionalPrograms { off_cpu: true, threads: true, ..Default::default() });
        assert_eq!(unavailable, vec![Unavailable { group: ProgramGroup::Cuda, why: "this kernel (5.10.0-32-cloud-amd64) lacks BPF attach cookies (Linux 5.15)".into() }]);
        // What was not asked for is not said.
        let (_, unavailable) = plan(OptionalPrograms { off_cpu: true, ..Default::default() }, &k);
        assert!(unavailable.is_empty());
    }

    #[test]
    fn each_kernel_loads_one_way_of_hooking_calls() {
        let cuda = OptionalPrograms { cuda: true, ..Default::default() };
        assert!(wanted("on_cuda_call", cuda, CallHooks::Sessions) && !wanted("on_cuda_entry", cuda, CallHooks::Sessions));
        assert!(!wanted("on_cuda_call", cuda, CallHooks::EntryAndReturn) && wanted("on_cuda_return", cuda, CallHooks::EntryAndReturn));
        assert!(!wanted("on_sched_switch", cuda, CallHooks::Sessions));
        assert!(wanted("on_cpu_sample", OptionalPrograms::default(), CallHooks::EntryAndReturn));
    }
}
