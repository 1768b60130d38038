//! The live set of device memory as the kernel keeps it (`gpuflame_bpf::LiveAllocation`), made
//! into what the profiles need: its allocations' sites, from the stacks the ring carried once
//! each, and in-use by site and by device.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use gpuflame_bpf::{tensor_stack_chance, CudaApi, CudaClass, CudaCounters, LiveAllocation, LiveKind};

use super::hbm::{weighed, Site, SiteTotals};
use crate::stacks::{StackKey, TailFrame};

/// Where the stack of an allocation whose record the full ring turned away would be.
pub const STACKS_LOST: &str = "[stacks lost: ring full]";
/// Where the stack of an allocation is that user space never read (its process's record
/// decoded badly, or a stack id from a process that had the pid before).
pub const STACK_NOT_READ: &str = "[stack not read]";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SiteKey {
    pid: u32,
    stack: u64,
    api: Option<CudaApi>,
    device: u32,
    via_allocator: bool,
}

/// The stacks of the live set's allocations, by the ids the programs gave them.
#[derive(Default)]
pub struct LiveSites {
    /// (pid, stack id) → the caller's stack, the allocating call at its tail.
    stacks: HashMap<(u32, u64), StackKey>,
    comms: HashMap<u32, String>,
    sites: HashMap<SiteKey, Rc<Site>>,
    /// Byte sampling's interval (0: every tensor's stack).
    tensor_sample_bytes: u64,
}

impl LiveSites {
    pub fn new(tensor_sample_bytes: u64) -> Self {
        LiveSites { tensor_sample_bytes, ..Default::default() }
    }

    /// An allocation's record came with its stack (the first of its stack id).
    pub fn learn(&mut self, pid: u32, id: u64, stack: StackKey) {
        self.comms.entry(pid).or_insert_with(|| stack.comm.clone());
        self.stacks.insert((pid, id), stack);
    }

    /// The site of an allocation; None for a tensor byte sampling passed over, which counts in
    /// the totals and under no stack.
    pub fn site(&mut self, pid: u32, stack: u64, kind: &LiveKind) -> Option<Rc<Site>> {
        if kind.sampled_out {
            return None;
        }
        let key = SiteKey { pid, stack, api: kind.api, device: kind.device, via_allocator: kind.in_allocator };
        if let Some(site) = self.sites.get(&key) {
            return Some(Rc::clone(site));
        }
        let call = TailFrame::Call(kind.api.map_or("[allocation]", CudaApi::frame_name).to_string());
        let marker = |text: &str| {
            let comm = self.comms.get(&pid).cloned().unwrap_or_default();
            StackKey::marker(pid, comm, vec![TailFrame::Marker(text.to_string()), call.clone()])
        };
        let stack = match self.stacks.get(&(pid, stack)) {
            Some(s) if !kind.stack_lost => s.clone(),
            _ if kind.stack_lost || stack == 0 => marker(STACKS_LOST),
            _ => marker(STACK_NOT_READ),
        };
        let site = Rc::new(Site { stack, device: kind.device, via_allocator: kind.in_allocator });
        self.sites.insert(key, Rc::clone(&site));
        Some(site)
    }

    /// What an allocation of `size` bytes stands for in its site: 1, or under byte sampling
    /// 1/chance for a tensor whose stack was drawn (and 0 for one passed over: no site).
    pub fn weight(&self, size: u64, kind: &LiveKind) -> f64 {
        match kind.api.map(CudaApi::class) {
            Some(CudaClass::TensorAlloc) if kind.sampled_out => 0.0,
            Some(CudaClass::TensorAlloc) => 1.0 / tensor_stack_chance(size, self.tensor_sample_bytes),
            _ => 1.0,
        }
    }

    /// The process is gone: its stacks go (its allocations went with it).
    pub fn forget(&mut self, pid: u32) {
        self.stacks.retain(|&(p, _), _| p != pid);
        self.sites.retain(|k, _| k.pid != pid);
        self.comms.remove(&pid);
    }

    /// In use by site, of the tensors (`tensors`) or of the segments allocated outside the
    /// allocator and in it, of one process and device or of all.
    pub fn in_use(&mut self, live: &[LiveAllocation], tensors: bool, pid: Option<u32>, device: Option<u32>) -> SiteTotals {
        let mut out: SiteTotals = HashMap::new();
        for a in live {
            if is_tensor(a) != tensors || pid.is_some_and(|p| p != a.pid) || device.is_some_and(|d| d != a.kind.device) {
                continue;
            }
            let weight = self.weight(a.size, &a.kind);
            let Some(site) = self.site(a.pid, a.stack, &a.kind) else { continue };
            let t = out.entry(site).or_default();
            t.0 += weighed(a.size, weight);
            t.1 += if weight == 1.0 { 1 } else { weight.round() as i64 };
        }
        out
    }
}

