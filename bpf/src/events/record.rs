//! The layout of a record of the `samples` ring (struct event_record in events.h), which every
//! kind's decoder reads: apart from the dispatch on kinds, so that the decoders need not name the
//! module that names them.

use std::mem::{offset_of, size_of};

use crate::pod::{read_pod, Pod};
use crate::skel::types;

pub(super) const STACK_AT: usize = offset_of!(types::event_record, stack);
pub(super) const PAYLOAD_AT: usize = offset_of!(types::event_record, payload);
/// Where the fixed part ends, and the stack (or a name, or kernel records) begins.
pub(super) const FIXED_BYTES: usize = offset_of!(types::event_record, user_stack);
pub(super) const KERNEL_STACK_AT: usize = offset_of!(types::event_record, kernel_stack);
pub(crate) const RECORD_BYTES: usize = size_of::<types::event_record>();
/// 8-byte slots after the fixed part of a whole record: the user stack's, then the kernel's.
pub(super) const SLOTS: usize = (RECORD_BYTES - FIXED_BYTES) / size_of::<u64>();
pub(super) const USER_SLOTS: usize = (KERNEL_STACK_AT - FIXED_BYTES) / size_of::<u64>();

/// A record of the `samples` ring whose fixed part is all there.
pub(super) struct Record<'a> {
    pub(super) header: types::event_header,
    pub(super) stack: types::event_stack,
    pub(super) data: &'a [u8],
}

impl<'a> Record<'a> {
    pub(super) fn new(data: &'a [u8]) -> Option<Self> {
        if data.len() < FIXED_BYTES {
            return None;
        }
        Some(Record { header: read_pod(data)?, stack: read_pod(&data[STACK_AT..])?, data })
    }

    /// The payload, as the struct of the record's kind.
    pub(super) fn payload<T: Pod>(&self) -> T {
        read_pod(&self.data[PAYLOAD_AT..]).expect("the fixed part holds every payload")
    }

    /// What follows the fixed part: a stack, a name, or kernel records.
    pub(super) fn tail(&self) -> &'a [u8] {
        &self.data[FIXED_BYTES..]
    }

    /// The 8-byte slots after the fixed part, as many as the record carries, at most a whole
    /// record's.
    pub(super) fn slots(&self) -> Vec<u64> {
        self.tail().chunks_exact(size_of::<u64>()).take(SLOTS).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect()
    }

    /// The `len` bytes of a name that follows the fixed part, as far as the record holds it.
    pub(super) fn name(&self, len: u32) -> String {
        let bytes = self.tail();
        String::from_utf8_lossy(&bytes[..(len as usize).min(bytes.len())]).into_owned()
    }

    pub(super) fn comm(&self) -> String {
        let bytes: Vec<u8> = self.header.comm.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::pod::as_bytes;

    /// A record as the programs send it: the fixed part, then `tail`.
    pub(crate) fn record<P: Copy>(header: types::event_header, stack: types::event_stack, payload: &P, tail: &[u64]) -> Vec<u8> {
        let mut data = vec![0u8; FIXED_BYTES];
        data[..size_of::<types::event_header>()].copy_from_slice(as_bytes(&header));
        data[STACK_AT..][..size_of::<types::event_stack>()].copy_from_slice(as_bytes(&stack));
        data[PAYLOAD_AT..][..size_of::<P>()].copy_from_slice(as_bytes(payload));
        data.extend(tail.iter().flat_map(|s| s.to_ne_bytes()));
        data
    }

    pub(crate) fn header(kind: types::event_kind, pid: u32, tid: u32, comm: &str) -> types::event_header {
        let mut h = types::event_header { kind: kind.0, pid, tid, cpu: 1, timestamp_ns: 1234, comm: [0; 16] };
        for (d, s) in h.comm.iter_mut().zip(comm.bytes()) {
            *d = s as i8;
        }
        h
    }

    /// What a kind's decoder makes of `data`, or None where the fixed part is not all there.
    pub(crate) fn decoded<T>(data: &[u8], decode: impl FnOnce(&Record) -> Option<T>) -> Option<T> {
        decode(&Record::new(data)?)
    }

    #[test]
    fn the_record_layout_is_the_c_one() {
        // A 40-byte header, 64 bytes of stack outcome, the largest payload (a CUDA call, 64),
        // then 512 user and 127 kernel frames. A CPU sample goes whole: its size is ring space.
        assert_eq!((size_of::<types::event_header>(), STACK_AT), (40, 40));
        assert_eq!((size_of::<types::event_stack>(), PAYLOAD_AT), (64, 104));
        assert_eq!((size_of::<types::event_payload>(), size_of::<types::cuda_call_payload>()), (64, 64));
        assert_eq!((FIXED_BYTES, KERNEL_STACK_AT, RECORD_BYTES), (168, 168 + 512 * 8, 168 + 512 * 8 + 127 * 8));
        assert_eq!((SLOTS, USER_SLOTS), (512 + 127, 512));
        // Every payload fits the union, and starts where it does.
        for size in [
            size_of::<types::kernel_name_payload>(),
            size_of::<types::cupti_kernels_payload>(),
            size_of::<types::cupti_name_payload>(),
            size_of::<types::cupti_launch_payload>(),
            size_of::<types::cupti_status_payload>(),
            size_of::<types::offcpu_stack_payload>(),
            size_of::<types::offcpu_end_payload>(),
            size_of::<types::hooked_stack_payload>(),
        ] {
            assert!(size <= size_of::<types::event_payload>());
        }
        assert_eq!(offset_of!(types::event_payload, offcpu_end), 0);
        assert_eq!(size_of::<types::unwind_block>(), 16 * 6);
        assert_eq!(size_of::<types::unwind_rule>(), 8);
        assert_eq!(size_of::<types::exec_mapping>(), 32);
        assert_eq!(size_of::<types::process_info>(), 8 + 1024 * 32);
    }
}
