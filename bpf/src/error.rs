use std::io;

/// Why the BPF side could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("not permitted to load BPF programs: run as root or grant CAP_BPF and CAP_PERFMON")]
    PermissionDenied,
    #[error("the kernel has no BTF at {0} (gpuflame needs a kernel ≥ 5.8 built with CONFIG_DEBUG_INFO_BTF=y)")]
    NoBtf(String),
    #[error("loading the BPF programs failed: {0}")]
    Load(#[source] libbpf_rs::Error),
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
        if is_permission(&e) {
            BpfError::PermissionDenied
        } else {
            BpfError::Load(e)
        }
    }
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
