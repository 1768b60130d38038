//! Python code objects → function, file and line, read from the process's memory while it runs:
//! the naming side of the interpreter, as `detect.rs` is its finding and `offsets.rs` its layouts.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::linetable::line_for;
use crate::offsets::PyOffsets;
use crate::unicode::{decode as decode_str, str_layout};

/// A Python frame as it is shown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// The qualified name (3.11+), else the function name; `<module>` for module code.
    pub function: Arc<str>,
    pub file: Arc<str>,
    pub line: Option<u32>,
}

struct Code {
    function: Arc<str>,
    file: Arc<str>,
    line_table: Vec<u8>,
}

/// How the walker identified a code object besides its address: a tag of its name, and the
/// function that makes the tag from the name string's `length ^ hash` (the BPF side's rule).
#[derive(Debug, Clone, Copy)]
pub struct NameTag {
    pub tag: u16,
    pub of: fn(u64) -> u16,
}

/// Reads code objects once per (process, address, first line, name tag): an address reused by
/// another code object has another name or first line, and then reads as new. An object is named
/// only if it still is a code object with the name the walker saw.
#[derive(Default)]
pub struct PythonSymbolizer {
    memory: HashMap<u32, File>,
    /// The code object last read at each address, with the first line and name tag it was read
    /// for. Only the last: a frame of an earlier object at a reused address is read again, since
    /// the 16-bit tag of a later object can equal the earlier one's (a thread running gen_43 took
    /// gen_20's cached name in 1 of ~30 runs of the code-reuse test).
    code: HashMap<(u32, u64), (u32, u16, Arc<Code>)>,
    /// Frames whose code object could not be read, or was no longer the one sampled.
    unreadable: HashSet<(u32, u64, u32, u16)>,
    /// Type objects known to be `code`, per process.
    code_types: HashMap<u32, u64>,
    /// Frames that could not be named (unreadable, or no longer the code object sampled).
    pub unknown_frames: u64,
    line_table_bytes: usize,
    /// Code objects whose line table did not fit in [`LINE_TABLES_BUDGET`].
    pub line_tables_dropped: u64,
}

const UNREADABLE: &str = "[unknown python]";
/// The most characters of a name or file name that are read. Profiles keep at most 4096 bytes of
/// a name, its end (gpuflame's names.rs), so more would only cost memory; and a process can make
/// names of millions of characters, in as many code objects as it likes.
pub const MAX_STR_CHARS: usize = 4096;
/// The most bytes of one line table that are read (real ones are a few KiB).
const MAX_LINE_TABLE: usize = 1 << 20;
/// The most bytes of line tables held for all code objects together; past it, frames of new
/// code objects have no line numbers. Real programs stay far below: a PyTorch training loop
/// samples a few thousand code objects of a few hundred bytes each.
const LINE_TABLES_BUDGET: usize = 64 << 20;
/// Bytes of a PyObject header before ob_type, and of a type object before tp_name.
const OB_TYPE: u64 = 8;
const TP_NAME: u64 = 24;

