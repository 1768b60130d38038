//! Checks that turn the commonest failures into one clear line before anything is loaded.

use std::fs;
use std::path::Path;

use crate::UserError;

const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const BTF: &str = "/sys/kernel/btf/vmlinux";

/// Root, or both CAP_BPF and CAP_PERFMON in the effective set.
pub fn check_privileges() -> Result<(), UserError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let caps = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| u64::from_str_radix(v.trim(), 16).ok())))
        .flatten()
        .unwrap_or(0);
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_BPF) && has(CAP_PERFMON) {
        Ok(())
    } else {
        Err(UserError("gpuflame needs root, or the CAP_BPF and CAP_PERFMON capabilities (try sudo)".into()))
    }
}

pub fn check_btf() -> Result<(), UserError> {
    if Path::new(BTF).exists() {
        Ok(())
    } else {
        Err(UserError(format!(
            "this kernel has no BTF ({BTF} is missing); gpuflame needs Linux ≥ 5.8 built with CONFIG_DEBUG_INFO_BTF=y"
        )))
    }
}
