//! Debug information kept apart from a stripped module: a separate debug file (by build-id in
//! the debug directories, or by the module's `.gnu_debuglink`), the MiniDebugInfo in its
//! `.gnu_debugdata`, or a file a debuginfod server has. Each module file is examined once, when
//! it is first sampled; what it lacks is looked up then, so that a debuginfod download runs while
//! the recording does, not after it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuflame_elfread::{consts, ElfFile, Section, Segment};

use crate::config::config;
use crate::copy::{safe_link_name, until_nul, MAX_COPY};
use crate::debuginfod;
use crate::files::ModuleFile;

/// The most MiniDebugInfo read compressed, and decompressed (its ELF holds a symbol table only;
/// libxul's, among the largest, is 2 MiB compressed).
const MAX_MINI_COMPRESSED: u64 = 64 << 20;
const MAX_MINI: u64 = 256 << 20;

/// What a module file lacks and where it can be had.
pub(crate) struct Extras {
    /// PT_LOAD segments: debug files name addresses, not the module's file offsets.
    segments: Vec<Segment>,
    /// A separate debug file of this very build (build-id or debug-link CRC checked).
    pub(crate) separate: Option<Arc<ModuleFile>>,
    /// `.gnu_debugdata`, decompressed on first use.
    pub(crate) mini: Option<Section>,
    /// Asked of debuginfod, not come yet: the build-id in hex.
    pub(crate) pending: Option<String>,
    build_id: Option<Vec<u8>>,
}

impl Extras {
    /// Examines a module file: None when it has its own symbol table and DWARF.
    pub(crate) fn examine(file: &ModuleFile, path: &Path) -> Option<Extras> {
        let elf = ElfFile::parse(file.file()).ok()?;
        let has_symtab = elf.sections().iter().any(|s| s.kind == consts::SHT_SYMTAB);
        let has_dwarf = elf.section(".debug_info").is_some_and(|s| s.kind != consts::SHT_NOBITS);
        if has_symtab && has_dwarf {
            return None;
        }
        let build_id = file.build_id().map(<[u8]>::to_vec);
        let link = elf.section(".gnu_debuglink").and_then(|s| elf.section_data(s, 4096).ok()).and_then(|d| parse_debuglink(&d));
        let config = config();
        let separate = find_local(&config.debug_dirs, path, build_id.as_deref(), link.as_ref());
        let mini = elf.section(".gnu_debugdata").filter(|s| s.kind != consts::SHT_NOBITS).cloned();
        let pending = match (&separate, &build_id) {
            // Names missing, not only lines: worth a download.
            (None, Some(id)) if !has_symtab => debuginfod::request(&hex(id)),
            _ => None,
        };
        if separate.is_none() && mini.is_none() && pending.is_none() {
            return None;
        }
        Some(Extras { segments: elf.load_segments().copied().collect(), separate, mini, pending, build_id })
    }

    /// The address a file offset of the module is loaded at, as debug files name it.
    pub(crate) fn virt_offset(&self, file_offset: u64) -> Option<u64> {
        let seg = self.segments.iter().find(|s| s.offset <= file_offset && file_offset - s.offset < s.file_size)?;
        Some(file_offset - seg.offset + seg.vaddr)
    }

    /// Takes what debuginfod has fetched by now (None: nothing yet, or nothing at all).
    pub(crate) fn settle(&mut self, waited: Option<std::time::Instant>) {
        let Some(id) = self.pending.clone() else { return };
        match debuginfod::result(&id, waited) {
            debuginfod::Outcome::Pending => {}
            debuginfod::Outcome::Missing => self.pending = None,
            debuginfod::Outcome::Found(path) => {
                self.pending = None;
                self.separate = open_matching(&path, self.build_id.as_deref(), None);
                if self.separate.is_none() {
                    tracing::warn!(path = %path.display(), "debuginfod's file does not match the build-id asked for");
                }
            }
        }
    }

