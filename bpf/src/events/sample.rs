//! CPU samples, and the stack of every kind of record that has one: who, where, and how far the
//! unwinder got.

use std::mem::size_of;

use super::record::{Record, KERNEL_STACK_AT, RECORD_BYTES, USER_SLOTS};
use super::stack_copy::StackCopy;
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
    /// After a gap in a sample whose stack was copied: the Python frames before this ran in one
    /// call of the evaluation loop, whose native frame holds `shim` (3.12+; 0 before).
    CallEnd { shim: u64 },
}

// The slots' tags, from the BPF object's own enum (python_layouts.h), as the walker writes them.
const PY_FRAME_TAG: u64 = 1 << types::frame_tag::FRAME_TAG_PYTHON_BIT.0;
const PY_NAME_TAG_SHIFT: u32 = types::frame_tag::FRAME_TAG_NAME_SHIFT.0;
const PY_ADDR_MASK: u64 = (1 << PY_NAME_TAG_SHIFT) - 1;
const USER_GAP_MARK: u64 = PY_FRAME_TAG | types::frame_tag::FRAME_TAG_GAP.0 as u64;
const PY_CALL_MARK: u64 = PY_FRAME_TAG | types::frame_tag::FRAME_TAG_PY_CALL.0 as u64;

/// The tag the walker gives a code object whose name string has `length ^ hash` (as
/// PyASCIIObject holds them; FRAME_TAG_NAME_SHIFT in python_layouts.h): user space checks it against the
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
        } else if v == PY_CALL_MARK {
            out.push(UserFrame::CallEnd { shim: slots.get(i + 1).copied().unwrap_or(0) });
            i += 2;
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
    /// The parent whose mappings, copied when the process forked, the unwinder walked it with:
    /// a child that has not exec'd (nor mapped code of its own) since. Its frames are named from
    /// what was read of that parent, not from the process's own maps, which may be a new
    /// program's by now.
    pub forked_from: Option<u32>,
    /// Frames in code that no mapping read from /proc covered were unwound with the table of
    /// their file, found by its identity (the first milliseconds of a program, a library just
    /// mapped): they can be named only once the process's maps are read.
    pub by_file: bool,
    /// The stack above the frame where the walk stopped for want of a table, for user space to
    /// finish once the table is in; or, from the leaf, the copy the unwinder's oracle checks.
    pub stack_copy: Option<Box<StackCopy>>,
}

/// A file by identity, and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeafFile {
    /// As `stat` gives them (st_dev, st_ino, st_size).
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub offset: u64,
    /// The leaf's mapping, [begin, end): every address in it is in this file, at `offset` plus
    /// its distance from the leaf. (0, 0) when not taken.
    pub vma: (u64, u64),
}

impl LeafFile {
    /// From the kernel's `dev_t` (12-bit major above a 20-bit minor) to user space's encoding.
    fn from_kernel(dev: u32, ino: u64, size: u64, offset: u64, vma: (u64, u64)) -> Self {
        let (major, minor) = (dev >> 20, dev & 0xf_ffff);
        LeafFile { dev: libc::makedev(major, minor), ino, size, offset, vma }
    }

    /// The offset in the file of `addr`, an address in the leaf's mapping, when the leaf was at
    /// `leaf`.
    pub fn offset_of(&self, leaf: u64, addr: u64) -> Option<u64> {
        (self.vma.0 <= addr && addr < self.vma.1).then(|| self.offset.wrapping_add(addr.wrapping_sub(leaf)))
    }
}

/// A record whose kernel frames follow its user frames in one array (off-CPU stacks, hooked
/// stacks: no room is sent for a user stack shorter than the most), as a sample.
pub(super) fn sample_with_kernel_after_user(r: &Record) -> Sample {
    let slots = r.slots();
    let users = (r.stack.user_frames as usize).min(slots.len()).min(USER_SLOTS);
    let kernel_bytes = r.stack.kernel_stack_bytes.max(0) as usize;
    let kernel_end = (users + kernel_bytes / size_of::<u64>()).min(slots.len());
    let kernel = slots[users..kernel_end].iter().copied().take_while(|&ip| ip != 0).collect();
    sample_of(r, &slots[..users], StackRead::Frames(kernel))
}

