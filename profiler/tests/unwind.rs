//! DWARF unwinding in BPF, on programs built without frame pointers. Run as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::Duration;

use common::*;

/// A frame matcher: exact name, or a prefix for names that carry more (C++ signatures, stripped
/// modules).
#[derive(Clone, Copy)]
enum F {
    Is(&'static str),
    Starts(&'static str),
    Has(&'static str),
}

impl F {
    fn matches(self, frame: &str) -> bool {
        match self {
            F::Is(n) => frame == n,
            F::Starts(p) => frame.starts_with(p),
            F::Has(p) => frame.contains(p),
        }
    }
}

struct Program {
    name: String,
    exe: PathBuf,
    args: Vec<String>,
    /// The root frame: the thread entry.
    entries: &'static [F],
    chain: Vec<F>,
}

const MAIN_ENTRY: &[F] = &[F::Is("_start")];
const THREAD_ENTRY: &[F] = &[F::Is("clone3"), F::Is("__clone3")];
/// A stripped executable's _start has no name.
const STRIPPED_ENTRY: &[F] = &[F::Starts("[unknown] (stripped_O2+0x")];
/// How long the programs spin: longer than the recording may end, since they are killed after it.
/// A program that exits inside the recording has samples in its exit path, without its chain: a
/// CI run's recording, started late on a loaded machine, ran past 8 s and caught cpp_O2's exit.
const SECONDS: &str = "60";

fn no_fp(opt: &str) -> Vec<&str> {
    vec![opt, "-g", "-fomit-frame-pointer"]
}

fn build(dir: &Path, src: &str, out: &str, flags: &[&str], compiler: &str) -> PathBuf {
    let exe = dir.join(out);
    let status = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(src))
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "building {out} failed");
    exe
}

fn programs(dir: &Path) -> Vec<Program> {
    let c_chain = || vec![F::Is("main"), F::Is("a"), F::Is("b"), F::Is("c")];
    let mut v = Vec::new();
    for opt in ["-O2", "-O3"] {
        let tag = &opt[1..];
        let p = |name: &str| format!("{name}_{tag}");
        v.push(Program { name: p("pie"), exe: build(dir, "chain.c", &p("pie"), &[no_fp(opt), vec!["-fPIE", "-pie"]].concat(), "cc"), args: vec![], entries: MAIN_ENTRY, chain: c_chain() });
        v.push(Program { name: p("nopie"), exe: build(dir, "chain.c", &p("nopie"), &[no_fp(opt), vec!["-fno-PIE", "-no-pie"]].concat(), "cc"), args: vec![], entries: MAIN_ENTRY, chain: c_chain() });
        v.push(Program { name: p("threads"), exe: build(dir, "threads.c", &p("threads"), &[no_fp(opt), vec!["-pthread"]].concat(), "cc"), args: vec![], entries: THREAD_ENTRY, chain: vec![F::Is("start_thread"), F::Is("worker"), F::Is("a"), F::Is("b"), F::Is("c")] });
        // Stacks realigned through r10 (DRAP): the CFA read from the frame, the caller's rbp
        // saved at the function's own rbp (PyTorch's AVX kernels).
        v.push(Program {
            name: p("realign"),
            exe: build(dir, "realign.c", &p("realign"), &no_fp(opt), "cc"),
            args: vec![],
            entries: MAIN_ENTRY,
            chain: vec![F::Is("main"), F::Is("aligned_outer"), F::Is("aligned_middle"), F::Is("aligned_leaf")],
        });
        let mut rec = vec![F::Is("main")];
        const LEVELS: [&str; 60] = [
            "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "r16", "r17", "r18", "r19", "r20", "r21", "r22", "r23", "r24", "r25", "r26", "r27", "r28", "r29",
            "r30", "r31", "r32", "r33", "r34", "r35", "r36", "r37", "r38", "r39", "r40", "r41", "r42", "r43", "r44", "r45", "r46", "r47", "r48", "r49", "r50", "r51", "r52", "r53", "r54", "r55", "r56", "r57", "r58", "r59",
        ];
        rec.extend(LEVELS.iter().map(|l| F::Is(l)));
        rec.push(F::Is("spin"));
        v.push(Program { name: p("recursion"), exe: build(dir, "recursion.c", &p("recursion"), &no_fp(opt), "cc"), args: vec![], entries: MAIN_ENTRY, chain: rec });
        v.push(Program {
            name: p("cpp"),
            exe: build(dir, "chain.cpp", &p("cpp"), &no_fp(opt), "c++"),
            args: vec![],
            entries: MAIN_ENTRY,
            chain: vec![F::Is("main"), F::Starts("gpuflame_test::Outer::a("), F::Has("gpuflame_test::b<int>("), F::Starts("gpuflame_test::c(")],
        });
        let lib = build(dir, "chainlib.c", &format!("libchain_{tag}.so"), &[no_fp(opt), vec!["-fPIC", "-shared"]].concat(), "cc");
        v.push(Program {
            name: p("dlopen"),
            exe: build(dir, "dlopener.c", &p("dlopen"), &[no_fp(opt), vec!["-ldl"]].concat(), "cc"),
            args: vec![lib.display().to_string()],
            entries: MAIN_ENTRY,
            chain: vec![F::Is("main"), F::Is("call_library"), F::Is("lib_entry"), F::Is("lib_inner"), F::Is("lib_spin")],
        });
    }
    // Code without CFI that pushed rbp and uses it as a counter, under a caller whose CFA is
    // rbp-based (MKL's tanh kernel under its threader, in libtorch_cpu.so).
    v.push(Program {
        name: "clobbered_rbp".into(),
        exe: build(dir, "clobbered_rbp.c", "clobbered_rbp", &no_fp("-O2"), "cc"),
        args: vec![],
        entries: MAIN_ENTRY,
        chain: vec![F::Is("main"), F::Is("rbp_framed_caller"), F::Is("clobbering_kernel")],
    });
    // Hand-written kernels without CFI, unwound with rows made from their prologues: MKL's sgemm
    // kernels' (a page-aligned frame of 8 to 64 KiB, rbp not a frame pointer's), and a frame
    // realigned under push %rbp; mov %rsp,%rbp.
    let no_cfi = |name: &str| build(dir, "no_cfi_kernels.c", name, &no_fp("-O2"), "cc");
    v.push(Program {
        name: "nocfi_mkl".into(),
        exe: no_cfi("nocfi_mkl"),
        args: vec!["mkl".into()],
        entries: MAIN_ENTRY,
        chain: vec![F::Is("main"), F::Is("outer"), F::Is("mkl_like_kernel")],
    });
    v.push(Program {
        name: "nocfi_realign".into(),
        exe: no_cfi("nocfi_realign"),
        args: vec!["realign".into()],
        entries: MAIN_ENTRY,
        chain: vec![F::Is("main"), F::Is("outer"), F::Is("realigned_kernel")],
    });
    v.push(Program { name: "static_O2".into(), exe: build(dir, "chain.c", "static_O2", &[no_fp("-O2"), vec!["-static"]].concat(), "cc"), args: vec![], entries: MAIN_ENTRY, chain: vec![F::Is("main"), F::Is("a"), F::Is("b"), F::Is("c")] });
    let stripped = build(dir, "chain.c", "stripped_O2", &no_fp("-O2"), "cc");
    let st = Command::new("strip").arg("--strip-all").arg(&stripped).status().expect("strip (binutils) is needed");
    assert!(st.success());
    // Without symbols main, a, b and c are four unknown frames of the executable under libc's
    // __libc_start_call_main.
    let unknown = F::Starts("[unknown] (stripped_O2+0x");
    v.push(Program { name: "stripped_O2".into(), exe: stripped, args: vec![], entries: STRIPPED_ENTRY, chain: vec![F::Is("__libc_start_call_main"), unknown, unknown, unknown, unknown] });
    v
}

fn matches_chain(frames: &[&str], chain: &[F]) -> bool {
    frames.windows(chain.len()).any(|w| w.iter().zip(chain).all(|(f, m)| m.matches(f)))
}

struct Running(Vec<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn programs_without_frame_pointers_unwind_to_their_thread_entry() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let programs = programs(dir.path());
    // Every program at its gate, its code all mapped (dlopen included), until the recording has
    // its tables; then recorded until each has had 0.4 s of CPU (~200 samples at 499 Hz).
    let gate = Gate::new(dir.path(), "gate");
    let running: Vec<Killed> = programs.iter().map(|p| gate.spawn(Command::new(&p.exe).args(&p.args).arg(SECONDS))).collect();
    let pids: Vec<u32> = running.iter().map(|k| k.0.id()).collect();
    let out = dir.path().join("unwind.folded");
    let mut args: Vec<String> = vec!["record".into(), "-F".into(), "499".into(), "-o".into(), out.display().to_string()];
    for pid in &pids {
        args.push("-p".into());
        args.push(pid.to_string());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let recording = Recording::start(&argv);
    gate.open_when_ready(&recording, &pids);
    wait_cpu_all(&pids, 0.4);
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{status:?}\n{stderr}");
    drop(running);

    let stacks = read_folded(&out);
    let mut failures = Vec::new();
    for p in &programs {
        // The kernel truncates comm to 15 bytes.
        let comm: String = p.name.chars().take(15).collect();
        let mine: Vec<&Stack> = stacks.iter().filter(|s| s.comm() == comm).collect();
        let all: u64 = mine.iter().map(|s| s.count).sum();
        let good: u64 = mine
            .iter()
            .filter(|s| {
                let user = s.user();
                user.first().is_some_and(|root| p.entries.iter().any(|e| e.matches(root))) && matches_chain(&user, &p.chain) && s.kernel_below_user()
            })
            .map(|s| s.count)
            .sum();
        eprintln!("{:<14} {good:>5} of {all:>5} samples complete ({:.2}%)", p.name, 100.0 * good as f64 / all.max(1) as f64);
        if all < 100 || good * 100 < all * 99 {
            let owned: Vec<Stack> = mine.iter().map(|s| (*s).clone()).collect();
            failures.push(format!("{}: {good} of {all} samples complete:\n{}", p.name, describe(&owned)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn debian_python_unwinds_to_start() {
    require_bpf();
    let python = Path::new("/usr/bin/python3.11");
    assert!(python.exists(), "Debian's /usr/bin/python3.11 is needed (apt-get install python3.11)");
    let mut child = Running(vec![Command::new(python)
        .args(["-c", "import time\nend = time.time() + 6\nx = 0\nwhile time.time() < end:\n    x = (x * 31 + 7) % 1000003\n"])
        .spawn()
        .unwrap()]);
    sleep(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("python.folded");
    let pid = child.0[0].id().to_string();
    gpuflame_ok(&["record", "-F", "299", "-d", "3", "-p", &pid, "-o", out.to_str().unwrap()], 0);
    drop(child.0.pop().map(|mut c| c.kill()));

    let stacks = read_folded(&out);
    let all = total(&stacks);
    let complete: u64 = stacks
        .iter()
        .filter(|s| {
            // The evaluation loop's frame is shown as the Python code it runs.
            s.user().first() == Some(&"_start") && s.user().iter().any(|f| f.starts_with("_PyEval_EvalFrameDefault") || f.starts_with("<module> (<string>"))
        })
        .map(|s| s.count)
        .sum();
    eprintln!("python3.11: {complete} of {all} samples reach _start through the eval loop");
    assert!(all >= 300, "expected ~900 samples, got {all}");
    assert!(complete * 100 >= all * 95, "only {complete} of {all} samples reach _start:\n{}", describe(&stacks));
}

#[test]
fn library_dlopened_during_the_recording_gets_its_table() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let lib = build(dir.path(), "chainlib.c", "libchain.so", &[no_fp("-O2"), vec!["-fPIC", "-shared"]].concat(), "cc");
    let exe = build(dir.path(), "dlopener.c", "late_dlopen", &[no_fp("-O2"), vec!["-ldl"]].concat(), "cc");
    let out = dir.path().join("late.folded");
    // The library is opened 1 s into the recording and runs for 3 s.
    // Held after the dlopen until the recording has the library's table: how soon it comes is
    // a matter of speed (benches/), that it comes and is used is the test.
    let gate = Gate::new(dir.path(), "gate");
    let (status, log) = record_gated(&gate, &["record", "-F", "199", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap(), lib.to_str().unwrap(), "3", "1"], 1);
    assert!(status.success(), "{status:?}\n{log}");
    let stacks = read_folded(&out);
    let in_lib: Vec<Stack> = stacks.iter().filter(|s| s.user().iter().any(|f| *f == "lib_spin" || f.contains("libchain.so"))).cloned().collect();
    let all = total(&in_lib);
    let complete: u64 = in_lib
        .iter()
        .filter(|s| s.user().first() == Some(&"_start") && matches_chain(&s.user(), &[F::Is("main"), F::Is("call_library"), F::Is("lib_entry"), F::Is("lib_inner"), F::Is("lib_spin")]))
        .map(|s| s.count)
        .sum();
    eprintln!("late dlopen: {complete} of {all} samples in the library are complete");
    assert!(all >= 300, "expected ~600 samples in the library, got {all}");
    assert!(complete * 100 >= all * 95, "only {complete} of {all}:\n{}", describe(&in_lib));
    // When the process exits, the tables only it used are evicted.
    let evicted = log.lines().find(|l| l.contains("evicted=")).and_then(|l| l.split("evicted=").nth(1)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u32>().ok());
    assert!(evicted.is_some_and(|n| n >= 2), "tables were not evicted:\n{log}");
}

#[test]
fn full_unwind_tables_are_reported_not_fatal() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "chain.c", "tables_full", &no_fp("-O2"), "cc");
    let out = dir.path().join("full.folded");
    let output = gpuflame_ok(&["record", "--unwind-rows", "100", "-F", "199", "-o", out.to_str().unwrap(), "--", exe.to_str().unwrap(), "1"], 3);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("unwind tables are full"), "no report of the full tables:\n{log}");
    assert!(log.contains("incomplete stacks"), "{log}");
    // Sampling went on: the program's samples are there, with the frames that could be walked.
    let stacks = read_folded(&out);
    assert!(total(&stacks) >= 100, "{}", describe(&stacks));
    assert!(stacks.iter().any(|s| s.user().last() == Some(&"c")), "{}", describe(&stacks));
}
