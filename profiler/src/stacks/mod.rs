//! Aggregation of raw CPU samples and of the stacks of CUDA calls, then symbolization into a
//! [`Profile`].
//!
//! User addresses are normalized as each sample arrives, while its process is alive; names are
//! looked up once at the end, from the files, so short-lived processes keep their symbols.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuflame_bpf::{Sample, UnwindStatus, UserFrame};
use gpuflame_pyframes::Interpreter;
use gpuflame_symbolizer::{MappedFile, NameTag, PyFrame, PythonSymbolizer, Symbol, Symbolizer, UserAddr};

use crate::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, KERNEL_MAPPING, PYTHON_MAPPING};

/// A user frame in an aggregated stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum UserKey {
    Native(UserAddr),
    /// Index into the aggregator's Python frames.
    Python(u32),
    /// Native frames missing between the Python frames and the native ones below: why.
    Gap(&'static str),
}

/// What a gap in a stack says, by why the native walk stopped.
fn gap_label(status: UnwindStatus) -> &'static str {
    match status {
        UnwindStatus::NoRow | UnwindStatus::BadFrame | UnwindStatus::BadCfa => "[native: no unwind info]",
        UnwindStatus::NoTableYet => "[native: unwind table not loaded yet]",
        UnwindStatus::ReadFault => "[native: stack not readable]",
        UnwindStatus::NoMapping | UnwindStatus::NoProcess => "[native: unknown code]",
        _ => "[native: frames missing]",
    }
}

/// The frame at the root of a user stack that does not reach its base: without it, a stack that
/// stopped at its leaf (the first samples of a program, before its table is loaded) reads as if
/// the leaf were called from nowhere, and sits beside the program's real root. A stack with
/// Python frames after a gap is marked at the gap instead.
fn root_marker(status: UnwindStatus, user: &[UserKey]) -> Option<&'static str> {
    match status {
        UnwindStatus::Truncated => Some("[truncated]"),
        UnwindStatus::EndOfStack | UnwindStatus::ZeroReturnAddress | UnwindStatus::KernelThread | UnwindStatus::InExec => None,
        _ if user.is_empty() || user.iter().any(|f| matches!(f, UserKey::Gap(_))) => None,
        status => Some(gap_label(status)),
    }
}

/// Symbols cached across windows before the caches are dropped and rebuilt.
const SYMBOL_CACHE_LIMIT: usize = 200_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    pub(crate) comm: String,
    /// Leaf first, as sampled.
    pub(crate) kernel: Vec<u64>,
    pub(crate) user: Vec<UserKey>,
    /// What stands at the root in place of the stack's missing base: `[truncated]` at the
    /// unwinder's depth limit, or why the native walk stopped early (see [`root_marker`]).
    pub(crate) root: Option<&'static str>,
    /// Frames below the user leaf that the stack does not have: the CUDA function that was
    /// called, the kernel it launched.
    pub(crate) tail: Vec<TailFrame>,
    /// A frame under the kernel's leaf: why an off-CPU stack left the CPU.
    pub(crate) leaf: Option<&'static str>,
}

impl StackKey {
    /// Native frames that no file of the process was found to hold: anonymous code (a JIT), or
    /// a process whose mappings were not read while it lived.
    pub fn unplaced_frames(&self) -> usize {
        self.user.iter().filter(|u| matches!(u, UserKey::Native(UserAddr::Unmapped { .. }))).count()
    }
}

/// A frame under the leaf of a hooked call's stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TailFrame {
    /// A function by name, such as `cudaMalloc`.
    Function(String),
    /// A GPU kernel by name: `[gpu] name`.
    Kernel(String),
    /// A GPU kernel by the address of its host stub, named by the stub's symbol.
    KernelStub(UserAddr),
}

/// Stacks with their device label and one value per sample type, ready to be symbolized.
pub type StackValues = Vec<(StackKey, Option<u32>, Vec<i64>)>;