/// What a full ring or a full live set cost device memory's profiles, in a line each; none when
/// nothing was lost. A full ring costs stacks and the timeline, never in-use totals.
pub fn loss_lines(c: &CudaCounters) -> Vec<String> {
    let mut lines = Vec::new();
    if c.memory_events_lost > 0 || c.memory_stacks_lost > 0 {
        lines.push(format!(
            "a full ring lost {} memory records and the stacks of {} allocations: the memory timeline and the allocation profiles miss those records; in-use has every allocation (read from the live set the kernel keeps), those whose stack was lost under {STACKS_LOST}",
            c.memory_events_lost, c.memory_stacks_lost
        ));
    }
    if c.live_full > 0 {
        lines.push(format!(
            "{} allocations were not kept: the live set was full (--max-live-allocations); in-use misses them",
            c.live_full
        ));
    }
    lines
}

pub fn is_tensor(a: &LiveAllocation) -> bool {
    a.kind.api.is_some_and(|api| api.class() == CudaClass::TensorAlloc)
}

/// Bytes live per device, of one process or of all: (segments, of them PyTorch's allocator's,
/// tensors).
pub fn by_device(live: &[LiveAllocation], pid: Option<u32>) -> BTreeMap<u32, (u64, u64, u64)> {
    let mut out: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for a in live.iter().filter(|a| pid.is_none_or(|p| p == a.pid)) {
        let t = out.entry(a.kind.device).or_default();
        if is_tensor(a) {
            t.2 += a.size;
        } else {
            t.0 += a.size;
            if a.kind.in_allocator {
                t.1 += a.size;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(pid: u32, n: u32) -> StackKey {
        StackKey { pid, tid: n, comm: "t".into(), kernel: vec![], user: vec![], root: None, tail: vec![], leaf: None }
    }

    fn alloc(pid: u32, addr: u64, size: u64, stack: u64, api: CudaApi, f: impl FnOnce(&mut LiveKind)) -> LiveAllocation {
        let mut kind = LiveKind { api: Some(api), ..Default::default() };
        f(&mut kind);
        LiveAllocation { pid, tid: pid, addr, size, stack, t_ns: 1, stream: 0, freed_ns: 0, kind }
    }

    #[test]
    fn in_use_by_site_marks_lost_stacks_and_weighs_sampled_tensors() {
        let mut sites = LiveSites::new(2 << 20);
        sites.learn(1, 11, stack(1, 1));
        let live = vec![
            alloc(1, 0x1000, 4 << 20, 11, CudaApi::C10Malloc, |_| {}),
            alloc(1, 0x2000, 4 << 20, 11, CudaApi::C10Malloc, |_| {}),
            alloc(1, 0x3000, 4096, 0, CudaApi::C10Malloc, |k| k.sampled_out = true),
            alloc(1, 0x4000, 8 << 20, 0, CudaApi::C10Malloc, |k| k.stack_lost = true),
            alloc(1, 0x5000, 20 << 20, 12, CudaApi::CudaMalloc, |k| k.in_allocator = true),
            alloc(2, 0x1000, 1 << 20, 13, CudaApi::C10Malloc, |_| {}),
        ];
        let tensors = sites.in_use(&live, true, Some(1), None);
        let mut by: Vec<(String, i64, i64)> = tensors.iter().map(|(s, t)| (format!("{:?}", s.stack.tail.first()), t.0, t.1)).collect();
        by.sort();
        assert_eq!(by.len(), 2, "{by:?}");
        assert!(by.iter().any(|b| b.0.contains(STACKS_LOST) && b.1 == 8 << 20 && b.2 == 1), "{by:?}");
        assert!(by.iter().any(|b| !b.0.contains(STACKS_LOST) && b.1 == 8 << 20 && b.2 == 2), "{by:?}");
        // The segment's stack was never read: named so, not dropped.
        let segments = sites.in_use(&live, false, None, None);
        assert!(segments.keys().all(|s| s.via_allocator && matches!(&s.stack.tail[0], TailFrame::Marker(m) if m == STACK_NOT_READ)));
        assert_eq!(by_device(&live, Some(1))[&0], (20 << 20, 20 << 20, (16 << 20) + 4096));
        assert_eq!(by_device(&live, None)[&0].2, (17 << 20) + 4096);
    }
}
