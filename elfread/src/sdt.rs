//! SystemTap's USDT probe descriptors (`.note.stapsdt`), which PyTorch's libraries carry.

use crate::consts;
use crate::elf::ElfFile;
use crate::error::ElfError;
use crate::le::u64_at;
use crate::limits::MAX_NOTES;
use crate::notes::Notes;
use crate::source::ReadAt;

/// A USDT probe (NT_STAPSDT): where it is and what it passes, with addresses of this file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdtProbe {
    pub provider: String,
    pub name: String,
    /// The probe's instruction, a virtual address of the file.
    pub address: u64,
    /// Its semaphore's virtual address; 0 when it has none.
    pub semaphore: u64,
    /// The argument specs as the note writes them (`-8@%rax -1@%dl 8@-56(%rbp)`).
    pub args: String,
}

/// Probes read at most: a file that claims more is read only so far.
pub const MAX_SDT_PROBES: usize = 4096;

impl<R: ReadAt> ElfFile<R> {
    /// The USDT probes of `.note.stapsdt`, their addresses moved by what prelinking or a linker
    /// script moved `.stapsdt.base` by. Empty when the file has none; a note that does not hold
    /// together ends the list.
    pub fn sdt_probes(&self) -> Result<Vec<SdtProbe>, ElfError> {
        let Some(section) = self.sections().iter().find(|s| s.kind == consts::SHT_NOTE && s.name == ".note.stapsdt") else { return Ok(Vec::new()) };
        let data = self.section_data(section, MAX_NOTES)?;
        let base = self.section(".stapsdt.base").map(|s| s.addr);
        let mut probes = Vec::new();
        for note in Notes::new(&data, 4).filter(|n| n.kind == 3 && n.name == b"stapsdt\0").take(MAX_SDT_PROBES) {
            if note.desc.len() < 24 {
                break;
            }
            let (pc, note_base, semaphore) = (u64_at(note.desc, 0), u64_at(note.desc, 8), u64_at(note.desc, 16));
            let mut strings = note.desc[24..].split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
            let (Some(provider), Some(name)) = (strings.next(), strings.next()) else { break };
            let args = strings.next().unwrap_or_default();
            let shift = |addr: u64| match base {
                Some(actual) if note_base != 0 && addr != 0 => addr.wrapping_add(actual).wrapping_sub(note_base),
                _ => addr,
            };
            probes.push(SdtProbe { provider, name, address: shift(pc), semaphore: shift(semaphore), args });
        }
        Ok(probes)
    }
}
