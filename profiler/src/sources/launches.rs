//! Kernel launches per stack, the kernel under its launching call: by the symbol of its host
//! stub (runtime launches), by the name cuModuleGetFunction gave its handle (driver launches);
//! graph launches count as themselves.

use std::collections::HashMap;
use std::time::Duration;

use gpuflame_bpf::{CudaApi, CudaCall, CudaClass};
use gpuflame_symbolizer::MappedFile;

use super::cycled::{sampling_comment, CycledCalls};
use super::source::{Closed, Input, Source, SourceStats, WindowInfo};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks, TailFrame};

pub struct Launches {
    counts: HashMap<StackKey, i64>,
    kernel_names: HashMap<(u32, u64), String>,
    cycled: CycledCalls,
    seen: u64,
}

impl Launches {
    pub fn new(trap_cost: Duration) -> Self {
        Launches { counts: HashMap::new(), kernel_names: HashMap::new(), cycled: CycledCalls::new(trap_cost), seen: 0 }
    }

    fn call(&mut self, call: &CudaCall, stack: &StackKey, files: Option<&[MappedFile]>, stacks: &mut Stacks) {
        let pid = call.sample.pid;
        let kernel = match call.api {
            CudaApi::CudaLaunchKernel | CudaApi::CudaLaunchKernelPtsz | CudaApi::CudaLaunchKernelExC | CudaApi::CudaLaunchKernelExCPtsz => {
                Some(TailFrame::KernelStub(stacks.code_address(pid, call.addr, files)))
            }
            CudaApi::CudaGraphLaunch | CudaApi::CudaGraphLaunchPtsz | CudaApi::CuGraphLaunch | CudaApi::CuGraphLaunchPtsz => None,
            _ => Some(TailFrame::Kernel(self.kernel_names.get(&(pid, call.addr)).cloned().unwrap_or_else(|| format!("kernel {:#x}", call.addr)))),
        };
        let mut stack = stack.clone();
        stack.tail.push(TailFrame::Call(call.api.symbol().to_string()));
        stack.tail.extend(kernel);
        *self.counts.entry(stack).or_default() += 1;
        self.seen += 1;
    }
}

impl Source for Launches {
    fn add(&mut self, input: &Input<'_>, stacks: &mut Stacks) {
        match input {
            Input::CudaCall { call, stack, files } if call.api.class() != CudaClass::Cupti => {
                self.cycled.saw(call);
                if call.api.class() == CudaClass::Launch && call.result == 0 {
                    self.call(call, stack, *files, stacks);
                }
            }
            Input::KernelName(k) => {
                self.kernel_names.insert((k.pid, k.handle), k.name.clone());
            }
            Input::ProcessExited(pid) => self.kernel_names.retain(|&(p, _), _| p != *pid),
            _ => {}
        }
    }

    fn close(&mut self, window: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let scales = self.cycled.take_scales(window.coverage);
        let values = std::mem::take(&mut self.counts).into_iter().map(|(k, n)| {
            let v = scales.scaled(k.tid, n);
            (k, None, vec![v])
        });
        let mut closed = Closed::new(ProfileKind::GpuLaunches, values.collect());
        closed.comments.extend(sampling_comment(&window.coverage));
        vec![closed]
    }

    fn stats(&self, into: &mut SourceStats) {
        into.launches_seen = self.seen;
    }
}
