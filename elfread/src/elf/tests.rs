use super::*;
use crate::limits::MAX_CFI_SECTION;

/// A minimal ELF64 file: the header, each section's bytes, the section names, the section
/// headers; one PT_LOAD covering everything.
pub(crate) fn tiny_elf(sections: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 64 + 56];
    let mut headers = vec![[0u8; 64]];
    let mut names = vec![0u8];
    for (name, kind, data) in sections {
        let offset = out.len() as u64;
        out.extend_from_slice(data);
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&(names.len() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&offset.to_le_bytes());
        h[32..40].copy_from_slice(&(<[u8]>::len(data) as u64).to_le_bytes());
        headers.push(h);
        names.extend_from_slice(name.as_bytes());
        names.push(0);
    }
    let names_at = out.len() as u64;
    out.extend_from_slice(&names);
    let mut h = [0u8; 64];
    h[4..8].copy_from_slice(&consts::SHT_STRTAB.to_le_bytes());
    h[24..32].copy_from_slice(&names_at.to_le_bytes());
    h[32..40].copy_from_slice(&(names.len() as u64).to_le_bytes());
    headers.push(h);
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    let shoff = out.len() as u64;
    for h in &headers {
        out.extend_from_slice(h);
    }
    let total = out.len() as u64;
    out[0..4].copy_from_slice(b"\x7fELF");
    out[4] = 2;
    out[5] = 1;
    out[6] = 1;
    out[18..20].copy_from_slice(&consts::EM_X86_64.to_le_bytes());
    out[32..40].copy_from_slice(&64u64.to_le_bytes());
    out[40..48].copy_from_slice(&shoff.to_le_bytes());
    out[52..54].copy_from_slice(&64u16.to_le_bytes());
    out[54..56].copy_from_slice(&56u16.to_le_bytes());
    out[56..58].copy_from_slice(&1u16.to_le_bytes());
    out[58..60].copy_from_slice(&64u16.to_le_bytes());
    out[60..62].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    out[62..64].copy_from_slice(&((headers.len() - 1) as u16).to_le_bytes());
    // PT_LOAD, R+X, the whole file at vaddr 0.
    out[64..68].copy_from_slice(&consts::PT_LOAD.to_le_bytes());
    out[68..72].copy_from_slice(&5u32.to_le_bytes());
    out[64 + 32..64 + 40].copy_from_slice(&total.to_le_bytes());
    out[64 + 40..64 + 48].copy_from_slice(&total.to_le_bytes());
    out
}

fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&(name.len() as u32).to_le_bytes());
    n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    n.extend_from_slice(&kind.to_le_bytes());
    n.extend_from_slice(name);
    while !n.len().is_multiple_of(4) {
        n.push(0);
    }
    n.extend_from_slice(desc);
    while !n.len().is_multiple_of(4) {
        n.push(0);
    }
    n
}

#[test]
fn reads_sections_symbols_and_build_id_of_a_real_file() {
    let exe = std::env::current_exe().unwrap();
    let file = crate::open_regular(&exe).unwrap();
    let elf = ElfFile::parse(&file).unwrap();
    assert_eq!(elf.machine(), consts::EM_X86_64);
    assert!(elf.load_segments().count() >= 2);
    let eh = elf.section(".eh_frame").expect("an .eh_frame");
    assert_eq!(elf.section_data(eh, MAX_CFI_SECTION).unwrap().len() as u64, eh.size);
    let symbols = elf.symbols(consts::SHT_SYMTAB).unwrap().expect("a test binary keeps .symtab");
    let me = symbols.iter().find(|s| s.name_str().is_some_and(|n| n.contains("reads_sections_symbols_and_build_id_of_a_real_file")));
    assert!(me.is_some_and(|s| s.is_function() && s.is_defined()));
    let id = elf.build_id().expect("rustc links with a build-id");
    let readelf = std::process::Command::new("readelf").arg("-n").arg(&exe).output().unwrap();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    assert!(String::from_utf8_lossy(&readelf.stdout).contains(&hex), "build-id {hex} not in readelf -n");
}

#[test]
fn every_truncation_of_a_file_is_an_error_or_a_short_read_never_a_panic() {
    let data = tiny_elf(&[(".eh_frame", 1, &[1u8; 300]), (".note.gnu.build-id", consts::SHT_NOTE, &note(b"GNU\0", 3, &[7; 20]))]);
    let full = ElfFile::parse(&data[..]).unwrap();
    assert_eq!(full.build_id(), Some(vec![7; 20]));
    for cut in 0..data.len() {
        let part = &data[..cut];
        let Ok(elf) = ElfFile::parse(part) else { continue };
        for s in elf.sections() {
            match elf.section_data(s, MAX_CFI_SECTION) {
                Ok(d) => assert_eq!(d.len() as u64, s.size),
                Err(e) => assert!(matches!(e, ElfError::Truncated { .. }), "{e}"),
            }
        }
        let _ = elf.build_id();
    }
}

