//! Off-CPU records: where a target thread left the CPU in a wait drawn for unwinding, and, at its
//! return, how long it was away and what chance the wait was drawn with.

use super::sample::{sample_with_kernel_after_user, Sample};
use super::record::Record;
use crate::skel::types;

/// Why a thread left the CPU: its scheduler state at the switch-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OffCpuState {
    /// TASK_RUNNING: it was preempted, and waited for a CPU.
    Preempted,
    /// TASK_INTERRUPTIBLE: it slept (a futex, a poll, a pipe, a sleep).
    Sleeping,
    /// TASK_UNINTERRUPTIBLE: disk I/O, page faults, some kernel locks.
    Uninterruptible,
    /// Stopped, traced, or another state.
    Other,
}

impl OffCpuState {
    fn from_raw(state: u32) -> Self {
        match state & 0x3 {
            0 if state == 0 => OffCpuState::Preempted,
            1 => OffCpuState::Sleeping,
            2 | 3 => OffCpuState::Uninterruptible,
            _ => OffCpuState::Other,
        }
    }

    /// The leaf frame that says so in a profile.
    pub fn label(self) -> &'static str {
        match self {
            OffCpuState::Preempted => "[off-cpu: preempted]",
            OffCpuState::Sleeping => "[off-cpu: sleeping]",
            OffCpuState::Uninterruptible => "[off-cpu: uninterruptible]",
            OffCpuState::Other => "[off-cpu: stopped or other]",
        }
    }
}

/// A target thread switched out: the stack where it left the CPU. Its time comes with the
/// [`OffCpuEnd`] of the same `wait`.
#[derive(Debug, Clone)]
pub struct OffCpuStack {
    pub sample: Sample,
    /// The wait's number within its thread; [`OffCpuStack::READ_BY_USER`]: read by user space
    /// from a thread that waits (session/waiting.rs), not by the switch program.
    pub wait: u64,
    /// When the wait began, on the scheduler's clock: its end says the same.
    pub since: u64,
    pub state: OffCpuState,
}

impl OffCpuStack {
    /// The `wait` of a stack read by user space; BPF numbers its waits from 1 up.
    pub const READ_BY_USER: u64 = u64::MAX;
}

/// A wait of a thread ended that was unwound (`wait` > 0) or lasted a sampling period or more,
/// with the time of the thread's short waits not unwound since its last record; or those alone
/// (`since` 0: at its exit, or once they are 100 ms).
#[derive(Debug, Clone)]
pub struct OffCpuEnd {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The [`OffCpuStack`] it belongs to; 0 for none.
    pub wait: u64,
    /// When it began (scheduler clock), as its stack and the thread reports say; 0: no wait.
    pub since: u64,
    /// Its time off the CPU, all of it.
    pub duration_ns: u64,
    /// The chance it was drawn with, of 1 << 32 (0 when not unwound).
    pub chance: u64,
    /// The thread's waits shorter than the sampling period and not unwound.
    pub short_rest_ns: u64,
}

impl OffCpuEnd {
    /// What it weighs among the unwound waits of its kind: its time divided by its chance (a
    /// wait drawn with chance c stands for 1/c such waits).
    pub fn weight(&self) -> f64 {
        self.duration_ns as f64 * (1u64 << 32) as f64 / self.chance.clamp(1, 1 << 32) as f64
    }
}

/// EVENT_OFFCPU_STACK: cut after its frames, the kernel ones right after the user ones (no room
/// is sent for a user stack shorter than the most).
pub(super) fn decode_stack(r: &Record) -> OffCpuStack {
    let types::offcpu_stack_payload { wait, since, state, _pad: _ } = r.payload();
    OffCpuStack { sample: sample_with_kernel_after_user(r), wait, since, state: OffCpuState::from_raw(state) }
}

/// EVENT_OFFCPU_END: the fixed part alone.
pub(super) fn decode_end(r: &Record) -> OffCpuEnd {
    let types::offcpu_end_payload { wait, since, off_ns, chance, short_rest_ns } = r.payload();
    OffCpuEnd { pid: r.header.pid, tid: r.header.tid, comm: r.comm(), wait, since, duration_ns: off_ns, chance, short_rest_ns }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::record::tests::{decoded, header, record};
    use crate::events::sample::{StackRead, UserFrame};

    #[test]
    fn decodes_an_off_cpu_stack_with_its_kernel_frames_after_the_user_ones() {
        let h = header(types::event_kind::EVENT_OFFCPU_STACK, 42, 44, "loader");
        let stack = types::event_stack { kernel_stack_bytes: 16, user_frames: 2, ..Default::default() };
        let payload = types::offcpu_stack_payload { wait: 7, since: 123, state: 1, _pad: 0 };
        let data = record(h, stack, &payload, &[0x10, 0x20, 0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]);
        let Some(o) = decoded(&data, |r| Some(decode_stack(r))) else { panic!("not an off-CPU stack") };
        assert_eq!((o.wait, o.since, o.state, o.sample.tid, o.sample.comm.as_str()), (7, 123, OffCpuState::Sleeping, 44, "loader"));
        assert_eq!(o.sample.user_stack, vec![UserFrame::Native(0x10), UserFrame::Native(0x20)]);
        assert_eq!(o.sample.kernel_stack, StackRead::Frames(vec![0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]));
        // A record cut short keeps what it carries.
        let Some(o) = decoded(&data[..data.len() - 8], |r| Some(decode_stack(r))) else { panic!() };
        assert_eq!(o.sample.kernel_stack.frames().len(), 1);
        assert_eq!(OffCpuState::from_raw(0), OffCpuState::Preempted);
        assert_eq!(OffCpuState::from_raw(0x102), OffCpuState::Uninterruptible);
    }

    #[test]
    fn decodes_the_end_of_a_wait() {
        let h = header(types::event_kind::EVENT_OFFCPU_END, 42, 44, "loader");
        let payload = types::offcpu_end_payload { wait: 7, since: 99, off_ns: 5_000_000, chance: 1 << 30, short_rest_ns: 300 };
        let Some(end) = decoded(&record(h, Default::default(), &payload, &[]), |r| Some(decode_end(r))) else { panic!("not an off-CPU end") };
        assert_eq!((end.pid, end.tid, end.comm.as_str()), (42, 44, "loader"));
        assert_eq!((end.wait, end.since, end.duration_ns, end.chance, end.short_rest_ns), (7, 99, 5_000_000, 1 << 30, 300));
        // Drawn with a chance of 1/4, it weighs as four such waits.
        assert_eq!(end.weight(), 20_000_000.0);
        assert_eq!(OffCpuEnd { chance: 1 << 32, ..end.clone() }.weight(), 5_000_000.0);
        assert!(OffCpuEnd { chance: 0, ..end }.weight().is_finite());
    }
}
