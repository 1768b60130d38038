//! Stacks: the one service every profile's source uses. It turns a BPF record's stack into a
//! [`StackKey`] (user addresses normalized as the record arrives, while its process is alive;
//! Python frames named from its memory) and, when a window closes, symbolizes the keys into a
//! [`Profile`] (names looked up once, from the files, so short-lived processes keep their
//! symbols; see `build.rs`). It counts nothing: what a stack is worth is each source's business.

mod build;

use std::collections::HashMap;

use gpuflame_bpf::{Sample, UnwindStatus, UserFrame};
use gpuflame_pyframes::Interpreter;
use gpuflame_pyframes::{NameTag, PyFrame, PythonSymbolizer};
use gpuflame_symbolizer::{MappedFile, Symbolizer, UserAddr};

use crate::process::read_for_symbolizer;

/// A user frame of a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum UserKey {
    Native(UserAddr),
    /// Index into the Python frames named so far.
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
/// Stacks of hooked calls remembered by their raw frames, at most.
const CALL_STACK_CACHE_LIMIT: usize = 50_000;

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
    /// A stack of the process that has only what gpuflame says in its place (`tail`): time or
    /// bytes no stack of the program can be given.
    pub fn marker(pid: u32, comm: String, tail: Vec<TailFrame>) -> Self {
        StackKey { pid, tid: 0, comm, kernel: Vec::new(), user: Vec::new(), root: None, tail, leaf: None }
    }

    /// Native frames that no file of the process was found to hold: anonymous code (a JIT), or
    /// a process whose mappings were not read while it lived.
    pub fn unplaced_frames(&self) -> usize {
        self.user.iter().filter(|u| matches!(u, UserKey::Native(UserAddr::Unmapped { .. }))).count()
    }
}

/// A frame under the leaf of a hooked call's stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TailFrame {
    /// A hooked function by name, such as `cudaMalloc`.
    Call(String),
    /// What gpuflame says there, such as `[out of memory] 8.0 GiB requested`.
    Marker(String),
    /// A GPU kernel by name: `[gpu] name`.
    Kernel(String),
    /// A GPU kernel by the address of its host stub, named by the stub's symbol, else by the name
    /// the driver gave the function the launch ran.
    KernelStub(UserAddr, Option<String>),
}

/// Stacks with their device label and one value per sample type, ready to be symbolized.
pub type StackValues = Vec<(StackKey, Option<u32>, Vec<i64>)>;

pub struct Stacks {
    symbolizer: Symbolizer,
    python: PythonSymbolizer,
    py_frames: Vec<PyFrame>,
    py_index: HashMap<PyFrame, u32>,
    /// Stacks of hooked calls already seen, by their raw frames: a launch loop repeats a few
    /// stacks millions of times, and naming Python frames costs reads of the process's memory.
    call_stacks: HashMap<(u32, u32, Vec<UserFrame>), StackKey>,
    /// Stacks of off-CPU waits already seen, by process and raw frames but not thread: a
    /// service's threads (often one per request) wait in the same few places thousands of times
    /// a second, and each new one would be normalized and its Python frames read again.
    wait_stacks: HashMap<WaitKey, StackKey>,
}

/// Process, the process whose mappings it was unwound with (a forked child's parent's), how the
/// unwind ended, kernel and user frames.
type WaitKey = (u32, Option<u32>, UnwindStatus, Vec<u64>, Vec<UserFrame>);

impl Default for Stacks {
    fn default() -> Self {
        Self::new()
    }
}

/// Stacks hold the sampled address, then return addresses. A return address points after the
/// call, possibly into the next function or line, so the call instruction is looked up instead.
fn call_sites(frames: &[u64]) -> Vec<u64> {
    frames.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) }).collect()
}

impl Stacks {
    pub fn new() -> Self {
        Stacks {
            symbolizer: Symbolizer::new(),
            python: PythonSymbolizer::new(),
            py_frames: Vec::new(),
            py_index: HashMap::new(),
            call_stacks: HashMap::new(),
            wait_stacks: HashMap::new(),
        }
    }

