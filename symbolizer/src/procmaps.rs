//! A mapping of a live process as its caller read it from /proc/PID/maps (gpuflame reads that
//! file in one place, the profiler's process tracker), for addresses no recorded mapping holds.

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// 0 for anonymous memory and the kernel's images (`[vdso]`).
    pub inode: u64,
    /// A file path, `[vdso]`-style name, or empty for anonymous memory.
    pub path: String,
}
