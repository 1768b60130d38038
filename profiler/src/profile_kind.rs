//! The profiles gpuflame records, described once: the CLI word, Pyroscope's `__name__`, the pprof
//! types, what a window's value means, and what each needs from the BPF side. Help text, the
//! README's table, the agent's names and the session's set-up all read [`DESCRIPTORS`].

use std::fmt;
use std::str::FromStr;

use crate::frame::FrameKind;
use crate::profile::{sampling_period, Profile, ValueType};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProfileKind {
    Cpu,
    HbmAlloc,
    HbmInUse,
    TensorAlloc,
    TensorInUse,
    GpuLaunches,
    CudaApi,
    GpuTime,
    OffCpu,
    Wall,
    Collectives,
    CollectiveTime,
}

/// What a profile's value over a window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowValue {
    /// What happened during the window, summed (time, bytes allocated, launches).
    Sum,
    /// What holds at the window's end (bytes in use).
    Snapshot,
}

/// The CUDA hooks a profile needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaHooks {
    /// Allocations, frees and maps: always attached, every call counts.
    Memory,
    /// Launches and synchronisations too: attached part of each second unless `--cuda-exact`,
    /// their counts scaled.
    DutyCycled,
}

/// A profile's own hook (`bpf/src/bpf/stack_hooks.h`): the BPF program that sends its stacks,
/// and the tracepoint it is attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackHook {
    pub program: &'static str,
    pub category: &'static str,
    pub tracepoint: &'static str,
}

/// What a profile needs from the BPF side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// The perf-event sampler's CPU samples.
    pub cpu_samples: bool,
    /// The sched_switch program: target threads leaving and coming back to the CPU.
    pub switches: bool,
    pub cuda: Option<CudaHooks>,
    /// The CUPTI injection library's kernel records (processes started with it).
    pub cupti: bool,
    /// A hook of its own that sends stacks with what they weigh (the source `HookedStacks`).
    pub stack_hook: Option<StackHook>,
}

const NOTHING: Needs = Needs { cpu_samples: false, switches: false, cuda: None, cupti: false, stack_hook: None };

/// The source that makes a profile (`sources/`): some make two, from one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SourceKind {
    Cpu,
    OffCpu,
    /// hbm-alloc, hbm-inuse, tensor-alloc, tensor-inuse: made whenever CUDA is hooked, since an
    /// out-of-memory failure is reported with what held the memory whatever the profiles.
    DeviceMemory,
    /// gpu-launches and cuda-api: the duty-cycled hooks' calls.
    CudaCalls,
    GpuTime,
    Collectives,
    /// Profiles of stacks that their own hooks send (`Needs::stack_hook`), summed per stack.
    HookedStacks,
}

pub struct Descriptor {
    pub kind: ProfileKind,
    pub source: SourceKind,
    /// On the command line and in file names.
    pub name: &'static str,
    /// The `__name__` it is pushed to Pyroscope under.
    pub pyroscope: &'static str,
    /// One line for `--help` and the README.
    pub about: &'static str,
    /// The pprof sample types (type, unit), as Pyroscope names them; the first is what flame
    /// graphs show.
    pub sample_types: &'static [(&'static str, &'static str)],
    /// Sampled time: each sample is one period of the sampling frequency.
    pub sampled_time: bool,
    pub window: WindowValue,
    pub needs: Needs,
    /// The kinds of frame it adds under the program's own, for the flame graph's legend.
    pub adds_frames: &'static [FrameKind],
}