/// A stack as the aggregators keep it: addresses, normalized while the process lives; named only
/// when a profile is built.
pub type StackId = StackKey;

pub struct CpuAggregator {
    symbolizer: Symbolizer,
    python: PythonSymbolizer,
    py_frames: Vec<PyFrame>,
    py_index: HashMap<PyFrame, u32>,
    counts: HashMap<StackKey, u64>,
    comms: HashMap<u32, String>,
    samples: u64,
    /// Samples with a user stack, and those of them that reached the outermost frame.
    user_stacks: u64,
    complete_user_stacks: u64,
}

impl Default for CpuAggregator {
    fn default() -> Self {
        Self::new()
    }
}

/// Stacks hold the sampled address, then return addresses. A return address points after the
/// call, possibly into the next function or line, so the call instruction is looked up instead.
fn call_sites(frames: &[u64]) -> Vec<u64> {
    frames.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) }).collect()
}

impl CpuAggregator {
    pub fn new() -> Self {
        CpuAggregator {
            symbolizer: Symbolizer::new(),
            python: PythonSymbolizer::new(),
            py_frames: Vec::new(),
            py_index: HashMap::new(),
            counts: HashMap::new(),
            comms: HashMap::new(),
            samples: 0,
            user_stacks: 0,
            complete_user_stacks: 0,
        }
    }

    /// Adds a CPU sample. `files` are the process's mappings as the process tracker read them,
    /// so that its addresses are placed even if it has exited by now.
    pub fn add(&mut self, sample: &Sample, files: Option<&[MappedFile]>, python: Option<&Interpreter>) {
        if sample.unwind.has_user_stack() {
            self.user_stacks += 1;
            self.complete_user_stacks += u64::from(sample.unwind.is_complete());
        }
        let key = self.stack(sample, files, python, false);
        *self.counts.entry(key).or_default() += 1;
        self.samples += 1;
    }

