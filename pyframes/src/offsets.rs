//! The struct offsets the Python walker needs, per interpreter version, and how 3.13+ give them
//! at run time; the tables of older versions are looked up in `versions`.

/// How the frames of one `_PyEval_EvalFrameDefault` call are told apart from its caller's.
use crate::layout::{self, Layout};

/// How many bytes of `_PyRuntime` [`PyOffsets::from_debug_offsets`] reads: the header, with room
/// for a newer CPython's sections to have moved.
pub const DEBUG_OFFSETS_LEN: usize = layout::HEADER_WORDS * 8;

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
    /// 3.13+: a shim frame holds `None` in its code slot, by which the walker finds the first
    /// shim of a process in a native frame; it is told `None`'s address.
    pub fn shim_holds_none(&self) -> bool {
        self.version >= (3, 13)
    }

    /// 3.14+: the frame's code is a tagged stack reference, its low bits flags.
    pub fn code_tagged(&self) -> bool {
        self.version >= (3, 14)
    }

    /// 3.12+: each call of the eval loop is known by its C-stack shim frame, not by the loop's
    /// address range (`python_shims.h`).
    pub fn eval_by_shim(&self) -> bool {
        self.version >= (3, 12)
    }

    /// Offsets from the `_Py_DebugOffsets` header that 3.13+ put at the start of `_PyRuntime`
    /// (`bytes` from there, [`DEBUG_OFFSETS_LEN`] long). A version past the known layouts is read
    /// where its sections are found by their shape ([`crate::layout`]). The header is in the
    /// process's own memory, which the process can write: every offset is bounded here, before
    /// anything is read or allocated by it.
    pub fn from_debug_offsets(bytes: &[u8]) -> Result<PyOffsets, DebugOffsetsError> {
        if bytes.get(..8) != Some(b"xdebugpy".as_slice()) {
            return Err(DebugOffsetsError::NoCookie);
        }
        let field = |i: usize| -> Result<u64, DebugOffsetsError> {
            let b = bytes.get(i * 8..i * 8 + 8).ok_or(DebugOffsetsError::Short(bytes.len()))?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| DebugOffsetsError::Short(bytes.len()))?))
        };
        let version = field(1)?;
        let (major, minor) = (((version >> 24) & 0xff) as u8, ((version >> 16) & 0xff) as u8);
        if major != 3 || minor < 13 {
            return Err(DebugOffsetsError::Version(major, minor));
        }
        if field(2)? != 0 {
            // Free-threaded builds lay frames out differently: not supported.
            return Err(DebugOffsetsError::FreeThreaded);
        }
        let layout = match layout::known(minor) {
            Some(l) => l,
            None if (major, minor) > layout::NEWEST_KNOWN => layout::find(&|i| field(i).ok()).map_err(|section| DebugOffsetsError::Shape { version: (major, minor), section })?,
            None => return Err(DebugOffsetsError::Version(major, minor)),
        };
        let Layout { runtime: rt, interp, thread: ts, thread_id, frame, code, unicode } = layout;
        let (ascii_size, cstack) = (unicode + 3, 3);
        let bounded = |i: usize, name: &'static str, max: usize| -> Result<usize, DebugOffsetsError> {
            let value = field(i)?;
            usize::try_from(value).ok().filter(|&v| v <= max).ok_or(DebugOffsetsError::Implausible { name, value, max })
        };
        let walked = |i: usize, name| bounded(i, name, MAX_STRUCT_OFFSET);
        let object = |i: usize, name| bounded(i, name, MAX_OBJECT_OFFSET);
        let unicode_ascii_size = object(ascii_size, "unicode_object.asciiobject_size")?;
        Ok(PyOffsets {
            version: (major, minor),
            runtime_interpreters_head: walked(rt + 2, "runtime_state.interpreters_head")?,
            interp_threads_head: walked(interp + 3, "interpreter_state.threads_head")?,
            tstate_next: walked(ts + 2, "thread_state.next")?,
            tstate_thread_id: walked(ts + thread_id, "thread_state.thread_id")?,
            tstate_frame: walked(ts + 4, "thread_state.current_frame")?,
            cframe_current_frame: None,
            frame_previous: walked(frame + 1, "interpreter_frame.previous")?,
            frame_code: walked(frame + 2, "interpreter_frame.executable")?,
            frame_instr: walked(frame + 3, "interpreter_frame.instr_ptr")?,
            frame_entry: FrameEntry::Owner { offset: walked(frame + 5, "interpreter_frame.owner")?, cstack },
            code_adaptive: Some(object(code + 9, "code_object.co_code_adaptive")?),
            code_qualname: Some(object(code + 3, "code_object.qualname")?),
            code_linetable: object(code + 4, "code_object.linetable")?,
            code_filename: object(code + 1, "code_object.filename")?,
            code_name: object(code + 2, "code_object.name")?,
            code_firstlineno: object(code + 5, "code_object.firstlineno")?,
            ascii_object_size: unicode_ascii_size,
            compact_object_size: unicode_ascii_size + 16,
        })
    }
}

