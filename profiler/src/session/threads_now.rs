//! The threads of the targets as they are now, each with its stack, for `gpuflame dump`: one
//! read-only pass of the task iterator; a thread that does not run has its stack read where it
//! lies (`read_thread_stack`); one that runs gets the stack of its next CPU sample. Nothing is
//! stopped: the threads that run go on running.

use gpuflame_bpf::{BpfPrograms, OffCpuState, Sample, ThreadReport, ThreadState};

use super::waiting::{wait_state, Read, StackReader};
use crate::profile::{Profile, ValueType};
use crate::workload::rank::ProcessLabels;

/// The threads of the targets, and their stacks symbolized.
pub struct ThreadsNow {
    /// Every thread, as the iterator reported it.
    pub threads: Vec<ThreadReport>,
    /// One sample per thread whose stack was had, its value the thread's index in `threads`.
    pub stacks: Profile,
    /// The processes' labels (their ranks).
    pub labels: ProcessLabels,
}

/// A thread's stack, by its index in the report.
pub(super) type ThreadStack = (usize, Sample);
/// A thread whose walk needs the table of the file at an address.
pub(super) type TableNeeded = (usize, u64);

/// The stacks of the threads that do not run, read where they lie: (thread index, stack), and
/// the threads whose walk needs a table not loaded yet, with its address. `only`: these threads
/// alone (None: every thread that does not run).
pub(super) fn read_stacks(sampler: &BpfPrograms, threads: &[ThreadReport], only: Option<&[usize]>) -> (Vec<ThreadStack>, Vec<TableNeeded>) {
    let mut order: Vec<usize> = match only {
        Some(only) => only.to_vec(),
        None => (0..threads.len()).filter(|&i| threads[i].state != ThreadState::Running).collect(),
    };
    // A process's threads one after another: the reader keeps what it read of the process.
    order.sort_by_key(|&i| (threads[i].pid, threads[i].tid));
    let mut reader = StackReader::new(sampler);
    let (mut stacks, mut needs) = (Vec::new(), Vec::new());
    for i in order {
        match reader.read(&threads[i]) {
            Read::Stack(sample) => stacks.push((i, sample)),
            Read::NeedsTable(ip) => needs.push((i, ip)),
            Read::NotYet | Read::Nothing => {}
        }
    }
    (stacks, needs)
}

/// The leaf of a thread's stack in a dump: its wait's, when it does not run.
pub(super) fn leaf_of(t: &ThreadReport) -> Option<OffCpuState> {
    (t.state != ThreadState::Running).then(|| wait_state(t.state))
}

/// A profile whose samples' values are thread indices (`ThreadsNow::stacks`).
pub(super) fn thread_profile() -> Profile {
    Profile::of(vec![ValueType::new("thread", "index")])
}
