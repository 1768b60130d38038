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

use gpuflame_bpf::{BpfPrograms, OffCpuStack, OffCpuState, ProcessUnwindView, PythonEval, PythonThreads, Sample, StackCopy, ThreadReport, ThreadState, UnwindStatus, UserFrame};
use gpuflame_unwind::WalkStart;

use super::late::{finish, Code, Outcome};

/// Stack bytes copied from a waiting thread first, and at most: a walk that runs off its copy is
/// tried again on one four times longer, up to deep Python stacks (3.10's eval loop takes a few
/// hundred bytes of C stack per call).
const FIRST_STACK_BYTES: usize = 32 << 10;
const MAX_STACK_BYTES: usize = 512 << 10;
/// How long one report's stack reads may take: the rest wait for the next window's end.
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

/// One report of the targets' threads at a window's end: the stacks read (each to go to the
/// sources before the waits), the tables the reads still need, and the threads.
pub(super) struct WaitingPass {
    pub(super) stacks: Vec<OffCpuStack>,
    pub(super) needs: Vec<(u32, u64)>,
    pub(super) reports: Vec<ThreadReport>,
}

impl WaitingPass {
    /// The threads that wait now, for the sources to count their waits up to now.
    pub(super) fn waiting(&self) -> impl Iterator<Item = &ThreadReport> {
        self.reports.iter().filter(|r| r.wait.is_some() && r.state != ThreadState::Running)
    }
}

impl WaitingThreads {
    /// Reports the targets' threads, and reads the stacks of waits not unwound yet and a period
    /// long. Needs the switch programs attached.
    pub(super) fn pass(&mut self, sampler: &BpfPrograms, period: u64) -> Option<WaitingPass> {
        let started = Instant::now();
        let reports = match sampler.report_threads(true) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the targets' threads failed: waits going on are counted when they end");
                return None;
            }
        };
        let iterated = started.elapsed();
        let (mut reads, mut reading) = (0u32, Duration::ZERO);
        self.stats.reports += 1;
        let current = |tid: &u32, since: &mut u64| reports.iter().any(|r| r.tid == *tid && r.wait.is_some_and(|w| w.since == *since));
        self.read.retain(current);
        self.cut.retain(current);
        let mut wanted: Vec<(&ThreadReport, u64)> = Vec::new();
        for r in &reports {
            let Some(wait) = r.wait.filter(|_| r.state != ThreadState::Running) else { continue };
            self.stats.waiting += 1;
            // Read when the switch program did not unwind it, and it has lasted (or, begun now at
            // the thread's first report, the thread has been idle) a period.
            let long = r.waited_ns().max(r.idle_ns) >= period;
            let unwound = wait.unwound && self.cut.get(&r.tid) != Some(&wait.since);
            if !unwound && long && self.read.get(&r.tid) != Some(&wait.since) {
                wanted.push((r, wait.since));
            }
        }
        // A process's threads one after another: the reader keeps what it read of the process
        // (threads of processes started together come interleaved by tid).
        wanted.sort_by_key(|(r, _)| (r.pid, r.tid));
        let (mut stacks, mut needs) = (Vec::new(), Vec::new());
        let mut reader = StackReader::new(sampler);
        for (r, since) in wanted {
            if reading >= READ_BUDGET {
                self.stats.deferred += 1;
                continue;
            }
            self.read.insert(r.tid, since);
            let read_started = Instant::now();
            let read = reader.read(r);
            reads += 1;
            reading += read_started.elapsed();
            match read {
                Read::Stack(sample) => {
                    self.stats.stacks_read += 1;
                    self.stats.stacks_whole += u64::from(sample.unwind.is_complete());
                    stacks.push(OffCpuStack { sample, wait: OffCpuStack::READ_BY_USER, since, state: wait_state(r.state) });
                }
                Read::NeedsTable(ip) => {
                    // Read again at the next report, once the table is in.
                    self.read.remove(&r.tid);
                    needs.push((r.pid, ip));
                }
                Read::NotYet => {
                    self.read.remove(&r.tid);
                }
                Read::Nothing => {}
            }
        }
        self.stats.last_pass = started.elapsed();
        let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
        tracing::debug!(threads = reports.len(), iterator_ms = ms(iterated), reads, reads_ms = ms(reading), pass_ms = ms(started.elapsed()), "the targets' threads reported");
        Some(WaitingPass { stacks, needs, reports })
    }
}

/// What reading a thread's stack came to.
pub(super) enum Read {
    Stack(Sample),
    /// The walk needs the table of the file at this address, not loaded yet (asked for).
    NeedsTable(u64),
    /// The process's maps are not read yet (a program the agent has not looked at): read again
    /// at the next report.
    NotYet,
    /// No user registers, or no memory (the process is gone, or not readable).
    Nothing,
}

/// Reads the stacks of threads that do not run, keeping what it has of a process (its memory,
/// its mappings and the rules found in them, its Python) while the threads are of that process.
pub(super) struct StackReader<'p> {
    programs: &'p BpfPrograms,
    pid: u32,
    memory: Option<File>,
    view: Option<ProcessUnwindView<'p>>,
    python: Option<PythonEval>,
    threads: Option<PythonThreads>,
}

impl<'p> StackReader<'p> {
    pub(super) fn new(programs: &'p BpfPrograms) -> Self {
        StackReader { programs, pid: 0, memory: None, view: None, python: None, threads: None }
    }

    /// The stack of a thread that does not run, as if the switch program had unwound it.
    pub(super) fn read(&mut self, r: &ThreadReport) -> Read {
        let Some(regs) = r.regs else { return Read::Nothing };
        if self.pid != r.pid {
            self.pid = r.pid;
            self.memory = File::open(format!("/proc/{}/mem", r.pid)).ok();
            self.view = self.programs.unwind_view(r.pid);
            self.python = self.programs.python_eval(r.pid);
            self.threads = self.memory.as_ref().and_then(|m| self.programs.python_threads(r.pid, m));
        }
        let Some(memory) = self.memory.as_ref() else { return Read::Nothing };
        let Some(view) = self.view.as_mut() else { return Read::NotYet };
        let py = self.threads.as_ref().and_then(|t| t.frames(r.fsbase, memory));
        let mut want = FIRST_STACK_BYTES;
        loop {
            let bytes = read_stack(memory, regs.sp.wrapping_sub(BELOW_SP), want);
            if bytes.is_empty() {
                return Read::Nothing;
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
            let mut code = Code { view, memory: Some(memory) };
            match finish(&mut sample, &copy, &mut code, self.python.as_ref(), true) {
                Outcome::Waiting { ip } => return Read::NeedsTable(ip),
                // Ran off the copy, which could be longer: again, with more.
                Outcome::Finished { cut_by_copy: true } if got == want && want < MAX_STACK_BYTES => want *= 4,
                Outcome::Finished { .. } => return Read::Stack(sample),
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
