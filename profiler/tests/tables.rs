//! Unwind tables in BPF's budget, on programs built here: the tables beyond the budget evicted
//! and the hot ones kept, a process over its share unable to starve another, and a big file's
//! table loaded in pieces. Run as root.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use common::*;

const LIBS: usize = 12;
const FUNCTIONS: usize = 3000;

/// `count` assembly functions named `{prefix}{j}` with CFI: four unwind rows and 32 bytes of
/// `.eh_frame` apiece.
fn cfi_filler(prefix: &str, count: usize) -> String {
    let mut asm = String::from(".text\n");
    for j in 0..count {
        let frame = 8 * (1 + j % 31);
        let f = format!("{prefix}{j}");
        let _ = writeln!(
            asm,
            ".globl {f}\n.type {f},@function\n{f}:\n.cfi_startproc\npush %rbx\n.cfi_adjust_cfa_offset 8\n.cfi_offset rbx, -16\n\
             sub ${frame}, %rsp\n.cfi_adjust_cfa_offset {frame}\nmov %edi, %eax\nadd ${frame}, %rsp\n.cfi_adjust_cfa_offset -{frame}\n\
             pop %rbx\n.cfi_adjust_cfa_offset -8\nret\n.cfi_endproc\n.size {f}, .-{f}"
        );
    }
    asm
}

/// A library of FUNCTIONS assembly functions with CFI (four unwind rows apiece; assembly, so that
/// twelve of them build in seconds), plus `libK_hot` in C for the two hot ones.
fn write_library(dir: &Path, k: usize) -> PathBuf {
    let filler = dir.join(format!("cap{k}.S"));
    std::fs::write(&filler, cfi_filler(&format!("lib{k}_f"), FUNCTIONS)).unwrap();
    let hot = dir.join(format!("cap{k}_hot.c"));
    let hot_src = match k {
        0 => "extern int (*volatile capacity_sink)(int);\nint lib1_hot(int);\n__attribute__((noinline)) int lib0_hot(int x) { int r = lib1_hot(x); return r + capacity_sink(r); }\n",
        1 => "__attribute__((noinline)) int lib1_hot(int x) { volatile long s = 0; for (long i = 0; i < 2000000; i++) s += i ^ x; return (int)s; }\n",
        _ => "",
    };
    std::fs::write(&hot, hot_src).unwrap();
    let so = dir.join(format!("libcap{k}.so"));
    let mut cmd = Command::new("cc");
    cmd.args(["-O2", "-fPIC", "-shared", "-fomit-frame-pointer", "-fasynchronous-unwind-tables", "-o"]).arg(&so).arg(&filler).arg(&hot);
    if k == 0 {
        cmd.arg(format!("-L{}", dir.display())).arg("-lcap1").arg(format!("-Wl,-rpath,{}", dir.display()));
    }
    assert!(cmd.status().unwrap().success(), "building {}", so.display());
    so
}

fn build_capacity_program(dir: &Path) -> PathBuf {
    // libcap1 first: libcap0 links against it.
    let mut order: Vec<usize> = (0..LIBS).collect();
    order.swap(0, 1);
    for k in order {
        write_library(dir, k);
    }
    let main = "#include <stdlib.h>\n\
        int (*volatile capacity_sink)(int);\n\
        static int ident(int x) { return x; }\n\
        int lib0_hot(int);\n\
        int lib2_f1(int); int lib3_f1(int); int lib4_f1(int); int lib5_f1(int); int lib6_f1(int); int lib7_f1(int);\n\
        int lib8_f1(int); int lib9_f1(int); int lib10_f1(int); int lib11_f1(int);\n\
        __attribute__((noinline)) int hot(int x) { int r = lib0_hot(x); return r + capacity_sink(r); }\n\
        int main(int argc, char **argv) {\n\
            capacity_sink = ident;\n\
            int cold = lib2_f1(1) + lib3_f1(1) + lib4_f1(1) + lib5_f1(1) + lib6_f1(1) + lib7_f1(1);\n\
            cold += lib8_f1(1) + lib9_f1(1) + lib10_f1(1) + lib11_f1(1);\n\
            for (;;) cold += hot(cold);\n\
        }\n";
    let c = dir.join("capacity.c");
    std::fs::write(&c, main).unwrap();
    let exe = dir.join("capacity");
    let mut cmd = Command::new("cc");
    cmd.args(["-O2", "-fomit-frame-pointer", "-o"]).arg(&exe).arg(&c).arg(format!("-L{}", dir.display()));
    for k in 0..LIBS {
        cmd.arg(format!("-lcap{k}"));
    }
    cmd.arg(format!("-Wl,-rpath,{}", dir.display()));
    assert!(cmd.status().unwrap().success(), "building the capacity program");
    exe
}

