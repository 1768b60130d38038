//! EVENT_MEMORY: one allocation or free of the live set of device memory (live_allocations.h),
//! a compact record of its own (struct memory_event), for the memory timeline and the allocation
//! profiles. In-use is not made of these: it is read from the live set itself ([`crate::LiveAllocation`]).

use crate::cuda::CudaApi;
use crate::pod::read_pod;
use crate::skel::types;

/// What an allocation of the live set is, as its record and its map entry both say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveKind {
    /// The allocating call: a tensor's (PyTorch's allocator) or a segment's (cudaMalloc…).
    pub api: Option<CudaApi>,
    pub device: u32,
    /// A tensor whose stack byte sampling passed over: in the totals, under no stack.
    pub sampled_out: bool,
    /// Its stack was new and the full ring turned its record away.
    pub stack_lost: bool,
    /// A segment PyTorch's allocator asked for: reserved memory.
    pub in_allocator: bool,
}

impl LiveKind {
    pub(crate) fn of(api: u16, device: u8, flags: u8) -> Self {
        use types::live_flags as f;
        let has = |bit: f| u32::from(flags) & bit.0 != 0;
        LiveKind {
            api: CudaApi::from_raw(u32::from(api)),
            device: u32::from(device),
            sampled_out: has(f::LIVE_SAMPLED_OUT),
            stack_lost: has(f::LIVE_STACK_LOST),
            in_allocator: has(f::LIVE_IN_ALLOCATOR),
        }
    }
}

/// What happened to the live set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryChange {
    Allocated {
        /// One was live at the address: its free was not seen.
        replaced: bool,
        /// The live set was full: this one is not in it (nor in in-use).
        untracked: bool,
    },
    /// Freed: `size` and `stack` are the allocation's.
    Freed,
    /// A free of nothing the live set had: allocated before gpuflame attached.
    UnknownFree,
}

#[derive(Debug, Clone)]
pub struct MemoryEvent {
    pub pid: u32,
    pub tid: u32,
    pub timestamp_ns: u64,
    pub addr: u64,
    pub size: u64,
    /// The allocation's stack id (0: none; `kind` says why).
    pub stack: u64,
    pub kind: LiveKind,
    pub change: MemoryChange,
}

pub(super) fn decode(data: &[u8]) -> Option<MemoryEvent> {
    use types::memory_event_flags as f;
    let types::memory_event { kind: _, pid, timestamp_ns, addr, size, stack, tid, api, device, flags } = read_pod(data)?;
    let has = |bit: f| u32::from(flags) & bit.0 != 0;
    let change = if has(f::MEMORY_UNKNOWN) {
        MemoryChange::UnknownFree
    } else if has(f::MEMORY_FREED) {
        MemoryChange::Freed
    } else {
        MemoryChange::Allocated { replaced: has(f::MEMORY_REPLACED), untracked: has(f::MEMORY_UNTRACKED) }
    };
    Some(MemoryEvent { pid, tid, timestamp_ns, addr, size, stack, kind: LiveKind::of(api, device, flags), change })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::as_bytes;

    #[test]
    fn a_memory_event_is_48_bytes_and_decodes_each_change() {
        assert_eq!(std::mem::size_of::<types::memory_event>(), 48);
        // The ring's lag reads every record's time where the header has it.
        assert_eq!(std::mem::offset_of!(types::memory_event, timestamp_ns), std::mem::offset_of!(types::event_header, timestamp_ns));
        assert_eq!(std::mem::offset_of!(types::memory_event, tid), std::mem::offset_of!(types::event_header, tid));
        let base = types::memory_event { kind: types::event_kind::EVENT_MEMORY.0, pid: 7, tid: 8, timestamp_ns: 9, addr: 0x1000, size: 4096, stack: 11, api: types::cuda_api::C10_MALLOC.0 as u16, device: 2, flags: 0 };
        let e = decode(as_bytes(&base)).unwrap();
        assert_eq!((e.pid, e.tid, e.addr, e.size, e.stack, e.kind.device), (7, 8, 0x1000, 4096, 11, 2));
        assert_eq!(e.kind.api, Some(CudaApi::C10Malloc));
        assert_eq!(e.change, MemoryChange::Allocated { replaced: false, untracked: false });
        let flags = (types::memory_event_flags::MEMORY_FREED.0 | types::live_flags::LIVE_SAMPLED_OUT.0) as u8;
        let e = decode(as_bytes(&types::memory_event { flags, ..base })).unwrap();
        assert!(e.change == MemoryChange::Freed && e.kind.sampled_out && !e.kind.stack_lost);
        let flags = (types::memory_event_flags::MEMORY_FREED.0 | types::memory_event_flags::MEMORY_UNKNOWN.0) as u8;
        assert_eq!(decode(as_bytes(&types::memory_event { flags, ..base })).unwrap().change, MemoryChange::UnknownFree);
        let flags = types::memory_event_flags::MEMORY_REPLACED.0 as u8;
        assert_eq!(decode(as_bytes(&types::memory_event { flags, ..base })).unwrap().change, MemoryChange::Allocated { replaced: true, untracked: false });
        assert!(decode(&as_bytes(&base)[..47]).is_none());
    }
}
