//! HBM accounting: which stack allocated the device memory that is live, from the ordered stream
//! of allocation, free, map and unmap calls.
//!
//! Device pointers (cudaMalloc, cuMemAlloc and their async and managed forms) live from their
//! allocation to their free. Physical memory from cuMemCreate lives until it is released and no
//! longer mapped, as the driver keeps it; cuMemMap and cuMemUnmap tie addresses to handles.
//! cuMemAddressReserve is address space, not memory, and is never hooked.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use gpuflame_bpf::{CudaApi, CudaClass};

use crate::stacks::StackKey;

/// What an allocation's stack and device are, shared by its records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Site {
    pub stack: StackKey,
    pub device: u32,
    /// A segment PyTorch's caching allocator asked for while handing out a tensor: reserved
    /// memory, which the tensors in it hold.
    pub via_allocator: bool,
}

#[derive(Debug, Clone)]
struct Block {
    site: Rc<Site>,
    size: u64,
    /// What it stands for in its site's bytes and objects: 1, or under byte sampling 1/chance
    /// for a tensor whose stack was drawn and 0 for one passed over (its site is no stack).
    weight: f64,
}

/// `size` bytes of an allocation that stands for `weight` of its kind.
pub fn weighed(size: u64, weight: f64) -> i64 {
    if weight == 1.0 {
        size as i64
    } else {
        (size as f64 * weight).round() as i64
    }
}

fn weighed_count(weight: f64) -> i64 {
    if weight == 1.0 {
        1
    } else {
        weight.round() as i64
    }
}

#[derive(Debug, Clone)]
struct Physical {
    site: Rc<Site>,
    size: u64,
    released: bool,
    mappings: u32,
}

/// Bytes and objects per allocation site.
pub type SiteTotals = HashMap<Rc<Site>, (i64, i64)>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HbmStats {
    pub allocations: u64,
    pub frees: u64,
    /// Frees (or releases, unmaps) of memory allocated before the hooks saw it.
    pub unknown_frees: u64,
    pub failed_allocations: u64,
    /// Allocations at an address that was live: its free was not seen.
    pub overwritten: u64,
    /// Allocations whose stack byte sampling passed over (tensors under the agent's defaults).
    pub without_stack: u64,
    /// Allocations the live set had no room for: missing from in-use.
    pub untracked: u64,
}

#[derive(Default)]
pub struct Hbm {
    blocks: HashMap<(u32, u64), Block>,
    physical: HashMap<(u32, u64), Physical>,
    /// (pid, address) → (handle, size) of each mapping.
    mapped: BTreeMap<(u32, u64), (u64, u64)>,
    window_allocs: SiteTotals,
    /// In use by processes that exited during the window, as it was when they exited.
    exited_in_use: SiteTotals,
    pub stats: HbmStats,
}

impl Hbm {
    /// A successful allocation of `size` bytes at `addr` (or physical handle `addr`).
    pub fn allocated(&mut self, pid: u32, api: CudaApi, addr: u64, size: u64, site: Rc<Site>) {
        self.allocated_weighed(pid, api, addr, size, site, 1.0);
    }

    /// The same for an allocation that stands for `weight` of its kind in its site (see [`Block`]).
    pub fn allocated_weighed(&mut self, pid: u32, api: CudaApi, addr: u64, size: u64, site: Rc<Site>, weight: f64) {
        self.stats.allocations += 1;
        if weight == 0.0 {
            self.stats.without_stack += 1;
        } else {
            let t = self.window_allocs.entry(Rc::clone(&site)).or_default();
            t.0 += weighed(size, weight);
            t.1 += weighed_count(weight);
        }
        if api == CudaApi::CuMemCreate {
            self.physical.insert((pid, addr), Physical { site, size, released: false, mappings: 0 });
        } else if self.blocks.insert((pid, addr), Block { site, size, weight }).is_some() {
            self.stats.overwritten += 1;
        }
    }

    /// A block at `addr` freed; what it was, if it was known.
    pub fn freed(&mut self, pid: u32, addr: u64) -> Option<(Rc<Site>, u64)> {
        self.freed_weighed(pid, addr).map(|(site, size, _)| (site, size))
    }

