//! Threads that wait now: at a window's end, and when following starts, every thread of the
//! targets is reported by a task iterator (`BpfPrograms::report_threads`). The waits going on are
//! counted up to here by the off-CPU source (`Input::Waiting`), so that a wait longer than a window
//! is in the windows it spans and not only in the one it ends in. A wait the switch program did not
//! unwind (it began before gpuflame followed the thread, or was drawn out) has its stack read here,
//! once, from user space: its user registers as the kernel saved them, a copy of its stack from
//! /proc/PID/mem, the late walk over it (`late::finish`), its Python frames from its thread state
//! and its kernel stack from the iterator. No signal, no ptrace: the thread is not woken.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use gpuflame_bpf::{Event, OffCpuStack, OffCpuState, Sample, StackCopy, ThreadReport, ThreadState, UnwindStatus, UserFrame};
use gpuflame_unwind::WalkStart;

use super::late::{finish, Code, Outcome};
use super::Session;
use crate::sources::Input;

/// Stack bytes copied from a waiting thread first, and at most: a walk that runs off its copy is
/// tried again on one four times longer, up to deep Python stacks (3.10's eval loop takes a few
/// hundred bytes of C stack per call).
const FIRST_STACK_BYTES: usize = 32 << 10;
const MAX_STACK_BYTES: usize = 512 << 10;
/// How long one report's stack reads may take: the rest wait for the next window.
const READ_BUDGET: Duration = Duration::from_millis(250);
/// Bytes below sp the copy starts at, as BPF's copies do (STACK_COPY_START_BELOW_SP).
const BELOW_SP: u64 = 128;

/// What reading waiting threads did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WaitingStats {
    /// Passes of the task iterator, and the threads they reported waiting.
    pub reports: u64,
    pub waiting: u64,
    /// Stacks read from user space, those that reached their outermost frame, and those not read
    /// for want of time (read at the next window's end).
    pub stacks_read: u64,
    pub stacks_whole: u64,
    pub deferred: u64,
    /// Time spent in the last pass, iterator and reads.
    pub last_pass: Duration,
}

#[derive(Default)]
pub(super) struct WaitingThreads {
    /// tid → the start of the wait whose stack was read (or tried), so that each is read once.
    read: HashMap<u32, u64>,
    /// tid → the start of its last wait whose stack the switch program could not finish (a
    /// program's first moments, before its code was read): read again if it lasts.
    cut: HashMap<u32, u64>,
    stats: WaitingStats,
}

impl WaitingThreads {
    pub(super) fn stats(&self) -> WaitingStats {
        self.stats
    }

    /// The switch program's stack of a wait, which did not reach the outermost frame.
    pub(super) fn cut_short(&mut self, tid: u32, since: u64) {
        self.cut.insert(tid, since);
    }
}

