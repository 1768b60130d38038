//! Why a file could not be read as ELF.

use crate::open::OpenError;

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
