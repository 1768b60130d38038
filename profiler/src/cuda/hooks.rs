//! Which CUDA functions are hooked, where, and when.
//!
//! Every executable file a target process maps is searched once for CUDA entry points. Memory and
//! bookkeeping functions are hooked as soon as the file is found and stay hooked: they are called
//! rarely. Launch and synchronisation functions are called thousands of times a second and a uprobe
//! costs microseconds per call, so by default their hooks are attached in short windows (the
//! [`DutyCycle`]) and their counts scaled; `exact` keeps them attached.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, CudaApi, CudaFunctions, CudaHookLink, TorchProbes, TrapCost};

use super::discover::cuda_functions;
use super::coverage::Coverage;
use crate::process::MapsEntry;

/// When the cycled hooks are attached.
#[derive(Debug, Clone)]
pub struct DutyCycle {
    /// Attached this long…
    pub on: Duration,
    /// …at the start of every period.
    pub period: Duration,
}

impl DutyCycle {
    /// 10 ms a second: a launch-bound loop loses at most 1% of its time to the hooks.
    pub const DEFAULT: DutyCycle = DutyCycle { on: Duration::from_millis(10), period: Duration::from_secs(1) };
}

struct HookedFile {
    name: String,
    cycled_functions: CudaFunctions,
    _always: Option<CudaHookLink>,
    _probes: Option<TorchProbes>,
    cycled: Option<CudaHookLink>,
    /// Processes that map the file, with a path that reaches it from here.
    users: HashMap<u32, PathBuf>,
}

/// The allocator's functions that follow tensors; its out-of-memory report is not one of them
/// (libc10, not libc10_cuda): an OOM is seen however tensors are followed.
fn follows_tensors(api: CudaApi) -> bool {
    api.is_pytorch() && api != CudaApi::C10OutOfMemory
}

/// Why an allocator without probes is not followed at the agent's defaults.
const NO_PROBES_AT_DEFAULTS: &str =
    "it has no USDT probes (torch 2.15 on has them), and the hooks that stand in for them (16-22 us a tensor) are not the agent's default: ask for tensor-inuse with --profiles to have them";

pub struct CudaHookManager {
    /// Hook launches and synchronisations at all (the gpu-launches or cuda-api profile is on).
    cycled_wanted: bool,
    /// Hook PyTorch's caching allocator (a tensor profile is on): three traps per tensor, tens
    /// of microseconds on a VM, which a program that asked only for segments does not pay.
    tensors_wanted: bool,
    /// Tensors followed by hooks on the allocator's functions where its library has no probes.
    tensors_by_hooks: bool,
    /// None: exact, always attached.
    duty: Option<DutyCycle>,
    files: HashMap<(String, u64), HookedFile>,
    without_cuda: HashSet<(String, u64)>,
    cycle_start: Instant,
    cycled_on_since: Option<Instant>,
    attached: Duration,
    window_start: Instant,
    trap_cost: TrapCost,
    pub stats: HookStats,
}

#[derive(Debug, Clone, Default)]
pub struct HookStats {
    pub files_searched: usize,
    pub files_hooked: usize,
    pub attach_failures: usize,
    /// Time from the event that reported a new mapping to its hooks being attached, worst case.
    pub max_attach_latency: Duration,
    /// Each PyTorch libc10_cuda found: its path, and how its allocator is followed.
    pub allocators: Vec<(String, AllocatorFollowed)>,
}

/// How the tensors of one libc10_cuda are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorFollowed {
    /// Through PyTorch's USDT probes (pytorch:malloc, pytorch:free).
    ByProbes,
    /// By hooks on its functions; why not by probes.
    ByHooks(&'static str),
    /// Not at all: why, in words.
    Not(String),
}

