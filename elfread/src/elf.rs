//! ELF64 little-endian headers, read by hand with checked arithmetic: only the headers are read
//! up front; sections are read when asked for, each against a limit.

use crate::limits::{MAX_BUILD_ID, MAX_HEADERS, MAX_NOTES, MAX_SECTION_NAMES, MAX_STRING_TABLE, MAX_SYMBOL_TABLE};
use crate::source::ReadAt;
use crate::consts;
use crate::error::ElfError;
use crate::le::{u32_at, u64_at};
use crate::symbols::{string_at, Symbols};

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: u64 = 56;
const SHDR_SIZE: u64 = 64;

/// A program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub kind: u32,
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
    pub mem_size: u64,
    pub align: u64,
}

/// A section header, with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub kind: u32,
    pub flags: u64,
    pub addr: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub entsize: u64,
}

/// An ELF file's headers, and the source to read its sections from.
pub struct ElfFile<R> {
    src: R,
    len: u64,
    /// Where the program and section header tables are: (offset, bytes).
    header_tables: [(u64, u64); 2],
    machine: u16,
    entry: u64,
    segments: Vec<Segment>,
    sections: Vec<Section>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2).map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}


/// Reads `len` bytes at `offset` into a new buffer, after checking them against `limit` and the
/// file's length; the allocation itself may fail without aborting.
fn read_bounded<R: ReadAt>(src: &R, file_len: u64, offset: u64, len: u64, what: &str, limit: u64) -> Result<Vec<u8>, ElfError> {
    if len > limit {
        return Err(ElfError::TooLarge { what: what.to_string(), size: len, limit });
    }
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(ElfError::Truncated { what: what.to_string(), offset, len, file_len });
    }
    let size = usize::try_from(len).map_err(|_| ElfError::Alloc { what: what.to_string(), size: len })?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(size).map_err(|_| ElfError::Alloc { what: what.to_string(), size: len })?;
    buf.resize(size, 0);
    src.read_exact_at(&mut buf, offset).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => ElfError::Shrank { what: what.to_string() },
        _ => ElfError::Io(e),
    })?;
    Ok(buf)
}

fn parse_section(b: &[u8]) -> (u32, Section) {
    let name = u32_at(b, 0);
    let section = Section {
        name: String::new(),
        kind: u32_at(b, 4),
        flags: u64_at(b, 8),
        addr: u64_at(b, 16),
        offset: u64_at(b, 24),
        size: u64_at(b, 32),
        link: u32_at(b, 40),
        entsize: u64_at(b, 56),
    };
    (name, section)
}

impl<R: ReadAt> ElfFile<R> {
    /// Reads and checks the ELF header, the program headers and the section headers with their
    /// names. Only 64-bit little-endian files are taken (what x86-64 runs).
    pub fn parse(src: R) -> Result<Self, ElfError> {
        let len = src.len().map_err(ElfError::Io)?;
        if len < EHDR_SIZE as u64 {
            return Err(ElfError::NotElf);
        }
        let h = read_bounded(&src, len, 0, EHDR_SIZE as u64, "the ELF header", EHDR_SIZE as u64)?;
        if h[..4] != *b"\x7fELF" {
            return Err(ElfError::NotElf);
        }
        if h[4] != 2 {
            return Err(ElfError::Unsupported("not a 64-bit ELF file"));
        }
        if h[5] != 1 {
            return Err(ElfError::Unsupported("not a little-endian ELF file"));
        }
        let machine = u16_at(&h, 18);
        let entry = u64_at(&h, 24);
        let (phoff, shoff) = (u64_at(&h, 32), u64_at(&h, 40));
        let (phentsize, mut phnum) = (u64::from(u16_at(&h, 54)), u64::from(u16_at(&h, 56)));
        let (shentsize, mut shnum, mut shstrndx) = (u64::from(u16_at(&h, 58)), u64::from(u16_at(&h, 60)), u32::from(u16_at(&h, 62)));

        // Counts that do not fit the header live in section header 0.
        if shoff != 0 {
            if shentsize != SHDR_SIZE {
                return Err(ElfError::Malformed("section header size is not 64"));
            }
            let first = read_bounded(&src, len, shoff, SHDR_SIZE, "section header 0", SHDR_SIZE)?;
            if shnum == 0 {
                shnum = u64_at(&first, 32);
            }
            if phnum == 0xffff {
                phnum = u64::from(u32_at(&first, 44));
            }
            if shstrndx == 0xffff {
                shstrndx = u32_at(&first, 40);
            }
        } else {
            shnum = 0;
        }
        if phnum > MAX_HEADERS || shnum > MAX_HEADERS {
            let size = phnum.max(shnum);
            return Err(ElfError::TooLarge { what: "the header table".into(), size, limit: MAX_HEADERS });
        }
        let mut segments = Vec::new();
        if phnum > 0 {
            if phentsize != PHDR_SIZE {
                return Err(ElfError::Malformed("program header size is not 56"));
            }
            let table = read_bounded(&src, len, phoff, phnum * PHDR_SIZE, "the program headers", MAX_HEADERS * PHDR_SIZE)?;
            segments = table
                .chunks_exact(PHDR_SIZE as usize)
                .map(|b| Segment {
                    kind: u32_at(b, 0),
                    flags: u32_at(b, 4),
                    offset: u64_at(b, 8),
                    vaddr: u64_at(b, 16),
                    file_size: u64_at(b, 32),
                    mem_size: u64_at(b, 40),
                    align: u64_at(b, 48),
                })
                .collect();
        }
        let mut sections = Vec::new();
        if shnum > 0 {
            let table = read_bounded(&src, len, shoff, shnum * SHDR_SIZE, "the section headers", MAX_HEADERS * SHDR_SIZE)?;
            let parsed: Vec<(u32, Section)> = table.chunks_exact(SHDR_SIZE as usize).map(parse_section).collect();
            let names = match parsed.get(shstrndx as usize) {
                Some((_, s)) if s.kind != consts::SHT_NOBITS && shstrndx != 0 => {
                    read_bounded(&src, len, s.offset, s.size, "the section names", MAX_SECTION_NAMES)?
                }
                _ => Vec::new(),
            };
            sections = parsed
                .into_iter()
                .map(|(name, mut s)| {
                    s.name = string_at(&names, name).map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
                    s
                })
                .collect();
        }
        let header_tables = [(phoff, phnum * PHDR_SIZE), (shoff, shnum * SHDR_SIZE)];
        Ok(ElfFile { src, len, header_tables, machine, entry, segments, sections })
    }

