//! The CUDA hooks' records: calls that returned, kernel names, and what gpuflame's CUPTI injection
//! library passes on: its launches (a correlation id with the launch's stack), its status, its
//! kernels' times and names. One type per kind of record, as in events.h.

use super::record::Record;
use super::sample::{sample_of, Sample, StackRead};
use crate::calibrate::HookTraps;
use crate::cuda::{CudaApi, CudaClass};
use crate::pod::read_pod;
use crate::skel::types;

/// A kernel's execution on the device, as CUPTI recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuKernel {
    /// Device timestamps, ns.
    pub start: u64,
    pub end: u64,
    /// The id CUPTI gave the launch (a graph launch's kernels share it).
    pub correlation: u32,
    pub device: u32,
    pub stream: u32,
    /// The kernel's name, numbered by the injection library ([`GpuKernelName`]); 0 is unknown.
    pub name_id: u32,
    pub graph: u32,
    pub graph_node: u64,
}

/// Kernel records of one process, in the order CUPTI delivered them.
#[derive(Debug, Clone)]
pub struct GpuKernelBatch {
    pub pid: u32,
    pub comm: String,
    pub kernels: Vec<GpuKernel>,
    /// Records the injection library dropped to its rate bound so far.
    pub dropped_total: u64,
}

/// The name behind a kernel name id of the injection library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuKernelName {
    pub pid: u32,
    pub id: u32,
    pub name: String,
}

/// The return of an outermost hooked call.
#[derive(Debug, Clone)]
pub struct CudaCall {
    /// Who called, when (at return), and the caller's stack; no kernel part.
    pub sample: Sample,
    pub api: CudaApi,
    /// The CUresult or cudaError_t: 0 is success.
    pub result: i32,
    pub device: u32,
    pub duration_ns: u64,
    /// Bytes asked for (allocations, cuMemMap/cuMemUnmap).
    pub size: u64,
    /// The device pointer or handle allocated or freed; the address mapped; the kernel launched.
    pub addr: u64,
    /// cuMemMap: the handle mapped at `addr`.
    pub handle: u64,
    /// What the hooks' programs took, unwinding included: the return's, the entry's, and the
    /// entries of the hooked calls nested in it. Part of what hooking cost.
    pub hook_ns: u64,
    /// How its hooks trapped: the rest of what hooking cost.
    pub traps: HookTraps,
    /// A segment (cudaMalloc and the like) that PyTorch's caching allocator asked for while a
    /// hooked tensor allocation was under way.
    pub in_allocator: bool,
    /// A tensor whose stack byte sampling passed over ([`crate::SamplerConfig::tensor_sample_bytes`]):
    /// counted, with no stack.
    pub stack_sampled_out: bool,
    /// A successful allocation: the id of its stack, by which the live set and the memory
    /// records know it ([`crate::LiveAllocation::stack`]).
    pub stack_id: u64,
}

impl CudaCall {
    /// An allocation that failed for lack of memory, and that nothing retries: PyTorch's
    /// allocator's report, or a CUDA allocation made outside it that returned out-of-memory. The
    /// programs hold the process's frees in the live set from then on (live_allocations.h),
    /// until [`crate::BpfPrograms::live_at_oom`] reads it.
    pub fn is_out_of_memory(&self) -> bool {
        match self.api.class() {
            CudaClass::TensorOom => true,
            CudaClass::Alloc => self.result == 2 && !self.in_allocator,
            _ => false,
        }
    }
}

/// A launch as CUPTI's callback saw it inside the injection library (EVENT_CUPTI_LAUNCH): the id
/// that its kernels' records will carry, with the launch's stack.
#[derive(Debug, Clone)]
pub struct CuptiLaunch {
    /// The launching thread, and its stack from inside the callback.
    pub sample: Sample,
    pub correlation: u32,
    /// CUPTI's id of the API function that launched.
    pub callback: u32,
}

/// What the injection library said of itself (EVENT_CUPTI_STATUS): ready, waiting for gpuflame
/// at CUDA's initialisation, or why it has no GPU time.
#[derive(Debug, Clone)]
pub struct CuptiStatus {
    pub pid: u32,
    pub comm: String,
    pub code: i32,
    /// The address of the word it waits on, in its memory, while it waits.
    pub ready_word: u64,
}

/// A kernel handle that cuModuleGetFunction returned, and the kernel's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelName {
    pub pid: u32,
    pub handle: u64,
    pub name: String,
}

