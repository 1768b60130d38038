//! CUDA: finding and hooking the runtime and driver in the processes that map them (with the
//! duty cycle of the launch hooks), the CUPTI injection library and its handshake, and the
//! accounting that the CUDA profiles' sources (`crate::sources`) build on: device memory by
//! allocation, GPU time by launch, NCCL's device time by collective call.

mod call_sites;
mod discover;
pub mod kernel_attribution;
pub mod hbm;
mod coverage;
pub mod hooks;
pub mod injection;
pub mod live;
pub mod memory;
pub mod nccl;
pub mod ready;
pub mod memory_points;

pub use discover::{cuda_functions, CudaSearch, DiscoverError};
pub use coverage::{Coverage, ThreadRate};
pub use hooks::{CudaHookManager, DutyCycle};
pub use crate::units::human_bytes;
