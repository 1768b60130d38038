//! Python and native frames in one stack, on every interpreter the machine has. Run as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Debian's python3.15, the newest of the matrix.
fn python_3_15() -> PathBuf {
    let python = python_interpreters().into_iter().find(|p| p.ends_with("python3.15")).expect("3.15 is in the matrix");
    assert!(python.exists(), "{} is missing (scripts/setup.sh installs it)", python.display());
    python
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pystack.py")
}


/// Whether a sample's stack is right: thread entry at the root, the interpreter's native frames
/// above the first Python frame, the expected Python functions in order with their lines, and
/// zlib's native code below compress_it.
fn correct(s: &Stack) -> bool {
    let user = s.user();
    let py: Vec<(usize, &str)> = user.iter().enumerate().filter(|(_, f)| f.contains(" (pystack.py:") || f.contains(" (threading.py:")).map(|(i, f)| (i, *f)).collect();
    let Some(&(first_py, first)) = py.first() else { return false };
    let main_thread = user.first() == Some(&"_start");
    // Debian's 3.13 to 3.15 come with sid's libc, whose symbols are stripped: clone3 is unnamed.
    let thread = user.first().is_some_and(|f| matches!(*f, "clone3" | "__clone3") || f.starts_with("[unknown] (libc.so.6+"));
    if main_thread {
        if first != "<module> (pystack.py:35)" {
            return false;
        }
        let runs_main = user[..first_py].iter().any(|f| f.starts_with("Py_RunMain") || f.starts_with("Py_BytesMain") || f.starts_with("pymain_"));
        if !runs_main {
            return false;
        }
    } else if !(thread && first.contains("_bootstrap (threading.py:")) {
        return false;
    }
    let ours: Vec<&str> = py.iter().map(|(_, f)| *f).filter(|f| f.contains("(pystack.py:") && !f.starts_with("<module>")).collect();
    let leaf_ok = match ours.as_slice() {
        ["worker (pystack.py:29)", "step (pystack.py:21)", leaf] => leaf.starts_with("hot_loop (pystack.py:1"),
        ["worker (pystack.py:29)", "step (pystack.py:22)", "compress_it (pystack.py:17)"] => {
            let (last_py, _) = *py.last().unwrap();
            user[last_py + 1..].iter().any(|f| f.contains("compress") || f.contains("deflate"))
        }
        _ => false,
    };
    leaf_ok
}

/// `pystack.py` under `python` (with `env`), recorded with -p for 2 s of its CPU time (~400
/// samples at 199 Hz) once the recording has its tables: the stacks and gpuflame's stderr.
fn record_pystack(python: &Path, dir: &Path, env: &[(&str, &str)]) -> (Vec<Stack>, String) {
    record_script(python, &script(), dir, env)
}

/// The same for another script of tests/programs.
fn record_script(python: &Path, script: &Path, dir: &Path, env: &[(&str, &str)]) -> (Vec<Stack>, String) {
    let name = format!("{}-{}", script.file_stem().unwrap().to_string_lossy(), python.to_string_lossy().replace('/', "-"));
    let gate = Gate::new(dir, &format!("gate-{name}"));
    let child = gate.spawn(Command::new(python).arg(script).arg("600").envs(env.iter().copied()));
    let out = dir.join(format!("{name}.folded"));
    let pid = child.0.id().to_string();
    let recording = Recording::start(&["record", "--lines", "-F", "199", "-p", &pid, "-o", out.to_str().unwrap()]);
    gate.open_when_ready(&recording, &[child.0.id()]);
    wait_cpu(child.0.id(), 2.0);
    let (status, stderr) = recording.interrupt();
    drop(child);
    assert!(status.success(), "{status:?}\n{stderr}");
    (read_folded(&out), stderr)
}

/// None when at least 300 samples were taken and 95% of them are right; else what was wrong.
fn judge(python: &Path, stacks: &[Stack]) -> Option<String> {
    let all = total(stacks);
    let good: u64 = stacks.iter().filter(|s| correct(s)).map(|s| s.count).sum();
    eprintln!("{:<50} {good:>4} of {all:>4} samples right ({:.1}%)", python.display(), 100.0 * good as f64 / all.max(1) as f64);
    if all < 300 || good * 100 < all * 95 {
        let bad: Vec<Stack> = stacks.iter().filter(|s| !correct(s)).cloned().collect();
        return Some(format!("{}: {good} of {all} samples right; wrong ones:\n{}", python.display(), describe(&bad)));
    }
    None
}

