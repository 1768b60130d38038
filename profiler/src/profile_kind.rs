//! The profiles gpuflame records, by the names the CLI and Pyroscope use.

use std::fmt;
use std::str::FromStr;

use crate::profile::ValueType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProfileKind {
    /// CPU time, sampled.
    Cpu,
    /// Device memory allocated per stack during the window.
    HbmAlloc,
    /// Device memory live per stack at the end of the window.
    HbmInUse,
    /// Kernel launches per stack.
    GpuLaunches,
    /// Wall time inside CUDA calls per stack.
    CudaApi,
    /// Kernel execution time on the device per launching stack (CUPTI).
    GpuTime,
    /// Time target threads spent switched out, by the stack where they left the CPU.
    OffCpu,
    /// CPU samples and off-CPU time together: where each thread's wall-clock time goes.
    Wall,
}

impl ProfileKind {
    pub const ALL: [ProfileKind; 8] = [
        ProfileKind::Cpu,
        ProfileKind::HbmAlloc,
        ProfileKind::HbmInUse,
        ProfileKind::GpuLaunches,
        ProfileKind::CudaApi,
        ProfileKind::GpuTime,
        ProfileKind::OffCpu,
        ProfileKind::Wall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::HbmAlloc => "hbm-alloc",
            ProfileKind::HbmInUse => "hbm-inuse",
            ProfileKind::GpuLaunches => "gpu-launches",
            ProfileKind::CudaApi => "cuda-api",
            ProfileKind::GpuTime => "gpu-time",
            ProfileKind::OffCpu => "off-cpu",
            ProfileKind::Wall => "wall",
        }
    }

    /// The pprof sample types, as Pyroscope names them; the first is what flame graphs show.
    pub fn sample_types(self) -> Vec<ValueType> {
        match self {
            ProfileKind::Cpu => vec![ValueType::cpu_nanoseconds()],
            ProfileKind::HbmAlloc => vec![ValueType::new("alloc_space", "bytes"), ValueType::new("alloc_objects", "count")],
            ProfileKind::HbmInUse => vec![ValueType::new("inuse_space", "bytes"), ValueType::new("inuse_objects", "count")],
            ProfileKind::GpuLaunches => vec![ValueType::new("launches", "count")],
            ProfileKind::CudaApi => vec![ValueType::new("cuda_api", "nanoseconds")],
            ProfileKind::GpuTime => vec![ValueType::new("gpu", "nanoseconds")],
            ProfileKind::OffCpu => vec![ValueType::new("off_cpu", "nanoseconds")],
            ProfileKind::Wall => vec![ValueType::new("wall", "nanoseconds")],
        }
    }

    pub fn is_cuda(self) -> bool {
        !matches!(self, ProfileKind::Cpu | ProfileKind::OffCpu | ProfileKind::Wall)
    }

    /// Whether it needs the scheduler's switches of target threads.
    pub fn is_off_cpu(self) -> bool {
        matches!(self, ProfileKind::OffCpu | ProfileKind::Wall)
    }

    /// Whether it needs CPU samples.
    pub fn needs_cpu_samples(self) -> bool {
        matches!(self, ProfileKind::Cpu | ProfileKind::Wall)
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

impl FromStr for ProfileKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProfileKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ProfileKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown profile {s:?} (known: {}, all)", names.join(", "))
        })
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
        assert_eq!(ProfileKind::parse_list("all").unwrap().len(), 8);
        assert_eq!(ProfileKind::parse_list("off-cpu,wall").unwrap(), vec![ProfileKind::OffCpu, ProfileKind::Wall]);
        assert!(ProfileKind::parse_list("gpu").unwrap_err().contains("unknown profile \"gpu\""));
        assert!(ProfileKind::parse_list(",").is_err());
    }
}
