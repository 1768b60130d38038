//! The BPF unwinder's oracle (`record --check-unwinder`, for tests): every CPU sample comes with
//! a copy of its stack from the leaf, which is unwound here with the same tables, and the two
//! walks are compared frame for frame.

use std::fs::File;

use gpuflame_bpf::{BpfPrograms, Sample, UnwindStatus, UserFrame};
use gpuflame_unwind::{walk_copied, WalkEnd};

use super::finish::{status_of, Code, MAX_NATIVE_FRAMES};

#[derive(Debug, Default)]
pub struct UnwinderCheck {
    /// Stacks compared, and those that agreed frame for frame.
    pub compared: u64,
    pub identical: u64,
    /// Stacks the copy was too short to compare to their end: compared as far as it goes.
    pub cut_by_copy: u64,
    /// Stacks BPF walked with other state than the maps hold when they are read here.
    pub skipped: u64,
    /// The first differences, as text.
    pub differences: Vec<String>,
    /// Bytes from the leaf's sp to the outermost frame's, of stacks walked to their end: what a
    /// copy needs to hold.
    pub depths: Vec<u64>,
}

impl UnwinderCheck {
    /// What the check found, as the lines `record` prints.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "unwinder check: {} stacks, {} identical frame for frame ({} as far as the copy went), {} differ, {} not compared (walked before the maps or a table were in, or before an exec)",
            self.compared,
            self.identical,
            self.cut_by_copy,
            self.compared - self.identical,
            self.skipped
        )];
        let mut d = self.depths.clone();
        d.sort_unstable();
        let at = |q: f64| d.get(((d.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
        lines.push(format!("unwinder check: stack depth from the leaf, bytes: median {}, p99 {}, max {}", at(0.5), at(0.99), at(1.0)));
        lines.extend(self.differences.iter().map(|d| format!("unwinder check: differs: {d}")));
        lines
    }

    /// Compares the BPF walk of `sample` with the user-space walk of its copy from the leaf.
    pub fn check(&mut self, programs: &BpfPrograms, sample: &Sample) {
        let Some(copy) = sample.stack_copy.as_ref().filter(|c| c.from_leaf) else { return };
        // Walks BPF made with other state than the maps hold now are not compared: before the
        // process's maps or a table were in (by its files' tables, cut where one was missing, at
        // code not known yet), or before an exec.
        let now_comm = std::fs::read(format!("/proc/{}/comm", sample.pid)).ok();
        let same_program = now_comm.is_some_and(|c| c.strip_suffix(b"\n").unwrap_or(&c) == sample.comm.as_bytes());
        if !sample.unwind.has_user_stack() || sample.by_file || matches!(sample.unwind, UnwindStatus::NoProcess | UnwindStatus::NoTableYet | UnwindStatus::NoMapping) || !same_program {
            self.skipped += 1;
            return;
        }
        let Some(mut view) = programs.unwind_view(sample.pid) else { return };
        let memory = File::open(format!("/proc/{}/mem", sample.pid)).ok();
        let mut code = Code { view: &mut view, memory: memory.as_ref() };
        let walk = walk_copied(&copy.copied(), &mut code, MAX_NATIVE_FRAMES);
        let bpf: Vec<u64> = sample.user_stack.iter().filter_map(|f| if let UserFrame::Native(a) = f { Some(*a) } else { None }).collect();
        let ours: Vec<u64> = walk.frames.iter().map(|f| f.ip).collect();
        self.compared += 1;
        if let (WalkEnd::EndOfStack | WalkEnd::ZeroReturnAddress, Some(last)) = (walk.end, walk.frames.last()) {
            self.depths.push(last.sp.saturating_sub(copy.start.sp));
        }
        // Where the copy ends before the stack does, the walks agree as far as it goes.
        let cut = walk.end == WalkEnd::ReadFault && copy.is_full() && ours.len() <= bpf.len();
        let same = if cut { bpf.starts_with(&ours) } else { bpf == ours && sample.unwind == status_of(&walk, copy) };
        if cut {
            self.cut_by_copy += 1;
        }
        if same {
            self.identical += 1;
        } else if self.differences.len() < 10 {
            self.differences.push(format!(
                "pid {} ({}): BPF {:?} {:x?}, user space {:?} {:x?} (copy of {} bytes from sp {:#x})",
                sample.pid, sample.comm, sample.unwind, bpf, walk.end, ours, copy.bytes.len(), copy.start.sp
            ));
        }
    }
}
