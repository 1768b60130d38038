//! How much of one ELF file the readers take, at most.
//!
//! Measured on the largest libraries at hand (PyTorch 2.x wheels, Triton, LLVM 22): the largest
//! `.eh_frame` is 16.9 MiB (libtorch_cpu.so, 346 k FDEs, 2.7 M rows), the largest `.symtab`
//! 12.5 MiB and `.strtab` 74.4 MiB (libtorch_cpu.so), `.dynstr` 13.6 MiB (libtriton.so), all
//! DWARF of one file 253 MiB (libtriton.so; 135 MiB of it `.debug_info`), the longest symbol
//! name 10 157 bytes (libtriton.so), with files up to 496 MiB (libtorch_cuda.so, mostly
//! `.nv_fatbin`). The limits leave an order of magnitude of room above those, and still stop a
//! file that claims gigabytes before anything is allocated for it.

/// Call frame information: `.eh_frame`, `.debug_frame` (15× libtorch_cpu.so's).
pub const MAX_CFI_SECTION: u64 = 256 << 20;
/// A symbol table, `.symtab` or `.dynsym` (20×; 11 M symbols).
pub const MAX_SYMBOL_TABLE: u64 = 256 << 20;
/// A string table, `.strtab` or `.dynstr` (7×).
pub const MAX_STRING_TABLE: u64 = 512 << 20;
/// Any other single section read whole (DWARF sections for symbolization: 3.8× the largest).
pub const MAX_SECTION: u64 = 512 << 20;
/// Program headers and section headers: 65 536 entries each, far above the few dozen of real
/// files.
pub const MAX_HEADERS: u64 = 1 << 16;
/// The section name table (a few hundred bytes in real files).
pub const MAX_SECTION_NAMES: u64 = 16 << 20;
/// A note segment or section searched for the build-id (tens of bytes in real files).
pub const MAX_NOTES: u64 = 1 << 20;
/// A build-id: 20 bytes (SHA-1) in practice, 32 for SHA-256.
pub const MAX_BUILD_ID: usize = 64;
/// A symbol name; longer ones read as unnamed (6× the longest seen).
pub const MAX_NAME: usize = 64 << 10;
/// FDEs taken from one file's call frame information (11× libtorch_cpu.so's).
pub const MAX_FDES: usize = 4 << 20;
/// Unwind rows produced from one file, before merging (6× libtorch_cpu.so's; each costs
/// about 24 bytes while the table is built).
pub const MAX_UNWIND_ROWS: usize = 16 << 20;
