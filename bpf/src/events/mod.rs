//! Typed forms of what the BPF programs send, decoded from the ring buffers. A record of the
//! `samples` ring (struct event_record in events.h) is a header, how its stack came out, one
//! payload chosen by its kind, then its stack or what its kind carries there; each kind is decoded
//! in the module of its concern, from the payload's own generated struct.

mod cuda;
mod hooked;
mod memory;
mod offcpu;
mod process;
pub(crate) mod record;
mod sample;
mod stack_copy;

pub use cuda::{CudaCall, CuptiLaunch, CuptiStatus, GpuKernel, GpuKernelBatch, GpuKernelName, KernelName};
pub use hooked::HookedStack;
pub use memory::{LiveKind, MemoryChange, MemoryEvent};
pub use offcpu::{OffCpuEnd, OffCpuStack, OffCpuState};
pub use process::{ProcessEvent, ProcessEventKind};
pub(crate) use process::decode_process_event;
pub use sample::{python_name_tag, LeafFile, Sample, StackRead, UnwindStatus, UserFrame};
pub use stack_copy::{StackCopy, STACK_COPY_BYTES, STACK_COPY_RECORD_BYTES};
pub(crate) use stack_copy::CopiesAwaitingSamples;

use record::Record;
use crate::skel::types;

/// What the sampler's ring buffers deliver, in order of arrival per buffer.
#[derive(Debug, Clone)]
pub enum Event {
    OffCpu(OffCpuStack),
    OffCpuEnd(OffCpuEnd),
    Sample(Sample),
    Process(ProcessEvent),
    Cuda(CudaCall),
    CuptiLaunch(CuptiLaunch),
    CuptiStatus(CuptiStatus),
    KernelName(KernelName),
    GpuKernels(GpuKernelBatch),
    GpuKernelName(GpuKernelName),
    HookedStack(HookedStack),
    /// An allocation or free of the live set of device memory.
    Memory(MemoryEvent),
}

/// Decodes a record of the `samples` ring, a stack copy kept until its sample comes. None: a copy,
/// or a record too short for its kind or of a kind unknown (`Err` then).
pub(crate) fn decode_ring_record(data: &[u8], copies: &mut CopiesAwaitingSamples) -> Result<Option<Event>, ()> {
    // The compact records are no event_record: their kind, the first word, says so.
    if record_kind(data) == Some(types::event_kind::EVENT_MEMORY.0) {
        return memory::decode(data).map(|m| Some(Event::Memory(m))).ok_or(());
    }
    let r = Record::new(data).ok_or(())?;
    if r.header.kind == types::event_kind::EVENT_STACK_COPY.0 {
        copies.copy(r.header.tid, r.header.timestamp_ns, stack_copy::decode(&r));
        return Ok(None);
    }
    let mut event = decode_record(data).ok_or(())?;
    if let Event::Sample(s) = &mut event {
        if r.stack.flags & types::stack_flags::STACK_COPIED.0 != 0 {
            s.stack_copy = copies.take(s.tid, s.timestamp_ns).map(Box::new);
        }
    }
    Ok(Some(event))
}

