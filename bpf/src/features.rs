//! What the running kernel's BPF can do, probed once before anything loads, so that gpuflame
//! loads the programs the kernel can take, picks the older way where a newer one is missing, and
//! says in one line what cannot run and since which Linux it could.
//!
//! Helpers and map types are asked of the kernel itself (libbpf's probes load a tiny program or
//! create a tiny map); kfuncs and attach types are read from the kernel's BTF, which names them
//! with their prototypes.

use std::fmt;

use libbpf_rs::btf::types::{Enum, Func, Typedef};
use libbpf_rs::btf::Btf;

/// Tests: features to act as if this kernel lacked ([`KernelFeatures::without`]).
pub const PRETEND_VAR: &str = "GPUFLAME_PRETEND_KERNEL_LACKS";

/// One thing gpuflame's programs use, with the first mainline kernel that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    pub since: &'static str,
}

pub const BTF: Feature = Feature { name: "BTF (CONFIG_DEBUG_INFO_BTF)", since: "5.5" };
pub const TP_BTF: Feature = Feature { name: "BTF-typed tracepoint programs (tp_btf)", since: "5.5" };
pub const RING_BUFFER: Feature = Feature { name: "BPF ring buffers", since: "5.8" };
pub const TASK_STORAGE: Feature = Feature { name: "task storage in tracing programs", since: "5.11" };
pub const ATTACH_COOKIE: Feature = Feature { name: "BPF attach cookies", since: "5.15" };
pub const BPF_LOOP: Feature = Feature { name: "bpf_loop", since: "5.17" };
pub const FIND_VMA: Feature = Feature { name: "bpf_find_vma", since: "5.17" };
pub const UPROBE_SESSION: Feature = Feature { name: "uprobe sessions", since: "6.13" };

/// How the CUDA functions' entries and returns are hooked on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallHooks {
    /// One session program a file (uprobe_multi with sessions): the return half only where the
    /// entry asks for it.
    Sessions,
    /// An entry uprobe and a return uprobe a function, each a link of its own.
    EntryAndReturn,
}

/// The kernel's answers, probed once ([`KernelFeatures::probe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    pub btf: bool,
    pub tp_btf: bool,
    pub ring_buffer: bool,
    pub task_storage: bool,
    pub attach_cookie: bool,
    pub bpf_loop: bool,
    pub find_vma: bool,
    /// Uprobe sessions: their attach type, and the kfunc `bpf_session_is_return` in either of its
    /// prototypes (libbpf resolves the one the kernel has, cuda_hooks.h).
    pub sessions: bool,
}

