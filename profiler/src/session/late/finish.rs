//! Finishing one copied sample: the BPF walk goes on over the copy from the frame where it
//! stopped, and the Python frames read at sample time go in place of the eval-loop frames it
//! finds, as the BPF walk puts them.

use std::fs::File;
use std::os::unix::fs::FileExt;

use gpuflame_bpf::{ProcessUnwindView, Sample, StackCopy, UnwindStatus, UserFrame};
use gpuflame_pyframes::PythonEval;
use gpuflame_unwind::{walk_copied, CodeAt, ProcessCode, Walk, WalkEnd, WalkedFrame};

/// Native frames a finished stack holds at most, as many as a BPF walk's sample.
pub const MAX_NATIVE_FRAMES: usize = 512;

/// The process's code as the walker needs it: BPF's mappings and tables, and its memory for the
/// call check of code without CFI (none once it is gone: such a frame then ends the walk).
pub struct Code<'v, 'p> {
    pub view: &'v mut ProcessUnwindView<'p>,
    pub memory: Option<&'v File>,
}

impl ProcessCode for Code<'_, '_> {
    fn code_at(&mut self, ip: u64, adjust: bool) -> CodeAt {
        self.view.code_at(ip, adjust)
    }

    fn code_before(&mut self, addr: u64) -> Option<[u8; 8]> {
        let mut b = [0u8; 8];
        self.memory?.read_exact_at(&mut b, addr.checked_sub(8)?).ok()?;
        Some(b)
    }
}

pub enum Outcome {
    /// The sample's stack is whole, or ended for another reason than a missing table;
    /// `cut_by_copy`: it went on past what BPF copies.
    Finished { cut_by_copy: bool },
    /// The walk met, at this address, a file whose table is not loaded yet, or code in no
    /// mapping read yet (a library just mapped).
    Waiting { ip: u64 },
}

/// Walks `copy` for `sample` and, unless a table is still missing (or a mapping, until
/// `maps_final`), puts the frames in its stack.
pub fn finish(sample: &mut Sample, copy: &StackCopy, code: &mut Code<'_, '_>, python: Option<&PythonEval>, maps_final: bool) -> Outcome {
    let walk = walk_copied(&copy.copied(), code, MAX_NATIVE_FRAMES);
    match walk.end {
        WalkEnd::TablePending { ip } => return Outcome::Waiting { ip },
        WalkEnd::NoMapping if !maps_final => return Outcome::Waiting { ip: walk.frames.last().map_or(copy.start.ip, |f| f.ip) },
        _ => {}
    }
    let status = status_of(&walk, copy);
    sample.user_stack = merged(&sample.user_stack, &walk, python);
    sample.unwind = status;
    Outcome::Finished { cut_by_copy: walk.end == WalkEnd::ReadFault && status == UnwindStatus::Truncated }
}

/// The status BPF gives a walk that ends so.
pub(super) fn status_of(walk: &Walk, copy: &StackCopy) -> UnwindStatus {
    match walk.end {
        WalkEnd::EndOfStack => UnwindStatus::EndOfStack,
        WalkEnd::ZeroReturnAddress => UnwindStatus::ZeroReturnAddress,
        WalkEnd::Truncated => UnwindStatus::Truncated,
        // The stack goes on past the most BPF copies: deeper than it walks.
        WalkEnd::ReadFault if copy.is_full() => UnwindStatus::Truncated,
        WalkEnd::ReadFault => UnwindStatus::ReadFault,
        WalkEnd::BadCfa => UnwindStatus::BadCfa,
        WalkEnd::NoMapping => UnwindStatus::NoMapping,
        WalkEnd::TablePending { .. } => UnwindStatus::NoTableYet,
        WalkEnd::BadFrame => UnwindStatus::BadFrame,
    }
}

/// The Python frames after the gap, by the eval-loop call that runs them, with its shim.
struct Call {
    frames: Vec<UserFrame>,
    shim: u64,
}

fn calls_after_gap(rest: &[UserFrame]) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut frames = Vec::new();
    for f in rest {
        match *f {
            UserFrame::CallEnd { shim } => calls.push(Call { frames: std::mem::take(&mut frames), shim }),
            UserFrame::Python { .. } => frames.push(*f),
            UserFrame::Native(_) | UserFrame::Gap => {}
        }
    }
    if !frames.is_empty() {
        calls.push(Call { frames, shim: 0 });
    }
    calls
}

/// The sample's frames up to where BPF stopped, the walk's callers after them, and each call's
/// Python frames in place of its eval-loop frame; calls no frame was found for stay after a gap.
fn merged(user: &[UserFrame], walk: &Walk, python: Option<&PythonEval>) -> Vec<UserFrame> {
    let gap = user.iter().position(|f| *f == UserFrame::Gap).unwrap_or(user.len());
    let mut out: Vec<UserFrame> = user[..gap].to_vec();
    let mut calls = calls_after_gap(user.get(gap + 1..).unwrap_or(&[])).into_iter().peekable();
    // Which frame runs a call is pyframes' rule (the walker's, in BPF).
    let holds_call = |f: &WalkedFrame, call: Option<&Call>| python.zip(call).is_some_and(|(py, call)| py.runs_call(f.ip, f.sp, f.cfa, call.shim));
    let stopped_may_hold = python.is_some_and(PythonEval::stopped_frame_may_hold_a_call);
    for (i, f) in walk.frames.iter().enumerate() {
        if (i > 0 || stopped_may_hold) && holds_call(f, calls.peek()) {
            if i == 0 && out.last() == Some(&UserFrame::Native(f.ip)) {
                out.pop();
            }
            out.extend(calls.next().map(|c| c.frames).unwrap_or_default());
        } else if i > 0 {
            out.push(UserFrame::Native(f.ip));
        }
    }
    let rest: Vec<UserFrame> = calls.flat_map(|c| c.frames).collect();
    if !rest.is_empty() {
        out.push(UserFrame::Gap);
        out.extend(rest);
    }
    out
}

#[cfg(test)]
#[path = "finish_tests.rs"]
mod tests;