impl CudaHookManager {
    pub fn new(cycled_wanted: bool, duty: Option<DutyCycle>) -> Self {
        let now = Instant::now();
        // The first window opens at once.
        let cycle_start = duty.as_ref().and_then(|d| now.checked_sub(d.period)).unwrap_or(now);
        CudaHookManager {
            cycled_wanted,
            tensors_wanted: false,
            tensors_by_hooks: true,
            duty,
            files: HashMap::new(),
            without_cuda: HashSet::new(),
            cycle_start,
            cycled_on_since: None,
            attached: Duration::ZERO,
            window_start: now,
            trap_cost: TrapCost::default(),
            stats: HookStats::default(),
        }
    }

    /// `by_hooks`: also where the allocator has no USDT probes, by hooks on its functions (16-22
    /// us a tensor against 3-6 through the probes): what `record` does, and the agent when its
    /// profiles were asked for rather than its defaults.
    pub fn with_tensors(mut self, wanted: bool, by_hooks: bool) -> Self {
        self.tensors_wanted = wanted;
        self.tensors_by_hooks = by_hooks;
        self
    }

    /// Measures what the traps of a hooked call cost, to correct sampled counts for it.
    pub fn calibrate(&mut self, sampler: &BpfPrograms) {
        if !self.cycled_wanted || self.duty.is_none() {
            return;
        }
        match sampler.calibrate_trap_cost() {
            Ok(cost) => {
                tracing::info!(trap_cost_ns = cost.emulated.as_nanos() as u64, stepped_ns = cost.stepped.as_nanos() as u64, "cost of a hooked call's traps");
                self.trap_cost = cost;
            }
            Err(e) => tracing::warn!(error = %e, "cannot measure the cost of a hooked call; sampled launch counts will come out low"),
        }
    }

