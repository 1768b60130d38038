//! Device memory as CUDA gave it (segments) and as PyTorch's caching allocator hands it to
//! tensors: what is reserved, what tensors hold, the difference (cached), and which stacks hold
//! it over time.
//!
//! Segments are `cuda::hbm`'s accounting of cudaMalloc and the driver's allocations. Tensors are
//! the same accounting of the allocator's `malloc` and frees, in a ledger of their own. A segment
//! the allocator asked for while a tensor waited is reserved memory: the tensors in it hold it,
//! so the holders of a process are its tensors and the segments that something else (NCCL, a
//! cuBLAS workspace, raw CUDA calls) allocated.

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

use gpuflame_bpf::CudaApi;

use super::hbm::{Hbm, Site, SiteTotals};
use super::memory_points::MemoryTimeline;

/// One device's memory, over the processes asked about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUse {
    pub device: u32,
    /// Segments PyTorch's allocator holds (all segments where no allocator was seen).
    pub reserved: u64,
    /// Bytes tensors hold; None where no allocator was seen at work.
    pub allocated: Option<u64>,
    /// Segments allocated outside the allocator, where one was seen.
    pub outside: u64,
}

impl DeviceUse {
    /// Reserved but held by no tensor: the allocator's cache, and rounding.
    pub fn cached(&self) -> Option<u64> {
        self.allocated.map(|a| self.reserved.saturating_sub(a))
    }

    pub fn allocator_seen(&self) -> bool {
        self.allocated.is_some()
    }
}

/// `device 0: reserved 300.0 MiB, allocated 250.0 MiB, cached 50.0 MiB; outside the allocator 8.0 MiB`.
impl std::fmt::Display for DeviceUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let h = super::human_bytes;
        match (self.allocated, self.cached()) {
            (Some(a), Some(c)) => write!(
                f,
                "device {}: reserved {}, allocated {}, cached {}; outside the allocator {}",
                self.device,
                h(self.reserved),
                h(a),
                h(c),
                h(self.outside)
            ),
            _ => write!(f, "device {}: in use {} (no PyTorch caching allocator seen: segments only)", self.device, h(self.reserved)),
        }
    }
}

#[derive(Default)]
pub struct DeviceMemory {
    pub segments: Hbm,
    pub tensors: Hbm,
    /// Processes whose caching allocator was seen handing out tensors.
    allocator_pids: HashSet<u32>,
    /// Kept only when a timeline is drawn (`record`): its sites grow with every stack that
    /// held memory, which an agent running for weeks must not keep.
    pub timeline: MemoryTimeline,
    pub timeline_on: bool,
    /// Segment allocations that failed inside the allocator, which then frees its cache and
    /// tries again: an out-of-memory only if its own report follows.
    pub allocator_retries: u64,
    /// What processes that exited during the window held when they exited; kept after the
    /// window closes (its report reads it) until something happens in the next.
    exited: Vec<DeviceUse>,
    exited_stale: bool,
}

impl DeviceMemory {
    pub fn segment_allocated(&mut self, t_ns: u64, pid: u32, api: CudaApi, addr: u64, size: u64, site: Rc<Site>) {
        self.next_window();
        if !site.via_allocator && api != CudaApi::CuMemCreate {
            self.track(t_ns, &site, size as i64);
        }
        self.segments.allocated(pid, api, addr, size, site);
    }

    /// A segment freed, released, mapped or unmapped.
    pub fn segment_changed(&mut self, t_ns: u64, pid: u32, api: CudaApi, addr: u64, size: u64, handle: u64) {
        if let Some((site, size)) = self.segments.changed(pid, api, addr, size, handle).filter(|(s, _)| !s.via_allocator) {
            self.track(t_ns, &site, -(size as i64));
        }
    }

    /// `weight`: what the tensor stands for in its stack's bytes (byte sampling: 1/chance for a
    /// drawn one, 0 for one passed over; 1 without sampling). Totals count its size.
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_allocated(&mut self, t_ns: u64, pid: u32, api: CudaApi, addr: u64, size: u64, site: Rc<Site>, weight: f64) {
        self.next_window();
        self.allocator_pids.insert(pid);
        self.track(t_ns, &site, super::hbm::weighed(size, weight));
        self.tensors.allocated_weighed(pid, api, addr, size, site, weight);
    }

    pub fn tensor_freed(&mut self, t_ns: u64, pid: u32, addr: u64) {
        if let Some((site, size, weight)) = self.tensors.freed_weighed(pid, addr) {
            self.track(t_ns, &site, -super::hbm::weighed(size, weight));
        }
    }

    fn track(&mut self, t_ns: u64, site: &Rc<Site>, delta: i64) {
        if self.timeline_on && delta != 0 {
            self.timeline.change(t_ns, site, delta);
        }
    }

    /// An allocation failed for lack of memory: marked on the timeline.
    pub fn out_of_memory(&mut self, t_ns: u64, device: u32, requested: u64) {
        if self.timeline_on {
            self.timeline.oom(t_ns, device, requested);
        }
    }

    pub fn allocator_seen(&self, pid: u32) -> bool {
        self.allocator_pids.contains(&pid)
    }

