//! Stacks copied where a CPU sample's walk met a table not loaded yet (stack_copy.h), and their
//! pairing with the sample they belong to, which the same program sends right after.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};

use super::record::Record;
use gpuflame_unwind::{CopiedStack, WalkStart};

use crate::skel::types;

/// Bytes of the largest copy record: what the ring must make room for.
pub const STACK_COPY_RECORD_BYTES: usize = offset_of!(types::stack_copy_record, bytes) + STACK_COPY_BYTES;
/// The most stack a copy holds (its array has a page more, for the verifier).
pub const STACK_COPY_BYTES: usize = types::stack_copy_layout::STACK_COPY_MAX_BYTES.0 as usize;
const _: () = assert!(size_of::<types::stack_copy_record>() == STACK_COPY_RECORD_BYTES + types::stack_copy_layout::STACK_COPY_SLACK_BYTES.0 as usize);

/// The registers of the frame where the walk stopped (and the walk's state there), and the stack
/// around its sp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackCopy {
    pub start: WalkStart,
    /// Taken at the sample's leaf, beside a whole walk (the unwinder's oracle), not where it
    /// stopped.
    pub from_leaf: bool,
    /// The stack from [`Self::base`] on.
    pub bytes: Vec<u8>,
}

/// How far below sp a copy starts: the red zone, and slots an epilogue has just popped, which
/// CFI may still name.
const STACK_COPY_BELOW_SP: u64 = types::stack_copy_layout::STACK_COPY_START_BELOW_SP.0 as u64;

impl StackCopy {
    /// The address of the copy's first byte.
    pub fn base(&self) -> u64 {
        self.start.sp.wrapping_sub(STACK_COPY_BELOW_SP)
    }

    /// Whether the copy holds as much as BPF copies: the stack may go on past it.
    pub fn is_full(&self) -> bool {
        self.bytes.len() >= STACK_COPY_BYTES
    }

    /// The stack for the user-space walk: from where BPF's stopped, or from the leaf.
    pub fn copied(&self) -> CopiedStack<'_> {
        CopiedStack { start: self.start, base: self.base(), bytes: &self.bytes }
    }
}

pub(super) fn decode(r: &Record) -> StackCopy {
    let p: types::stack_copy_payload = r.payload();
    let types::stack_copy_payload { ip, sp, bp, bp_below_ra, bytes, adjust, scans, from_leaf, _pad: _ } = p;
    let tail = r.tail();
    // BPF leaves the walk's state out of a copy from the leaf: its walk starts afresh.
    let start = WalkStart { ip, sp, bp, bp_below_ra, adjust: adjust != 0, scans };
    StackCopy { start, from_leaf: from_leaf != 0, bytes: tail[..(bytes as usize).min(tail.len())].to_vec() }
}

/// Copies read, each waiting for its sample: the next record of its thread with its time.
#[derive(Default)]
pub(crate) struct CopiesAwaitingSamples {
    by_tid: HashMap<u32, (u64, StackCopy)>,
    /// Copies whose sample never came (the ring was full for it).
    pub(crate) unpaired: u64,
}

impl CopiesAwaitingSamples {
    /// Threads with a copy waiting at most: a sample lost to a full ring leaves one behind.
    const MAX_WAITING: usize = 1024;

    pub(crate) fn copy(&mut self, tid: u32, timestamp_ns: u64, copy: StackCopy) {
        if self.by_tid.len() >= Self::MAX_WAITING {
            self.unpaired += self.by_tid.len() as u64;
            self.by_tid.clear();
        }
        if self.by_tid.insert(tid, (timestamp_ns, copy)).is_some() {
            self.unpaired += 1;
        }
    }

    /// The copy of the sample of thread `tid` taken at `timestamp_ns`, marked as copied.
    pub(crate) fn take(&mut self, tid: u32, timestamp_ns: u64) -> Option<StackCopy> {
        match self.by_tid.remove(&tid) {
            Some((ts, copy)) if ts == timestamp_ns => Some(copy),
            Some(_) => {
                self.unpaired += 1;
                None
            }
            None => None,
        }
    }
}
