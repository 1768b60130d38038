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
    /// In execve: the registers belong to the program that called it; no user stack is taken.
    InExec,
    Unknown(u32),
}

impl UnwindStatus {
    fn from_raw(v: u32) -> Self {
        use types::unwind_status as raw;
        // The C enum's names, from the object's BTF: a renumbering there cannot go unnoticed here.
        let known = [
            (raw::UNWIND_END_OF_STACK, UnwindStatus::EndOfStack),
            (raw::UNWIND_TRUNCATED, UnwindStatus::Truncated),
            (raw::UNWIND_NO_PROCESS, UnwindStatus::NoProcess),
            (raw::UNWIND_NO_MAPPING, UnwindStatus::NoMapping),
            (raw::UNWIND_NO_ROW, UnwindStatus::NoRow),
            (raw::UNWIND_BAD_CFA, UnwindStatus::BadCfa),
            (raw::UNWIND_READ_FAULT, UnwindStatus::ReadFault),
            (raw::UNWIND_KERNEL_THREAD, UnwindStatus::KernelThread),
            (raw::UNWIND_ZERO_RA, UnwindStatus::ZeroReturnAddress),
            (raw::UNWIND_NO_TABLE_YET, UnwindStatus::NoTableYet),
            (raw::UNWIND_BAD_FRAME, UnwindStatus::BadFrame),
            (raw::UNWIND_IN_EXEC, UnwindStatus::InExec),
        ];
        known.iter().find(|(r, _)| r.0 == v).map_or(UnwindStatus::Unknown(v), |&(_, s)| s)
    }

    /// Whether the sample has a user stack to speak of (not a kernel thread, not in execve).
    pub fn has_user_stack(self) -> bool {
        !matches!(self, UnwindStatus::KernelThread | UnwindStatus::InExec)
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
    /// The file under the user leaf, taken when the unwinder knew neither the process nor the
    /// mapping: what names the leaf of a process gone before its maps could be read.
    pub leaf_file: Option<LeafFile>,
}

/// A file by identity, and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeafFile {
    /// As `stat` gives them (st_dev, st_ino, st_size).
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub offset: u64,
}

impl LeafFile {
    /// From the kernel's `dev_t` (12-bit major above a 20-bit minor) to user space's encoding.
    fn from_kernel(dev: u32, ino: u64, size: u64, offset: u64) -> Self {
        let (major, minor) = (dev >> 20, dev & 0xf_ffff);
        LeafFile { dev: libc::makedev(major, minor), ino, size, offset }
    }
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
    /// The wait's number within its thread.
    pub wait: u64,
    pub state: OffCpuState,
}

