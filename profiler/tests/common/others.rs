//! What a test runs as another user (nobody) gets its files from a directory that user can reach.
//!
//! A user's clone may be closed to everyone else: root's home is 0700 on Debian and Ubuntu, and
//! so is a directory made by `mktemp -d`. A path inside the checkout or its `target/` works for
//! nobody only where the clone happens to be open, so such a test passes in one clone and fails
//! in another. Every test that runs something as nobody goes through `as_nobody`,
//! `setpriv_nobody` or `sh_as`, which refuse any path inside the checkout or `target/`, wherever
//! it is, and any path that nobody cannot reach by its modes; files come from an `OpenDir`.
//! `tests/runs_as_others.rs` holds the tests to this.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// setpriv's arguments for the unprivileged party.
pub const NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

/// A temporary directory outside the checkout (in the system's temp directory) that every user
/// can reach: 0755 by default, or 0777 / 0o1777 for a test where nobody writes into it.
pub struct OpenDir(tempfile::TempDir);

impl OpenDir {
    pub fn new(prefix: &str) -> OpenDir {
        OpenDir::with_mode(prefix, 0o755)
    }

    pub fn with_mode(prefix: &str, mode: u32) -> OpenDir {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().expect("making a temporary directory");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let open = OpenDir(dir);
        if let Err(why) = reachable(open.path()) {
            panic!("the temporary directory {} cannot be handed to another user ({why}); is TMPDIR inside a private directory?", open.path().display());
        }
        open
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// A copy of `file` (a test program or script of the checkout, a binary of `target/`) that
    /// every user can read and run. A hard link where the file system allows it: the link is
    /// reached through this directory, and a big binary is not copied.
    pub fn copy(&self, file: &Path) -> PathBuf {
        let name = file.file_name().unwrap_or_else(|| panic!("{} has no file name", file.display()));
        let to = self.path().join(name);
        if std::fs::hard_link(file, &to).is_err() {
            std::fs::copy(file, &to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", file.display(), to.display()));
        }
        let mode = std::fs::metadata(&to).unwrap().permissions().mode();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode | 0o444 | if mode & 0o100 != 0 { 0o111 } else { 0 })).unwrap();
        to
    }
}

/// The checkout (the workspace root) and the target directory that holds this build.
fn private_roots() -> [PathBuf; 2] {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    // CARGO_TARGET_TMPDIR is TARGET/tmp, wherever CARGO_TARGET_DIR put TARGET.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().to_path_buf();
    [checkout, target]
}

/// Why nobody could not reach `path` in every clone, if it could not: a path inside the checkout
/// or `target/`, or a directory on the way that others cannot traverse. The file's own mode is the
/// test's to choose (a victim file is meant to be closed to nobody).
pub fn reachable(path: &Path) -> Result<(), String> {
    let canonical = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
    for root in private_roots() {
        let root = root.canonicalize().unwrap_or(root);
        if canonical.starts_with(&root) {
            return Err(format!(
                "{} is inside {}, which a user's clone may keep private (root's home is 0700): hand it over as a copy in an OpenDir",
                path.display(),
                root.display()
            ));
        }
    }
    let mut dir = canonical.parent();
    while let Some(d) = dir {
        let mode = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?.permissions().mode();
        if mode & 0o001 == 0 {
            return Err(format!("{} on the way to {} is mode {:o}: other users cannot traverse it", d.display(), path.display(), mode & 0o7777));
        }
        dir = d.parent();
    }
    Ok(())
}

/// Every argument that names an existing file by its absolute path is one nobody can reach.
fn check_paths<'a>(what: &str, words: impl IntoIterator<Item = &'a OsStr>) {
    for word in words {
        let path = Path::new(word);
        if path.is_absolute() && path.exists() {
            if let Err(why) = reachable(path) {
                panic!("{what} is handed {why}");
            }
        }
    }
}

/// `setpriv NOBODY program args…`: `program` and every path among `args` checked first.
pub fn as_nobody<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Command {
    let words: Vec<&OsStr> = std::iter::once(program.as_ref()).chain(args.iter().map(AsRef::as_ref)).collect();
    check_paths("a command run as nobody", words.iter().copied());
    let mut command = Command::new("setpriv");
    command.args(NOBODY).args(&words);
    command
}

/// `setpriv NOBODY…` as words, for a command line that gpuflame or a shell runs (join them with
/// spaces for a script), once `paths` (what that command is handed) are checked.
pub fn setpriv_nobody(paths: &[&Path]) -> [&'static str; 4] {
    check_paths("a command run as nobody", paths.iter().map(|p| p.as_os_str()));
    ["setpriv", NOBODY[0], NOBODY[1], NOBODY[2]]
}

/// Runs a shell script as `user` (setpriv's arguments: `NOBODY`, or none for root) and fails the
/// test unless it succeeds. The script's absolute paths are checked when it runs as another user.
pub fn sh_as(user: &[&str], script: &str) {
    if !user.is_empty() {
        let words = script.split(|c: char| c.is_whitespace() || c == '\'' || c == '"');
        check_paths("a script run as another user", words.map(OsStr::new));
    }
    let out = Command::new("setpriv").args(user).args(["sh", "-c", script]).output().expect("setpriv (util-linux) is needed");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}
