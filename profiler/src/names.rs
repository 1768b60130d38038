//! Names read from other processes (Python code objects, comm, file paths, symbols) made safe for
//! every writer. [`crate::profile::ProfileBuilder`] applies [`sanitize`] to every name it interns,
//! so folded stacks, SVG, pprof and the agent's pushes all see the same, safe names.
//!
//! Rules:
//! - Control characters (C0 including NUL, DEL, C1 U+0080–U+009F) become visible escapes, as
//!   Python's `repr` writes them: `\t`, `\n`, `\r`, else `\xNN`. A name with a newline would
//!   split a folded line, and most of them are not allowed in XML 1.0.
//! - U+FFFE and U+FFFF, not characters in XML 1.0 either, become `\ufffe` and `\uffff`.
//! - Backslashes are left alone, so a literal `\x1b` reads like an escape: names are for people,
//!   and sanitizing must be idempotent because profiles are rebuilt (subsets, pprof read back).
//! - Names longer than [`MAX_NAME_BYTES`] keep their end, after `…`.
//!
//! Invalid UTF-8 and lone surrogates are turned into U+FFFD where bytes are decoded (comm in the
//! bpf crate, Python strings in the pyframes crate): a `String` cannot hold them.

use std::borrow::Cow;

/// The most bytes a name keeps. A hostile process can make names of a million characters, each
/// repeated in every folded line and SVG frame; 4096 bytes is more than any real symbol or path
/// needs. The end is kept, as Pyroscope does: it holds the innermost part of qualified names
/// and the file name of paths.
pub const MAX_NAME_BYTES: usize = 4096;

/// Marks a name whose start was cut.
const CUT: &str = "…";

/// `name` with its control characters escaped and its length capped; borrowed when already safe.
pub fn sanitize(name: &str) -> Cow<'_, str> {
    if name.len() <= MAX_NAME_BYTES && !name.chars().any(needs_escape) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(escape_capped(name))
}

/// [`sanitize`] in place, allocating only when something changes.
pub fn sanitize_in_place(name: &mut String) {
    let clean = match sanitize(name) {
        Cow::Borrowed(_) => return,
        Cow::Owned(clean) => clean,
    };
    *name = clean;
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{fffe}' | '\u{ffff}')
}

fn escaped_len(c: char) -> usize {
    match c {
        '\t' | '\n' | '\r' => 2,
        '\u{fffe}' | '\u{ffff}' => 6,
        c if c.is_control() => 4,
        c => c.len_utf8(),
    }
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\t' => out.push_str("\\t"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\u{fffe}' | '\u{ffff}' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
        c => out.push(c),
    }
}

/// Walks from the end so that the cut falls between whole characters and whole escapes, and a
/// million-character name costs only the part that is kept.
fn escape_capped(name: &str) -> String {
    let budget = MAX_NAME_BYTES - CUT.len();
    let mut used = 0;
    let mut keep_from = None;
    for (i, c) in name.char_indices().rev() {
        let n = escaped_len(c);
        if keep_from.is_none() && used + n > budget {
            keep_from = Some(i + c.len_utf8());
        }
        used += n;
        if used > MAX_NAME_BYTES {
            let tail = &name[keep_from.unwrap_or(name.len())..];
            let mut out = String::with_capacity(MAX_NAME_BYTES);
            out.push_str(CUT);
            tail.chars().for_each(|c| push_escaped(&mut out, c));
            return out;
        }
    }
    let mut out = String::with_capacity(used);
    name.chars().for_each(|c| push_escaped(&mut out, c));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names_are_borrowed() {
        for name in ["main", "std::vec::Vec<T>::push", "step (train.py:41)", "naïve 😀", "a;b", ""] {
            assert!(matches!(sanitize(name), Cow::Borrowed(n) if n == name), "{name:?}");
        }
    }

    #[test]
    fn control_characters_become_escapes() {
        assert_eq!(sanitize("libdevice.py (\0\x1b\0:3)"), r"libdevice.py (\x00\x1b\x00:3)");
        assert_eq!(sanitize("a\tb\nc\rd"), r"a\tb\nc\rd");
        assert_eq!(sanitize("del\x7f c1\u{80}\u{85}\u{9f}"), r"del\x7f c1\x80\x85\x9f");
        assert_eq!(sanitize("\u{fffe}\u{ffff}\u{fffd}"), "\\ufffe\\uffff\u{fffd}");
        // Not controls: the first character after C1 and a non-breaking space stay.
        assert_eq!(sanitize("\u{a0}\u{a1}"), "\u{a0}\u{a1}");
    }

    #[test]
    fn result_is_xml_text_without_line_breaks() {
        let all: String = (0..0x300).chain(0xfff0..0x10000).filter_map(char::from_u32).collect();
        let clean = sanitize(&all);
        let xml_char = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..);
        assert!(clean.chars().all(|c| xml_char(c) && !c.is_control()), "{clean:?}");
    }

    #[test]
    fn sanitizing_twice_changes_nothing() {
        for name in ["\x1b[31mred\n", &"é\x01".repeat(5000), &"x".repeat(10_000)] {
            let once = sanitize(name).into_owned();
            assert!(matches!(sanitize(&once), Cow::Borrowed(_)), "{once:?}");
        }
    }

    #[test]
    fn long_names_keep_their_end() {
        let name = format!("start{}end", "x".repeat(1_000_000));
        let capped = sanitize(&name);
        assert_eq!(capped.len(), MAX_NAME_BYTES);
        assert!(capped.starts_with("…xxx") && capped.ends_with("xend"));
        assert_eq!(sanitize(&"y".repeat(MAX_NAME_BYTES)).len(), MAX_NAME_BYTES, "exactly the cap is kept whole");
    }

    #[test]
    fn the_cut_falls_between_characters_and_escapes() {
        // 3-byte characters and 4-byte escapes never fit the budget exactly.
        for unit in ["€", "\x01", "é", "😀\x02"] {
            let capped = sanitize(&unit.repeat(3000)).into_owned();
            assert!(capped.len() <= MAX_NAME_BYTES && capped.len() > MAX_NAME_BYTES - 8, "{unit:?}: {}", capped.len());
            let body = capped.strip_prefix(CUT).expect("cut mark");
            let whole: String = sanitize(unit).repeat(3000);
            let starts_whole = unit.chars().any(|c| body.starts_with(sanitize(&c.to_string()).as_ref()));
            assert!(whole.ends_with(body) && starts_whole, "{unit:?} cut inside: {:?}", body.chars().take(4).collect::<String>());
        }
    }

    #[test]
    fn in_place_allocates_only_for_changes() {
        let mut s = String::from("fine");
        let before = s.as_ptr();
        sanitize_in_place(&mut s);
        assert_eq!(s.as_ptr(), before);
        let mut s = String::from("a\nb");
        sanitize_in_place(&mut s);
        assert_eq!(s, r"a\nb");
    }
}