    /// Looks at a process's executable mappings (as just read) and hooks the CUDA it finds.
    pub fn process_mapped(&mut self, sampler: &BpfPrograms, pid: u32, entries: &[MapsEntry], seen_at: Instant) {
        let mut mapped_now = HashSet::new();
        let mut files: Vec<&MapsEntry> = entries.iter().filter(|e| e.executable && e.inode != 0 && e.path.starts_with('/')).collect();
        // The files that hold CUDA first: a process that maps torch maps them in one go with
        // libtorch_cpu.so, whose search alone takes 100 ms, and should not wait behind it.
        files.sort_by_key(|e| !likely_cuda(&e.path));
        for entry in files {
            let key = (entry.dev.clone(), entry.inode);
            mapped_now.insert(key.clone());
            let path = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end));
            self.hook_file(sampler, pid, entry, path, seen_at);
        }
        // Files this process no longer maps, and files nobody maps any more.
        for (key, file) in self.files.iter_mut() {
            if !mapped_now.contains(key) {
                file.users.remove(&pid);
            }
        }
        self.files.retain(|_, f| !f.users.is_empty());
    }

    /// Whether the process maps a file whose CUDA functions are hooked.
    pub fn maps_cuda(&self, pid: u32) -> bool {
        self.files.values().any(|f| f.users.contains_key(&pid))
    }

    /// Searches a mapped file for CUDA once, and hooks what it finds; `path` reaches the file.
    fn hook_file(&mut self, sampler: &BpfPrograms, pid: u32, entry: &MapsEntry, path: PathBuf, seen_at: Instant) {
        let key = (entry.dev.clone(), entry.inode);
        if self.without_cuda.contains(&key) {
            return;
        }
        if let Some(file) = self.files.get_mut(&key) {
            file.users.insert(pid, path);
            return;
        }
        self.stats.files_searched += 1;
        let mut found = match cuda_functions(&path) {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(pid, path = %entry.path, error = %e, "cannot search for CUDA");
                self.without_cuda.insert(key);
                return;
            }
        };
        if !self.tensors_wanted {
            found.functions.retain(|(api, _)| !api.is_pytorch());
            found.allocator_missing = None;
            found.probes_replace = None;
        }
        let is_allocator = found.allocator_missing.is_some() || found.functions.iter().any(|(api, _)| *api == CudaApi::C10Malloc);
        let mut probes = None;
        let followed = match (&found.allocator_missing, &found.probes_replace) {
            (Some(why), _) => {
                tracing::warn!(path = %entry.path, "PyTorch's caching allocator cannot be followed: {why}; tensor-alloc and tensor-inuse stay empty for it, the hbm-* profiles (segments) still hold");
                AllocatorFollowed::Not(why.clone())
            }
            (None, Some(replaced)) => match sampler.attach_torch_probes(&path) {
                Ok(attached) => {
                    found.functions.retain(|f| !replaced.replaced.contains(f));
                    found.functions.extend(replaced.added.iter().copied());
                    probes = Some(attached);
                    AllocatorFollowed::ByProbes
                }
                Err(e) if self.tensors_by_hooks => {
                    tracing::warn!(path = %entry.path, error = %e, "cannot attach to PyTorch's allocator probes; its functions are hooked instead");
                    AllocatorFollowed::ByHooks("its probes could not be attached")
                }
                Err(e) => {
                    found.functions.retain(|(api, _)| !follows_tensors(*api));
                    AllocatorFollowed::Not(format!("its USDT probes could not be attached ({e})"))
                }
            },
            (None, None) if self.tensors_by_hooks => AllocatorFollowed::ByHooks("it has no USDT notes"),
            (None, None) => {
                found.functions.retain(|(api, _)| !follows_tensors(*api));
                if is_allocator {
                    tracing::info!(path = %entry.path, "PyTorch's caching allocator not followed for tensors: {NO_PROBES_AT_DEFAULTS}");
                }
                AllocatorFollowed::Not(NO_PROBES_AT_DEFAULTS.to_string())
            }
        };
        if is_allocator {
            match &followed {
                AllocatorFollowed::ByProbes => tracing::info!(path = %entry.path, "PyTorch's caching allocator followed through its USDT probes pytorch:malloc and pytorch:free"),
                AllocatorFollowed::ByHooks(why) => tracing::info!(path = %entry.path, "PyTorch's caching allocator followed by hooks on its functions: {why}"),
                AllocatorFollowed::Not(_) => {}
            }
            if self.stats.allocators.len() < 64 {
                self.stats.allocators.push((entry.path.clone(), followed));
            }
        }
        let functions = match found.functions {
            f if !f.is_empty() => f,
            _ => {
                self.without_cuda.insert(key);
                return;
            }
        };
        let (always, cycled): (Vec<_>, Vec<_>) = functions.iter().partition(|(api, _)| api.always_on());
        let name = entry.path.clone();
        let always_hooks = match (!always.is_empty()).then(|| sampler.attach_cuda(&path, &CudaFunctions::new(&path, &always))) {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                self.stats.attach_failures += 1;
                tracing::warn!(path = %name, error = %e, "cannot hook the CUDA memory functions");
                None
            }
            None => None,
        };
        let mut file = HookedFile { name, cycled_functions: CudaFunctions::new(&path, &cycled), _always: always_hooks, _probes: probes, cycled: None, users: HashMap::from([(pid, path)]) };
        if self.cycled_wanted && (self.duty.is_none() || self.cycled_on_since.is_some()) {
            attach_cycled(sampler, &mut file, &mut self.stats);
        }
        let latency = seen_at.elapsed();
        self.stats.max_attach_latency = self.stats.max_attach_latency.max(latency);
        self.stats.files_hooked += 1;
        tracing::info!(pid, file = %file.name, functions = functions.len(), latency_ms = latency.as_secs_f64() * 1e3, "CUDA found and hooked");
        self.files.insert(key, file);
    }

    /// Hooks a file by path before any process maps it (the injection library of a command about
    /// to start).
    pub fn hook_path(&mut self, sampler: &BpfPrograms, path: &std::path::Path) {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::metadata(path) else { return };
        let dev = meta.dev();
        // As /proc/PID/maps writes devices.
        let key = (format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev)), meta.ino());
        let entry = MapsEntry { start: 0, end: 0, executable: true, writable: false, offset: 0, dev: key.0.clone(), inode: key.1, path: path.display().to_string() };
        self.hook_file(sampler, 0, &entry, path.to_path_buf(), std::time::Instant::now());
    }

    pub fn process_exited(&mut self, pid: u32) {
        for file in self.files.values_mut() {
            file.users.remove(&pid);
        }
        self.files.retain(|_, f| !f.users.is_empty());
    }

    /// How long until the cycled hooks must be attached or detached; None when they never are.
    pub fn next_toggle(&self, now: Instant) -> Option<Duration> {
        let duty = self.duty.as_ref().filter(|_| self.cycled_wanted)?;
        let deadline = match self.cycled_on_since {
            Some(since) => since + duty.on,
            None => self.cycle_start + duty.period,
        };
        Some(deadline.saturating_duration_since(now))
    }

    /// Attaches or detaches the cycled hooks when their time has come; at the start, attaches
    /// them for exact counting.
    pub fn tick(&mut self, sampler: &BpfPrograms) {
        if !self.cycled_wanted {
            return;
        }
        let now = Instant::now();
        let Some(duty) = self.duty.clone() else { return };
        match self.cycled_on_since {
            Some(since) if now >= since + duty.on => {
                // The window ends where detaching starts: calls after it are not seen. A window
                // in which nothing was hooked saw nothing and stands for nothing.
                if self.files.values().any(|f| f.cycled.is_some()) {
                    self.attached += now - since.max(self.window_start);
                }
                self.cycled_on_since = None;
                for file in self.files.values_mut() {
                    if let Some(h) = file.cycled.take() {
                        h.detach_in_background();
                    }
                }
                tracing::trace!("cycled CUDA hooks detached");
            }
            None if now >= self.cycle_start + duty.period => {
                self.cycle_start = now;
                for file in self.files.values_mut() {
                    attach_cycled(sampler, file, &mut self.stats);
                }
                self.cycled_on_since = Some(Instant::now());
                tracing::trace!(attach_ms = now.elapsed().as_secs_f64() * 1e3, "cycled CUDA hooks attached");
            }
            _ => {}
        }
    }

    /// The coverage of the cycled hooks since the last call, which starts a new window.
    pub fn take_coverage(&mut self) -> Coverage {
        let now = Instant::now();
        let mut attached = std::mem::take(&mut self.attached);
        if let Some(since) = self.cycled_on_since.filter(|_| self.files.values().any(|f| f.cycled.is_some())) {
            attached += now - since.max(self.window_start);
            self.cycled_on_since = Some(now);
        }
        let elapsed = now - self.window_start;
        self.window_start = now;
        Coverage { attached, elapsed, exact: self.duty.is_none(), trap_cost: self.trap_cost, window: self.duty.as_ref().map_or(Duration::ZERO, |d| d.on) }
    }

    pub fn trap_cost(&self) -> TrapCost {
        self.trap_cost
    }

    pub fn files_hooked(&self) -> usize {
        self.files.len()
    }
}

fn attach_cycled(sampler: &BpfPrograms, file: &mut HookedFile, stats: &mut HookStats) {
    if file.cycled_functions.is_empty() || file.cycled.is_some() {
        return;
    }
    // Any process that maps the file reaches it; the first may have exited.
    for path in file.users.values() {
        match sampler.attach_cuda(path, &file.cycled_functions) {
            Ok(h) => {
                file.cycled = Some(h);
                return;
            }
            Err(e) => tracing::debug!(file = %file.name, error = %e, "cannot hook CUDA launches through this path"),
        }
    }
    stats.attach_failures += 1;
}


/// Whether a mapped file is likely to define CUDA entry points: NVIDIA's own libraries (the CUDA
/// runtime and the copies linked into NCCL and NVSHMEM, under .../nvidia/ in PyPI wheels).
fn likely_cuda(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.contains("/nvidia/") || ["cuda", "libcu", "nccl", "nvshmem"].iter().any(|k| name.contains(k))
}
