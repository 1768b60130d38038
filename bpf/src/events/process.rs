//! Process life-cycle events, from their own ring (`process_events`), for the process tracker.

use crate::pod::read_pod;
use crate::skel::types;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEventKind {
    Exec,
    Exit,
    /// A sample met code the unwinder has no table for: the mappings should be read again.
    Unknown,
    /// A file was mapped executable (dlopen): new code, maybe a CUDA library to hook.
    MmapExec,
    /// A sample needs the unwind table of the file mapped at `addr`.
    NeedTable { addr: u64 },
    /// A new process whose unwinding BPF set up with a copy of its parent's mappings: it runs
    /// the parent's code until it execs or maps its own.
    Fork { parent: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEvent {
    pub pid: u32,
    pub kind: ProcessEventKind,
}

pub(crate) fn decode_process_event(data: &[u8]) -> Option<ProcessEvent> {
    use types::process_event_kind as raw;
    let types::process_event { pid, kind, addr } = read_pod(data)?;
    // The C enum's names, from the object's BTF, as for the unwind status.
    let kind = [
        (raw::PROCESS_EXEC, ProcessEventKind::Exec),
        (raw::PROCESS_EXIT, ProcessEventKind::Exit),
        (raw::PROCESS_UNKNOWN, ProcessEventKind::Unknown),
        (raw::PROCESS_MMAP_EXEC, ProcessEventKind::MmapExec),
        (raw::PROCESS_NEED_TABLE, ProcessEventKind::NeedTable { addr }),
        (raw::PROCESS_FORK, ProcessEventKind::Fork { parent: u32::try_from(addr).unwrap_or(0) }),
    ]
    .into_iter()
    .find(|(r, _)| r.0 == kind)?
    .1;
    // A fork from a parent that no pid can be is no record to act on.
    if kind == (ProcessEventKind::Fork { parent: 0 }) {
        return None;
    }
    Some(ProcessEvent { pid, kind })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::as_bytes;

    #[test]
    fn decodes_process_events() {
        let e = types::process_event { pid: 7, kind: 1, addr: 0 };
        assert_eq!(decode_process_event(as_bytes(&e)), Some(ProcessEvent { pid: 7, kind: ProcessEventKind::Exit }));
        let e = types::process_event { pid: 7, kind: 4, addr: 0x4000 };
        assert_eq!(decode_process_event(as_bytes(&e)), Some(ProcessEvent { pid: 7, kind: ProcessEventKind::NeedTable { addr: 0x4000 } }));
        let e = types::process_event { pid: 8, kind: 5, addr: 7 };
        assert_eq!(decode_process_event(as_bytes(&e)), Some(ProcessEvent { pid: 8, kind: ProcessEventKind::Fork { parent: 7 } }));
        let e = types::process_event { pid: 8, kind: 5, addr: 1 << 40 };
        assert_eq!(decode_process_event(as_bytes(&e)), None, "no such pid");
        let e = types::process_event { pid: 7, kind: 9, addr: 0 };
        assert_eq!(decode_process_event(as_bytes(&e)), None);
    }
}
