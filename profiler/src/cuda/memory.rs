//! Device memory as CUDA gave it (segments) and as PyTorch's caching allocator hands it to
//! tensors: what is reserved, what tensors hold, the difference (cached), and which stacks hold
//! it over time.
//!
//! What is in use is read from the live set the kernel keeps (`cuda::live`), tensors and
//! segments (cudaMalloc and the like) alike; the memory records (allocations and frees, with
//! their stack ids) make the allocation profiles and the timeline; physical memory (cuMemCreate)
//! is `cuda::hbm`'s accounting of its records. A segment the allocator asked for while a tensor
//! waited is reserved memory: the tensors in it hold it, so the holders of a process are its
//! tensors and the segments that something else (NCCL, a cuBLAS workspace, raw CUDA calls)
//! allocated.

use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

use gpuflame_bpf::{CudaApi, LiveAllocation, MemoryChange, MemoryEvent};

use super::hbm::{weighed, Hbm, HbmStats, Site, SiteTotals};
use super::live::{self, is_tensor, LiveSites};
use super::memory_points::MemoryTimeline;
use crate::stacks::StackKey;

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
    /// Physical memory (cuMemCreate), followed from the records: the live set keeps addresses.
    pub physical: Hbm,
    pub sites: LiveSites,
    /// Counted from the memory records: segments (cudaMalloc and the like) and tensors.
    pub segment_stats: HbmStats,
    pub tensor_stats: HbmStats,
    segment_allocs: SiteTotals,
    tensor_allocs: SiteTotals,
    /// The live set as read at the last window's end.
    live: Vec<LiveAllocation>,
    /// The live set of a process at its out-of-memory, as it was then.
    oom_live: Option<(u32, Vec<LiveAllocation>)>,
    /// Processes whose caching allocator was seen handing out tensors.
    allocator_pids: HashSet<u32>,
    /// Kept only when a timeline is drawn (`record`): its sites grow with every stack that
    /// held memory, which an agent running for weeks must not keep.
    pub timeline: MemoryTimeline,
    pub timeline_on: bool,
    /// Segment allocations that failed inside the allocator, which then frees its cache and
    /// tries again: an out-of-memory only if its own report follows.
    pub allocator_retries: u64,
    /// Physical memory of processes that exited during the window, as it was when they exited.
    exited: Vec<DeviceUse>,
    exited_stale: bool,
}

impl DeviceMemory {
    pub fn new(tensor_sample_bytes: u64) -> Self {
        DeviceMemory { sites: LiveSites::new(tensor_sample_bytes), ..Default::default() }
    }

    /// The record of an allocation that carried its stack: what its stack id stands for.
    pub fn learn_stack(&mut self, pid: u32, stack_id: u64, stack: StackKey) {
        if stack_id != 0 {
            self.sites.learn(pid, stack_id, stack);
        }
    }

    /// Process `pid` allocated a tensor through PyTorch's allocator.
    pub fn allocator_used(&mut self, pid: u32) {
        self.allocator_pids.insert(pid);
    }

    /// Physical memory created (cuMemCreate): user space's to follow, by its records.
    pub fn physical_created(&mut self, pid: u32, api: CudaApi, handle: u64, size: u64, site: Rc<Site>) {
        self.next_window();
        self.segment_stats.allocations += 1;
        self.physical.allocated(pid, api, handle, size, site);
    }

    /// Physical memory released, mapped or unmapped.
    pub fn physical_changed(&mut self, pid: u32, api: CudaApi, addr: u64, size: u64, handle: u64) {
        self.physical.changed(pid, api, addr, size, handle);
    }

    /// An allocation or free of the live set, as its record told it.
    pub fn memory_event(&mut self, e: &MemoryEvent) {
        self.next_window();
        let tensor = e.kind.api.is_some_and(CudaApi::is_tensor);
        let stats = if tensor { &mut self.tensor_stats } else { &mut self.segment_stats };
        match e.change {
            MemoryChange::Allocated { replaced, untracked } => {
                stats.allocations += 1;
                stats.overwritten += u64::from(replaced);
                stats.untracked += u64::from(untracked);
                if tensor {
                    self.allocator_pids.insert(e.pid);
                }
                let weight = self.sites.weight(e.size, &e.kind);
                let Some(site) = self.sites.site(e.pid, e.stack, &e.kind) else {
                    stats.without_stack += 1;
                    return;
                };
                let t = if tensor { &mut self.tensor_allocs } else { &mut self.segment_allocs }.entry(Rc::clone(&site)).or_default();
                t.0 += weighed(e.size, weight);
                t.1 += if weight == 1.0 { 1 } else { weight.round() as i64 };
                if tensor || !site.via_allocator {
                    self.track(e.timestamp_ns, &site, weighed(e.size, weight));
                }
            }
            MemoryChange::Freed => {
                stats.frees += 1;
                let weight = self.sites.weight(e.size, &e.kind);
                if let Some(site) = self.sites.site(e.pid, e.stack, &e.kind) {
                    if tensor || !site.via_allocator {
                        self.track(e.timestamp_ns, &site, -weighed(e.size, weight));
                    }
                }
            }
            MemoryChange::UnknownFree => stats.unknown_frees += 1,
        }
    }