    pub fn process_exited(&mut self, t_ns: u64, pid: u32) {
        self.next_window();
        let held = self.by_device(Some(pid));
        self.exited = merge(std::mem::take(&mut self.exited), held);
        if self.timeline_on {
            // The state before the exit, then the memory gone at once: one step down.
            self.timeline.flush();
            for (site, (bytes, _)) in self.holders(pid, None) {
                self.timeline.change_without_point(t_ns, &site, -bytes);
            }
            self.timeline.flush();
        }
        self.segments.process_exited(pid);
        self.tensors.process_exited(pid);
        self.allocator_pids.remove(&pid);
    }

    /// What holds the memory of process `pid` (on one device, or all): its tensors, and the
    /// segments allocated outside its allocator.
    pub fn holders(&self, pid: u32, device: Option<u32>) -> SiteTotals {
        let mut out = self.tensors.in_use_of(Some(pid));
        out.extend(self.segments.in_use_of(Some(pid)).into_iter().filter(|(s, _)| !s.via_allocator));
        out.retain(|s, _| device.is_none_or(|d| s.device == d));
        out
    }

    /// Per device, what the processes hold now and what those that exited in this window held
    /// when they exited.
    pub fn window_by_device(&self) -> Vec<DeviceUse> {
        merge(self.by_device(None), self.exited.clone())
    }

    /// A new window: processes that exited are forgotten.
    pub fn window_closed(&mut self) {
        self.exited_stale = true;
    }

    fn next_window(&mut self) {
        if std::mem::take(&mut self.exited_stale) {
            self.exited.clear();
        }
    }

    /// Reserved, allocated and cached per device, of one process or of all.
    pub fn by_device(&self, pid: Option<u32>) -> Vec<DeviceUse> {
        let segments = self.segments.by_device(pid);
        let tensors = self.tensors.by_device(pid);
        let allocator = match pid {
            Some(p) => self.allocator_seen(p),
            None => !self.allocator_pids.is_empty(),
        };
        let mut devices: BTreeMap<u32, DeviceUse> = BTreeMap::new();
        for (&device, &(all, via)) in &segments {
            let d = devices.entry(device).or_insert(DeviceUse { device, ..Default::default() });
            if allocator {
                d.reserved = via;
                d.outside = all - via;
            } else {
                d.reserved = all;
            }
        }
        if allocator {
            for d in devices.values_mut() {
                d.allocated = Some(0);
            }
            for (&device, &(bytes, _)) in &tensors {
                devices.entry(device).or_insert(DeviceUse { device, ..Default::default() }).allocated = Some(bytes);
            }
        }
        devices.into_values().collect()
    }
}

/// Two sets of devices' figures, added up device by device.
fn merge(a: Vec<DeviceUse>, b: Vec<DeviceUse>) -> Vec<DeviceUse> {
    let mut by: BTreeMap<u32, DeviceUse> = BTreeMap::new();
    for d in a.into_iter().chain(b) {
        let t = by.entry(d.device).or_insert(DeviceUse { device: d.device, ..Default::default() });
        t.reserved += d.reserved;
        t.outside += d.outside;
        t.allocated = match (t.allocated, d.allocated) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
        };
    }
    by.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::StackKey;

    fn site(n: u32, via_allocator: bool) -> Rc<Site> {
        let stack = StackKey { pid: 1, tid: n, comm: "t".into(), kernel: vec![], user: vec![], root: None, tail: vec![], leaf: None };
        Rc::new(Site { stack, device: 0, via_allocator })
    }

    #[test]
    fn reserved_allocated_and_cached_per_device() {
        let mut m = DeviceMemory { timeline_on: true, ..Default::default() };
        m.segment_allocated(1, 1, CudaApi::CudaMalloc, 0x1000, 20 << 20, site(1, true));
        m.tensor_allocated(1, 1, CudaApi::C10Malloc, 0x1000, 4 << 20, site(2, false), 1.0);
        m.tensor_allocated(2, 1, CudaApi::C10Malloc, 0x2000, 6 << 20, site(3, false), 1.0);
        m.segment_allocated(3, 1, CudaApi::CudaMalloc, 0x9000, 1 << 20, site(4, false));
        m.tensor_freed(4, 1, 0x2000);
        m.tensor_freed(4, 1, 0x7777);
        let d = m.by_device(Some(1));
        assert_eq!(d, vec![DeviceUse { device: 0, reserved: 20 << 20, allocated: Some(4 << 20), outside: 1 << 20 }]);
        assert_eq!(d[0].cached(), Some(16 << 20));
        assert_eq!(m.tensors.stats.unknown_frees, 1);
        // The holders: the live tensor and the segment from outside the allocator.
        let holders = m.holders(1, Some(0));
        assert_eq!(holders.len(), 2);
        assert_eq!(holders[&site(2, false)], (4 << 20, 1));
        assert_eq!(holders[&site(4, false)], (1 << 20, 1));
        m.timeline.finish(5);
        let (_, points) = m.timeline.devices().next().unwrap();
        assert_eq!(points.last().unwrap().total, 5 << 20);
    }

    #[test]
    fn without_an_allocator_segments_are_what_is_reserved() {
        let mut m = DeviceMemory::default();
        m.segment_allocated(1, 1, CudaApi::CudaMalloc, 0x1000, 100, site(1, false));
        assert_eq!(m.by_device(None), vec![DeviceUse { device: 0, reserved: 100, allocated: None, outside: 0 }]);
    }
}
