//! Section and program header types and flags used by the readers.

pub const PT_LOAD: u32 = 1;
/// p_flags: the segment is executable.
pub const PF_X: u32 = 1;
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
