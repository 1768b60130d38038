//! A few variables of a process's environment (`/proc/PID/environ`), read without holding it.
//!
//! An environment is whatever the process's parent put there: usually a few KiB, but a user who
//! raises the stack rlimit can exec with tens of MiB of it, and any value may hold any byte but
//! NUL. So it is read in chunks and only the variables asked for are kept, each to a bounded
//! prefix; reading stops at a total cap, and says so.

use std::fs::File;
use std::io::{self, Read};

/// Bytes read from the file at a time.
const CHUNK: usize = 64 << 10;
/// The longest name that is compared with the names asked for; longer names are never wanted.
pub const MAX_NAME: usize = 128;
/// Bytes of an environment read at most: four times the 2 MiB that the default 8 MiB stack
/// rlimit allows to exec (a quarter of it), for users who raise it.
pub const MAX_TOTAL: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EnvironError {
    #[error("reading /proc/{pid}/environ: {source}")]
    Read { pid: u32, source: io::Error },
}

/// One variable's value: its first `max_value` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub bytes: Vec<u8>,
    /// The value went on past the bytes kept.
    pub longer: bool,
}

/// The variables asked for that the environment has (the first of each name, as getenv finds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environ {
    vars: Vec<(String, Value)>,
    /// Reading stopped at [`MAX_TOTAL`] bytes before the environment's end; a variable after it
    /// was not seen.
    pub cut: bool,
}

