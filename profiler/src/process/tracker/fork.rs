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
        let copied = (self.processes.get(&parent), self.entries.get(&parent), self.entry_keys.get(&parent));
        let (Some(keys), Some(entries), Some(entry_keys)) = copied else {
            // The parent was forgotten before its child was seen (it exited, or its maps could
            // not be read): the copy may name tables that are gone. The child is read instead,
            // when its samples ask.
            sampler.remove_process(child);
            return;
        };
        let (keys, entries, entry_keys) = (keys.clone(), entries.clone(), entry_keys.clone());
        for key in &keys {
            if let Some(exe) = self.executables.get_mut(key) {
                exe.users.insert(child);
            }
        }
        // The parent's files as its own child sees them: a parent that has not exec'd since its
        // own fork has its parent's.
        let files = self.files_as_unwound(parent).map(<[MappedFile]>::to_vec).unwrap_or_default();
        self.fork_files.insert(child, files);
        if let Some(interp) = self.pythons.get(&parent).cloned() {
            self.pythons.insert(child, interp);
        }
        self.entries.insert(child, entries);
        self.entry_keys.insert(child, entry_keys);
        self.forked.insert(child, parent);
        // A pid used again before its last owner's exit was handled: that one's tables go.
        if let Some(old) = self.processes.insert(child, keys) {
            self.release_unused(sampler, child, &old);
        }
    }

    /// The file mappings a process's stacks are unwound with now: its parent's, copied at fork,
    /// until its own are read.
    fn files_as_unwound(&self, pid: u32) -> Option<&[MappedFile]> {
        match self.forked.contains_key(&pid) {
            true => self.fork_files.get(&pid),
            false => self.files.get(&pid),
        }
        .map(Vec::as_slice)
    }

    /// The file mappings to name a sample's frames by: those it was unwound with (see
    /// [`gpuflame_bpf::Sample::forked_from`]), also for a while after the process exited.
    pub fn files_of_sample(&self, pid: u32, forked_from: Option<u32>) -> Option<&[MappedFile]> {
        match forked_from {
            // The child's copy; the parent's own files if the fork was not seen.
            Some(parent) => self.fork_files.get(&pid).or_else(|| self.files.get(&parent)).map(Vec::as_slice),
            None => self.files(pid),
        }
    }
}
