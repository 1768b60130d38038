//! The struct offsets the Python walker needs, per interpreter version.

use crate::tables::TABLES;

/// How the frames of one `_PyEval_EvalFrameDefault` call are told apart from its caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameEntry {
    /// 3.8–3.10: one PyFrameObject per evaluation-loop call.
    FrameObject,
    /// 3.11: `_PyInterpreterFrame.is_entry` marks the first frame of a call.
    IsEntry { offset: usize },
    /// 3.12+: a shim frame owned by the C stack (`owner == cstack`) sits below each call's frames.
    Owner { offset: usize, cstack: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyOffsets {
    pub version: (u8, u8),
    pub runtime_interpreters_head: usize,
    pub interp_threads_head: usize,
    pub tstate_next: usize,
    /// `thread_id`: the thread's pthread_t, which on x86-64 glibc is its TLS base (fs).
    pub tstate_thread_id: usize,
    /// `frame` (≤3.10), `cframe` (3.11, 3.12) or `current_frame` (3.13+).
    pub tstate_frame: usize,
    /// 3.11 and 3.12: `_PyCFrame.current_frame`, behind `tstate_frame`.
    pub cframe_current_frame: Option<usize>,
    pub frame_previous: usize,
    /// `f_code`, or `f_executable` (3.13+; a tagged stack reference in 3.14).
    pub frame_code: usize,
    /// `f_lasti` (int, ≤3.10), `prev_instr` (3.11, 3.12) or `instr_ptr` (3.13+).
    pub frame_instr: usize,
    pub frame_entry: FrameEntry,
    /// `co_code_adaptive`: where the bytecode starts inside the code object (3.11+).
    pub code_adaptive: Option<usize>,
    pub code_qualname: Option<usize>,
    /// `co_lnotab` (3.8, 3.9) or `co_linetable` (3.10+).
    pub code_linetable: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_firstlineno: usize,
    pub ascii_object_size: usize,
    pub compact_object_size: usize,
}

impl PyOffsets {
    /// The table for a version without `_Py_DebugOffsets` (3.8 to 3.12).
    pub fn for_version(major: u8, minor: u8) -> Option<&'static PyOffsets> {
        TABLES.iter().find(|t| t.version == (major, minor))
    }

    /// Offsets from the `_Py_DebugOffsets` header that 3.13+ put at the start of `_PyRuntime`
    /// (`bytes` from there, at least 0x300 long), for the versions whose header layout is known
    /// (3.13, 3.14).
    pub fn from_debug_offsets(bytes: &[u8]) -> Option<PyOffsets> {
        if bytes.get(..8)? != b"xdebugpy" {
            return None;
        }
        let field = |i: usize| -> Option<usize> {
            let b = bytes.get(i * 8..i * 8 + 8)?;
            usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()
        };
        let version = field(1)? as u64;
        let (major, minor) = (((version >> 24) & 0xff) as u8, ((version >> 16) & 0xff) as u8);
        if (major, minor) < (3, 13) || field(2)? != 0 {
            // Free-threaded builds lay frames out differently: not supported.
            return None;
        }
        // Where each section starts (its `size` field), in u64 words: 3.14 added fields to the
        // interpreter and thread sections, so the later ones moved.
        let (rt, interp, ts, frame, code, ascii_size, cstack) = match minor {
            13 => (3, 6, 19, 28, 34, 70, 3),
            14 => (3, 6, 22, 31, 39, 80, 3),
            _ => return None,
        };
        let unicode_ascii_size = field(ascii_size)?;
        Some(PyOffsets {
            version: (major, minor),
            runtime_interpreters_head: field(rt + 2)?,
            interp_threads_head: field(interp + 3)?,
            tstate_next: field(ts + 2)?,
            tstate_thread_id: field(ts + 5)?,
            tstate_frame: field(ts + 4)?,
            cframe_current_frame: None,
            frame_previous: field(frame + 1)?,
            frame_code: field(frame + 2)?,
            frame_instr: field(frame + 3)?,
            frame_entry: FrameEntry::Owner { offset: field(frame + 5)?, cstack },
            code_adaptive: Some(field(code + 9)?),
            code_qualname: Some(field(code + 3)?),
            code_linetable: field(code + 4)?,
            code_filename: field(code + 1)?,
            code_name: field(code + 2)?,
            code_firstlineno: field(code + 5)?,
            ascii_object_size: unicode_ascii_size,
            compact_object_size: unicode_ascii_size + 16,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_cover_3_8_to_3_13() {
        for minor in 8..=13 {
            let t = PyOffsets::for_version(3, minor).unwrap_or_else(|| panic!("no table for 3.{minor}"));
            assert_eq!(matches!(t.frame_entry, FrameEntry::FrameObject), minor < 11);
            assert_eq!(t.code_adaptive.is_some(), minor >= 11);
        }
        assert!(PyOffsets::for_version(3, 7).is_none());
    }

    #[test]
    fn debug_offsets_need_the_cookie() {
        assert!(PyOffsets::from_debug_offsets(&[0; 0x300]).is_none());
    }
}
