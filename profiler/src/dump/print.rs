//! A dump written for people (groups of threads with one stack each, innermost frame first, as
//! py-spy and debuggers print them) or for scripts (`--format json`).

use std::fmt::Write;

use gpuflame_bpf::ThreadState;
use serde_json::{json, Value};

use super::group::{who, Dump, Frame, Thread};
use crate::frame::FrameKind;

fn seconds(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

/// `waiting 12.3 s in futex`, `running`, `preempted 0.2 s`.
fn state(t: &Thread) -> String {
    match (t.state, t.waited_ns) {
        (ThreadState::Running, _) => "running".into(),
        (ThreadState::Preempted, Some(ns)) => format!("preempted {}", seconds(ns)),
        (s, ns) => {
            let how = if s == ThreadState::Sleeping { "waiting".to_string() } else { format!("waiting ({})", s.name()) };
            let mut out = match ns {
                Some(ns) => format!("{how} {}", seconds(ns)),
                None => how,
            };
            if let Some(w) = &t.waits_in {
                let _ = write!(out, " in {w}");
            }
            out
        }
    }
}

/// A group's states: one when they agree, else a range of waits.
fn states(dump: &Dump, threads: &[usize]) -> String {
    let mut all: Vec<String> = threads.iter().map(|&i| state(&dump.threads[i])).collect();
    all.sort();
    all.dedup();
    if all.len() == 1 {
        return all.remove(0);
    }
    let waits: Vec<u64> = threads.iter().filter_map(|&i| dump.threads[i].waited_ns).collect();
    match (waits.iter().min(), waits.iter().max()) {
        (Some(lo), Some(hi)) if waits.len() == threads.len() => {
            let t = &dump.threads[threads[0]];
            let during = t.waits_in.as_ref().map(|w| format!(" in {w}")).unwrap_or_default();
            format!("waiting {:.1}–{:.1} s{during}", *lo as f64 / 1e9, *hi as f64 / 1e9)
        }
        _ => all.join(" / "),
    }
}

fn frame_text(f: &Frame) -> String {
    match (&f.file, f.line, f.kind) {
        (Some(file), Some(line), FrameKind::Python) => format!("{} ({file}:{line})", f.function),
        (Some(file), None, FrameKind::Python) => format!("{} ({file})", f.function),
        (_, _, FrameKind::Kernel) => format!("{} [kernel]", f.function),
        _ => f.function.clone(),
    }
}

pub fn text(dump: &Dump, elapsed: std::time::Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "gpuflame dump: {} processes, {} threads, {} stacks in {:.2} s (nothing was stopped)",
        dump.processes.len(),
        dump.threads.len(),
        dump.groups.len(),
        elapsed.as_secs_f64()
    );
    out.push('\n');
    let _ = writeln!(out, "{:>8} {:>8}  {:<20} COMMAND", "PID", "THREADS", "LABELS");
    for p in &dump.processes {
        let n = dump.threads.iter().filter(|t| t.pid == p.pid).count();
        let labels = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let command: String = p.command.chars().take(100).collect();
        let _ = writeln!(out, "{:>8} {:>8}  {:<20} {command}", p.pid, n, labels);
    }
    for (g, group) in dump.groups.iter().enumerate() {
        let n = group.threads.len();
        let first = &dump.threads[group.threads[0]];
        let call = first.call.as_ref().map(|c| format!(", in {c}")).unwrap_or_default();
        out.push('\n');
        let _ = writeln!(out, "[{}] {n} thread{} of {}: {}{call}", g + 1, if n == 1 { "" } else { "s" }, who(dump, &group.threads), states(dump, &group.threads));
        let names: Vec<String> = group.threads.iter().take(8).map(|&i| format!("{} {} ({})", dump.threads[i].pid, dump.threads[i].tid, dump.threads[i].name)).collect();
        let more = if n > 8 { format!(" and {} more", n - 8) } else { String::new() };
        let _ = writeln!(out, "    threads: {}{more}", names.join(", "));
        for f in group.frames.iter().rev() {
            let _ = writeln!(out, "      {}", frame_text(f));
        }
    }
    let lost: Vec<&Thread> = dump.threads.iter().filter(|t| t.group.is_none()).collect();
    if !lost.is_empty() {
        out.push('\n');
        let _ = writeln!(out, "{} thread{} without a stack:", lost.len(), if lost.len() == 1 { "" } else { "s" });
        for t in lost {
            let _ = writeln!(out, "    {} {} ({}): {}; {}", t.pid, t.tid, t.name, state(t), t.no_stack.unwrap_or("no stack"));
        }
    }
    out
}

fn frame_json(f: &Frame) -> Value {
    json!({ "function": f.function, "file": f.file, "line": f.line, "kind": f.kind.name() })
}

pub fn json(dump: &Dump, elapsed: std::time::Duration) -> Value {
    let threads: Vec<Value> = dump
        .threads
        .iter()
        .map(|t| {
            json!({
                "pid": t.pid, "tid": t.tid, "name": t.name, "state": t.state.name(),
                "waited_s": t.waited_ns.map(|ns| ns as f64 / 1e9), "waits_in": t.waits_in, "call": t.call,
                "group": t.group.map(|g| g + 1), "no_stack": t.no_stack,
            })
        })
        .collect();
    let processes: Vec<Value> = dump
        .processes
        .iter()
        .map(|p| json!({ "pid": p.pid, "command": p.command, "labels": p.labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect::<serde_json::Map<String, Value>>() }))
        .collect();
    let groups: Vec<Value> = dump
        .groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            json!({
                "group": g + 1,
                "threads": group.threads.iter().map(|&i| json!({ "pid": dump.threads[i].pid, "tid": dump.threads[i].tid })).collect::<Vec<_>>(),
                "call": dump.threads[group.threads[0]].call,
                "frames": group.frames.iter().rev().map(frame_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "elapsed_s": elapsed.as_secs_f64(), "processes": processes, "threads": threads, "groups": groups })
}
