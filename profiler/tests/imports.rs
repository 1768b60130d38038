//! "No file imports a file that imports it": two files of a crate's src/ that each refer to the other by
//! path are one concern split in two, or two concerns knotted together, and either is read
//! only by reading both. The check is on files, not modules: `agent/mod.rs` using
//! `workload/service.rs` while `workload/service.rs` uses `agent/labels.rs` is no cycle.
//!
//! A file refers to another when it names it in a path: `use crate::a::b::C`, `crate::a::b::f()`,
//! `super::C`, `self::c::D`, or a child module's items (`use child::E`, `child::f()`). A path is
//! the file of its longest prefix that is a file's module (`crate::a::b::C` is a/b.rs, or
//! a/b/mod.rs; `crate::UserError` is lib.rs). Declaring a module (`mod child;`) is no reference:
//! a parent declares every child. Comments and string literals are left out; method calls are
//! no paths, so a child that adds methods to its parent's type (`impl super::T`) and a parent
//! that calls them are no cycle, which is what splitting a type's impl over files is for.
//! Only direct pairs are reported, not longer loops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `["agent", "config"]`; the root is empty.
type ModPath = Vec<String>;

/// The files that each file refers to, with the first path that does it.
type References = BTreeMap<String, BTreeMap<String, String>>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Colons,
    Open,
    Close,
    Semi,
    Comma,
    Star,
    Other(char),
}

/// Rust's tokens as far as paths and braces go: comments, strings, characters and numbers are
/// dropped, so that `"crate::x"` or `'{'` are neither a path nor a brace.
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    // From an opening quote at `i`: the index after the closing one, escapes honoured.
    let skip_quoted = |mut i: usize, quote: char| {
        i += 1;
        while i < c.len() && c[i] != quote {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                } else if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_quoted(i, '"');
        } else if ch == '\'' {
            // A character ('x', '\n', '{') or a lifetime ('a, 'static).
            if at(i + 1) == '\\' || at(i + 2) == '\'' {
                i = skip_quoted(i, '\'');
            } else {
                i += 1;
            }
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let prefix = matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr");
            if prefix && at(i) == '"' {
                i = skip_quoted(i, '"');
            } else if word == "b" && at(i) == '\'' {
                i = skip_quoted(i, '\'');
            } else if prefix && at(i) == '#' {
                let hashes = c[i..].iter().take_while(|&&h| h == '#').count();
                if at(i + hashes) == '"' {
                    // A raw string: it ends at a quote followed by as many hashes.
                    i += hashes + 1;
                    while i < c.len() && !(c[i] == '"' && c[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes) {
                        i += 1;
                    }
                    i += 1 + hashes;
                } else {
                    // A raw identifier: r#type.
                    i += 1;
                    let start = i;
                    while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                        i += 1;
                    }
                    out.push(Tok::Ident(c[start..i].iter().collect()));
                }
            } else {
                out.push(Tok::Ident(word));
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok::Colons);
            i += 2;
        } else {
            out.push(match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ';' => Tok::Semi,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                other => Tok::Other(other),
            });
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The paths of a `use` tree that starts at `toks[*i]`, each with the prefix before it; `*i`
/// ends after the tree.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    if toks.get(*i) == Some(&Tok::Colons) {
        *i += 1; // `use ::std::…`
    }
    loop {
        match toks.get(*i) {
            Some(Tok::Open) => {
                *i += 1;
                while !matches!(toks.get(*i), Some(Tok::Close) | None) {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i) == Some(&Tok::Comma) {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some(Tok::Star) => {
                *i += 1;
                out.push(path);
                return;
            }
            Some(Tok::Ident(s)) => {
                // `self` in braces is the prefix itself: `use a::{self, B}`.
                if s != "self" || path.is_empty() {
                    path.push(s.clone());
                }
                *i += 1;
                if toks.get(*i) == Some(&Tok::Colons) {
                    *i += 1;
                    continue;
                }
                if ident(toks.get(*i)) == Some("as") {
                    *i += 2;
                }
                out.push(path);
                return;
            }
            _ => return,
        }
    }
}

/// Every path of a file (in `use` and in code), each with the module it is written in: a file's
/// inline modules (`mod tests { use super::*; }`) change what `super` and `self` mean.
fn paths(src: &str, module: &ModPath) -> Vec<(ModPath, Vec<String>)> {
    let toks = tokens(src);
    let mut out = Vec::new();
    // Inline modules open now, each with the brace depth outside it.
    let mut inline: Vec<(ModPath, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here = inline.last().map_or_else(|| module.clone(), |(m, _)| m.clone());
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some(name), Some(Tok::Open)) = (ident(toks.get(i + 1)), toks.get(i + 2)) {
                    let mut m = here.clone();
                    m.push(name.to_string());
                    inline.push((m, depth));
                    i += 2;
                    continue;
                }
            }
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut found = Vec::new();
                use_tree(&toks, &mut i, &[], &mut found);
                out.extend(found.into_iter().map(|p| (here.clone(), p)));
                continue;
            }
            Tok::Ident(w) if toks.get(i + 1) == Some(&Tok::Colons) && (i == 0 || toks[i - 1] != Tok::Colons) => {
                let mut p = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Colons) {
                    match ident(toks.get(j + 1)) {
                        Some(s) => p.push(s.to_string()),
                        None => break,
                    }
                    j += 2;
                }
                out.push((here, p));
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The module of a file under src/, by Rust's rules: lib.rs is the root, a/mod.rs and a.rs are
/// `a`. main.rs is a crate of its own (it names the library `gpuflame::`), so it has none.
fn module_of(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" if parts.is_empty() => {}
        "main.rs" if parts.is_empty() => return None,
        "mod.rs" => {}
        name => parts.push(name.strip_suffix(".rs")?.to_string()),
    }
    Some(parts)
}

