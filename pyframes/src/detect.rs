//! Finding CPython in a process: the executable or libpython that holds the interpreter, its
//! version, and where `_PyRuntime` and the evaluation loop are in memory.

use std::fs::File;
use std::path::{Path, PathBuf};

use gpuflame_elfread::{consts, open_regular, ElfError, ElfFile, OpenError};

use crate::layout::NEWEST_KNOWN;
use crate::offsets::{DebugOffsetsError, PyOffsets, DEBUG_OFFSETS_LEN};

#[derive(Debug, thiserror::Error)]
pub enum PyError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Read { path: String, source: ElfError },
    #[error("Python {0}.{1} is not supported (3.8 to 3.15 are)")]
    Unsupported(u8, u8),
    #[error("Python {0}.{1} is a free-threaded build ({0}.{1}t), whose frames gpuflame does not read yet")]
    FreeThreaded(u8, u8),
    #[error("{0} has no _PyRuntime symbol")]
    NoRuntime(String),
    /// The loader has mapped the file's code but not yet its data (ld.so maps a library's
    /// segments one by one): `_PyRuntime`'s address still shows other bytes. Asked again later,
    /// the answer comes.
    #[error("{0} is still being mapped: _PyRuntime's address does not show the file's data yet")]
    StillMapping(String),
    #[error("cannot read _Py_DebugOffsets at {addr:#x} in {path}")]
    HeaderUnreadable { path: String, addr: u64 },
    #[error(transparent)]
    DebugOffsets(#[from] DebugOffsetsError),
}

/// The interpreter of one process, with addresses in that process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// The file that holds the interpreter (python3.X or libpython3.X.so).
    pub path: PathBuf,
    pub version: (u8, u8),
    pub offsets: PyOffsets,
    pub runtime_addr: u64,
    /// `_PyEval_EvalFrameDefault` and its `.cold` part, as [start, end) ranges.
    pub eval_ranges: Vec<(u64, u64)>,
    /// `_Py_NoneStruct`, None (0 when not found): 3.13+ puts it in the C-stack shim frame of each
    /// eval-loop call, which is how the walker knows that frame on the stack unaided.
    pub none_addr: u64,
}

impl Interpreter {
    /// Newer than the layouts gpuflame knows (it is read by its own `_Py_DebugOffsets`): the
    /// newest known, to say so.
    pub fn past_known_layouts(&self) -> Option<(u8, u8)> {
        (self.version > NEWEST_KNOWN).then_some(NEWEST_KNOWN)
    }
}

const MAX_EVAL_RANGES: usize = 16;

/// One file mapping of the process, as /proc/PID/maps lists it: all of them, not only code, since
/// whether `_PyRuntime`'s data is mapped yet is read from them.
#[derive(Debug, Clone)]
pub struct Mapping<'a> {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: &'a str,
}

