//! Kernel launches per stack, the kernel under its launching call: by the symbol of its host
//! stub (runtime launches; where it has none, by the driver launch the runtime made), by the name
//! cuModuleGetFunction or cuLibraryGetKernel gave its handle (driver launches);
//! graph launches count as themselves. Fed by the duty-cycled hooks' source (`cycled.rs`).

use std::collections::HashMap;

use gpuflame_bpf::{CudaApi, CudaCall, KernelName};
use gpuflame_symbolizer::MappedFile;

use super::scaling::ThreadScales;
use crate::stacks::{StackKey, StackValues, Stacks, TailFrame};

#[derive(Default)]
pub(super) struct Launches {
    counts: HashMap<StackKey, i64>,
    kernel_names: HashMap<(u32, u64), String>,
    pub(super) seen: u64,
}

impl Launches {
    /// A launch that succeeded.
    pub(super) fn launched(&mut self, call: &CudaCall, stack: &StackKey, files: Option<&[MappedFile]>, stacks: &mut Stacks) {
        let pid = call.sample.pid;
        let kernel = match call.api {
            CudaApi::CudaLaunchKernel | CudaApi::CudaLaunchKernelPtsz | CudaApi::CudaLaunchKernelExC | CudaApi::CudaLaunchKernelExCPtsz => {
                let driver_name = (call.handle != 0).then(|| self.kernel_names.get(&(pid, call.handle)).cloned()).flatten();
                Some(TailFrame::KernelStub(stacks.code_address(pid, call.addr, files), driver_name))
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

    pub(super) fn kernel_named(&mut self, k: &KernelName) {
        self.kernel_names.insert((k.pid, k.handle), k.name.clone());
    }

    pub(super) fn process_exited(&mut self, pid: u32) {
        self.kernel_names.retain(|&(p, _), _| p != pid);
    }

    /// Launches per stack, scaled; the counts start again from zero.
    pub(super) fn take(&mut self, scales: &ThreadScales) -> StackValues {
        std::mem::take(&mut self.counts).into_iter().map(|(k, n)| {
            let v = scales.scaled(k.tid, n);
            (k, None, vec![v])
        }).collect()
    }
}
