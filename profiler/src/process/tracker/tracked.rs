//! What the tracker knows of one process, in one record: the tracker's one map keyed by pid holds
//! these. A record is made by the process's first event (a read of its maps, its fork, its exec
//! or a preload) and lives `Live → Exited { at } → Forgotten`: an exited process keeps the files
//! and the interpreter its last samples are named by for [`EXITED_GRACE`] (the one rule for exited
//! processes), then its record goes.
//! Its pid used again in the meantime makes the record live again.

use std::time::{Duration, Instant};

use gpuflame_pyframes::Interpreter;
use gpuflame_symbolizer::MappedFile;
use gpuflame_unwind::ExecutableKey;

use crate::process::maps::MapsEntry;

/// How long after its exit a process's records can still come (they wait in rings of their own,
/// read late on a loaded machine): the one rule for how long what gpuflame keeps of an exited
/// process stays. What names its records (this record) stays this long; what a window is built
/// with (its labels and names, the stacks' caches) until the first window close at least this
/// long after the exit (`session/processes.rs`).
pub const EXITED_GRACE: Duration = Duration::from_secs(5);

/// One process, as the tracker knows it.
#[derive(Default)]
pub(super) struct Tracked {
    /// Its executable mappings as last read, while it lives: none before its first read, after an
    /// exec not read yet, and once it exited.
    pub mapped: Option<Mapped>,
    /// Its file mappings as last read, for symbolization, also a while after it exited.
    pub files: Option<Vec<MappedFile>>,
    /// Files whose tables were built before it ran (`preload`), kept while it lives.
    pub pinned: Option<Vec<ExecutableKey>>,
    /// The parent whose BPF entry it was copied from at fork, until its own maps are read.
    pub forked_from: Option<u32>,
    /// The file mappings it got from its parent at fork, which samples unwound with the parent's
    /// mappings are named from; kept, like `files`, a while after it exits.
    pub fork_files: Option<Vec<MappedFile>>,
    /// Its CPython interpreter, also a while after it exited.
    pub python: Option<Interpreter>,
    /// Its Python could not be profiled, and the user was told.
    pub python_warned: bool,
    /// Caught while ld.so mapped its libpython: when it is looked for again, and the tries so far.
    pub python_retry: Option<(Instant, u32)>,
    /// Its mappings were read since its tables were last all in (`ready.rs`).
    pub unready: bool,
    /// A program exec'd and not read yet (lazy reads), since when.
    pub deferred: Option<Instant>,
    /// When its exit was seen; None while it lives.
    pub exited_at: Option<Instant>,
}

/// A live process's executable mappings as last read.
#[derive(Clone)]
pub(super) struct Mapped {
    /// The files with tables that it maps, each once.
    pub keys: Vec<ExecutableKey>,
    pub entries: Vec<MapsEntry>,
    /// The file of each of `entries`, where it has one.
    pub entry_keys: Vec<Option<ExecutableKey>>,
}

impl Tracked {
    /// Whether the record is of a process that exited at `at` and no other has taken its pid since.
    pub fn forgettable(&self, at: Instant) -> bool {
        self.exited_at == Some(at)
    }
}