/// The kind of a record of the `samples` ring: its first word, whatever its layout.
fn record_kind(data: &[u8]) -> Option<u32> {
    data.get(..4).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes)
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
        Some(Event::CuptiLaunch(cuda::decode_cupti_launch(&r)))
    } else if k == kind::EVENT_CUPTI_STATUS.0 {
        Some(Event::CuptiStatus(cuda::decode_cupti_status(&r)))
    } else if k == kind::EVENT_CUDA_KERNEL.0 {
        Some(Event::KernelName(cuda::decode_kernel_name(&r)))
    } else if k == kind::EVENT_CUPTI_KERNELS.0 {
        Some(Event::GpuKernels(cuda::decode_cupti_kernels(&r)))
    } else if k == kind::EVENT_CUPTI_NAME.0 {
        Some(Event::GpuKernelName(cuda::decode_cupti_name(&r)))
    } else if k == kind::EVENT_HOOKED_STACK.0 {
        Some(Event::HookedStack(hooked::decode(&r)))
    } else if k == kind::EVENT_OFFCPU_STACK.0 {
        Some(Event::OffCpu(offcpu::decode_stack(&r)))
    } else if k == kind::EVENT_OFFCPU_END.0 {
        Some(Event::OffCpuEnd(offcpu::decode_end(&r)))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::CudaApi;
    use record::tests::{header, record};
    use record::{FIXED_BYTES, SLOTS};

    /// A record of `kind` from process 1, decoded.
    fn decoded<P: Copy>(kind: types::event_kind, payload: &P, tail: &[u64]) -> Option<Event> {
        decode_record(&record(header(kind, 1, 1, "x"), types::event_stack::default(), payload, tail))
    }

    // The decoders' own tests read records of their kinds by themselves: here, that each kind
    // reaches its decoder.
    #[test]
    fn every_kind_is_decoded_as_its_event() {
        use types::event_kind as kind;
        // A CPU sample is never cut short: it comes with all its slots.
        assert!(matches!(decoded(kind::EVENT_CPU_SAMPLE, &[0u8; 0], &[0; SLOTS]), Some(Event::Sample(_))));
        let call = types::cuda_call_payload { api: types::cuda_api::CUDA_MALLOC.0, ..Default::default() };
        assert!(matches!(decoded(kind::EVENT_CUDA_CALL, &call, &[]), Some(Event::Cuda(c)) if c.api == CudaApi::CudaMalloc));
        let launch = types::cupti_launch_payload::default();
        assert!(matches!(decoded(kind::EVENT_CUPTI_LAUNCH, &launch, &[]), Some(Event::CuptiLaunch(_))));
        let status = types::cupti_status_payload::default();
        assert!(matches!(decoded(kind::EVENT_CUPTI_STATUS, &status, &[]), Some(Event::CuptiStatus(_))));
        let name = types::kernel_name_payload::default();
        assert!(matches!(decoded(kind::EVENT_CUDA_KERNEL, &name, &[]), Some(Event::KernelName(_))));
        let kernels = types::cupti_kernels_payload::default();
        assert!(matches!(decoded(kind::EVENT_CUPTI_KERNELS, &kernels, &[]), Some(Event::GpuKernels(_))));
        let name = types::cupti_name_payload::default();
        assert!(matches!(decoded(kind::EVENT_CUPTI_NAME, &name, &[]), Some(Event::GpuKernelName(_))));
        let stack = types::offcpu_stack_payload::default();
        assert!(matches!(decoded(kind::EVENT_OFFCPU_STACK, &stack, &[]), Some(Event::OffCpu(_))));
        let end = types::offcpu_end_payload::default();
        assert!(matches!(decoded(kind::EVENT_OFFCPU_END, &end, &[]), Some(Event::OffCpuEnd(_))));
    }

    #[test]
    fn a_stack_copy_goes_with_the_sample_of_its_thread_and_time() {
        use types::event_kind as k;
        let mut copies = CopiesAwaitingSamples::default();
        let payload = types::stack_copy_payload { ip: 0x1000, sp: 0x7000, bytes: 16, adjust: 1, ..Default::default() };
        let copy = record(header(k::EVENT_STACK_COPY, 1, 7, "x"), types::event_stack::default(), &payload, &[1, 2, 3]);
        assert!(matches!(decode_ring_record(&copy, &mut copies), Ok(None)));
        let stack = types::event_stack { flags: types::stack_flags::STACK_COPIED.0, ..Default::default() };
        let sample = record(header(k::EVENT_CPU_SAMPLE, 1, 7, "x"), stack, &[0u8; 0], &[0; SLOTS]);
        let Ok(Some(Event::Sample(s))) = decode_ring_record(&sample, &mut copies) else { panic!("not a sample") };
        let c = s.stack_copy.expect("paired");
        assert_eq!((c.start.ip, c.start.sp, c.start.adjust, c.bytes.len()), (0x1000, 0x7000, true, 16));
        assert_eq!(c.base(), 0x7000 - 128);
        // Another thread's sample, or one sent later, does not take it.
        assert!(matches!(decode_ring_record(&copy, &mut copies), Ok(None)));
        let other = record(header(k::EVENT_CPU_SAMPLE, 1, 8, "x"), stack, &[0u8; 0], &[0; SLOTS]);
        assert!(matches!(decode_ring_record(&other, &mut copies), Ok(Some(Event::Sample(s))) if s.stack_copy.is_none()));
        let later = record(types::event_header { timestamp_ns: 9999, ..header(k::EVENT_CPU_SAMPLE, 1, 7, "x") }, stack, &[0u8; 0], &[0; SLOTS]);
        assert!(matches!(decode_ring_record(&later, &mut copies), Ok(Some(Event::Sample(s))) if s.stack_copy.is_none()));
        assert_eq!(copies.unpaired, 1);
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
