//! Device memory per stack: segments as CUDA gave them (hbm-alloc, hbm-inuse) and tensors as
//! PyTorch's caching allocator handed them out (tensor-alloc, tensor-inuse): in use from the live
//! set the kernel keeps, read at each window's end; allocated from the memory records (the
//! accounting is `cuda::memory`). Also where an
//! out-of-memory failure is seen, with what held the memory when it happened, and the memory
//! timeline.

use std::rc::Rc;

use gpuflame_bpf::{CudaApi, CudaCall, CudaClass};

use super::oom::{site_values, OomReport};
use super::source::{Closed, Input, Source, SourceStats, WindowInfo};
use super::memory_chart::chart;
use crate::cuda::hbm::Site;
use crate::cuda::memory::{DeviceMemory, DeviceUse};
use crate::output::memory_svg::DeviceChart;
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, Stacks, TailFrame};

/// cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2.
const OUT_OF_MEMORY: i32 = 2;

pub struct DeviceMemorySource {
    memory: DeviceMemory,
    wants: [bool; 4],
    ooms: Vec<OomReport>,
    /// Processes that exited in this window: their stacks go when it closes.
    exited: Vec<u32>,
}

impl DeviceMemorySource {
    /// Which of hbm-alloc, hbm-inuse, tensor-alloc and tensor-inuse to make; the interval of
    /// tensors' byte sampling (0: every tensor has its stack).
    pub fn new(wants: [bool; 4], tensor_sample_bytes: u64) -> Self {
        DeviceMemorySource { memory: DeviceMemory::new(tensor_sample_bytes), wants, ooms: Vec::new(), exited: Vec::new() }
    }

    fn call(&mut self, call: &CudaCall, stack: &StackKey) {
        let pid = call.sample.pid;
        let class = call.api.class();
        let ok = call.result == 0;
        let with_call = || {
            let mut s = stack.clone();
            s.tail.push(TailFrame::Call(call.api.frame_name().to_string()));
            s
        };
        let m = &mut self.memory;
        match class {
            // Physical memory is followed by its records; the live set has the rest.
            CudaClass::Alloc if ok && call.addr != 0 && call.api == CudaApi::CuMemCreate => {
                let site = Rc::new(Site { stack: with_call(), device: call.device, via_allocator: call.in_allocator });
                m.physical_created(pid, call.api, call.addr, call.size, site)
            }
            CudaClass::Alloc | CudaClass::TensorAlloc if call.addr != 0 && (ok || class == CudaClass::TensorAlloc) => {
                if class == CudaClass::TensorAlloc {
                    // Each of its stacks' first tensor sends this record, with or without
                    // records of tensors (tensor-alloc, a timeline).
                    m.allocator_used(pid);
                }
                m.learn_stack(pid, call.stack_id, with_call())
            }
            CudaClass::Alloc => {
                m.segment_stats.failed_allocations += 1;
                if call.in_allocator {
                    // PyTorch frees its cache and tries again; its own report says if it failed.
                    m.allocator_retries += 1;
                } else if call.result == OUT_OF_MEMORY {
                    self.out_of_memory(call, with_call(), None);
                }
            }
            CudaClass::Free | CudaClass::Map if ok && matches!(call.api, CudaApi::CuMemRelease | CudaApi::CuMemMap | CudaApi::CuMemUnmap) => {
                m.physical_changed(pid, call.api, call.addr, call.size, call.handle)
            }
            CudaClass::TensorAlloc => m.tensor_stats.failed_allocations += 1,
            CudaClass::TensorOom => {
                m.tensor_stats.failed_allocations += 1;
                self.out_of_memory(call, with_call(), Some((call.addr, call.handle)));
            }
            _ => {}
        }
    }

    /// `allocator_says`: the allocator's own allocated and reserved bytes, from its report.
    fn out_of_memory(&mut self, call: &CudaCall, stack: StackKey, allocator_says: Option<(u64, u64)>) {
        let pid = call.sample.pid;
        let usage = self.memory.by_device(Some(pid)).into_iter().find(|d| d.device == call.device);
        let holders = self.memory.holders(pid, Some(call.device));
        self.memory.out_of_memory(call.sample.timestamp_ns, call.device, call.size);
        self.ooms.push(OomReport {
            pid,
            comm: call.sample.comm.clone(),
            api: call.api,
            requested: call.size,
            device: call.device,
            in_use: holders.values().map(|t| t.0 as u64).sum(),
            usage: usage.unwrap_or(DeviceUse { device: call.device, ..Default::default() }),
            allocator_says,
            stack,
            holders,
        });
    }

    /// Reserved against allocated on each device, for a profile's comments.
    fn usage_comments(&self) -> Vec<String> {
        self.memory.window_by_device().iter().map(DeviceUse::to_string).collect()
    }
}

impl Source for DeviceMemorySource {
    fn add(&mut self, input: &Input<'_>, _: &mut Stacks) {
        match input {
            Input::CudaCall { call, stack, .. } => self.call(call, stack),
            Input::Memory(event) => self.memory.memory_event(event),
            Input::LiveAtWindowEnd(live) => self.memory.live_at_window_end(live.to_vec()),
            Input::LiveAtOom { pid, live } => self.memory.live_at_oom(*pid, live.to_vec()),
            Input::ProcessExited(pid) => {
                // After its last record, which may have been read just now.
                let t = crate::cuda::memory_points::boot_time_ns().max(self.memory.timeline.last_ns() + 1);
                self.memory.process_exited(t, *pid);
                self.exited.push(*pid);
            }
            _ => {}
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let comments = self.usage_comments();
        self.memory.window_closed();
        let values = self.memory.take_window();
        // Their allocations were counted in this window, the last they are in.
        for pid in std::mem::take(&mut self.exited) {
            self.memory.forget(pid);
        }
        ProfileKind::MEMORY
            .into_iter()
            .zip(values)
            .zip(self.wants)
            .filter(|(_, want)| *want)
            .map(|((kind, totals), _)| Closed { kind, values: site_values(&totals), comments: comments.clone() })
            .collect()
    }

    fn stats(&self, into: &mut SourceStats) {
        into.hbm = self.memory.segment_stats;
        into.tensors = self.memory.tensor_stats;
        into.allocator_retries = self.memory.allocator_retries;
        into.devices = self.memory.window_by_device();
    }
}

/// What only device memory has: its out-of-memory failures and its timeline.
impl DeviceMemorySource {
    /// Allocations that failed for lack of memory since the last call.
    pub fn take_ooms(&mut self) -> Vec<OomReport> {
        std::mem::take(&mut self.ooms)
    }

    /// Keep what the memory timeline needs (`record` draws one; the agent does not).
    pub fn keep_memory_timeline(&mut self) {
        self.memory.timeline_on = true;
    }

    /// Device memory over time, drawn up to `end_ns` (boot time), per device.
    pub fn memory_timeline(&mut self, end_ns: u64, stacks: &mut Stacks) -> Vec<DeviceChart> {
        chart(&mut self.memory.timeline, end_ns, stacks)
    }
}
