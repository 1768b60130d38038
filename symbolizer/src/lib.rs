//! Native and kernel symbolization for gpuflame.
//!
//! Two steps, split in time on purpose. [`Symbolizer::normalize`] turns a process's virtual
//! addresses into (module, file offset) while the process is alive: it needs /proc/PID/maps, and
//! opens each module's file there, through /proc/PID/map_files. [`Symbolizer::symbolize_user`]
//! turns those into function, file and line at any later time, from the files opened then,
//! cached per module (keyed by build-id when the file has one, else by the file's identity), so
//! that a process that exited during a recording, a deleted file, and a file of another mount
//! namespace all get the names of the file that was actually mapped, never of a file that
//! happens to have its path here.

mod config;
mod copy;
mod debuginfo;
mod debuginfod;
mod demangle;
mod files;
mod frames;
mod modules;
mod normalize_addrs;
mod procmaps;
mod symtab;

pub use config::{configure, DebugConfig};
pub use demangle::demangle;
pub use files::{FileError, ModuleFile};
pub use frames::{Symbol, SymbolLine};
pub use modules::{Module, ModuleId};
pub use procmaps::ProcessMapping;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use blazesym::normalize::Normalizer;
use blazesym::symbolize::source::{self as src, Source};
use blazesym::symbolize::{self, Input};
use gpuflame_elfread::{max_open_files, FileId};

use copy::PrivateCopy;
use symtab::SymbolIndex;
use debuginfo::Extras;
use modules::ModuleTable;

const VDSO: &str = "[vdso]";

/// Private copies kept at once, in bytes: past this, the copies and blazesym's state are dropped
/// before more are made (twice [`copy::MAX_COPY`]).
const COPIES_BUDGET: u64 = 2 << 30;

/// A user-space address after normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UserAddr {
    /// Inside a file-backed mapping: symbolizable later without the process.
    InModule { module: ModuleId, file_offset: u64 },
    /// Anonymous memory (JIT code), a mapping that was gone, or an unreadable process.
    Unmapped { addr: u64 },
}

/// An executable file mapping of a process, as a process tracker saw it while the process lived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    /// File offset mapped at `start`.
    pub offset: u64,
    pub path: std::path::PathBuf,
    pub build_id: Option<Vec<u8>>,
    /// The mapped file, opened while the process lived (None when it could not be): what the
    /// module is symbolized from.
    pub file: Option<Arc<ModuleFile>>,
}

