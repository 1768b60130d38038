//! CUDA profiles: HBM allocated and in use, kernel launches and time in CUDA calls, per stack,
//! from the records of the CUDA hooks; and OOM forensics.

mod discover;
mod gputime;
pub mod hbm;
pub mod hooks;
pub mod injection;
pub mod ready;

use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use gpuflame_bpf::{CudaApi, CudaCall, CudaClass, GpuKernelBatch, GpuKernelName, KernelName};
use gpuflame_pyframes::Interpreter;
use gpuflame_symbolizer::MappedFile;

pub use discover::{cuda_functions, DiscoverError};
pub use hooks::{CudaHookManager, Coverage, DutyCycle};

use crate::aggregate::{CpuAggregator, StackKey, StackValues, TailFrame};
use crate::profile::Profile;
use crate::profile_kind::ProfileKind;
use hbm::{Hbm, Site, SiteTotals};

const STACK_CACHE_LIMIT: usize = 50_000;

/// cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2.
const OUT_OF_MEMORY: i32 = 2;

/// An allocation that failed for lack of memory.
#[derive(Debug, Clone)]
pub struct OomReport {
    pub pid: u32,
    pub comm: String,
    pub api: CudaApi,
    pub requested: u64,
    pub device: u32,
    /// Bytes the process held when it failed, as far as the hooks saw.
    pub in_use: u64,
    pub stack: StackKey,
    pub in_use_by_site: SiteTotals,
}

#[derive(Default)]
pub struct CudaProfiles {
    pub hbm: Hbm,
    launches: HashMap<StackKey, i64>,
    /// Time in calls whose hooks are always attached, and in calls whose hooks are cycled.
    api_exact: HashMap<StackKey, i64>,
    api_sampled: HashMap<StackKey, i64>,
    kernel_names: HashMap<(u32, u64), String>,
    /// Per thread: calls seen through cycled hooks, for their rate.
    cycled_calls: HashMap<u32, hooks::ThreadRate>,
    trap_cost: std::time::Duration,
    /// Stacks already seen, by their raw frames: a launch loop repeats a few stacks millions of
    /// times, and naming Python frames costs reads of the process's memory.
    stack_cache: HashMap<(u32, u32, Vec<gpuflame_bpf::UserFrame>), StackKey>,
    pub launches_seen: u64,
    gpu_time: gputime::GpuTime,
    /// Processes whose injection library reported that it has no GPU time, and why.
    pub cupti_failures: HashMap<u32, i32>,
}

