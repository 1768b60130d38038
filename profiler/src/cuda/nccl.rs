//! NCCL: the sizes of its datatypes, which call a kernel of its was launched by, and the device
//! time of its kernels attributed to the collective calls of the same process.
//!
//! A collective's call returns as soon as its kernel is queued; the kernel then runs on the
//! device until every rank has arrived, so a rank that waits for a slower one shows it as kernel
//! time, not as time in the call. NCCL's kernels are named after what they do
//! (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`): their time goes to the process's calls of that
//! operation, in proportion to how often each stack made one; a kernel whose name does not say
//! (NCCL's generic kernels) goes to all of the process's collective calls alike. Every call is
//! hooked, so the stacks and their proportions are exact; which of two call sites of the same
//! operation a given kernel belongs to is not known.

use std::collections::HashMap;

use gpuflame_bpf::{CudaApi, GpuKernelBatch, GpuKernelName};

use crate::stacks::{StackKey, StackValues, TailFrame};

/// Bytes of one element of an `ncclDataType_t` (nccl.h, 2.30); None for a value NCCL does not
/// define.
pub fn datatype_size(datatype: u64) -> Option<u64> {
    match datatype {
        0 | 1 | 10 | 11 => Some(1), // int8, uint8, fp8 e4m3, fp8 e5m2
        6 | 9 => Some(2),           // float16, bfloat16
        2 | 3 | 7 => Some(4),       // int32, uint32, float32
        4 | 5 | 8 => Some(8),       // int64, uint64, float64
        _ => None,
    }
}

/// Whether a kernel is NCCL's: `ncclDevKernel_…`, `ncclKernel_…`, mangled or not.
pub fn is_nccl_kernel(name: &str) -> bool {
    name.contains("ncclDevKernel") || name.contains("ncclKernel")
}

/// The calls that launch a kernel of this name; None when the name does not say (a generic
/// kernel). Gather, scatter and all-to-all are made of sends and receives in NCCL.
pub fn kernel_ops(name: &str) -> Option<&'static [CudaApi]> {
    let (_, after) = name.split_once("ncclDevKernel_").or_else(|| name.split_once("ncclKernel_"))?;
    let op = after.split('_').next().unwrap_or("");
    Some(match op {
        "AllReduce" => &[CudaApi::NcclAllReduce],
        "AllGather" => &[CudaApi::NcclAllGather],
        "ReduceScatter" => &[CudaApi::NcclReduceScatter],
        "Broadcast" => &[CudaApi::NcclBroadcast, CudaApi::NcclBcast],
        "Reduce" => &[CudaApi::NcclReduce],
        "SendRecv" => &[CudaApi::NcclSend, CudaApi::NcclRecv, CudaApi::NcclAlltoAll, CudaApi::NcclGather, CudaApi::NcclScatter],
        _ => return None,
    })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CollectiveTimeStats {
    pub nccl_records: u64,
    pub by_operation_ns: i64,
    pub by_process_ns: i64,
    pub unattributed_ns: i64,
}

impl CollectiveTimeStats {
    pub fn describe(&self) -> String {
        let total = (self.by_operation_ns + self.by_process_ns + self.unattributed_ns).max(1) as f64;
        format!(
            "device time of {} NCCL kernel records: {:.1}% attributed to the process's calls of the kernel's operation, {:.1}% to all its collective calls (the kernel's name does not say its operation), {:.1}% to no call (none seen)",
            self.nccl_records,
            100.0 * self.by_operation_ns as f64 / total,
            100.0 * self.by_process_ns as f64 / total,
            100.0 * self.unattributed_ns as f64 / total,
        )
    }
}

/// Call sites kept per process, at most; more are merged away by forgetting the process's
/// oldest (a program with thousands of distinct collective stacks is not one to split hairs on).
const SITES_PER_PROCESS: usize = 4096;

#[derive(Default)]
pub struct CollectiveTime {
    /// pid → (call, its stack with the call as tail frame) → calls seen while the process lived.
    sites: HashMap<u32, HashMap<(CudaApi, StackKey), u64>>,
    names: HashMap<(u32, u32), String>,
    /// (pid, kernel name id, device) → device time of the window, and the process's name.
    kernels: HashMap<(u32, u32, u32), (i64, String)>,
    exited: Vec<u32>,
    stats: CollectiveTimeStats,
}

impl CollectiveTime {
    /// A collective call returned; `stack` ends in the call.
    pub fn called(&mut self, pid: u32, api: CudaApi, stack: &StackKey) {
        let sites = self.sites.entry(pid).or_default();
        if sites.len() >= SITES_PER_PROCESS && !sites.contains_key(&(api, stack.clone())) {
            sites.clear();
        }
        *sites.entry((api, stack.clone())).or_default() += 1;
    }