/// The file that `path`, written in module `here` of the file `module`, refers to; none for
/// paths outside the crate (std, other crates) and for items that are no module's file.
fn resolve(files: &BTreeMap<ModPath, String>, here: &ModPath, path: &[String]) -> Option<String> {
    let (mut full, rest) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.clone(), &path[1..]),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            (here[..here.len().checked_sub(ups)?].to_vec(), &path[ups..])
        }
        // A name of this module's scope: only a child module's file counts; anything else is
        // another crate (std::, serde::) or an item (Self::, an enum's variants).
        child => {
            let mut m = here.clone();
            m.push(child.to_string());
            if !files.contains_key(&m) {
                return None;
            }
            (here.clone(), path)
        }
    };
    full.extend(rest.iter().cloned());
    (0..=full.len()).rev().find_map(|n| files.get(&full[..n]).cloned())
}

/// What each file refers to, from the files' paths (relative to src/) and texts.
fn references(sources: &[(PathBuf, String)]) -> References {
    let files: BTreeMap<ModPath, String> =
        sources.iter().filter_map(|(rel, _)| Some((module_of(rel)?, rel.to_string_lossy().into_owned()))).collect();
    let mut refs = References::new();
    for (rel, text) in sources {
        let Some(module) = module_of(rel) else { continue };
        let name = rel.to_string_lossy().into_owned();
        let entry = refs.entry(name.clone()).or_default();
        for (here, path) in paths(text, &module) {
            if let Some(target) = resolve(&files, &here, &path) {
                if target != name {
                    entry.entry(target).or_insert_with(|| path.join("::"));
                }
            }
        }
    }
    refs
}

/// Each pair of files that refer to each other, described for a person.
fn cycles(refs: &References) -> Vec<String> {
    let mut out = Vec::new();
    for (a, targets) in refs {
        for (b, a_to_b) in targets {
            if let Some(b_to_a) = refs.get(b).and_then(|t| t.get(a)).filter(|_| a < b) {
                out.push(format!("{a} <-> {b}: {a} uses {a_to_b}, {b} uses {b_to_a}"));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path.strip_prefix(root).unwrap().to_path_buf(), text));
        }
    }
}

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut found = Vec::new();
    for krate in ["profiler", "bpf", "unwind", "symbolizer", "pyframes", "elfread", "server-upload", "benches"] {
        let src = workspace.join(krate).join("src");
        let mut sources = Vec::new();
        rust_files(&src, &src, &mut sources);
        assert!(!sources.is_empty(), "found no files under {}", src.display());
        found.extend(cycles(&references(&sources)).into_iter().map(|c| format!("{krate}/src: {c}")));
    }
    assert!(found.is_empty(), "{} pairs of files import each other:\n{}", found.len(), found.join("\n"));
}

