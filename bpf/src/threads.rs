//! Threads of the target processes as they are now (thread_reports.h): running or not, how long
//! each has waited, and where, from one pass of a task iterator. Nothing is stopped.

use std::io::Read;
use std::mem::{offset_of, size_of};

use libbpf_rs::Iter;

use crate::error::{attach_error, BpfError};
use crate::events::StackRead;
use crate::pod::read_pod;
use crate::programs::{load, BpfPrograms};
use crate::skel::types;

/// What a thread is doing, by its scheduler state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadState {
    /// On a CPU now.
    Running,
    /// Runnable, waiting for a CPU.
    Preempted,
    /// In an interruptible wait: a futex, a poll, a pipe, a sleep.
    Sleeping,
    /// In an uninterruptible wait: disk I/O, some kernel locks, a device's driver.
    Uninterruptible,
    /// Stopped or traced.
    Stopped,
    Other,
}

impl ThreadState {
    fn from_raw(state: u32, on_cpu: bool) -> Self {
        if on_cpu {
            return ThreadState::Running;
        }
        match state {
            0 => ThreadState::Preempted,
            s if s & 0xc != 0 => ThreadState::Stopped, // __TASK_STOPPED, __TASK_TRACED
            s if s & 2 != 0 => ThreadState::Uninterruptible,
            s if s & 1 != 0 => ThreadState::Sleeping,
            _ => ThreadState::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ThreadState::Running => "running",
            ThreadState::Preempted => "preempted",
            ThreadState::Sleeping => "sleeping",
            ThreadState::Uninterruptible => "uninterruptible",
            ThreadState::Stopped => "stopped",
            ThreadState::Other => "other",
        }
    }
}

/// A thread's user registers, as its last entry into the kernel saved them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The wait a thread is in, as the switch programs follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowedWait {
    /// When it began, on the scheduler's clock (the switch records' `since`).
    pub since: u64,
    pub preempted: bool,
    /// The switch program unwound it: its stack came as an off-CPU record.
    pub unwound: bool,
    /// The chance it was drawn with, of 1 << 32.
    pub chance: u64,
}

/// One thread of a target process.
#[derive(Debug, Clone)]
pub struct ThreadReport {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub state: ThreadState,
    /// The iterator's time, on the scheduler's clock.
    pub now: u64,
    /// Its wait, when the switch programs follow it (not while it runs).
    pub wait: Option<FollowedWait>,
    /// How long since it last ran, by the scheduler's accounting (0 while it runs).
    pub idle_ns: u64,
    /// Its user registers, when it is not running and entered the kernel from user mode.
    pub regs: Option<UserRegs>,
    /// The system call it is in.
    pub syscall: Option<u64>,
    /// Its TLS base, which is its pthread_t.
    pub fsbase: u64,
    /// Its kernel stack, leaf first (empty while it runs).
    pub kernel_stack: StackRead,
}

impl ThreadReport {
    /// How long its current wait has lasted: as followed when it is, else since it last ran.
    pub fn waited_ns(&self) -> u64 {
        match self.wait {
            Some(w) if w.since > 0 => self.now.saturating_sub(w.since),
            _ => self.idle_ns,
        }
    }
}

const FIXED: usize = offset_of!(types::thread_report, kernel_stack);

fn decode(r: &types::thread_report, frames: &[u8]) -> ThreadReport {
    let on_cpu = r.on_cpu != 0;
    let kernel_stack = if r.kernel_stack_bytes < 0 {
        StackRead::Failed(-r.kernel_stack_bytes)
    } else {
        StackRead::Frames(frames.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default())).filter(|&a| a != 0).collect())
    };
    let comm_len = r.comm.iter().position(|&c| c == 0).unwrap_or(r.comm.len());
    let comm = String::from_utf8_lossy(&r.comm[..comm_len].iter().map(|&c| c as u8).collect::<Vec<u8>>()).into_owned();
    ThreadReport {
        pid: r.pid,
        tid: r.tid,
        comm,
        state: ThreadState::from_raw(r.state, on_cpu),
        now: r.now,
        wait: (r.followed != 0 && r.since != 0).then_some(FollowedWait { since: r.since, preempted: r.preempted != 0, unwound: r.unwound != 0, chance: r.chance }),
        idle_ns: r.waited_ns,
        regs: (r.user_regs != 0 && !on_cpu && r.sp != 0).then_some(UserRegs { ip: r.ip, sp: r.sp, bp: r.bp }),
        syscall: u64::try_from(r.syscall).ok(),
        fsbase: r.fsbase,
        kernel_stack,
    }
}