    pub fn named(&mut self, n: &GpuKernelName) {
        self.names.insert((n.pid, n.id), n.name.clone());
    }

    /// Kernel records: summed by kernel now, attributed when the window closes, when every
    /// name and call that came with them is in.
    pub fn kernels(&mut self, batch: &GpuKernelBatch) {
        for k in &batch.kernels {
            let ns = k.end.saturating_sub(k.start) as i64;
            let e = self.kernels.entry((batch.pid, k.name_id, k.device)).or_insert_with(|| (0, batch.comm.clone()));
            e.0 = e.0.saturating_add(ns);
        }
    }

    /// Its sites stay until the window closes: its last kernel records may come after.
    pub fn process_exited(&mut self, pid: u32) {
        self.exited.push(pid);
    }

    /// The window's device time by collective stack (the kernel as leaf), and how it was
    /// attributed.
    pub fn take(&mut self) -> (StackValues, CollectiveTimeStats) {
        let mut out: HashMap<(StackKey, u32), i64> = HashMap::new();
        for ((pid, name_id, device), (ns, comm)) in std::mem::take(&mut self.kernels) {
            let Some(name) = self.names.get(&(pid, name_id)).filter(|n| is_nccl_kernel(n)) else { continue };
            self.stats.nccl_records += 1;
            let kernel = TailFrame::Kernel(name.clone());
            let sites = self.sites.get(&pid).map(|s| s.iter().map(|((api, stack), &n)| (*api, stack, n)).collect::<Vec<_>>()).unwrap_or_default();
            let of_op: Vec<(&StackKey, u64)> = match kernel_ops(name) {
                Some(ops) => sites.iter().filter(|(api, _, _)| ops.contains(api)).map(|&(_, s, n)| (s, n)).collect(),
                None => Vec::new(),
            };
            let (chosen, counter) = if !of_op.is_empty() {
                (of_op, &mut self.stats.by_operation_ns)
            } else if !sites.is_empty() {
                (sites.iter().map(|&(_, s, n)| (s, n)).collect(), &mut self.stats.by_process_ns)
            } else {
                self.stats.unattributed_ns += ns;
                let stack = StackKey::marker(pid, comm, vec![TailFrame::Marker("[no collective call seen]".into()), kernel]);
                *out.entry((stack, device)).or_default() += ns;
                continue;
            };
            *counter += ns;
            for (stack, share) in shares(ns, &chosen) {
                let mut s = stack.clone();
                s.tail.push(kernel.clone());
                *out.entry((s, device)).or_default() += share;
            }
        }
        for pid in std::mem::take(&mut self.exited) {
            self.sites.remove(&pid);
            self.names.retain(|&(p, _), _| p != pid);
        }
        let values = out.into_iter().map(|((stack, device), ns)| (stack, Some(device), vec![ns])).collect();
        (values, std::mem::take(&mut self.stats))
    }
}

