//! Process tracking: which executables each target process maps, and their unwind tables in BPF.

mod builder;
mod maps;
mod procfs;
mod tracker;

pub use maps::{parse_maps, MapsEntry};
pub use tracker::{ProcessTracker, TrackerStats};
