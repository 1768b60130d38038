//! Device memory over time: the bytes in use per device, and which allocation sites hold them,
//! as points along the run, for the memory timeline.
//!
//! Memory stays bounded however long the run: a device keeps at most [`MAX_POINTS`] points, each
//! with at most [`TOP_PER_POINT`] sites and the rest as one sum. When the points are full, every
//! other one is dropped and points are taken half as often from then on, so a run of any length
//! is drawn end to end, finer when it is short.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use super::hbm::Site;

pub const MAX_POINTS: usize = 512;
pub const TOP_PER_POINT: usize = 16;
/// Points are first taken at most every 10 µs: a short run is drawn change by change.
const FIRST_RESOLUTION_NS: u64 = 10_000;

/// The state of one device at one time: in use in all, and by its biggest sites.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    pub total: u64,
    /// (site index, bytes), biggest first; the rest of `total` is held by other sites.
    pub top: Vec<(u32, u64)>,
    /// An out-of-memory failure's: never dropped.
    pub pinned: bool,
}

#[derive(Debug, Default)]
struct DeviceLine {
    live: HashMap<u32, u64>,
    total: u64,
    points: Vec<Point>,
    resolution_ns: u64,
    /// A change since the last point.
    dirty: bool,
}

/// An allocation that failed for lack of memory, where it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct OomMark {
    pub t_ns: u64,
    pub device: u32,
    pub requested: u64,
}

#[derive(Debug, Default)]
pub struct MemoryTimeline {
    sites: Vec<Rc<Site>>,
    index: HashMap<Rc<Site>, u32>,
    devices: BTreeMap<u32, DeviceLine>,
    pub ooms: Vec<OomMark>,
    first_ns: Option<u64>,
    last_ns: u64,
}

impl MemoryTimeline {
    /// `site` holds `delta` bytes more (or fewer) on its device from `t_ns` on.
    pub fn change(&mut self, t_ns: u64, site: &Rc<Site>, delta: i64) {
        self.apply(t_ns, site, delta, true);
    }

    /// Changes that happen at once (a process's exit): drawn as one step by the next
    /// [`MemoryTimeline::flush`].
    pub fn change_without_point(&mut self, t_ns: u64, site: &Rc<Site>, delta: i64) {
        self.apply(t_ns, site, delta, false);
    }

    fn apply(&mut self, t_ns: u64, site: &Rc<Site>, delta: i64, point: bool) {
        let id = match self.index.get(site) {
            Some(&id) => id,
            None => {
                let id = self.sites.len() as u32;
                self.sites.push(Rc::clone(site));
                self.index.insert(Rc::clone(site), id);
                id
            }
        };
        self.first_ns.get_or_insert(t_ns);
        self.last_ns = self.last_ns.max(t_ns);
        let line = self.devices.entry(site.device).or_insert_with(|| DeviceLine { resolution_ns: FIRST_RESOLUTION_NS, ..Default::default() });
        let held = line.live.entry(id).or_default();
        let before = *held;
        *held = held.saturating_add_signed(delta);
        line.total = line.total.saturating_sub(before).saturating_add(*held);
        if *held == 0 {
            line.live.remove(&id);
        }
        line.dirty = true;
        if point {
            line.take_point(t_ns, false);
        }
    }

    /// What each site of process `pid` holds on the timeline now.
    pub fn held_by(&self, pid: u32) -> Vec<(Rc<Site>, i64)> {
        let mut out = Vec::new();
        for line in self.devices.values() {
            for (&id, &bytes) in &line.live {
                let site = &self.sites[id as usize];
                if site.stack.pid == pid {
                    out.push((Rc::clone(site), bytes as i64));
                }
            }
        }
        out
    }

    pub fn oom(&mut self, t_ns: u64, device: u32, requested: u64) {
        self.first_ns.get_or_insert(t_ns);
        self.last_ns = self.last_ns.max(t_ns);
        if let Some(line) = self.devices.get_mut(&device) {
            line.dirty = true;
            line.take_point(t_ns, true);
            if let Some(p) = line.points.last_mut() {
                p.pinned = true;
            }
        }
        self.ooms.push(OomMark { t_ns, device, requested });
        self.ooms.truncate(MAX_POINTS);
    }

    /// A point of every device changed since its last, at the time of the last change: before
    /// what follows (a process's exit) changes it at once.
    pub fn flush(&mut self) {
        let t = self.last_ns;
        for line in self.devices.values_mut() {
            line.take_point(t, true);
        }
    }

