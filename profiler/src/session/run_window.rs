//! Running a window and closing it: the session's side of `window.rs` (its methods are the
//! session's, apart from its start and its handling of records).

use std::time::Duration;

use gpuflame_bpf::LiveAllocation;

use super::window::{Flow, Oom, OpenWindow, Window};
use super::{Session, TICK};
use crate::sources::Input;

/// How long the last window waits for the tables its held samples need.
const LAST_TABLES_WAIT: Duration = Duration::from_secs(5);

impl Session {
    /// Runs the window until `length` has passed since it opened (never, for None) or `between`,
    /// called every 100 ms, says stop; then closes it. A new window opens.
    pub fn window(&mut self, length: Option<Duration>, mut between: impl FnMut(&mut Session) -> anyhow::Result<Flow>) -> anyhow::Result<Window> {
        let stopped = loop {
            self.pump(TICK)?;
            if between(self)? == Flow::Stop {
                break true;
            }
            if length.is_some_and(|l| self.window.start.elapsed() >= l) {
                break false;
            }
        };
        // The backlog first, so that the live set is read as close to the window's end as can be;
        // then the records sent before the read, whose stacks its ids name.
        self.drain()?;
        let live = self.live.read(&mut self.sampler, self.collector.wants_memory());
        self.drain()?;
        Ok(self.close_window(stopped, live))
    }

    fn close_window(&mut self, stopped: bool, live: Option<Vec<LiveAllocation>>) -> Window {
        // The last window: the held samples wait for their tables a while, then go on.
        if stopped && !self.late.is_empty() {
            self.processes.tracker_mut().wait_for_tables(&mut self.sampler, LAST_TABLES_WAIT);
            self.release_late(true);
        } else {
            self.release_late(false);
        }
        // Waits going on are counted up to here.
        if self.off_cpu() {
            self.report_waiting_threads();
        }
        let open = std::mem::replace(&mut self.window, OpenWindow::now());
        let duration = open.start.elapsed();
        let coverage = self.processes.cuda_mut().map(|c| c.hooks.take_coverage());
        if let Some(live) = &live {
            self.collector.offer(&Input::LiveAtWindowEnd(live));
        }
        let (profiles, stats) = self.collector.close(coverage, open.wall, duration, self.processes.labels());
        // Exits can be lost: a process is forgotten once it is gone, not when it has no record.
        let closed = self.processes.window_closed(&mut self.sampler);
        self.collector.processes_forgotten(&closed.forgotten);
        let gone = closed.gone;
        self.live.gone(&gone);
        self.collector.processes_gone(&gone);
        if let Some(live) = live {
            self.live.forget_gone(&mut self.sampler, live);
        }
        Window { start: open.wall, duration, profiles, stats, coverage, stopped }
    }

    /// Samples of the window open now.
    pub fn samples_in_window(&self) -> u64 {
        self.collector.samples()
    }

    /// Device memory over time, per device, up to now.
    pub fn memory_timeline(&mut self) -> Vec<crate::output::memory_svg::DeviceChart> {
        self.collector.memory_timeline(crate::cuda::memory_points::boot_time_ns())
    }

    /// The out-of-memory failures seen since the last call, with their snapshots.
    pub fn take_ooms(&mut self) -> Vec<Oom> {
        self.collector.take_ooms(self.window.wall, self.processes.labels())
    }
}
