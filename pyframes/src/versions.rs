//! The offsets of versions without `_Py_DebugOffsets`, looked up in the generated tables: kept
//! apart from `offsets` because the tables name its types, so `offsets` cannot name them.

use crate::offsets::PyOffsets;
use crate::tables::TABLES;

impl PyOffsets {
    /// The generated table of a version (3.8 to 3.13). Detection uses it up to 3.12; from 3.13 the
    /// process's own `_Py_DebugOffsets` are read instead.
    pub fn for_version(major: u8, minor: u8) -> Option<&'static PyOffsets> {
        TABLES.iter().find(|t| t.version == (major, minor))
    }
}

#[cfg(test)]
mod tests {
    use crate::offsets::{FrameEntry, PyOffsets};

    #[test]
    fn tables_cover_3_8_to_3_13() {
        for minor in 8..=13 {
            let t = PyOffsets::for_version(3, minor).unwrap_or_else(|| panic!("no table for 3.{minor}"));
            assert_eq!(matches!(t.frame_entry, FrameEntry::FrameObject), minor < 11);
            assert_eq!(t.code_adaptive.is_some(), minor >= 11);
        }
        assert!(PyOffsets::for_version(3, 7).is_none());
    }
}
