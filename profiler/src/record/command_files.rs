//! The files a command started by `record` maps first: its executable (for a script, the
//! interpreter of its `#!` line; for `env`, the command it runs), the dynamic loader that the
//! executable names and the libraries that loader links it with, as the loader itself lists them
//! (`ld.so --list`, what ldd runs: it maps them and stops before any of their code runs). Their
//! unwind tables are built while the command waits to exec, so that its stacks are whole from its
//! first sample.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuflame_elfread::{open_regular, ElfFile};

/// ELF program header type of the loader's path.
const PT_INTERP: u32 = 3;
/// How long the loader may take to list the libraries.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);
/// `#!` lines followed, at most (a script run by a script's interpreter...).
const MAX_SCRIPT_DEPTH: usize = 4;

/// The files `argv` will map first, executable first; empty when it is not found. `env`: what
/// the command gets on top of gpuflame's environment.
pub fn command_files(argv: &[String], env: &[(String, String)]) -> Vec<PathBuf> {
    let Some(exe) = executable(argv, env, 0) else { return Vec::new() };
    let mut files = vec![exe.clone()];
    let Some(loader) = loader_of(&exe) else { return files };
    files.push(loader.clone());
    for lib in listed_libraries(&loader, &exe, env) {
        if !files.contains(&lib) {
            files.push(lib);
        }
    }
    files
}

/// The ELF file that `argv` runs.
fn executable(argv: &[String], env: &[(String, String)], depth: usize) -> Option<PathBuf> {
    let (program, args) = argv.split_first()?;
    if Path::new(program).file_name().is_some_and(|n| n == "env") {
        return executable(&env_command(args), env, depth);
    }
    let path = on_path(program, env)?;
    let mut head = [0u8; 256];
    let n = open_regular(&path).ok()?.read(&mut head).ok()?;
    let Some(line) = head[..n].strip_prefix(b"#!") else { return Some(path) };
    if depth >= MAX_SCRIPT_DEPTH {
        return None;
    }
    let line = String::from_utf8_lossy(line.split(|&b| b == b'\n').next()?).into_owned();
    let interpreter: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    executable(&interpreter, env, depth + 1)
}

/// The command that `env ARGS` runs: the first argument that is no option nor assignment.
fn env_command(args: &[String]) -> Vec<String> {
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        match arg.as_str() {
            // Options with a value of their own.
            "-u" | "--unset" | "-C" | "--chdir" => i += 2,
            // `-S` splits a string into arguments: not worth following.
            "-S" | "--split-string" => return Vec::new(),
            "--" => return args[i + 1..].to_vec(),
            a if a.starts_with('-') || a.contains('=') => i += 1,
            _ => return args[i..].to_vec(),
        }
    }
    Vec::new()
}

/// `program` as the command's exec will find it: a path, or the first match on its PATH.
fn on_path(program: &str, env: &[(String, String)]) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).or_else(|| std::env::var("PATH").ok())?;
    path.split(':').map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(program)).find(|p| p.is_file())
}

/// The dynamic loader the executable names (PT_INTERP); none for a static executable.
fn loader_of(exe: &Path) -> Option<PathBuf> {
    let elf = ElfFile::parse(open_regular(exe).ok()?).ok()?;
    let interp = elf.segments().iter().find(|s| s.kind == PT_INTERP)?;
    let bytes = elf.read(interp.offset, interp.file_size, "PT_INTERP", 4096).ok()?;
    let path = bytes.split(|&b| b == 0).next()?;
    Some(PathBuf::from(String::from_utf8_lossy(path).into_owned()))
}

/// The libraries `loader --list exe` says the executable gets, with the command's environment
/// (LD_LIBRARY_PATH, LD_PRELOAD).
fn listed_libraries(loader: &Path, exe: &Path, env: &[(String, String)]) -> Vec<PathBuf> {
    let child = Command::new(loader)
        .arg("--list")
        .arg(exe)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(loader = %loader.display(), error = %e, "cannot list the command's libraries");
            return Vec::new();
        }
    };
    // Read as it comes: a listing longer than the pipe holds would block the loader.
    let reader = child.stdout.take().map(|stdout| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stdout.take(1 << 20).read_to_string(&mut out);
            out
        })
    });
    let deadline = Instant::now() + LIST_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::debug!(loader = %loader.display(), "listing the command's libraries took too long");
                return Vec::new();
            }
        }
    }
    let out = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    parse_list(&out)
}

/// The paths in the loader's listing: `\tname => /path (0x…)` or `\t/path (0x…)`.
fn parse_list(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = line.split_once(" => ").map_or(line, |(_, p)| p);
            let path = path.rsplit_once(" (0x").map_or(path, |(p, _)| p);
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_loaders_listing() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibpython3.11.so.1.0 => /opt/py/lib/libpython3.11.so.1.0 (0x00007f5e)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f5d)\n\tlibmissing.so => not found\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f5f)\n";
        let paths: Vec<PathBuf> = ["/opt/py/lib/libpython3.11.so.1.0", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"].iter().map(PathBuf::from).collect();
        assert_eq!(parse_list(text), paths);
    }

    #[test]
    fn env_runs_the_first_word_that_is_no_option_nor_assignment() {
        let args = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(env_command(&args("-i A=1 -u B python3 x.py")), args("python3 x.py"));
        assert_eq!(env_command(&args("A=1 -- sh -c true")), args("sh -c true"));
        assert!(env_command(&args("-S python3 x")).is_empty());
    }

    #[test]
    fn a_dynamic_program_brings_its_loader_and_libc() {
        let files = command_files(&["sh".to_string(), "-c".to_string(), "true".to_string()], &[]);
        let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        assert!(names.first().is_some_and(|n| n.ends_with("/sh")), "{names:?}");
        assert!(names.iter().any(|n| n.contains("ld-linux")), "{names:?}");
        assert!(names.iter().any(|n| n.contains("libc.so")), "{names:?}");
    }
}