fn field(log: &str, name: &str) -> Option<u64> {
    let at = log.find(&format!(" {name}="))? + name.len() + 2;
    log[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn tables_beyond_the_budget_are_evicted_and_the_hot_ones_stay() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_capacity_program(dir.path());
    let child = Killed(Command::new(&exe).stdout(Stdio::null()).spawn().unwrap());
    sleep(Duration::from_millis(300));
    let pid = child.0.id().to_string();

    // Every table of the process together, for the budget to be a fraction of.
    let probe = dir.path().join("all.folded");
    let output = gpuflame_ok(&["record", "-d", "1", "-p", &pid, "-v", "-o", probe.to_str().unwrap()], 0);
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    let hot_rows = field(&log, "rows").unwrap_or_else(|| panic!("no table summary:\n{log}"));

    // Room for the working set (libc, the two hot libraries: ~55k rows) and little more, against
    // ~175k rows in all: the cold libraries' tables are built ahead of need (they are small), and
    // evicted when the hot ones are asked for.
    let budget = "70000".to_string();
    let out = dir.path().join("capacity.folded");
    // 4 s of the program's CPU time: ~2000 samples, however loaded the machine.
    let (status, log) = record_for_cpu(&["record", "--unwind-rows", &budget, "-F", "499", "-p", &pid, "-o", out.to_str().unwrap()], child.0.id(), 4.0);
    drop(child);
    assert!(status.success(), "{log}");
    let stacks = read_folded(&out);
    // The first samples wait for four demanded tables, each found only once the one before it
    // is in (lib1, lib0, the program, libc): ~60 ms, 31 of 3036 samples, beside the parallel
    // test. They say so at their root; every other sample is whole. Tables that were evicted
    // while hot would keep stacks waiting: a tenth of the samples (seven times the first wait
    // on a quiet machine) is more than the first wait takes on a loaded one.
    let (complete, all, early) = hot_path_whole(&stacks, &["main", "hot", "lib0_hot", "lib1_hot"], 1000, &log);
    eprintln!("capacity: all tables {hot_rows} rows, budget {budget}; {complete} of {all} hot samples complete, {early} before their tables");
    let junk: Vec<Stack> = stacks.iter().filter(|s| s.user().iter().any(|f| f.starts_with("[unknown]"))).cloned().collect();
    assert!(junk.is_empty(), "frames that are no code:\n{}", describe(&junk));
    assert!(field(&log, "evicted_for_room").is_some_and(|n| n >= 1), "no table was evicted for room:\n{log}");
    assert_eq!(field(&log, "rows_unaccounted"), Some(0), "tables leaked:\n{log}");

    // A budget smaller than the hot library's table: named, with the flag that fixes it.
    let child = Killed(Command::new(&exe).stdout(Stdio::null()).spawn().unwrap());
    sleep(Duration::from_millis(300));
    let pid = child.0.id().to_string();
    let out = dir.path().join("small.folded");
    let (status, log) = record_for_cpu(&["record", "--unwind-rows", "4000", "-F", "199", "-p", &pid, "-o", out.to_str().unwrap()], child.0.id(), 1.0);
    drop(child);
    assert!(status.success(), "{log}");
    assert!(log.contains("unwind tables are full") && log.contains("libcap1.so") && log.contains("--unwind-memory"), "{log}");
    let stacks = read_folded(&out);
    let junk: Vec<Stack> = stacks.iter().filter(|s| s.user().iter().any(|f| f.starts_with("[unknown]"))).cloned().collect();
    assert!(junk.is_empty(), "frames that are no code:\n{}", describe(&junk));
    assert!(total(&stacks) >= 100, "{}", describe(&stacks));
}

/// Functions of the big library's filler: with four rows and 32 bytes of CFI apiece, 40,000 make
/// 1.2 MiB of `.eh_frame` (a big file, whose table is built and loaded in pieces of 65,536 rows)
/// and ~200k rows (four pieces).
const BIG_FUNCTIONS: usize = 40_000;

/// A program whose hot path runs through a big library from a function in its first piece
/// (`big_entry`, linked before the filler) to one in its last (`big_last`, after it).
fn build_big_library_program(dir: &Path) -> PathBuf {
    let filler = dir.join("big_filler.S");
    std::fs::write(&filler, cfi_filler("big_f", BIG_FUNCTIONS)).unwrap();
    let first = dir.join("big_first.c");
    std::fs::write(&first, "int big_last(int);\nextern int (*volatile big_sink)(int);\n__attribute__((noinline)) int big_entry(int x) { int r = big_last(x); return r + big_sink(r); }\n").unwrap();
    let last = dir.join("big_last.c");
    std::fs::write(&last, "int (*volatile big_sink)(int);\n__attribute__((noinline)) int big_last(int x) { volatile long s = 0; for (long i = 0; i < 2000000; i++) s += i ^ x; return (int)s; }\n").unwrap();
    let so = dir.join("libbig.so");
    let built = Command::new("cc")
        .args(["-O2", "-fPIC", "-shared", "-fomit-frame-pointer", "-fasynchronous-unwind-tables", "-o"])
        .arg(&so)
        .arg(&first)
        .arg(&filler)
        .arg(&last)
        .status()
        .unwrap();
    assert!(built.success(), "building {}", so.display());
    let main = "static int ident(int x) { return x; }\n\
        extern int (*volatile big_sink)(int);\n\
        int big_entry(int);\n\
        __attribute__((noinline)) int hot(int x) { int r = big_entry(x); return r + big_sink(r); }\n\
        int main(void) { big_sink = ident; int v = 0; for (;;) v += hot(v); }\n";
    let c = dir.join("big.c");
    std::fs::write(&c, main).unwrap();
    let exe = dir.join("big");
    let built = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&c)
        .arg(format!("-L{}", dir.display()))
        .arg("-lbig")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .status()
        .unwrap();
    assert!(built.success(), "building the big library's program");
    exe
}

