//! Normalizing addresses of a live process (this test's own) with the mappings its caller read.

use std::path::Path;

use gpuflame_elfread::{consts, ElfFile};
use gpuflame_symbolizer::{ProcessMapping, Symbolizer, UserAddr};

#[inline(never)]
#[no_mangle]
pub extern "C" fn gpuflame_normalize_test_marker() -> u32 {
    std::hint::black_box(7)
}

/// The file offset of a function of this test binary.
fn offset_of(exe: &Path, name: &str) -> u64 {
    let data = std::fs::read(exe).unwrap();
    let elf = ElfFile::parse(&data[..]).unwrap();
    let symbols = elf.symbols(consts::SHT_SYMTAB).unwrap().unwrap();
    let sym = symbols.iter().find(|s| s.name == name.as_bytes()).unwrap();
    let seg = elf.load_segments().find(|s| s.vaddr <= sym.value && sym.value < s.vaddr + s.file_size).unwrap();
    sym.value - seg.vaddr + seg.offset
}

/// This process's mappings, as the profiler's reader gives them (the symbolizer reads none).
fn own_maps() -> Option<Vec<ProcessMapping>> {
    let text = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = |l: &str| {
        let f: Vec<&str> = l.splitn(6, char::is_whitespace).collect();
        let (start, end) = f.first()?.split_once('-')?;
        Some(ProcessMapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            offset: u64::from_str_radix(f.get(2)?, 16).ok()?,
            inode: f.get(4)?.parse().ok()?,
            path: f.get(5).map_or("", |p| p.trim_start()).to_string(),
        })
    };
    Some(text.lines().filter_map(line).collect())
}

#[test]
fn own_process_is_placed_through_map_files() {
    assert_eq!(gpuflame_normalize_test_marker(), 7);
    let exe = std::env::current_exe().unwrap();
    let addr = gpuflame_normalize_test_marker as *const () as usize as u64;
    let mut s = Symbolizer::new();
    let placed = s.normalize(std::process::id(), &[addr, 8], own_maps);
    assert!(matches!(placed[1], UserAddr::Unmapped { .. }));
    let UserAddr::InModule { module, file_offset } = placed[0] else { panic!("{:?}", placed[0]) };
    assert_eq!(file_offset, offset_of(&exe, "gpuflame_normalize_test_marker"));
    assert_eq!(s.module(module).path, exe);
    let names = s.symbolize_user(&placed[..1]);
    assert_eq!(names[0].lines.first().map(|l| l.function.as_str()), Some("gpuflame_normalize_test_marker"));
    // Placed once: the maps are not read again for the same address.
    let again = s.normalize(std::process::id(), &[addr], || panic!("the maps read again for an address already placed"));
    assert_eq!(again[0], placed[0]);
}
