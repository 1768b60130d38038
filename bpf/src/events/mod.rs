//! Typed forms of what the BPF programs send, decoded from the ring buffers. A record of the
//! `samples` ring (struct event_record in events.h) is a header, how its stack came out, one
//! payload chosen by its kind, then its stack or what its kind carries there; each kind is decoded
//! in the module of its concern, from the payload's own generated struct.

mod cuda;
mod offcpu;
mod process;
mod sample;

use std::mem::{offset_of, size_of};

pub use offcpu::{OffCpuEnd, OffCpuStack, OffCpuState};
pub use process::{ProcessEvent, ProcessEventKind};
pub(crate) use process::decode_process_event;
pub use sample::{python_name_tag, LeafFile, Sample, StackRead, UnwindStatus, UserFrame};

use crate::cuda::{CudaCall, GpuKernelBatch, GpuKernelName, KernelName};
use crate::pod::{read_pod, Pod};
use crate::skel::types;

/// What the sampler's ring buffers deliver, in order of arrival per buffer.
#[derive(Debug, Clone)]
pub enum Event {
    OffCpu(OffCpuStack),
    OffCpuEnd(OffCpuEnd),
    Sample(Sample),
    Process(ProcessEvent),
    Cuda(CudaCall),
    KernelName(KernelName),
    GpuKernels(GpuKernelBatch),
    GpuKernelName(GpuKernelName),
}

const STACK_AT: usize = offset_of!(types::event_record, stack);
const PAYLOAD_AT: usize = offset_of!(types::event_record, payload);
/// Where the fixed part ends, and the stack (or a name, or kernel records) begins.
const FIXED_BYTES: usize = offset_of!(types::event_record, user_stack);
const KERNEL_STACK_AT: usize = offset_of!(types::event_record, kernel_stack);
const RECORD_BYTES: usize = size_of::<types::event_record>();
/// 8-byte slots after the fixed part of a whole record: the user stack's, then the kernel's.
const SLOTS: usize = (RECORD_BYTES - FIXED_BYTES) / size_of::<u64>();
const USER_SLOTS: usize = (KERNEL_STACK_AT - FIXED_BYTES) / size_of::<u64>();

/// A record of the `samples` ring whose fixed part is all there.
struct Record<'a> {
    header: types::event_header,
    stack: types::event_stack,
    data: &'a [u8],
}

impl<'a> Record<'a> {
    fn new(data: &'a [u8]) -> Option<Self> {
        if data.len() < FIXED_BYTES {
            return None;
        }
        Some(Record { header: read_pod(data)?, stack: read_pod(&data[STACK_AT..])?, data })
    }

    /// The payload, as the struct of the record's kind.
    fn payload<T: Pod>(&self) -> T {
        read_pod(&self.data[PAYLOAD_AT..]).expect("the fixed part holds every payload")
    }

    /// What follows the fixed part: a stack, a name, or kernel records.
    fn tail(&self) -> &'a [u8] {
        &self.data[FIXED_BYTES..]
    }

    /// The 8-byte slots after the fixed part, as many as the record carries, at most a whole
    /// record's.
    fn slots(&self) -> Vec<u64> {
        self.tail().chunks_exact(size_of::<u64>()).take(SLOTS).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect()
    }

    /// The `len` bytes of a name that follows the fixed part, as far as the record holds it.
    fn name(&self, len: u32) -> String {
        let bytes = self.tail();
        String::from_utf8_lossy(&bytes[..(len as usize).min(bytes.len())]).into_owned()
    }

    fn comm(&self) -> String {
        let bytes: Vec<u8> = self.header.comm.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Decodes a record of the `samples` ring. None: too short for its kind, or of a kind unknown.
pub(crate) fn decode_record(data: &[u8]) -> Option<Event> {
    use types::event_kind as kind;
    let r = Record::new(data)?;
    let k = r.header.kind;
    if k == kind::EVENT_CPU_SAMPLE.0 {
        sample::decode_cpu_sample(&r).map(Event::Sample)
    } else if k == kind::EVENT_CUDA_CALL.0 {
        cuda::decode_call(&r).map(Event::Cuda)
    } else if k == kind::EVENT_CUPTI_LAUNCH.0 {
        Some(Event::Cuda(cuda::decode_cupti_launch(&r)))
    } else if k == kind::EVENT_CUPTI_STATUS.0 {
        Some(Event::Cuda(cuda::decode_cupti_status(&r)))
    } else if k == kind::EVENT_CUDA_KERNEL.0 {
        Some(Event::KernelName(cuda::decode_kernel_name(&r)))
    } else if k == kind::EVENT_CUPTI_KERNELS.0 {
        Some(Event::GpuKernels(cuda::decode_cupti_kernels(&r)))
    } else if k == kind::EVENT_CUPTI_NAME.0 {
        Some(Event::GpuKernelName(cuda::decode_cupti_name(&r)))
    } else if k == kind::EVENT_OFFCPU_STACK.0 {
        Some(Event::OffCpu(offcpu::decode_stack(&r)))
    } else if k == kind::EVENT_OFFCPU_END.0 {
        Some(Event::OffCpuEnd(offcpu::decode_end(&r)))
    } else {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
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

    #[test]
    fn the_record_layout_is_the_c_one() {
        // A 40-byte header, 40 bytes of stack outcome, the largest payload (a CUDA call, 56),
        // then 512 user and 127 kernel frames. A CPU sample goes whole: its size is ring space.
        assert_eq!((size_of::<types::event_header>(), STACK_AT), (40, 40));
        assert_eq!((size_of::<types::event_stack>(), PAYLOAD_AT), (40, 80));
        assert_eq!((size_of::<types::event_payload>(), size_of::<types::cuda_call_payload>()), (56, 56));
        assert_eq!((FIXED_BYTES, KERNEL_STACK_AT, RECORD_BYTES), (136, 136 + 512 * 8, 136 + 512 * 8 + 127 * 8));
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
        ] {
            assert!(size <= size_of::<types::event_payload>());
        }
        assert_eq!(offset_of!(types::event_payload, offcpu_end), 0);
        assert_eq!(size_of::<types::unwind_block>(), 16 * 6);
        assert_eq!(size_of::<types::unwind_rule>(), 8);
        assert_eq!(size_of::<types::exec_mapping>(), 32);
        assert_eq!(size_of::<types::process_info>(), 8 + 1024 * 32);
    }

    #[test]
    fn short_or_unknown_records_are_not_decoded() {
        let h = header(types::event_kind::EVENT_OFFCPU_END, 1, 1, "x");
        let data = record(h, types::event_stack::default(), &types::offcpu_end_payload::default(), &[]);
        assert!(decode_record(&data).is_some());
        assert!(decode_record(&data[..FIXED_BYTES - 1]).is_none());
        let unknown = record(types::event_header { kind: 99, ..h }, types::event_stack::default(), &0u64, &[]);
        assert!(decode_record(&unknown).is_none());
    }
}
