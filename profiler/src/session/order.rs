//! The order in which a batch of records is handled: a new process's reports before its records.

use std::collections::HashMap;

use gpuflame_bpf::{Event, Sample};

/// The header of a record with a stack (samples and CUDA calls; None for the rest).
pub(super) fn record_sample(event: &Event) -> Option<&Sample> {
    match event {
        Event::Sample(s) => Some(s),
        Event::OffCpu(o) => Some(&o.sample),
        Event::Cuda(c) => Some(&c.sample),
        Event::CuptiLaunch(l) => Some(&l.sample),
        Event::HookedStack(h) => Some(&h.sample),
        _ => None,
    }
}

/// The process whose record an event is.
fn record_pid(event: &Event) -> Option<u32> {
    record_sample(event).map(|s| s.pid)
}

/// A batch with the exec and mmap reports of a process the tracker does not know yet moved
/// before its first record. They come from the other ring buffer, read after the samples', so a
/// program that runs out of memory and exits within one batch had its stack placed before its
/// maps were read, and then it was gone (the OOM test named nothing 2 runs in 5 on a loaded
/// machine). A known process keeps the order: its records may be from before an exec.
pub(super) fn reports_first_for_new_processes(events: Vec<Event>, known: impl Fn(u32) -> bool) -> Vec<Event> {
    let mut reports: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Event::Process(p) = e {
            if !known(p.pid) {
                reports.entry(p.pid).or_default().push(i);
            }
        }
    }
    if reports.is_empty() {
        return events;
    }
    let mut slots: Vec<Option<Event>> = events.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(slots.len());
    for i in 0..slots.len() {
        let pulled = slots[i].as_ref().and_then(record_pid).and_then(|pid| reports.remove(&pid));
        for j in pulled.into_iter().flatten() {
            out.extend(slots[j].take());
        }
        out.extend(slots[i].take());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuflame_bpf::{ProcessEvent, ProcessEventKind, StackRead, UnwindStatus};

    fn sample(pid: u32) -> Event {
        Event::Sample(Sample {
            timestamp_ns: 0,
            pid,
            tid: pid,
            cpu: 0,
            comm: String::new(),
            kernel_stack: StackRead::Frames(Vec::new()),
            user_stack: Vec::new(),
            unwind: UnwindStatus::EndOfStack,
            leaf_file: None,
            forked_from: None,
            by_file: false,
            stack_copy: None,
        })
    }

    fn report(pid: u32, kind: ProcessEventKind) -> Event {
        Event::Process(ProcessEvent { pid, kind })
    }

    fn describe(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Sample(s) => format!("sample {}", s.pid),
                Event::Process(p) => format!("{:?} {}", p.kind, p.pid),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn reports_of_a_new_process_come_before_its_first_record() {
        let batch = vec![sample(7), sample(9), sample(7), report(9, ProcessEventKind::MmapExec), report(7, ProcessEventKind::Exec), report(7, ProcessEventKind::MmapExec)];
        // 9 is known: its records keep their order against its reports.
        let out = reports_first_for_new_processes(batch, |pid| pid == 9);
        assert_eq!(describe(&out), ["Exec 7", "MmapExec 7", "sample 7", "sample 9", "sample 7", "MmapExec 9"]);
    }
}