    /// A point of every device as it is at `t_ns`: the end of the run.
    pub fn finish(&mut self, t_ns: u64) {
        let t_ns = t_ns.max(self.last_ns);
        for line in self.devices.values_mut() {
            line.take_point(t_ns, true);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn last_ns(&self) -> u64 {
        self.last_ns
    }

    pub fn first_ns(&self) -> u64 {
        self.first_ns.unwrap_or(0)
    }

    pub fn site(&self, id: u32) -> &Rc<Site> {
        &self.sites[id as usize]
    }

    /// The points of each device, in time order.
    pub fn devices(&self) -> impl Iterator<Item = (u32, &[Point])> {
        self.devices.iter().map(|(d, l)| (*d, l.points.as_slice()))
    }
}

impl DeviceLine {
    fn take_point(&mut self, t_ns: u64, always: bool) {
        let due = self.points.last().is_none_or(|p| t_ns >= p.t_ns.saturating_add(self.resolution_ns));
        if !(always && self.dirty || due) {
            return;
        }
        let mut top: Vec<(u32, u64)> = self.live.iter().map(|(&id, &b)| (id, b)).collect();
        if top.len() > TOP_PER_POINT {
            top.select_nth_unstable_by(TOP_PER_POINT - 1, |a, b| b.1.cmp(&a.1));
            top.truncate(TOP_PER_POINT);
        }
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let point = Point { t_ns, total: self.total, top, pinned: false };
        match self.points.last_mut() {
            // Two points at one time: the later state is the one that holds.
            Some(last) if last.t_ns == t_ns => *last = Point { pinned: last.pinned, ..point },
            _ => self.points.push(point),
        }
        self.dirty = false;
        if self.points.len() >= MAX_POINTS {
            // Every other point goes, the last stays: the run's end is always drawn.
            let last = self.points.pop();
            let mut i = 0;
            self.points.retain(|p| {
                i += 1;
                i % 2 == 1 || p.pinned
            });
            self.points.extend(last);
            self.resolution_ns = self.resolution_ns.saturating_mul(2);
        }
    }
}

/// Now, on the clock the BPF records' times are taken on (CLOCK_BOOTTIME).
pub fn boot_time_ns() -> u64 {
    gpuflame_bpf::boottime_ns()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::StackKey;

    fn site(n: u32, device: u32) -> Rc<Site> {
        let stack = StackKey { pid: 1, tid: n, comm: "t".into(), kernel: vec![], user: vec![], root: None, tail: vec![], leaf: None };
        Rc::new(Site { stack, device, via_allocator: false })
    }

    fn sum(p: &Point) -> u64 {
        p.top.iter().map(|t| t.1).sum()
    }

    #[test]
    fn points_add_up_and_follow_frees() {
        let mut t = MemoryTimeline::default();
        let (a, b) = (site(1, 0), site(2, 0));
        t.change(0, &a, 100);
        t.change(2_000_000, &b, 50);
        t.change(4_000_000, &a, -100);
        t.oom(5_000_000, 0, 1000);
        t.finish(6_000_000);
        let (_, points) = t.devices().next().unwrap();
        let totals: Vec<u64> = points.iter().map(|p| p.total).collect();
        // The OOM's point, and the end's.
        assert_eq!(totals, vec![100, 150, 50, 50, 50]);
        assert!(points[3].pinned && points[3].t_ns == 5_000_000);
        assert!(points.iter().all(|p| sum(p) == p.total));
        assert_eq!(t.ooms, vec![OomMark { t_ns: 5_000_000, device: 0, requested: 1000 }]);
    }

    #[test]
    fn a_long_run_keeps_a_bounded_number_of_points_and_its_end() {
        let mut t = MemoryTimeline::default();
        let sites: Vec<_> = (0..40).map(|i| site(i, 1)).collect();
        for i in 0..200_000u64 {
            t.change(i * 1_000_000, &sites[(i % 40) as usize], if i % 3 == 2 { -1 } else { 2 });
        }
        t.finish(200_000 * 1_000_000);
        let (_, points) = t.devices().next().unwrap();
        assert!(points.len() <= MAX_POINTS && points.len() > MAX_POINTS / 4, "{}", points.len());
        assert!(points.windows(2).all(|w| w[0].t_ns < w[1].t_ns));
        assert_eq!(points.last().unwrap().t_ns, 200_000 * 1_000_000);
        assert!(points.iter().all(|p| p.top.len() <= TOP_PER_POINT && sum(p) <= p.total));
    }
}