impl KernelFeatures {
    pub fn probe() -> Self {
        let btf = Btf::from_vmlinux().ok();
        let attach_types = btf.as_ref().map(attach_type_names).unwrap_or_default();
        let has_attach = |name: &str| attach_types.iter().any(|n| n == name);
        let sessions = has_attach("BPF_TRACE_UPROBE_SESSION") && btf.as_ref().is_some_and(|b| b.type_by_name::<Func<'_>>("bpf_session_is_return").is_some());
        let probed = KernelFeatures {
            release: kernel_release(),
            btf: btf.is_some(),
            // A tp_btf program attaches through the tracepoint's typedef in the kernel's BTF.
            tp_btf: btf.as_ref().is_some_and(|b| b.type_by_name::<Typedef<'_>>("btf_trace_sched_process_fork").is_some()),
            ring_buffer: probe_map(libbpf_sys::BPF_MAP_TYPE_RINGBUF),
            task_storage: probe_map(libbpf_sys::BPF_MAP_TYPE_TASK_STORAGE) && probe_helper(libbpf_sys::BPF_FUNC_task_storage_get),
            attach_cookie: probe_helper(libbpf_sys::BPF_FUNC_get_attach_cookie),
            bpf_loop: probe_helper(libbpf_sys::BPF_FUNC_loop),
            find_vma: probe_helper(libbpf_sys::BPF_FUNC_find_vma),
            sessions,
        };
        match std::env::var(PRETEND_VAR) {
            Ok(list) if !list.is_empty() => {
                tracing::info!("{PRETEND_VAR}={list}: acting as if this kernel lacked them");
                probed.without(&list)
            }
            _ => probed,
        }
    }

    /// These features taken away (comma-separated: btf, tp-btf, ring-buffer, task-storage, cookies,
    /// bpf-loop, find-vma, sessions; unknown names are ignored), so that the
    /// older ways and the lines that say what cannot run are tested on the kernel at hand.
    pub fn without(mut self, list: &str) -> Self {
        for name in list.split(',').map(str::trim) {
            match name {
                "btf" => self.btf = false,
                "tp-btf" => self.tp_btf = false,
                "ring-buffer" => self.ring_buffer = false,
                "task-storage" => self.task_storage = false,
                "cookies" => self.attach_cookie = false,
                "bpf-loop" => self.bpf_loop = false,
                "find-vma" => self.find_vma = false,
                "sessions" => self.sessions = false,
                "" => {}
                other => tracing::warn!("{PRETEND_VAR}: no feature named {other:?}"),
            }
        }
        self
    }

    /// The first feature the sampler, the unwinder and the process events need that this kernel
    /// lacks: without it nothing can run.
    pub fn missing_for_sampler(&self) -> Option<Feature> {
        [(self.btf, BTF), (self.tp_btf, TP_BTF), (self.ring_buffer, RING_BUFFER), (self.bpf_loop, BPF_LOOP), (self.find_vma, FIND_VMA)]
            .into_iter()
            .find_map(|(has, f)| (!has).then_some(f))
    }

    /// What off-CPU and wall time need beyond the sampler.
    pub fn missing_for_off_cpu(&self) -> Option<Feature> {
        (!self.task_storage).then_some(TASK_STORAGE)
    }

    /// What the CUDA hooks and PyTorch's probes need beyond the sampler (the hooks tell calls
    /// apart by their attach cookie; libbpf's USDT support needs cookies too).
    pub fn missing_for_cuda(&self) -> Option<Feature> {
        [(self.attach_cookie, ATTACH_COOKIE), (self.task_storage, TASK_STORAGE)].into_iter().find_map(|(has, f)| (!has).then_some(f))
    }

    pub fn call_hooks(&self) -> CallHooks {
        if self.sessions {
            CallHooks::Sessions
        } else {
            CallHooks::EntryAndReturn
        }
    }

}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (Linux {})", self.name, self.since)
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn probe_helper(helper: libbpf_sys::bpf_func_id) -> bool {
    // SAFETY: the probe loads a two-instruction program of the given type; no pointers are kept.
    unsafe { libbpf_sys::libbpf_probe_bpf_helper(libbpf_sys::BPF_PROG_TYPE_KPROBE, helper, std::ptr::null()) == 1 }
}

fn probe_map(map: libbpf_sys::bpf_map_type) -> bool {
    // SAFETY: the probe creates and closes a small map of the given type.
    unsafe { libbpf_sys::libbpf_probe_bpf_map_type(map, std::ptr::null()) == 1 }
}

/// The names of `enum bpf_attach_type` in the kernel's BTF: a kernel knows the attach types it
/// has, so they date uprobe sessions (BPF_TRACE_UPROBE_SESSION).
fn attach_type_names(btf: &Btf<'_>) -> Vec<String> {
    btf.type_by_name::<Enum<'_>>("bpf_attach_type")
        .map(|e| e.iter().filter_map(|m| m.name.map(|n| n.to_string_lossy().into_owned())).collect())
        .unwrap_or_default()
}


#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> KernelFeatures {
        KernelFeatures {
            release: "6.18.0".into(),
            btf: true,
            tp_btf: true,
            ring_buffer: true,
            task_storage: true,
            attach_cookie: true,
            bpf_loop: true,
            find_vma: true,
            sessions: true,
        }
    }

    #[test]
    fn the_sampler_names_the_first_feature_missing() {
        let k515 = KernelFeatures { bpf_loop: false, find_vma: false, sessions: false, ..all() };
        assert_eq!(k515.missing_for_sampler(), Some(BPF_LOOP));
        assert_eq!(k515.missing_for_sampler().map(|f| f.to_string()).as_deref(), Some("bpf_loop (Linux 5.17)"));
        assert_eq!(all().missing_for_sampler(), None);
    }

    #[test]
    fn features_can_be_taken_away_for_tests() {
        let k = all().without("sessions, task-storage,bpf-loop");
        assert!(!k.sessions);
        assert!(!k.task_storage && !k.bpf_loop && k.find_vma && k.attach_cookie);
    }

    #[test]
    fn kernels_without_sessions_hook_entries_and_returns() {
        assert_eq!(all().call_hooks(), CallHooks::Sessions);
        assert_eq!(KernelFeatures { sessions: false, ..all() }.call_hooks(), CallHooks::EntryAndReturn);
    }

    #[test]
    fn this_kernel_is_probed_without_failing() {
        // Whatever the kernel the tests run on: the probe answers, and a kernel that runs the
        // test suite has what the sampler needs.
        let k = KernelFeatures::probe();
        assert!(!k.release.is_empty());
        assert_eq!(k.missing_for_sampler(), None, "{k:?}");
    }
}
