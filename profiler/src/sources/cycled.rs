//! The profiles of the duty-cycled hooks (launches, synchronisations, copies): gpu-launches and
//! cuda-api, from one source, so that what each thread's calls stand for (`scaling.rs`) is
//! followed once for both.

use gpuflame_bpf::{CudaClass, TrapCost};

use super::cuda_api::CudaApiTime;
use super::launches::Launches;
use super::scaling::{sampling_comment, CycledCalls};
use super::source::{Closed, Input, Source, SourceStats, WindowInfo};
use crate::profile_kind::ProfileKind;
use crate::stacks::Stacks;

/// gpu-launches, cuda-api, or both.
pub struct CycledHooks {
    calls: CycledCalls,
    launches: Option<Launches>,
    api_time: Option<CudaApiTime>,
}

impl CycledHooks {
    pub fn new(trap_cost: TrapCost, launches: bool, api_time: bool) -> Self {
        CycledHooks { calls: CycledCalls::new(trap_cost), launches: launches.then(Launches::default), api_time: api_time.then(CudaApiTime::default) }
    }
}

impl Source for CycledHooks {
    fn add(&mut self, input: &Input<'_>, stacks: &mut Stacks) {
        match input {
            // NCCL's calls are the collectives profiles'.
            Input::CudaCall { call, .. } if call.api.class() == CudaClass::Collective => {}
            // PyTorch's allocator is device memory's.
            Input::CudaCall { call, .. } if call.api.is_pytorch() => {}
            Input::CudaCall { call, stack, files } => {
                self.calls.saw(call);
                if let Some(l) = self.launches.as_mut().filter(|_| call.api.class() == CudaClass::Launch && call.result == 0) {
                    l.launched(call, stack, *files, stacks);
                }
                if let Some(t) = self.api_time.as_mut() {
                    t.returned(call, stack);
                }
            }
            Input::KernelName(k) => {
                if let Some(l) = self.launches.as_mut() {
                    l.kernel_named(k);
                }
            }
            Input::ProcessExited(pid) => {
                if let Some(l) = self.launches.as_mut() {
                    l.process_exited(*pid);
                }
            }
            _ => {}
        }
    }

    fn close(&mut self, window: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let scales = self.calls.take_scales(window.coverage);
        let comment = sampling_comment(&window.coverage);
        let mut out = Vec::new();
        if let Some(l) = self.launches.as_mut() {
            out.push(Closed { kind: ProfileKind::GpuLaunches, values: l.take(&scales), comments: comment.iter().cloned().collect() });
        }
        if let Some(t) = self.api_time.as_mut() {
            out.push(Closed { kind: ProfileKind::CudaApi, values: t.take(&scales), comments: comment.into_iter().collect() });
        }
        out
    }

    fn stats(&self, into: &mut SourceStats) {
        into.launches_seen = self.launches.as_ref().map_or(0, |l| l.seen);
    }
}
