//! NCCL's collectives: calls and the bytes they moved per calling stack (`collectives`), and the
//! device time of NCCL's kernels per collective stack (`collective-time`, from the CUPTI
//! injection library's kernel records; the attribution is `cuda::nccl`).

use std::collections::HashMap;

use gpuflame_bpf::{CudaClass, CudaCall};

use super::source::{Closed, Input, Source, WindowInfo};
use crate::cuda::nccl::{datatype_size, CollectiveTime};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks, TailFrame};

#[derive(Debug, Clone, Copy, Default)]
struct CallStats {
    calls: u64,
    failed: u64,
    /// Calls whose datatype NCCL does not define: their bytes are not counted.
    unknown_datatype: u64,
}

pub struct Collectives {
    /// (stack ending in the call, device) → calls, bytes; None when the profile is not asked for.
    calls: Option<HashMap<(StackKey, u32), [i64; 2]>>,
    time: Option<CollectiveTime>,
    stats: CallStats,
}

impl Collectives {
    pub fn new(calls: bool, time: bool) -> Self {
        Collectives { calls: calls.then(HashMap::new), time: time.then(CollectiveTime::default), stats: CallStats::default() }
    }

    fn returned(&mut self, call: &CudaCall, stack: &StackKey) {
        let mut stack = stack.clone();
        stack.tail.push(TailFrame::Call(call.api.symbol().to_string()));
        self.stats.calls += 1;
        let bytes = if call.result != 0 {
            // Refused (bad arguments, a broken communicator): nothing moved.
            self.stats.failed += 1;
            0
        } else {
            match datatype_size(call.handle) {
                Some(size) => call.size.saturating_mul(size).min(i64::MAX as u64) as i64,
                None => {
                    self.stats.unknown_datatype += 1;
                    0
                }
            }
        };
        // A refused call launched nothing: it takes no share of its operation's kernel time.
        if let Some(time) = self.time.as_mut().filter(|_| call.result == 0) {
            time.called(call.sample.pid, call.api, &stack);
        }
        if let Some(calls) = self.calls.as_mut() {
            let v = calls.entry((stack, call.device)).or_default();
            v[0] += 1;
            v[1] = v[1].saturating_add(bytes);
        }
    }
}

impl Source for Collectives {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        match input {
            Input::CudaCall { call, stack, .. } if call.api.class() == CudaClass::Collective => self.returned(call, stack),
            Input::GpuKernels(batch) => self.time.iter_mut().for_each(|t| t.kernels(batch)),
            Input::GpuKernelName(n) => self.time.iter_mut().for_each(|t| t.named(n)),
            Input::ProcessExited(pid) => self.time.iter_mut().for_each(|t| t.process_exited(*pid)),
            _ => {}
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let mut out = Vec::new();
        let stats = std::mem::take(&mut self.stats);
        if let Some(calls) = self.calls.as_mut() {
            let values = calls.drain().map(|((stack, device), v)| (stack, Some(device), v.to_vec())).collect();
            let mut comments = vec![format!("{} NCCL calls; bytes are count × the datatype's size as the caller passed them", stats.calls)];
            if stats.failed > 0 {
                comments.push(format!("{} calls failed (NCCL returned an error): counted, without bytes", stats.failed));
            }
            if stats.unknown_datatype > 0 {
                comments.push(format!("{} calls passed a datatype NCCL does not define: counted, without bytes", stats.unknown_datatype));
            }
            out.push(Closed { kind: ProfileKind::Collectives, values, comments });
        }
        if let Some(time) = self.time.as_mut() {
            let (values, stats) = time.take();
            tracing::info!("{}", stats.describe());
            out.push(Closed { kind: ProfileKind::CollectiveTime, values, comments: vec![stats.describe()] });
        }
        out
    }
}