    /// The stack of a sample. `at_return`: the leaf is a return address too (a stack taken when
    /// a hooked function returned), so its call instruction is what is looked up.
    pub fn stack(&mut self, sample: &Sample, files: Option<&[MappedFile]>, python: Option<&Interpreter>, at_return: bool) -> StackKey {
        // A new command name of a process's main thread means exec: its old mappings are gone.
        // (Other threads have names of their own.)
        if sample.tid == sample.pid {
            if let Some(old) = self.comms.insert(sample.pid, sample.comm.clone()) {
                if old != sample.comm {
                    self.symbolizer.forget_process(sample.pid);
                    self.python.forget_process(sample.pid);
                }
            }
        } else {
            self.comms.entry(sample.pid).or_insert_with(|| sample.comm.clone());
        }
        // Native addresses go through normalization in one batch; Python frames are named now,
        // while the process and its code objects are alive.
        let native: Vec<u64> = sample
            .user_stack
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f {
                UserFrame::Native(a) if i == 0 && !at_return => Some(*a),
                UserFrame::Native(a) => Some(a.saturating_sub(1)),
                UserFrame::Python { .. } | UserFrame::Gap => None,
            })
            .collect();
        let normalized = match files {
            _ if native.is_empty() => Vec::new(),
            Some(files) => self.symbolizer.normalize_in(sample.pid, &native, files),
            None => self.symbolizer.normalize(sample.pid, &native),
        };
        let mut normalized = normalized.into_iter();
        let mut user = Vec::with_capacity(sample.user_stack.len());
        // A process gone before its maps were read: its leaf is placed by the file under it.
        let leaf_in_file = sample.leaf_file.and_then(|f| self.symbolizer.in_file(f.dev, f.ino, f.size, f.offset));
        for frame in &sample.user_stack {
            match *frame {
                UserFrame::Native(a) => {
                    let placed = normalized.next().unwrap_or(UserAddr::Unmapped { addr: a });
                    let placed = match (placed, leaf_in_file) {
                        (UserAddr::Unmapped { .. }, Some(in_file)) if user.is_empty() => in_file,
                        _ => placed,
                    };
                    user.push(UserKey::Native(placed));
                }
                UserFrame::Gap => user.push(UserKey::Gap(gap_label(sample.unwind))),
                UserFrame::Python { code, name_tag, first_line, lasti } => {
                    let Some(interp) = python else { continue };
                    let name = NameTag { tag: name_tag, of: gpuflame_bpf::python_name_tag };
                    let py = self.python.resolve(sample.pid, &interp.offsets, code, name, first_line, lasti);
                    let next = self.py_frames.len() as u32;
                    let id = *self.py_index.entry(py.clone()).or_insert(next);
                    if id == next {
                        self.py_frames.push(py);
                    }
                    user.push(UserKey::Python(id));
                }
            }
        }
        StackKey {
            pid: sample.pid,
            tid: sample.tid,
            comm: sample.comm.clone(),
            kernel: call_sites(sample.kernel_stack.frames()),
            root: root_marker(sample.unwind, &user),
            user,
            tail: Vec::new(),
            leaf: None,
        }
    }

    /// A native address of a process (a kernel's host stub), normalized for naming later.
    pub fn code_address(&mut self, pid: u32, addr: u64, files: Option<&[MappedFile]>) -> UserAddr {
        let normalized = match files {
            Some(files) => self.symbolizer.normalize_in(pid, &[addr], files),
            None => self.symbolizer.normalize(pid, &[addr]),
        };
        normalized.into_iter().next().unwrap_or(UserAddr::Unmapped { addr })
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Python frames shown as `[unknown python]`: unreadable, or no longer the code sampled.
    pub fn unknown_python_frames(&self) -> u64 {
        self.python.unknown_frames
    }

    /// Forgets processes that are gone (their samples of this window are in `counts` already),
    /// and keeps the symbol caches bounded.
    pub fn forget_exited(&mut self) {
        let gone: Vec<u32> = self.comms.keys().copied().filter(|&pid| !crate::target::process_alive(pid)).collect();
        for pid in gone {
            self.comms.remove(&pid);
            self.symbolizer.forget_process(pid);
            self.python.forget_process(pid);
        }
        self.symbolizer.trim(SYMBOL_CACHE_LIMIT);
    }

    /// Fraction of user stacks that reached their outermost frame (thread entry).
    pub fn complete_fraction(&self) -> Option<f64> {
        (self.user_stacks > 0).then(|| self.complete_user_stacks as f64 / self.user_stacks as f64)
    }

    pub fn processes(&self) -> usize {
        self.counts.keys().map(|k| k.pid).collect::<HashSet<_>>().len()
    }

    /// Symbolizes what was gathered since the last call and builds its CPU profile; the counts
    /// start again from zero, the symbol caches stay.
    pub fn take_profile(&mut self, frequency_hz: u64, start: SystemTime, duration: Duration) -> Profile {
        let values = self.take_cpu_values(frequency_hz);
        let mut profile = Profile::cpu(frequency_hz);
        self.build(&mut profile, values, start, duration);
        self.forget_exited();
        profile
    }

    /// The CPU time of the stacks gathered since the last call (samples × period, in ns); the
    /// counts start again from zero.
    pub fn take_cpu_values(&mut self, frequency_hz: u64) -> StackValues {
        let counts = std::mem::take(&mut self.counts);
        self.samples = 0;
        self.user_stacks = 0;
        self.complete_user_stacks = 0;
        let period = Profile::cpu(frequency_hz).period;
        counts.into_iter().map(|(k, n)| (k, None, vec![n as i64 * period])).collect()
    }

    /// Fills `profile` with these stacks, their values and device labels, symbolized.
    pub fn build(&mut self, profile: &mut Profile, values: StackValues, start: SystemTime, duration: Duration) {
        profile.time_nanos = start.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
        profile.duration_nanos = duration.as_nanos() as i64;

        let stub = |t: &TailFrame| match t {
            TailFrame::KernelStub(a) => Some(*a),
            _ => None,
        };
        let mut user_addrs: Vec<UserAddr> = values
            .iter()
            .flat_map(|(k, _, _)| {
                k.user
                    .iter()
                    .filter_map(|u| match u {
                        UserKey::Native(a) => Some(*a),
                        UserKey::Python(_) | UserKey::Gap(_) => None,
                    })
                    .chain(k.tail.iter().filter_map(stub))
            })
            .collect();
        user_addrs.sort_unstable();
        user_addrs.dedup();
        let mut kernel_addrs: Vec<u64> = values.iter().flat_map(|(k, _, _)| k.kernel.iter().copied()).collect();
        kernel_addrs.sort_unstable();
        kernel_addrs.dedup();
        let user_syms: HashMap<UserAddr, Symbol> =
            user_addrs.iter().copied().zip(self.symbolizer.symbolize_user(&user_addrs)).collect();
        let kernel_syms: HashMap<u64, Symbol> =
            kernel_addrs.iter().copied().zip(self.symbolizer.symbolize_kernel(&kernel_addrs)).collect();

        let mut b = ProfileBuilder::default();
        let kernel_mapping = b.mapping(profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None });
        let python_mapping = b.mapping(profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
        let mut user_locations: HashMap<UserKey, usize> = HashMap::new();
        let mut kernel_locations: HashMap<u64, usize> = HashMap::new();
        for (key, device, vals) in &values {
            let mut stack = Vec::with_capacity(key.user.len() + key.kernel.len() + key.tail.len() + 1);
            if let Some(root) = key.root {
                let location = Location { mapping: None, address: 0, kernel: false, lines: vec![Line::function(root)] };
                stack.push(b.location(profile, location));
            }
            for frame in key.user.iter().rev() {
                let loc = *user_locations.entry(*frame).or_insert_with(|| {
                    let location = match frame {
                        UserKey::Native(addr) => self.user_location(&mut b, profile, *addr, &user_syms[addr]),
                        UserKey::Python(id) => {
                            let py = &self.py_frames[*id as usize];
                            let line = Line { function: py.function.to_string(), file: Some(py.file.to_string()), line: py.line };
                            Location { mapping: Some(python_mapping), address: 0, kernel: false, lines: vec![line] }
                        }
                        UserKey::Gap(label) => Location { mapping: None, address: 0, kernel: false, lines: vec![Line::function(*label)] },
                    };
                    b.location(profile, location)
                });
                stack.push(loc);
            }
            for frame in &key.tail {
                let name = match frame {
                    TailFrame::Function(name) => name.clone(),
                    TailFrame::Kernel(name) => format!("[gpu] {name}"),
                    TailFrame::KernelStub(addr) => match user_syms[addr].lines.last() {
                        Some(line) => format!("[gpu] {}", line.function),
                        None => "[gpu] [unknown kernel]".to_string(),
                    },
                };
                stack.push(b.location(profile, Location { mapping: None, address: 0, kernel: false, lines: vec![Line::function(name)] }));
            }
            // An off-CPU stack was taken inside the sched_switch tracepoint: its leaf frames are
            // the program and the tracepoint's plumbing, which differ from call to call.
            let plumbing = if key.leaf.is_some() {
                key.kernel.iter().take_while(|a| kernel_syms[a].lines.first().is_some_and(|l| is_tracepoint_plumbing(&l.function))).count()
            } else {
                0
            };
            for addr in key.kernel[plumbing..].iter().rev() {
                let loc = *kernel_locations.entry(*addr).or_insert_with(|| {
                    let lines = lines_or_unknown(&kernel_syms[addr], || format!("[unknown] ({KERNEL_MAPPING}+{addr:#x})"));
                    b.location(profile, Location { mapping: Some(kernel_mapping), address: *addr, kernel: true, lines })
                });
                stack.push(loc);
            }
            if let Some(label) = key.leaf {
                stack.push(b.location(profile, Location { mapping: None, address: 0, kernel: false, lines: vec![Line::function(label)] }));
            }
            let labels = Labels { pid: Some(key.pid), tid: Some(key.tid), comm: Some(key.comm.clone()), device: *device };
            b.add_values(stack, labels, vals);
        }
        b.finish(profile);
    }

    /// The processes sampled, and not yet found to have exited.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.comms.keys().copied()
    }

    /// Drops the leaf frames that lie in files `drop` names (by file name): the frames of a
    /// library that reports from inside the call it watches.
    pub fn trim_leaf_files(&self, key: &mut StackKey, drop: impl Fn(&str) -> bool) {
        let n = key
            .user
            .iter()
            .take_while(|u| match u {
                UserKey::Native(UserAddr::InModule { module, .. }) => drop(&self.symbolizer.module(*module).file_name()),
                _ => false,
            })
            .count();
        key.user.drain(..n);
    }

    /// One stack as a line for logs: `main → load → cudaMalloc`.
    pub fn describe(&mut self, stack: &StackKey) -> String {
        let mut profile = Profile::of(vec![crate::profile::ValueType::new("stack", "count")]);
        self.build(&mut profile, vec![(stack.clone(), None, vec![1])], UNIX_EPOCH, Duration::ZERO);
        let line = crate::output::folded::lines(&profile, crate::output::Detail::Lines).into_iter().next().unwrap_or_default();
        let frames = line.rsplit_once(' ').map_or(line.as_str(), |(f, _)| f);
        frames.split(';').skip(1).collect::<Vec<_>>().join(" → ")
    }

    fn user_location(&self, b: &mut ProfileBuilder, profile: &mut Profile, addr: UserAddr, sym: &Symbol) -> Location {
        match addr {
            UserAddr::InModule { module, file_offset } => {
                let module = self.symbolizer.module(module);
                let mapping = b.mapping(profile, Mapping { path: module.path.display().to_string(), build_id: module.build_id_hex() });
                let lines = lines_or_unknown(sym, || format!("[unknown] ({}+{file_offset:#x})", module.file_name()));
                Location { mapping: Some(mapping), address: file_offset, kernel: false, lines }
            }
            UserAddr::Unmapped { addr } => {
                Location { mapping: None, address: addr, kernel: false, lines: vec![Line::function(format!("[unknown] ({addr:#x})"))] }
            }
        }
    }
}