/// The sample part of a record with a stack: its header, its user stack out of `slots` (those the
/// record carries before anything else of its kind), and `kernel_stack` as the kind has it.
pub(super) fn sample_of(r: &Record, slots: &[u64], kernel_stack: StackRead) -> Sample {
    // Every field named: a field added to the C structs and not read here does not compile.
    let types::event_header { kind: _, pid, tid, cpu, timestamp_ns, comm: _ } = r.header;
    let types::event_stack { kernel_stack_bytes: _, user_frames, unwind_status, leaf_dev, leaf_ino, leaf_size, leaf_offset, leaf_vma_begin, leaf_vma_end, forked_from, flags } =
        r.stack;
    let users = (user_frames as usize).min(slots.len()).min(USER_SLOTS);
    Sample {
        timestamp_ns,
        pid,
        tid,
        cpu,
        comm: r.comm(),
        kernel_stack,
        user_stack: split_user_frames(&slots[..users]),
        unwind: UnwindStatus::from_raw(unwind_status),
        leaf_file: (leaf_ino != 0).then(|| LeafFile::from_kernel(leaf_dev, leaf_ino, leaf_size, leaf_offset, (leaf_vma_begin, leaf_vma_end))),
        forked_from: (forked_from != 0).then_some(forked_from),
        by_file: flags & types::stack_flags::STACK_BY_FILE.0 != 0,
        stack_copy: None,
    }
}

/// A CPU sample: always a whole record, the kernel frames in their own array.
pub(super) fn decode_cpu_sample(r: &Record) -> Option<Sample> {
    if r.data.len() < RECORD_BYTES {
        return None;
    }
    let kernel: Vec<u64> = r.data[KERNEL_STACK_AT..RECORD_BYTES]
        .chunks_exact(size_of::<u64>())
        .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Some(sample_of(r, &r.slots(), kernel_stack(&kernel, r.stack.kernel_stack_bytes)))
}

/// The kernel frames that bpf_get_stack() wrote, `bytes` of them (or its error).
pub(super) fn kernel_stack(frames: &[u64], bytes: i32) -> StackRead {
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
    use crate::events::record::tests::{decoded, header, record};

    #[test]
    fn decodes_a_sample() {
        // The file under the leaf, in the kernel's dev_t encoding (major 8, minor 1: sda1).
        let stack = types::event_stack {
            kernel_stack_bytes: -libc::EFAULT,
            user_frames: 2,
            unwind_status: types::unwind_status::UNWIND_TRUNCATED.0,
            leaf_dev: (8 << 20) | 1,
            leaf_ino: 77,
            leaf_size: 4096,
            leaf_offset: 0x1234,
            leaf_vma_begin: 0x800,
            leaf_vma_end: 0x3000,
            forked_from: 9,
            flags: types::stack_flags::STACK_BY_FILE.0,
        };
        let mut slots = vec![0u64; 512 + 127];
        slots[..2].copy_from_slice(&[0x1000, 0x2000]);
        let data = record(header(types::event_kind::EVENT_CPU_SAMPLE, 42, 43, "foo"), stack, &[0u8; 0], &slots);
        let Some(s) = decoded(&data, decode_cpu_sample) else { panic!("not a sample") };
        let leaf = LeafFile { dev: libc::makedev(8, 1), ino: 77, size: 4096, offset: 0x1234, vma: (0x800, 0x3000) };
        assert_eq!(s.leaf_file, Some(leaf));
        assert_eq!((leaf.offset_of(0x1000, 0x2000), leaf.offset_of(0x1000, 0x3000)), (Some(0x2234), None));
        assert_eq!((s.pid, s.tid, s.comm.as_str(), s.timestamp_ns), (42, 43, "foo", 1234));
        assert_eq!(s.kernel_stack, StackRead::Frames(vec![]));
        assert_eq!(s.user_stack, vec![UserFrame::Native(0x1000), UserFrame::Native(0x2000)]);
        assert_eq!(s.unwind, UnwindStatus::Truncated);
        assert_eq!(s.forked_from, Some(9));
        assert!(s.by_file);
        assert!(decoded(&data[..10], decode_cpu_sample).is_none());
        assert!(decoded(&data[..200], decode_cpu_sample).is_none(), "a CPU sample is never cut short");
    }

    #[test]
    fn a_sample_has_the_kernel_frames_of_its_own_array() {
        let stack = types::event_stack { kernel_stack_bytes: 16, user_frames: 1, ..Default::default() };
        let mut slots = vec![0u64; 512 + 127];
        slots[0] = 0x1000;
        slots[512..515].copy_from_slice(&[0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000, 0xffff_ffff_8300_0000]);
        let data = record(header(types::event_kind::EVENT_CPU_SAMPLE, 42, 43, "foo"), stack, &[0u8; 0], &slots);
        let Some(s) = decoded(&data, decode_cpu_sample) else { panic!("not a sample") };
        assert_eq!(s.kernel_stack, StackRead::Frames(vec![0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]));
        assert_eq!(s.forked_from, None, "a process's own mappings");
        assert_eq!(kernel_stack(&[], -5), StackRead::Failed(5));
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
}