    /// The same, with what the block stood for.
    pub fn freed_weighed(&mut self, pid: u32, addr: u64) -> Option<(Rc<Site>, u64, f64)> {
        match self.blocks.remove(&(pid, addr)) {
            Some(b) => {
                self.stats.frees += 1;
                Some((b.site, b.size, b.weight))
            }
            None => {
                self.stats.unknown_frees += 1;
                None
            }
        }
    }

    pub fn failed(&mut self) {
        self.stats.failed_allocations += 1;
    }

    /// A successful free, release, map or unmap; the block a free gave back, if it was known.
    pub fn changed(&mut self, pid: u32, api: CudaApi, addr: u64, size: u64, handle: u64) -> Option<(Rc<Site>, u64)> {
        match (api.class(), api) {
            (CudaClass::Free, CudaApi::CuMemRelease) => match self.physical.get_mut(&(pid, addr)) {
                Some(p) => {
                    p.released = true;
                    self.stats.frees += 1;
                    if p.mappings == 0 {
                        self.physical.remove(&(pid, addr));
                    }
                }
                None => self.stats.unknown_frees += 1,
            },
            // cudaFree(NULL) frees nothing.
            (CudaClass::Free, _) if addr == 0 => {}
            (CudaClass::Free, _) => return self.freed(pid, addr),
            (CudaClass::Map, CudaApi::CuMemMap) => {
                if let Some(p) = self.physical.get_mut(&(pid, handle)) {
                    p.mappings += 1;
                }
                self.mapped.insert((pid, addr), (handle, size));
            }
            (CudaClass::Map, _) => {
                let end = addr.saturating_add(size.max(1));
                let gone: Vec<(u32, u64)> = self.mapped.range((pid, addr)..(pid, end)).map(|(k, _)| *k).collect();
                for key in gone {
                    let Some((h, _)) = self.mapped.remove(&key) else { continue };
                    if let Some(p) = self.physical.get_mut(&(pid, h)) {
                        p.mappings = p.mappings.saturating_sub(1);
                        if p.released && p.mappings == 0 {
                            self.physical.remove(&(pid, h));
                        }
                    }
                }
            }
            _ => {}
        }
        None
    }

    /// The process ended: the driver gives its memory back. What it held is kept for the in-use
    /// profile of this window.
    pub fn process_exited(&mut self, pid: u32) {
        let held = self.in_use_of(Some(pid));
        for (site, (bytes, objects)) in held {
            let t = self.exited_in_use.entry(site).or_default();
            t.0 += bytes;
            t.1 += objects;
        }
        self.blocks.retain(|&(p, _), _| p != pid);
        self.physical.retain(|&(p, _), _| p != pid);
        self.mapped.retain(|&(p, _), _| p != pid);
    }

    /// Live bytes and objects per site, of one process or of all; under byte sampling, what the
    /// drawn blocks stand for.
    pub fn in_use_of(&self, pid: Option<u32>) -> SiteTotals {
        let mut out: SiteTotals = HashMap::new();
        let blocks = self.blocks.iter().map(|(k, b)| (k.0, &b.site, b.size, b.weight));
        let physical = self.physical.iter().map(|(k, p)| (k.0, &p.site, p.size, 1.0));
        for (p, site, size, weight) in blocks.chain(physical) {
            if pid.is_some_and(|want| want != p) || weight == 0.0 {
                continue;
            }
            let t = out.entry(Rc::clone(site)).or_default();
            t.0 += weighed(size, weight);
            t.1 += weighed_count(weight);
        }
        out
    }

    /// Live bytes per device, of one process or of all: (all, of them via PyTorch's allocator).
    pub fn by_device(&self, pid: Option<u32>) -> BTreeMap<u32, (u64, u64)> {
        let mut out: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        let blocks = self.blocks.iter().map(|(k, b)| (k.0, &b.site, b.size));
        let physical = self.physical.iter().map(|(k, p)| (k.0, &p.site, p.size));
        for (p, site, size) in blocks.chain(physical) {
            if pid.is_some_and(|want| want != p) {
                continue;
            }
            let t = out.entry(site.device).or_default();
            t.0 += size;
            if site.via_allocator {
                t.1 += size;
            }
        }
        out
    }

