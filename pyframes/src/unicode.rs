//! Python `str` objects as the interpreter lays them out (PEP 393), decoded from their bytes.

use crate::offsets::PyOffsets;

/// What a str header says: how many characters, of what width, stored where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrLayout {
    pub length: usize,
    /// 1, 2 or 4 bytes per character.
    pub kind: usize,
    /// Offset of the characters from the object, for compact strings.
    pub data_offset: Option<usize>,
}

/// Reads the header: `header` holds the object's first 40 bytes at least.
pub fn str_layout(header: &[u8], o: &PyOffsets) -> Option<StrLayout> {
    let length = usize::try_from(u64::from_le_bytes(header.get(16..24)?.try_into().ok()?)).ok()?;
    let state = u32::from_le_bytes(header.get(32..36)?.try_into().ok()?);
    let kind = ((state >> 2) & 7) as usize;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    // CPython's bound (PY_SSIZE_T_MAX bytes); readers take only what they need of a long str.
    if !matches!(kind, 1 | 2 | 4) || length > isize::MAX as usize / kind {
        return None;
    }
    let data_offset = compact.then_some(if ascii { o.ascii_object_size } else { o.compact_object_size });
    Some(StrLayout { length, kind, data_offset })
}

/// Decodes `length` characters of width `kind`. Python strs may hold lone surrogates (U+D800 to
/// U+DFFF, as `surrogateescape` makes from undecodable bytes) and memory read from a racing
/// process may hold anything; such code points become U+FFFD rather than vanish, so that a name
/// visibly had something there.
pub fn decode(data: &[u8], kind: usize) -> String {
    let char_or_replacement = |u: u32| char::from_u32(u).unwrap_or(char::REPLACEMENT_CHARACTER);
    match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        // UCS-2 holds no surrogate pairs (those strs are UCS-4): each unit is one code point.
        2 => data.chunks_exact(2).map(|c| char_or_replacement(u32::from(u16::from_le_bytes([c[0], c[1]])))).collect(),
        _ => data.chunks_exact(4).map(|c| char_or_replacement(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_ascii_and_wide() {
        let o = PyOffsets::for_version(3, 12).unwrap();
        let mut h = [0u8; 40];
        h[16] = 5;
        h[32] = (1 << 2) | (1 << 5) | (1 << 6);
        assert_eq!(str_layout(&h, o), Some(StrLayout { length: 5, kind: 1, data_offset: Some(40) }));
        h[32] = (2 << 2) | (1 << 5);
        assert_eq!(str_layout(&h, o).unwrap().data_offset, Some(56));
        assert_eq!(decode(&[0x3b, 0x04, 0x38, 0x04], 2), "\u{43b}\u{438}");
        assert_eq!(decode(b"step", 1), "step");
    }

    #[test]
    fn lone_surrogates_and_invalid_code_points_become_replacement_characters() {
        // "a\udcffb" as UCS-2, a high surrogate at the end, then "\U0001f600\udcff" and
        // 0x110000 as UCS-4.
        assert_eq!(decode(&[0x61, 0, 0xff, 0xdc, 0x62, 0, 0x00, 0xd8], 2), "a\u{fffd}b\u{fffd}");
        let ucs4 = [0x00, 0xf6, 0x01, 0x00, 0xff, 0xdc, 0, 0, 0, 0, 0x11, 0];
        assert_eq!(decode(&ucs4, 4), "\u{1f600}\u{fffd}\u{fffd}");
        // Latin-1 is always valid: C1 controls come through, for the profile builder to escape.
        assert_eq!(decode(&[0x85, 0xff], 1), "\u{85}\u{ff}");
    }
}
