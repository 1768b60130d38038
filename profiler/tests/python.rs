//! Python and native frames in one stack, on every interpreter the machine has. Run as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::Duration;

use common::*;

/// The interpreters: pyenv's 3.8 to 3.13, Debian's python3.11, and Debian's 3.13 and 3.14 that
/// scripts/setup.sh installs.
fn interpreters() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for minor in 8..=13 {
        let found = std::fs::read_dir("/root/.pyenv/versions").ok().and_then(|d| {
            d.flatten().map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("3.{minor}.")))).max()
        });
        v.push(found.map(|p| p.join(format!("bin/python3.{minor}"))).unwrap_or_else(|| PathBuf::from(format!("/root/.pyenv/versions/3.{minor}.x/bin/python3.{minor}"))));
    }
    v.push(PathBuf::from("/usr/bin/python3.11"));
    let debian = std::env::var("GPUFLAME_TEST_PYTHONS").unwrap_or_else(|_| "/opt/gpuflame-pythons".into());
    for minor in [13, 14] {
        v.push(Path::new(&debian).join(format!("3.{minor}/usr/bin/python3.{minor}")));
    }
    v
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/pystack.py")
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a sample's stack is right: thread entry at the root, the interpreter's native frames
/// above the first Python frame, the expected Python functions in order with their lines, and
/// zlib's native code below compress_it.
fn correct(s: &Stack) -> bool {
    let user = s.user();
    let py: Vec<(usize, &str)> = user.iter().enumerate().filter(|(_, f)| f.contains(" (pystack.py:") || f.contains(" (threading.py:")).map(|(i, f)| (i, *f)).collect();
    let Some(&(first_py, first)) = py.first() else { return false };
    let main_thread = user.first() == Some(&"_start");
    // Debian's 3.13 and 3.14 come with sid's libc, whose symbols are stripped: clone3 is unnamed.
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

#[test]
fn python_and_native_frames_interleave_on_every_interpreter() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for python in interpreters() {
        if !python.exists() {
            failures.push(format!("{} is missing (scripts/setup.sh installs the interpreters these tests need)", python.display()));
            continue;
        }
        let child = Killed(Command::new(&python).arg(script()).arg("6").spawn().unwrap());
        sleep(Duration::from_millis(800));
        let out = dir.path().join("py.folded");
        let pid = child.0.id().to_string();
        gpuflame_ok(&["record", "-F", "199", "-d", "3", "-p", &pid, "-o", out.to_str().unwrap()], 0);
        drop(child);
        let stacks = read_folded(&out);
        let all = total(&stacks);
        let good: u64 = stacks.iter().filter(|s| correct(s)).map(|s| s.count).sum();
        eprintln!("{:<50} {good:>4} of {all:>4} samples right ({:.1}%)", python.display(), 100.0 * good as f64 / all.max(1) as f64);
        if all < 300 || good * 100 < all * 95 {
            let bad: Vec<Stack> = stacks.iter().filter(|s| !correct(s)).cloned().collect();
            failures.push(format!("{}: {good} of {all} samples right; wrong ones:\n{}", python.display(), describe(&bad)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
