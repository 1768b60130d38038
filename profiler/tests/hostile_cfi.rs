//! A file whose call frame information is as big as the limits admit: 80 MB of `.eh_frame`, 4
//! million FDEs, mapped and run by an unprivileged process. gpuflame builds its table on the
//! builder thread within a stated memory bound, keeps profiling everything else, and ends on
//! time (before: 900 MB RSS, 3.2 s on the thread that reads events). Run as root.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use common::others::*;
use common::*;

/// FDEs in the generated file: just under elfread's limit (4,194,304), so the table is built.
const FDES: usize = 4_000_000;
const TEXT: usize = 0x1000;
const CIE_LEN: usize = 24;
const FDE_LEN: usize = 20;
/// gpuflame's peak RSS while it builds that table, at most: 314 MiB measured (debug build),
/// of which the file's CFI is 80 MB (710 MiB when each FDE had its own row vector).
const MAX_RSS_MIB: u64 = 450;


/// An ELF shared object with `FDES` bytes of code (a `jmp .` first, then `int3`s), one FDE per
/// byte (CFA = rsp + 8, return address at CFA - 8: a function that has not pushed anything), and
/// its sections listed; one loadable segment maps it all at file offsets.
fn huge_cfi_elf() -> Vec<u8> {
    let eh = (TEXT + FDES + 7) & !7;
    let eh_size = CIE_LEN + FDES * FDE_LEN + 4;
    let shstrtab = eh + eh_size;
    let names = b"\0.text\0.eh_frame\0.shstrtab\0";
    let shoff = (shstrtab + names.len() + 7) & !7;
    let mut f = vec![0u8; shoff + 4 * 64];
    let put = |f: &mut Vec<u8>, at: usize, bytes: &[u8]| f[at..at + bytes.len()].copy_from_slice(bytes);
    let u16le = |v: u16| v.to_le_bytes();
    let u32le = |v: u32| v.to_le_bytes();
    let u64le = |v: u64| v.to_le_bytes();
    // ELF header: 64-bit, little-endian, ET_DYN, x86-64.
    put(&mut f, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    put(&mut f, 16, &u16le(3));
    put(&mut f, 18, &u16le(62));
    put(&mut f, 20, &u32le(1));
    put(&mut f, 24, &u64le(TEXT as u64));
    put(&mut f, 32, &u64le(64));
    put(&mut f, 40, &u64le(shoff as u64));
    put(&mut f, 52, &u16le(64));
    put(&mut f, 54, &u16le(56));
    put(&mut f, 56, &u16le(1));
    put(&mut f, 58, &u16le(64));
    put(&mut f, 60, &u16le(4));
    put(&mut f, 62, &u16le(3));
    // PT_LOAD, R+X, everything up to the section names.
    put(&mut f, 64, &u32le(1));
    put(&mut f, 68, &u32le(5));
    put(&mut f, 64 + 32, &u64le(shstrtab as u64));
    put(&mut f, 64 + 40, &u64le(shstrtab as u64));
    put(&mut f, 64 + 48, &u64le(0x1000));
    // Code: jmp . ; int3 …
    f[TEXT..TEXT + FDES].fill(0xcc);
    put(&mut f, TEXT, &[0xeb, 0xfe]);
    // CIE: id 0, version 1, "zR", code align 1, data align -8, return address r16, FDE pointers
    // pc-relative sdata4; CFA = rsp + 8, r16 at CFA - 8.
    put(&mut f, eh, &u32le((CIE_LEN - 4) as u32));
    put(&mut f, eh + 4, &[0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0x90, 1, 0, 0]);
    for i in 0..FDES {
        let at = eh + CIE_LEN + i * FDE_LEN;
        put(&mut f, at, &u32le((FDE_LEN - 4) as u32));
        put(&mut f, at + 4, &u32le((at + 4 - eh) as u32));
        let pc = (TEXT + i) as i64 - (at + 8) as i64;
        put(&mut f, at + 8, &(pc as i32).to_le_bytes());
        put(&mut f, at + 12, &u32le(1));
        // Augmentation data length 0, then DW_CFA_nop padding.
    }
    put(&mut f, shstrtab, names);
    // Section headers: null, .text, .eh_frame, .shstrtab.
    let section = |f: &mut Vec<u8>, n: usize, name: u32, kind: u32, flags: u64, at: usize, size: usize, align: u64| {
        let h = shoff + n * 64;
        put(f, h, &u32le(name));
        put(f, h + 4, &u32le(kind));
        put(f, h + 8, &u64le(flags));
        put(f, h + 16, &u64le(if flags != 0 { at as u64 } else { 0 }));
        put(f, h + 24, &u64le(at as u64));
        put(f, h + 32, &u64le(size as u64));
        put(f, h + 48, &u64le(align));
    };
    section(&mut f, 1, 1, 1, 6, TEXT, FDES, 16);
    section(&mut f, 2, 7, 1, 2, eh, eh_size, 8);
    section(&mut f, 3, 17, 3, 0, shstrtab, names.len(), 1);
    f
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

#[test]
fn eighty_megabytes_of_cfi_cost_bounded_memory_and_stop_nothing() {
    require_bpf();
    let dir = OpenDir::new("gpuflame-cfi-");
    let elf = dir.path().join("huge_cfi.so");
    std::fs::write(&elf, huge_cfi_elf()).unwrap();
    let runner = build_c(dir.path(), "run_mapped", &["-O2"]);
    let control = build_c(dir.path(), "chain", &["-O2", "-fomit-frame-pointer"]);
    for f in [&elf, &runner, &control] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let cfi_mib = std::fs::metadata(&elf).unwrap().len() >> 20;

    let out = dir.path().join("cfi.folded");
    // Ended by Ctrl-C once the control program is done; tables asked for and loaded, debug.
    let log = ("RUST_LOG", Some("info,gpuflame::ready=debug,gpuflame::process=debug"));
    let recording = Recording::start_with_env(&["record", "-F", "199", "-o", out.to_str().unwrap()], &[log]);
    let gpuflame_pid = recording.child.id();
    let hostile = Killed(
        as_nobody(&runner, &[elf.as_os_str(), TEXT.to_string().as_ref()])
            .spawn()
            .expect("setpriv (util-linux) is needed"),
    );
    // Started while the big table is being built: a new program's small tables must not wait
    // for it (they did, for 2.7 s in a CI run, and the control's stacks stopped at the leaf).
    let big = "huge_cfi.so";
    recording.wait_for_line(&format!("unwind table asked for by a sample file={}", elf.display()));
    let gate = Gate::new(dir.path(), "gate");
    let mut control = gate.spawn(Command::new(&control).arg("4"));
    let control_ready = recording.wait_ready(control.0.id());
    gate.open_when_ready(&recording, &[control.0.id()]);
    let big_loaded = recording.position(&format!("unwind table loaded file={}", elf.display()));
    assert!(big_loaded.is_none_or(|big| big > control_ready), "the control's tables came after {big}'s:\n{}", recording.log_text());
    // The big table is built, and the hostile code runs with it for a while (~300 samples).
    recording.wait_for_line(&format!("unwind table loaded file={}", elf.display()));
    wait_cpu(hostile.0.id(), 1.5);
    let mut peak_kib = vm_hwm_kib(gpuflame_pid);
    while control.0.try_wait().unwrap().is_none() {
        peak_kib = peak_kib.max(vm_hwm_kib(gpuflame_pid));
        sleep(Duration::from_millis(100));
    }
    peak_kib = peak_kib.max(vm_hwm_kib(gpuflame_pid));
    // The end does not wait for anything that hangs (Recording::finish): a whole-machine
    // recording ends once it has symbolized every sample, gpuflame's own among them (its debug
    // build has 158 MB of DWARF: 2-2.5 s, a cost the README states).
    let (status, stderr) = recording.interrupt();
    drop(hostile);
    let tables = stderr.lines().find(|l| l.contains("unwind tables tables=")).unwrap_or("");
    eprintln!("{cfi_mib} MiB file; gpuflame peak RSS {} MiB; {tables}", peak_kib >> 10);
    assert!(status.success(), "gpuflame failed:\n{stderr}");
    assert!(peak_kib >> 10 <= MAX_RSS_MIB, "gpuflame's RSS reached {} MiB (bound {MAX_RSS_MIB})", peak_kib >> 10);

    let stacks = read_folded(&out);
    control_samples_complete(&stacks, "chain", 100);
    // The hostile code itself: unwound from its table once built, to main.
    let hostile: Vec<Stack> = stacks.iter().filter(|s| s.comm() == "run_mapped").cloned().collect();
    let whole: u64 = hostile.iter().filter(|s| s.user().first() == Some(&"_start") && s.user().contains(&"main")).map(|s| s.count).sum();
    eprintln!("run_mapped: {whole} of {} samples whole", total(&hostile));
    assert!(whole >= 200, "the mapped code's table was not used: {whole} of {} whole:\n{}", total(&hostile), describe(&hostile));
}


#[test]
fn the_generated_file_reads_as_intended() {
    // The generator's own check, with the unwinder the profiler uses: every FDE read, one rule.
    let bytes = huge_cfi_elf();
    assert_eq!(&bytes[..4], b"\x7fELF");
    let table = gpuflame_unwind::UnwindTable::from_elf(&bytes).expect("the table builds");
    for pc in [TEXT as u64, (TEXT + FDES / 2) as u64, (TEXT + FDES - 1) as u64] {
        assert!(table.lookup(pc).is_some(), "no row at {pc:#x}");
    }
}