/// Kernel functions that run a BPF program at a tracepoint, and the programs themselves.
fn is_tracepoint_plumbing(function: &str) -> bool {
    ["bpf_prog_", "bpf_trace_run", "__traceiter_", "__bpf_trace_"].iter().any(|p| function.starts_with(p))
}

fn lines_or_unknown(sym: &Symbol, unknown: impl FnOnce() -> String) -> Vec<Line> {
    if sym.is_unknown() {
        return vec![Line::function(unknown())];
    }
    sym.lines.iter().map(|l| Line { function: l.function.clone(), file: l.file.clone(), line: l.line }).collect()
}

#[cfg(test)]
mod tests {
    use super::{call_sites, is_tracepoint_plumbing};

    #[test]
    fn tracepoint_plumbing_is_known_by_name() {
        assert!(is_tracepoint_plumbing("bpf_prog_5bfa299a51b840d9_on_sched_switch"));
        assert!(is_tracepoint_plumbing("__traceiter_sched_switch"));
        assert!(is_tracepoint_plumbing("bpf_trace_run4"));
        assert!(!is_tracepoint_plumbing("__schedule"));
    }

    #[test]
    fn return_addresses_point_at_the_call() {
        assert_eq!(call_sites(&[100, 200, 300]), vec![100, 199, 299]);
        assert!(call_sites(&[]).is_empty());
    }
}