/// The version a file name announces: python3.11, libpython3.12.so.1.0, python3.13d…
fn version_from_name(name: &str) -> Option<(u8, u8)> {
    let rest = name.strip_prefix("libpython").or_else(|| name.strip_prefix("python"))?;
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Finds the interpreter among a process's file mappings, reading files at the paths the
/// mappings name: right for this mount namespace only. `read_memory` reads `len` bytes of the
/// process's memory (for `_Py_DebugOffsets`). None when the process is not CPython 3.
pub fn find_interpreter(
    maps: &[Mapping<'_>],
    read_memory: impl Fn(u64, usize) -> Option<Vec<u8>>,
) -> Result<Option<Interpreter>, PyError> {
    find_interpreter_with(maps, |m| open_regular(Path::new(m.path.trim_end_matches(" (deleted)"))), read_memory)
}

/// Finds the interpreter, with `open` reaching the file behind a mapping: for another process,
/// /proc/PID/map_files/START-END, which is the mapped file itself even in another mount
/// namespace (a container), deleted, or replaced at its path. The path text only names it.
pub fn find_interpreter_with(
    maps: &[Mapping<'_>],
    open: impl Fn(&Mapping<'_>) -> Result<File, OpenError>,
    read_memory: impl Fn(u64, usize) -> Option<Vec<u8>>,
) -> Result<Option<Interpreter>, PyError> {
    // libpython first: a python executable that links it has no interpreter of its own.
    let mut candidates: Vec<&Mapping<'_>> = maps
        .iter()
        .filter(|m| {
            let name = Path::new(m.path).file_name().and_then(|n| n.to_str()).unwrap_or("");
            version_from_name(name).is_some_and(|v| v.0 == 3)
        })
        .collect();
    candidates.sort_by_key(|m| !Path::new(m.path).file_name().and_then(|n| n.to_str()).unwrap_or("").starts_with("libpython"));
    let Some(first) = candidates.first() else { return Ok(None) };
    let path = first.path.trim_end_matches(" (deleted)");
    let read = |source: ElfError| PyError::Read { path: path.to_string(), source };
    let file = open(first).map_err(|e| read(e.into()))?;
    let elf = ElfFile::parse(&file).map_err(read)?;
    let segments: Vec<(u64, u64, u64)> = elf.load_segments().map(|s| (s.offset, s.vaddr, s.file_size)).collect();
    // The load bias from any mapping of this file.
    let bias = maps
        .iter()
        .filter(|m| m.path == first.path)
        .find_map(|m| {
            let seg = segments.iter().find(|(off, _, size)| *off <= m.offset && m.offset - off < (*size).max(1))?;
            Some(m.start.wrapping_sub(seg.1.wrapping_add(m.offset - seg.0)))
        })
        .unwrap_or(0);

    let mut runtime = None;
    let mut none = None;
    let mut eval_ranges = Vec::new();
    let tables = [consts::SHT_SYMTAB, consts::SHT_DYNSYM].map(|kind| elf.symbols(kind));
    for table in tables {
        let Some(symbols) = table.map_err(read)? else { continue };
        for sym in symbols.iter() {
            match sym.name {
                b"_PyRuntime" => runtime = Some(sym.value),
                b"_Py_NoneStruct" => none = Some(sym.value),
                n if n == b"_PyEval_EvalFrameDefault" || n.starts_with(b"_PyEval_EvalFrameDefault.cold") => {
                    let start = sym.value.wrapping_add(bias);
                    let range = (start, start.saturating_add(sym.size.max(1)));
                    // The walker takes a handful; a file with millions of such names is not
                    // searched quadratically.
                    if eval_ranges.len() < MAX_EVAL_RANGES && !eval_ranges.contains(&range) {
                        eval_ranges.push(range);
                    }
                }
                _ => {}
            }
        }
    }
    let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(version) = version_from_name(name) else { return Ok(None) };
    let Some(runtime) = runtime else {
        // A python executable that links libpython has no interpreter of its own; right after
        // exec, libpython is not mapped yet.
        if name.starts_with("python") {
            return Ok(None);
        }
        return Err(PyError::NoRuntime(path.to_string()));
    };
    let runtime_addr = runtime.wrapping_add(bias);
    let offsets = if version >= (3, 13) {
        if !data_mapped(maps, first.path, &segments, runtime, runtime_addr) {
            return Err(PyError::StillMapping(path.to_string()));
        }
        let header = read_memory(runtime_addr, DEBUG_OFFSETS_LEN).ok_or_else(|| PyError::HeaderUnreadable { path: path.to_string(), addr: runtime_addr })?;
        match PyOffsets::from_debug_offsets(&header) {
            Ok(o) => o,
            Err(DebugOffsetsError::FreeThreaded) => return Err(PyError::FreeThreaded(version.0, version.1)),
            Err(DebugOffsetsError::NoCookie | DebugOffsetsError::Version(..)) => return Err(PyError::Unsupported(version.0, version.1)),
            Err(e) => return Err(PyError::DebugOffsets(e)),
        }
    } else {
        *PyOffsets::for_version(version.0, version.1).ok_or(PyError::Unsupported(version.0, version.1))?
    };
    Ok(Some(Interpreter { path: PathBuf::from(path), version, offsets, runtime_addr, eval_ranges, none_addr: none.map_or(0, |n| n.wrapping_add(bias)) }))
}

/// Whether the process maps, at `addr`, the file bytes the ELF segments put at `vaddr`: not so
/// while ld.so has mapped the file's whole span from offset 0 and not yet its data segment over
/// it, nor when another mapping (or none) is there.
fn data_mapped(maps: &[Mapping<'_>], path: &str, segments: &[(u64, u64, u64)], vaddr: u64, addr: u64) -> bool {
    let Some(&(seg_offset, seg_vaddr, _)) = segments.iter().find(|(_, v, size)| (*v..v.saturating_add(*size)).contains(&vaddr)) else {
        // Not in the file (zero-filled): nothing to compare.
        return true;
    };
    let want = vaddr - seg_vaddr + seg_offset;
    maps.iter().any(|m| m.path == path && (m.start..m.end).contains(&addr) && m.offset.wrapping_add(addr - m.start) == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("python3.11"), Some((3, 11)));
        assert_eq!(version_from_name("libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_from_name("python3.13d"), Some((3, 13)));
        assert_eq!(version_from_name("python3"), None);
        assert_eq!(version_from_name("libc.so.6"), None);
    }

    const LIBPYTHON: &str = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";

    /// The path text names the file; the opener decides which file is read.
    #[test]
    fn the_opened_file_is_read_not_the_path() {
        let maps = [Mapping { start: 0x7f00_0000_0000, end: 0x7f00_0001_0000, offset: 0, path: "/nowhere/libpython3.11.so.1.0" }];
        assert!(matches!(find_interpreter(&maps, |_, _| None), Err(PyError::Read { .. })));
        let interp = find_interpreter_with(&maps, |_| open_regular(Path::new(LIBPYTHON)), |_, _| None).unwrap().unwrap();
        assert_eq!(interp.version, (3, 11));
        assert!(interp.runtime_addr > 0x7f00_0000_0000 && !interp.eval_ranges.is_empty());
    }

    #[test]
    fn a_truncated_or_corrupt_libpython_is_an_error_not_a_crash() {
        let data = std::fs::read(LIBPYTHON).unwrap();
        let dir = std::env::temp_dir().join(format!("pyframes-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("libpython3.11.so.1.0");
        let maps = [Mapping { start: 0x7f00_0000_0000, end: 0x7f00_0001_0000, offset: 0, path: "/x/libpython3.11.so.1.0" }];
        for cut in [0, 63, 64, 4096, data.len() / 2, data.len() - 1] {
            std::fs::write(&copy, &data[..cut]).unwrap();
            let found = find_interpreter_with(&maps, |_| open_regular(&copy), |_, _| None);
            assert!(found.is_err(), "cut at {cut}: {found:?}");
        }
        let mut bad = data.clone();
        for b in bad.iter_mut().skip(64).step_by(997) {
            *b = !*b;
        }
        std::fs::write(&copy, &bad).unwrap();
        let _ = find_interpreter_with(&maps, |_| open_regular(&copy), |_, _| None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// pyenv's libpython3.13, whose header is read from memory.
    fn libpython_3_13() -> PathBuf {
        std::fs::read_dir("/root/.pyenv/versions")
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("3.13."))))
            .map(|p| p.join("lib/libpython3.13.so.1.0"))
            .expect("pyenv's Python 3.13 (shared) is needed for this test")
    }

    /// ld.so maps a library's whole span from offset 0, then each segment over it: in between,
    /// `_PyRuntime`'s address holds other bytes of the file, which are no header to refuse
    /// Python for.
    #[test]
    fn a_libpython_whose_data_is_not_mapped_yet_is_asked_again_not_refused() {
        let path = libpython_3_13();
        let data = std::fs::read(&path).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let elf = ElfFile::parse(&file).unwrap();
        let segments: Vec<(u64, u64, u64, u64)> = elf.load_segments().map(|s| (s.offset, s.vaddr, s.file_size, s.mem_size)).collect();
        let name = path.to_str().unwrap();
        let base = 0x7f00_0000_0000u64;
        let span = segments.iter().map(|s| s.1 + s.3).max().unwrap().next_multiple_of(4096);
        // The memory a whole mapping shows: the file at the mapping's offset, as the kernel does.
        let read_as = |maps: Vec<(u64, u64, u64)>| {
            let data = &data;
            move |addr: u64, len: usize| {
                let (start, _, offset) = maps.iter().find(|(s, e, _)| (*s..*e).contains(&addr))?;
                let at = usize::try_from(offset + (addr - start)).ok()?;
                data.get(at..at + len).map(<[u8]>::to_vec)
            }
        };
        let open = |_: &Mapping<'_>| open_regular(&path);

        let reserved = vec![(base, base + span, 0)];
        let maps: Vec<Mapping<'_>> = reserved.iter().map(|&(start, end, offset)| Mapping { start, end, offset, path: name }).collect();
        let found = find_interpreter_with(&maps, open, read_as(reserved.clone()));
        assert!(matches!(found, Err(PyError::StillMapping(_))), "{found:?}");

        // Every segment in place: the header is read and the layouts come from it.
        let page = |v: u64| v & !0xfff;
        let placed: Vec<(u64, u64, u64)> = segments.iter().map(|&(off, vaddr, _, mem)| (base + page(vaddr), base + (vaddr + mem).next_multiple_of(4096), page(off))).collect();
        let maps: Vec<Mapping<'_>> = placed.iter().map(|&(start, end, offset)| Mapping { start, end, offset, path: name }).collect();
        let interp = find_interpreter_with(&maps, open, read_as(placed.clone())).unwrap().unwrap();
        assert_eq!(interp.version, (3, 13));
        let unreadable = find_interpreter_with(&maps, open, |_, _| None);
        assert!(matches!(unreadable, Err(PyError::HeaderUnreadable { .. })), "{unreadable:?}");
    }

    #[test]
    fn a_process_without_python_has_no_interpreter() {
        let maps = [Mapping { start: 0x1000, end: 0x2000, offset: 0, path: "/usr/lib/x86_64-linux-gnu/libc.so.6" }];
        assert!(find_interpreter(&maps, |_, _| None).unwrap().is_none());
    }
}
