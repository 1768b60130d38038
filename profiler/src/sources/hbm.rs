//! HBM allocated during the window and in use at its end, per allocating stack, from the ordered
//! stream of allocations, frees and maps (the accounting is `cuda::hbm`). Also where an
//! out-of-memory failure is seen, with what was in use when it happened.

use std::rc::Rc;

use gpuflame_bpf::{CudaCall, CudaClass};

use super::oom::{site_values, OomReport};
use super::source::{Closed, Input, Source, SourceStats, WindowInfo};
use crate::cuda::hbm::{Hbm, Site};
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks, TailFrame};

/// cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2.
const OUT_OF_MEMORY: i32 = 2;

pub struct HbmSource {
    hbm: Hbm,
    alloc: bool,
    in_use: bool,
    ooms: Vec<OomReport>,
}

impl HbmSource {
    pub fn new(alloc: bool, in_use: bool) -> Self {
        HbmSource { hbm: Hbm::default(), alloc, in_use, ooms: Vec::new() }
    }

    fn call(&mut self, call: &CudaCall, stack: &StackKey) {
        let pid = call.sample.pid;
        let class = call.api.class();
        if !matches!(class, CudaClass::Alloc | CudaClass::Free | CudaClass::Map) {
            return;
        }
        let ok = call.result == 0;
        let with_call = || {
            let mut s = stack.clone();
            s.tail.push(TailFrame::Call(call.api.symbol().to_string()));
            s
        };
        match class {
            CudaClass::Alloc if ok && call.addr != 0 => {
                self.hbm.allocated(pid, call.api, call.addr, call.size, Rc::new(Site { stack: with_call(), device: call.device }));
            }
            CudaClass::Alloc => {
                self.hbm.failed();
                if call.result == OUT_OF_MEMORY {
                    self.ooms.push(OomReport {
                        pid,
                        comm: call.sample.comm.clone(),
                        api: call.api,
                        requested: call.size,
                        device: call.device,
                        in_use: self.hbm.bytes_in_use(pid),
                        stack: with_call(),
                        in_use_by_site: self.hbm.in_use_of(Some(pid)),
                    });
                }
            }
            _ if ok => self.hbm.changed(pid, call.api, call.addr, call.size, call.handle),
            _ => {}
        }
    }
}

impl Source for HbmSource {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        match input {
            Input::CudaCall { call, stack, .. } => self.call(call, stack),
            Input::ProcessExited(pid) => self.hbm.process_exited(*pid),
            _ => {}
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let (allocs, in_use) = self.hbm.take_window();
        let mut out = Vec::new();
        if self.alloc {
            out.push(Closed::new(ProfileKind::HbmAlloc, site_values(&allocs)));
        }
        if self.in_use {
            out.push(Closed::new(ProfileKind::HbmInUse, site_values(&in_use)));
        }
        out
    }

    fn stats(&self, into: &mut SourceStats) {
        into.hbm = self.hbm.stats;
    }

    fn take_ooms(&mut self) -> Vec<OomReport> {
        std::mem::take(&mut self.ooms)
    }
}
