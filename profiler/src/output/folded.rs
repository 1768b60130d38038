//! Folded stacks, one line per stack: `comm;root;…;leaf COUNT`, kernel frames marked `_[k]` (the
//! convention of Brendan Gregg's stackcollapse scripts, which inferno colours accordingly).

use std::collections::HashMap;
use std::io::{self, BufRead, Write};

use super::fold::{fold, KERNEL_SUFFIX};
use super::frame_names::FrameNames;
use super::rendering::Detail;
use crate::frame::FrameKind;
use crate::profile::{Labels, Line, Location, Mapping, Profile, KERNEL_MAPPING};
use crate::samples::{FlatProfile, Samples, TableBuilder};

/// The folded lines of a profile, merged over pid and tid, in sorted order. Values are sample
/// counts for sampled-time profiles and raw values otherwise.
pub fn lines<S: Samples>(profile: &Profile<S>, detail: Detail) -> Vec<String> {
    let mut names = FrameNames::default();
    let folded = fold(profile, detail, &mut names);
    (0..folded.len())
        .map(|i| {
            let mut line = String::new();
            folded.stack_text(&names, i, &mut line);
            format!("{line} {}", folded.count(i))
        })
        .collect()
}

pub fn write<S: Samples>(profile: &Profile<S>, detail: Detail, out: impl Write) -> io::Result<()> {
    let mut names = FrameNames::default();
    fold(profile, detail, &mut names).write(&names, out)
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
    match read_from(&mut text.as_bytes(), period) {
        Ok(profile) => Ok(profile.expand()),
        Err(FoldedReadError::Line(e)) => Err(e),
        // A &str is UTF-8 and reading it cannot fail.
        Err(FoldedReadError::NotText | FoldedReadError::Io(_)) => Err(FoldedError { line: 0, reason: "not UTF-8 text" }),
    }
}

/// Why folded stacks could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub enum FoldedReadError {
    #[error(transparent)]
    Line(#[from] FoldedError),
    /// A line is not UTF-8: the input is something else (a pprof, uncompressed).
    #[error("not UTF-8 text")]
    NotText,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// [`read`] of a stream, a line at a time: the text is never held whole. On an error the
/// stream is left after the line that caused it.
pub fn read_from(input: &mut impl BufRead, period: i64) -> Result<FlatProfile, FoldedReadError> {
    let mut profile: FlatProfile = Profile::cpu(1).clone_header();
    profile.period = period;
    let mut builder = TableBuilder::new(1);
    // Each distinct frame's location, by its text: a frame is made into a location once, not
    // once per line it is in.
    let mut frames: HashMap<String, usize> = HashMap::new();
    let mut bytes = Vec::new();
    let mut locations = Vec::new();
    for i in 0.. {
        bytes.clear();
        if input.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        let raw = std::str::from_utf8(&bytes).map_err(|_| FoldedReadError::NotText)?.trim_end();
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let err = |reason| FoldedError { line: i + 1, reason };
        let (stack, count) = raw.rsplit_once(' ').ok_or_else(|| err("no count after the stack"))?;
        let count: i64 = count.parse().map_err(|_| err("the count is not a number"))?;
        let mut stack = stack.split(';');
        let comm = stack.next().filter(|c| !c.is_empty()).ok_or_else(|| err("empty stack"))?;
        locations.clear();
        for frame in stack {
            if let Some(&l) = frames.get(frame) {
                locations.push(l);
                continue;
            }
            let (name, kernel) = match frame.strip_suffix(KERNEL_SUFFIX) {
                Some(n) => (n, true),
                None => (frame, false),
            };
            let mapping = kernel.then(|| builder.mapping(&mut profile, Mapping { path: KERNEL_MAPPING.into(), build_id: None }));
            // Folded text does not say what a frame is: its name is all there is to go by.
            let location = Location { mapping, address: 0, kind: FrameKind::guess(frame), lines: vec![Line::function(name)] };
            let l = builder.location(&mut profile, location);
            frames.insert(frame.to_string(), l);
            locations.push(l);
        }
        let labels = Labels { comm: Some(comm.to_string()), ..Default::default() };
        builder.add(locations.iter().copied(), labels, &[count.saturating_mul(period)]);
    }
    builder.finish(&mut profile);
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ProfileBuilder, PYTHON_MAPPING};

    #[test]
    fn round_trip() {
        let text = "app;main;a;b;c 7\napp;main;read;ksys_read_[k];vfs_read_[k] 3\n";
        let profile = read(text, 10).unwrap();
        assert_eq!(profile.total(), 100);
        let kernel: Vec<_> = profile.locations.iter().filter(|l| l.kind == FrameKind::Kernel).map(|l| &l.lines[0].function).collect();
        assert_eq!(kernel, ["ksys_read", "vfs_read"]);
        let mut out = Vec::new();
        write(&profile, Detail::Lines, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn merges_threads_and_sanitizes() {
        let mut profile = Profile::cpu(100);
        let mut b = ProfileBuilder::default();
        let loc = b.location(&mut profile, Location { mapping: None, address: 1, kind: FrameKind::Native, lines: vec![Line::function("a;b")] });
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
        let loc = b.location(&mut profile, Location { mapping: Some(py), address: 0, kind: FrameKind::Python, lines: vec![line] });
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
