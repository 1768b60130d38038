//! GPU time: kernel execution records from the CUPTI injection library, attributed to the stacks
//! that launched them.
//!
//! A launch's stack is captured (for a sample of launches, which the injection library picks)
//! together with CUPTI's correlation id, which the kernel's record carries too. A record whose
//! launch was sampled goes to that stack; the others go to the stacks seen launching the same
//! kernel in the same process, in proportion to how often each was seen ("by kernel and call
//! site"). A stack cut short (a library's unwind table not in yet) is used only for a kernel that
//! has no whole one: on a 5 s PyTorch program on an H200, every sampled launch came before
//! libtorch's tables, and all its GPU time would have gone to `[launch stack not sampled]`, where
//! a kernel never seen launched goes.

use std::collections::HashMap;

use gpuflame_bpf::{GpuKernelBatch, GpuKernelName};

use crate::stacks::{StackKey, StackValues, TailFrame};

/// Correlation ids kept for records still to come, at most.
const LAUNCHES_LIMIT: usize = 1 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuTimeStats {
    pub records: u64,
    pub by_correlation_ns: i64,
    pub by_site_ns: i64,
    /// Shared over launch stacks cut short, the kernel having no whole one.
    pub by_partial_site_ns: i64,
    pub unattributed_ns: i64,
    /// Records the injection libraries dropped to their rate bound (sum over processes).
    pub dropped: u64,
}

#[derive(Default)]
pub struct GpuTime {
    /// Launch stacks, interned: a kernel record costs integer work only, at millions a second.
    stacks: Vec<StackKey>,
    stack_ids: HashMap<StackKey, u32>,
    launches: HashMap<(u32, u32), u32>,
    sites: HashMap<(u32, u32), HashMap<u32, u64>>,
    /// The same for launch stacks cut short.
    partial_launches: HashMap<(u32, u32), u32>,
    partial_sites: HashMap<(u32, u32), HashMap<u32, u64>>,
    names: HashMap<(u32, u32), String>,
    by_stack: HashMap<(u32, u32), i64>,
    /// (pid, name id) → time of records whose launch was not sampled, and the process's name.
    pending: HashMap<(u32, u32), (i64, String)>,
    dropped: HashMap<u32, u64>,
    stats: GpuTimeStats,
}

impl GpuTime {
    /// A sampled launch: its stack (the CUDA call's caller and up), whether that stack is whole,
    /// and the correlation id.
    pub fn launch(&mut self, pid: u32, correlation: u32, stack: StackKey, whole: bool) {
        let launches = if whole { &mut self.launches } else { &mut self.partial_launches };
        if launches.len() >= LAUNCHES_LIMIT {
            launches.clear();
        }
        let next = self.stacks.len() as u32;
        let id = *self.stack_ids.entry(stack).or_insert_with_key(|k| {
            self.stacks.push(k.clone());
            next
        });
        launches.insert((pid, correlation), id);
    }

    pub fn named(&mut self, n: GpuKernelName) {
        self.names.insert((n.pid, n.id), n.name);
    }

    pub fn kernels(&mut self, batch: &GpuKernelBatch) {
        let pid = batch.pid;
        self.dropped.insert(pid, batch.dropped_total);
        for k in &batch.kernels {
            let ns = k.end.saturating_sub(k.start) as i64;
            self.stats.records += 1;
            match self.launches.get(&(pid, k.correlation)) {
                Some(&stack) => {
                    *self.sites.entry((pid, k.name_id)).or_default().entry(stack).or_default() += 1;
                    *self.by_stack.entry((stack, k.name_id)).or_default() += ns;
                    self.stats.by_correlation_ns += ns;
                }
                None => {
                    if let Some(&stack) = self.partial_launches.get(&(pid, k.correlation)) {
                        *self.partial_sites.entry((pid, k.name_id)).or_default().entry(stack).or_default() += 1;
                    }
                    let p = self.pending.entry((pid, k.name_id)).or_insert_with(|| (0, batch.comm.clone()));
                    p.0 += ns;
                }
            }
        }
    }

    pub fn process_exited(&mut self, pid: u32) {
        self.launches.retain(|&(p, _), _| p != pid);
        self.partial_launches.retain(|&(p, _), _| p != pid);
    }

    /// Stacks no launch or site refers to any more are dropped between windows.
    fn compact(&mut self) {
        if self.stacks.len() < 100_000 {
            return;
        }
        self.launches.clear();
        self.sites.clear();
        self.partial_launches.clear();
        self.partial_sites.clear();
        self.stacks.clear();
        self.stack_ids.clear();
    }