/// The most an offset into the structures the BPF walker follows may be: it holds them in 16
/// bits, u16::MAX meaning none. (3.13's largest is the thread list in PyInterpreterState, 0x1cb0.)
pub const MAX_STRUCT_OFFSET: usize = u16::MAX as usize - 1;
/// The most an offset into a code or str object may be: gpuflame reads that much of each code
/// object it names, and the real ones are under 0x100.
pub const MAX_OBJECT_OFFSET: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    #[error("no _Py_DebugOffsets cookie")]
    NoCookie,
    #[error("_Py_DebugOffsets cut short at {0} bytes")]
    Short(usize),
    #[error("_Py_DebugOffsets of an unknown layout (Python {0}.{1})")]
    Version(u8, u8),
    #[error("a free-threaded build, whose frames gpuflame does not read yet")]
    FreeThreaded,
    #[error("Python {}.{} is newer than gpuflame knows and its _Py_DebugOffsets header has no {section} section of the known shape", version.0, version.1)]
    Shape { version: (u8, u8), section: &'static str },
    #[error("_Py_DebugOffsets says {name} is at {value:#x}, beyond {max:#x}: corrupt or forged")]
    Implausible { name: &'static str, value: u64, max: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_offsets_need_the_cookie() {
        assert_eq!(PyOffsets::from_debug_offsets(&[0; 0x300]), Err(DebugOffsetsError::NoCookie));
    }

    /// The layout of a 3.13 header with the offsets CPython 3.13.0 puts there.
    fn header_3_13() -> Vec<u8> {
        let mut words = vec![0u64; 0x60];
        words[0] = u64::from_le_bytes(*b"xdebugpy");
        words[1] = 0x030d_00f0;
        for (i, w) in words.iter_mut().enumerate().skip(3).take(70) {
            *w = 8 * (i as u64 % 30);
        }
        words[70] = 0x28;
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The words of Debian's python3.15 (3.15.2) header that gpuflame reads, where they are.
    #[test]
    fn a_3_15_header_is_read_past_the_fields_3_15_added() {
        let mut words = vec![0u64; 0x60];
        words[0] = u64::from_le_bytes(*b"xdebugpy");
        words[1] = 0x030f_02f0;
        for (i, v) in [(5, 0x3a8), (9, 0x1ca8), (24, 8), (26, 0x48), (27, 0x50), (30, 0xb0), (40, 8), (41, 0), (42, 0x38), (44, 0x4a)] {
            words[i] = v;
        }
        for (i, v) in [(48, 0x70), (49, 0x78), (50, 0x80), (51, 0x88), (52, 0x44), (56, 0xd0), (92, 0x28)] {
            words[i] = v;
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let o = PyOffsets::from_debug_offsets(&bytes).unwrap();
        assert_eq!((o.version, o.runtime_interpreters_head, o.interp_threads_head, o.tstate_next, o.tstate_frame), ((3, 15), 0x3a8, 0x1ca8, 8, 0x48));
        assert_eq!(o.tstate_thread_id, 0xb0, "thread_id comes after the three fields 3.15 added");
        assert_eq!((o.frame_previous, o.frame_code, o.frame_instr, o.frame_entry), (8, 0, 0x38, FrameEntry::Owner { offset: 0x4a, cstack: 3 }));
        assert_eq!((o.code_filename, o.code_name, o.code_qualname, o.code_linetable, o.code_firstlineno, o.code_adaptive), (0x70, 0x78, Some(0x80), 0x88, 0x44, Some(0xd0)));
        assert_eq!(o.ascii_object_size, 0x28);
        // A version past the known layouts whose sections do not have the shape of the known
        // ones (here, most words 0) is refused, not read with the last one's.
        words[1] = 0x0310_00a0;
        let newer: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert!(matches!(PyOffsets::from_debug_offsets(&newer), Err(DebugOffsetsError::Shape { version: (3, 16), .. })));
    }

    #[test]
    fn huge_or_truncated_debug_offsets_are_errors() {
        let good = header_3_13();
        let o = PyOffsets::from_debug_offsets(&good).unwrap();
        assert_eq!((o.version, o.ascii_object_size), ((3, 13), 0x28));
        // What a process can write into its own header: sizes that would make gpuflame read
        // (and allocate) a TiB per code object.
        for (word, value) in [(34 + 1, 1u64 << 40), (70, u64::MAX), (6 + 3, 0x1_0000), (34 + 4, 4097)] {
            let mut bad = good.clone();
            bad[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
            assert!(matches!(PyOffsets::from_debug_offsets(&bad), Err(DebugOffsetsError::Implausible { .. })), "word {word} = {value:#x}");
        }
        assert_eq!(PyOffsets::from_debug_offsets(&good[..0x100]), Err(DebugOffsetsError::Short(0x100)));
    }

    // A CPython newer than the table: its sections found by their shape (crate::layout).
    use crate::layout::tests::REAL_3_15;

    fn bytes(words: &[u64]) -> Vec<u8> {
        let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        b.resize(crate::layout::HEADER_WORDS * 8, 0);
        b
    }

    fn as_version(mut words: Vec<u64>, minor: u64) -> Vec<u64> {
        words[1] = 0x0300_00f0 | minor << 16;
        words
    }

    #[test]
    fn the_newest_known_layout_is_found_where_the_table_puts_it() {
        let table = PyOffsets::from_debug_offsets(&bytes(&REAL_3_15)).unwrap();
        let found = PyOffsets::from_debug_offsets(&bytes(&as_version(REAL_3_15.to_vec(), 16))).unwrap();
        assert_eq!(found, PyOffsets { version: (3, 16), ..table });
        assert_eq!((table.tstate_thread_id, table.code_filename, table.ascii_object_size), (0xb0, 0x70, 0x28));
    }

    /// 3.16 as a later CPython would change the header: a field appended to the thread and code
    /// sections, a section added before the unicode one and one at the end.
    fn header_3_16() -> Vec<u64> {
        let mut w = as_version(REAL_3_15.to_vec(), 16);
        w.insert(39, 0x130); // thread_state's new last field
        w.insert(59, 0xb8); // code_object's
        w.splice(89..89, [0x48, 0x10, 0x18, 0x20]); // a new section before unicode_object (at 87 in 3.15)
        w.extend([0x30, 0x8, 0x10]);
        w
    }

    #[test]
    fn a_later_python_that_appended_fields_and_sections_is_read() {
        let table = PyOffsets::from_debug_offsets(&bytes(&REAL_3_15)).unwrap();
        let found = PyOffsets::from_debug_offsets(&bytes(&header_3_16())).unwrap();
        assert_eq!(found, PyOffsets { version: (3, 16), ..table });
    }

    #[test]
    fn a_later_python_with_a_field_out_of_its_structure_is_refused() {
        // Each refused: where a section's shape breaks, the search may take later words for it,
        // and then the next section is not found.
        for (word, value) in [(50, 0x2000), (26, 0x1000), (95, 0x50), (6, 0x10), (42, 0x60)] {
            let mut w = header_3_16();
            w[word] = value;
            let got = PyOffsets::from_debug_offsets(&bytes(&w));
            assert!(matches!(got, Err(DebugOffsetsError::Shape { version: (3, 16), .. })), "word {word} = {value:#x}: {got:?}");
        }
        // Cut before its last section: the search reads no further than the bytes it has.
        let cut = bytes(&header_3_16());
        assert!(matches!(PyOffsets::from_debug_offsets(&cut[..90 * 8]), Err(DebugOffsetsError::Shape { .. })));
    }

    #[test]
    fn free_threaded_builds_are_refused_whatever_their_version() {
        for minor in [15, 16] {
            let mut w = as_version(REAL_3_15.to_vec(), minor);
            w[2] = 1;
            assert_eq!(PyOffsets::from_debug_offsets(&bytes(&w)), Err(DebugOffsetsError::FreeThreaded));
        }
    }

    #[test]
    fn versions_before_the_header_or_of_another_major_are_refused() {
        for (version, want) in [(0x030c_00f0, (3, 12)), (0x0400_00f0, (4, 0))] {
            let mut w = REAL_3_15.to_vec();
            w[1] = version;
            assert_eq!(PyOffsets::from_debug_offsets(&bytes(&w)), Err(DebugOffsetsError::Version(want.0, want.1)));
        }
    }
}