/// The size of a file's `.eh_frame`, as readelf says.
fn eh_frame_bytes(file: &Path) -> u64 {
    let out = Command::new("readelf").arg("-SW").arg(file).output().expect("readelf (binutils) is needed");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains(" .eh_frame ")).unwrap_or_else(|| panic!("no .eh_frame in {}:\n{text}", file.display()));
    // [Nr] Name Type Address Off Size ...
    let fields: Vec<&str> = line.split(']').nth(1).unwrap_or("").split_whitespace().collect();
    u64::from_str_radix(fields.get(4).copied().unwrap_or("0"), 16).unwrap_or(0)
}

#[test]
fn a_big_librarys_table_comes_in_pieces_and_its_stacks_are_whole() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_big_library_program(dir.path());
    let lib = dir.path().join("libbig.so");
    let cfi = eh_frame_bytes(&lib);
    assert!(cfi > 1 << 20, "libbig.so has {cfi} bytes of .eh_frame: not a big file, the test would not build it in pieces");
    let child = Killed(Command::new(&exe).stdout(Stdio::null()).spawn().unwrap());
    sleep(Duration::from_millis(300));
    let pid = child.0.id().to_string();
    let out = dir.path().join("big.folded");
    let (status, log) = record_for_cpu(&["record", "-F", "499", "-p", &pid, "-o", out.to_str().unwrap()], child.0.id(), 2.0);
    drop(child);
    assert!(status.success(), "{log}");
    assert!(field(&log, "in_pieces").is_some_and(|n| n >= 1), "no table was loaded in pieces:\n{log}");
    assert_eq!(field(&log, "rows_unaccounted"), Some(0), "tables leaked:\n{log}");
    // Samples before the table is in say so at their root (the first ~0.1 s); all others whole.
    let (complete, all, early) = hot_path_whole(&read_folded(&out), &["main", "hot", "big_entry", "big_last"], 500, &log);
    eprintln!("big library: {cfi} bytes of CFI; {complete} of {all} samples complete, {early} before their tables");
}

