//! Folded stacks, one line per stack: `comm;root;…;leaf COUNT`, kernel frames marked `_[k]` (the
//! convention of Brendan Gregg's stackcollapse scripts, which inferno colours accordingly).

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::profile::{Labels, Line, Location, Mapping, Profile, ProfileBuilder, KERNEL_MAPPING, PYTHON_MAPPING};

const KERNEL_SUFFIX: &str = "_[k]";

/// The folded lines of a profile, merged over pid and tid, in sorted order. Values are sample
/// counts for sampled-time profiles and raw values otherwise.
pub fn lines(profile: &Profile) -> Vec<String> {
    let mut merged: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.samples {
        // A process may name itself "": an empty first frame would make an unreadable line.
        let comm = sample.labels.comm.as_deref().filter(|c| !c.is_empty()).unwrap_or("[unknown]");
        let mut frames = vec![sanitize(comm)];
        for &loc in &sample.stack {
            let location = &profile.locations[loc];
            let python = location.mapping.is_some_and(|m| profile.mappings[m].path == PYTHON_MAPPING);
            for line in &location.lines {
                let mut name = if python { python_name(line) } else { sanitize(&line.function) };
                if location.kernel {
                    name.push_str(KERNEL_SUFFIX);
                }
                frames.push(name);
            }
        }
        *merged.entry(frames.join(";")).or_default() += profile.sample_count(sample.value());
    }
    merged.into_iter().filter(|(_, n)| *n > 0).map(|(stack, n)| format!("{stack} {n}")).collect()
}

pub fn write(profile: &Profile, mut out: impl Write) -> io::Result<()> {
    for line in lines(profile) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Python frames read as py-spy shows them: `step (train.py:41)`.
fn python_name(line: &Line) -> String {
    let file = line.file.as_deref().unwrap_or("");
    let base = file.rsplit('/').next().unwrap_or(file);
    let name = match line.line {
        Some(n) => format!("{} ({base}:{n})", line.function),
        None => format!("{} ({base})", line.function),
    };
    sanitize(&name)
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
            let location = Location { mapping, address: 0, kernel, lines: vec![Line::function(name)] };
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
    fn round_trip() {
        let text = "app;main;a;b;c 7\napp;main;read;ksys_read_[k];vfs_read_[k] 3\n";
        let profile = read(text, 10).unwrap();
        assert_eq!(profile.total(), 100);
        let kernel: Vec<_> = profile.locations.iter().filter(|l| l.kernel).map(|l| &l.lines[0].function).collect();
        assert_eq!(kernel, ["ksys_read", "vfs_read"]);
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn merges_threads_and_sanitizes() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let loc = b.location(&mut profile, Location { mapping: None, address: 1, kernel: false, lines: vec![Line::function("a;b")] });
        for tid in [1, 2] {
            let labels = Labels { pid: Some(1), tid: Some(tid), comm: Some("x".into()), device: None };
            b.add(vec![loc], labels, 2 * profile.period);
        }
        b.finish(&mut profile);
        assert_eq!(lines(&profile), ["x;a:b 4"]);
    }

    #[test]
    fn hostile_names_stay_one_frame_on_one_line() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let line = Line { function: "f;\n\x1b".into(), file: Some("/a/b;\r.py".into()), line: Some(7) };
        let py = b.mapping(&mut profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
        let loc = b.location(&mut profile, Location { mapping: Some(py), address: 0, kernel: false, lines: vec![line] });
        b.add(vec![loc], Labels { comm: Some(String::new()), ..Default::default() }, profile.period);
        b.finish(&mut profile);
        let text = lines(&profile);
        assert_eq!(text, [r"[unknown];f:\n\x1b (b:\r.py:7) 1"]);
        assert_eq!(read(&text[0], 1).unwrap().locations.len(), 1);
    }

    #[test]
    fn bad_lines_say_where() {
        assert_eq!(read("a;b 1\nnocount\n", 1).unwrap_err().line, 2);
        assert!(read("a;b x\n", 1).is_err());
    }
}
