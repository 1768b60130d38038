//! Folded stacks, one line per stack: `comm;root;…;leaf COUNT`, kernel frames marked `_[k]` (the
//! convention of Brendan Gregg's stackcollapse scripts, which inferno colours accordingly).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use super::rendering::Detail;
use crate::frame::FrameKind;
use crate::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, KERNEL_MAPPING, PYTHON_MAPPING};

const KERNEL_SUFFIX: &str = "_[k]";

/// Folded stacks as written and drawn.
#[derive(Debug, Default)]
pub struct Folded {
    /// `comm;root;…;leaf COUNT`, merged over pid and tid, in sorted order.
    pub lines: Vec<String>,
    /// Python frames whose file is shown shortened, with the file's full path.
    pub full_paths: HashMap<String, String>,
    /// What each frame of the lines is, by its name in them (the first location's kind, where
    /// two kinds of frame have one name).
    pub kinds: HashMap<String, FrameKind>,
}

/// The folded lines of a profile, merged over pid and tid, in sorted order. Values are sample
/// counts for sampled-time profiles and raw values otherwise.
pub fn lines(profile: &Profile, detail: Detail) -> Vec<String> {
    fold(profile, detail).lines
}

pub fn fold(profile: &Profile, detail: Detail) -> Folded {
    let mut merged: BTreeMap<String, i64> = BTreeMap::new();
    let mut full_paths = HashMap::new();
    let mut kinds = HashMap::new();
    // The main script's directory of each process, for the stacks of its other threads too.
    let mut script_dirs: HashMap<Option<u32>, &str> = HashMap::new();
    for sample in &profile.samples {
        if let Some(dir) = script_dir(profile, &sample.stack) {
            script_dirs.entry(sample.labels.pid).or_insert(dir);
        }
    }
    for sample in &profile.samples {
        // A process may name itself "": an empty first frame would make an unreadable line.
        let comm = sample.labels.comm.as_deref().filter(|c| !c.is_empty()).unwrap_or("[unknown]");
        let mut frames = vec![sanitize(comm)];
        // The process's name is no location of the profile: it keeps the colour its name gave
        // it in every flame graph so far.
        kinds.entry(frames[0].clone()).or_insert_with(|| FrameKind::guess(comm));
        let script_dir = script_dir(profile, &sample.stack).or_else(|| script_dirs.get(&sample.labels.pid).copied());
        for &loc in &sample.stack {
            let location = &profile.locations[loc];
            let python = location.mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING);
            for line in &location.lines {
                let mut name = if python {
                    let (name, full) = python_name(line, script_dir, detail);
                    if let Some(full) = full {
                        full_paths.entry(name.clone()).or_insert_with(|| full.to_string());
                    }
                    name
                } else {
                    sanitize(&line.function)
                };
                if location.kernel {
                    name.push_str(KERNEL_SUFFIX);
                }
                kinds.entry(name.clone()).or_insert(location.kind);
                frames.push(name);
            }
        }
        *merged.entry(frames.join(";")).or_default() += profile.sample_count(sample.value());
    }
    let lines = merged.into_iter().filter(|(_, n)| *n > 0).map(|(stack, n)| format!("{stack} {n}")).collect();
    Folded { lines, full_paths, kinds }
}

pub fn write(profile: &Profile, detail: Detail, mut out: impl Write) -> io::Result<()> {
    for line in lines(profile, detail) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Python frames read as py-spy shows them: `step (train.py)`, or with [`Detail::Lines`]
/// `step (train.py:41)`, `backward (torch/autograd/__init__.py:395)`. Also the file's full
/// path when it is shown shortened.
fn python_name<'a>(line: &'a Line, script_dir: Option<&str>, detail: Detail) -> (String, Option<&'a str>) {
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
fn script_dir<'a>(profile: &'a Profile, stack: &[usize]) -> Option<&'a str> {
    let python = |loc: &Location| loc.mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING);
    let line = stack.iter().map(|&l| &profile.locations[l]).filter(|l| python(l)).flat_map(|l| l.lines.last()).next()?;
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
fn python_file<'a>(file: &'a str, script_dir: Option<&str>) -> &'a str {
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
fn sanitize(name: &str) -> String {
    name.replace(';', ":")
}

