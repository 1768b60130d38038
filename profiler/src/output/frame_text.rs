//! How frames read in folded lines: names without `;`, Python frames as py-spy shows them.

use super::rendering::Detail;
use crate::profile::{Line, Profile};
use crate::samples::Stack;

/// Python frames read as py-spy shows them: `step (train.py)`, or with [`Detail::Lines`]
/// `step (train.py:41)`, `backward (torch/autograd/__init__.py:395)`. Also the file's full
/// path when it is shown shortened.
pub(super) fn python_name<'a>(line: &'a Line, script_dir: Option<&str>, detail: Detail) -> (String, Option<&'a str>) {
    let full = line.file.as_deref().unwrap_or("");
    let file = python_file(full, script_dir);
    let name = match line.line {
        Some(n) if detail == Detail::Lines => format!("{} ({file}:{n})", line.function),
        _ => format!("{} ({file})", line.function),
    };
    (sanitize(&name), (file != full).then_some(full))
}

/// The directory of the stack's main script (its outermost `<module>`): sys.path[0], the entry
/// a project's own modules are imported from.
pub(super) fn script_dir<'a, S>(profile: &'a Profile<S>, python: &[bool], stack: Stack<'_>) -> Option<&'a str> {
    let line = stack.iter().filter(|&l| python[l]).flat_map(|l| profile.locations[l].lines.last()).next()?;
    if line.function != "<module>" {
        return None;
    }
    let file = line.file.as_deref()?;
    Some(file.rsplit_once('/').map_or("", |(dir, _)| dir)).filter(|d| !d.is_empty())
}

/// A Python file relative to the sys.path entry it came from, as far as the path tells: after
/// site-packages or dist-packages, after the standard library's lib/pythonX.Y, after the main
/// script's directory; otherwise the path as the interpreter has it. The full path stays in
/// pprof's Function.filename.
pub(super) fn python_file<'a>(file: &'a str, script_dir: Option<&str>) -> &'a str {
    if file.starts_with('<') {
        return file;
    }
    for packages in ["/site-packages/", "/dist-packages/"] {
        if let Some(at) = file.rfind(packages) {
            return &file[at + packages.len()..];
        }
    }
    if let Some(at) = file.rfind("/lib/python") {
        // `/lib/python3.11/json/decoder.py`: past the version directory.
        let rest = &file[at + "/lib/".len()..];
        if let Some(slash) = rest.find('/') {
            return &rest[slash + 1..];
        }
    }
    if let Some(dir) = script_dir {
        if let Some(rest) = file.strip_prefix(dir).and_then(|r| r.strip_prefix('/')) {
            return rest;
        }
    }
    file
}

/// A `;` would split the frame in two. It becomes `:`, readable and rare in real names, rather
/// than an escape that no folded reader undoes; newlines cannot reach here, the profile builder
/// escaped them (crate::names).
pub(super) fn sanitize(name: &str) -> String {
    name.replace(';', ":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_files_are_relative_to_their_sys_path_entry() {
        let script = Some("/home/me/proj");
        assert_eq!(python_file("/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", script), "torch/autograd/__init__.py");
        assert_eq!(python_file("/usr/lib/python3/dist-packages/numpy/core/numeric.py", None), "numpy/core/numeric.py");
        assert_eq!(python_file("/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py", None), "json/decoder.py");
        assert_eq!(python_file("/home/me/proj/models/net.py", script), "models/net.py");
        assert_eq!(python_file("/home/me/proj/train.py", script), "train.py");
        assert_eq!(python_file("<frozen importlib._bootstrap>", script), "<frozen importlib._bootstrap>");
        assert_eq!(python_file("/opt/other/lib.py", script), "/opt/other/lib.py");
        assert_eq!(python_file("train.py", None), "train.py");
    }
}