pub struct Symbolizer {
    normalizer: Normalizer,
    blaze: symbolize::Symbolizer,
    modules: ModuleTable,
    /// Per process, addresses already normalized: hot loops hit this, not /proc.
    normalized: HashMap<u32, HashMap<u64, UserAddr>>,
    user_cache: HashMap<(ModuleId, u64), Symbol>,
    kernel_cache: HashMap<u64, Symbol>,
    /// Private copies of module files, per file; None when the copy failed (not retried).
    copies: HashMap<FileId, Option<PrivateCopy>>,
    /// Function indexes of module files without DWARF, per file; None for a file blazesym reads
    /// from a private copy instead (it has DWARF, or could not be indexed).
    indexes: HashMap<FileId, Option<SymbolIndex>>,
    copied_bytes: u64,
    /// Per module file, what it lacks and where that is (None: nothing to add).
    extras: HashMap<FileId, Option<Extras>>,
    /// Decompressed MiniDebugInfo, per module file; None when there was none to be had.
    minis: HashMap<FileId, Option<PrivateCopy>>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Symbolizer {
            // Only the vDSO goes through blazesym's normalizer: without build-ids it opens no
            // file (it would open the path text, which may be a FIFO or another file).
            normalizer: Normalizer::builder().enable_build_ids(false).build(),
            blaze: Self::new_blazesym(),
            modules: ModuleTable::new(max_open_files() / 2),
            normalized: HashMap::new(),
            user_cache: HashMap::new(),
            kernel_cache: HashMap::new(),
            copies: HashMap::new(),
            indexes: HashMap::new(),
            copied_bytes: 0,
            extras: HashMap::new(),
            minis: HashMap::new(),
        }
    }

    /// Forgets what was normalized for `pid` (it exited or exec'd another program).
    pub fn forget_process(&mut self, pid: u32) {
        self.normalized.remove(&pid);
    }

    /// Drops the symbol caches (and blazesym's parsed files) once they hold more than `limit`
    /// entries, so that a long-running agent on a busy machine stays bounded. Normalized
    /// addresses and modules stay valid.
    pub fn trim(&mut self, limit: usize) {
        if self.user_cache.len() + self.kernel_cache.len() > limit {
            tracing::debug!(entries = self.user_cache.len() + self.kernel_cache.len(), "trimming the symbol caches");
            self.user_cache.clear();
            self.kernel_cache.clear();
            self.drop_copies();
        }
    }

    /// Drops the private copies and blazesym, which maps them.
    fn drop_copies(&mut self) {
        self.blaze = Self::new_blazesym();
        self.copies.clear();
        self.indexes.clear();
        self.minis.clear();
        self.copied_bytes = 0;
    }

    /// The private copy of a module file, made on first use.
    /// The function index of a module file, built on first use; None when blazesym is to read it.
    fn index_of(&mut self, file: &ModuleFile) -> Option<&SymbolIndex> {
        if !self.indexes.contains_key(&file.id()) {
            // Indexes hold no descriptor: only the bytes count against them.
            if self.copied_bytes > COPIES_BUDGET {
                tracing::debug!(bytes = self.copied_bytes, "dropping the private copies and indexes");
                self.drop_copies();
            }
            let index = match SymbolIndex::build(file) {
                Ok(index) => index,
                Err(e) => {
                    tracing::debug!(file = ?file.id(), error = %e, "cannot index a module's symbols");
                    None
                }
            };
            self.copied_bytes += index.as_ref().map_or(0, SymbolIndex::bytes);
            self.indexes.insert(file.id(), index);
        }
        self.indexes.get(&file.id()).and_then(Option::as_ref)
    }

    fn copy_of(&mut self, file: &ModuleFile) -> Option<&PrivateCopy> {
        if !self.copies.contains_key(&file.id()) {
            if self.copied_bytes > COPIES_BUDGET || self.copies.len() >= max_open_files() {
                tracing::debug!(bytes = self.copied_bytes, copies = self.copies.len(), "dropping the private copies");
                self.drop_copies();
            }
            let copy = match PrivateCopy::make(file) {
                Ok(c) => {
                    self.copied_bytes += c.bytes;
                    Some(c)
                }
                Err(e) => {
                    tracing::debug!(file = ?file.id(), error = %e, "cannot copy a module's symbols");
                    None
                }
            };
            self.copies.insert(file.id(), copy);
        }
        self.copies.get(&file.id()).and_then(Option::as_ref)
    }

    fn new_blazesym() -> symbolize::Symbolizer {
        // The debug directories serve the dwz files (.gnu_debugaltlink) of separate debug files.
        symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .set_debug_dirs(Some(&config::config().debug_dirs))
            .build()
    }

    pub fn module(&self, id: ModuleId) -> &Module {
        self.modules.get(id)
    }

    /// Symbolizes normalized user addresses; the result has one [`Symbol`] per address.
    pub fn symbolize_user(&mut self, addrs: &[UserAddr]) -> Vec<Symbol> {
        // Downloads still running are waited for until one deadline, shared by all modules.
        let mut wait_until: Option<Instant> = None;
        let mut by_module: HashMap<ModuleId, Vec<u64>> = HashMap::new();
        for addr in addrs {
            if let UserAddr::InModule { module, file_offset } = *addr {
                if !self.user_cache.contains_key(&(module, file_offset)) {
                    by_module.entry(module).or_default().push(file_offset);
                }
            }
        }
        for (module, mut offsets) in by_module {
            offsets.sort_unstable();
            offsets.dedup();
            // Never the path: in another mount namespace it names another file, or a FIFO.
            let files = self.modules.files(module).to_vec();
            if files.is_empty() {
                tracing::debug!(module = %self.modules.get(module).path.display(), "no open file to symbolize with");
            }
            let mut symbols = vec![Symbol::unknown(); offsets.len()];
            let mut awaited = false;
            for file in files {
                if symbols.iter().all(|s| !s.is_unknown()) {
                    break;
                }
                Self::examine(&mut self.extras, &file, &self.modules.get(module).path.clone());
                if let Some(Some(extras)) = self.extras.get_mut(&file.id()) {
                    if extras.pending.is_some() {
                        extras.settle(Some(*wait_until.get_or_insert_with(|| Instant::now() + config::config().wait)));
                        awaited |= extras.pending.is_some();
                    }
                }
                // The separate debug file first (all names, and lines), then the module's own
                // tables, then its MiniDebugInfo (the names the dynamic symbols lack).
                let separate = self.extras.get(&file.id()).and_then(Option::as_ref).and_then(|e| e.separate.clone());
                if let Some(debug) = separate {
                    if let Some(copy) = self.copy_of(&debug) {
                        let (path, dwarf) = (copy.path(), copy.dwarf);
                        self.name_virt(module, &file, path, dwarf, &offsets, &mut symbols);
                    }
                }
                let pending: Vec<usize> = (0..offsets.len()).filter(|&i| symbols[i].is_unknown()).collect();
                let wanted: Vec<u64> = pending.iter().map(|&i| offsets[i]).collect();
                if let Some(index) = self.index_of(&file) {
                    for (&i, &offset) in pending.iter().zip(&wanted) {
                        if let Some(name) = index.name_at(&file, offset) {
                            symbols[i] = Symbol::function(name);
                        }
                    }
                } else if let Some(copy) = self.copy_of(&file) {
                    let mut elf = src::Elf::new(copy.path());
                    elf.debug_syms = copy.dwarf;
                    match self.blaze.symbolize(&Source::Elf(elf), Input::FileOffset(&wanted)) {
                        Ok(results) => {
                            for (&i, r) in pending.iter().zip(results) {
                                symbols[i] = frames::symbol_from(r);
                            }
                        }
                        Err(e) => tracing::debug!(module = %self.modules.get(module).path.display(), error = %e, "cannot symbolize with this file"),
                    }
                }
                if symbols.iter().any(Symbol::is_unknown) {
                    if let Some(path) = self.mini_of(&file) {
                        self.name_virt(module, &file, path, false, &offsets, &mut symbols);
                    }
                }
            }
            if awaited {
                // Named later, if the download comes: the unknowns are not remembered.
                for (offset, symbol) in offsets.into_iter().zip(symbols).filter(|(_, s)| !s.is_unknown()) {
                    self.user_cache.insert((module, offset), symbol);
                }
                continue;
            }
            for (offset, symbol) in offsets.into_iter().zip(symbols) {
                self.user_cache.insert((module, offset), symbol);
            }
        }
        addrs
            .iter()
            .map(|addr| match *addr {
                UserAddr::InModule { module, file_offset } => {
                    self.user_cache.get(&(module, file_offset)).cloned().unwrap_or_else(Symbol::unknown)
                }
                UserAddr::Unmapped { .. } => Symbol::unknown(),
            })
            .collect()
    }

    /// Names the unknowns among `offsets` (file offsets of the module file `file`) with a debug
    /// file at `path`, which names addresses.
    fn name_virt(&mut self, module: ModuleId, file: &ModuleFile, path: std::path::PathBuf, dwarf: bool, offsets: &[u64], symbols: &mut [Symbol]) {
        let Some(Some(extras)) = self.extras.get(&file.id()) else { return };
        let (pending, wanted): (Vec<usize>, Vec<u64>) =
            (0..offsets.len()).filter(|&i| symbols[i].is_unknown()).filter_map(|i| Some((i, extras.virt_offset(offsets[i])?))).unzip();
        if wanted.is_empty() {
            return;
        }
        let mut elf = src::Elf::new(path);
        elf.debug_syms = dwarf;
        match self.blaze.symbolize(&Source::Elf(elf), Input::VirtOffset(&wanted)) {
            Ok(results) => {
                for (&i, r) in pending.iter().zip(results) {
                    symbols[i] = frames::symbol_from(r);
                }
            }
            Err(e) => tracing::debug!(module = %self.modules.get(module).path.display(), error = %e, "cannot symbolize with a debug file"),
        }
    }

    /// The decompressed MiniDebugInfo of a module file, made on first use.
    fn mini_of(&mut self, file: &ModuleFile) -> Option<std::path::PathBuf> {
        if !self.minis.contains_key(&file.id()) {
            let extras = self.extras.get(&file.id()).and_then(Option::as_ref);
            let copy = extras.and_then(|e| e.decompress_mini(file)).and_then(|data| match PrivateCopy::from_bytes(&data) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot keep a MiniDebugInfo");
                    None
                }
            });
            self.minis.insert(file.id(), copy);
        }
        self.minis.get(&file.id()).and_then(Option::as_ref).map(PrivateCopy::path)
    }

    /// Symbolizes kernel addresses with kallsyms.
    pub fn symbolize_kernel(&mut self, addrs: &[u64]) -> Vec<Symbol> {
        let mut missing: Vec<u64> = addrs.iter().copied().filter(|a| !self.kernel_cache.contains_key(a)).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let source = Source::Kernel(src::Kernel::default());
            let symbols: Vec<Symbol> = match self.blaze.symbolize(&source, Input::AbsAddr(&missing)) {
                Ok(results) => results.into_iter().map(frames::symbol_from).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot symbolize kernel addresses");
                    vec![Symbol::unknown(); missing.len()]
                }
            };
            self.kernel_cache.extend(missing.into_iter().zip(symbols));
        }
        addrs.iter().map(|a| self.kernel_cache.get(a).cloned().unwrap_or_else(Symbol::unknown)).collect()
    }
}


#[cfg(test)]
mod tests;