impl PythonSymbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The frame of code object `code` in process `pid` at instruction `lasti`.
    pub fn resolve(&mut self, pid: u32, offsets: &PyOffsets, code: u64, name: NameTag, first_line: u32, lasti: u32) -> PyFrame {
        let key = (pid, code, first_line, name.tag);
        let cached = self.code.get(&(pid, code)).filter(|(l, t, _)| (*l, *t) == (first_line, name.tag)).map(|(_, _, c)| Arc::clone(c));
        let found = match cached {
            Some(c) => Some(c),
            None if self.unreadable.contains(&key) => None,
            None => match self.read_code(pid, offsets, code, name).map(Arc::new) {
                Some(c) => {
                    if let Some((_, _, old)) = self.code.insert((pid, code), (first_line, name.tag, Arc::clone(&c))) {
                        self.line_table_bytes = self.line_table_bytes.saturating_sub(old.line_table.len());
                    }
                    Some(c)
                }
                None => {
                    self.unreadable.insert(key);
                    None
                }
            },
        };
        match found {
            Some(c) => PyFrame {
                function: Arc::clone(&c.function),
                file: Arc::clone(&c.file),
                line: line_for(offsets.version, first_line, &c.line_table, lasti),
            },
            None => {
                self.unknown_frames += 1;
                PyFrame { function: Arc::from(UNREADABLE), file: Arc::from(""), line: None }
            }
        }
    }

    /// Drops what is known of a process (it exited, or exec'd).
    pub fn forget_process(&mut self, pid: u32) {
        self.memory.remove(&pid);
        self.code_types.remove(&pid);
        self.unreadable.retain(|(p, _, _, _)| *p != pid);
        let mut freed = 0;
        self.code.retain(|(p, _), (_, _, code)| {
            if *p == pid {
                freed += code.line_table.len();
            }
            *p != pid
        });
        self.line_table_bytes = self.line_table_bytes.saturating_sub(freed);
    }

    fn read(&mut self, pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
        let file = match self.memory.entry(pid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(File::open(format!("/proc/{pid}/mem")).ok()?),
        };
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    fn read_ptr(bytes: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    }

    /// The str at `obj`, at most its last [`MAX_STR_CHARS`] characters, after `…` when cut.
    fn read_str(&mut self, pid: u32, o: &PyOffsets, obj: u64) -> Option<String> {
        let header = self.read(pid, obj, o.compact_object_size + 8)?;
        let layout = str_layout(&header, o)?;
        let data_addr = match layout.data_offset {
            Some(off) => obj.checked_add(off as u64)?,
            // A legacy (non-compact) string keeps its characters behind a pointer.
            None => Self::read_ptr(&header, o.compact_object_size)?,
        };
        let keep = layout.length.min(MAX_STR_CHARS);
        let skip = u64::try_from((layout.length - keep).checked_mul(layout.kind)?).ok()?;
        let data = self.read(pid, data_addr.checked_add(skip)?, keep * layout.kind)?;
        let text = decode_str(&data, layout.kind);
        Some(if keep < layout.length { format!("…{text}") } else { text })
    }

    /// Whether the object at `addr` is a code object: its type's tp_name is "code".
    fn is_code(&mut self, pid: u32, addr: u64) -> Option<bool> {
        let ty = Self::read_ptr(&self.read(pid, addr.checked_add(OB_TYPE)?, 8)?, 0)?;
        if self.code_types.get(&pid) == Some(&ty) {
            return Some(true);
        }
        let name = Self::read_ptr(&self.read(pid, ty.checked_add(TP_NAME)?, 8)?, 0)?;
        let is_code = self.read(pid, name, 5)? == b"code\0";
        if is_code {
            self.code_types.insert(pid, ty);
        }
        Some(is_code)
    }

    fn read_code(&mut self, pid: u32, o: &PyOffsets, code: u64, name: NameTag) -> Option<Code> {
        if !self.is_code(pid, code)? {
            return None;
        }
        let fields = [o.code_filename, o.code_name, o.code_linetable, o.code_qualname.unwrap_or(0)];
        let size = fields.iter().max().copied().unwrap_or(0) + 8;
        let bytes = self.read(pid, code, size)?;
        let name_ptr = Self::read_ptr(&bytes, o.code_qualname.unwrap_or(o.code_name))?;
        // Freed and reused for another code object since the sample: not the code sampled.
        let header = self.read(pid, name_ptr.checked_add(16)?, 16)?;
        let length_xor_hash = Self::read_ptr(&header, 0)? ^ Self::read_ptr(&header, 8)?;
        if (name.of)(length_xor_hash) != name.tag {
            return None;
        }
        let function = self.read_str(pid, o, name_ptr)?;
        let file = self.read_str(pid, o, Self::read_ptr(&bytes, o.code_filename)?)?;
        // The line table is a bytes object: its size at +16, its bytes at +32 in every version.
        let table_ptr = Self::read_ptr(&bytes, o.code_linetable)?;
        let header = self.read(pid, table_ptr, 32)?;
        let len = usize::try_from(u64::from_le_bytes(header.get(16..24)?.try_into().ok()?)).ok()?.min(MAX_LINE_TABLE);
        let line_table = if self.line_table_bytes + len <= LINE_TABLES_BUDGET {
            let table = self.read(pid, table_ptr.checked_add(32)?, len)?;
            self.line_table_bytes += table.len();
            table
        } else {
            self.line_tables_dropped += 1;
            Vec::new()
        };
        Some(Code { function: Arc::from(function), file: Arc::from(file), line_table })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A code pointer whose memory is no longer a code object may hold anything as its type: a
    /// type pointer at the top of the address space wrapped around and panicked in a debug build
    /// (a CI run's `record` of four Python ranks).
    #[test]
    fn a_type_pointer_near_the_top_of_memory_is_no_code_object() {
        let object: [u64; 2] = [1, u64::MAX - 8];
        let mut python = PythonSymbolizer::new();
        assert_eq!(python.is_code(std::process::id(), object.as_ptr() as u64), None);
        assert_eq!(python.is_code(std::process::id(), u64::MAX - 4), None);
    }
}
