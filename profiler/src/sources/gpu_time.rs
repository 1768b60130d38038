//! GPU time: kernel records of the CUPTI injection library, attributed to the stacks that
//! launched them (the attribution is `cuda::kernel_attribution`). Also says, once per process, why a
//! process has no GPU time when its injection library reports a failure.

use std::collections::HashMap;

use super::source::{Closed, Input, Source, WindowInfo};
use crate::cuda::kernel_attribution::GpuTime;
use crate::cuda::ready::STATUS_WAITING;
use crate::profile_kind::ProfileKind;
use crate::stacks::Stacks;

#[derive(Default)]
pub struct GpuTimeSource {
    gpu_time: GpuTime,
    /// Processes whose injection library reported that it has no GPU time, and why.
    failures: HashMap<u32, i32>,
}

impl Source for GpuTimeSource {
    fn add(&mut self, input: &Input<'_>, stacks: &mut Stacks) {
        match input {
            Input::CuptiStatus(status) => {
                let pid = status.pid;
                // Waiting for gpuflame is not a failure: the session answers it.
                if status.code != 0 && status.code != STATUS_WAITING && self.failures.insert(pid, status.code).is_none() {
                    let why = match status.code {
                        1 => "libcupti was not found (set GPUFLAME_CUPTI_PATH)",
                        2 => "another CUPTI subscriber is active (the PyTorch profiler or Nsight?)",
                        _ => "CUPTI refused the kernel activity",
                    };
                    eprintln!("gpuflame: pid {pid} ({}): no GPU time: {why}; its gpu-launches and cuda-api profiles stand in", status.comm);
                }
            }
            Input::CuptiLaunch { launch, stack } => {
                // Reported from inside the launch, by the injection library through CUPTI: their
                // frames are not the program's.
                let mut stack = (*stack).clone();
                stacks.trim_leaf_files(&mut stack, |f| f.starts_with("libgpuflame_cupti") || f.starts_with("libcupti"));
                // A stack cut short (its libraries just loaded, their tables not in yet) would
                // take its kernel's time away from the real call site: it is used only for a
                // kernel that has no whole one.
                self.gpu_time.launch(launch.sample.pid, launch.correlation, stack, launch.sample.unwind.is_complete());
            }
            Input::GpuKernels(batch) => self.gpu_time.kernels(batch),
            Input::GpuKernelName(n) => self.gpu_time.named((*n).clone()),
            Input::ProcessExited(pid) => self.gpu_time.process_exited(*pid),
            _ => {}
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let (values, stats) = self.gpu_time.take();
        tracing::info!("{}", stats.describe());
        vec![Closed { kind: ProfileKind::GpuTime, values, comments: vec![stats.describe()] }]
    }
}
