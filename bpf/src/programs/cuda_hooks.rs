//! The CUDA hooks: uprobes on the CUDA runtime's and driver's functions (and PyTorch's allocator
//! and NCCL where they are found), one session program a file where the kernel has uprobe
//! sessions, an entry and a return uprobe a function where it has not (cuda_hooks.h).

use std::path::Path;

use libbpf_rs::{Link, UprobeMultiOpts, UprobeOpts};

use super::{load, BpfPrograms};
use crate::calibrate::{self, TrapCost};
use crate::cuda::CudaApi;
use crate::error::{attach_error, BpfError};
use crate::features::CallHooks;
use crate::skel::types;

const COOKIE_STEPPED: u64 = types::cuda_cookie::CUDA_COOKIE_STEPPED.0 as u64;

/// CUDA functions of one file to hook (file offsets), with their attach cookies: the api, and
/// whether the kernel steps the function's first instruction out of line, a trap more per call
/// that the scaling of sampled counts subtracts (calibrate.rs). Read from the file once, when it
/// is found; its hooks are attached every duty cycle.
#[derive(Debug, Clone, Default)]
pub struct CudaFunctions {
    offsets: Vec<usize>,
    cookies: Vec<u64>,
    /// How kernels without sessions hook each (see [`CudaApi::has_return`]).
    apis: Vec<CudaApi>,
}

impl CudaFunctions {
    pub fn new(path: &Path, functions: &[(CudaApi, u64)]) -> Self {
        let stepped = calibrate::stepped_at(path, &functions.iter().map(|&(_, off)| off).collect::<Vec<_>>());
        let cookies = functions.iter().zip(stepped).map(|(&(api, _), stepped)| u64::from(api.raw()) | if stepped { COOKIE_STEPPED } else { 0 }).collect();
        let apis = functions.iter().map(|&(api, _)| api).collect();
        CudaFunctions { offsets: functions.iter().map(|&(_, off)| off as usize).collect(), cookies, apis }
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
}

/// Hooks on the CUDA functions of one file, in every process that maps it. Dropping it detaches
/// them.
pub struct CudaHookLink {
    _links: Vec<Link>,
}

impl CudaHookLink {
    /// Detaches without waiting. The kernel takes the breakpoints out at once, then waits for an
    /// RCU grace period (~100 ms) before the call returns; that wait happens on a thread of its
    /// own, so that the caller does not wait for it.
    pub fn detach_in_background(self) {
        // Each link's detach waits for its grace period: entry and return probes, a link each
        // (kernels without sessions), dropped one after another kept the last breakpoints in a
        // window's ~100 ms a link longer. Each on a thread of its own, all go out at once.
        for link in self._links {
            let spawned = std::thread::Builder::new().name("gpuflame-detach".into()).spawn(move || drop(link));
            if let Err(e) = spawned {
                tracing::debug!(error = %e, "cannot detach on a thread of its own");
            }
        }
    }
}

impl BpfPrograms {
    /// Hooks the entry and return of `functions` of the file at `path`, in every process that maps
    /// it now or later; the programs keep to the targets.
    pub fn attach_cuda(&self, path: &Path, functions: &CudaFunctions) -> Result<CudaHookLink, BpfError> {
        let what = || format!("CUDA hooks to {}", path.display());
        self.require(load::ProgramGroup::Cuda)?;
        let progs = &self.skel.progs;
        if self.features.call_hooks() == CallHooks::Sessions {
            let opts = UprobeMultiOpts { offsets: functions.offsets.clone(), cookies: functions.cookies.clone(), session: true, ..Default::default() };
            let link = progs.on_cuda_call.attach_uprobe_multi_with_opts(-1, path, "", opts).map_err(|source| attach_error(&what(), source))?;
            return Ok(CudaHookLink { _links: vec![link] });
        }
        // Without sessions: an entry probe each, and a return probe where the call has a return
        // half; the instructions after a call are the return half's, at entry. A link each; the
        // kernel takes each breakpoint out as its link goes. Attaching them while an earlier set
        // is being detached waits for it (up to seconds): such hooks are attached once and kept,
        // not duty-cycled (session/kernel.rs).
        let started = std::time::Instant::now();
        let mut links = Vec::with_capacity(functions.offsets.len() * 2);
        for ((&offset, &cookie), &api) in functions.offsets.iter().zip(&functions.cookies).zip(&functions.apis) {
            let mut attach = |prog: &libbpf_rs::ProgramMut<'_>, retprobe: bool| -> Result<(), BpfError> {
                let opts = UprobeOpts { cookie, retprobe, ..Default::default() };
                links.push(prog.attach_uprobe_with_opts(-1, path, offset, opts).map_err(|source| attach_error(&what(), source))?);
                Ok(())
            };
            if api.is_after_call() {
                attach(&progs.on_cuda_return, false)?;
                continue;
            }
            attach(&progs.on_cuda_entry, false)?;
            if api.has_return() {
                attach(&progs.on_cuda_return, true)?;
            }
        }
        tracing::debug!(links = links.len(), elapsed_us = started.elapsed().as_micros() as u64, "CUDA hooks attached as entry and return probes");
        Ok(CudaHookLink { _links: links })
    }

    /// What a hooked call costs on this machine beyond its programs: the entry and return traps,
    /// measured on a function of this process with programs that do nothing.
    pub fn calibrate_trap_cost(&self) -> Result<TrapCost, BpfError> {
        self.require(load::ProgramGroup::Cuda)?;
        let progs = &self.skel.progs;
        match self.features.call_hooks() {
            CallHooks::Sessions => calibrate::trap_cost(calibrate::Probes::Session(&progs.on_calibrate)),
            CallHooks::EntryAndReturn => calibrate::trap_cost(calibrate::Probes::EntryAndReturn(&progs.on_calibrate_entry, &progs.on_calibrate_return)),
        }
    }
}
