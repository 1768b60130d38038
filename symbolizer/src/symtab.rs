//! A module's function symbols, indexed by gpuflame and named by pread.
//!
//! blazesym maps what it symbolizes, so it is handed a private copy of a file's symbol and string
//! tables (copy.rs), all of it resident while it is kept: libtorch_cpu.so's are 91 MiB, and the
//! agent on a node of PyTorch ranks held 42.6 MiB of such copies. A file without DWARF needs no
//! more than its function symbols, so for those the index is built here: each function's
//! address, size and the offset of its name, 16 bytes, read from the file in bounded pieces. A
//! name is read from the file when an address first needs it (the caller caches the result), so
//! what stays is the index and the names of the functions that were sampled.
//!
//! The rules are blazesym's: `.symtab` when the file has one, else `.dynsym`; a symbol of size 0
//! covers what follows it in `.symtab`, only its own address in `.dynsym` (which is sparse).

use std::os::unix::fs::FileExt;

use gpuflame_elfread::{consts, limits, ElfError, ElfFile, Section, Segment};

use crate::demangle::demangle;
use crate::files::ModuleFile;

const SYM_SIZE: u64 = 24;
/// Symbols read at a time: a piece of the table, never all of it.
const PIECE_SYMBOLS: u64 = 4096;
const STT_NOTYPE: u8 = 0;
const SHN_ABS: u16 = 0xfff1;
const SHF_EXECINSTR: u64 = 0x4;

#[derive(Debug, Clone, Copy)]
struct Entry {
    addr: u64,
    /// 0: unknown (capped at u32::MAX).
    size: u32,
    /// Offset of the name in the string table.
    name: u32,
}

pub(crate) struct SymbolIndex {
    /// Sorted by address, one per address.
    entries: Vec<Entry>,
    /// The string table's place in the file.
    strings: (u64, u64),
    dynamic: bool,
    loads: Vec<Segment>,
}

impl SymbolIndex {
    /// The index of `module`'s functions (empty when it has no symbol table); None when the file
    /// has DWARF, whose lines and inlined functions blazesym reads from a private copy.
    pub(crate) fn build(module: &ModuleFile) -> Result<Option<Self>, ElfError> {
        let elf = ElfFile::parse(module.file())?;
        let sections = elf.sections();
        if sections.iter().any(|s| s.name.starts_with(".debug_") || s.name.starts_with(".zdebug_")) {
            return Ok(None);
        }
        let loads = elf.load_segments().copied().collect();
        let (table, dynamic) = match sections.iter().find(|s| s.kind == consts::SHT_SYMTAB) {
            Some(t) => (t, false),
            None => match sections.iter().find(|s| s.kind == consts::SHT_DYNSYM) {
                Some(t) => (t, true),
                None => return Ok(Some(SymbolIndex { entries: Vec::new(), strings: (0, 0), dynamic: false, loads })),
            },
        };
        if table.size > limits::MAX_SYMBOL_TABLE {
            return Err(ElfError::TooLarge { what: table.name.clone(), size: table.size, limit: limits::MAX_SYMBOL_TABLE });
        }
        let strings = match sections.get(table.link as usize) {
            Some(s) if s.kind == consts::SHT_STRTAB && s.offset.checked_add(s.size).is_some_and(|end| end <= elf.len()) => (s.offset, s.size),
            _ => return Err(ElfError::Malformed("symbol table without a string table")),
        };
        let code = |shndx: u16| sections.get(shndx as usize).is_some_and(|s: &Section| s.flags & SHF_EXECINSTR != 0);
        let count = table.size / SYM_SIZE;
        let mut entries = Vec::new();
        let mut first = 1; // symbol 0 is the null symbol
        while first < count {
            let n = (count - first).min(PIECE_SYMBOLS);
            let piece = elf.read(table.offset + first * SYM_SIZE, n * SYM_SIZE, &table.name, PIECE_SYMBOLS * SYM_SIZE)?;
            for e in piece.chunks_exact(SYM_SIZE as usize) {
                let u64_at = |at: usize| e[at..at + 8].try_into().map_or(0, u64::from_le_bytes);
                let (kind, shndx) = (e[4] & 0xf, u16::from_le_bytes([e[6], e[7]]));
                let function = matches!(kind, consts::STT_FUNC | consts::STT_GNU_IFUNC) || (kind == STT_NOTYPE && code(shndx));
                let (addr, size) = (u64_at(8), u64_at(16));
                if function && shndx != consts::SHN_UNDEF && shndx != SHN_ABS && addr != 0 {
                    let name = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                    entries.push(Entry { addr, size: u32::try_from(size).unwrap_or(u32::MAX), name });
                }
            }
            first += n;
        }
        // Of aliases (one address, several names), the largest, as blazesym picks.
        entries.sort_unstable_by_key(|e| (e.addr, std::cmp::Reverse(e.size)));
        entries.dedup_by_key(|e| e.addr);
        entries.shrink_to_fit();
        Ok(Some(SymbolIndex { entries, strings, dynamic, loads }))
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        (self.entries.capacity() * std::mem::size_of::<Entry>()) as u64
    }

    /// The function at `file_offset` of the module, demangled; None when no symbol covers it.
    pub(crate) fn name_at(&self, module: &ModuleFile, file_offset: u64) -> Option<String> {
        let load = self.loads.iter().find(|s| s.offset <= file_offset && file_offset - s.offset < s.file_size)?;
        let addr = file_offset - load.offset + load.vaddr;
        let i = self.entries.partition_point(|e| e.addr <= addr).checked_sub(1)?;
        let e = self.entries[i];
        let covers = match e.size {
            0 => !self.dynamic || addr == e.addr,
            size => addr - e.addr < u64::from(size),
        };
        if !covers {
            return None;
        }
        let name = self.read_name(module, e.name)?;
        Some(demangle(&name))
    }

    /// The NUL-terminated string at `at` in the string table, read in pieces up to the name
    /// limit; None when it is out of the table, unterminated or unreadable.
    fn read_name(&self, module: &ModuleFile, at: u32) -> Option<String> {
        let (table, size) = self.strings;
        let mut name = Vec::new();
        let mut at = u64::from(at);
        let mut piece = [0u8; 256];
        while at < size && name.len() <= limits::MAX_NAME {
            let want = (size - at).min(piece.len() as u64) as usize;
            // A file truncated meanwhile reads short, never SIGBUS: it is not mapped.
            let n = module.file().read_at(&mut piece[..want], table + at).ok()?;
            if n == 0 {
                return None;
            }
            match piece[..n].iter().position(|&c| c == 0) {
                Some(end) => {
                    name.extend_from_slice(&piece[..end]);
                    return (!name.is_empty()).then(|| String::from_utf8_lossy(&name).into_owned());
                }
                None => name.extend_from_slice(&piece[..n]),
            }
            at += n as u64;
        }
        None
    }
}
