//! Helpers shared by the benchmarks.

use std::path::{Path, PathBuf};

/// glibc, present on every machine the benchmarks run on.
pub const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// The shared library with the largest `.eh_frame` among the usual places (the Rust toolchain's
/// libLLVM on the development machine; libtorch_cuda.so where PyTorch is installed), or the
/// path in GPUFLAME_BENCH_LIB.
pub fn largest_library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUFLAME_BENCH_LIB") {
        return Some(PathBuf::from(p));
    }
    let mut roots = vec![PathBuf::from("/usr/lib"), PathBuf::from("/usr/local/lib")];
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".rustup/toolchains"));
    }
    let mut best: Option<(u64, PathBuf)> = None;
    let mut stack = roots;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let path = e.path();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(".so")) {
                let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                if size > 20 << 20 && best.as_ref().is_none_or(|(s, _)| size > *s) {
                    best = Some((size, path));
                }
            }
        }
    }
    best.map(|(_, p)| p)
}