    /// The live set as read at a window's end: in-use is made of it. Frees held for an
    /// out-of-memory are frees.
    pub fn live_at_window_end(&mut self, mut live: Vec<LiveAllocation>) {
        live.retain(|a| a.freed_ns == 0);
        self.live = live;
    }

    /// The live set of `pid` at its out-of-memory, for the report that comes next.
    pub fn live_at_oom(&mut self, pid: u32, live: Vec<LiveAllocation>) {
        self.oom_live = Some((pid, live));
    }

    /// What the last read of the live set says of `pid`: its out-of-memory's, where it had one.
    fn live_of(&self, pid: u32) -> &[LiveAllocation] {
        match &self.oom_live {
            Some((p, live)) if *p == pid => live,
            _ => &self.live,
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
        self.allocator_pids.contains(&pid) || self.live_of(pid).iter().any(|a| a.pid == pid && is_tensor(a))
    }

    pub fn process_exited(&mut self, t_ns: u64, pid: u32) {
        self.next_window();
        let held = physical_by_device(&self.physical, Some(pid));
        self.exited = merge(std::mem::take(&mut self.exited), held);
        if self.timeline_on {
            // The state before the exit, then the memory gone at once: one step down.
            self.timeline.flush();
            for (site, bytes) in self.timeline.held_by(pid) {
                self.timeline.change_without_point(t_ns, &site, -bytes);
            }
            self.timeline.flush();
        }
        self.physical.process_exited(pid);
        if matches!(&self.oom_live, Some((p, _)) if *p == pid) {
            self.oom_live = None;
        }
    }

    /// The process's records are all in: its stacks go.
    pub fn forget(&mut self, pid: u32) {
        self.sites.forget(pid);
        self.allocator_pids.remove(&pid);
    }

    /// What holds the memory of process `pid` (on one device, or all): its tensors, and the
    /// segments allocated outside its allocator.
    pub fn holders(&mut self, pid: u32, device: Option<u32>) -> SiteTotals {
        // The fields apart: the sites are named while the set is read.
        let live: &[LiveAllocation] = match &self.oom_live {
            Some((p, live)) if *p == pid => live,
            _ => &self.live,
        };
        let mut out = self.sites.in_use(live, true, Some(pid), device);
        out.extend(self.sites.in_use(live, false, Some(pid), device).into_iter().filter(|(s, _)| !s.via_allocator));
        out.extend(self.physical.in_use_of(Some(pid)).into_iter().filter(|(s, _)| device.is_none_or(|d| s.device == d)));
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

    /// What was allocated in the window and what is in use at its end, of segments then of
    /// tensors: [segment allocs, segments in use, tensor allocs, tensors in use].
    pub fn take_window(&mut self) -> [SiteTotals; 4] {
        let (physical_allocs, physical_in_use) = self.physical.take_window();
        let mut segment_allocs = std::mem::take(&mut self.segment_allocs);
        segment_allocs.extend(physical_allocs);
        let mut segments = self.sites.in_use(&self.live, false, None, None);
        segments.extend(physical_in_use);
        let tensors = self.sites.in_use(&self.live, true, None, None);
        [segment_allocs, segments, std::mem::take(&mut self.tensor_allocs), tensors]
    }

    /// Reserved, allocated and cached per device, of one process or of all.
    pub fn by_device(&self, pid: Option<u32>) -> Vec<DeviceUse> {
        let live = pid.map_or(&self.live[..], |p| self.live_of(p));
        let allocator = match pid {
            Some(p) => self.allocator_seen(p),
            None => !self.allocator_pids.is_empty() || live.iter().any(is_tensor),
        };
        let mut devices: BTreeMap<u32, DeviceUse> = BTreeMap::new();
        for (device, (all, via, tensors)) in live::by_device(live, pid) {
            let d = devices.entry(device).or_insert(DeviceUse { device, ..Default::default() });
            if allocator {
                d.reserved = via;
                d.outside = all - via;
                d.allocated = Some(tensors);
            } else {
                d.reserved = all;
            }
        }
        for d in physical_by_device(&self.physical, pid) {
            let e = devices.entry(d.device).or_insert(DeviceUse { device: d.device, ..Default::default() });
            if allocator {
                e.outside += d.reserved;
                e.allocated.get_or_insert(0);
            } else {
                e.reserved += d.reserved;
            }
        }
        devices.into_values().collect()
    }
}

/// Physical memory live per device, as reserved bytes.
fn physical_by_device(physical: &Hbm, pid: Option<u32>) -> Vec<DeviceUse> {
    physical.by_device(pid).into_iter().map(|(device, (all, _))| DeviceUse { device, reserved: all, ..Default::default() }).collect()
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
    use gpuflame_bpf::LiveKind;

    fn stack(n: u32) -> StackKey {
        StackKey { pid: 1, tid: n, comm: "t".into(), kernel: vec![], user: vec![], root: None, tail: vec![], leaf: None }
    }

    fn kind(api: CudaApi, in_allocator: bool) -> LiveKind {
        LiveKind { api: Some(api), in_allocator, ..Default::default() }
    }

    fn event(t: u64, addr: u64, size: u64, stack: u64, kind: LiveKind, change: MemoryChange) -> MemoryEvent {
        MemoryEvent { pid: 1, tid: 1, timestamp_ns: t, addr, size, stack, kind, change }
    }

    fn live(addr: u64, size: u64, stack: u64, kind: LiveKind) -> LiveAllocation {
        LiveAllocation { pid: 1, tid: 1, addr, size, stack, t_ns: 1, stream: 0, freed_ns: 0, kind }
    }

    const NEW: MemoryChange = MemoryChange::Allocated { replaced: false, untracked: false };

    #[test]
    fn reserved_allocated_and_cached_per_device_from_the_live_set() {
        let mut m = DeviceMemory { timeline_on: true, ..DeviceMemory::new(0) };
        for (id, n) in [(11, 1), (12, 2), (13, 3), (14, 4)] {
            m.learn_stack(1, id, stack(n));
        }
        let (segment, tensor, outside) = (kind(CudaApi::CudaMalloc, true), kind(CudaApi::C10Malloc, false), kind(CudaApi::CudaMalloc, false));
        m.memory_event(&event(1, 0x1000, 20 << 20, 11, segment, NEW));
        m.memory_event(&event(1, 0x1000, 4 << 20, 12, tensor, NEW));
        m.memory_event(&event(2, 0x2000, 6 << 20, 13, tensor, NEW));
        m.memory_event(&event(3, 0x9000, 1 << 20, 14, outside, NEW));
        m.memory_event(&event(4, 0x2000, 6 << 20, 13, tensor, MemoryChange::Freed));
        let unknown = LiveKind { api: Some(CudaApi::C10LocalRawDelete), ..Default::default() };
        m.memory_event(&event(4, 0x7777, 0, 0, unknown, MemoryChange::UnknownFree));
        assert_eq!((m.tensor_stats.allocations, m.tensor_stats.frees, m.tensor_stats.unknown_frees), (2, 1, 1));
        m.live_at_window_end(vec![live(0x1000, 20 << 20, 11, segment), live(0x1000, 4 << 20, 12, tensor), live(0x9000, 1 << 20, 14, outside)]);
        let d = m.by_device(Some(1));
        assert_eq!(d, vec![DeviceUse { device: 0, reserved: 20 << 20, allocated: Some(4 << 20), outside: 1 << 20 }]);
        assert_eq!(d[0].cached(), Some(16 << 20));
        // The holders: the live tensor and the segment from outside the allocator.
        let holders = m.holders(1, Some(0));
        assert_eq!(holders.values().copied().collect::<std::collections::BTreeSet<_>>(), [(1 << 20, 1), (4 << 20, 1)].into());
        let [segment_allocs, segments, tensor_allocs, tensors] = m.take_window();
        assert_eq!((segment_allocs.len(), segments.len(), tensor_allocs.len(), tensors.len()), (2, 2, 2, 1));
        m.timeline.finish(5);
        let (_, points) = m.timeline.devices().next().unwrap();
        assert_eq!(points.last().unwrap().total, 5 << 20);
    }

    #[test]
    fn the_live_set_at_an_oom_is_what_the_report_reads() {
        let mut m = DeviceMemory::new(0);
        let tensor = kind(CudaApi::C10Malloc, false);
        m.live_at_window_end(vec![live(0x1000, 100, 1, tensor)]);
        m.live_at_oom(1, vec![live(0x1000, 100, 1, tensor), live(0x2000, 300, 1, tensor)]);
        assert_eq!(m.holders(1, None).values().map(|t| t.0).sum::<i64>(), 400);
        assert_eq!(m.by_device(Some(1))[0].allocated, Some(400));
        assert_eq!(m.by_device(None)[0].allocated, Some(100));
    }

    #[test]
    fn without_an_allocator_segments_are_what_is_reserved() {
        let mut m = DeviceMemory::new(0);
        m.live_at_window_end(vec![live(0x1000, 100, 1, kind(CudaApi::CudaMalloc, false))]);
        assert_eq!(m.by_device(None), vec![DeviceUse { device: 0, reserved: 100, allocated: None, outside: 0 }]);
    }
}