fn fake(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect()
}

#[test]
fn the_checker_sees_paths_in_use_and_in_code() {
    let sources = fake(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d; pub struct E;"),
        ("a.rs", "use crate::b::X; // crate::c::Y\nfn f() -> &'static str { let _ = '{'; \"crate::c::Z\" }"),
        ("b.rs", "pub struct X; fn g() { super::a::f(); }\n#[cfg(test)]\nmod tests { use super::*; }"),
        ("c.rs", "use crate::{d::{self, D}, E as F}; fn h() { r#\"crate::a\"#; }"),
        ("d.rs", "pub struct D; pub(super) fn i() { crate::c::h() }"),
    ]);
    let refs = references(&sources);
    let targets = |f: &str| refs[f].keys().cloned().collect::<Vec<_>>();
    assert_eq!(targets("a.rs"), ["b.rs"], "comments and strings are no paths");
    assert_eq!(targets("b.rs"), ["a.rs"], "`super::*` in b's tests is b itself");
    assert_eq!(targets("c.rs"), ["d.rs", "lib.rs"]);
    assert_eq!(cycles(&refs).len(), 2, "{:?}", cycles(&refs));
}

#[test]
fn a_parent_and_its_child_are_a_cycle_only_when_both_name_each_other() {
    let sources = fake(&[
        ("lib.rs", "pub mod p; pub mod q;"),
        ("p/mod.rs", "mod inner; mod other; pub use inner::Inner; pub struct P;"),
        ("p/inner.rs", "use super::P; pub struct Inner;"),
        ("p/other.rs", "use super::P; impl P { pub fn m(&self) {} }"),
        ("q/mod.rs", "mod tree; struct T; fn f(t: &T) { t.m() }"),
        ("q/tree.rs", "impl super::T { pub(super) fn m(&self) {} }"),
    ]);
    let found = cycles(&references(&sources));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("p/inner.rs <-> p/mod.rs"), "{found:?}");
}

/// The profiler's modules from the bottom of the house up: a module uses its own layer and the
/// ones below, never one above. Data flows up (BPF events → sources → stacks → profiles →
/// writers), and what a lower layer needs of a higher one belongs lower.
const LAYERS: &[&[&str]] = &[
    // The model and the small things everything uses.
    &["lib", "frame", "names", "units", "profile", "profile_kind", "target", "outfile", "status", "preflight"],
    // Writers over the profile model, and the samples they read back.
    &["samples", "output"],
    // What gpuflame knows of processes: their maps, tables, Python, and who they are.
    &["process", "workload"],
    &["stacks"],
    &["cuda"],
    &["sources"],
    &["session"],
    // The commands.
    &["record", "agent", "convert", "dump", "cli", "main"],
];

/// Each use of a module of a higher layer, described for a person.
fn uses_up_the_house(refs: &References) -> Vec<String> {
    let top = |f: &str| f.split('/').next().unwrap_or("").trim_end_matches(".rs").to_string();
    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let mut out = Vec::new();
    for (from, targets) in refs {
        for (to, path) in targets {
            match (layer(&top(from)), layer(&top(to))) {
                (Some(a), Some(b)) if b > a => out.push(format!("{from} (layer {a}) uses {path} ({to}, layer {b})")),
                (None, _) => out.push(format!("{from}: its module {} is in no layer of LAYERS", top(from))),
                _ => {}
            }
        }
    }
    out
}

#[test]
fn no_module_uses_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Vec::new();
    rust_files(&src, &src, &mut sources);
    let found = uses_up_the_house(&references(&sources));
    assert!(found.is_empty(), "{} uses up the house:\n{}", found.len(), found.join("\n"));
}

#[test]
fn a_use_up_the_house_is_seen() {
    let refs = references(&fake(&[
        ("stacks/mod.rs", "use crate::output::Detail; pub struct X;"),
        ("output/mod.rs", "pub enum Detail { A } fn f() { crate::stacks::X; }"),
        ("record/mod.rs", "use crate::stacks::X;"),
    ]));
    assert_eq!(uses_up_the_house(&refs), ["output/mod.rs (layer 1) uses crate::stacks::X (stacks/mod.rs, layer 3)"]);
}
