//! Typed forms of what the BPF programs send, decoded from the ring buffers.

use std::mem::size_of;

use crate::cuda::{CudaApi, CudaCall, GpuKernel, GpuKernelBatch, GpuKernelName, KernelName};
use crate::skel::types;

/// The outcome of the kernel stack read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackRead {
    /// Instruction pointers, leaf first: the sampled address, then return addresses.
    Frames(Vec<u64>),
    /// The read failed with this errno.
    Failed(i32),
}

impl StackRead {
    pub fn frames(&self) -> &[u64] {
        match self {
            StackRead::Frames(f) => f,
            StackRead::Failed(_) => &[],
        }
    }
}

/// Why the user stack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnwindStatus {
    /// Reached the outermost frame: the stack is complete.
    EndOfStack,
    /// Deeper than the unwinder walks.
    Truncated,
    /// The process's tables were not loaded yet.
    NoProcess,
    NoMapping,
    NoRow,
    BadCfa,
    ReadFault,
    KernelThread,
    /// A zero return address: the end of a stack whose outermost frame has no CFI marking.
    ZeroReturnAddress,
    /// The table of a file on the stack was not built yet; it was asked for.
    NoTableYet,
    /// Code without CFI whose caller neither frame pointer nor stack scan found.
    BadFrame,
    Unknown(u32),
}

impl UnwindStatus {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => UnwindStatus::EndOfStack,
            1 => UnwindStatus::Truncated,
            2 => UnwindStatus::NoProcess,
            3 => UnwindStatus::NoMapping,
            4 => UnwindStatus::NoRow,
            5 => UnwindStatus::BadCfa,
            6 => UnwindStatus::ReadFault,
            7 => UnwindStatus::KernelThread,
            8 => UnwindStatus::ZeroReturnAddress,
            9 => UnwindStatus::NoTableYet,
            10 => UnwindStatus::BadFrame,
            other => UnwindStatus::Unknown(other),
        }
    }

    /// Whether the stack reached its outermost frame.
    pub fn is_complete(self) -> bool {
        matches!(self, UnwindStatus::EndOfStack | UnwindStatus::ZeroReturnAddress | UnwindStatus::KernelThread)
    }
}

/// One frame of a user stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UserFrame {
    /// A native instruction pointer (the sampled address or a return address).
    Native(u64),
    /// A CPython frame: the code object's address in the process, a 16-bit tag of its name
    /// (length and hash) and its first line (to tell a reused address apart), and the last instruction
    /// (bytes up to 3.9, code units from 3.10).
    Python { code: u64, name_tag: u16, first_line: u32, lasti: u32 },
    /// Frames missing here: the native walk stopped early, and the Python frames that follow
    /// were read from the interpreter on their own.
    Gap,
}

const PY_FRAME_TAG: u64 = 1 << 63;
const PY_NAME_TAG_SHIFT: u32 = 47;
const PY_ADDR_MASK: u64 = (1 << PY_NAME_TAG_SHIFT) - 1;
const USER_GAP_MARK: u64 = PY_FRAME_TAG | 1;

/// The tag the walker gives a code object whose name string has `length ^ hash` (as
/// PyASCIIObject holds them; PY_NAME_TAG_SHIFT in events.h): user space checks it against the
/// object it reads later.
pub fn python_name_tag(length_xor_hash: u64) -> u16 {
    let x = length_xor_hash;
    ((x ^ (x >> 16) ^ (x >> 32) ^ (x >> 48)) & 0xffff) as u16
}

/// Splits the raw stack slots: a Python frame is two slots, the first tagged.
fn split_user_frames(slots: &[u64]) -> Vec<UserFrame> {
    let mut out = Vec::with_capacity(slots.len());
    let mut i = 0;
    while i < slots.len() {
        let v = slots[i];
        if v == USER_GAP_MARK {
            out.push(UserFrame::Gap);
            i += 1;
        } else if v & PY_FRAME_TAG != 0 {
            let second = slots.get(i + 1).copied().unwrap_or(0);
            out.push(UserFrame::Python {
                code: v & PY_ADDR_MASK,
                name_tag: ((v & !PY_FRAME_TAG) >> PY_NAME_TAG_SHIFT) as u16,
                first_line: (second >> 32) as u32,
                lasti: second as u32,
            });
            i += 2;
        } else {
            out.push(UserFrame::Native(v));
            i += 1;
        }
    }
    out
}