    /// Bytes live now, in one process.
    #[cfg(test)]
    pub fn bytes_in_use(&self, pid: u32) -> u64 {
        self.in_use_of(Some(pid)).values().map(|t| t.0 as u64).sum()
    }

    /// What was allocated in the window, and what is in use at its end; a new window starts.
    pub fn take_window(&mut self) -> (SiteTotals, SiteTotals) {
        let allocs = std::mem::take(&mut self.window_allocs);
        let mut in_use = self.in_use_of(None);
        for (site, (bytes, objects)) in std::mem::take(&mut self.exited_in_use) {
            let t = in_use.entry(site).or_default();
            t.0 += bytes;
            t.1 += objects;
        }
        (allocs, in_use)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(n: u32) -> Rc<Site> {
        let stack = StackKey { pid: 1, tid: n, comm: "t".into(), kernel: vec![], user: vec![], root: None, tail: vec![], leaf: None };
        Rc::new(Site { stack, device: 0, via_allocator: false })
    }

    #[test]
    fn frees_move_bytes_out_of_in_use() {
        let mut h = Hbm::default();
        h.allocated(1, CudaApi::CudaMalloc, 0x1000, 100, site(1));
        h.allocated(1, CudaApi::CudaMalloc, 0x2000, 50, site(1));
        h.changed(1, CudaApi::CudaFree, 0x1000, 0, 0);
        h.changed(1, CudaApi::CudaFree, 0x9999, 0, 0);
        let (allocs, in_use) = h.take_window();
        assert_eq!(allocs[&site(1)], (150, 2));
        assert_eq!(in_use[&site(1)], (50, 1));
        assert_eq!(h.stats.unknown_frees, 1);
        // The next window allocated nothing, and the block is still live.
        let (allocs, in_use) = h.take_window();
        assert!(allocs.is_empty());
        assert_eq!(in_use[&site(1)], (50, 1));
    }

    #[test]
    fn sampled_blocks_count_what_they_stand_for_and_passed_over_ones_nothing() {
        let mut h = Hbm::default();
        h.allocated_weighed(1, CudaApi::C10Malloc, 0x1000, 4096, site(1), 512.5);
        h.allocated_weighed(1, CudaApi::C10Malloc, 0x2000, 4096, site(1), 0.0);
        h.allocated_weighed(1, CudaApi::C10Malloc, 0x3000, 8 << 20, site(2), 1.0);
        assert_eq!((h.stats.allocations, h.stats.without_stack), (3, 1));
        let (allocs, in_use) = h.take_window();
        assert_eq!(allocs[&site(1)], (2_099_200, 513));
        assert_eq!(in_use[&site(2)], (8 << 20, 1));
        // Totals by device count every block once, by its size.
        assert_eq!(h.by_device(None)[&0], (4096 + 4096 + (8 << 20), 0));
        assert_eq!(h.freed_weighed(1, 0x1000).map(|(_, size, w)| (size, w)), Some((4096, 512.5)));
    }

    #[test]
    fn physical_memory_lives_until_released_and_unmapped() {
        let mut h = Hbm::default();
        h.allocated(1, CudaApi::CuMemCreate, 7, 20, site(2));
        h.changed(1, CudaApi::CuMemMap, 0x10_0000, 20, 7);
        h.changed(1, CudaApi::CuMemRelease, 7, 0, 0);
        assert_eq!(h.bytes_in_use(1), 20, "still mapped");
        h.changed(1, CudaApi::CuMemUnmap, 0x10_0000, 20, 0);
        assert_eq!(h.bytes_in_use(1), 0);
    }

    #[test]
    fn an_exited_process_keeps_its_in_use_for_the_window() {
        let mut h = Hbm::default();
        h.allocated(1, CudaApi::CudaMalloc, 0x1000, 100, site(1));
        h.process_exited(1);
        assert_eq!(h.bytes_in_use(1), 0);
        let (_, in_use) = h.take_window();
        assert_eq!(in_use[&site(1)], (100, 1));
        assert!(h.take_window().1.is_empty());
    }
}
