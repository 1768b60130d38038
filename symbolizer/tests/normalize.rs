//! Normalizing addresses of a live process (this test's own) with the mappings its caller read.

use gpuflame_symbolizer::{ProcessMapping, Symbolizer, UserAddr};

#[inline(never)]
#[no_mangle]
pub extern "C" fn gpuflame_normalize_test_marker() -> u32 {
    std::hint::black_box(11)
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
    assert_eq!(gpuflame_normalize_test_marker(), 11);
    let exe = std::env::current_exe().unwrap();
    let addr = gpuflame_normalize_test_marker as *const () as usize as u64;
    let mut s = Symbolizer::new();
    let placed = s.normalize(std::process::id(), &[addr, 8], own_maps);
    assert!(matches!(placed[1], UserAddr::Unmapped { .. }));
    let UserAddr::InModule { module, file_offset } = placed[0] else { panic!("{:?}", placed[0]) };
    let m = own_maps().unwrap().into_iter().find(|m| (m.start..m.end).contains(&addr)).unwrap();
    assert_eq!(file_offset, addr - m.start + m.offset);
    assert_eq!(s.module(module).path, exe);
    let names = s.symbolize_user(&placed[..1]);
    assert_eq!(names[0].lines.first().map(|l| l.function.as_str()), Some("gpuflame_normalize_test_marker"));
    // Placed once: the maps are not read again for the same address.
    let again = s.normalize(std::process::id(), &[addr], || panic!("the maps read again for an address already placed"));
    assert_eq!(again[0], placed[0]);
}
