//! Why a file has no unwind table.

use gpuflame_elfread::ElfError;

#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Read { path: String, source: ElfError },
    #[error("not a usable ELF file: {0}")]
    Elf(#[from] ElfError),
    #[error("unsupported ELF machine {0} (x86-64 only)")]
    Architecture(u16),
    #[error("malformed call frame information: {0}")]
    Cfi(#[from] gimli::Error),
    #[error("more than {limit} {what}: refused")]
    Limit { what: &'static str, limit: usize },
    #[error("the code spans more than 4 GiB")]
    TooLarge,
    #[error("more than {} distinct unwind rules", crate::rule_table::RuleTable::CAPACITY)]
    RulesFull,
}

impl UnwindError {
    /// Whether the file broke one of the size limits (hostile or absurd, never a real binary).
    pub fn is_limit(&self) -> bool {
        match self {
            UnwindError::Limit { .. } => true,
            UnwindError::Read { source, .. } | UnwindError::Elf(source) => source.is_limit(),
            _ => false,
        }
    }
}

