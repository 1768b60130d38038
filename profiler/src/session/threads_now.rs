//! The threads of the targets as they are now, each with its stack, for `gpuflame dump`: one
//! read-only pass of the task iterator; a thread that does not run has its stack read where it
//! lies (`read_thread_stack`); one that runs gets the stack of its next CPU sample. Nothing is
//! stopped: the threads that run go on running.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuflame_bpf::{Sample, ThreadReport, ThreadState};

use super::waiting::wait_state;
use super::Session;
use crate::profile::{Profile, ValueType};
use crate::workload::rank::ProcessLabels;

/// How often the sampler is read while the running threads' samples are awaited.
const POLL: Duration = Duration::from_millis(10);

/// The threads of the targets, and their stacks symbolized.
pub struct ThreadsNow {
    /// Every thread, as the iterator reported it.
    pub threads: Vec<ThreadReport>,
    /// One sample per thread whose stack was had, its value the thread's index in `threads`.
    pub stacks: Profile,
    /// The processes' labels (their ranks).
    pub labels: ProcessLabels,
}

impl Session {
    /// Every thread of the targets now, with its stack: read at once for those that do not run,
    /// from a CPU sample within `running_wait` for those that do.
    pub fn threads_now(&mut self, running_wait: Duration) -> anyhow::Result<ThreadsNow> {
        let threads = self.sampler.report_threads(false).map_err(super::user_facing)?;
        let mut stacks: Vec<(usize, Sample, bool)> = Vec::new();
        for (i, r) in threads.iter().enumerate().filter(|(_, r)| r.state != ThreadState::Running) {
            if let Some(sample) = self.read_thread_stack(r) {
                stacks.push((i, sample, true));
            }
        }
        let running: HashSet<u32> = threads.iter().filter(|r| r.state == ThreadState::Running).map(|r| r.tid).collect();
        if !running.is_empty() {
            self.tap = Some(HashMap::new());
            let deadline = Instant::now() + running_wait;
            while Instant::now() < deadline && !running.iter().all(|t| self.tap.as_ref().is_some_and(|tap| tap.contains_key(t))) {
                self.pump(POLL)?;
            }
            let mut tap = self.tap.take().unwrap_or_default();
            for (i, r) in threads.iter().enumerate().filter(|(_, r)| r.state == ThreadState::Running) {
                if let Some(sample) = tap.remove(&r.tid) {
                    stacks.push((i, sample, false));
                }
            }
        }
        let mut values = Vec::with_capacity(stacks.len());
        for (i, sample, waits) in stacks {
            let wait = waits.then(|| wait_state(threads[i].state));
            let view = self.processes.record(&sample);
            let key = self.collector.stack_key(&sample, view, wait);
            values.push((key, None, vec![i as i64 + 1]));
        }
        let labels = self.processes.labels().clone();
        let stacks = self.collector.symbolize(Profile::of(vec![ValueType::new("thread", "index")]), values, &labels);
        Ok(ThreadsNow { threads, stacks, labels })
    }
}
