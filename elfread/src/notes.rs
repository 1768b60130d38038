//! The notes of a note area, as the build-id (elf.rs) and the USDT probes (sdt.rs) read them.

use crate::le::u32_at;

/// One note of a note area.
pub(crate) struct Note<'a> {
    pub kind: u32,
    pub name: &'a [u8],
    pub desc: &'a [u8],
}

/// The notes of a note area in order, up to the first that does not fit in it.
pub(crate) struct Notes<'a> {
    data: &'a [u8],
    align: usize,
    at: usize,
}

impl<'a> Notes<'a> {
    pub fn new(data: &'a [u8], align: usize) -> Self {
        Notes { data, align, at: 0 }
    }
}

impl<'a> Iterator for Notes<'a> {
    type Item = Note<'a>;

    fn next(&mut self) -> Option<Note<'a>> {
        let align = self.align;
        let pad = |n: usize| n.checked_add(align - 1).map(|n| n & !(align - 1));
        let at = self.at;
        if at.checked_add(12)? > self.data.len() {
            return None;
        }
        let namesz = u32_at(self.data, at) as usize;
        let descsz = u32_at(self.data, at + 4) as usize;
        let kind = u32_at(self.data, at + 8);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(pad(namesz)?)?;
        self.at = desc_at.checked_add(pad(descsz)?)?;
        let name = self.data.get(name_at..name_at.checked_add(namesz)?)?;
        let desc = self.data.get(desc_at..desc_at.checked_add(descsz)?)?;
        Some(Note { kind, name, desc })
    }
}
