//! Stacks that meet a file whose table is not loaded yet are copied by BPF and finished in user
//! space once the table comes; the same user-space walk checks the BPF one. Run as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A shared library with over 1 MiB of CFI: chainlib.c (lib_entry → lib_inner → lib_spin) and
/// 16,000 functions that push and pop six registers, each change of the CFA a row.
fn big_library(dir: &Path) -> PathBuf {
    let regs = ["rbx", "rbp", "r12", "r13", "r14", "r15"];
    let mut asm = String::from(".text\n");
    for i in 0..16_000 {
        asm += &format!(".globl bulk_{i}\n.type bulk_{i},@function\nbulk_{i}:\n.cfi_startproc\n");
        for (k, r) in regs.iter().enumerate() {
            asm += &format!("push %{r}\n.cfi_adjust_cfa_offset 8\n.cfi_offset {r},-{}\n", 16 + 8 * k);
        }
        asm += "mov %rdi,%rax\n";
        for r in regs.iter().rev() {
            asm += &format!("pop %{r}\n.cfi_adjust_cfa_offset -8\n.cfi_restore {r}\n");
        }
        asm += &format!("ret\n.cfi_endproc\n.size bulk_{i},.-bulk_{i}\n");
    }
    asm += ".section .note.GNU-stack,\"\",@progbits\n";
    let s = dir.join("bulk.s");
    std::fs::write(&s, asm).unwrap();
    let lib = dir.join("libbig.so");
    let out = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-fPIC", "-shared", "-o"])
        .arg(&lib)
        .arg(Path::new(&program_dir()).join("chainlib.c"))
        .arg(&s)
        .output()
        .expect("a C compiler (cc) is needed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let eh = Command::new("readelf").args(["-SW"]).arg(&lib).output().expect("readelf (binutils) is needed");
    let text = String::from_utf8_lossy(&eh.stdout);
    let size = text.lines().find(|l| l.contains(" .eh_frame ")).and_then(|l| l.split_whitespace().nth(5)).and_then(|s| u64::from_str_radix(s, 16).ok());
    assert!(size.is_some_and(|s| s > 1 << 20), "the library's .eh_frame should be over 1 MiB: {size:?}");
    lib
}

/// The summary's "N finished late", 0 when absent.
fn finished_late(log: &str) -> u64 {
    log.split(" finished late").next().filter(|s| s.len() < log.len()).and_then(|s| s.rsplit(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn a_big_library_run_as_soon_as_it_is_dlopened_is_whole_from_its_first_sample() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let lib = big_library(dir.path());
    let exe = build_c(dir.path(), "dlopener", &["-O2", "-g", "-fomit-frame-pointer", "-ldl"]);
    let out = dir.path().join("big.folded");
    // No gate: the library runs the moment it is mapped, before its table can be built. It is
    // mapped 0.3 s after the program starts, as a real program's libraries are: in its first
    // milliseconds, before its maps are read at all, a sample in a library whose table is not
    // published yet stops at `[native: unknown code]` and is not copied (README; the debug
    // build reads a new program's maps late enough for one sample in two runs to land there).
    let run = gpuflame_ok(&["record", "-F", "199", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap(), lib.to_str().unwrap(), "2", "0.3"], 0);
    let log = String::from_utf8_lossy(&run.stderr);
    let stacks = read_folded(&out);
    let in_lib: Vec<Stack> = stacks.iter().filter(|s| s.user().iter().any(|f| *f == "lib_spin" || f.contains("libbig.so"))).cloned().collect();
    let all = total(&in_lib);
    let is_whole = |s: &Stack| s.user().first() == Some(&"_start") && s.has_sequence(&["main", "call_library", "lib_entry", "lib_inner", "lib_spin"]);
    let whole: u64 = in_lib.iter().filter(|s| is_whole(s)).map(|s| s.count).sum();
    let cut: Vec<Stack> = in_lib.iter().filter(|s| !is_whole(s)).cloned().collect();
    eprintln!("big dlopen: {whole} of {all} samples whole; {} finished late\n{}", finished_late(&log), describe(&cut));
    assert!(all >= 200, "expected ~400 samples in the library, got {all}\n{log}");
    assert!(finished_late(&log) > 0, "no sample waited for the library's table: the test did not test late stacks\n{log}");
    assert!(whole * 1000 >= all * 995, "only {whole} of {all} whole:\n{}\n{log}", describe(&in_lib));
}

/// The line `unwinder check: N stacks, M identical …, D differ, …` as (N, D).
fn check_line(log: &str) -> (u64, u64) {
    let line = log.lines().find(|l| l.contains("unwinder check: ") && l.contains(" stacks, ")).unwrap_or_else(|| panic!("no check line:\n{log}"));
    let after = line.split("unwinder check: ").nth(1).unwrap();
    let n = after.split(' ').next().and_then(|n| n.parse().ok()).unwrap();
    let d = after.split(", ").find(|p| p.ends_with(" differ")).and_then(|p| p.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    (n, d)
}

#[test]
fn the_user_space_unwinder_walks_every_stack_as_the_bpf_one_does() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let no_fp = ["-O2", "-g", "-fomit-frame-pointer"];
    let chain = build_c(d, "chain", &no_fp);
    let recursion = build_c(d, "recursion", &no_fp);
    let realign = build_c(d, "realign", &no_fp);
    let clobbered = build_c(d, "clobbered_rbp", &no_fp);
    let threads = build_c(d, "threads", &[&no_fp[..], &["-pthread"]].concat());
    // Kernels without CFI, unwound with rows made from their prologues.
    let no_cfi = build_c(d, "no_cfi_kernels", &no_fp);
    // Debian's python3.11: the interpreter in the executable, without frame pointers; its
    // native stacks only (the check walks no Python frames).
    let script = format!(
        "{c} 1; {r} 1; {a} 1; {b} 1; {t} 1; {k} mkl 1; {k} realign 1; /usr/bin/python3.11 -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 1: sum(range(1000))'",
        c = chain.display(),
        r = recursion.display(),
        a = realign.display(),
        b = clobbered.display(),
        t = threads.display(),
        k = no_cfi.display()
    );
    let out = d.join("check.folded");
    let run = gpuflame_ok(&["record", "--check-unwinder", "-F", "199", "-o", out.to_str().unwrap(), "--", "sh", "-c", &script], 0);
    let log = String::from_utf8_lossy(&run.stderr);
    let (compared, differ) = check_line(&log);
    eprintln!("{}", log.lines().filter(|l| l.contains("unwinder check")).collect::<Vec<_>>().join("\n"));
    assert!(compared >= 600, "expected ~1,200 stacks compared, got {compared}\n{log}");
    assert_eq!(differ, 0, "the two unwinders differ:\n{log}");
}

/// Whether `frames` holds `names` in this order (other frames between them).
fn in_order(frames: &[&str], names: &[&str]) -> bool {
    let mut it = frames.iter();
    names.iter().all(|n| it.any(|f| f == n))
}

/// pyenv's Python 3.minor.
fn pyenv_python(minor: u32) -> PathBuf {
    std::fs::read_dir("/root/.pyenv/versions")
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("3.{minor}.")))))
        .map(|p| p.join(format!("bin/python3.{minor}")))
        .unwrap_or_else(|| panic!("pyenv's Python 3.{minor} is needed for this test (/root/.pyenv/versions/3.{minor}.x)"))
}

