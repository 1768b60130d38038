//! A symbol table and its string table, owned, and the string-table reader that section names
//! use too.

use crate::consts::{SHN_UNDEF, STT_FUNC, STT_GNU_IFUNC};
use crate::limits::MAX_NAME;

const SYM_SIZE: usize = 24;

/// The NUL-terminated string at `at` in a string table, None when it is out of range, not
/// terminated, or longer than [`MAX_NAME`].
pub(crate) fn string_at(table: &[u8], at: u32) -> Option<&[u8]> {
    let rest = table.get(at as usize..)?;
    let window = &rest[..rest.len().min(MAX_NAME + 1)];
    let end = window.iter().position(|&c| c == 0)?;
    Some(&window[..end])
}

/// One symbol; `name` is empty when its name is out of range, unterminated or too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol<'a> {
    pub name: &'a [u8],
    pub value: u64,
    pub size: u64,
    /// STT_* (low four bits of st_info).
    pub kind: u8,
    pub bind: u8,
    pub shndx: u16,
}

impl Symbol<'_> {
    pub fn name_str(&self) -> Option<&str> {
        std::str::from_utf8(self.name).ok()
    }

    pub fn is_function(&self) -> bool {
        matches!(self.kind, STT_FUNC | STT_GNU_IFUNC)
    }

    pub fn is_defined(&self) -> bool {
        self.shndx != SHN_UNDEF
    }
}

pub struct Symbols {
    entries: Vec<u8>,
    strings: Vec<u8>,
}

impl Symbols {
    pub(crate) fn new(entries: Vec<u8>, strings: Vec<u8>) -> Self {
        Symbols { entries, strings }
    }

    pub fn len(&self) -> usize {
        self.entries.len() / SYM_SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every symbol but the null one at index 0.
    pub fn iter(&self) -> impl Iterator<Item = Symbol<'_>> {
        self.entries.chunks_exact(SYM_SIZE).skip(1).map(|e| {
            let u64_at = |at: usize| e[at..at + 8].try_into().map_or(0, u64::from_le_bytes);
            let name_offset = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
            Symbol {
                name: string_at(&self.strings, name_offset).unwrap_or(&[]),
                value: u64_at(8),
                size: u64_at(16),
                kind: e[4] & 0xf,
                bind: e[4] >> 4,
                shndx: u16::from_le_bytes([e[6], e[7]]),
            }
        })
    }
}