/// EVENT_CUDA_CALL: cut after the caller's user stack, which has no kernel part.
pub(super) fn decode_call(r: &Record) -> Option<CudaCall> {
    let types::cuda_call_payload { api, result, device, flags, duration_ns, size, addr, handle, hook_ns, stack_id } = r.payload();
    Some(CudaCall {
        sample: sample_of(r, &r.slots(), StackRead::Frames(Vec::new())),
        api: CudaApi::from_raw(api)?,
        result,
        device,
        duration_ns,
        size,
        addr,
        handle,
        hook_ns,
        traps: HookTraps {
            stepped: flags & STEPPED != 0,
            nested: (flags >> NESTED_SHIFT) & NESTED_MAX,
            nested_stepped: (flags >> NESTED_STEPPED_SHIFT) & NESTED_MAX,
        },
        in_allocator: flags & IN_ALLOCATOR != 0,
        stack_sampled_out: flags & SAMPLED_OUT != 0,
        stack_id,
    })
}

const IN_ALLOCATOR: u32 = types::cuda_call_flags::CUDA_CALL_IN_ALLOCATOR.0 as u32;
const STEPPED: u32 = types::cuda_call_flags::CUDA_CALL_STEPPED.0 as u32;
const SAMPLED_OUT: u32 = types::cuda_call_flags::CUDA_CALL_SAMPLED_OUT.0 as u32;
const NESTED_SHIFT: u32 = types::cuda_call_flags::CUDA_CALL_NESTED_SHIFT.0 as u32;
const NESTED_STEPPED_SHIFT: u32 = types::cuda_call_flags::CUDA_CALL_NESTED_STEPPED_SHIFT.0 as u32;
const NESTED_MAX: u32 = types::cuda_call_flags::CUDA_CALL_NESTED_MAX.0 as u32;

/// EVENT_CUPTI_LAUNCH: a call of the injection library's launch function, with the stack of the
/// launch.
pub(super) fn decode_cupti_launch(r: &Record) -> CuptiLaunch {
    let types::cupti_launch_payload { correlation, callback } = r.payload();
    CuptiLaunch { sample: sample_of(r, &r.slots(), StackRead::Frames(Vec::new())), correlation, callback }
}

/// EVENT_CUPTI_STATUS: a call of the injection library's status function, without a stack.
pub(super) fn decode_cupti_status(r: &Record) -> CuptiStatus {
    let types::cupti_status_payload { code, _pad: _, ready_word } = r.payload();
    CuptiStatus { pid: r.header.pid, comm: r.comm(), code, ready_word }
}

/// EVENT_CUDA_KERNEL: the handle, and the name after the fixed part.
pub(super) fn decode_kernel_name(r: &Record) -> KernelName {
    let types::kernel_name_payload { handle, name_len, _pad: _ } = r.payload();
    KernelName { pid: r.header.pid, handle, name: r.name(name_len) }
}

/// EVENT_CUPTI_NAME: the id, and the name after the fixed part.
pub(super) fn decode_cupti_name(r: &Record) -> GpuKernelName {
    let types::cupti_name_payload { id, name_len } = r.payload();
    GpuKernelName { pid: r.header.pid, id, name: r.name(name_len) }
}