/// Of the samples in the last function of `path`: at least `min`, 99% of them whole from
/// `_start` through `path` or waiting for their tables (and at most a tenth waiting). Returns
/// (whole, all, waiting).
fn hot_path_whole(stacks: &[Stack], path: &[&str], min: u64, log: &str) -> (u64, u64, u64) {
    let leaf = path[path.len() - 1];
    let hot: Vec<&Stack> = stacks.iter().filter(|s| s.user().contains(&leaf)).collect();
    let all: u64 = hot.iter().map(|s| s.count).sum();
    let complete: u64 = hot.iter().filter(|s| s.user().first() == Some(&"_start") && s.has_sequence(path)).map(|s| s.count).sum();
    let early: u64 = hot.iter().filter(|s| s.before_tables()).map(|s| s.count).sum();
    assert!(all >= min, "expected {min} samples or more in {leaf}, got {all}:\n{}", describe(stacks));
    assert!((complete + early) * 100 >= all * 99, "{complete} of {all} complete, {early} before their tables:\n{}\n{log}", describe(stacks));
    assert!(early * 10 <= all, "{early} of {all} samples waited for their tables:\n{}\n{log}", describe(stacks));
    (complete, all, early)
}

/// A program that runs code in all twelve libraries round and round, so that every one of their
/// tables is in the working set all the time.
fn build_table_hog(dir: &Path) -> PathBuf {
    let mut order: Vec<usize> = (0..LIBS).collect();
    order.swap(0, 1);
    for k in order {
        write_library(dir, k);
    }
    // capacity_sink: libcap0 refers to it.
    let mut main = String::from("#include <time.h>\nstatic volatile int sink;\nint (*volatile capacity_sink)(int);\n");
    for k in 0..LIBS {
        let _ = writeln!(main, "int lib{k}_f1(int);");
    }
    main.push_str("static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }\nint main(void) {\n for (;;) {\n");
    for k in 0..LIBS {
        let _ = writeln!(main, "  for (double end = now() + 0.01; now() < end;) for (int i = 0; i < 1000; i++) sink += lib{k}_f1(i);");
    }
    main.push_str(" }\n}\n");
    let c = dir.join("hog.c");
    std::fs::write(&c, main).unwrap();
    let exe = dir.join("hog");
    let mut cmd = Command::new("cc");
    cmd.args(["-O2", "-o"]).arg(&exe).arg(&c).arg(format!("-L{}", dir.display()));
    for k in 0..LIBS {
        cmd.arg(format!("-lcap{k}"));
    }
    cmd.arg(format!("-Wl,-rpath,{}", dir.display()));
    assert!(cmd.status().unwrap().success(), "building the table hog");
    exe
}

/// An unprivileged process whose running code needs more tables than the budget holds cannot
/// keep a process started later from getting its tables: over its share of the budget, its
/// tables make room for others' even while in use.
#[test]
fn a_process_over_its_share_of_tables_does_not_starve_another() {
    require_bpf();
    let dir = common::others::OpenDir::new("gpuflame-share-");
    let hog = build_table_hog(dir.path());
    let victim = build_c(dir.path(), "chain", &["-O2", "-fomit-frame-pointer"]);
    // Both run under one `record -- CMD`: the hog first, as nobody; the victim 2.5 s later,
    // when the hog's tables (~175k rows in use against a budget of 70k) fill the budget.
    let script = format!(
        "{} {} & sleep 2.5; {} 4; kill $!",
        common::others::setpriv_nobody(&[&hog]).join(" "),
        hog.display(),
        victim.display()
    );
    let out = dir.path().join("share.folded");
    let output = gpuflame(&["record", "--unwind-rows", "70000", "-F", "199", "-v", "-o", out.to_str().unwrap(), "--", "sh", "-c", &script]);
    let (status, log) = (output.status, String::from_utf8_lossy(&output.stderr).into_owned());
    assert!(status.success(), "{log}");
    let stacks = read_folded(&out);
    let victim_stacks: Vec<Stack> = stacks.iter().filter(|s| s.comm() == "chain").cloned().collect();
    let all: u64 = victim_stacks.iter().map(|s| s.count).sum();
    let complete: u64 = victim_stacks.iter().filter(|s| s.user().first() == Some(&"_start") && s.has_sequence(&["main", "a", "b", "c"])).map(|s| s.count).sum();
    eprintln!("fair share: {complete} of {all} victim samples complete");
    assert!(all >= 200, "too few samples of the victim:\n{}", describe(&stacks));
    assert!(complete * 100 >= all * 90, "{complete} of {all} victim samples complete:\n{}\n{log}", describe(&victim_stacks));
    // A table built twice (asked for again while its first build waited to be loaded) was loaded
    // twice, and the first copy's rows were lost to the budget: a CI run's victim found no room.
    assert_eq!(field(&log, "rows_unaccounted"), Some(0), "tables leaked:\n{log}");
}