    /// The stack of a hooked call's caller, taken at its return, remembered by its raw frames.
    pub fn call_stack(&mut self, sample: &Sample, files: Option<&[MappedFile]>, python: Option<&Interpreter>) -> StackKey {
        let key = (sample.pid, sample.tid, sample.user_stack.clone());
        if let Some(s) = self.call_stacks.get(&key) {
            return s.clone();
        }
        let s = self.stack(sample, files, python, true);
        if self.call_stacks.len() >= CALL_STACK_CACHE_LIMIT {
            self.call_stacks.clear();
        }
        self.call_stacks.insert(key, s.clone());
        s
    }

    /// The stack where a thread left the CPU, remembered by its process and raw frames for the
    /// window: another thread of the process waiting at the same place gets the same stack, with
    /// its own tid and name.
    pub fn wait_stack(&mut self, sample: &Sample, files: Option<&[MappedFile]>, python: Option<&Interpreter>) -> StackKey {
        if sample.leaf_file.is_some() {
            return self.stack(sample, files, python, false);
        }
        let key = (sample.pid, sample.forked_from, sample.unwind, sample.kernel_stack.frames().to_vec(), sample.user_stack.clone());
        let mut s = match self.wait_stacks.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = self.stack(sample, files, python, false);
                if self.wait_stacks.len() >= CALL_STACK_CACHE_LIMIT {
                    self.wait_stacks.clear();
                }
                self.wait_stacks.insert(key, s.clone());
                s
            }
        };
        s.tid = sample.tid;
        if s.comm != sample.comm {
            s.comm.clone_from(&sample.comm);
        }
        s
    }

    /// The process runs a new program (the registry says): what named the old one's frames goes.
    pub fn program_changed(&mut self, pid: u32) {
        self.symbolizer.forget_process(pid);
        self.python.forget_process(pid);
        self.call_stacks.retain(|k, _| k.0 != pid);
        self.wait_stacks.retain(|k, _| k.0 != pid);
    }

    /// The stack of a sample. `at_return`: the leaf is a return address too (a stack taken when
    /// a hooked function returned), so its call instruction is what is looked up.
    pub fn stack(&mut self, sample: &Sample, files: Option<&[MappedFile]>, python: Option<&Interpreter>, at_return: bool) -> StackKey {
        // Native addresses go through normalization in one batch; Python frames are named now,
        // while the process and its code objects are alive.
        let native: Vec<u64> = sample
            .user_stack
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f {
                UserFrame::Native(a) if i == 0 && !at_return => Some(*a),
                UserFrame::Native(a) => Some(a.saturating_sub(1)),
                UserFrame::Python { .. } | UserFrame::Gap | UserFrame::CallEnd { .. } => None,
            })
            .collect();
        let normalized = match files {
            _ if native.is_empty() => Vec::new(),
            Some(files) => self.symbolizer.normalize_in(sample.pid, &native, files, || read_for_symbolizer(sample.pid)),
            None => self.symbolizer.normalize(sample.pid, &native, || read_for_symbolizer(sample.pid)),
        };
        let mut normalized = normalized.into_iter();
        let mut user = Vec::with_capacity(sample.user_stack.len());
        // A process gone before its maps were read: its leaf is placed by the file under it.
        let leaf_in_file = sample.leaf_file.and_then(|f| self.symbolizer.in_file(f.dev, f.ino, f.size, f.offset));
        let leaf_addr = match sample.user_stack.first() {
            Some(UserFrame::Native(a)) => Some(*a),
            _ => None,
        };
        for frame in &sample.user_stack {
            match *frame {
                UserFrame::Native(a) => {
                    let placed = normalized.next().unwrap_or(UserAddr::Unmapped { addr: a });
                    let placed = match (placed, leaf_in_file) {
                        (UserAddr::Unmapped { .. }, Some(in_file)) if user.is_empty() => in_file,
                        // Unwound in the leaf's mapping with its file's table, in a process gone
                        // before its maps were read: placed from the leaf.
                        (UserAddr::Unmapped { .. }, Some(_)) if sample.by_file => sample
                            .leaf_file
                            .zip(leaf_addr)
                            .and_then(|(f, leaf)| f.offset_of(leaf, a).map(|o| (f, o.saturating_sub(1))))
                            .and_then(|(f, o)| self.symbolizer.in_file(f.dev, f.ino, f.size, o))
                            .unwrap_or(placed),
                        _ => placed,
                    };
                    user.push(UserKey::Native(placed));
                }
                UserFrame::Gap => user.push(UserKey::Gap(gap_label(sample.unwind))),
                // Where a copied stack could not be finished: the calls' ends say nothing.
                UserFrame::CallEnd { .. } => {}
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
        let mut unwind = sample.unwind;
        // Unwound with its files' tables before its maps were read, and gone before they could
        // be: the frames cannot be named, only the leaf by its file, as if unwinding had stopped
        // there.
        if sample.by_file && user.iter().any(|f| matches!(f, UserKey::Native(UserAddr::Unmapped { .. }))) {
            user.truncate(1);
            unwind = UnwindStatus::NoMapping;
        }
        StackKey {
            pid: sample.pid,
            tid: sample.tid,
            comm: sample.comm.clone(),
            kernel: call_sites(sample.kernel_stack.frames()),
            root: root_marker(unwind, &user),
            user,
            tail: Vec::new(),
            leaf: None,
        }
    }

    /// A native address of a process (a kernel's host stub), normalized for naming later.
    pub fn code_address(&mut self, pid: u32, addr: u64, files: Option<&[MappedFile]>) -> UserAddr {
        let normalized = match files {
            Some(files) => self.symbolizer.normalize_in(pid, &[addr], files, || read_for_symbolizer(pid)),
            None => self.symbolizer.normalize(pid, &[addr], || read_for_symbolizer(pid)),
        };
        normalized.into_iter().next().unwrap_or(UserAddr::Unmapped { addr })
    }

    /// Python frames shown as `[unknown python]`: unreadable, or no longer the code sampled.
    pub fn unknown_python_frames(&self) -> u64 {
        self.python.unknown_frames
    }

    /// Processes that are gone (the registry says): their stacks of this window are keyed
    /// already; what was cached to name their frames goes.
    pub fn forget(&mut self, pids: &[u32]) {
        for pid in pids {
            self.symbolizer.forget_process(*pid);
            self.python.forget_process(*pid);
        }
    }

    /// A process exited: its calls' and waits' stacks are not seen again.
    pub fn process_exited(&mut self, pid: u32) {
        self.call_stacks.retain(|k, _| k.0 != pid);
        self.wait_stacks.retain(|k, _| k.0 != pid);
    }

    /// The window closed: call and wait stacks are remembered for one window at most.
    pub fn window_closed(&mut self) {
        self.call_stacks.clear();
        self.wait_stacks.clear();
        self.symbolizer.trim(SYMBOL_CACHE_LIMIT);
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

}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuflame_bpf::StackRead;

    #[test]
    fn return_addresses_point_at_the_call() {
        assert_eq!(call_sites(&[100, 200, 300]), vec![100, 199, 299]);
        assert!(call_sites(&[]).is_empty());
    }

    fn wait(tid: u32, comm: &str, user: &[u64]) -> Sample {
        Sample {
            timestamp_ns: 1,
            pid: 4_300_001,
            tid,
            cpu: 0,
            comm: comm.into(),
            kernel_stack: StackRead::Frames(vec![0xffff_ffff_8100_0010]),
            user_stack: user.iter().map(|&a| UserFrame::Native(a)).collect(),
            unwind: UnwindStatus::EndOfStack,
            leaf_file: None,
            forked_from: None,
            by_file: false,
            stack_copy: None,
        }
    }

    #[test]
    fn a_wait_stack_seen_before_is_the_same_stack_for_another_thread() {
        let files: &[MappedFile] = &[];
        let mut stacks = Stacks::new();
        let first = stacks.wait_stack(&wait(11, "worker-1", &[0x40_1000, 0x40_2000]), Some(files), None);
        let second = stacks.wait_stack(&wait(12, "worker-2", &[0x40_1000, 0x40_2000]), Some(files), None);
        assert_eq!((second.tid, second.comm.as_str()), (12, "worker-2"));
        assert_eq!(StackKey { tid: 11, comm: "worker-1".into(), ..second.clone() }, first, "the same frames, another thread's");
        assert_eq!(second, stacks.stack(&wait(12, "worker-2", &[0x40_1000, 0x40_2000]), Some(files), None, false), "as if made anew");
        let other = stacks.wait_stack(&wait(12, "worker-2", &[0x40_1000, 0x40_3000]), Some(files), None);
        assert_ne!(other.user, second.user);
    }
}
