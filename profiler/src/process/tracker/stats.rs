//! Counters of the tracker's work, apart from the work itself: the end-of-recording summary and
//! the benchmarks read them, and neither needs to know how tables are built.

use std::collections::BTreeSet;
use std::time::Duration;

/// What the tracker did, for the summary and the benchmarks.
#[derive(Debug, Clone, Default)]
pub struct TrackerStats {
    pub tables_built: usize,
    pub rows_loaded: u64,
    pub build_time: Duration,
    /// Tables dropped because no process maps their file any more.
    pub tables_evicted: usize,
    /// Tables dropped to make room within the memory budget.
    pub tables_evicted_for_room: usize,
    /// Tables built and loaded in pieces (the big files'), their rows never all in memory.
    pub tables_in_pieces: usize,
    pub table_failures: usize,
    pub mappings_dropped: usize,
    /// Reads of a process's maps.
    pub maps_read: u64,
    /// New programs that exited before their maps were read (lazy reads: `lazy.rs`).
    pub reads_saved: u64,
    /// Files without unwind information.
    pub files_without_cfi: usize,
    /// Functions without CFI in files with some, unwound with rows made from their prologues.
    pub functions_from_prologues: usize,
    /// Files whose tables did not fit in the budget, by name.
    pub no_room: BTreeSet<String>,
    /// When the first table a sample asked for was loaded, after the tracker started.
    pub first_demanded_table: Option<Duration>,
    /// Rows of BPF's budget that no known file's table holds: a leak, always 0 unless a bug
    /// (a table loaded twice leaked the first copy). Filled in on request
    /// ([`super::ProcessTracker::rows_unaccounted`]).
    pub rows_unaccounted: u64,
}