/// EVENT_CUPTI_KERNELS: the kernel records after the fixed part, in a record of their own size.
pub(super) fn decode_cupti_kernels(r: &Record) -> GpuKernelBatch {
    let types::cupti_kernels_payload { count, _pad: _, dropped_total } = r.payload();
    let kernels = r
        .tail()
        .chunks_exact(size_of::<types::cupti_kernel>())
        .take(count as usize)
        .filter_map(read_pod::<types::cupti_kernel>)
        .map(|k| {
            let types::cupti_kernel { start, end, correlation, device, stream, name_id, graph, pad: _, graph_node } = k;
            GpuKernel { start, end, correlation, device, stream, name_id, graph, graph_node }
        })
        .collect();
    GpuKernelBatch { pid: r.header.pid, comm: r.comm(), kernels, dropped_total }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::record::tests::{decoded, header, record};
    use crate::events::sample::UserFrame;
    use crate::pod::as_bytes;

    #[test]
    fn decodes_a_cuda_record_cut_after_its_stack() {
        let h = header(types::event_kind::EVENT_CUDA_CALL, 42, 42, "trainer");
        let stack = types::event_stack { user_frames: 3, ..Default::default() };
        let payload = types::cuda_call_payload {
            api: types::cuda_api::CUDA_MALLOC.0,
            result: 2,
            device: 1,
            flags: 1 | 2 | (2 << 8) | (1 << 16),
            duration_ns: 500,
            size: 4096,
            addr: 0x7000,
            handle: 9,
            hook_ns: 30,
            stack_id: 77,
        };
        let data = record(h, stack, &payload, &[0x10, 0x20, 0x30]);
        let Some(c) = decoded(&data, decode_call) else { panic!("not a CUDA call") };
        assert_eq!((c.api, c.result, c.device, c.duration_ns), (CudaApi::CudaMalloc, 2, 1, 500));
        assert_eq!((c.size, c.addr, c.handle, c.hook_ns, c.sample.pid, c.stack_id), (4096, 0x7000, 9, 30, 42, 77));
        assert_eq!((c.in_allocator, c.traps), (true, HookTraps { stepped: true, nested: 2, nested_stepped: 1 }));
        assert_eq!(c.sample.user_stack, vec![UserFrame::Native(0x10), UserFrame::Native(0x20), UserFrame::Native(0x30)]);
        assert_eq!(c.sample.kernel_stack, StackRead::Frames(vec![]));
        // A record that claims more frames than it carries keeps only those it carries.
        let Some(c) = decoded(&data[..data.len() - 16], decode_call) else { panic!() };
        assert_eq!(c.sample.user_stack.len(), 1);
        // An api the hooks do not know is no call.
        let data = record(h, stack, &types::cuda_call_payload { api: 0, ..payload }, &[]);
        assert!(decoded(&data, decode_call).is_none());
    }

    #[test]
    fn the_injection_library_s_launch_and_status_are_records_of_their_own() {
        let h = header(types::event_kind::EVENT_CUPTI_LAUNCH, 42, 43, "trainer");
        let stack = types::event_stack { user_frames: 1, ..Default::default() };
        let data = record(h, stack, &types::cupti_launch_payload { correlation: 77, callback: 13 }, &[0x10]);
        let Some(c) = decoded(&data, |r| Some(decode_cupti_launch(r))) else { panic!("not a launch") };
        assert_eq!((c.correlation, c.callback, c.sample.tid), (77, 13, 43));
        assert_eq!(c.sample.user_stack, vec![UserFrame::Native(0x10)]);
        let h = header(types::event_kind::EVENT_CUPTI_STATUS, 42, 43, "trainer");
        let data = record(h, Default::default(), &types::cupti_status_payload { code: 4, _pad: 0, ready_word: 0x5000 }, &[]);
        let Some(c) = decoded(&data, |r| Some(decode_cupti_status(r))) else { panic!("not a status") };
        assert_eq!((c.pid, c.comm.as_str(), c.code, c.ready_word), (42, "trainer", 4, 0x5000));
    }

    #[test]
    fn decodes_names_after_the_fixed_part() {
        let name = |s: &str| {
            let mut slots = vec![0u64; 32];
            // SAFETY: viewing the u64s as their bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<u8>(), 256) };
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            slots
        };
        let h = header(types::event_kind::EVENT_CUDA_KERNEL, 42, 42, "trainer");
        let data = record(h, Default::default(), &types::kernel_name_payload { handle: 0xf00d, name_len: 4, _pad: 0 }, &name("gemm"));
        let Some(k) = decoded(&data, |r| Some(decode_kernel_name(r))) else { panic!("not a kernel name") };
        assert_eq!(k, KernelName { pid: 42, handle: 0xf00d, name: "gemm".into() });
        let h = header(types::event_kind::EVENT_CUPTI_NAME, 42, 42, "trainer");
        let data = record(h, Default::default(), &types::cupti_name_payload { id: 3, name_len: 10 }, &name("flash_attn"));
        let Some(n) = decoded(&data, |r| Some(decode_cupti_name(r))) else { panic!("not a kernel name id") };
        assert_eq!(n, GpuKernelName { pid: 42, id: 3, name: "flash_attn".into() });
    }

    #[test]
    fn decodes_kernel_records_up_to_their_count() {
        let k = |correlation| types::cupti_kernel { start: 1, end: 2, correlation, device: 0, stream: 7, name_id: 3, graph: 0, pad: 0, graph_node: 0 };
        let h = header(types::event_kind::EVENT_CUPTI_KERNELS, 42, 42, "trainer");
        let mut data = record(h, Default::default(), &types::cupti_kernels_payload { count: 2, _pad: 0, dropped_total: 5 }, &[]);
        for c in [77, 78, 79] {
            data.extend_from_slice(as_bytes(&k(c)));
        }
        let Some(b) = decoded(&data, |r| Some(decode_cupti_kernels(r))) else { panic!("not kernel records") };
        assert_eq!((b.pid, b.comm.as_str(), b.dropped_total), (42, "trainer", 5));
        assert_eq!(b.kernels.iter().map(|k| k.correlation).collect::<Vec<_>>(), vec![77, 78]);
    }
}
