//! CPython as gpuflame sees it from outside the process: which interpreter a process runs, the
//! offsets of the interpreter structures that the BPF walker follows, code objects and their
//! line tables (for naming frames), and where a call's frames go in a native stack (splicing).
//! Pure Rust, no BPF.
//!
//! Offsets for 3.8 to 3.12 come from tables generated from each version's headers
//! (`tools/gen-offsets.sh`); from 3.13 on the interpreter describes itself in the
//! `_Py_DebugOffsets` header at the start of `_PyRuntime`, read at run time.

mod detect;
mod layout;
mod linetable;
mod naming;
mod offsets;
mod splice;
mod tables;
mod unicode;
mod versions;

pub use detect::{find_interpreter, find_interpreter_with, Interpreter, Mapping, PyError};
pub use layout::NEWEST_KNOWN;
pub use linetable::line_for;
pub use naming::{NameTag, PyFrame, PythonSymbolizer, MAX_STR_CHARS};
pub use splice::PythonEval;
pub use offsets::{DebugOffsetsError, FrameEntry, PyOffsets, DEBUG_OFFSETS_LEN, MAX_OBJECT_OFFSET, MAX_STRUCT_OFFSET};
pub use unicode::{decode as decode_str, str_layout, StrLayout};
