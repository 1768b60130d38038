//! The test set-up holds wherever the repository is cloned: what a test runs as another user
//! (nobody) is handed no path inside the checkout or `target/`, which a private clone (root's
//! home is 0700) closes to that user. Every such test goes through `common::others`, which
//! refuses those paths in any clone, private or not; these tests hold the helpers and the test
//! files to that.

mod common;

use std::path::Path;

use common::others::*;

/// Where a test file runs something as another user by hand, not through `common::others`.
#[test]
fn every_test_runs_others_through_the_one_helper() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = Vec::new();
    for dir in [tests.clone(), tests.join("common")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 20, "the test files were not found under {}", tests.display());
    let mut by_hand = Vec::new();
    for file in &files {
        if file.ends_with("common/others.rs") || file.ends_with("runs_as_others.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["\"setpriv\"", "setpriv --", "--reuid", "runuser"].iter().any(|by_hand| code.contains(by_hand)) {
                by_hand.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(by_hand.is_empty(), "run another user through common::others (as_nobody, setpriv_nobody, sh_as):\n{}", by_hand.join("\n"));
}

/// A file of the checkout is refused, however open the clone is; a copy in an `OpenDir` is
/// taken, and nobody can read it.
#[test]
fn a_path_inside_the_checkout_is_refused_and_a_copy_is_read_by_nobody() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs a command as nobody (setpriv) and must run as root");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/huge_names.py");
    let why = reachable(&script).expect_err("a file of the checkout was taken");
    assert!(why.contains("inside") && why.contains("OpenDir"), "{why}");
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"));
    assert!(reachable(built).is_err(), "target/ was taken");
    let refused = std::panic::catch_unwind(|| as_nobody("/bin/cat", &[script.to_str().unwrap()]));
    assert!(refused.is_err(), "as_nobody handed nobody a file of the checkout");

    let dir = OpenDir::new("gpuflame-others-");
    let copy = dir.copy(&script);
    assert_eq!(reachable(&copy), Ok(()));
    let out = as_nobody("/bin/cat", &[copy.to_str().unwrap()]).output().expect("setpriv (util-linux) is needed");
    assert!(out.status.success(), "nobody could not read {}: {}", copy.display(), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, std::fs::read(&script).unwrap());
}
