use super::*;
use gpuflame_elfread::{consts, ElfFile};
use std::path::{Path, PathBuf};

#[inline(never)]
#[no_mangle]
pub extern "C" fn gpuflame_symbolizer_test_marker() -> u32 {
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

#[test]
fn names_come_from_the_open_file_not_the_path() {
    assert_eq!(gpuflame_symbolizer_test_marker(), 7);
    let exe = std::env::current_exe().unwrap();
    let offset = offset_of(&exe, "gpuflame_symbolizer_test_marker");
    let file = ModuleFile::open(&exe).unwrap();
    // The path names another program (as a host file at a container's path would).
    let mapped = |path: &str, file: Option<Arc<ModuleFile>>| MappedFile { start: 0x10000, end: 0x10000 + (1 << 30), offset: 0, path: path.into(), build_id: None, file };
    let mut s = Symbolizer::new();
    let with_file = s.normalize_in(1, &[0x10000 + offset], &[mapped("/bin/true", Some(file))], || None);
    let without = s.normalize_in(1, &[0x10000 + offset], &[mapped(exe.to_str().unwrap(), None)], || None);
    let names = s.symbolize_user(&[with_file[0], without[0]]);
    assert_eq!(names[0].lines.first().map(|l| l.function.as_str()), Some("gpuflame_symbolizer_test_marker"));
    // Lines come from the DWARF of the private copy.
    assert!(names[0].lines[0].file.as_deref().is_some_and(|f| f.ends_with("tests.rs")), "{:?}", names[0]);
    assert!(names[1].is_unknown(), "a module without an open file is never read through its path");
    let UserAddr::InModule { module, .. } = with_file[0] else { panic!() };
    assert_eq!(s.module(module).path, Path::new("/bin/true"));
}

/// The private copy names every address as the original file does, through debug links too
/// (Debian's libc keeps its local symbols in /usr/lib/debug).
#[test]
fn the_private_copy_names_addresses_as_the_original_does() {
    for path in [std::env::current_exe().unwrap(), PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")] {
        let data = std::fs::read(&path).unwrap();
        let elf = ElfFile::parse(&data[..]).unwrap();
        let text = elf.load_segments().find(|s| s.flags & 1 != 0).unwrap();
        let offsets: Vec<u64> = (0..300).map(|i| text.offset + text.file_size * i / 300).collect();
        let blaze = Symbolizer::new_blazesym();
        let direct: Vec<Symbol> =
            blaze.symbolize(&Source::Elf(src::Elf::new(&path)), Input::FileOffset(&offsets)).unwrap().into_iter().map(frames::symbol_from).collect();
        let mut s = Symbolizer::new();
        let file = ModuleFile::open(&path).unwrap();
        let mapped = [MappedFile { start: 0, end: u64::MAX, offset: 0, path: path.clone(), build_id: None, file: Some(file) }];
        let placed = s.normalize_in(1, &offsets, &mapped, || None);
        let copied = s.symbolize_user(&placed);
        let named = direct.iter().filter(|d| !d.is_unknown()).count();
        assert!(named > 200, "{}: only {named} of 300 named directly", path.display());
        assert_eq!(copied, direct, "{}", path.display());
    }
}

/// Files without DWARF are named from gpuflame's own index of their symbols (symtab.rs), which
/// must name what blazesym names: a library with `.symtab` (C++ names, size-0 assembly symbols,
/// aliases), and the same stripped to `.dynsym`.
#[test]
fn the_symbol_index_names_addresses_as_blazesym_does() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lib.cc");
    let mut code = String::from("namespace torch { namespace nn {\n");
    for i in 0..400 {
        code.push_str(&format!("__attribute__((noinline)) int layer{i}(int x) {{ return x * {i} + (x >> 3) - {i}; }}\n"));
        if i % 50 == 0 {
            code.push_str(&format!("static __attribute__((noinline, used)) int hidden{i}(int x) {{ return layer{i}(x) + 1; }}\n"));
        }
    }
    code.push_str("} }\nextern \"C\" int alias_of_layer0(int) __attribute__((alias(\"_ZN5torch2nn6layer0Ei\")));\n");
    code.push_str("asm(\".text\\n.globl sizeless_asm\\nsizeless_asm:\\n nop\\n nop\\n ret\\n\");\n");
    std::fs::write(&src, code).unwrap();
    for (name, strip) in [("libsymtab.so", false), ("libdynsym.so", true)] {
        let path = dir.path().join(name);
        let mut cc = std::process::Command::new("c++");
        cc.args(["-O2", "-shared", "-fPIC", "-o"]).arg(&path).arg(&src);
        if strip {
            cc.arg("-s");
        }
        let out = cc.output().expect("a C++ compiler (c++) is needed");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let data = std::fs::read(&path).unwrap();
        let elf = ElfFile::parse(&data[..]).unwrap();
        assert!(elf.sections().iter().all(|s| !s.name.starts_with(".debug_")));
        assert_eq!(elf.sections().iter().any(|s| s.kind == consts::SHT_SYMTAB), !strip);
        let text = elf.load_segments().find(|s| s.flags & 1 != 0).unwrap();
        let offsets: Vec<u64> = (0..2000).map(|i| text.offset + text.file_size * i / 2000).collect();
        let blaze = Symbolizer::new_blazesym();
        let direct: Vec<Symbol> =
            blaze.symbolize(&Source::Elf(src::Elf::new(&path)), Input::FileOffset(&offsets)).unwrap().into_iter().map(frames::symbol_from).collect();
        let mut s = Symbolizer::new();
        let file = ModuleFile::open(&path).unwrap();
        let mapped = [MappedFile { start: 0, end: u64::MAX, offset: 0, path: path.clone(), build_id: None, file: Some(file.clone()) }];
        let placed = s.normalize_in(1, &offsets, &mapped, || None);
        let indexed = s.symbolize_user(&placed);
        assert!(s.index_of(&file).is_some(), "{name} is named from the index");
        let named = direct.iter().filter(|d| !d.is_unknown()).count();
        assert!(named > 1000, "{name}: only {named} of 2000 named by blazesym");
        // Of two aliases of one size, either may be given: blazesym's order of them is its sort's.
        let alias = |s: &Symbol| s.lines.first().is_some_and(|l| l.function == "alias_of_layer0" || l.function == "torch::nn::layer0(int)");
        let differ: Vec<String> = indexed.iter().zip(&direct).zip(&offsets).filter(|((a, b), _)| a != b && !(alias(a) && alias(b))).take(5).map(|((a, b), o)| format!("{o:#x}: index {:?}, blazesym {:?}", a.lines.first(), b.lines.first())).collect();
        assert!(differ.is_empty(), "{name}: {differ:#?}");
        assert!(indexed.iter().any(|d| d.lines.first().is_some_and(|l| l.function == "torch::nn::layer7(int)")), "{name}: C++ names demangled");
    }
}

