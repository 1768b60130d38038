//! Where the sections of a `_Py_DebugOffsets` header start: known per minor version, and found by
//! their shape in a CPython newer than the table.
//!
//! Each section opens with the size of the structure it describes (not of the section), so
//! sections cannot be found by walking sizes. What a later CPython does to the header is append:
//! fields at the end of a section, sections at the end or between the ones gpuflame reads. The
//! newest known layout is therefore searched forward, section by section, for the first place
//! where the words look like that section: a structure size in its range, the fields gpuflame reads
//! inside it, aligned and distinct. A field inserted in the middle of a section defeats this; the
//! checks refuse most such headers, and then the process is profiled natively, with a warning.

/// Start of each section gpuflame reads, in u64 words from the start of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub runtime: usize,
    pub interp: usize,
    pub thread: usize,
    /// `thread_id`'s place inside the thread section (3.15 put three fields before it).
    pub thread_id: usize,
    pub frame: usize,
    pub code: usize,
    pub unicode: usize,
}

/// The newest minor version whose layout is known.
pub const NEWEST_KNOWN: (u8, u8) = (3, 15);

/// The layout of a known 3.x release.
pub(crate) fn known(minor: u8) -> Option<Layout> {
    let l = |runtime, interp, thread, thread_id, frame, code, unicode| Layout { runtime, interp, thread, thread_id, frame, code, unicode };
    match minor {
        13 => Some(l(3, 6, 19, 5, 28, 34, 67)),
        // 3.14 added fields to the interpreter, frame and code sections.
        14 => Some(l(3, 6, 22, 5, 31, 39, 77)),
        // 3.15 added fields to the thread section (three before `thread_id`) and the type section.
        15 => Some(l(3, 6, 22, 8, 39, 47, 89)),
        _ => None,
    }
}

/// How far past the newest known layout a section may have moved, in words, over the whole
/// header: a release adds a handful (3.14 moved the last section by 10, 3.15 by 12).
const MOST_GROWTH: usize = 48;

/// Words of header the search may need: the newest layout's last section read, moved as far as
/// it may be, and its four words.
pub(crate) const HEADER_WORDS: usize = 89 + MOST_GROWTH + 4;

/// The layout of a CPython newer than the table, found from the newest known one. Err names the
/// first section that was not found.
pub(crate) fn find(word: &dyn Fn(usize) -> Option<u64>) -> Result<Layout, &'static str> {
    let base = known(NEWEST_KNOWN.1).ok_or("any")?;
    let tid = base.thread_id;
    // In the order of the header, with how long each is in the newest layout where the next one
    // follows it directly (None: sections gpuflame does not read come between).
    type Shaped = dyn Fn(&dyn Fn(usize) -> Option<u64>) -> bool;
    let sections: [(&'static str, usize, Option<usize>, &Shaped); 6] = [
        ("runtime_state", base.runtime, Some(base.interp - base.runtime), &|s| inside(s, 0x100, 1 << 28, &[1, 2], 8)),
        ("interpreter_state", base.interp, Some(base.thread - base.interp), &|s| inside(s, 0x100, 1 << 28, &[1, 2, 3], 8)),
        ("thread_state", base.thread, Some(base.frame - base.thread), &move |s| thread_shaped(s, tid)),
        ("interpreter_frame", base.frame, Some(base.code - base.frame), &|s| frame_shaped(s)),
        ("code_object", base.code, None, &|s| code_shaped(s)),
        ("unicode_object", base.unicode, None, &|s| unicode_shaped(s)),
    ];
    let mut found = [0usize; 6];
    let mut moved = 0;
    // The section before, where it was found, how long it was, and its structure's size: words
    // between its known end and the next section are fields appended to it, inside that size.
    let mut before: Option<(usize, Option<usize>, u64)> = None;
    for (n, &(name, start, len, shaped)) in sections.iter().enumerate() {
        let appended = |from: usize| match before {
            Some((at, Some(len), size)) => (at + len..from).all(|i| word(i).is_some_and(|v| v < size)),
            _ => true,
        };
        let shift = (moved..=MOST_GROWTH).find(|&shift| shaped(&|i| word(start + shift + i)) && appended(start + shift)).ok_or(name)?;
        moved = shift;
        found[n] = start + shift;
        before = Some((start + shift, len, word(start + shift).unwrap_or(0)));
    }
    let [runtime, interp, thread, frame, code, unicode] = found;
    Ok(Layout { runtime, interp, thread, thread_id: tid, frame, code, unicode })
}

