//! Forked children before they exec. A child runs its parent's code in a copy of its memory, and
//! a shell's child lives a millisecond or two before it execs a command: gone before its maps
//! could be read, its samples were `[native: unknown code]`. BPF gives it a copy of its parent's
//! entry when it forks (`on_process_fork`) and says so with a `Fork` event; here the child becomes
//! a user of the parent's tables, so that none it may unwind with is evicted, and keeps the
//! parent's files to name its samples by. Its own maps are read, as any process's, once it
//! execs, maps code, or meets code the copy does not have; its samples say which mappings they
//! were unwound with ([`gpuflame_bpf::Sample::forked_from`]).

use gpuflame_bpf::BpfPrograms;
use gpuflame_symbolizer::MappedFile;

use super::ProcessTracker;

impl ProcessTracker {
    /// Process `child` forked from `parent` with a copy of the parent's entry in BPF.
    pub(super) fn forked(&mut self, sampler: &mut BpfPrograms, child: u32, parent: u32) {
        let Some(mapped) = self.processes.get(&parent).and_then(|p| p.mapped.clone()) else {
            // The parent was forgotten before its child was seen (it exited, or its maps could
            // not be read): the copy may name tables that are gone. The child is read instead,
            // when its samples ask.
            sampler.remove_process(child);
            return;
        };
        for key in &mapped.keys {
            if let Some(exe) = self.executables.get_mut(key) {
                exe.users.insert(child);
            }
        }
        // The parent's files as its own child sees them: a parent that has not exec'd since its
        // own fork has its parent's.
        let files = self.files_as_unwound(parent).map(<[MappedFile]>::to_vec).unwrap_or_default();
        let interp = self.processes.get(&parent).and_then(|p| p.python.clone());
        let c = self.live(child);
        c.fork_files = Some(files);
        c.forked_from = Some(parent);
        // A pid used again before its last owner's exit was handled: that one's tables go.
        let old = c.mapped.replace(mapped);
        if interp.is_some() {
            self.set_python(child, interp);
        }
        if let Some(old) = old {
            self.release_unused(sampler, child, &old.keys);
        }
    }

    /// The file mappings a process's stacks are unwound with now: its parent's, copied at fork,
    /// until its own are read.
    fn files_as_unwound(&self, pid: u32) -> Option<&[MappedFile]> {
        let p = self.processes.get(&pid)?;
        match p.forked_from {
            Some(_) => p.fork_files.as_deref(),
            None => p.files.as_deref(),
        }
    }

    /// The file mappings to name a sample's frames by: those it was unwound with (see
    /// [`gpuflame_bpf::Sample::forked_from`]), also for a while after the process exited.
    pub fn files_of_sample(&self, pid: u32, forked_from: Option<u32>) -> Option<&[MappedFile]> {
        match forked_from {
            // The child's copy; the parent's own files if the fork was not seen.
            Some(parent) => self.processes.get(&pid).and_then(|p| p.fork_files.as_deref()).or_else(|| self.files(parent)),
            None => self.files(pid),
        }
    }
}