impl Environ {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.vars.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// The variables `wanted` of process `pid`, each value cut to `max_value` bytes.
pub fn read(pid: u32, wanted: &[&str], max_value: usize) -> Result<Environ, EnvironError> {
    let err = |source| EnvironError::Read { pid, source };
    let file = File::open(format!("/proc/{pid}/environ")).map_err(err)?;
    scan(file, wanted, max_value, MAX_TOTAL).map_err(err)
}

/// Where the scan is within the current `NAME=value\0` entry.
enum State {
    /// In the name: its bytes so far, or None once it is longer than any wanted name.
    Name(Option<Vec<u8>>),
    /// In the value of a wanted variable, not seen before: its name and what is kept.
    Value(String, Value),
    /// In anything else, up to the next NUL.
    Skip,
}

/// [`read`] of any reader, with the total cap given (for tests).
pub(crate) fn scan(mut input: impl Read, wanted: &[&str], max_value: usize, max_total: usize) -> io::Result<Environ> {
    let mut env = Environ::default();
    let mut chunk = vec![0u8; CHUNK];
    let mut state = State::Name(Some(Vec::new()));
    let mut total = 0;
    loop {
        if env.vars.len() == wanted.len() {
            // All found: the rest cannot change what getenv would say.
            return Ok(env);
        }
        let room = max_total - total;
        if room == 0 {
            env.cut = input.read(&mut [0u8])? > 0;
            break;
        }
        let n = match input.read(&mut chunk[..CHUNK.min(room)]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        total += n;
        for &b in &chunk[..n] {
            state = step(state, b, wanted, max_value, &mut env);
        }
    }
    // An environment ends with NUL; one cut short, or written without it, ends here. A value
    // cut at the cap is incomplete and left out.
    if !env.cut {
        step(state, 0, wanted, max_value, &mut env);
    }
    Ok(env)
}

fn step(state: State, b: u8, wanted: &[&str], max_value: usize, env: &mut Environ) -> State {
    match (state, b) {
        (State::Name(_), 0) => State::Name(Some(Vec::new())),
        (State::Name(Some(name)), b'=') => match wanted.iter().find(|w| w.as_bytes() == name) {
            Some(w) if env.get(w).is_none() => State::Value(w.to_string(), Value { bytes: Vec::new(), longer: false }),
            _ => State::Skip,
        },
        (State::Name(None), b'=') => State::Skip,
        (State::Name(Some(mut name)), b) => {
            if name.len() < MAX_NAME {
                name.push(b);
                State::Name(Some(name))
            } else {
                State::Name(None)
            }
        }
        (State::Name(None), _) => State::Name(None),
        (State::Value(name, value), 0) => {
            env.vars.push((name, value));
            State::Name(Some(Vec::new()))
        }
        (State::Value(name, mut value), b) => {
            if value.bytes.len() < max_value {
                value.bytes.push(b);
            } else {
                value.longer = true;
            }
            State::Value(name, value)
        }
        (State::Skip, 0) => State::Name(Some(Vec::new())),
        (State::Skip, _) => State::Skip,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

    fn value(s: &str) -> Value {
        Value { bytes: s.as_bytes().to_vec(), longer: false }
    }

    #[test]
    fn only_the_wanted_variables_are_kept_the_first_of_each() {
        let raw = b"PATH=/bin\0RANK=3\0X=1\0RANK=9\0NOEQUALS\0LOCAL_RANK=\0WORLD_SIZE=4";
        let env = scan(&raw[..], &["RANK", "LOCAL_RANK", "WORLD_SIZE", "ABSENT"], 16, MAX_TOTAL).unwrap();
        assert_eq!(env.get("RANK"), Some(&value("3")));
        assert_eq!(env.get("LOCAL_RANK"), Some(&value("")));
        assert_eq!(env.get("WORLD_SIZE"), Some(&value("4")), "the last variable needs no NUL");
        assert_eq!(env.get("PATH"), None);
        assert_eq!(env.get("ABSENT"), None);
        assert!(!env.cut);
    }

    #[test]
    fn values_are_cut_and_names_longer_than_any_wanted_never_match() {
        let long_name = format!("{}RANK", "A".repeat(MAX_NAME));
        let raw = format!("{long_name}=1\0RANK={}\0", "7".repeat(40));
        let env = scan(raw.as_bytes(), &["RANK", &long_name], 8, MAX_TOTAL).unwrap();
        assert_eq!(env.get("RANK"), Some(&Value { bytes: b"77777777".to_vec(), longer: true }));
        assert_eq!(env.get(&long_name), None);
    }

    #[test]
    fn reading_stops_at_the_cap_and_says_so() {
        let raw = format!("{}\0RANK=1\0", "F=".repeat(100));
        let env = scan(raw.as_bytes(), &["RANK"], 8, 100).unwrap();
        assert!(env.cut && env.get("RANK").is_none(), "{env:?}");
        // A value that the cap cuts in its middle is not taken as if it ended there.
        let env = scan(&b"RANK=12345"[..], &["RANK"], 8, 7).unwrap();
        assert!(env.cut && env.get("RANK").is_none(), "{env:?}");
        // Exactly at the cap is not cut.
        let env = scan(&b"RANK=1\0"[..], &["RANK"], 8, 7).unwrap();
        assert!(!env.cut && env.get("RANK") == Some(&value("1")), "{env:?}");
    }

    /// `sleep` with `envs`, once its environment can be read (exec sets it up after the new
    /// program's memory is in place, a moment after `spawn` returns).
    pub(crate) fn sleeper(envs: &[(&str, &str)]) -> std::process::Child {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut child = Command::new("sleep").arg("30").env_clear().env("PATH", path).envs(envs.iter().copied()).env("READY", "1").spawn().expect("sleep");
        let ready = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            read(child.id(), &["READY"], 1).is_ok_and(|e| e.get("READY").is_some())
        });
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the environment of sleep never showed");
        }
        child
    }

    #[test]
    fn a_variable_after_a_mebibyte_of_others_is_found() {
        // Command orders the environment by name: the fillers come before RANK.
        let filler = "x".repeat(64 << 10);
        let names: Vec<String> = (0..16).map(|i| format!("A_FILLER_{i:02}")).collect();
        let mut envs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), filler.as_str())).collect();
        envs.push(("RANK", "5"));
        let mut child = sleeper(&envs);
        let env = read(child.id(), &["RANK", "A_FILLER_03"], 256);
        let _ = child.kill();
        let _ = child.wait();
        let env = env.unwrap();
        assert_eq!(env.get("RANK"), Some(&value("5")));
        assert_eq!(env.get("A_FILLER_03").map(|v| (v.bytes.len(), v.longer)), Some((256, true)));
        assert!(!env.cut);
    }

    #[test]
    fn a_process_that_is_gone_is_an_error() {
        let mut child = Command::new("true").spawn().expect("true");
        let pid = child.id();
        child.wait().expect("wait");
        let e = read(pid, &["RANK"], 16).unwrap_err();
        assert!(e.to_string().contains(&format!("/proc/{pid}/environ")), "{e}");
    }
}