impl Session {
    /// Reports the targets' threads: those waiting go to the sources, counted up to now; the stacks
    /// of waits not unwound yet and a period long are read. Needs the switch programs attached.
    pub(super) fn report_waiting_threads(&mut self) {
        let started = Instant::now();
        let reports = match self.sampler.report_threads(true) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the targets' threads failed: waits going on are counted when they end");
                return;
            }
        };
        let period = self.off_cpu_period_ns;
        self.waiting.stats.reports += 1;
        let current = |tid: &u32, since: &mut u64| reports.iter().any(|r| r.tid == *tid && r.wait.is_some_and(|w| w.since == *since));
        self.waiting.read.retain(current);
        self.waiting.cut.retain(current);
        for r in &reports {
            let Some(wait) = r.wait.filter(|_| r.state != ThreadState::Running) else { continue };
            self.waiting.stats.waiting += 1;
            // Read when the switch program did not unwind it, and it has lasted (or, begun now at
            // the thread's first report, the thread has been idle) a period.
            let long = r.waited_ns().max(r.idle_ns) >= period;
            let unwound = wait.unwound && self.waiting.cut.get(&r.tid) != Some(&wait.since);
            if !unwound && long && self.waiting.read.get(&r.tid) != Some(&wait.since) {
                if started.elapsed() >= READ_BUDGET {
                    self.waiting.stats.deferred += 1;
                } else {
                    self.waiting.read.insert(r.tid, wait.since);
                    if let Some(sample) = self.read_thread_stack(r) {
                        self.waiting.stats.stacks_read += 1;
                        self.waiting.stats.stacks_whole += u64::from(sample.unwind.is_complete());
                        let stack = OffCpuStack { sample, wait: OffCpuStack::READ_BY_USER, since: wait.since, state: wait_state(r.state) };
                        self.collect(Event::OffCpu(stack));
                    }
                }
            }
            self.collector.offer(&Input::Waiting(r));
        }
        self.waiting.stats.last_pass = started.elapsed();
    }

    /// The stack of a thread that does not run, as if the switch program had unwound it: None
    /// without its user registers, its process's maps, or the table its walk needs (asked for).
    pub(super) fn read_thread_stack(&mut self, r: &ThreadReport) -> Option<Sample> {
        let regs = r.regs?;
        let memory = File::open(format!("/proc/{}/mem", r.pid)).ok()?;
        let py = self.sampler.python_frames_of_thread(r.pid, r.fsbase, &memory);
        let python = self.sampler.python_eval(r.pid);
        let mut view = self.sampler.unwind_view(r.pid)?;
        let mut want = FIRST_STACK_BYTES;
        loop {
            let bytes = read_stack(&memory, regs.sp.wrapping_sub(BELOW_SP), want);
            if bytes.is_empty() {
                return None;
            }
            let got = bytes.len();
            let mut user_stack = vec![UserFrame::Native(regs.ip)];
            user_stack.extend(py.iter().flatten().copied());
            let mut sample = Sample {
                timestamp_ns: 0,
                pid: r.pid,
                tid: r.tid,
                cpu: 0,
                comm: r.comm.clone(),
                kernel_stack: r.kernel_stack.clone(),
                user_stack,
                unwind: UnwindStatus::NoTableYet,
                leaf_file: None,
                forked_from: None,
                by_file: false,
                stack_copy: None,
            };
            let copy = StackCopy { start: WalkStart { ip: regs.ip, sp: regs.sp, bp: regs.bp, ..Default::default() }, from_leaf: false, bytes };
            let mut code = Code { view: &mut view, memory: Some(&memory) };
            match finish(&mut sample, &copy, &mut code, python.as_ref(), true) {
                Outcome::Waiting { ip } => {
                    // Its table is not loaded yet: asked for, and read again at the next report.
                    self.waiting.read.remove(&r.tid);
                    self.processes.tracker_mut().need_table(&mut self.sampler, r.pid, ip);
                    return None;
                }
                // Ran off the copy, which could be longer: again, with more.
                Outcome::Finished { cut_by_copy: true } if got == want && want < MAX_STACK_BYTES => want *= 4,
                Outcome::Finished { .. } => break Some(sample),
            }
        }
    }
}

/// The leaf a waiting thread's stack gets, by its state.
pub(super) fn wait_state(state: ThreadState) -> OffCpuState {
    match state {
        ThreadState::Preempted | ThreadState::Running => OffCpuState::Preempted,
        ThreadState::Sleeping => OffCpuState::Sleeping,
        ThreadState::Uninterruptible => OffCpuState::Uninterruptible,
        ThreadState::Stopped | ThreadState::Other => OffCpuState::Other,
    }
}

/// The stack from `base` up, as far as it is mapped, up to `most` bytes.
fn read_stack(memory: &File, base: u64, most: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; most];
    let mut got = 0;
    while got < bytes.len() {
        match memory.read_at(&mut bytes[got..], base + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    bytes.truncate(got);
    bytes
}