/// Word 0 is a structure size in `min..=max`, and `fields` are distinct offsets inside it, aligned
/// to `align`.
fn inside(s: &dyn Fn(usize) -> Option<u64>, min: u64, max: u64, fields: &[usize], align: u64) -> bool {
    let Some(size) = s(0).filter(|z| (min..=max).contains(z)) else { return false };
    let mut seen = Vec::with_capacity(fields.len());
    for &i in fields {
        match s(i) {
            Some(v) if v < size && v % align == 0 && !seen.contains(&v) => seen.push(v),
            _ => return false,
        }
    }
    true
}

/// PyThreadState: `prev`, `next` and `interp` are its first three pointers, at 0, 8 and 16, as
/// they have been since 3.0; `current_frame` and `thread_id` come later.
fn thread_shaped(s: &dyn Fn(usize) -> Option<u64>, thread_id: usize) -> bool {
    let (Some(prev), Some(next), Some(interp)) = (s(1), s(2), s(3)) else { return false };
    inside(s, 0x80, 0x1_0000, &[1, 2, 3, 4, thread_id], 8) && (prev, next, interp) == (0, 8, 16)
}

/// _PyInterpreterFrame: ends in `localsplus`, a one-element array, and `owner` is a byte before it.
fn frame_shaped(s: &dyn Fn(usize) -> Option<u64>) -> bool {
    let (Some(size), Some(locals), Some(owner)) = (s(0), s(4), s(5)) else { return false };
    inside(s, 0x30, 0x400, &[1, 2, 3, 4], 8) && (1..=3).all(|i| s(i).is_some_and(|v| v < locals)) && owner < locals && size <= locals + 16
}

/// PyCodeObject: the names and the line table are pointers past the object header, the first line
/// an int, and the bytecode, a one-element array, ends the object.
fn code_shaped(s: &dyn Fn(usize) -> Option<u64>) -> bool {
    if !inside(s, 0x80, 0x1000, &[1, 2, 3, 4, 9], 8) || !inside(s, 0x80, 0x1000, &[5], 4) {
        return false;
    }
    let (Some(size), Some(adaptive)) = (s(0), s(9)) else { return false };
    (1..=5).all(|i| s(i).is_some_and(|v| v >= 0x10 && v < adaptive)) && size <= adaptive + 16
}

/// PyUnicodeObject: an ASCII object of 32 bytes or more with the state and length inside it, the
/// compact object's two words after it, and one more.
fn unicode_shaped(s: &dyn Fn(usize) -> Option<u64>) -> bool {
    let (Some(size), Some(state), Some(length), Some(ascii)) = (s(0), s(1), s(2), s(3)) else { return false };
    (0x20..=0x100).contains(&ascii) && ascii % 8 == 0 && (ascii + 0x10..=ascii + 0x20).contains(&size) && state < ascii && length < ascii && state != length
}

#[cfg(test)]
pub(crate) mod tests {
    /// The first 99 words of Debian's python3.15 (3.15.2) `_Py_DebugOffsets`, as its file holds them.
    pub(crate) const REAL_3_15: [u64; 99] = [
        0x7970_6775_6265_6478, 0x030f_02f0, 0, // cookie, version, free_threaded
        0x549c8, 0x390, 0x3a8, // runtime_state
        0x373c0, 0x1c68, 0x1c60, 0x1ca8, 0x1cb8, 0x1ce8, 0x1da8, 0x1d98, 0x1da0, 0x10, 0x1e38, 0, 0x1e48, 0x1e40, 0x1f08, 0, // interpreter_state
        0x378, 0, 0x8, 0x10, 0x48, 0x50, 0x58, 0x60, 0xb0, 0xb8, 0x100, 0x20, 0x24, 0x28, 0x88, 0x120, 0, // thread_state
        0x58, 0x8, 0, 0x38, 0x50, 0x4a, 0x40, 0, // interpreter_frame
        0xd8, 0x70, 0x78, 0x80, 0x88, 0x44, 0x34, 0x60, 0x68, 0xd0, 0, // code_object
        0x10, 0x8, 0x1a8, 0x18, 0x58, 0xa8, 0x20, 0x120, 0x3b0, 0x378, // pyobject, type_object
        0x28, 0x20, 0x10, 0x28, 0x18, 0x10, 0xc8, 0x18, 0x28, 0x20, 0x30, 0x20, 0x28, 0x18, 0x10, 0x20, 0x10, 0x18, 0x28, 0x10, 0x20, // tuple .. bytes
        0x40, 0x20, 0x10, 0x28, // unicode_object
        0x38, 0xb0, 0x70, 0x78, 0x460, 0x68, // gc and what follows
    ];

