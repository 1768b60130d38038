//! What to profile: existing processes, or a command that gpuflame starts.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::thread;

use crate::UserError;

/// Fails with a clear message when `pid` is not a running process.
pub fn check_pid(pid: u32) -> Result<(), UserError> {
    if process_alive(pid) {
        Ok(())
    } else {
        Err(UserError(format!("PID {pid} not found")))
    }
}

/// Whether `pid` is a process that still runs (zombies have exited).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may contain spaces.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

fn pipe() -> io::Result<(fs::File, fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((fs::File::from(r), fs::File::from(w)))
}

/// A command started by gpuflame that waits, before exec, until it has been made a target, so
/// that its very first instructions are sampled and nothing of it is filtered out.
pub struct GatedChild {
    pid: u32,
    release: fs::File,
    spawned: thread::JoinHandle<io::Result<Child>>,
}

impl GatedChild {
    pub fn spawn(argv: &[String], env: &[(String, String)]) -> Result<Self, UserError> {
        let (program, args) = argv.split_first().ok_or_else(|| UserError("no command given after --".into()))?;
        let io_err = |e: io::Error| UserError(format!("cannot start {program}: {e}"));
        let (mut pid_r, pid_w) = pipe().map_err(io_err)?;
        let (gate_r, gate_w) = pipe().map_err(io_err)?;
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let (mut pid_w, mut gate_r) = (pid_w, gate_r);
        // SAFETY: the closure runs between fork and exec and only calls getpid, getrlimit,
        // setrlimit, write and read, which are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // The command gets the limit on open files it would have had without gpuflame.
                gpuflame_elfread::restore_fd_limit()?;
                let pid = libc::getpid() as u32;
                pid_w.write_all(&pid.to_ne_bytes())?;
                let mut byte = [0u8; 1];
                let _ = gate_r.read(&mut byte);
                Ok(())
            });
        }
        // std's spawn returns only once exec happened, which the gate holds back: spawn in a
        // thread and learn the pid from the child itself.
        let spawned = thread::spawn(move || cmd.spawn());
        let mut pid = [0u8; 4];
        if pid_r.read_exact(&mut pid).is_err() {
            // The child never ran its pre-exec step: spawn itself failed.
            let err = match spawned.join() {
                Ok(Err(e)) => e,
                _ => io::Error::other("the command could not be started"),
            };
            return Err(io_err(err));
        }
        Ok(GatedChild { pid: u32::from_ne_bytes(pid), release: gate_w, spawned })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Lets the command exec and run.
    pub fn release(mut self) -> Result<Child, UserError> {
        let _ = self.release.write_all(&[1]);
        drop(self.release);
        match self.spawned.join() {
            Ok(Ok(child)) => Ok(child),
            Ok(Err(e)) => Err(UserError(format!("cannot start the command: {e}"))),
            Err(_) => Err(UserError("cannot start the command".into())),
        }
    }
}

/// The exit code a shell would report for this status: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1)
}