impl CudaProfiles {
    /// Handles one hooked call's return; an out-of-memory failure comes back as a report.
    pub fn add(&mut self, call: &CudaCall, stacks: &mut CpuAggregator, files: Option<&[MappedFile]>, python: Option<&Interpreter>) -> Option<OomReport> {
        let pid = call.sample.pid;
        if call.api == CudaApi::CuptiStatus {
            // Waiting for gpuflame is not a failure: the session answers it.
            if call.result != 0 && call.result != ready::STATUS_WAITING && self.cupti_failures.insert(pid, call.result).is_none() {
                let why = match call.result {
                    1 => "libcupti was not found (set GPUFLAME_CUPTI_PATH)",
                    2 => "another CUPTI subscriber is active (the PyTorch profiler or Nsight?)",
                    _ => "CUPTI refused the kernel activity",
                };
                eprintln!("gpuflame: pid {pid} ({}): no GPU time: {why}; its gpu-launches and cuda-api profiles stand in", call.sample.comm);
            }
            return None;
        }
        let cache_key = (pid, call.sample.tid, call.sample.user_stack.clone());
        let mut stack = match self.stack_cache.get(&cache_key) {
            Some(s) => s.clone(),
            None => {
                let s = stacks.stack(&call.sample, files, python, true);
                if self.stack_cache.len() >= STACK_CACHE_LIMIT {
                    self.stack_cache.clear();
                }
                self.stack_cache.insert(cache_key, s.clone());
                s
            }
        };
        stack.tail.push(TailFrame::Function(call.api.symbol().to_string()));
        if call.api == CudaApi::CuptiLaunch {
            // Reported from inside the launch, by the injection library through CUPTI: their
            // frames are not the program's.
            stacks.trim_leaf_files(&mut stack, |f| f.starts_with("libgpuflame_cupti") || f.starts_with("libcupti"));
            stack.tail.clear();
            // A stack cut short (its libraries just loaded, their tables not in yet) would take
            // its kernel's time away from the real call site: such a launch counts as unsampled.
            if call.sample.unwind.is_complete() {
                self.gpu_time.launch(pid, call.addr as u32, stack);
            }
            return None;
        }
        *(if call.api.always_on() { &mut self.api_exact } else { &mut self.api_sampled }).entry(stack.clone()).or_default() += call.duration_ns as i64;
        if !call.api.always_on() {
            self.cycled_calls.entry(call.sample.tid).or_default().add(call.sample.timestamp_ns, call.hook_ns, self.trap_cost);
        }
        let ok = call.result == 0;
        match call.api.class() {
            CudaClass::Alloc if ok && call.addr != 0 => {
                self.hbm.allocated(pid, call.api, call.addr, call.size, Rc::new(Site { stack, device: call.device }));
            }
            CudaClass::Alloc => {
                self.hbm.failed();
                if call.result == OUT_OF_MEMORY {
                    return Some(OomReport {
                        pid,
                        comm: call.sample.comm.clone(),
                        api: call.api,
                        requested: call.size,
                        device: call.device,
                        in_use: self.hbm.bytes_in_use(pid),
                        stack,
                        in_use_by_site: self.hbm.in_use_of(Some(pid)),
                    });
                }
            }
            CudaClass::Free | CudaClass::Map if ok => self.hbm.changed(pid, call.api, call.addr, call.size, call.handle),
            CudaClass::Launch if ok => {
                let kernel = match call.api {
                    CudaApi::CudaLaunchKernel | CudaApi::CudaLaunchKernelPtsz | CudaApi::CudaLaunchKernelExC | CudaApi::CudaLaunchKernelExCPtsz => {
                        Some(TailFrame::KernelStub(stacks.code_address(pid, call.addr, files)))
                    }
                    CudaApi::CudaGraphLaunch | CudaApi::CudaGraphLaunchPtsz | CudaApi::CuGraphLaunch | CudaApi::CuGraphLaunchPtsz => None,
                    _ => Some(TailFrame::Kernel(
                        self.kernel_names.get(&(pid, call.addr)).cloned().unwrap_or_else(|| format!("kernel {:#x}", call.addr)),
                    )),
                };
                stack.tail.extend(kernel);
                *self.launches.entry(stack).or_default() += 1;
                self.launches_seen += 1;
            }
            _ => {}
        }
        None
    }

    /// What the traps of one hooked call cost, as calibrated.
    pub fn set_trap_cost(&mut self, cost: std::time::Duration) {
        self.trap_cost = cost;
    }

    pub fn gpu_kernels(&mut self, batch: &GpuKernelBatch) {
        self.gpu_time.kernels(batch);
    }

    pub fn gpu_kernel_named(&mut self, n: GpuKernelName) {
        self.gpu_time.named(n);
    }

    pub fn kernel_named(&mut self, k: KernelName) {
        self.kernel_names.insert((k.pid, k.handle), k.name);
    }

    pub fn process_exited(&mut self, pid: u32) {
        self.hbm.process_exited(pid);
        self.stack_cache.retain(|k, _| k.0 != pid);
        self.kernel_names.retain(|&(p, _), _| p != pid);
        self.gpu_time.process_exited(pid);
    }