/// A wait of a thread ended.
#[derive(Debug, Clone)]
pub struct OffCpuEnd {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The [`OffCpuStack`] it belongs to; 0 when this wait was not unwound.
    pub wait: u64,
    /// Its time off the CPU.
    pub duration_ns: u64,
    /// Time off the CPU of this thread's waits that were not unwound, since its last record.
    pub not_unwound_ns: u64,
}

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
        k if k == types::event_kind::EVENT_OFFCPU_STACK.0 => {
            // The kernel frames follow the used user slots directly.
            let slots: &[u64] = {
                // SAFETY: user_stack and kernel_stack are adjacent u64 arrays of the record, which
                // is repr(C) plain old data; the view stays within the struct.
                let all = unsafe { std::slice::from_raw_parts(e.user_stack.as_ptr(), e.user_stack.len() + e.kernel_stack.len()) };
                &all[..stack_room.min(all.len())]
            };
            let users = (e.user_frames as usize).min(slots.len()).min(e.user_stack.len());
            let kernel_bytes = e.kernel_stack_bytes.max(0) as usize;
            let kernel_end = (users + kernel_bytes / size_of::<u64>()).min(slots.len());
            let mut sample = sample_of(&e, users, false);
            sample.kernel_stack = StackRead::Frames(slots[users..kernel_end].iter().copied().take_while(|&ip| ip != 0).collect());
            Some(Event::OffCpu(OffCpuStack { sample, wait: e.addr, state: OffCpuState::from_raw(e.api) }))
        }
        k if k == types::event_kind::EVENT_OFFCPU_END.0 => {
            let comm = sample_of(&e, 0, false).comm;
            Some(Event::OffCpuEnd(OffCpuEnd { pid: e.pid, tid: e.tid, comm, wait: e.addr, duration_ns: e.duration_ns, not_unwound_ns: e.aux }))
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
        leaf_file: (e.leaf_ino != 0).then(|| LeafFile::from_kernel(e.leaf_dev, e.leaf_ino, e.leaf_size, e.leaf_offset)),
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
        // 120 bytes of fixed fields (88, and the leaf's file: 32), the comm, 512 user frames, 127
        // kernel frames.
        assert_eq!(std::mem::offset_of!(types::sample_event, leaf_ino), 88);
        assert_eq!(std::mem::offset_of!(types::sample_event, comm), 120);
        assert_eq!(std::mem::offset_of!(types::sample_event, user_stack), 136);
        assert_eq!(std::mem::offset_of!(types::sample_event, kernel_stack), 136 + 512 * 8);
        assert_eq!(size_of::<types::sample_event>(), 136 + 512 * 8 + 127 * 8);
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
        // The file under the leaf, in the kernel's dev_t encoding (major 8, minor 1: sda1).
        e.leaf_ino = 77;
        e.leaf_size = 4096;
        e.leaf_offset = 0x1234;
        e.leaf_dev = (8 << 20) | 1;
        let Some(Event::Sample(s)) = decode_record(as_bytes(&*e)) else { panic!("not a sample") };
        assert_eq!(s.leaf_file, Some(LeafFile { dev: libc::makedev(8, 1), ino: 77, size: 4096, offset: 0x1234 }));
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
    fn decodes_an_off_cpu_stack_with_its_kernel_frames_after_the_user_ones() {
        let mut e: Box<types::sample_event> = Box::default();
        e.kind = types::event_kind::EVENT_OFFCPU_STACK.0;
        e.pid = 42;
        e.tid = 44;
        e.api = 1;
        e.addr = 7;
        e.user_stack[..4].copy_from_slice(&[0x10, 0x20, 0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]);
        e.user_frames = 2;
        e.kernel_stack_bytes = 16;
        let Some(Event::OffCpu(o)) = decode_record(&as_bytes(&*e)[..HEADER_BYTES + 4 * 8]) else { panic!("not an off-CPU stack") };
        assert_eq!((o.wait, o.state, o.sample.tid), (7, OffCpuState::Sleeping, 44));
        assert_eq!(o.sample.user_stack, vec![UserFrame::Native(0x10), UserFrame::Native(0x20)]);
        assert_eq!(o.sample.kernel_stack, StackRead::Frames(vec![0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]));
        // A record cut short keeps what it carries.
        let Some(Event::OffCpu(o)) = decode_record(&as_bytes(&*e)[..HEADER_BYTES + 3 * 8]) else { panic!() };
        assert_eq!(o.sample.kernel_stack.frames().len(), 1);
        e.kind = types::event_kind::EVENT_OFFCPU_END.0;
        e.duration_ns = 5_000_000;
        e.aux = 300;
        let Some(Event::OffCpuEnd(end)) = decode_record(&as_bytes(&*e)[..HEADER_BYTES]) else { panic!("not an off-CPU end") };
        assert_eq!((end.tid, end.wait, end.duration_ns, end.not_unwound_ns), (44, 7, 5_000_000, 300));
        assert_eq!(OffCpuState::from_raw(0), OffCpuState::Preempted);
        assert_eq!(OffCpuState::from_raw(0x102), OffCpuState::Uninterruptible);
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
