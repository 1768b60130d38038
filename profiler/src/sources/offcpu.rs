//! Off-CPU and wall time by stack: the stacks at which target threads left the CPU, joined with
//! the time each wait lasted. Not every switch-out is unwound (see `OffCpuSampling`), but every
//! wait is measured: a thread's time in waits not unwound is shared out over its unwound waits of
//! the same kind (shorter than the sampling period, or not), each weighing its time over the
//! chance it was drawn with. A thread with none: its short waits over its process's (threads of
//! a thread-per-request server wait alike, and few live to be unwound), its long ones under
//! `[off-cpu: waits not unwound]`. Wall time is that and the CPU samples, on one scale: each
//! sample counts its period.

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
        let (off, totals) = self.waits.take_values(OffCpuSampling::at(window.frequency_hz).period_ns());
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
        "off-CPU stacks are sampled: each wait is unwound with a chance of its expected length (its thread's recent waits) over {period_ms:.2} ms, scaled per CPU to about {} unwinds a second; the time is not sampled: each thread's waits shorter than {period_ms:.2} ms, and its longer ones, are measured and shared out over its unwound waits of the same kind, weighed by time over chance (a thread with none: its short waits over its process's, its long ones under {NOT_UNWOUND})",
        OffCpuSampling::default().cpu_target
    )
}

/// The frame of off-CPU time that no unwound wait of the window can carry.
const NOT_UNWOUND: &str = "[off-cpu: waits not unwound]";

/// Waits shorter than the sampling period, and the others: each kind's time goes to unwound
/// waits of the same kind, so that a short wait drawn at a small chance cannot carry a long one's.
const KINDS: usize = 2;
const SHORT: usize = 0;

fn kind_of(duration_ns: u64, period_ns: u64) -> usize {
    usize::from(duration_ns >= period_ns)
}

#[derive(Default)]
struct ThreadTime {
    pid: u32,
    comm: String,
    /// Measured time of its waits, unwound or not, by kind once known (`rest_ns`: not unwound).
    rest_ns: [u64; KINDS],
    /// Its unwound waits: stack (None: the stack was dropped), time, weight (time over chance).
    unwound: Vec<(Option<StackKey>, u64, f64)>,
}

#[derive(Default)]
struct Waits {
    /// tid → its current wait's number and stack, until the wait's end arrives.
    pending: HashMap<u32, (u64, StackKey)>,
    threads: HashMap<u32, ThreadTime>,
    /// Processes that exited since the last window.
    gone: HashSet<u32>,
}

/// The totals of one window, for reports and the profile's comment.
#[derive(Debug, Clone, Copy, Default)]
pub struct OffCpuTotals {
    /// Time shared out over a thread's own unwound waits.
    pub own_ns: u64,
    /// Short waits of threads without an unwound short wait, shared out over their process's.
    pub process_ns: u64,
    /// Time no unwound wait of its process could carry.
    pub not_unwound_ns: u64,
}