#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct FoldedError {
    pub line: usize,
    pub reason: &'static str,
}

/// Parses folded stacks into a CPU profile whose samples are `period` nanoseconds each. The first
/// frame of each line is taken as the command name.
pub fn read(text: &str, period: i64) -> Result<Profile, FoldedError> {
    let mut profile = Profile::cpu(1);
    profile.period = period;
    let mut builder = ProfileBuilder::default();
    for (i, raw) in text.lines().enumerate() {
        let raw = raw.trim_end();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let err = |reason| FoldedError { line: i + 1, reason };
        let (stack, count) = raw.rsplit_once(' ').ok_or_else(|| err("no count after the stack"))?;
        let count: i64 = count.parse().map_err(|_| err("the count is not a number"))?;
        let mut frames = stack.split(';');
        let comm = frames.next().filter(|c| !c.is_empty()).ok_or_else(|| err("empty stack"))?;
        let mut locations = Vec::new();
        for frame in frames {
            let (name, kernel) = match frame.strip_suffix(KERNEL_SUFFIX) {
                Some(n) => (n, true),
                None => (frame, false),
            };
            let mapping = kernel.then(|| {
                builder.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None })
            });
            // Folded text does not say what a frame is: its name is all there is to go by.
            let location = Location { mapping, address: 0, kernel, kind: FrameKind::guess(frame), lines: vec![Line::function(name)] };
            locations.push(builder.location(&mut profile, location));
        }
        let labels = Labels { comm: Some(comm.to_string()), ..Default::default() };
        builder.add(locations, labels, count.saturating_mul(period));
    }
    builder.finish(&mut profile);
    Ok(profile)
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

    #[test]
    fn round_trip() {
        let text = "app;main;a;b;c 7\napp;main;read;ksys_read_[k];vfs_read_[k] 3\n";
        let profile = read(text, 10).unwrap();
        assert_eq!(profile.total(), 100);
        let kernel: Vec<_> = profile.locations.iter().filter(|l| l.kernel).map(|l| &l.lines[0].function).collect();
        assert_eq!(kernel, ["ksys_read", "vfs_read"]);
        let mut out = Vec::new();
        write(&profile, Detail::Lines, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn merges_threads_and_sanitizes() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let loc = b.location(&mut profile, Location { mapping: None, address: 1, kernel: false, kind: FrameKind::Native, lines: vec![Line::function("a;b")] });
        for tid in [1, 2] {
            let labels = Labels { pid: Some(1), tid: Some(tid), comm: Some("x".into()), device: None };
            b.add(vec![loc], labels, 2 * profile.period);
        }
        b.finish(&mut profile);
        assert_eq!(lines(&profile, Detail::Lines), ["x;a:b 4"]);
    }

    #[test]
    fn hostile_names_stay_one_frame_on_one_line() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let line = Line { function: "f;\n\x1b".into(), file: Some("/a/b;\r.py".into()), line: Some(7) };
        let py = b.mapping(&mut profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
        let loc = b.location(&mut profile, Location { mapping: Some(py), address: 0, kernel: false, kind: FrameKind::Python, lines: vec![line] });
        b.add(vec![loc], Labels { comm: Some(String::new()), ..Default::default() }, profile.period);
        b.finish(&mut profile);
        let text = lines(&profile, Detail::Lines);
        assert_eq!(text, [r"[unknown];f:\n\x1b (/a/b:\r.py:7) 1"]);
        assert_eq!(read(&text[0], 1).unwrap().locations.len(), 1);
    }

    #[test]
    fn bad_lines_say_where() {
        assert_eq!(read("a;b 1\nnocount\n", 1).unwrap_err().line, 2);
        assert!(read("a;b x\n", 1).is_err());
    }
}