    /// The file's length when it was parsed.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte ranges (offset, length) of the ELF header, the program headers and the section
    /// headers, for a copy that keeps the file's layout.
    pub fn header_ranges(&self) -> [(u64, u64); 3] {
        [(0, EHDR_SIZE as u64), self.header_tables[0], self.header_tables[1]]
    }

    /// `e_machine` (62 for x86-64).
    pub fn machine(&self) -> u16 {
        self.machine
    }

    /// `e_entry`: the virtual address where the program (or the dynamic loader) starts; 0 in
    /// most shared libraries.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The PT_LOAD segments: what the loader maps.
    pub fn load_segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(|s| s.kind == consts::PT_LOAD)
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    pub fn source(&self) -> &R {
        &self.src
    }

    /// `len` bytes at `offset`, refused over `limit`.
    pub fn read(&self, offset: u64, len: u64, what: &str, limit: u64) -> Result<Vec<u8>, ElfError> {
        read_bounded(&self.src, self.len, offset, len, what, limit)
    }

    /// A section's bytes (none for SHT_NOBITS), refused over `limit`.
    pub fn section_data(&self, section: &Section, limit: u64) -> Result<Vec<u8>, ElfError> {
        if section.kind == consts::SHT_NOBITS {
            return Ok(Vec::new());
        }
        self.read(section.offset, section.size, &section.name, limit)
    }

    /// The GNU build-id, from the note segments, else the note sections. Oversized or broken
    /// notes are skipped: the build-id is an identity, and its absence is handled.
    pub fn build_id(&self) -> Option<Vec<u8>> {
        let from_segments = self.segments.iter().filter(|s| s.kind == consts::PT_NOTE).map(|s| (s.offset, s.file_size, s.align));
        let from_sections = self.sections.iter().filter(|s| s.kind == consts::SHT_NOTE).map(|s| (s.offset, s.size, 4));
        let notes = if self.segments.iter().any(|s| s.kind == consts::PT_NOTE) {
            from_segments.collect::<Vec<_>>()
        } else {
            from_sections.collect()
        };
        notes.into_iter().find_map(|(offset, size, align)| {
            let data = self.read(offset, size, "a note", MAX_NOTES).ok()?;
            gnu_build_id(&data, if align == 8 { 8 } else { 4 })
        })
    }

    /// The symbols of the first section of type `kind` (SHT_SYMTAB or SHT_DYNSYM) with their
    /// names; None when the file has no such table.
    pub fn symbols(&self, kind: u32) -> Result<Option<Symbols>, ElfError> {
        let Some(table) = self.sections.iter().find(|s| s.kind == kind) else { return Ok(None) };
        let entries = self.section_data(table, MAX_SYMBOL_TABLE)?;
        let strings = match self.sections.get(table.link as usize) {
            Some(s) if s.kind == consts::SHT_STRTAB => self.section_data(s, MAX_STRING_TABLE)?,
            _ => return Err(ElfError::Malformed("symbol table without a string table")),
        };
        Ok(Some(Symbols::new(entries, strings)))
    }
}

/// NT_GNU_BUILD_ID in a note area; `align` is 4, or 8 for notes aligned as such.
fn gnu_build_id(data: &[u8], align: usize) -> Option<Vec<u8>> {
    crate::notes::Notes::new(data, align).find(|n| n.kind == 3 && n.name == b"GNU\0" && !n.desc.is_empty() && n.desc.len() <= MAX_BUILD_ID).map(|n| n.desc.to_vec())
}

#[cfg(test)]
mod tests;
