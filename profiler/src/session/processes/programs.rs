//! Which program each process runs, as far as the records tell: the registry's one watch for an
//! exec whose event came late or was lost. Records and process events come by different ring
//! buffers, so a new program's first records can be read before its exec event, or with no event
//! at all when the ring was full; a new name of its main thread is then the sign. The registry
//! announces an exec, from the event or from this, and what keeps anything of the old program
//! (the rank reader, the stacks' caches) is told by it; none of them watches names itself.

use crate::workload::rank::{RankRead, RankReader};

/// The name of a process's main thread, as its records last showed it (kept in the registry's
/// record of the process).
#[derive(Debug, Default)]
pub struct MainThreadName(Option<String>);

impl MainThreadName {
    /// A record of thread `tid` (named `comm`) of process `pid`: whether it shows a new program,
    /// a main thread that was named otherwise before. Other threads have names of their own and
    /// tell nothing; the first name seen is no news.
    pub fn record(&mut self, pid: u32, tid: u32, comm: &str) -> bool {
        if tid != pid || pid == 0 {
            return false;
        }
        // Every record comes here: the name is copied only when it is news.
        match &mut self.0 {
            Some(name) if name == comm => false,
            Some(name) => {
                comm.clone_into(name);
                true
            }
            None => {
                self.0 = Some(comm.to_string());
                false
            }
        }
    }

    /// The process exec'd (its event), or exited: its next name is no news.
    pub fn forget(&mut self) {
        self.0 = None;
    }
}

/// A record's identity, as the registry reads it: whether it shows a new program, and the
/// process's labels when they are to be set now. A new program is read again at once; any other
/// record reads its process once.
pub fn identify(name: &mut MainThreadName, rank: &mut RankRead, ranks: &mut RankReader, pid: u32, tid: u32, comm: &str) -> (bool, Option<Vec<(String, String)>>) {
    match name.record(pid, tid, comm) {
        true => (true, ranks.exec(pid, rank)),
        false => (false, ranks.on_record(pid, rank)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::environ::tests::sleeper;
    use crate::workload::rank::{RankLabels, RankStats};

    fn labels(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_process_is_read_once_and_again_after_exec() {
        let mut child = sleeper(&[("RANK", "3")]);
        let pid = child.id();
        let mut reader = RankReader::new(RankLabels::default());
        let (mut name, mut rank) = (MainThreadName::default(), RankRead::default());
        let record = |name: &mut MainThreadName, rank: &mut RankRead, reader: &mut RankReader, tid: u32, comm: &str| identify(name, rank, reader, pid, tid, comm).1;
        // First seen in another thread's record: read; the main thread's name is learnt after.
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid + 1, "worker"), Some(labels(&[("rank", "3")])));
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid, "sleep"), None);
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid + 1, "other"), None);
        // A new name of its main thread: read again. An exec report (the registry forgets the
        // name, and reads): read at once, not at the next record.
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid, "python3"), Some(labels(&[("rank", "3")])));
        name.forget();
        assert_eq!(reader.exec(pid, &mut rank), Some(labels(&[("rank", "3")])));
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid + 1, "worker"), None);
        assert_eq!(record(&mut name, &mut rank, &mut reader, pid, "python3"), None);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(reader.stats().environments_read, 3);
        // Turned off: nothing is read.
        let mut off = RankReader::new(RankLabels::none());
        assert_eq!(identify(&mut MainThreadName::default(), &mut RankRead::default(), &mut off, pid, pid, "sleep").1, None);
        assert_eq!(off.stats(), RankStats::default());
    }

    #[test]
    fn a_new_name_of_the_main_thread_is_a_new_program_and_other_threads_are_not() {
        let mut names = MainThreadName::default();
        // First seen in another thread's record, then the main thread's: nothing new yet.
        assert!(!names.record(10, 11, "worker"));
        assert!(!names.record(10, 10, "sleep"));
        assert!(!names.record(10, 11, "other"));
        assert!(!names.record(10, 10, "sleep"));
        // A new name of its main thread: a new program, told once.
        assert!(names.record(10, 10, "python3"));
        assert!(!names.record(10, 10, "python3"));
        // Its exec event was heard: the new program's first name is no news.
        names.forget();
        assert!(!names.record(10, 10, "torchrun"));
        assert!(!MainThreadName::default().record(0, 0, "swapper/0"));
    }
}
