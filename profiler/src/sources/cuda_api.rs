//! Wall time inside CUDA calls per stack: exact for the calls whose hooks are always attached
//! (memory), scaled for the duty-cycled ones (launches, synchronisations, copies). Fed by the
//! duty-cycled hooks' source (`cycled.rs`).

use std::collections::HashMap;

use gpuflame_bpf::CudaCall;

use super::scaling::ThreadScales;
use crate::stacks::{StackKey, StackValues, TailFrame};

#[derive(Default)]
pub(super) struct CudaApiTime {
    exact: HashMap<StackKey, i64>,
    cycled_time: HashMap<StackKey, i64>,
}

impl CudaApiTime {
    pub(super) fn returned(&mut self, call: &CudaCall, stack: &StackKey) {
        let mut stack = stack.clone();
        stack.tail.push(TailFrame::Call(call.api.symbol().to_string()));
        let time = if call.api.always_on() { &mut self.exact } else { &mut self.cycled_time };
        *time.entry(stack).or_default() += call.duration_ns as i64;
    }

    /// Nanoseconds per stack, the cycled calls' scaled; a new window starts.
    pub(super) fn take(&mut self, scales: &ThreadScales) -> StackValues {
        let mut sum = std::mem::take(&mut self.exact);
        for (k, v) in std::mem::take(&mut self.cycled_time) {
            *sum.entry(k.clone()).or_default() += scales.scaled(k.tid, v);
        }
        sum.into_iter().map(|(k, v)| (k, None, vec![v])).collect()
    }
}
