//! Windows: the session runs until a window's length has passed (or its caller says stop),
//! then every source closes its profiles (see `Session::window`). What a caller does with them
//! (files, series pushed to Pyroscope) is its own business.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime};

use gpuflame_bpf::{Sample, UnwindStatus};

use crate::cuda::Coverage;
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use crate::sources::OomReport;

/// Whether the window goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Close the window now: the recording or the agent is ending.
    Stop,
}

/// The samples of a window, for reports.
#[derive(Debug, Clone, Default)]
pub struct WindowStats {
    pub samples: u64,
    /// Of those, the samples of programs: neither gpuflame's own (building tables, symbolizing)
    /// nor the kernel's threads (housekeeping, which a slow guest on a loaded host magnifies).
    pub program_samples: u64,
    /// Samples with a user stack, and those of them that reached the outermost frame.
    pub user_stacks: u64,
    pub complete_user_stacks: u64,
    pids: HashSet<u32>,
}

impl WindowStats {
    pub(super) fn sample(&mut self, sample: &Sample) {
        self.samples += 1;
        self.program_samples += u64::from(sample.pid != own_pid() && sample.unwind != UnwindStatus::KernelThread);
        if sample.unwind.has_user_stack() {
            self.user_stacks += 1;
            self.complete_user_stacks += u64::from(sample.unwind.is_complete());
        }
        self.pids.insert(sample.pid);
    }

    /// Processes sampled.
    pub fn processes(&self) -> usize {
        self.pids.len()
    }

    /// Fraction of user stacks that reached their outermost frame (thread entry).
    pub fn complete_fraction(&self) -> Option<f64> {
        (self.user_stacks > 0).then(|| self.complete_user_stacks as f64 / self.user_stacks as f64)
    }
}

/// gpuflame's pid, read once: a sample's is compared with it.
fn own_pid() -> u32 {
    static OWN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OWN.get_or_init(std::process::id)
}

pub(super) struct OpenWindow {
    pub(super) start: Instant,
    pub(super) wall: SystemTime,
}

impl OpenWindow {
    pub(super) fn now() -> Self {
        OpenWindow { start: Instant::now(), wall: SystemTime::now() }
    }
}

/// A closed window's profiles, symbolized, in the order of [`ProfileKind`].
pub struct Window {
    pub start: SystemTime,
    pub duration: Duration,
    pub profiles: Vec<(ProfileKind, Profile)>,
    pub stats: WindowStats,
    /// How much of it the duty-cycled CUDA hooks were attached, when CUDA was hooked.
    pub coverage: Option<Coverage>,
    /// The caller said stop.
    pub stopped: bool,
}

/// An out-of-memory failure, with the snapshot of what its process held.
pub struct Oom {
    pub report: OomReport,
    pub snapshot: Profile,
    /// The failing stack on one line: `main → load → cudaMalloc`.
    pub stack: String,
    /// The biggest holders: bytes, the Python line first, the whole stack.
    pub holders: Vec<(u64, String, String)>,
}