/// Splits the iterator's output into reports: each its fixed part, then its kernel stack's bytes.
fn decode_all(mut data: &[u8]) -> Vec<ThreadReport> {
    let mut out = Vec::new();
    while let Some(r) = read_pod::<types::thread_report>(&pad(data)) {
        let bytes = usize::try_from(r.kernel_stack_bytes.max(0)).unwrap_or(0).min(size_of::<types::thread_report>() - FIXED);
        let Some(frames) = data.get(FIXED..FIXED + bytes) else { break };
        out.push(decode(&r, frames));
        data = &data[FIXED + bytes..];
    }
    out
}

/// The record's bytes, zero-filled to the struct's size (its kernel stack is cut after its use).
fn pad(data: &[u8]) -> Vec<u8> {
    if data.len() < FIXED {
        return Vec::new();
    }
    let mut b = data[..data.len().min(size_of::<types::thread_report>())].to_vec();
    b.resize(size_of::<types::thread_report>(), 0);
    b
}

impl BpfPrograms {
    /// Every thread of the target processes, as it is now. `follow`: a waiting thread without
    /// off-CPU state is given one, its wait begun now (needs the switch programs attached).
    pub fn report_threads(&self, follow: bool) -> Result<Vec<ThreadReport>, BpfError> {
        self.require(load::ProgramGroup::OffCpu)?;
        self.require(load::ProgramGroup::Threads)?;
        let progs = &self.skel().progs;
        let prog = if follow { &progs.report_threads_following } else { &progs.report_threads };
        let link = prog.attach().map_err(|source| attach_error("the thread iterator", source))?;
        let mut iter = Iter::new(&link).map_err(|source| attach_error("the thread iterator", source))?;
        let mut data = Vec::new();
        iter.read_to_end(&mut data).map_err(|e| attach_error("the thread iterator", libbpf_rs::Error::from(e)))?;
        Ok(decode_all(&data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::as_bytes;

    #[test]
    fn reports_are_read_back_each_cut_after_its_kernel_stack() {
        let mut a = types::thread_report { pid: 7, tid: 8, state: 1, followed: 1, since: 100, now: 350, user_regs: 1, ip: 0x401000, sp: 0x7ffd_0000, bp: 5, syscall: 202, kernel_stack_bytes: 16, ..Default::default() };
        a.kernel_stack[0] = 0xffff_ffff_8100_0000;
        a.kernel_stack[1] = 0xffff_ffff_8200_0000;
        for (i, c) in b"waiter".iter().enumerate() {
            a.comm[i] = *c as _;
        }
        let b = types::thread_report { pid: 7, tid: 9, on_cpu: 1, state: 0, now: 350, syscall: -1, ..Default::default() };
        let mut data = as_bytes(&a)[..FIXED + 16].to_vec();
        data.extend_from_slice(&as_bytes(&b)[..FIXED]);
        let r = decode_all(&data);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].tid, r[0].comm.as_str(), r[0].state, r[0].waited_ns(), r[0].syscall), (8, "waiter", ThreadState::Sleeping, 250, Some(202)));
        assert_eq!(r[0].regs, Some(UserRegs { ip: 0x401000, sp: 0x7ffd_0000, bp: 5 }));
        assert_eq!(r[0].kernel_stack.frames(), &[0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]);
        assert_eq!((r[1].state, r[1].regs, r[1].syscall, r[1].wait), (ThreadState::Running, None, None, None));
        // A report cut short is not read.
        assert_eq!(decode_all(&data[..FIXED - 1]).len(), 0);
        assert_eq!(ThreadState::from_raw(0x402, false), ThreadState::Uninterruptible);
        assert_eq!(ThreadState::from_raw(8, false), ThreadState::Stopped);
    }
}
