use std::io;

/// Why the BPF side could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("not permitted to load BPF programs: run as root or grant CAP_BPF and CAP_PERFMON")]
    PermissionDenied,
    #[error("the kernel has no BTF at {0} (gpuflame needs a kernel ≥ 5.8 built with CONFIG_DEBUG_INFO_BTF=y)")]
    NoBtf(String),
    #[error("this kernel ({kernel}) lacks {feature}, which gpuflame's sampler and unwinder need: gpuflame runs on Linux {} or later", feature.since)]
    KernelLacks { kernel: String, feature: crate::features::Feature },
    /// A group of programs this kernel did not take ([`crate::BpfPrograms::unavailable`]).
    #[error("{0}")]
    Unavailable(String),
    #[error("loading the BPF programs failed: {0}")]
    Load(#[source] libbpf_rs::Error),
    #[error(
        "the kernel's verifier refused gpuflame's BPF programs; this process may load BPF, so privileges are not why (the verifier's log is above: please report it with `uname -r`)"
    )]
    Refused(#[source] libbpf_rs::Error),
    #[error("attaching {what} failed: {source}")]
    Attach { what: String, source: libbpf_rs::Error },
    #[error("perf_event_open on CPU {cpu} failed: {source}")]
    PerfEventOpen { cpu: u32, source: io::Error },
    #[error("reading the online CPUs: {0}")]
    OnlineCpus(#[source] io::Error),
    #[error("BPF map {map}: {source}")]
    Map { map: &'static str, source: libbpf_rs::Error },
    #[error("the unwind tables are full: {0}")]
    UnwindFull(String),
    #[error("the BPF ring buffer: {0}")]
    RingBuffer(#[source] libbpf_rs::Error),
}

impl BpfError {
    /// Maps a libbpf error to PermissionDenied when that is what it is, so that the user is told
    /// what to do instead of seeing EPERM.
    pub(crate) fn load(e: libbpf_rs::Error) -> Self {
        Self::load_with(e, may_load_bpf())
    }

    /// The verifier refusing a program is EACCES too: telling a root user to run as root would
    /// send them the wrong way.
    fn load_with(e: libbpf_rs::Error, privileged: bool) -> Self {
        match (is_permission(&e), privileged) {
            (true, false) => BpfError::PermissionDenied,
            (true, true) => BpfError::Refused(e),
            (false, _) => BpfError::Load(e),
        }
    }
}

/// Whether this process holds CAP_SYS_ADMIN or CAP_BPF (with which root, or a granted binary,
/// loads programs), from its effective capabilities.
fn may_load_bpf() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_BPF: u32 = 39;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN | 1 << CAP_BPF) != 0)
}

/// Attaching failed: PermissionDenied when that is why, as [`BpfError::load`] does for loading.
pub(crate) fn attach_error(what: &str, source: libbpf_rs::Error) -> BpfError {
    if is_permission(&source) {
        BpfError::PermissionDenied
    } else {
        BpfError::Attach { what: what.to_string(), source }
    }
}

pub(crate) fn is_permission(e: &libbpf_rs::Error) -> bool {
    matches!(e.kind(), libbpf_rs::ErrorKind::PermissionDenied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_not_told_as_missing_privileges_to_who_has_them() {
        let eacces = || libbpf_rs::Error::from_raw_os_error(libc::EACCES);
        assert!(matches!(BpfError::load_with(eacces(), false), BpfError::PermissionDenied));
        let refused = BpfError::load_with(eacces(), true);
        assert!(matches!(refused, BpfError::Refused(_)), "{refused}");
        assert!(refused.to_string().contains("verifier refused"), "{refused}");
        let einval = libbpf_rs::Error::from_raw_os_error(libc::EINVAL);
        assert!(matches!(BpfError::load_with(einval, true), BpfError::Load(_)));
    }
}
