//! Off-CPU and wall time by stack: the stacks at which target threads left the CPU, joined with
//! the time each wait lasted. Not every switch-out is drawn for unwinding (see `OffCpuSampling`):
//! a drawn wait's time counts divided by the chance it was drawn with, which estimates the time
//! of the others without bias. A wait drawn but not unwound (the CPU's budget spent) has its time
//! spread over its thread's unwound waits in proportion. Wall time is that and the CPU samples,
//! on one scale: each sample counts its period.

use std::collections::{HashMap, HashSet};

use gpuflame_bpf::{OffCpuEnd, OffCpuSampling, OffCpuStack};

use super::cpu::SampleCounts;
use super::source::{Closed, Input, Source, WindowInfo};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, StackValues, Stacks, TailFrame};

/// The off-CPU and wall profiles, from the same waits.
pub struct OffCpu {
    waits: Waits,
    off_cpu: bool,
    /// The CPU samples, when wall time is wanted.
    wall: Option<SampleCounts>,
}

impl OffCpu {
    pub fn new(off_cpu: bool, wall: bool) -> Self {
        OffCpu { waits: Waits::default(), off_cpu, wall: wall.then(SampleCounts::default) }
    }
}

impl Source for OffCpu {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        match input {
            Input::Sample { stack, .. } => {
                if let Some(w) = self.wall.as_mut() {
                    w.add(stack);
                }
            }
            Input::OffCpu { record, stack } => self.waits.stack(record, stack),
            Input::OffCpuEnd(end) => self.waits.end(end),
            Input::ProcessExited(pid) => self.waits.thread_gone(*pid),
            _ => {}
        }
    }

    fn close(&mut self, window: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let (off, totals) = self.waits.take_values();
        let sampling = describe_sampling(window.frequency_hz);
        let mut out = Vec::new();
        if let Some(w) = self.wall.as_mut() {
            let mut values = w.take(window.frequency_hz);
            values.extend(off.iter().cloned());
            let comments = vec![
                format!("wall: CPU samples at {} Hz (each one period of time) and off-CPU time", window.frequency_hz),
                totals.describe(),
                sampling.clone(),
            ];
            out.push(Closed { kind: ProfileKind::Wall, values, comments });
        }
        if self.off_cpu {
            out.push(Closed { kind: ProfileKind::OffCpu, values: off, comments: vec![totals.describe(), sampling] });
        }
        out
    }
}

/// How the waits were drawn, for the profile's reader (offcpu.h has the why).
fn describe_sampling(frequency_hz: u64) -> String {
    let period_ms = OffCpuSampling::at(frequency_hz).period.as_secs_f64() * 1e3;
    format!(
        "off-CPU time is sampled: each wait is drawn for unwinding with a chance of its expected length (its thread's recent waits) over {period_ms:.2} ms, scaled per CPU to about {} unwinds a second, and counts its time divided by that chance (an unbiased estimate); the waits of a thread that waits {period_ms:.2} ms or more at a time count exactly while their CPU is under that rate",
        OffCpuSampling::default().cpu_target
    )
}

/// The frame of a thread's off-CPU time that no unwound wait of the window can carry.
const NOT_UNWOUND: &str = "[off-cpu: waits not unwound]";

#[derive(Default)]
struct ThreadTime {
    pid: u32,
    comm: String,
    unwound_ns: u64,
    not_unwound_ns: u64,
}

#[derive(Default)]
struct Waits {
    /// tid → its current wait's number and stack, until the wait's end arrives.
    pending: HashMap<u32, (u64, StackKey)>,
    unwound: HashMap<StackKey, u64>,
    threads: HashMap<u32, ThreadTime>,
    /// Processes that exited since the last window.
    gone: HashSet<u32>,
}

/// The totals of one window, for reports and the profile's comment.
#[derive(Debug, Clone, Copy, Default)]
pub struct OffCpuTotals {
    pub unwound_ns: u64,
    pub not_unwound_ns: u64,
}

impl OffCpuTotals {
    pub fn describe(&self) -> String {
        let total = self.unwound_ns + self.not_unwound_ns;
        let share = if total > 0 { self.unwound_ns as f64 * 100.0 / total as f64 } else { 100.0 };
        format!(
            "off-CPU time of {:.3} s, {share:.1}% of it in waits drawn and unwound; the rest (drawn past the CPU's unwind budget) is spread over the same thread's unwound waits in proportion",
            total as f64 / 1e9
        )
    }
}

impl Waits {
    fn stack(&mut self, o: &OffCpuStack, stack: &StackKey) {
        let mut key = stack.clone();
        key.leaf = Some(o.state.label());
        self.pending.insert(o.sample.tid, (o.wait, key));
    }

    fn end(&mut self, end: &OffCpuEnd) {
        let thread = self.threads.entry(end.tid).or_default();
        thread.pid = end.pid;
        if thread.comm.is_empty() {
            thread.comm = end.comm.clone();
        }
        let ns = end.weighted_ns();
        if end.wait == 0 {
            thread.not_unwound_ns += ns;
            return;
        }
        match self.pending.remove(&end.tid) {
            Some((wait, key)) if wait == end.wait => {
                thread.unwound_ns += ns;
                *self.unwound.entry(key).or_default() += ns;
            }
            _ => {
                // Its stack was dropped: the time still counts, as not unwound.
                thread.not_unwound_ns += ns;
            }
        }
    }

    /// The process exited: its waits still pending will never end, but only once the window is
    /// over: the exit comes on another ring buffer than the samples, and can be read before the
    /// end of a wait that its thread sent on its way out.
    fn thread_gone(&mut self, pid: u32) {
        self.gone.insert(pid);
    }

    /// Off-CPU nanoseconds per stack since the last call, scaled per thread.
    fn take_values(&mut self) -> (StackValues, OffCpuTotals) {
        let gone = std::mem::take(&mut self.gone);
        if !gone.is_empty() {
            self.pending.retain(|_, (_, k)| !gone.contains(&k.pid));
        }
        let unwound = std::mem::take(&mut self.unwound);
        let threads = std::mem::take(&mut self.threads);
        let mut totals = OffCpuTotals::default();
        let mut values: StackValues = Vec::with_capacity(unwound.len() + 1);
        for (key, ns) in unwound {
            let scale = threads.get(&key.tid).map_or(1.0, |t| (t.unwound_ns + t.not_unwound_ns) as f64 / t.unwound_ns.max(1) as f64);
            values.push((key, None, vec![(ns as f64 * scale).round() as i64]));
        }
        for (tid, t) in threads {
            totals.unwound_ns += t.unwound_ns;
            totals.not_unwound_ns += t.not_unwound_ns;
            if t.unwound_ns == 0 && t.not_unwound_ns > 0 {
                let key = StackKey {
                    pid: t.pid,
                    tid,
                    comm: t.comm,
                    kernel: Vec::new(),
                    user: Vec::new(),
                    root: None,
                    tail: vec![TailFrame::Marker(NOT_UNWOUND.into())],
                    leaf: None,
                };
                values.push((key, None, vec![t.not_unwound_ns as i64]));
            }
        }
        (values, totals)
    }
}
