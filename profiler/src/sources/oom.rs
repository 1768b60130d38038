//! Out-of-memory forensics: when an allocation fails for lack of device memory (CUDA's error, or
//! PyTorch's caching allocator's own report before it throws), what held the memory of the
//! failing process on that device, by stack, with the failed request as a stack of its own:
//! `… → cudaMalloc → [out of memory] 128.0 MiB requested`. A snapshot, written when it happens,
//! not at the end of a window.

use std::time::{Duration, SystemTime};

use gpuflame_bpf::CudaApi;

use crate::cuda::hbm::SiteTotals;
use crate::cuda::human_bytes;
use crate::cuda::memory::DeviceUse;
use crate::frame::{FrameKind, NamedFrame};
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use crate::stacks::{StackKey, StackValues, Stacks, TailFrame};
use crate::workload::rank::LabelsByPid;

/// Holders listed in the report, biggest first.
pub const TOP_HOLDERS: usize = 5;

/// An allocation that failed for lack of memory.
#[derive(Debug, Clone)]
pub struct OomReport {
    pub pid: u32,
    pub comm: String,
    pub api: CudaApi,
    pub requested: u64,
    pub device: u32,
    /// Bytes the holders held on the device when it failed, as far as the hooks saw.
    pub in_use: u64,
    /// Reserved, allocated and cached on the device, of the failing process.
    pub usage: DeviceUse,
    /// The allocator's own allocated and reserved bytes, from its report.
    pub allocator_says: Option<(u64, u64)>,
    pub stack: StackKey,
    /// Its tensors and the segments allocated outside its allocator, on the device.
    pub holders: SiteTotals,
}

impl OomReport {
    /// The in-use profile of the process that failed, the failed request included.
    pub fn snapshot(&self, stacks: &mut Stacks, at: SystemTime, labels: &dyn LabelsByPid) -> Profile {
        let mut values = site_values(&self.holders);
        let mut failing = self.stack.clone();
        failing.tail.push(TailFrame::Marker(format!("[out of memory] {} requested", human_bytes(self.requested))));
        values.push((failing, Some(self.device), vec![self.requested as i64, 1]));
        let mut profile = ProfileKind::HbmInUse.empty_profile(1);
        profile.comments.push(self.headline());
        profile.comments.push(self.usage.to_string());
        stacks.build(&mut profile, values, at, Duration::ZERO, labels);
        profile
    }

    /// The call that failed: the allocator's report is made in its malloc.
    pub fn failed_call(&self) -> &'static str {
        if self.api == CudaApi::C10OutOfMemory {
            CudaApi::C10Malloc.frame_name()
        } else {
            self.api.frame_name()
        }
    }

    /// `CUDACachingAllocator::malloc of 30.0 MiB on device 0 failed in pid 7 (python3) holding 250.0 MiB`.
    pub fn headline(&self) -> String {
        let mut line = format!(
            "out of memory: {} of {} on device {} failed in pid {} ({}) holding {}",
            self.failed_call(),
            human_bytes(self.requested),
            self.device,
            self.pid,
            self.comm,
            human_bytes(self.in_use)
        );
        if let Some((allocated, reserved)) = self.allocator_says {
            line.push_str(&format!(" (PyTorch: allocated {}, reserved {})", human_bytes(allocated), human_bytes(reserved)));
        }
        line
    }

    /// The biggest holders, each as `bytes  python line ← caller  (whole stack)`.
    pub fn top_holders(&self, stacks: &mut Stacks) -> Vec<(u64, String, String)> {
        let mut held: Vec<(&StackKey, u64)> = self.holders.iter().map(|(s, t)| (&s.stack, t.0 as u64)).collect();
        held.sort_by_key(|h| std::cmp::Reverse(h.1));
        held.truncate(TOP_HOLDERS);
        held.into_iter()
            .map(|(stack, bytes)| {
                let frames = stacks.frames(stack);
                // From the program's own code on: the interpreter's start-up says nothing here.
                let from_python = frames.iter().position(|f| f.kind == FrameKind::Python).unwrap_or(0);
                (bytes, holder_label(&frames), NamedFrame::joined(&frames[from_python..]))
            })
            .collect()
    }
}

/// Frames of PyTorch and the C++ library: a tensor's holder is the code that called into them.
const LIBRARY_PREFIXES: [&str; 5] = ["c10::", "at::", "torch::", "caffe2::", "std::"];

/// The line a person looks for in a stack (its last frame the hooked call): its innermost Python
/// frame and the one that called it; without Python, the innermost native frame outside PyTorch
/// and the C++ library, and its caller.
pub fn holder_label(frames: &[NamedFrame]) -> String {
    let python: Vec<&str> = frames.iter().filter(|f| f.kind == FrameKind::Python).map(|f| f.name.as_str()).collect();
    let own: Vec<&str> = match python.as_slice() {
        [] => frames[..frames.len().saturating_sub(1)].iter().map(|f| f.name.as_str()).filter(|f| !LIBRARY_PREFIXES.iter().any(|p| f.starts_with(p))).collect(),
        _ => python,
    };
    match own.as_slice() {
        [.., caller, inner] => format!("{inner} ← {caller}"),
        [inner] => inner.to_string(),
        [] => frames.last().map_or_else(String::new, |f| f.name.clone()),
    }
}

/// Bytes and objects per allocating stack, with its device.
pub(super) fn site_values(totals: &SiteTotals) -> StackValues {
    totals.iter().map(|(site, &(bytes, objects))| (site.stack.clone(), Some(site.device), vec![bytes, objects])).collect()
}

#[cfg(test)]
mod tests {
    use super::holder_label;
    use crate::frame::{FrameKind, NamedFrame};

    /// `a → b → c`, the frames named `(file.py:N)` or `(file.py)` Python, the others native.
    fn frames(described: &str) -> Vec<NamedFrame> {
        described.split(" → ").map(|f| NamedFrame::new(f, if f.contains(".py") { FrameKind::Python } else { FrameKind::Native })).collect()
    }

    #[test]
    fn a_holder_is_named_by_its_python_line_first() {
        assert_eq!(
            holder_label(&frames("main (serve.py:90) → allocate_kv_cache (serve.py:40) → at::empty → CUDACachingAllocator::malloc")),
            "allocate_kv_cache (serve.py:40) ← main (serve.py:90)"
        );
        assert_eq!(holder_label(&frames("main → load → cudaMalloc")), "load ← main");
        assert_eq!(
            holder_label(&frames("main → oom → allocate_kv_cache() → at::empty(unsigned long, int) → c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long) → CUDACachingAllocator::malloc")),
            "allocate_kv_cache() ← oom"
        );
        assert_eq!(holder_label(&frames("cudaMalloc")), "cudaMalloc");
    }

    /// Python frames are known by their kind, not by a file name in their text: a line-less
    /// frame is one, and a native function whose name reads like a file and line is not.
    #[test]
    fn python_frames_are_known_by_kind_not_text() {
        let stack = vec![
            NamedFrame::new("<module> (serve.py)", FrameKind::Python),
            NamedFrame::new("load_weights (model.py)", FrameKind::Python),
            NamedFrame::new("parse(a.py:1)", FrameKind::Native),
            NamedFrame::new("cudaMalloc", FrameKind::CudaApi),
        ];
        assert_eq!(holder_label(&stack), "load_weights (model.py) ← <module> (serve.py)");
    }
}