    /// The window's stacks and nanoseconds, and how they were attributed; a new window starts.
    pub fn take(&mut self) -> (StackValues, GpuTimeStats) {
        let mut out: HashMap<StackKey, i64> = HashMap::new();
        let name = |names: &HashMap<(u32, u32), String>, pid: u32, id: u32| {
            names.get(&(pid, id)).cloned().unwrap_or_else(|| format!("kernel #{id}"))
        };
        for ((stack, id), ns) in std::mem::take(&mut self.by_stack) {
            let mut stack = self.stacks[stack as usize].clone();
            stack.tail.push(TailFrame::Kernel(name(&self.names, stack.pid, id)));
            *out.entry(stack).or_default() += ns;
        }
        for ((pid, id), (ns, comm)) in std::mem::take(&mut self.pending) {
            let kernel = TailFrame::Kernel(name(&self.names, pid, id));
            let whole = self.sites.get(&(pid, id)).filter(|s| !s.is_empty());
            let sites = whole.or_else(|| self.partial_sites.get(&(pid, id)).filter(|s| !s.is_empty()));
            match sites {
                Some(sites) => {
                    if whole.is_some() {
                        self.stats.by_site_ns += ns;
                    } else {
                        self.stats.by_partial_site_ns += ns;
                    }
                    let seen: u64 = sites.values().sum();
                    let mut left = ns;
                    let mut sites: Vec<(&u32, &u64)> = sites.iter().collect();
                    sites.sort_by_key(|(_, &n)| n);
                    for (i, (stack, &n)) in sites.iter().enumerate() {
                        // The most frequent site, last, takes what rounding left over.
                        let share = if i + 1 == sites.len() { left } else { (ns as i128 * n as i128 / seen as i128) as i64 };
                        left -= share;
                        let mut s = self.stacks[**stack as usize].clone();
                        s.tail.push(kernel.clone());
                        *out.entry(s).or_default() += share;
                    }
                }
                None => {
                    self.stats.unattributed_ns += ns;
                    let stack = StackKey {
                        pid,
                        tid: 0,
                        comm,
                        kernel: Vec::new(),
                        user: Vec::new(),
                        root: None,
                        tail: vec![TailFrame::Marker("[launch stack not sampled]".into()), kernel],
                        leaf: None,
                    };
                    *out.entry(stack).or_default() += ns;
                }
            }
        }
        self.stats.dropped = self.dropped.values().sum();
        self.compact();
        let stats = std::mem::take(&mut self.stats);
        (out.into_iter().map(|(k, ns)| (k, None, vec![ns])).collect(), stats)
    }
}

impl GpuTimeStats {
    /// How the time was attributed, for the profile's comment.
    pub fn describe(&self) -> String {
        let total = (self.by_correlation_ns + self.by_site_ns + self.by_partial_site_ns + self.unattributed_ns).max(1) as f64;
        format!(
            "gpu time of {} kernel records: {:.1}% attributed by correlation with a sampled launch stack, {:.1}% by kernel and call site, {:.1}% by kernel and a call site whose stack was cut short (its tables not in yet), {:.1}% unattributed; {} records dropped by the rate bound",
            self.records,
            100.0 * self.by_correlation_ns as f64 / total,
            100.0 * self.by_site_ns as f64 / total,
            100.0 * self.by_partial_site_ns as f64 / total,
            100.0 * self.unattributed_ns as f64 / total,
            self.dropped
        )
    }
}

#[cfg(test)]
mod tests {
    use gpuflame_bpf::GpuKernel;

    use super::*;

    fn site(name: &str) -> StackKey {
        StackKey::marker(7, "python3".into(), vec![TailFrame::Marker(name.into())])
    }

    fn batch(correlations: &[u32]) -> GpuKernelBatch {
        let kernel = |correlation| GpuKernel { start: 0, end: 100, correlation, device: 0, stream: 0, name_id: 1, graph: 0, graph_node: 0 };
        GpuKernelBatch { pid: 7, comm: "python3".into(), kernels: correlations.iter().map(|&c| kernel(c)).collect(), dropped_total: 0 }
    }

    fn at(values: &StackValues, name: &str) -> i64 {
        values.iter().filter(|(k, _, _)| k.tail.first() == Some(&TailFrame::Marker(name.into()))).map(|(_, _, v)| v[0]).sum()
    }

    #[test]
    fn a_kernel_with_only_stacks_cut_short_goes_to_them_and_says_so() {
        let mut g = GpuTime::default();
        g.launch(7, 1, site("cut short"), false);
        g.kernels(&batch(&[1, 2, 3]));
        let (values, stats) = g.take();
        assert_eq!(at(&values, "cut short"), 300);
        assert_eq!((stats.by_partial_site_ns, stats.unattributed_ns), (300, 0));
        assert!(stats.describe().contains("100.0% by kernel and a call site whose stack was cut short"), "{}", stats.describe());
    }

    #[test]
    fn a_whole_stack_of_the_kernel_takes_the_time_from_those_cut_short() {
        let mut g = GpuTime::default();
        g.launch(7, 1, site("cut short"), false);
        g.launch(7, 2, site("whole"), true);
        g.kernels(&batch(&[1, 2, 3]));
        let (values, stats) = g.take();
        assert_eq!((at(&values, "whole"), at(&values, "cut short")), (300, 0));
        assert_eq!((stats.by_correlation_ns, stats.by_site_ns, stats.by_partial_site_ns), (100, 200, 0));
    }
}
