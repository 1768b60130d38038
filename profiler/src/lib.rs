//! gpuflame: the profiler. BPF events → aggregation → symbolization → profile → writers.

pub mod agent;
pub mod aggregate;
pub mod cli;
pub mod convert;
pub mod cuda;
pub mod names;
pub mod output;
pub mod preflight;
pub mod process;
pub mod profile;
pub mod profile_kind;
pub mod record;
pub mod session;
pub mod status;
pub mod target;

/// A failure the user caused or can fix (bad flag, missing privilege, unknown PID): reported as
/// one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UserError(pub String);