#[test]
fn corrupt_bytes_never_panic() {
    let base = tiny_elf(&[(".symtab", consts::SHT_SYMTAB, &[0xffu8; 48]), (".strtab", consts::SHT_STRTAB, b"\0abc"), (".n", consts::SHT_NOTE, &[0xff; 40])]);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut data = base.clone();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed % data.len() as u64) as usize;
            data[at] = (seed >> 32) as u8;
        }
        if let Ok(elf) = ElfFile::parse(&data[..]) {
            let _ = elf.build_id();
            if let Ok(Some(symbols)) = elf.symbols(consts::SHT_SYMTAB) {
                let _ = symbols.iter().count();
            }
        }
    }
}

#[test]
fn huge_claims_are_refused_before_allocating() {
    let mut data = tiny_elf(&[(".eh_frame", 1, &[0u8; 16])]);
    // .eh_frame claims 1 TiB.
    let shoff = u64::from_le_bytes(data[40..48].try_into().unwrap()) as usize;
    data[shoff + 64 + 32..shoff + 64 + 40].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let elf = ElfFile::parse(&data[..]).unwrap();
    let eh = elf.section(".eh_frame").unwrap();
    assert!(elf.section_data(eh, MAX_CFI_SECTION).unwrap_err().is_limit());
    // Within the limit but past the end of the file.
    data[shoff + 64 + 32..shoff + 64 + 40].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let elf = ElfFile::parse(&data[..]).unwrap();
    let eh = elf.section(".eh_frame").unwrap();
    assert!(matches!(elf.section_data(eh, MAX_CFI_SECTION), Err(ElfError::Truncated { .. })));
    // Four billion section headers through the extended count in section header 0.
    data[60..62].copy_from_slice(&0u16.to_le_bytes());
    data[shoff + 32..shoff + 40].copy_from_slice(&(1u64 << 32).to_le_bytes());
    assert!(ElfFile::parse(&data[..]).err().is_some_and(|e| e.is_limit()));
}

#[test]
fn oversized_and_overlong_names_and_notes_are_skipped() {
    let long = vec![b'x'; crate::limits::MAX_NAME + 10];
    let mut strings = vec![0u8];
    strings.extend_from_slice(b"short\0");
    strings.extend_from_slice(&long);
    let mut syms = vec![0u8; 24 * 3];
    syms[24..28].copy_from_slice(&1u32.to_le_bytes());
    syms[48..52].copy_from_slice(&7u32.to_le_bytes());
    let bad_note = [note(b"GNU\0", 3, &[1; 200]), note(b"GNU\0", 3, &[2; 20])].concat();
    let mut data = tiny_elf(&[(".symtab", consts::SHT_SYMTAB, &syms), (".strtab", consts::SHT_STRTAB, &strings), (".note", consts::SHT_NOTE, &bad_note)]);
    // Link .symtab (section 1) to .strtab (section 2).
    let shoff = u64::from_le_bytes(data[40..48].try_into().unwrap()) as usize;
    data[shoff + 64 + 40..shoff + 64 + 44].copy_from_slice(&2u32.to_le_bytes());
    let elf = ElfFile::parse(&data[..]).unwrap();
    let symbols = elf.symbols(consts::SHT_SYMTAB).unwrap().unwrap();
    let names: Vec<&[u8]> = symbols.iter().map(|s| s.name).collect();
    assert_eq!(names, [&b"short"[..], &b""[..]]);
    assert_eq!(elf.build_id(), Some(vec![2; 20]), "the 200-byte id is skipped, the next note taken");
}

#[test]
fn a_file_that_shrinks_under_the_reader_is_an_error() {
    let dir = std::env::temp_dir().join(format!("elfread-shrink-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lib.so");
    std::fs::write(&path, tiny_elf(&[(".eh_frame", 1, &[3u8; 4096])])).unwrap();
    let file = crate::open_regular(&path).unwrap();
    let elf = ElfFile::parse(&file).unwrap();
    let eh = elf.section(".eh_frame").unwrap().clone();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(200).unwrap();
    assert!(matches!(elf.section_data(&eh, MAX_CFI_SECTION), Err(ElfError::Shrank { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}
