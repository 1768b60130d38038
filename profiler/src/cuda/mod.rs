//! CUDA: finding and hooking the runtime and driver in the processes that map them (with the
//! duty cycle of the launch hooks), the CUPTI injection library and its handshake, and the
//! accounting that the CUDA profiles' sources (`crate::sources`) build on: device memory by
//! allocation, GPU time by launch, NCCL's device time by collective call.

mod call_sites;
mod discover;
pub mod gputime;
pub mod hbm;
mod coverage;
pub mod hooks;
pub mod injection;
pub mod memory;
pub mod nccl;
pub mod ready;
pub mod timeline;

pub use discover::{cuda_functions, CudaSearch, DiscoverError};
pub use coverage::{Coverage, ThreadRate};
pub use hooks::{CudaHookManager, DutyCycle};

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
