//! Finding CPython in a process: the executable or libpython that holds the interpreter, its
//! version, and where `_PyRuntime` and the evaluation loop are in memory.

use std::fs;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::offsets::PyOffsets;

#[derive(Debug, thiserror::Error)]
pub enum PyError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}: not a usable ELF file")]
    Elf(String),
    #[error("Python {0}.{1} is not supported (3.8 to 3.14 are)")]
    Unsupported(u8, u8),
    #[error("{0} has no _PyRuntime symbol")]
    NoRuntime(String),
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
}

/// One file mapping of the process, as /proc/PID/maps lists it.
#[derive(Debug, Clone)]
pub struct Mapping<'a> {
    pub start: u64,
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

/// Finds the interpreter among a process's file mappings; `read_runtime` reads `len` bytes of
/// the process's memory (for `_Py_DebugOffsets`). None when the process is not CPython 3.
pub fn find_interpreter(
    maps: &[Mapping<'_>],
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
    let io = |source| PyError::Io { path: path.to_string(), source };
    let file = fs::File::open(path).map_err(io)?;
    // SAFETY: read-only mapping of an executable file, only read.
    let data = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    let elf = object::File::parse(&*data).map_err(|_| PyError::Elf(path.to_string()))?;
    let segments: Vec<(u64, u64, u64)> = elf
        .segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (off, s.address(), size)
        })
        .collect();
    // The load bias from any mapping of this file.
    let bias = maps
        .iter()
        .filter(|m| m.path == first.path)
        .find_map(|m| {
            let seg = segments.iter().find(|(off, _, size)| *off <= m.offset && m.offset < off + size.max(&1))?;
            Some(m.start.wrapping_sub(seg.1 + (m.offset - seg.0)))
        })
        .unwrap_or(0);

    let mut runtime = None;
    let mut eval_ranges = Vec::new();
    for sym in elf.symbols().chain(elf.dynamic_symbols()) {
        match sym.name() {
            Ok("_PyRuntime") => runtime = Some(sym.address()),
            Ok(n) if n == "_PyEval_EvalFrameDefault" || n.starts_with("_PyEval_EvalFrameDefault.cold") => {
                let start = sym.address().wrapping_add(bias);
                let range = (start, start + sym.size().max(1));
                if !eval_ranges.contains(&range) {
                    eval_ranges.push(range);
                }
            }
            _ => {}
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
        read_memory(runtime_addr, 0x300)
            .and_then(|b| PyOffsets::from_debug_offsets(&b))
            .ok_or(PyError::Unsupported(version.0, version.1))?
    } else {
        *PyOffsets::for_version(version.0, version.1).ok_or(PyError::Unsupported(version.0, version.1))?
    };
    Ok(Some(Interpreter { path: PathBuf::from(path), version, offsets, runtime_addr, eval_ranges }))
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

    #[test]
    fn a_process_without_python_has_no_interpreter() {
        let maps = [Mapping { start: 0x1000, offset: 0, path: "/usr/lib/x86_64-linux-gnu/libc.so.6" }];
        assert!(find_interpreter(&maps, |_, _| None).unwrap().is_none());
    }
}
