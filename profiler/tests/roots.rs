//! Stacks whole to their root in the parts of a process's life that used to end early: the
//! dynamic loader's entry code, before the program's `_start` (no CFI there), and a forked child
//! before it execs (it runs its parent's code, and lives too short for its own maps to be read).
//! Run as root.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Builds the early_life program, linked with the library whose constructor does its work.
fn build_early_life(dir: &Path) -> std::path::PathBuf {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    let lib = dir.join("libearly.so");
    let exe = dir.join("early_life");
    let cc = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("cc").args(args).output().expect("a C compiler (cc) is needed to build the test programs");
        assert!(out.status.success(), "cc {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    cc(&[&os("-O2"), &os("-g"), &os("-fPIC"), &os("-shared"), &os("-o"), lib.as_os_str(), programs.join("early_lib.c").as_os_str()]);
    let rpath = os(&format!("-Wl,-rpath,{}", dir.display()));
    let libdir = os(&format!("-L{}", dir.display()));
    cc(&[&os("-O2"), &os("-g"), &os("-o"), exe.as_os_str(), programs.join("early_life.c").as_os_str(), &libdir, &os("-learly"), &rpath]);
    exe
}

/// Whether a frame is the dynamic loader's entry code (named from its debug symbols, or by its
/// file).
fn in_loader(frame: &str) -> bool {
    frame == "_dl_start_user" || frame.contains("ld-linux")
}

#[test]
fn a_library_constructor_before_start_is_whole_to_the_loaders_entry() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_early_life(dir.path());
    let out = dir.path().join("early.folded");
    let gate = Gate::new(dir.path(), "gate");
    let (status, stderr) = record_gated_with_env(&gate, &["record", "-F", "999", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap()], 1, &[("EARLY_MS", Some("500"))]);
    assert!(status.success(), "{stderr}");

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.user().last() == Some(&"early_spin")).collect();
    let all = total(&stacks);
    assert!(all >= 100, "expected ~500 samples in the constructor, got {all}:\n{}", describe(&stacks));
    // Whole: from the loader's entry code (which the unwinder used to take for code whose caller
    // it could not find) through _dl_init to the constructor.
    let whole: u64 = stacks.iter().filter(|s| s.user().first().is_some_and(|f| in_loader(f)) && s.has_sequence(&["early_init", "early_spin"])).map(|s| s.count).sum();
    assert!(whole * 100 >= all * 95, "only {whole} of {all} samples in the constructor are whole to the loader's entry:\n{}", describe(&stacks));
}

#[test]
fn forked_children_before_exec_are_whole_and_named() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "fork_spin", FP_FLAGS);
    let out = dir.path().join("fork.folded");
    // The whole machine, as a quiet machine whose shells start short commands is recorded.
    let recording = Recording::start(&["record", "-F", "999", "-o", out.to_str().unwrap()]);
    let gate = Gate::new(dir.path(), "gate");
    // 200 children of 5 ms of CPU time each: a child is gone long before its maps could be read.
    let mut program = gate.spawn(Command::new(&exe).args(["200", "5"]));
    gate.open_when_ready(&recording, &[program.0.id()]);
    assert!(program.0.wait().unwrap().success());
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");

    let stacks: Vec<Stack> = read_folded(&out).into_iter().filter(|s| s.comm() == "fork_spin").collect();
    let spinning: Vec<&Stack> = stacks.iter().filter(|s| s.user().last() == Some(&"spin")).collect();
    let all: u64 = spinning.iter().map(|s| s.count).sum();
    let children: u64 = spinning.iter().filter(|s| s.user() == ["_start", "__libc_start_main_impl", "__libc_start_call_main", "main", "child_work", "spin"]).map(|s| s.count).sum();
    let parent: u64 = spinning.iter().filter(|s| s.has_sequence(&["main", "parent_work", "spin"])).map(|s| s.count).sum();
    // The children had about as much CPU time as the parent: a second of it, ~1000 samples.
    assert!(children >= 300 && parent >= 300, "children {children}, parent {parent} samples whole:\n{}", describe(&stacks));
    // Every sample in spin is one of the two, whole; a child's that stopped early would read
    // `[native: unknown code];spin`.
    assert!((children + parent) * 100 >= all * 97, "only {} of {all} samples in spin are whole:\n{}", children + parent, describe(&stacks));
}
