//! Programs whose injection library waits, at CUDA initialisation, for gpuflame to have the unwind
//! tables of the files it just loaded (see cupti/gpuflame_cupti.c): a program launches its first
//! kernels within milliseconds of cuInit, and those launches would otherwise have no stack.
//!
//! gpuflame answers by writing 1 to the word whose address the library gave, once the process's
//! queued tables are in or after [`GIVE_UP`]. That is the one write gpuflame makes into another
//! process, so it is bounded: only into a process that is a target (BPF hears no one else), only
//! 4 bytes, and only inside a writable mapping of gpuflame's own injection library.

use std::io;
use std::time::{Duration, Instant};

use crate::process::read_maps;

/// The environment variable that asks the injection library to wait, and for how long (ms).
pub const WAIT_VAR: &str = "GPUFLAME_CUPTI_WAIT_MS";
/// What a recording asks for. The library stops waiting then in any case.
pub const WAIT_MS: u64 = 1000;
/// gpuflame answers a little before the library gives up, ready or not.
const GIVE_UP: Duration = Duration::from_millis(WAIT_MS * 9 / 10);
/// The status code of a library that waits (STATUS_WAITING in gpuflame_cupti.c).
pub const STATUS_WAITING: i32 = 4;

struct Waiting {
    pid: u32,
    word: u64,
    since: Instant,
}

/// The processes waiting for gpuflame's answer.
#[derive(Default)]
pub struct WaitingProcesses {
    waiting: Vec<Waiting>,
    /// Answers given when the tables were in, and when time ran out first.
    pub answered_ready: u64,
    pub answered_late: u64,
}

impl WaitingProcesses {
    pub fn add(&mut self, pid: u32, word: u64) {
        if word != 0 && !self.waiting.iter().any(|w| w.pid == pid) {
            self.waiting.push(Waiting { pid, word, since: Instant::now() });
        }
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Answers the processes whose tables are settled, or that waited too long.
    pub fn answer(&mut self, settled: impl Fn(u32) -> bool) {
        let (ready, late) = (&mut self.answered_ready, &mut self.answered_late);
        self.waiting.retain(|w| {
            let is_settled = settled(w.pid);
            if !is_settled && w.since.elapsed() < GIVE_UP {
                return true;
            }
            *(if is_settled { &mut *ready } else { &mut *late }) += 1;
            tracing::debug!(pid = w.pid, settled = is_settled, ms = w.since.elapsed().as_millis() as u64, "answering the injection library");
            if let Err(e) = set_ready(w.pid, w.word) {
                tracing::debug!(pid = w.pid, error = %e, "cannot answer the injection library");
            }
            false
        });
    }
}

/// Writes 1 to `word` in `pid`, if the word lies in a writable mapping of the injection library.
fn set_ready(pid: u32, word: u64) -> io::Result<()> {
    let maps = read_maps(pid).ok_or_else(|| io::Error::other(format!("cannot read the mappings of pid {pid}")))?;
    let ours = maps.into_iter().any(|e| {
        let name = e.path.rsplit('/').next().unwrap_or("");
        e.writable && name.starts_with("libgpuflame_cupti") && e.start <= word && word.saturating_add(4) <= e.end
    });
    if !ours || !word.is_multiple_of(4) {
        return Err(io::Error::other(format!("{word:#x} is not in the injection library's data")));
    }
    let one = 1u32.to_ne_bytes();
    let local = libc::iovec { iov_base: one.as_ptr() as *mut libc::c_void, iov_len: one.len() };
    let remote = libc::iovec { iov_base: word as *mut libc::c_void, iov_len: one.len() };
    // SAFETY: both iovecs describe 4 bytes; the local one is a live array, the remote one is
    // only touched by the kernel, in the other process, and checked above.
    let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n == one.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_word_of_the_injection_library_is_written() {
        // This test's own memory: a real, writable word, but not in the injection library.
        let word = Box::new(0u32);
        let addr = &*word as *const u32 as u64;
        let err = set_ready(std::process::id(), addr).unwrap_err();
        assert!(err.to_string().contains("not in the injection library"), "{err}");
        assert_eq!(*word, 0);
    }

    #[test]
    fn a_process_is_answered_once_and_after_the_limit_regardless() {
        let mut w = WaitingProcesses::default();
        w.add(1, 0x1000);
        w.add(1, 0x2000);
        w.add(2, 0);
        assert_eq!(w.waiting.len(), 1, "a second report of the same process and a null word are ignored");
        w.answer(|_| false);
        assert_eq!((w.answered_ready, w.answered_late, w.waiting.len()), (0, 0, 1));
        w.waiting[0].since -= GIVE_UP;
        w.answer(|_| false);
        assert_eq!((w.answered_ready, w.answered_late, w.is_empty()), (0, 1, true));
        w.add(3, 0x1000);
        w.answer(|pid| pid == 3);
        assert_eq!(w.answered_ready, 1);
    }
}