/// One CPU-clock sample as BPF recorded it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// CLOCK_BOOTTIME nanoseconds.
    pub timestamp_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: String,
    pub kernel_stack: StackRead,
    /// Leaf first; Python frames in place of the evaluation loop that ran them.
    pub user_stack: Vec<UserFrame>,
    pub unwind: UnwindStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEventKind {
    Exec,
    Exit,
    /// A sample met code the unwinder has no table for: the mappings should be read again.
    Unknown,
    /// A file was mapped executable (dlopen): new code, maybe a CUDA library to hook.
    MmapExec,
    /// A sample needs the unwind table of the file mapped at `addr`.
    NeedTable { addr: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEvent {
    pub pid: u32,
    pub kind: ProcessEventKind,
}

/// What the sampler's ring buffers deliver, in order of arrival per buffer.
#[derive(Debug, Clone)]
pub enum Event {
    Sample(Sample),
    Process(ProcessEvent),
    Cuda(CudaCall),
    KernelName(KernelName),
    GpuKernels(GpuKernelBatch),
    GpuKernelName(GpuKernelName),
}

/// # Safety
/// `T` must be plain old data (the generated BTF mirrors are).
pub(crate) unsafe fn read_pod<T: Copy>(data: &[u8]) -> Option<T> {
    if data.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked; the caller guarantees T is plain old data; read_unaligned
    // makes no alignment assumption.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) })
}

pub(crate) fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: viewing a Copy value as its bytes; the generated types have no padding holes that
    // the kernel would read as meaningful (they are zero-initialised by Default).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

const HEADER_BYTES: usize = std::mem::offset_of!(types::sample_event, user_stack);

/// Decodes a record of the `samples` ring: a CPU sample (full size), or a CUDA record, which ends
/// after the stack entries it uses.
pub(crate) fn decode_record(data: &[u8]) -> Option<Event> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let mut e: Box<types::sample_event> = Box::default();
    let n = data.len().min(size_of::<types::sample_event>());
    // SAFETY: sample_event is generated from BTF and plain old data; n bytes fit in it.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (&mut *e as *mut types::sample_event).cast::<u8>(), n) };
    let stack_room = (n - HEADER_BYTES) / size_of::<u64>();
    match e.kind {
        k if k == types::event_kind::EVENT_CPU_SAMPLE.0 => {
            (data.len() >= size_of::<types::sample_event>()).then(|| Event::Sample(sample_of(&e, stack_room, true)))
        }
        k if k == types::event_kind::EVENT_CUDA_CALL.0 => {
            let api = CudaApi::from_raw(e.api)?;
            Some(Event::Cuda(CudaCall {
                sample: sample_of(&e, stack_room, false),
                api,
                result: e.result,
                device: e.device,
                duration_ns: e.duration_ns,
                size: e.size,
                addr: e.addr,
                handle: e.aux,
                hook_ns: e.hook_ns,
            }))
        }
        k if k == types::event_kind::EVENT_CUDA_KERNEL.0 => {
            // SAFETY: viewing the u64 array as its bytes.
            let bytes: &[u8] = unsafe { std::slice::from_raw_parts(e.user_stack.as_ptr().cast::<u8>(), stack_room * 8) };
            let len = (e.size as usize).min(bytes.len());
            let name = String::from_utf8_lossy(&bytes[..len]).into_owned();
            Some(Event::KernelName(KernelName { pid: e.pid, handle: e.addr, name }))
        }
        k if k == types::event_kind::EVENT_CUPTI_KERNELS.0 => {
            // The records follow the header in the ring record itself, past a sample's size.
            let record = size_of::<types::cupti_kernel>();
            let bytes = &data[HEADER_BYTES..];
            let n = (e.user_frames as usize).min(bytes.len() / record);
            let kernels = bytes[..n * record]
                .chunks_exact(record)
                .filter_map(|c| {
                    // SAFETY: cupti_kernel is generated from BTF and plain old data.
                    let k: types::cupti_kernel = unsafe { read_pod(c)? };
                    Some(GpuKernel {
                        start: k.start,
                        end: k.end,
                        correlation: k.correlation,
                        device: k.device,
                        stream: k.stream,
                        name_id: k.name_id,
                        graph: k.graph,
                        graph_node: k.graph_node,
                    })
                })
                .collect();
            let comm = sample_of(&e, 0, false).comm;
            Some(Event::GpuKernels(GpuKernelBatch { pid: e.pid, comm, kernels, dropped_total: e.size }))
        }
        k if k == types::event_kind::EVENT_CUPTI_NAME.0 => {
            // SAFETY: viewing the u64 array as its bytes.
            let bytes: &[u8] = unsafe { std::slice::from_raw_parts(e.user_stack.as_ptr().cast::<u8>(), stack_room * 8) };
            let len = (e.size as usize).min(bytes.len());
            let name = String::from_utf8_lossy(&bytes[..len]).into_owned();
            Some(Event::GpuKernelName(GpuKernelName { pid: e.pid, id: e.addr as u32, name }))
        }
        _ => None,
    }
}

fn sample_of(e: &types::sample_event, stack_room: usize, with_kernel: bool) -> Sample {
    let comm_bytes: Vec<u8> = e.comm.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let user_frames = (e.user_frames as usize).min(stack_room).min(e.user_stack.len());
    Sample {
        timestamp_ns: e.timestamp_ns,
        pid: e.pid,
        tid: e.tid,
        cpu: e.cpu,
        comm: String::from_utf8_lossy(&comm_bytes).into_owned(),
        kernel_stack: if with_kernel { kernel_stack(&e.kernel_stack, e.kernel_stack_bytes) } else { StackRead::Frames(Vec::new()) },
        user_stack: split_user_frames(&e.user_stack[..user_frames]),
        unwind: UnwindStatus::from_raw(e.unwind_status),
    }
}

pub(crate) fn decode_process_event(data: &[u8]) -> Option<ProcessEvent> {
    // SAFETY: process_event is generated from BTF and plain old data.
    let e: types::process_event = unsafe { read_pod(data)? };
    let kind = match e.kind {
        0 => ProcessEventKind::Exec,
        1 => ProcessEventKind::Exit,
        2 => ProcessEventKind::Unknown,
        3 => ProcessEventKind::MmapExec,
        4 => ProcessEventKind::NeedTable { addr: e.addr },
        _ => return None,
    };
    Some(ProcessEvent { pid: e.pid, kind })
}

fn kernel_stack(frames: &[u64], bytes: i32) -> StackRead {
    if bytes < 0 {
        // An empty kernel part of a user-mode sample reads as EFAULT: no failure, no frames.
        if -bytes == libc::EFAULT {
            return StackRead::Frames(Vec::new());
        }
        return StackRead::Failed(-bytes);
    }
    let n = (bytes as usize / size_of::<u64>()).min(frames.len());
    StackRead::Frames(frames[..n].iter().copied().take_while(|&ip| ip != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_layout_matches_the_c_header() {
        // 88 bytes of fixed fields, the comm, 256 user frames, 127 kernel frames.
        assert_eq!(std::mem::offset_of!(types::sample_event, comm), 88);
        assert_eq!(std::mem::offset_of!(types::sample_event, user_stack), 104);
        assert_eq!(std::mem::offset_of!(types::sample_event, kernel_stack), 104 + 256 * 8);
        assert_eq!(size_of::<types::sample_event>(), 104 + 256 * 8 + 127 * 8);
        assert_eq!(size_of::<types::unwind_block>(), 16 * 6);
        assert_eq!(size_of::<types::unwind_rule>(), 8);
        assert_eq!(size_of::<types::exec_mapping>(), 32);
        assert_eq!(size_of::<types::process_info>(), 8 + 1024 * 32);
    }

    #[test]
    fn decodes_a_sample() {
        let mut e: Box<types::sample_event> = Box::default();
        e.pid = 42;
        e.tid = 43;
        e.comm[..3].copy_from_slice(&[b'f' as i8, b'o' as i8, b'o' as i8]);
        e.kernel_stack_bytes = -libc::EFAULT;
        e.user_stack[..2].copy_from_slice(&[0x1000, 0x2000]);
        e.user_frames = 2;
        e.unwind_status = 1;
        let Some(Event::Sample(s)) = decode_record(as_bytes(&*e)) else { panic!("not a sample") };
        assert_eq!((s.pid, s.tid, s.comm.as_str()), (42, 43, "foo"));
        assert_eq!(s.kernel_stack, StackRead::Frames(vec![]));
        assert_eq!(s.user_stack, vec![UserFrame::Native(0x1000), UserFrame::Native(0x2000)]);
        assert_eq!(s.unwind, UnwindStatus::Truncated);
        assert!(decode_record(&as_bytes(&*e)[..10]).is_none());
        assert!(decode_record(&as_bytes(&*e)[..200]).is_none(), "a CPU sample is never cut short");
    }

    #[test]
    fn decodes_a_cuda_record_cut_after_its_stack() {
        let mut e: Box<types::sample_event> = Box::default();
        e.kind = types::event_kind::EVENT_CUDA_CALL.0;
        e.pid = 42;
        e.api = types::cuda_api::CUDA_MALLOC.0;
        e.size = 4096;
        e.addr = 0x7000;
        e.user_stack[..3].copy_from_slice(&[0x10, 0x20, 0x30]);
        e.user_frames = 3;
        let Some(Event::Cuda(c)) = decode_record(&as_bytes(&*e)[..HEADER_BYTES + 3 * 8]) else { panic!("not a CUDA call") };
        assert_eq!((c.api, c.size, c.addr, c.sample.pid), (CudaApi::CudaMalloc, 4096, 0x7000, 42));
        assert_eq!(c.sample.user_stack, vec![UserFrame::Native(0x10), UserFrame::Native(0x20), UserFrame::Native(0x30)]);
        // A record that claims more frames than it carries keeps only those it carries.
        let Some(Event::Cuda(c)) = decode_record(&as_bytes(&*e)[..HEADER_BYTES + 8]) else { panic!() };
        assert_eq!(c.sample.user_stack.len(), 1);
    }

    #[test]
    fn python_frames_take_two_slots() {
        let slots = [0x1000, 0x7f00_0000_1000 | PY_FRAME_TAG | (0xbeef << PY_NAME_TAG_SHIFT), (41 << 32) | 12, USER_GAP_MARK, 0x2000];
        assert_eq!(
            split_user_frames(&slots),
            vec![
                UserFrame::Native(0x1000),
                UserFrame::Python { code: 0x7f00_0000_1000, name_tag: 0xbeef, first_line: 41, lasti: 12 },
                UserFrame::Gap,
                UserFrame::Native(0x2000)
            ]
        );
    }

    #[test]
    fn decodes_process_events() {
        let e = types::process_event { pid: 7, kind: 1, addr: 0 };
        assert_eq!(decode_process_event(as_bytes(&e)), Some(ProcessEvent { pid: 7, kind: ProcessEventKind::Exit }));
        let e = types::process_event { pid: 7, kind: 4, addr: 0x4000 };
        assert_eq!(decode_process_event(as_bytes(&e)), Some(ProcessEvent { pid: 7, kind: ProcessEventKind::NeedTable { addr: 0x4000 } }));
    }
}
