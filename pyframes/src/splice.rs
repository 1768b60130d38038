//! Where a Python call's frames go in a native stack: in place of the eval-loop frame that runs
//! the call. The BPF walker applies the rule as it walks (`python_walk.h`: by the eval loop's
//! address before 3.12, by the shim frame each call pushes from 3.12); a stack walked later from
//! a copy (`session/late/finish.rs`) applies the same rule here, to the frames of its walk.

/// The evaluation loop of a Python process, as the walker knows it: how its frames are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonEval {
    /// The eval loop's code (3.11 and before: its frames are found by address).
    pub ranges: Vec<(u64, u64)>,
    /// 3.12+: an eval-loop frame is known by the shim frame in it.
    pub by_shim: bool,
}

impl PythonEval {
    /// Whether the native frame at `ip`, whose stack runs from `sp` up to `cfa` (0: not known),
    /// runs the Python call whose shim frame is at `shim` (0: none known).
    pub fn runs_call(&self, ip: u64, sp: u64, cfa: u64, shim: u64) -> bool {
        if self.by_shim {
            shim != 0 && cfa != 0 && sp <= shim && shim < cfa
        } else {
            self.ranges.iter().any(|&(lo, hi)| lo <= ip && ip < hi)
        }
    }

    /// Whether the frame the BPF walk stopped at may still hold a call: by shim it does (the
    /// walker knew no shim for it), by address the walker put that frame's Python frames in
    /// already.
    pub fn stopped_frame_may_hold_a_call(&self) -> bool {
        self.by_shim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_run_by_the_frame_whose_stack_holds_its_shim_or_by_the_eval_loops_code() {
        let shims = PythonEval { ranges: vec![], by_shim: true };
        assert!(shims.runs_call(0x10, 0x1000, 0x1080, 0x1010));
        assert!(!shims.runs_call(0x10, 0x1000, 0x1080, 0x1080));
        assert!(!shims.runs_call(0x10, 0x1000, 0, 0x1010));
        assert!(!shims.runs_call(0x10, 0x1000, 0x1080, 0));
        let ranges = PythonEval { ranges: vec![(0x500, 0x600)], by_shim: false };
        assert!(ranges.runs_call(0x500, 0, 0, 0));
        assert!(!ranges.runs_call(0x600, 0, 0, 0));
        assert!(shims.stopped_frame_may_hold_a_call() && !ranges.stopped_frame_may_hold_a_call());
    }
}
