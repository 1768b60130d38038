//! Off-CPU and wall time by stack: the stacks at which target threads left the CPU, joined with
//! the time each wait lasted. Not every switch-out is unwound (see `OffCpuSampling`), but every
//! wait is measured: a thread's time in waits not unwound is shared out over its unwound waits of
//! the same kind (shorter than the sampling period, or not), each weighing its time over the
//! chance it was drawn with. A thread with none: its short waits over its process's (threads of
//! a thread-per-request server wait alike, and few live to be unwound), its long ones under
//! `[off-cpu: waits not unwound]`. Wall time is that and the CPU samples, on one scale: each
//! sample counts its period.
//!
//! A wait is counted in the windows it spans: at a window's end the session reports the threads
//! that wait (`Input::Waiting`), and each wait a period long or unwound is counted up to then,
//! under its stack (the switch program's, or one read from user space for a wait it did not
//! unwind: `OffCpuStack::READ_BY_USER`). Its end says when it began, and only what was not
//! counted yet is counted then.

use std::collections::{HashMap, HashSet};

use gpuflame_bpf::{OffCpuEnd, OffCpuSampling, OffCpuStack, ThreadReport, ThreadState};

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
    pub fn new(off_cpu: bool, wall: bool, frequency_hz: u64) -> Self {
        let waits = Waits { period_ns: OffCpuSampling::at(frequency_hz).period_ns(), ..Default::default() };
        OffCpu { waits, off_cpu, wall: wall.then(SampleCounts::default) }
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
            Input::Waiting(report) => self.waits.waiting(report),
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

/// One wait's time in this window: all of it, or the part since a window's end counted the rest.
struct WaitTime {
    /// Its stack (None: not unwound, or the stack was dropped).
    key: Option<StackKey>,
    ns: u64,
    /// Its whole length so far, which decides its kind.
    full_ns: u64,
    /// Its time over the chance it was drawn with.
    weight: f64,
}

#[derive(Default)]
struct ThreadTime {
    pid: u32,
    comm: String,
    /// Measured time of its short waits not unwound.
    short_rest_ns: u64,
    /// Its other waits.
    waits: Vec<WaitTime>,
}

/// The stack of a thread's current wait, until its end.
struct Pending {
    since: u64,
    key: StackKey,
    /// Read from user space: it stands for this wait alone (chance 1).
    by_user: bool,
}

/// A wait a window's end counted a part of, until its end comes.
struct OpenWait {
    pid: u32,
    since: u64,
    counted_to: u64,
    /// The window whose end last saw it going on.
    seen: u64,
}

#[derive(Default)]
struct Waits {
    period_ns: u64,
    /// tid → the stack of its current wait.
    pending: HashMap<u32, Pending>,
    /// tid → its wait counted up to a window's end.
    open: HashMap<u32, OpenWait>,
    threads: HashMap<u32, ThreadTime>,
    /// Processes that exited since the last window.
    gone: HashSet<u32>,
    /// Windows closed so far.
    window: u64,
    /// Time of waits going on at this window's end, counted up to it.
    ongoing_ns: u64,
}

const CHANCE_ONE: u64 = 1 << 32;

fn weight(ns: u64, chance: u64) -> f64 {
    ns as f64 * CHANCE_ONE as f64 / chance.clamp(1, CHANCE_ONE) as f64
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
    /// Of all these, the time of waits still going on at the window's end.
    pub ongoing_ns: u64,
}

impl OffCpuTotals {
    pub fn describe(&self) -> String {
        let total = self.own_ns + self.process_ns + self.not_unwound_ns;
        let pct = |ns: u64| if total > 0 { ns as f64 * 100.0 / total as f64 } else { 0.0 };
        format!(
            "off-CPU time of {:.3} s, measured: {:.1}% on the thread's own unwound waits, {:.1}% on its process's (short waits of a thread with none unwound), {:.1}% under {NOT_UNWOUND}; {:.3} s of it in waits still going on at the window's end",
            total as f64 / 1e9,
            pct(self.own_ns),
            pct(self.process_ns),
            pct(self.not_unwound_ns),
            self.ongoing_ns as f64 / 1e9
        )
    }
}

impl Waits {
    fn thread(&mut self, pid: u32, tid: u32, comm: &str) -> &mut ThreadTime {
        let thread = self.threads.entry(tid).or_default();
        thread.pid = pid;
        if thread.comm.is_empty() {
            thread.comm = comm.to_string();
        }
        thread
    }

    fn stack(&mut self, o: &OffCpuStack, stack: &StackKey) {
        let mut key = stack.clone();
        key.leaf = Some(o.state.label());
        self.pending.insert(o.sample.tid, Pending { since: o.since, key, by_user: o.wait == OffCpuStack::READ_BY_USER });
    }

    /// The stack of `tid`'s wait begun at `since`, with the chance it stands for; taken when
    /// the wait ended.
    fn stack_of(&mut self, tid: u32, since: u64, chance: u64, ended: bool) -> (Option<StackKey>, u64) {
        let Some(p) = self.pending.get(&tid).filter(|p| p.since == since) else { return (None, CHANCE_ONE) };
        let chance = if p.by_user { CHANCE_ONE } else { chance };
        let key = if ended { self.pending.remove(&tid).map(|p| p.key) } else { Some(p.key.clone()) };
        (key, chance)
    }

    fn end(&mut self, end: &OffCpuEnd) {
        self.thread(end.pid, end.tid, &end.comm).short_rest_ns += end.short_rest_ns;
        if end.since == 0 {
            return;
        }
        // What a window's end counted of it already.
        let from = match self.open.remove(&end.tid) {
            Some(o) if o.since == end.since => o.counted_to.max(end.since),
            _ => end.since,
        };
        let ns = (end.since + end.duration_ns).saturating_sub(from);
        // Its stack may have been dropped, or it was not unwound: the time still counts.
        let (key, chance) = self.stack_of(end.tid, end.since, end.chance, true);
        if ns > 0 {
            let wait = WaitTime { key, ns, full_ns: end.duration_ns, weight: weight(ns, chance) };
            self.thread(end.pid, end.tid, &end.comm).waits.push(wait);
        }
    }

    /// A thread as it is at a window's end: its wait, going on, is counted up to now when it is
    /// a period long or unwound (its end then comes on its own, and says when it began).
    fn waiting(&mut self, r: &ThreadReport) {
        let Some(w) = r.wait.filter(|_| r.state != ThreadState::Running) else { return };
        let waited = r.now.saturating_sub(w.since);
        if !w.unwound && waited < self.period_ns {
            return;
        }
        let window = self.window;
        let open = self.open.entry(r.tid).or_insert(OpenWait { pid: r.pid, since: w.since, counted_to: w.since, seen: window });
        if open.since != w.since {
            *open = OpenWait { pid: r.pid, since: w.since, counted_to: w.since, seen: window };
        }
        let ns = r.now.saturating_sub(open.counted_to.max(w.since));
        open.counted_to = open.counted_to.max(r.now);
        open.seen = window;
        if ns == 0 {
            return;
        }
        let (key, chance) = self.stack_of(r.tid, w.since, w.chance, false);
        self.ongoing_ns += ns;
        self.thread(r.pid, r.tid, &r.comm).waits.push(WaitTime { key, ns, full_ns: waited, weight: weight(ns, chance) });
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
    fn take_values(&mut self) -> (StackValues, OffCpuTotals) {
        let period_ns = self.period_ns;
        let gone = std::mem::take(&mut self.gone);
        if !gone.is_empty() {
            self.pending.retain(|_, p| !gone.contains(&p.key.pid));
            self.open.retain(|_, o| !gone.contains(&o.pid));
        }
        // A wait seen going on at the last two windows' ends may still have its end to come (it
        // woke as the window closed); older ones ended with their end lost.
        let window = self.window;
        self.open.retain(|_, o| o.seen + 2 > window);
        self.window += 1;
        let threads = std::mem::take(&mut self.threads);
        let mut totals = OffCpuTotals { ongoing_ns: std::mem::take(&mut self.ongoing_ns), ..Default::default() };
        let mut values: HashMap<StackKey, f64> = HashMap::new();
        // pid → the short waits of its threads without an unwound one, and the weights of all
        // its unwound waits by kind.
        let mut processes: HashMap<u32, ProcessRest> = HashMap::new();
        for (tid, t) in threads {
            let mut by_kind: [Vec<(StackKey, f64)>; KINDS] = Default::default();
            let mut measured = [0; KINDS];
            measured[SHORT] = t.short_rest_ns;
            for w in t.waits {
                let k = kind_of(w.full_ns, period_ns);
                measured[k] += w.ns;
                if let Some(key) = w.key {
                    by_kind[k].push((key, w.weight));
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
