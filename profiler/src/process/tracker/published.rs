//! Loaded tables published to BPF by the identity of their files, beside the mappings of each
//! process: code that BPF finds no mapping for (a program in its first milliseconds after exec,
//! a library ld.so has just mapped, before the maps are read) is unwound with its file's table,
//! if that file is known already. Every inode known to hold the file is published; a table is
//! taken back before it is evicted.

use gpuflame_bpf::BpfPrograms;
use gpuflame_elfread::FileId;
use gpuflame_unwind::ExecutableKey;

use super::{ProcessTracker, TableState};

impl ProcessTracker {
    /// Publishes the table of `key`, now loaded, under every inode that holds its file.
    pub(super) fn publish(&self, sampler: &BpfPrograms, key: &ExecutableKey) {
        for (file, k) in &self.keys_by_inode {
            if k == key {
                self.publish_inode(sampler, file, key);
            }
        }
    }

    /// Publishes the table of `key` under `file`, if it is loaded.
    pub(super) fn publish_inode(&self, sampler: &BpfPrograms, file: &FileId, key: &ExecutableKey) {
        let Some(exe) = self.executables.get(key) else { return };
        let TableState::Loaded(id) = exe.state else { return };
        if let Err(e) = sampler.publish_file_table(file.dev, file.ino, file.size, id, &exe.segments) {
            tracing::debug!(file = %exe.name, error = %e, "cannot publish an unwind table by its file");
        }
    }

    /// Takes back what [`Self::publish`] published for `key`: before its table goes.
    pub(super) fn unpublish(&self, sampler: &BpfPrograms, key: &ExecutableKey) {
        for (file, k) in &self.keys_by_inode {
            if k == key {
                sampler.unpublish_file_table(file.dev, file.ino, file.size);
            }
        }
    }

    /// Publishes the inodes found since the last call for tables already loaded.
    pub(super) fn publish_new_inodes(&mut self, sampler: &BpfPrograms) {
        for file in std::mem::take(&mut self.new_inodes) {
            if let Some(key) = self.keys_by_inode.get(&file) {
                self.publish_inode(sampler, &file, key);
            }
        }
    }
}