/// A file whose debug link names a FIFO (absolute path): symbolizing it must neither open the
/// FIFO nor hang; the file's own symbols still name what they can.
#[test]
fn a_debug_link_to_a_fifo_is_not_followed() {
    let dir = PathBuf::from(format!("/tmp/gfdbg{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("f");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let elf = ElfFile::parse(&data[..]).unwrap();
    let link = elf.section(".gnu_debuglink").expect("Debian's libc has a debug link").clone();
    let id = elf.build_id().unwrap();
    let text = *elf.load_segments().find(|s| s.flags & 1 != 0).unwrap();
    drop(elf);
    // Another build-id, so that no debug file is found by it first.
    let at = data.windows(id.len()).position(|w| w == id).unwrap();
    data[at] ^= 0xff;
    let name = fifo.as_os_str().as_encoded_bytes();
    let start = link.offset as usize;
    data[start..start + link.size as usize - 4].fill(0);
    data[start..start + name.len()].copy_from_slice(name);
    let evil = dir.join("libc.so.6");
    std::fs::write(&evil, &data).unwrap();

    let (tx, rx) = std::sync::mpsc::channel();
    let evil2 = evil.clone();
    std::thread::spawn(move || {
        let mut s = Symbolizer::new();
        let file = ModuleFile::open(&evil2).unwrap();
        let mapped = [MappedFile { start: 0, end: u64::MAX, offset: 0, path: evil2.clone(), build_id: None, file: Some(file) }];
        let offsets: Vec<u64> = (0..100).map(|i| text.offset + text.file_size * i / 100).collect();
        let placed = s.normalize_in(1, &offsets, &mapped, || None);
        let _ = tx.send(s.symbolize_user(&placed));
    });
    let names = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("symbolization hung on the FIFO the debug link names");
    assert!(names.iter().filter(|n| !n.is_unknown()).count() > 20, "the dynamic symbols still name exported functions");
    let _ = std::fs::remove_dir_all(&dir);
}

/// blazesym reads the private copy: truncating the original afterwards (which would raise SIGBUS
/// in a reader that maps it) changes nothing; truncated before the copy, the module stays
/// unnamed.
#[test]
fn truncating_the_original_cannot_reach_the_copy() {
    let exe = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("symbolizer-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::copy(&exe, &victim).unwrap();
    let (a, b) = (offset_of(&exe, "gpuflame_symbolizer_test_marker"), offset_of(&exe, "main"));
    let file = ModuleFile::open(&victim).unwrap();
    let mapped = [MappedFile { start: 0, end: u64::MAX, offset: 0, path: victim.clone(), build_id: None, file: Some(file) }];
    let mut s = Symbolizer::new();
    let first = s.normalize_in(1, &[a, b], &mapped, || None);
    assert!(!s.symbolize_user(&first[..1])[0].is_unknown());
    std::fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(0).unwrap();
    assert_eq!(s.symbolize_user(&first[1..])[0].lines.first().map(|l| l.function.as_str()), Some("main"));

    let mut fresh = Symbolizer::new();
    let placed = fresh.normalize_in(1, &[a], &mapped, || None);
    assert!(fresh.symbolize_user(&placed)[0].is_unknown());
    let _ = std::fs::remove_dir_all(&dir);
}