    /// Debian's 3.13.18 and 3.14.10 headers (their files' words), up to the unicode section.
    const REAL_3_13: [u64; 71] = [
        0x7970677562656478, 0x30d12f0, 0, 0x45310, 0x260, 0x278, 0x2f9a8, 0x1c68, 0x1c60, 0x1cb0,
        0x1ce8, 0x1de8, 0x1dd8, 0x1de0, 0x10, 0x1e48, 0, 0x1e58, 0x1e50, 0x138, 0, 0x8, 0x10, 0x48,
        0x98, 0xa0, 0xe8, 0x20, 0x50, 0x8, 0, 0x38, 0x48, 0x46, 0xd0, 0x70, 0x78, 0x80, 0x88, 0x44,
        0x34, 0x60, 0x68, 0xc8, 0x10, 0x8, 0x1a0, 0x18, 0x58, 0xa8, 0x20, 0x18, 0x10, 0x28, 0x18,
        0x10, 0x30, 0x20, 0x28, 0x18, 0x10, 0x20, 0x10, 0x18, 0x28, 0x10, 0x20, 0x40, 0x20, 0x10,
        0x28,
    ];
    const REAL_3_14: [u64; 81] = [
        0x7970677562656478, 0x30e0af0, 0, 0x4d4c8, 0x310, 0x328, 0x37248, 0x1c70, 0x1c68, 0x1cb0,
        0x1cc0, 0x1cf0, 0x1e08, 0x1df8, 0x1e00, 0x10, 0x1e68, 0, 0x1e78, 0x1e70, 0x1f38, 0, 0x340,
        0, 0x8, 0x10, 0x48, 0x98, 0xa0, 0xe8, 0x20, 0x58, 0x8, 0, 0x38, 0x50, 0x4a, 0x40, 0, 0xd8,
        0x70, 0x78, 0x80, 0x88, 0x44, 0x34, 0x60, 0x68, 0xd0, 0, 0x10, 0x8, 0x1a0, 0x18, 0x58, 0xa8,
        0x28, 0x20, 0x10, 0x28, 0x18, 0x10, 0xc8, 0x18, 0x28, 0x20, 0x30, 0x20, 0x28, 0x18, 0x10,
        0x20, 0x10, 0x18, 0x28, 0x10, 0x20, 0x40, 0x20, 0x10, 0x28,
    ];

    /// The shape rules hold for every known release at the table's places, and the search from
    /// each release's own layout stays there: rules that fit 3.13 to 3.15 are likely to fit 3.16.
    #[test]
    fn every_known_release_has_the_shape_the_search_looks_for() {
        for (minor, words) in [(13, &REAL_3_13[..]), (14, &REAL_3_14[..]), (15, &REAL_3_15[..])] {
            let l = super::known(minor).unwrap();
            let s = |start: usize| move |i: usize| words.get(start + i).copied();
            assert!(super::inside(&s(l.runtime), 0x100, 1 << 28, &[1, 2], 8), "3.{minor} runtime");
            assert!(super::inside(&s(l.interp), 0x100, 1 << 28, &[1, 2, 3], 8), "3.{minor} interp");
            assert!(super::thread_shaped(&s(l.thread), l.thread_id), "3.{minor} thread");
            assert!(super::frame_shaped(&s(l.frame)), "3.{minor} frame");
            assert!(super::code_shaped(&s(l.code)), "3.{minor} code");
            assert!(super::unicode_shaped(&s(l.unicode)), "3.{minor} unicode");
            assert_eq!(words[l.unicode + 3], 0x28, "3.{minor}");
        }
    }
}
