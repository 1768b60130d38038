//! The first of the two steps: a process's addresses to (module, file offset), while it lives.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use blazesym::normalize::{self, UserMeta};
use blazesym::symbolize::Symbolized;
use blazesym::Pid;
use gpuflame_elfread::FileId;

use crate::debuginfo::Extras;
use crate::{frames, MappedFile, ModuleFile, ProcessMapping, Symbolizer, UserAddr, VDSO};

impl Symbolizer {
    /// Normalizes addresses of process `pid` with its mappings as `read_maps` gives them now (None:
    /// they cannot be read). Must run while the process is alive; addresses that cannot be placed
    /// (the process is gone, anonymous memory) come back as [`UserAddr::Unmapped`], never as an
    /// error. The maps are read only when an address is new.
    pub fn normalize(&mut self, pid: u32, addrs: &[u64], read_maps: impl FnOnce() -> Option<Vec<ProcessMapping>>) -> Vec<UserAddr> {
        let known = self.normalized.entry(pid).or_default();
        let mut missing: Vec<u64> = addrs.iter().copied().filter(|a| !known.contains_key(a)).collect();
        if !missing.is_empty() {
            missing.sort_unstable();
            missing.dedup();
            match read_maps().map(|maps| self.place(pid, &missing, maps)) {
                Some(placed) => {
                    let known = self.normalized.entry(pid).or_default();
                    known.extend(missing.iter().copied().zip(placed));
                }
                None => {
                    tracing::debug!(pid, "cannot read the process's mappings (process gone?)");
                    // Not remembered: a later sample may still find the process readable.
                    let known = self.normalized.entry(pid).or_default();
                    return addrs
                        .iter()
                        .map(|&a| known.get(&a).copied().unwrap_or(UserAddr::Unmapped { addr: a }))
                        .collect();
                }
            }
        }
        let known = self.normalized.entry(pid).or_default();
        addrs.iter().map(|a| known.get(a).copied().unwrap_or(UserAddr::Unmapped { addr: *a })).collect()
    }

    /// Places sorted addresses with the process's maps read now, opening the mapped files through
    /// /proc/PID/map_files; the vDSO's code is named right away.
    fn place(&mut self, pid: u32, sorted: &[u64], mut maps: Vec<ProcessMapping>) -> Vec<UserAddr> {
        maps.sort_by_key(|m| m.start);
        let mut opened: HashMap<u64, Option<Arc<ModuleFile>>> = HashMap::new();
        let mut out = Vec::with_capacity(sorted.len());
        let mut vdso = Vec::new();
        for (i, &addr) in sorted.iter().enumerate() {
            let at = maps.partition_point(|m| m.start <= addr);
            let Some(m) = at.checked_sub(1).map(|j| &maps[j]).filter(|m| addr < m.end) else {
                out.push(UserAddr::Unmapped { addr });
                continue;
            };
            if m.path == VDSO {
                vdso.push((i, addr));
                out.push(UserAddr::Unmapped { addr });
            } else if m.inode != 0 && m.path.starts_with('/') {
                let file = opened.entry(m.start).or_insert_with(|| match ModuleFile::open_mapping(pid, m.start, m.end) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        tracing::debug!(pid, path = %m.path, error = %e, "cannot open a mapped file");
                        None
                    }
                });
                let path = Path::new(m.path.strip_suffix(" (deleted)").unwrap_or(&m.path));
                if let Some(f) = file.as_ref() {
                    Self::examine(&mut self.extras, f, path);
                }
                let module = self.modules.intern(path, None, file.as_ref());
                out.push(UserAddr::InModule { module, file_offset: addr - m.start + m.offset });
            } else {
                out.push(UserAddr::Unmapped { addr });
            }
        }
        if !vdso.is_empty() {
            let addrs: Vec<u64> = vdso.iter().map(|&(_, a)| a).collect();
            let opts = normalize::NormalizeOpts { sorted_addrs: true, ..Default::default() };
            match self.normalizer.normalize_user_addrs_opts(Pid::from(pid), &addrs, &opts) {
                Ok(n) => {
                    for (&(i, _), &(offset, meta)) in vdso.iter().zip(n.outputs.iter()) {
                        // The vDSO exists only in memory: blazesym names its code right away.
                        if let Some(UserMeta::Sym(sym)) = n.meta.get(meta) {
                            let module = self.modules.intern(Path::new(VDSO), None, None);
                            self.user_cache.insert((module, offset), frames::symbol_from(Symbolized::Sym(sym.clone())));
                            out[i] = UserAddr::InModule { module, file_offset: offset };
                        }
                    }
                }
                Err(e) => tracing::debug!(pid, error = %e, "cannot place vDSO addresses"),
            }
        }
        out
    }

    /// Normalizes with mappings recorded earlier (sorted by start), so that a process that has
    /// exited since is still placed; addresses outside them go through [`Symbolizer::normalize`].
    pub fn normalize_in(&mut self, pid: u32, addrs: &[u64], mappings: &[MappedFile], read_maps: impl FnOnce() -> Option<Vec<ProcessMapping>>) -> Vec<UserAddr> {
        let mut out: Vec<Option<UserAddr>> = Vec::with_capacity(addrs.len());
        let mut rest = Vec::new();
        for &addr in addrs {
            let i = mappings.partition_point(|m| m.start <= addr);
            match i.checked_sub(1).map(|i| &mappings[i]).filter(|m| addr < m.end) {
                Some(m) => {
                    if let Some(f) = m.file.as_ref() {
                        Self::examine(&mut self.extras, f, &m.path);
                    }
                    let module = self.modules.intern(&m.path, m.build_id.as_deref(), m.file.as_ref());
                    out.push(Some(UserAddr::InModule { module, file_offset: addr - m.start + m.offset }));
                }
                None => {
                    out.push(None);
                    rest.push(addr);
                }
            }
        }
        let mut fallback = if rest.is_empty() { Vec::new() } else { self.normalize(pid, &rest, read_maps) }.into_iter();
        out.into_iter().map(|a| a.or_else(|| fallback.next()).unwrap_or(UserAddr::Unmapped { addr: 0 })).collect()
    }

    /// An address known only by its file's identity (device, inode and size as `stat` gives
    /// them) and offset: placed in the module of that file when one was seen mapped before.
    pub fn in_file(&self, dev: u64, ino: u64, size: u64, file_offset: u64) -> Option<UserAddr> {
        self.modules.by_inode(dev, ino, size).map(|module| UserAddr::InModule { module, file_offset })
    }

    /// Looks at a module file when it is first sampled: a debuginfod download it may need starts
    /// now, to be done by the time names are wanted.
    pub(crate) fn examine(extras: &mut HashMap<FileId, Option<Extras>>, file: &Arc<ModuleFile>, path: &Path) {
        extras.entry(file.id()).or_insert_with(|| Extras::examine(file, path));
    }
}
