//! Process tracking: which executables each target process maps, and their unwind tables in BPF.

mod builder;
mod maps;
mod procfs;
mod tracker;

pub use maps::{parse_maps, read_for_symbolizer, read_maps, MapsEntry};
pub use tracker::{ProcessTracker, TrackerStats, EXITED_GRACE};

/// The most kernel memory for unwind tables, in MiB (1 TiB). Here rather than with either flag
/// that takes it (`record --unwind-memory`, the agent's `unwind_memory`) so that the two share
/// one bound without the command line and the agent's configuration importing each other.
pub const MAX_UNWIND_MIB: u64 = 1 << 20;