#[test]
fn python_frames_go_where_their_eval_loop_calls_are_in_stacks_finished_late() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let lib = big_library(dir.path());
    let script = dir.path().join("call_lib.py");
    std::fs::write(&script, "import ctypes, sys\ndef work(lib):\n    lib.lib_entry(ctypes.c_double(2.0))\ndef main():\n    work(ctypes.CDLL(sys.argv[1]))\nmain()\n").unwrap();
    // 3.10: a frame object per eval-loop call; 3.11: entry frames; 3.12 and 3.13: shim frames.
    for minor in [10, 11, 12, 13] {
        let python = pyenv_python(minor);
        let out = dir.path().join(format!("py{minor}.folded"));
        let run = gpuflame_ok(&["record", "-F", "199", "-o", out.to_str().unwrap(), "--", python.to_str().unwrap(), script.to_str().unwrap(), lib.to_str().unwrap()], 0);
        let log = String::from_utf8_lossy(&run.stderr);
        let stacks = read_folded(&out);
        let in_lib: Vec<Stack> = stacks.iter().filter(|s| s.user().contains(&"lib_spin")).cloned().collect();
        let all = total(&in_lib);
        let whole: u64 = in_lib
            .iter()
            .filter(|s| s.user().first() == Some(&"_start") && in_order(&s.user(), &["<module> (call_lib.py)", "main (call_lib.py)", "work (call_lib.py)", "lib_entry"]) && s.has_sequence(&["lib_entry", "lib_inner", "lib_spin"]))
            .map(|s| s.count)
            .sum();
        eprintln!("python 3.{minor}: {whole} of {all} samples in the library whole with their Python frames; {} finished late", finished_late(&log));
        assert!(all >= 200, "3.{minor}: expected ~400 samples in the library, got {all}\n{log}");
        assert!(finished_late(&log) > 0, "3.{minor}: no sample waited for a table\n{log}");
        assert!(whole * 1000 >= all * 995, "3.{minor}: only {whole} of {all} whole:\n{}\n{log}", describe(&in_lib));
    }
}
