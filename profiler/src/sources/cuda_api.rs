//! Wall time inside CUDA calls per stack: exact for the calls whose hooks are always attached
//! (memory), scaled for the duty-cycled ones (launches, synchronisations, copies).

use std::collections::HashMap;
use std::time::Duration;

use gpuflame_bpf::CudaApi;

use super::cycled::{sampling_comment, CycledCalls};
use super::source::{Closed, Input, Source, WindowInfo};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks, TailFrame};

pub struct CudaApiTime {
    exact: HashMap<StackKey, i64>,
    cycled_time: HashMap<StackKey, i64>,
    cycled: CycledCalls,
}

impl CudaApiTime {
    pub fn new(trap_cost: Duration) -> Self {
        CudaApiTime { exact: HashMap::new(), cycled_time: HashMap::new(), cycled: CycledCalls::new(trap_cost) }
    }
}

impl Source for CudaApiTime {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        let Input::CudaCall { call, stack, .. } = input else { return };
        if call.api == CudaApi::CuptiLaunch {
            return;
        }
        self.cycled.saw(call);
        let mut stack = (*stack).clone();
        stack.tail.push(TailFrame::Call(call.api.symbol().to_string()));
        let time = if call.api.always_on() { &mut self.exact } else { &mut self.cycled_time };
        *time.entry(stack).or_default() += call.duration_ns as i64;
    }

    fn close(&mut self, window: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let scales = self.cycled.take_scales(window.coverage);
        let mut sum = std::mem::take(&mut self.exact);
        for (k, v) in std::mem::take(&mut self.cycled_time) {
            *sum.entry(k.clone()).or_default() += scales.scaled(k.tid, v);
        }
        let mut closed = Closed::new(ProfileKind::CudaApi, sum.into_iter().map(|(k, v)| (k, None, vec![v])).collect());
        closed.comments.extend(sampling_comment(&window.coverage));
        vec![closed]
    }
}
