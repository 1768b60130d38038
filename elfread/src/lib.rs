//! Reading ELF files that unprivileged users control, from a profiler that runs as root.
//!
//! Every byte is read with `pread` into owned buffers: a file truncated while it is read gives a
//! short read (an error here), never the SIGBUS that touching an mmap past the new end raises.
//! Files are opened without blocking and must be regular files, so that a FIFO or a device at a
//! mapped file's path cannot hang the reader. What is read is bounded (see [`limits`]): a file
//! that claims a larger section is refused with [`ElfError::TooLarge`], never allocated for.

mod elf;
pub mod limits;
mod open;
mod source;
mod symbols;

pub use elf::{ElfFile, Section, Segment};
pub use open::{max_open_files, open_regular, raise_fd_limit, restore_fd_limit, FileId, OpenError};
pub use source::ReadAt;
pub use symbols::{Symbol, Symbols};

/// Section and program header types and flags used by the readers.
pub mod consts {
    pub const PT_LOAD: u32 = 1;
    pub const PT_NOTE: u32 = 4;
    pub const SHT_SYMTAB: u32 = 2;
    pub const SHT_STRTAB: u32 = 3;
    pub const SHT_NOTE: u32 = 7;
    pub const SHT_NOBITS: u32 = 8;
    pub const SHT_DYNSYM: u32 = 11;
    pub const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
    pub const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
    pub const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;
    pub const SHF_ALLOC: u64 = 0x2;
    pub const SHF_COMPRESSED: u64 = 0x800;
    pub const STT_FUNC: u8 = 2;
    pub const STT_GNU_IFUNC: u8 = 10;
    pub const SHN_UNDEF: u16 = 0;
    pub const EM_X86_64: u16 = 62;
}

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("{0}")]
    Open(#[from] OpenError),
    #[error("read error: {0}")]
    Io(std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("unsupported ELF file: {0}")]
    Unsupported(&'static str),
    #[error("malformed ELF file: {0}")]
    Malformed(&'static str),
    #[error("truncated: {what} ({len} bytes at {offset:#x}) lies past the end of the file ({file_len} bytes)")]
    Truncated { what: String, offset: u64, len: u64, file_len: u64 },
    #[error("the file shrank while {what} was read (truncated under the reader)")]
    Shrank { what: String },
    #[error("{what} is {size} bytes, over the {limit}-byte limit")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("cannot allocate {size} bytes for {what}")]
    Alloc { what: String, size: u64 },
}

impl ElfError {
    /// Whether the file broke a size limit: hostile or absurd, reported as such.
    pub fn is_limit(&self) -> bool {
        matches!(self, ElfError::TooLarge { .. })
    }
}