#[test]
fn python_and_native_frames_interleave_on_every_interpreter() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for python in python_interpreters() {
        if !python.exists() {
            failures.push(format!("{} is missing (scripts/setup.sh installs the interpreters these tests need)", python.display()));
            continue;
        }
        let (stacks, _) = record_pystack(&python, dir.path(), &[]);
        failures.extend(judge(&python, &stacks));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `record -- python3.15 pystack.py`: from its start, as the matrix's -p is from attaching.
#[test]
fn record_runs_the_newest_python_with_its_frames_from_the_start() {
    require_bpf();
    let python = python_3_15();
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(dir.path(), "gate");
    let out = dir.path().join("py315.folded");
    // Two threads for 1.5 s of CPU each: ~600 samples at 199 Hz.
    let (status, stderr) = record_gated(&gate, &["record", "--lines", "-F", "199", "-o", out.to_str().unwrap(), "--", python.to_str().unwrap(), script().to_str().unwrap(), "1.5"], 1);
    assert!(status.success(), "{status:?}\n{stderr}");
    if let Some(failure) = judge(&python, &read_folded(&out)) {
        panic!("{failure}\n{stderr}");
    }
}

/// A generator driven by a coroutine that asyncio runs, on every interpreter: the generator's
/// frame under the coroutine's, the coroutine's under the event loop's and `<module>`, whole down
/// to `_start`, with the generator's lines.
#[test]
fn generators_and_coroutines_on_every_interpreter() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(&program_dir()).join("pygen.py");
    let mut failures = Vec::new();
    for python in python_interpreters() {
        if !python.exists() {
            failures.push(format!("{} is missing (scripts/setup.sh installs the interpreters these tests need)", python.display()));
            continue;
        }
        let (stacks, _) = record_script(&python, &script, dir.path(), &[]);
        let ours = |s: &Stack| -> Vec<String> { s.user().iter().filter(|f| f.contains("(pygen.py:")).map(|f| f.split(" (").next().unwrap_or("").to_string()).collect() };
        // The generator runs at lines 10 to 13; the coroutine resumes it at line 20.
        let right = |s: &Stack| {
            let user = s.user();
            let lines_ok = user.iter().any(|f| f.starts_with("consume (pygen.py:20)")) && user.iter().any(|f| ["10)", "11)", "12)", "13)"].iter().any(|l| f.starts_with("produce (pygen.py:") && f.ends_with(l)));
            user.first() == Some(&"_start") && ours(s) == ["<module>", "consume", "produce"] && lines_ok && user.iter().any(|f| f.starts_with("run (runners.py:") || f.starts_with("run (asyncio/runners.py:"))
        };
        let all = total(&stacks);
        let good: u64 = stacks.iter().filter(|s| right(s)).map(|s| s.count).sum();
        // Samples in the event loop between steps have no generator (or no coroutine): fewer
        // than 1 in 10. Any other sample is a broken walk.
        let between = |s: &Stack| s.user().first() == Some(&"_start") && (ours(s) == ["<module>"] || ours(s) == ["<module>", "consume"]);
        let broken: Vec<Stack> = stacks.iter().filter(|s| !right(s) && !between(s)).cloned().collect();
        let broken_count: u64 = broken.iter().map(|s| s.count).sum();
        eprintln!("{:<50} {good:>4} of {all:>4} samples in the generator under the coroutine, {broken_count} broken", python.display());
        if all < 300 || good * 100 < all * 85 || broken_count * 100 > all {
            failures.push(format!("{}: {good} of {all} right, {broken_count} broken:\n{}", python.display(), describe(&broken)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A CPython newer than gpuflame's tables: Debian's 3.15 as `python3.16`, its `_Py_DebugOffsets`
/// saying 3.16, is read where the header's sections are found (the search of pyframes' layout.rs,
/// whose unit tests move them), with one info line and no warning.
#[test]
fn a_python_newer_than_the_tables_is_read_where_its_header_says() {
    require_bpf();
    let real = python_3_15();
    let mut bytes = std::fs::read(&real).unwrap();
    let cookies: Vec<usize> = bytes.windows(16).enumerate().filter(|(_, w)| w[..8] == *b"xdebugpy" && w[10] == 15 && w[11] == 3).map(|(i, _)| i).collect();
    assert_eq!(cookies.len(), 1, "one 3.15 _Py_DebugOffsets header in {}", real.display());
    bytes[cookies[0] + 8..cookies[0] + 16].copy_from_slice(&0x0310_00a0u64.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("python3.16");
    std::fs::write(&newer, &bytes).unwrap();
    std::fs::set_permissions(&newer, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Its standard library is 3.15's, which it finds from its home.
    let home = real.parent().and_then(Path::parent).unwrap().to_str().unwrap().to_string();
    let (stacks, stderr) = record_pystack(&newer, dir.path(), &[("PYTHONHOME", &home)]);
    if let Some(failure) = judge(&newer, &stacks) {
        panic!("{failure}\n{stderr}");
    }
    let named: Vec<&str> = stderr.lines().filter(|l| l.contains("Python 3.16 is newer than gpuflame's tables (up to 3.15)")).collect();
    assert_eq!(named.len(), 1, "one info line names the version:\n{stderr}");
    assert!(!stderr.contains("WARN"), "no warning:\n{stderr}");
}

fn py_spy() -> PathBuf {
    let in_path = std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("py-spy")).find(|p| p.exists()));
    in_path.unwrap_or_else(|| PathBuf::from("/root/.pyenv/shims/py-spy"))
}

/// The Python frames of a py-spy dump of one thread, root first: (function, file, line).
fn py_spy_frames(dump: &str) -> Vec<(String, String, String)> {
    let mut frames: Vec<(String, String, String)> = dump
        .lines()
        .map(str::trim)
        .filter_map(|l| {
            let (func, loc) = l.rsplit_once(" (")?;
            let loc = loc.strip_suffix(')')?;
            let (file, line) = loc.rsplit_once(':')?;
            file.ends_with(".py").then(|| (func.to_string(), file.rsplit('/').next().unwrap_or(file).to_string(), line.to_string()))
        })
        .collect();
    frames.reverse();
    frames
}

#[test]
fn same_python_frames_as_py_spy_dump() {
    require_bpf();
    let py_spy = py_spy();
    assert!(py_spy.exists(), "py-spy is needed (scripts/setup.sh installs it from PyPI)");
    let spin = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pyspin.py");
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(dir.path(), "gate");
    let child = gate.spawn(Command::new("/usr/bin/python3.11").arg(&spin));
    let pid = child.0.id().to_string();
    let out = dir.path().join("spin.folded");
    let recording = Recording::start(&["record", "--lines", "-F", "199", "-p", &pid, "-o", out.to_str().unwrap()]);
    gate.open_when_ready(&recording, &[child.0.id()]);
    wait_cpu(child.0.id(), 0.5);
    let dump = Command::new(&py_spy).args(["dump", "--native", "--pid", &pid]).output().expect("running py-spy");
    // 1.5 s of its CPU time in all: ~300 samples at 199 Hz.
    wait_cpu(child.0.id(), 1.0);
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{stderr}");
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    let expected = py_spy_frames(&dump);
    assert_eq!(expected.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), ["<module>", "top", "middle", "leaf"], "py-spy dump:\n{dump}");

    let stacks = read_folded(&out);
    let all = total(&stacks);
    let same: u64 = stacks
        .iter()
        .filter(|s| {
            let ours: Vec<(String, String, String)> = s
                .user()
                .iter()
                .filter_map(|f| {
                    let (func, loc) = f.rsplit_once(" (")?;
                    let (file, line) = loc.strip_suffix(')')?.rsplit_once(':')?;
                    file.ends_with(".py").then(|| (func.to_string(), file.to_string(), line.to_string()))
                })
                .collect();
            // The same functions and files in the same order; the same lines but in the spinning
            // leaf, whose line moves between the loop's two lines.
            ours.len() == expected.len()
                && ours.iter().zip(&expected).enumerate().all(|(i, (a, b))| a.0 == b.0 && a.1 == b.1 && (i + 1 == ours.len() || a.2 == b.2))
        })
        .map(|s| s.count)
        .sum();
    assert!(all >= 200 && same * 100 >= all * 95, "{same} of {all} samples match py-spy's {expected:?}:\n{}", describe(&stacks));
}

#[test]
fn unsupported_python_is_profiled_natively_with_one_warning() {
    require_bpf();
    let python = std::fs::read_dir("/root/.pyenv/versions")
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("3.7."))))
        .map(|p| p.join("bin/python3.7"))
        .expect("pyenv's Python 3.7 is needed for this test");
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new(dir.path(), "gate");
    let program = format!("import sys\nsys.path.insert(0, {:?})\nimport gate\ngate.gate()\nx = 0\nwhile True:\n    x += 1\n", program_dir());
    let child = gate.spawn(Command::new(&python).args(["-c", &program]));
    let out = dir.path().join("py37.folded");
    let pid = child.0.id().to_string();
    let recording = Recording::start(&["record", "--lines", "-F", "199", "-p", &pid, "-o", out.to_str().unwrap()]);
    gate.open_when_ready(&recording, &[child.0.id()]);
    wait_cpu(child.0.id(), 1.0);
    let (status, stderr) = recording.interrupt();
    assert!(status.success(), "{status:?}\n{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("not supported")).collect();
    assert_eq!(warnings.len(), 1, "expected one warning:\n{stderr}");
    assert!(warnings[0].contains("Python 3.7") && warnings[0].contains("without Python frames"), "{}", warnings[0]);
    let stacks = read_folded(&out);
    assert!(total(&stacks) >= 100, "{}", describe(&stacks));
    assert!(stacks.iter().all(|s| s.user().first() == Some(&"_start")), "native stacks, complete:\n{}", describe(&stacks));
    assert!(stacks.iter().any(|s| s.user().iter().any(|f| f.starts_with("_PyEval_EvalFrameDefault"))));
}