    /// Decompresses the MiniDebugInfo (an xz-compressed ELF with a symbol table), bounded.
    pub(crate) fn decompress_mini(&self, file: &ModuleFile) -> Option<Vec<u8>> {
        let section = self.mini.as_ref()?;
        let elf = ElfFile::parse(file.file()).ok()?;
        let compressed = elf.section_data(section, MAX_MINI_COMPRESSED).ok()?;
        let mut out = Vec::new();
        let read = xz2::read::XzDecoder::new(&compressed[..]).take(MAX_MINI + 1).read_to_end(&mut out);
        match read {
            Ok(n) if n as u64 <= MAX_MINI => Some(out),
            Ok(_) => {
                tracing::debug!(limit = MAX_MINI, "MiniDebugInfo larger than allowed: left out");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "MiniDebugInfo does not decompress");
                None
            }
        }
    }
}

pub(crate) fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `.gnu_debuglink`: a file name, NUL, padding to 4 bytes, a CRC-32 of the debug file.
fn parse_debuglink(data: &[u8]) -> Option<(String, u32)> {
    let name = until_nul(data);
    if !safe_link_name(name) {
        return None;
    }
    let at = (name.len() + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?);
    Some((String::from_utf8(name.to_vec()).ok()?, crc))
}

/// The separate debug file of a module, as gdb looks for it: by build-id in each debug
/// directory, then the debug link next to the module, in its .debug/, and under each debug
/// directory. The module's path is its path in its process's mount namespace, so a candidate is
/// taken only if it carries the module's build-id (or, without one, the link's CRC).
fn find_local(dirs: &[PathBuf], module: &Path, build_id: Option<&[u8]>, link: Option<&(String, u32)>) -> Option<Arc<ModuleFile>> {
    let mut candidates = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        for dir in dirs {
            candidates.push(dir.join(".build-id").join(hex(&id[..1])).join(format!("{}.debug", hex(&id[1..]))));
        }
    }
    if let (Some((name, _)), Some(parent)) = (link, module.parent().filter(|p| p.is_absolute())) {
        candidates.push(parent.join(name));
        candidates.push(parent.join(".debug").join(name));
        for dir in dirs {
            candidates.push(dir.join(parent.strip_prefix("/").unwrap_or(parent)).join(name));
        }
    }
    candidates.into_iter().find_map(|c| open_matching(&c, build_id, link.map(|l| l.1)))
}

/// Opens a candidate debug file if it belongs to the build: same build-id, or without one the
/// debug link's CRC.
fn open_matching(path: &Path, build_id: Option<&[u8]>, crc: Option<u32>) -> Option<Arc<ModuleFile>> {
    // A missing candidate is the common case: no open, no log.
    std::fs::symlink_metadata(path).ok()?;
    let file = match ModuleFile::open(path) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot open a debug file");
            return None;
        }
    };
    let matches = match (build_id, crc) {
        (Some(id), _) => file.build_id() == Some(id),
        (None, Some(crc)) => crc_of(&file) == Some(crc),
        (None, None) => false,
    };
    if !matches {
        tracing::debug!(path = %path.display(), "debug file of another build: not used");
        return None;
    }
    tracing::debug!(path = %path.display(), "separate debug file");
    Some(file)
}

fn crc_of(file: &ModuleFile) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let len = file.file().metadata().ok()?.len();
    if len > MAX_COPY {
        return None;
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = file.file().read_at(&mut buf, at).ok()?;
        if n == 0 {
            return None;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Some(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debuglink_is_a_safe_name_and_a_crc() {
        let mut d = b"prog.debug\0\0".to_vec();
        d.extend_from_slice(&0x1234_5678u32.to_le_bytes());
        assert_eq!(parse_debuglink(&d), Some(("prog.debug".to_string(), 0x1234_5678)));
        let mut bad = b"../x.debug\0\0".to_vec();
        bad.extend_from_slice(&[0; 4]);
        assert_eq!(parse_debuglink(&bad), None);
        assert_eq!(parse_debuglink(b"prog.debug\0"), None);
    }
}
