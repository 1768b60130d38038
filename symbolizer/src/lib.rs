//! Native and kernel symbolization for gpuflame.
//!
//! Two steps, split in time on purpose. [`Symbolizer::normalize`] turns a process's virtual
//! addresses into (module, file offset) while the process is alive: it needs /proc/PID/maps.
//! [`Symbolizer::symbolize_user`] turns those into function, file and line at any later time,
//! from the module files, cached per module (keyed by build-id when the file has one), so that a
//! process that exited during a recording still gets its names.

mod demangle;
mod frames;
mod modules;
mod python;

pub use frames::{Symbol, SymbolLine};
pub use modules::{Module, ModuleId};
pub use python::{NameTag, PyFrame, PythonSymbolizer};

use std::collections::HashMap;

use blazesym::normalize::{self, Normalizer, UserMeta};
use blazesym::symbolize::source::{self as src, Source};
use blazesym::symbolize::{self, Input, Symbolized};
use std::path::Path;

const VDSO: &str = "[vdso]";
use blazesym::Pid;

use modules::ModuleTable;

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
}

pub struct Symbolizer {
    normalizer: Normalizer,
    blaze: symbolize::Symbolizer,
    modules: ModuleTable,
    /// Per process, addresses already normalized: hot loops hit this, not /proc.
    normalized: HashMap<u32, HashMap<u64, UserAddr>>,
    user_cache: HashMap<(ModuleId, u64), Symbol>,
    kernel_cache: HashMap<u64, Symbol>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Symbolizer {
            normalizer: Normalizer::builder().enable_build_ids(true).enable_build_id_caching(true).build(),
            blaze: Self::new_blazesym(),
            modules: ModuleTable::default(),
            normalized: HashMap::new(),
            user_cache: HashMap::new(),
            kernel_cache: HashMap::new(),
        }
    }

    /// Normalizes addresses of process `pid`. Must run while the process is alive; addresses that
    /// cannot be placed (the process is gone, anonymous memory) come back as
    /// [`UserAddr::Unmapped`], never as an error.
    pub fn normalize(&mut self, pid: u32, addrs: &[u64]) -> Vec<UserAddr> {
        let known = self.normalized.entry(pid).or_default();
        let mut missing: Vec<u64> = addrs.iter().copied().filter(|a| !known.contains_key(a)).collect();
        if !missing.is_empty() {
            missing.sort_unstable();
            missing.dedup();
            let opts = normalize::NormalizeOpts { sorted_addrs: true, ..Default::default() };
            match self.normalizer.normalize_user_addrs_opts(Pid::from(pid), &missing, &opts) {
                Ok(out) => {
                    for (&addr, &(offset, meta)) in missing.iter().zip(out.outputs.iter()) {
                        let resolved = match out.meta.get(meta) {
                            Some(UserMeta::Elf(elf)) => UserAddr::InModule {
                                module: self.modules.intern(&elf.path, elf.build_id.as_deref()),
                                file_offset: offset,
                            },
                            // The vDSO exists only in memory: blazesym names its code right away.
                            Some(UserMeta::Sym(sym)) => {
                                let module = self.modules.intern(Path::new(VDSO), None);
                                let symbol = frames::symbol_from(Symbolized::Sym(sym.clone()));
                                self.user_cache.insert((module, offset), symbol);
                                UserAddr::InModule { module, file_offset: offset }
                            }
                            _ => UserAddr::Unmapped { addr },
                        };
                        known.insert(addr, resolved);
                    }
                }
                Err(e) => {
                    tracing::debug!(pid, error = %e, "normalizing addresses failed (process gone?)");
                    // Not remembered: a later sample may still find the process readable.
                    return addrs
                        .iter()
                        .map(|&a| known.get(&a).copied().unwrap_or(UserAddr::Unmapped { addr: a }))
                        .collect();
                }
            }
        }
        addrs.iter().map(|a| known[a]).collect()
    }

    /// Normalizes with mappings recorded earlier (sorted by start), so that a process that has
    /// exited since is still placed; addresses outside them go through [`Symbolizer::normalize`].
    pub fn normalize_in(&mut self, pid: u32, addrs: &[u64], mappings: &[MappedFile]) -> Vec<UserAddr> {
        let mut out: Vec<Option<UserAddr>> = Vec::with_capacity(addrs.len());
        let mut rest = Vec::new();
        for &addr in addrs {
            let i = mappings.partition_point(|m| m.start <= addr);
            match i.checked_sub(1).map(|i| &mappings[i]).filter(|m| addr < m.end) {
                Some(m) => {
                    let module = self.modules.intern(&m.path, m.build_id.as_deref());
                    out.push(Some(UserAddr::InModule { module, file_offset: addr - m.start + m.offset }));
                }
                None => {
                    out.push(None);
                    rest.push(addr);
                }
            }
        }
        let mut fallback = if rest.is_empty() { Vec::new() } else { self.normalize(pid, &rest) }.into_iter();
        out.into_iter().map(|a| a.or_else(|| fallback.next()).unwrap_or(UserAddr::Unmapped { addr: 0 })).collect()
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
            self.blaze = Self::new_blazesym();
        }
    }

    fn new_blazesym() -> symbolize::Symbolizer {
        symbolize::Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(false).build()
    }

    pub fn module(&self, id: ModuleId) -> &Module {
        self.modules.get(id)
    }

    /// Symbolizes normalized user addresses; the result has one [`Symbol`] per address.
    pub fn symbolize_user(&mut self, addrs: &[UserAddr]) -> Vec<Symbol> {
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
            let m = self.modules.get(module);
            let paths: Vec<_> = std::iter::once(m.path.clone()).chain(m.other_paths.iter().cloned()).collect();
            let mut symbols = vec![Symbol::unknown(); offsets.len()];
            for path in paths {
                let pending: Vec<usize> = (0..offsets.len()).filter(|&i| symbols[i].is_unknown()).collect();
                if pending.is_empty() {
                    break;
                }
                let wanted: Vec<u64> = pending.iter().map(|&i| offsets[i]).collect();
                let source = Source::Elf(src::Elf::new(&path));
                match self.blaze.symbolize(&source, Input::FileOffset(&wanted)) {
                    Ok(results) => {
                        for (&i, r) in pending.iter().zip(results) {
                            symbols[i] = frames::symbol_from(r);
                        }
                    }
                    Err(e) => tracing::debug!(module = %path.display(), error = %e, "cannot symbolize with this file"),
                }
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

