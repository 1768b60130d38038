//! Demangling of Rust and C++ names, applied only to names that are mangled.

/// The readable name: Rust (legacy and v0, without the hash) and Itanium C++ names are
/// demangled; anything without a mangling prefix, such as a C function `c`, stays as it is.
pub fn demangle(name: &str) -> String {
    if !(name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z")) {
        return name.to_string();
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn only_mangled_names_change() {
        assert_eq!(demangle("c"), "c");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE"), "core::fmt::write");
        assert_eq!(demangle("_Znot_really"), "_Znot_really");
    }
}
