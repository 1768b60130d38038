//! Samples that wait for their table: BPF copied the stack where the walk met a file whose table
//! was not loaded yet, or code of a library user space had not read yet (stack_copy.h); they are
//! held here, finished once the table is in, and go
//! on to the profiles then, in the window they are finished in. A sample whose table does not
//! come (the file gone, over the budget) goes on as BPF cut it, after MAX_WAIT or at the end.

mod check;
mod finish;

use std::collections::VecDeque;
use std::fs::File;
use std::time::{Duration, Instant};

use gpuflame_bpf::{BpfPrograms, Sample};

pub use check::UnwinderCheck;
pub(super) use finish::{finish, Code, Outcome};

/// How long a sample waits for its table at most: the biggest (libtorch_cpu, 2.7 M rows) take
/// about a second to build and load on a loaded machine.
const MAX_WAIT: Duration = Duration::from_secs(10);
/// How long a sample waits for code it reached to be in a mapping read from the process: a
/// library just mapped is read within a few hundred milliseconds; past that, the address is in
/// no mapping at all (code gone, or never mapped).
const MAPS_WAIT: Duration = Duration::from_secs(2);
/// How often held samples are tried while tables are being built.
const RETRY: Duration = Duration::from_millis(50);
/// Stack bytes held at most: beyond, a sample goes on as BPF cut it (a machine of many CPUs whose
/// every sample waits: at 19 Hz, 192 CPUs would hold 1.2 GB over MAX_WAIT).
const MAX_HELD_BYTES: u64 = 64 << 20;

/// What the late unwinding did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LateStats {
    /// Samples whose stack was finished from their copy, and those of them whole to their root.
    pub finished: u64,
    pub finished_whole: u64,
    /// Of those, the ones whose stack went on past the copy (marked `[truncated]`).
    pub cut_by_copy: u64,
    /// Samples whose table did not come in time: they went on cut.
    pub gave_up: u64,
    /// Samples not held, MAX_HELD_BYTES being held already: they went on cut.
    pub turned_away: u64,
    /// Samples waiting now, and the bytes of stack they hold.
    pub waiting: u64,
    pub waiting_bytes: u64,
}

struct Held {
    sample: Sample,
    since: Instant,
}

#[derive(Default)]
pub struct LateStacks {
    held: VecDeque<Held>,
    tried: Option<Instant>,
    finished: u64,
    finished_whole: u64,
    cut_by_copy: u64,
    gave_up: u64,
    turned_away: u64,
    held_bytes: u64,
}

/// An address whose file's table a held sample still needs.
pub struct NeedsTable {
    pub pid: u32,
    pub addr: u64,
}

impl LateStacks {
    /// Keeps a sample with a copy to finish; gives back any other.
    pub fn offer(&mut self, mut sample: Sample) -> Option<Sample> {
        let bytes = match &sample.stack_copy {
            Some(copy) if !copy.from_leaf => copy.bytes.len() as u64,
            _ => return Some(sample),
        };
        if self.held_bytes + bytes > MAX_HELD_BYTES {
            self.turned_away += 1;
            sample.stack_copy = None;
            return Some(sample);
        }
        self.held_bytes += bytes;
        self.held.push_back(Held { sample, since: Instant::now() });
        None
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Finishes the held samples whose tables are in (`all`: every one, as far as it can; the
    /// end of a recording). Gives the samples that go on, and the tables still missing.
    pub fn release(&mut self, programs: &BpfPrograms, all: bool) -> (Vec<Sample>, Vec<NeedsTable>) {
        let now = Instant::now();
        if self.held.is_empty() || (!all && self.tried.is_some_and(|t| now.duration_since(t) < RETRY)) {
            return (Vec::new(), Vec::new());
        }
        self.tried = Some(now);
        let (mut out, mut needs, mut keep) = (Vec::new(), Vec::new(), VecDeque::new());
        let mut view_pid = None;
        let mut view = None;
        let mut memory: Option<File> = None;
        let mut python = None;
        for mut h in std::mem::take(&mut self.held) {
            let pid = h.sample.pid;
            if view_pid != Some(pid) {
                view_pid = Some(pid);
                view = programs.unwind_view(pid);
                memory = File::open(format!("/proc/{pid}/mem")).ok();
                python = programs.python_eval(pid);
            }
            let Some(copy) = h.sample.stack_copy.take() else { continue };
            // None: the process is gone (its mappings with it), and its sample goes on as cut.
            let outcome = view.as_mut().map(|v| {
                let mut code = Code { view: v, memory: memory.as_ref() };
                finish(&mut h.sample, &copy, &mut code, python.as_ref(), all || now.duration_since(h.since) >= MAPS_WAIT)
            });
            match outcome {
                Some(Outcome::Waiting { ip }) if !all && now.duration_since(h.since) < MAX_WAIT => {
                    needs.push(NeedsTable { pid, addr: ip });
                    h.sample.stack_copy = Some(copy);
                    keep.push_back(h);
                    continue;
                }
                Some(Outcome::Finished { cut_by_copy }) => {
                    self.finished += 1;
                    self.cut_by_copy += u64::from(cut_by_copy);
                    self.finished_whole += u64::from(h.sample.unwind.is_complete());
                }
                _ => self.gave_up += 1,
            }
            self.held_bytes = self.held_bytes.saturating_sub(copy.bytes.len() as u64);
            out.push(h.sample);
        }
        self.held = keep;
        needs.dedup_by_key(|n| (n.pid, n.addr));
        (out, needs)
    }

    pub fn stats(&self) -> LateStats {
        LateStats {
            finished: self.finished,
            finished_whole: self.finished_whole,
            cut_by_copy: self.cut_by_copy,
            gave_up: self.gave_up,
            turned_away: self.turned_away,
            waiting: self.held.len() as u64,
            waiting_bytes: self.held_bytes,
        }
    }
}
