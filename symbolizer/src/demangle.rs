//! Demangling of Rust and C++ names, applied only to names that are mangled; every name capped.

use std::fmt;

/// The most bytes of a name that are kept: its end, after `…`. The profile builder caps names at
/// the same size (gpuflame's names.rs); capping here too means that a file with names of
/// megabytes (a process can map any file) costs no more than that per cached symbol.
pub const MAX_NAME_BYTES: usize = 4096;
/// Longer mangled names are not demangled: the demangler's work and output grow with them, and
/// back-references can make the output far larger than the input.
const MAX_MANGLED_BYTES: usize = 64 << 10;
/// Demangling stops, and the mangled name is kept, past this much output.
const MAX_DEMANGLED_BYTES: usize = 256 << 10;

/// `name`, or its last [`MAX_NAME_BYTES`] bytes after `…` (cut between characters).
pub fn keep_end(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_string();
    }
    let mut start = name.len() - (MAX_NAME_BYTES - '…'.len_utf8());
    while !name.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &name[start..])
}

/// A String that refuses to grow past a bound.
struct Bounded(String);

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED_BYTES {
            return Err(fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

/// The readable name: Rust (legacy and v0, without the hash) and Itanium C++ names are
/// demangled; anything without a mangling prefix, such as a C function `c`, stays as it is.
pub fn demangle(name: &str) -> String {
    let mangled = name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z");
    if !mangled || name.len() > MAX_MANGLED_BYTES {
        return keep_end(name);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // rustc-demangle bounds its own output (it stops at a million bytes).
        return keep_end(&format!("{rust:#}"));
    }
    let demangled = cpp_demangle::Symbol::new(name).ok().and_then(|s| {
        let mut out = Bounded(String::new());
        s.structured_demangle(&mut out, &cpp_demangle::DemangleOptions::default()).ok().map(|()| out.0)
    });
    keep_end(demangled.as_deref().unwrap_or(name))
}

#[cfg(test)]
mod tests {
    use super::{demangle, keep_end, MAX_NAME_BYTES};

    #[test]
    fn only_mangled_names_change() {
        assert_eq!(demangle("c"), "c");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE"), "core::fmt::write");
        assert_eq!(demangle("_Znot_really"), "_Znot_really");
    }

    #[test]
    fn huge_names_keep_their_end() {
        // An 8 MiB C name and an 8 MiB mangled C++ name (one namespace, many components).
        let plain = format!("start{}end_marker", "x".repeat(8 << 20));
        let named = demangle(&plain);
        assert!(named.len() <= MAX_NAME_BYTES && named.starts_with('…') && named.ends_with("end_marker"), "{}", named.len());
        let mut mangled = String::from("_ZN");
        while mangled.len() < 8 << 20 {
            mangled.push_str("9component");
        }
        mangled.push_str("4lastEv");
        let named = demangle(&mangled);
        assert!(named.len() <= MAX_NAME_BYTES && named.ends_with("4lastEv"), "not demangled, cut: {}", &named[..40]);
        // Under the demangling bound: demangled, then cut.
        let medium = format!("_ZN40000{}4lastEv", "y".repeat(40_000));
        let named = demangle(&medium);
        assert!(named.len() <= MAX_NAME_BYTES && named.ends_with("yy::last()"), "{}", &named[named.len() - 40..]);
        assert_eq!(keep_end("é".repeat(3000).as_str()).chars().filter(|&c| c == 'é').count(), (MAX_NAME_BYTES - 3) / 2);
    }
}
