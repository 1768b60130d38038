//! Process tracking: which executables each target process maps, and their unwind tables in BPF.

mod builder;
mod maps;
mod procfs;
mod tracker;

pub use maps::{parse_maps, read_for_symbolizer, read_maps, MapsEntry};
pub use tracker::{ProcessTracker, TrackerStats};

/// How long after its exit a process's records can still come (they wait in rings of their own,
/// read late on a loaded machine): the one rule for how long what gpuflame keeps of an exited
/// process stays. What names its records (the tracker's record of it) stays this long; what a
/// window is built with (its labels and names, the stacks' caches) until the first window close
/// at least this long after the exit (`session/processes.rs`).
pub const EXITED_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The most kernel memory for unwind tables, in MiB (1 TiB). Here rather than with either flag
/// that takes it (`record --unwind-memory`, the agent's `unwind_memory`) so that the two share
/// one bound without the command line and the agent's configuration importing each other.
pub const MAX_UNWIND_MIB: u64 = 1 << 20;