pub const DESCRIPTORS: &[Descriptor] = &[
    Descriptor {
        kind: ProfileKind::Cpu,
        source: SourceKind::Cpu,
        name: "cpu",
        pyroscope: "process_cpu",
        about: "CPU time, sampled",
        sample_types: &[("cpu", "nanoseconds")],
        sampled_time: true,
        window: WindowValue::Sum,
        needs: Needs { cpu_samples: true, ..NOTHING },
        adds_frames: &[],
    },
    Descriptor {
        kind: ProfileKind::HbmAlloc,
        source: SourceKind::DeviceMemory,
        name: "hbm-alloc",
        pyroscope: "hbm_alloc",
        about: "device memory allocated per stack during the window",
        sample_types: &[("alloc_space", "bytes"), ("alloc_objects", "count")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cuda: Some(CudaHooks::Memory), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::HbmInUse,
        source: SourceKind::DeviceMemory,
        name: "hbm-inuse",
        pyroscope: "hbm_inuse",
        about: "device memory live per stack at the end of the window",
        sample_types: &[("inuse_space", "bytes"), ("inuse_objects", "count")],
        sampled_time: false,
        window: WindowValue::Snapshot,
        needs: Needs { cuda: Some(CudaHooks::Memory), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::TensorAlloc,
        source: SourceKind::DeviceMemory,
        name: "tensor-alloc",
        pyroscope: "tensor_alloc",
        about: "PyTorch tensors' device memory allocated per stack during the window",
        sample_types: &[("alloc_space", "bytes"), ("alloc_objects", "count")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cuda: Some(CudaHooks::Memory), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::TensorInUse,
        source: SourceKind::DeviceMemory,
        name: "tensor-inuse",
        pyroscope: "tensor_inuse",
        about: "PyTorch tensors' device memory live per stack at the end of the window",
        sample_types: &[("inuse_space", "bytes"), ("inuse_objects", "count")],
        sampled_time: false,
        window: WindowValue::Snapshot,
        needs: Needs { cuda: Some(CudaHooks::Memory), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::GpuLaunches,
        source: SourceKind::CudaCalls,
        name: "gpu-launches",
        pyroscope: "gpu_launches",
        about: "kernel launches per stack",
        sample_types: &[("launches", "count")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cuda: Some(CudaHooks::DutyCycled), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi, FrameKind::GpuKernel],
    },
    Descriptor {
        kind: ProfileKind::CudaApi,
        source: SourceKind::CudaCalls,
        name: "cuda-api",
        pyroscope: "cuda_api",
        about: "wall time inside CUDA calls per stack",
        sample_types: &[("cuda_api", "nanoseconds")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cuda: Some(CudaHooks::DutyCycled), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::GpuTime,
        source: SourceKind::GpuTime,
        name: "gpu-time",
        pyroscope: "gpu_time",
        about: "kernel execution time on the device per launching stack (CUPTI)",
        sample_types: &[("gpu", "nanoseconds")],
        sampled_time: false,
        window: WindowValue::Sum,
        // Launch stacks come from the injection library's sampled callback; gpu-launches and
        // cuda-api, which stand in where CUPTI cannot be had, need the duty-cycled hooks.
        needs: Needs { cuda: Some(CudaHooks::DutyCycled), cupti: true, ..NOTHING },
        adds_frames: &[FrameKind::GpuKernel],
    },
    Descriptor {
        kind: ProfileKind::OffCpu,
        source: SourceKind::OffCpu,
        name: "off-cpu",
        // Pyroscope has no standard name for off-CPU time: its sample type's, as for the others.
        pyroscope: "off_cpu",
        about: "time threads spent switched out, by the stack where they left the CPU",
        sample_types: &[("off_cpu", "nanoseconds")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { switches: true, ..NOTHING },
        adds_frames: &[FrameKind::Marker],
    },
    Descriptor {
        kind: ProfileKind::Wall,
        source: SourceKind::OffCpu,
        name: "wall",
        // The Java, .NET, Python and Ruby agents push `wall` too.
        pyroscope: "wall",
        about: "CPU samples and off-CPU time together: where each thread's wall-clock time goes",
        sample_types: &[("wall", "nanoseconds")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cpu_samples: true, switches: true, ..NOTHING },
        adds_frames: &[FrameKind::Marker],
    },
    Descriptor {
        kind: ProfileKind::Collectives,
        source: SourceKind::Collectives,
        name: "collectives",
        pyroscope: "nccl_collectives",
        about: "NCCL collective and point-to-point calls per stack, and the bytes each moved",
        sample_types: &[("calls", "count"), ("bytes", "bytes")],
        sampled_time: false,
        window: WindowValue::Sum,
        // NCCL's functions are hooked with the memory ones: every call counts.
        needs: Needs { cuda: Some(CudaHooks::Memory), ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
    Descriptor {
        kind: ProfileKind::CollectiveTime,
        source: SourceKind::Collectives,
        name: "collective-time",
        pyroscope: "nccl_collective_time",
        about: "device time of NCCL's kernels per collective call stack (CUPTI): where a rank waits for the others",
        sample_types: &[("gpu", "nanoseconds")],
        sampled_time: false,
        window: WindowValue::Sum,
        needs: Needs { cuda: Some(CudaHooks::Memory), cupti: true, ..NOTHING },
        adds_frames: &[FrameKind::CudaApi],
    },
];

impl ProfileKind {
    pub const ALL: [ProfileKind; DESCRIPTORS.len()] = {
        let mut all = [ProfileKind::Cpu; DESCRIPTORS.len()];
        let mut i = 0;
        while i < DESCRIPTORS.len() {
            all[i] = DESCRIPTORS[i].kind;
            i += 1;
        }
        all
    };

    /// The profiles of device memory: segments and tensors, allocated and in use.
    pub const MEMORY: [ProfileKind; 4] = [ProfileKind::HbmAlloc, ProfileKind::HbmInUse, ProfileKind::TensorAlloc, ProfileKind::TensorInUse];

    pub fn descriptor(self) -> &'static Descriptor {
        // The table is in the enum's order (a test checks it).
        &DESCRIPTORS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.descriptor().name
    }

    /// The number a profile's own hook is attached with, which its stacks carry back.
    pub fn origin(self) -> u64 {
        self as u64
    }

    pub fn sample_types(self) -> Vec<ValueType> {
        self.descriptor().sample_types.iter().map(|(t, u)| ValueType::new(t, u)).collect()
    }

    /// An empty profile of this kind; `frequency_hz` sets the period of sampled time.
    pub fn empty_profile(self, frequency_hz: u64) -> Profile {
        if self.descriptor().sampled_time {
            Profile { period: sampling_period(frequency_hz), ..Profile::of(self.sample_types()) }
        } else {
            Profile::of(self.sample_types())
        }
    }

    /// The profile names `--help` lists, comma-separated.
    pub fn names() -> String {
        DESCRIPTORS.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
    }

    /// Parses a comma-separated list, such as `cpu,hbm-inuse`; `all` is every profile.
    pub fn parse_list(list: &str) -> Result<Vec<ProfileKind>, String> {
        let mut out = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(ProfileKind::ALL);
                continue;
            }
            out.push(part.parse()?);
        }
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err("no profile given".into());
        }
        Ok(out)
    }
}

/// What a set of profiles needs from the BPF side, together.
pub fn needs_of(kinds: &[ProfileKind]) -> Needs {
    let mut all = NOTHING;
    for k in kinds {
        let n = k.descriptor().needs;
        all.cpu_samples |= n.cpu_samples;
        all.switches |= n.switches;
        all.cupti |= n.cupti;
        all.cuda = match (all.cuda, n.cuda) {
            (Some(CudaHooks::DutyCycled), _) | (_, Some(CudaHooks::DutyCycled)) => Some(CudaHooks::DutyCycled),
            (a, b) => a.or(b),
        };
    }
    all
}

/// `--profiles`' help: the profiles' names, from their descriptors.
pub fn profiles_help(verb: &str) -> String {
    format!("Profiles to {verb}, comma-separated: {}, or all", ProfileKind::names())
}

/// `--profiles`' long help: a line per profile.
pub fn profiles_long_help(verb: &str) -> String {
    let mut help = profiles_help(verb);
    if verb == "record" {
        help.push_str(". With more than one, each goes to its own file, named by profile (out.cpu.svg, …)");
    }
    help.push(':');
    for d in DESCRIPTORS {
        help.push_str(&format!("\n  {:<13} {}", d.name, d.about));
    }
    help
}

/// `gpuflame --help`'s list of what it profiles, a line each, and the output formats.
pub fn overview_help() -> String {
    let mut help = String::from("Profiles (record --profiles, the agent's profiles):");
    for d in DESCRIPTORS {
        help.push_str(&format!("\n  {:<13} {}", d.name, d.about));
    }
    help.push_str(
        "\n\nOutputs: flame graphs (.svg), pprof (.pb.gz), folded stacks (.folded), a memory timeline (SVG)\n\
         and an in-use snapshot at each out-of-memory; the agent pushes to Pyroscope or writes pprof files.\n\n\
         Examples:",
    );
    for (command, what) in [
        ("gpuflame record -d 10 -o flame.svg", "the whole machine for 10 s"),
        ("gpuflame record -o flame.svg -- python3 train.py", "a command, its Python lines included"),
        ("gpuflame record --profiles cpu,gpu-time,hbm-inuse -o prof.svg -p 1234", ""),
        ("gpuflame agent --server http://pyroscope:4040", "every window to Pyroscope"),
    ] {
        help.push_str(&format!("\n  {command:<50} {what}").trim_end().to_string());
    }
    help
}

impl FromStr for ProfileKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProfileKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| format!("unknown profile {s:?} (known: {}, all)", ProfileKind::names()))
    }
}

impl fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        assert_eq!(ProfileKind::parse_list("hbm-inuse, cpu,cpu").unwrap(), vec![ProfileKind::Cpu, ProfileKind::HbmInUse]);
        assert_eq!(ProfileKind::parse_list("all").unwrap(), ProfileKind::ALL);
        assert_eq!(ProfileKind::parse_list("off-cpu,wall").unwrap(), vec![ProfileKind::OffCpu, ProfileKind::Wall]);
        assert!(ProfileKind::parse_list("gpu").unwrap_err().contains("unknown profile \"gpu\""));
        assert!(ProfileKind::parse_list(",").is_err());
    }

    #[test]
    fn the_table_is_in_the_enums_order_with_unique_names() {
        for (i, d) in DESCRIPTORS.iter().enumerate() {
            assert_eq!(d.kind as usize, i, "{}", d.name);
            assert!(!d.sample_types.is_empty());
            assert_eq!(DESCRIPTORS.iter().filter(|o| o.name == d.name || o.pyroscope == d.pyroscope).count(), 1, "{}", d.name);
        }
    }

    /// Pyroscope's profile type IDs, `__name__:sample type:unit:period type:unit`.
    fn type_ids(d: &Descriptor) -> String {
        let profile = d.kind.empty_profile(100);
        let period = &profile.period_type;
        let ids: Vec<String> = d.sample_types.iter().map(|(t, u)| format!("`{}:{t}:{u}:{}:{}`", d.pyroscope, period.kind, period.unit)).collect();
        ids.join(", ")
    }

    #[test]
    fn the_readme_names_every_profile_as_the_table_does() {
        let readme = include_str!("../../README.md");
        for d in DESCRIPTORS {
            let row = format!("| `{}` | {}", d.name, type_ids(d));
            assert!(readme.contains(&row), "README.md's table of profile type IDs lacks {row:?}");
            assert!(readme.contains(&format!("`{}`", d.name)), "{}", d.name);
        }
    }

    #[test]
    fn gpu_time_needs_the_cycled_hooks_in_record_and_agent_alike() {
        assert_eq!(needs_of(&[ProfileKind::GpuTime]).cuda, Some(CudaHooks::DutyCycled));
        assert_eq!(needs_of(&[ProfileKind::HbmInUse]).cuda, Some(CudaHooks::Memory));
        assert_eq!(needs_of(&[ProfileKind::Cpu]).cuda, None);
    }
}