    /// The CUDA profiles among `wanted` for the window that ends now; a new window starts.
    pub fn take_profiles(&mut self, stacks: &mut CpuAggregator, wanted: &[ProfileKind], coverage: Coverage, start: SystemTime, duration: Duration) -> Vec<(ProfileKind, Profile)> {
        let (allocs, in_use) = self.hbm.take_window();
        self.stack_cache.clear();
        let launches = std::mem::take(&mut self.launches);
        let api_exact = std::mem::take(&mut self.api_exact);
        let api_sampled = std::mem::take(&mut self.api_sampled);
        let scale = coverage.scale();
        let thread_scales: HashMap<u32, f64> = std::mem::take(&mut self.cycled_calls)
            .into_iter()
            .map(|(tid, mut rate)| (tid, coverage.thread_scale(&mut rate)))
            .collect();
        let thread_scale = |tid: u32| thread_scales.get(&tid).copied().unwrap_or(scale);
        let scaled = |k: &StackKey, v: i64| (v as f64 * thread_scale(k.tid)).round() as i64;
        let mut out = Vec::new();
        for &kind in wanted.iter().filter(|k| k.is_cuda()) {
            let values: StackValues = match kind {
                ProfileKind::HbmAlloc => sites(&allocs),
                ProfileKind::HbmInUse => sites(&in_use),
                ProfileKind::GpuLaunches => launches.iter().map(|(k, &n)| (k.clone(), None, vec![scaled(k, n)])).collect(),
                ProfileKind::CudaApi => {
                    let mut sum: HashMap<&StackKey, i64> = HashMap::new();
                    for (k, &v) in &api_exact {
                        *sum.entry(k).or_default() += v;
                    }
                    for (k, &v) in &api_sampled {
                        *sum.entry(k).or_default() += scaled(k, v);
                    }
                    sum.into_iter().map(|(k, v)| (k.clone(), None, vec![v])).collect()
                }
                ProfileKind::GpuTime => {
                    let (values, stats) = self.gpu_time.take();
                    tracing::info!("{}", stats.describe());
                    let mut profile = Profile::of(kind.sample_types());
                    profile.comments.push(stats.describe());
                    stacks.build(&mut profile, values, start, duration);
                    out.push((kind, profile));
                    continue;
                }
                ProfileKind::Cpu | ProfileKind::OffCpu | ProfileKind::Wall => continue,
            };
            let mut profile = Profile::of(kind.sample_types());
            if matches!(kind, ProfileKind::GpuLaunches | ProfileKind::CudaApi) && !coverage.exact {
                profile.comments.push(format!(
                    "sampled: launch and synchronisation hooks were attached {:.2}% of the time ({:.0} ms of {:.1} s); counts and times are scaled by {:.1}, more for threads the hooks slowed down ({} ns of traps per call)",
                    100.0 / scale,
                    coverage.attached.as_secs_f64() * 1e3,
                    coverage.elapsed.as_secs_f64(),
                    scale,
                    coverage.trap_cost.as_nanos()
                ));
            }
            stacks.build(&mut profile, values, start, duration);
            out.push((kind, profile));
        }
        out
    }

    /// The in-use profile of the process that failed, with the failed request as a stack of its
    /// own: `… → cudaMalloc → [out of memory] 128.0 MiB requested`.
    pub fn oom_snapshot(stacks: &mut CpuAggregator, report: &OomReport, start: SystemTime) -> Profile {
        let mut values = sites(&report.in_use_by_site);
        let mut failing = report.stack.clone();
        failing.tail.push(TailFrame::Function(format!("[out of memory] {} requested", human_bytes(report.requested))));
        values.push((failing, Some(report.device), vec![report.requested as i64, 1]));
        let mut profile = Profile::of(ProfileKind::HbmInUse.sample_types());
        profile.comments.push(format!(
            "out of memory: {} of {} failed in pid {} ({}) holding {}",
            report.api.symbol(),
            human_bytes(report.requested),
            report.pid,
            report.comm,
            human_bytes(report.in_use)
        ));
        stacks.build(&mut profile, values, start, Duration::ZERO);
        profile
    }
}

fn sites(totals: &SiteTotals) -> StackValues {
    totals.iter().map(|(site, &(bytes, objects))| (site.stack.clone(), Some(site.device), vec![bytes, objects])).collect()
}

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
