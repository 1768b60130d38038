//! Stacks from profiles' own hooks (stack_hooks.h): the stack, what it weighs, and which profile's
//! hook took it, as the attach cookie that user space gave the hook says.

use super::record::Record;
use super::sample::{sample_with_kernel_after_user, Sample};
use crate::skel::types;

/// A stack that a profile's own hook took.
#[derive(Debug, Clone)]
pub struct HookedStack {
    /// The thread, and its stack: kernel and user.
    pub sample: Sample,
    /// The cookie the hook was attached with: which profile ([`crate::BpfPrograms::attach_stack_hook`]).
    pub origin: u64,
    /// What it stands for: events, bytes.
    pub value: u64,
}

/// EVENT_HOOKED_STACK: cut after its frames, the kernel ones right after the user ones.
pub(super) fn decode(r: &Record) -> HookedStack {
    let types::hooked_stack_payload { origin, value } = r.payload();
    HookedStack { sample: sample_with_kernel_after_user(r), origin, value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::record::tests::{decoded, header, record};
    use crate::events::sample::{StackRead, UserFrame};

    #[test]
    fn decodes_a_hooked_stack_with_its_kernel_frames_after_the_user_ones() {
        let h = header(types::event_kind::EVENT_HOOKED_STACK, 42, 44, "faulter");
        let stack = types::event_stack { kernel_stack_bytes: 8, user_frames: 2, ..Default::default() };
        let payload = types::hooked_stack_payload { origin: 13, value: 64 };
        let data = record(h, stack, &payload, &[0x10, 0x20, 0xffff_ffff_8100_0000]);
        let Some(s) = decoded(&data, |r| Some(decode(r))) else { panic!("not a hooked stack") };
        assert_eq!((s.origin, s.value, s.sample.tid, s.sample.comm.as_str()), (13, 64, 44, "faulter"));
        assert_eq!(s.sample.user_stack, vec![UserFrame::Native(0x10), UserFrame::Native(0x20)]);
        assert_eq!(s.sample.kernel_stack, StackRead::Frames(vec![0xffff_ffff_8100_0000]));
    }
}
