//! Reading ELF files that unprivileged users control, from a profiler that runs as root.
//!
//! Every byte is read with `pread` into owned buffers: a file truncated while it is read gives a
//! short read (an error here), never the SIGBUS that touching an mmap past the new end raises.
//! Files are opened without blocking and must be regular files, so that a FIFO or a device at a
//! mapped file's path cannot hang the reader. What is read is bounded (see [`limits`]): a file
//! that claims a larger section is refused with [`ElfError::TooLarge`], never allocated for.

pub mod consts;
mod elf;
mod error;
pub mod limits;
mod le;
mod notes;
mod sdt;
mod open;
mod source;
mod symbols;

pub use elf::{ElfFile, Section, Segment};
pub use error::ElfError;
pub use sdt::{SdtProbe, MAX_SDT_PROBES};
pub use open::{max_open_files, open_regular, raise_fd_limit, restore_fd_limit, FileId, OpenError};
pub use source::ReadAt;
pub use symbols::{Symbol, Symbols};