/// `total` split over stacks in proportion to their counts; the largest share, last, takes what
/// rounding left over, so that the shares add up to `total`.
fn shares<'a>(total: i64, stacks: &[(&'a StackKey, u64)]) -> Vec<(&'a StackKey, i64)> {
    let seen: u64 = stacks.iter().map(|(_, n)| n).sum::<u64>().max(1);
    let mut sorted = stacks.to_vec();
    sorted.sort_by_key(|&(_, n)| n);
    let mut left = total;
    let last = sorted.len().saturating_sub(1);
    sorted
        .into_iter()
        .enumerate()
        .map(|(i, (stack, n))| {
            let share = if i == last { left } else { (total as i128 * n as i128 / seen as i128) as i64 };
            left -= share;
            (stack, share)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuflame_bpf::GpuKernel;

    #[test]
    fn datatypes_have_ncclh_sizes() {
        assert_eq!(datatype_size(7), Some(4)); // ncclFloat32
        assert_eq!(datatype_size(9), Some(2)); // ncclBfloat16
        assert_eq!(datatype_size(4), Some(8)); // ncclInt64
        assert_eq!(datatype_size(11), Some(1)); // ncclFloat8e5m2
        assert_eq!(datatype_size(12), None); // ncclNumTypes
        assert_eq!(datatype_size(u64::MAX), None);
    }

    #[test]
    fn kernel_names_say_their_operation() {
        assert_eq!(kernel_ops("ncclDevKernel_AllReduce_Sum_f32_RING_LL"), Some(&[CudaApi::NcclAllReduce][..]));
        assert_eq!(kernel_ops("_Z39ncclDevKernel_AllGather_RING_LL24ncclDevKernelArgsStorageILm4096EE"), Some(&[CudaApi::NcclAllGather][..]));
        assert_eq!(kernel_ops("ncclKernel_Reduce_RING_LL_Sum_float").map(|o| o[0]), Some(CudaApi::NcclReduce));
        assert_eq!(kernel_ops("ncclDevKernel_Generic_1"), None);
        assert!(is_nccl_kernel("ncclDevKernel_Generic_1"));
        assert!(!is_nccl_kernel("void at::native::vectorized_elementwise_kernel"));
    }

    fn stack(pid: u32, leaf: &str) -> StackKey {
        StackKey::marker(pid, "python3".into(), vec![TailFrame::Marker(leaf.into())])
    }

    fn batch(pid: u32, kernels: &[(u32, u64)]) -> GpuKernelBatch {
        let kernels = kernels
            .iter()
            .map(|&(name_id, ns)| GpuKernel { start: 1000, end: 1000 + ns, correlation: 1, device: 0, stream: 7, name_id, graph: 0, graph_node: 0 })
            .collect();
        GpuKernelBatch { pid, comm: "python3".into(), kernels, dropped_total: 0 }
    }

    fn by_leaf(values: &StackValues) -> HashMap<String, i64> {
        let mut out = HashMap::new();
        for (s, _, v) in values {
            let names: Vec<String> = s.tail.iter().map(|t| format!("{t:?}")).collect();
            *out.entry(names.join(";")).or_default() += v[0];
        }
        out
    }

    #[test]
    fn kernel_time_goes_to_the_calls_of_its_operation_in_proportion() {
        let mut t = CollectiveTime::default();
        let name = |id, name: &str| GpuKernelName { pid: 7, id, name: name.into() };
        t.named(&name(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
        t.named(&name(2, "ncclDevKernel_Generic_1"));
        t.named(&name(3, "gemm"));
        for _ in 0..3 {
            t.called(7, CudaApi::NcclAllReduce, &stack(7, "grads"));
        }
        t.called(7, CudaApi::NcclAllReduce, &stack(7, "loss"));
        t.called(7, CudaApi::NcclAllGather, &stack(7, "metrics"));
        t.kernels(&batch(7, &[(1, 1000), (2, 500), (3, 999_999)]));
        t.kernels(&batch(8, &[(1, 77)]));
        t.named(&GpuKernelName { pid: 8, id: 1, name: "ncclDevKernel_AllReduce_Sum_f32_RING_LL".into() });
        let (values, stats) = t.take();
        let leaves = by_leaf(&values);
        let k = |leaf: &str, kernel: &str| leaves.get(&format!("Marker({leaf:?});Kernel({kernel:?})")).copied().unwrap_or(0);
        // All-reduce time by the 3:1 of its call sites; the generic kernel over all 5 calls.
        assert_eq!(k("grads", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"), 750);
        assert_eq!(k("loss", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"), 250);
        assert_eq!(k("grads", "ncclDevKernel_Generic_1") + k("loss", "ncclDevKernel_Generic_1") + k("metrics", "ncclDevKernel_Generic_1"), 500);
        assert_eq!(k("metrics", "ncclDevKernel_Generic_1"), 100);
        // Not NCCL's: not here. A process with no call seen: said so.
        assert_eq!(values.iter().map(|v| v.2[0]).sum::<i64>(), 1000 + 500 + 77);
        assert_eq!(k("[no collective call seen]", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"), 77);
        assert_eq!((stats.nccl_records, stats.by_operation_ns, stats.by_process_ns, stats.unattributed_ns), (3, 1000, 500, 77));
    }

    #[test]
    fn an_exited_process_keeps_its_sites_until_the_window_closes() {
        let mut t = CollectiveTime::default();
        t.named(&GpuKernelName { pid: 7, id: 1, name: "ncclDevKernel_AllGather_RING_LL".into() });
        t.called(7, CudaApi::NcclAllGather, &stack(7, "metrics"));
        t.process_exited(7);
        t.kernels(&batch(7, &[(1, 40)]));
        let (values, _) = t.take();
        assert_eq!(by_leaf(&values).get("Marker(\"metrics\");Kernel(\"ncclDevKernel_AllGather_RING_LL\")"), Some(&40));
        t.kernels(&batch(7, &[(1, 40)]));
        assert!(t.take().0.is_empty(), "its names went with the process");
    }
}
