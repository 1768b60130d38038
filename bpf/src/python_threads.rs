//! The Python walker of python_walk.h in Rust, for a thread that waits and is read from user space
//! (its stack unwound from a copy, session/waiting.rs): its Python frames from its thread state,
//! each eval-loop call's ended by a call mark, as BPF emits them after a gap for a copied stack
//! (`py_emit_rest`), so that the late walk's merge puts each call's frames in place of its
//! eval-loop frame. Reads go through the process's memory, which the process can change under
//! the reads: every chain is bounded.

use std::fs::File;
use std::os::unix::fs::FileExt;

use libbpf_rs::MapCore;
use libbpf_rs::MapFlags;

use crate::events::{python_name_tag, UserFrame};
use crate::pod::read_pod;
use crate::programs::BpfPrograms;
use crate::skel::types;

/// Thread states read at most (two reads each): more threads than a Python process runs, and a
/// bound on what a list changed under the reads, or made so on purpose, costs.
const MAX_THREAD_STATES: usize = 8192;
/// Python frames a walk emits at most, as a BPF sample holds (two slots each).
const MAX_FRAMES: usize = 255;
const NO_OFFSET: u16 = u16::MAX;
/// A user-space address: what a code object's address must be (PY_ADDR_MASK, below the name's tag).
const ADDR_MASK: u64 = (1 << types::frame_tag::FRAME_TAG_NAME_SHIFT.0) - 1;

struct Memory<'f>(&'f File);

impl Memory<'_> {
    fn word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u64::from_ne_bytes(b))
    }

    fn u32(&self, addr: u64) -> Option<u32> {
        let mut b = [0u8; 4];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(u32::from_ne_bytes(b))
    }

    fn byte(&self, addr: u64) -> Option<u8> {
        let mut b = [0u8; 1];
        self.0.read_exact_at(&mut b, addr).ok()?;
        Some(b[0])
    }
}

/// A process's Python, for reading its threads' frames: its interpreter's layout and its thread
/// states by pthread_t, read once (the list is walked once, not once per thread: a process of a
/// thousand threads has a thousand states in it).
pub struct PythonThreads {
    p: types::py_process,
    states: std::collections::HashMap<u64, u64>,
}

impl BpfPrograms {
    /// The Python of `pid` as the walker has it, with its thread states read from `memory` (its
    /// /proc/PID/mem); None when it runs no Python the walker knows.
    pub fn python_threads(&self, pid: u32, memory: &File) -> Option<PythonThreads> {
        let bytes = self.skel().maps.python_processes.lookup(&pid.to_ne_bytes(), MapFlags::ANY).ok()??;
        let p: types::py_process = read_pod(&bytes)?;
        let states = thread_states(&p, &Memory(memory));
        Some(PythonThreads { p, states })
    }
}

impl PythonThreads {
    /// The Python frames of the thread whose pthread_t is `fsbase`: a gap mark, then its frames
    /// innermost first, each eval-loop call's ended by a call mark. None when the thread has no
    /// thread state or frame.
    pub fn frames(&self, fsbase: u64, memory: &File) -> Option<Vec<UserFrame>> {
        let m = Memory(memory);
        let ts = *self.states.get(&fsbase)?;
        walk_thread(&self.p, current_frame(&self.p, ts, &m)?, &m)
    }
}

fn at(base: u64, offset: u16) -> u64 {
    base.wrapping_add(u64::from(offset))
}

/// The interpreter's thread states, by thread id (pthread_t).
fn thread_states(p: &types::py_process, m: &Memory<'_>) -> std::collections::HashMap<u64, u64> {
    let o = &p.o;
    let mut out = std::collections::HashMap::new();
    let Some(interp) = m.word(at(p.runtime, o.runtime_interpreters_head)).filter(|&a| a != 0) else { return out };
    let mut ts = m.word(at(interp, o.interp_threads_head)).unwrap_or(0);
    while ts != 0 && out.len() < MAX_THREAD_STATES {
        let Some(id) = m.word(at(ts, o.tstate_thread_id)) else { break };
        if out.insert(id, ts).is_some() {
            break; // a cycle: the list is being changed under the reads
        }
        ts = m.word(at(ts, o.tstate_next)).unwrap_or(0);
    }
    out
}

/// py_current_frame, from the thread's state.
fn current_frame(p: &types::py_process, ts: u64, m: &Memory<'_>) -> Option<u64> {
    let o = &p.o;
    let mut frame = m.word(at(ts, o.tstate_frame))?;
    if o.cframe_current_frame != NO_OFFSET && frame != 0 {
        frame = m.word(at(frame, o.cframe_current_frame))?;
    }
    (frame != 0).then_some(frame)
}

/// py_emit_frame: the frame's code object, its name's tag, its first line and last instruction.
fn python_frame(o: &types::py_offsets, f: u64, code: u64, m: &Memory<'_>) -> UserFrame {
    let object_frames = o.frame_kind == types::py_frame_kind::PY_FRAME_OBJECT.0 as u8;
    let lasti = if object_frames {
        m.u32(at(f, o.frame_instr)).unwrap_or(0)
    } else {
        match (m.word(at(f, o.frame_instr)), o.code_adaptive) {
            (Some(instr), adaptive) if adaptive != NO_OFFSET && instr >= at(code, adaptive) => ((instr - at(code, adaptive)) / 2) as u32,
            _ => 0,
        }
    };
    let first_line = m.u32(at(code, o.code_firstlineno)).unwrap_or(0);
    let name_tag = m
        .word(at(code, o.code_name))
        .filter(|&n| n != 0)
        .and_then(|name| Some(python_name_tag(m.word(name + 16)? ^ m.word(name + 24)?)))
        .unwrap_or(0);
    UserFrame::Python { code, name_tag, first_line, lasti }
}

/// py_emit_rest with the calls marked: every frame of the thread, after a gap mark.
fn walk_thread(p: &types::py_process, frame: u64, m: &Memory<'_>) -> Option<Vec<UserFrame>> {
    let o = &p.o;
    let mut f = frame;
    let kind = u32::from(o.frame_kind);
    let marked = kind != types::py_frame_kind::PY_FRAME_OBJECT.0;
    let mut out = vec![UserFrame::Gap];
    let mut emitted = 0;
    let mut steps = 0;
    while f != 0 && emitted < MAX_FRAMES && steps < 4 * MAX_FRAMES {
        steps += 1;
        let Some(previous) = m.word(at(f, o.frame_previous)) else { break };
        let marker = if marked { m.byte(at(f, o.frame_entry)).unwrap_or(0) } else { 0 };
        if kind == types::py_frame_kind::PY_FRAME_OWNER.0 && marker == o.owner_cstack {
            out.push(UserFrame::CallEnd { shim: f });
            f = previous;
            continue;
        }
        if let Some(mut code) = m.word(at(f, o.frame_code)) {
            if o.code_tagged != 0 {
                code &= !7;
            }
            if code != 0 && code & !ADDR_MASK == 0 {
                out.push(python_frame(o, f, code, m));
                emitted += 1;
            }
        }
        f = previous;
        if kind == types::py_frame_kind::PY_FRAME_OBJECT.0 || (kind == types::py_frame_kind::PY_FRAME_IS_ENTRY.0 && marker != 0) {
            out.push(UserFrame::CallEnd { shim: 0 });
        }
    }
    (emitted > 0).then_some(out)
}