impl OffCpuTotals {
    pub fn describe(&self) -> String {
        let total = self.own_ns + self.process_ns + self.not_unwound_ns;
        let pct = |ns: u64| if total > 0 { ns as f64 * 100.0 / total as f64 } else { 0.0 };
        format!(
            "off-CPU time of {:.3} s, measured: {:.1}% on the thread's own unwound waits, {:.1}% on its process's (short waits of a thread with none unwound), {:.1}% under {NOT_UNWOUND}",
            total as f64 / 1e9,
            pct(self.own_ns),
            pct(self.process_ns),
            pct(self.not_unwound_ns)
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
        thread.rest_ns[0] += end.short_rest_ns;
        thread.rest_ns[1] += end.long_rest_ns;
        if end.wait == 0 {
            return;
        }
        // Its stack may have been dropped: the time still counts, as not unwound.
        let key = match self.pending.remove(&end.tid) {
            Some((wait, key)) if wait == end.wait => Some(key),
            _ => None,
        };
        thread.unwound.push((key, end.duration_ns, end.weight()));
    }

    /// The process exited: its waits still pending will never end, but only once the window is
    /// over: the exit comes on another ring buffer than the samples, and can be read before the
    /// end of a wait that its thread sent on its way out.
    fn thread_gone(&mut self, pid: u32) {
        self.gone.insert(pid);
    }

    /// Off-CPU nanoseconds per stack since the last call: each thread's measured time of each
    /// kind over its unwound waits of that kind, in proportion to their weights; a thread with
    /// none over its process's; what is left under [`NOT_UNWOUND`].
    fn take_values(&mut self, period_ns: u64) -> (StackValues, OffCpuTotals) {
        let gone = std::mem::take(&mut self.gone);
        if !gone.is_empty() {
            self.pending.retain(|_, (_, k)| !gone.contains(&k.pid));
        }
        let threads = std::mem::take(&mut self.threads);
        let mut totals = OffCpuTotals::default();
        let mut values: HashMap<StackKey, f64> = HashMap::new();
        // pid → the short waits of its threads without an unwound one, and the weights of all
        // its unwound waits by kind.
        let mut processes: HashMap<u32, ProcessRest> = HashMap::new();
        for (tid, t) in threads {
            let mut by_kind: [Vec<(StackKey, f64)>; KINDS] = Default::default();
            let mut measured = t.rest_ns;
            for (key, ns, weight) in t.unwound {
                let k = kind_of(ns, period_ns);
                measured[k] += ns;
                if let Some(key) = key {
                    by_kind[k].push((key, weight));
                }
            }
            let process = processes.entry(t.pid).or_insert_with(|| ProcessRest { tid, comm: t.comm.clone(), ..Default::default() });
            for k in 0..KINDS {
                let weights = &by_kind[k];
                if !weights.is_empty() {
                    share_out(&mut values, weights, measured[k]);
                    totals.own_ns += measured[k];
                } else if k == SHORT {
                    // Many short waits, alike across a process's threads (a thread-per-request
                    // server's threads rarely live to an unwound wait of their own).
                    process.short_rest_ns += measured[k];
                } else if measured[k] > 0 {
                    // A long wait of a thread whose waits were short: another thread's long
                    // wait is no guess at where it waited (a main thread's sleep was shared
                    // out over three worker threads' waits in a test).
                    *values.entry(not_unwound_key(t.pid, tid, &t.comm)).or_default() += measured[k] as f64;
                    totals.not_unwound_ns += measured[k];
                }
                process.weights[k].append(&mut by_kind[k]);
            }
        }
        for (pid, p) in processes {
            if p.short_rest_ns == 0 {
                continue;
            }
            // Its short waits first, else its long ones: a process's waits all long or all short.
            let weights = if p.weights[SHORT].is_empty() { &p.weights[1 - SHORT] } else { &p.weights[SHORT] };
            if weights.is_empty() {
                *values.entry(not_unwound_key(pid, p.tid, &p.comm)).or_default() += p.short_rest_ns as f64;
                totals.not_unwound_ns += p.short_rest_ns;
            } else {
                share_out(&mut values, weights, p.short_rest_ns);
                totals.process_ns += p.short_rest_ns;
            }
        }
        (values.into_iter().map(|(key, ns)| (key, None, vec![ns.round() as i64])).collect(), totals)
    }
}

#[derive(Default)]
struct ProcessRest {
    /// A thread of it and its name, for the stack of time no wait could carry.
    tid: u32,
    comm: String,
    short_rest_ns: u64,
    weights: [Vec<(StackKey, f64)>; KINDS],
}

fn not_unwound_key(pid: u32, tid: u32, comm: &str) -> StackKey {
    StackKey {
        pid,
        tid,
        comm: comm.to_string(),
        kernel: Vec::new(),
        user: Vec::new(),
        root: None,
        tail: vec![TailFrame::Marker(NOT_UNWOUND.into())],
        leaf: None,
    }
}

/// Adds `ns` to the stacks of `weights`, in proportion.
fn share_out(values: &mut HashMap<StackKey, f64>, weights: &[(StackKey, f64)], ns: u64) {
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    for (key, w) in weights {
        let share = if total > 0.0 { w / total } else { 1.0 / weights.len() as f64 };
        *values.entry(key.clone()).or_default() += ns as f64 * share;
    }
}
