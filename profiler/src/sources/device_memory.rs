//! Device memory per stack: segments as CUDA gave them (hbm-alloc, hbm-inuse) and tensors as
//! PyTorch's caching allocator handed them out (tensor-alloc, tensor-inuse), from the ordered
//! stream of allocations, frees and maps (the accounting is `cuda::memory`). Also where an
//! out-of-memory failure is seen, with what held the memory when it happened, and the memory
//! timeline.

use std::rc::Rc;

use gpuflame_bpf::{tensor_stack_chance, CudaCall, CudaClass};

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
    tensor_sample_bytes: u64,
}

impl DeviceMemorySource {
    /// Which of hbm-alloc, hbm-inuse, tensor-alloc and tensor-inuse to make; the interval of
    /// tensors' byte sampling (0: every tensor has its stack).
    pub fn new(wants: [bool; 4], tensor_sample_bytes: u64) -> Self {
        DeviceMemorySource { memory: DeviceMemory::default(), wants, ooms: Vec::new(), tensor_sample_bytes }
    }

    fn call(&mut self, call: &CudaCall, stack: &StackKey) {
        let (pid, t) = (call.sample.pid, call.sample.timestamp_ns);
        let class = call.api.class();
        let ok = call.result == 0;
        let with_call = || {
            let mut s = stack.clone();
            s.tail.push(TailFrame::Call(call.api.frame_name().to_string()));
            s
        };
        let site = || Rc::new(Site { stack: with_call(), device: call.device, via_allocator: call.in_allocator });
        let m = &mut self.memory;
        match class {
            CudaClass::Alloc if ok && call.addr != 0 => m.segment_allocated(t, pid, call.api, call.addr, call.size, site()),
            CudaClass::Alloc => {
                m.segments.failed();
                if call.in_allocator {
                    // PyTorch frees its cache and tries again; its own report says if it failed.
                    m.allocator_retries += 1;
                } else if call.result == OUT_OF_MEMORY {
                    self.out_of_memory(call, with_call(), None);
                }
            }
            CudaClass::Free | CudaClass::Map if ok => m.segment_changed(t, pid, call.api, call.addr, call.size, call.handle),
            CudaClass::TensorAlloc if call.addr != 0 => {
                // A drawn tensor stands for 1/chance of its kind; one passed over, for none.
                let weight = if call.stack_sampled_out { 0.0 } else { 1.0 / tensor_stack_chance(call.size, self.tensor_sample_bytes) };
                m.tensor_allocated(t, pid, call.api, call.addr, call.size, site(), weight)
            }
            CudaClass::TensorAlloc => m.tensors.failed(),
            CudaClass::TensorOom => {
                m.tensors.failed();
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
            Input::TensorFreed(call) => self.memory.tensor_freed(call.sample.timestamp_ns, call.sample.pid, call.addr),
            Input::ProcessExited(pid) => {
                // After its last record, which may have been read just now.
                let t = crate::cuda::memory_points::boot_time_ns().max(self.memory.timeline.last_ns() + 1);
                self.memory.process_exited(t, *pid)
            }
            _ => {}
        }
    }

    fn close(&mut self, _: &WindowInfo, _: &mut Stacks) -> Vec<Closed> {
        let comments = self.usage_comments();
        self.memory.window_closed();
        let (segment_allocs, segments_in_use) = self.memory.segments.take_window();
        let (tensor_allocs, tensors_in_use) = self.memory.tensors.take_window();
        let values = [segment_allocs, segments_in_use, tensor_allocs, tensors_in_use];
        ProfileKind::MEMORY
            .into_iter()
            .zip(values)
            .zip(self.wants)
            .filter(|(_, want)| *want)
            .map(|((kind, totals), _)| Closed { kind, values: site_values(&totals), comments: comments.clone() })
            .collect()
    }

    fn stats(&self, into: &mut SourceStats) {
        into.hbm = self.memory.segments.stats;
        into.tensors = self.memory.tensors.stats;
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
