//! The lines of a flame graph that inferno needs to draw it. inferno merges its lines into one
//! frame per node of the call tree (56 bytes each, 18.7 million of them for a million stacks of
//! 30 frames: 1 GB) and then drops the frames narrower than `min_width` percent of the total,
//! which at a million stacks are nearly all of them. Here the frames it would drop are found
//! first, with inferno's own reading of lines, and each run of lines under such frames (siblings
//! whose parent is drawn, together no wider than a frame that is drawn) is given to it as one
//! line, cut below the first of them, with the run's total: what it draws is the same, byte for
//! byte (the tests hold the two to each other), from a line per frame it draws, about.
//!
//! Why the same: a dropped frame's descendants are narrower still, so dropped too, and the run's
//! line makes one frame no wider than the run, dropped as well; the run's line is kept only where
//! it sorts between the lines around it and shares as many frames with each as the run's first
//! and last lines did, so every frame drawn starts and ends at the same time, in the same order,
//! with the same delta; and it keeps the run's largest change (lines of two counts), so
//! differential colours are scaled alike. Where no such line can be made, the run's lines are
//! given as they are.

/// A line as inferno's merge reads it (inferno 0.12, flamegraph/merge.rs: `frames`,
/// `parse_nsamples`, `rfind_samples`), from a line `from_lines` has trimmed.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'a> {
    stack: &'a str,
    samples: u64,
    /// The change, for lines of two counts (`stack BASE NEW`).
    delta: Option<isize>,
}

fn parse(line: &str) -> Option<Parsed<'_>> {
    // `from_lines` leaves out empty lines and `# ` comments; `frames` lines without a count or
    // without a stack.
    if line.is_empty() || line.starts_with("# ") {
        return None;
    }
    let mut stack = line;
    let samples = parse_samples(&mut stack)?;
    let delta = parse_samples(&mut stack).map(|base| samples as isize - base as isize);
    (!stack.is_empty()).then_some(Parsed { stack, samples, delta })
}

fn parse_samples(line: &mut &str) -> Option<u64> {
    let at = line.rfind(' ')? + 1;
    let token = &line[at..];
    let digits = match token.find('.') {
        Some(dot) if token[..dot].chars().chain(token[dot + 1..].chars()).all(|c| c.is_ascii_digit()) => &token[..dot],
        Some(_) => return None,
        None if token.chars().all(|c| c.is_ascii_digit()) => token,
        None => return None,
    };
    let n = digits.parse().ok()?;
    *line = line[..at].trim_end();
    Some(n)
}

/// Frames two stacks share, from the root.
fn shared(a: &str, b: &str) -> usize {
    a.split(';').zip(b.split(';')).take_while(|(a, b)| a == b).count()
}

/// Lines `first..end` (inferno's order), all under one frame, or under sibling frames, at `depth`
/// (0 is inferno's root, `all`) that are too narrow to draw, `width` in all; `parent` is the
/// first line of their parent frame.
#[derive(Debug)]
struct Block {
    first: usize,
    end: usize,
    depth: usize,
    parent: usize,
    width: u64,
}

/// The lines to give inferno for the flame graph of `n` lines: `line(i, out)` appends line `i`
/// in inferno's order (sorted as text), trimmed as `from_lines` trims it. `min_width` is
/// inferno's option, a percentage of the total.
pub(super) fn lines(n: usize, min_width: f64, mut line: impl FnMut(usize, &mut String)) -> Vec<String> {
    let mut text = String::new();
    let mut total: u64 = 0;
    for i in 0..n {
        text.clear();
        line(i, &mut text);
        total = total.saturating_add(parse(&text).map_or(0, |p| p.samples));
    }
    // As inferno computes it, to the bit.
    let min_time = min_width / (100.0 / total as f64);
    let mut runs: Vec<Block> = Vec::new();
    for b in narrow_blocks(n, min_time, &mut line) {
        match runs.last_mut() {
            Some(r) if r.end == b.first && r.depth == b.depth && r.parent == b.parent && ((r.width + b.width) as f64) < min_time => {
                r.end = b.end;
                r.width += b.width;
            }
            _ => runs.push(b),
        }
    }
    let mut out = Kept { lines: Vec::new(), last_parsed: None, before: String::new() };
    let mut i = 0;
    for run in &runs {
        (i..run.first).for_each(|j| out.as_is(j, &mut line));
        if !out.one_line(run, n, &mut line) {
            (run.first..run.end).for_each(|j| out.as_is(j, &mut line));
        }
        i = run.end;
    }
    (i..n).for_each(|j| out.as_is(j, &mut line));
    out.lines
}

/// The runs of lines under frames too narrow to draw whose parents are drawn, in order: the
/// frames as inferno's `flow` opens and closes them, line after line.
fn narrow_blocks(n: usize, min_time: f64, line: &mut impl FnMut(usize, &mut String)) -> Vec<Block> {
    // Open frames by depth: when each started, and at which line.
    let mut open: Vec<(u64, usize)> = Vec::new();
    let mut blocks: Vec<Block> = Vec::new();
    let (mut text, mut last) = (String::new(), String::new());
    let mut last_stack = 0..0;
    let mut time: u64 = 0;
    let mut close = |open: &mut Vec<(u64, usize)>, time: u64, end: usize| {
        let depth = open.len() - 1;
        let Some((start, first)) = open.pop() else { return };
        let width = time - start;
        if (width as f64) < min_time {
            // Its descendants' runs are inside its own.
            while blocks.last().is_some_and(|b| b.first >= first) {
                blocks.pop();
            }
            let parent = open.last().map_or(0, |p| p.1);
            blocks.push(Block { first, end, depth, parent, width });
        }
    };
    for i in 0..n {
        text.clear();
        line(i, &mut text);
        let Some(p) = parse(&text) else { continue };
        let frames = p.stack.split(';').count();
        // inferno's root frame, "", is shared by every line after the first.
        let shared = if open.is_empty() { 0 } else { 1 + shared(&last[last_stack.clone()], p.stack) };
        while open.len() > shared {
            close(&mut open, time, i);
        }
        while open.len() < frames + 1 {
            open.push((time, i));
        }
        time = time.saturating_add(p.samples);
        let at = p.stack.as_ptr() as usize - text.as_ptr() as usize;
        last_stack = at..at + p.stack.len();
        std::mem::swap(&mut text, &mut last);
    }
    while !open.is_empty() {
        close(&mut open, time, n);
    }
    blocks
}

/// The lines given to inferno so far.
struct Kept {
    lines: Vec<String>,
    /// The last of them that inferno reads (not a comment, nor a line without a count).
    last_parsed: Option<usize>,
    /// The last line read before the next run that inferno reads, as it was.
    before: String,
}

impl Kept {
    fn as_is(&mut self, j: usize, line: &mut impl FnMut(usize, &mut String)) {
        let mut text = String::new();
        line(j, &mut text);
        if parse(&text).is_some() {
            self.last_parsed = Some(self.lines.len());
            self.before.clone_from(&text);
        }
        self.lines.push(text);
    }

    /// Gives `run` as one line, if one can be made that draws the same (see the module's
    /// documentation): the run's first line cut below the run's frame, else its last line whole.
    fn one_line(&mut self, run: &Block, n: usize, line: &mut impl FnMut(usize, &mut String)) -> bool {
        let mut text = String::new();
        let (mut first, mut last) = (None::<String>, String::new());
        let (mut sum, mut two_counts, mut widest) = (0u64, None::<bool>, None::<isize>);
        let mut last_line = String::new();
        for j in run.first..run.end {
            text.clear();
            line(j, &mut text);
            let Some(p) = parse(&text) else { continue };
            let Some(s) = sum.checked_add(p.samples) else { return false };
            sum = s;
            if *two_counts.get_or_insert(p.delta.is_some()) != p.delta.is_some() {
                return false;
            }
            if let Some(d) = p.delta {
                widest = Some(widest.map_or(d, |w| if d.unsigned_abs() > w.unsigned_abs() { d } else { w }));
            }
            first.get_or_insert_with(|| p.stack.to_string());
            last.clear();
            last.push_str(p.stack);
            last_line.clone_from(&text);
        }
        let Some(first) = first else { return false };
        let mut next = String::new();
        if run.end < n {
            line(run.end, &mut next);
        }
        let before = parse(&self.before).map(|p| p.stack.to_string());
        let around = Around { before: before.as_deref(), next: (run.end < n).then_some(next.as_str()) };
        let cut: String = first.split(';').take(run.depth).collect::<Vec<_>>().join(";");
        for stack in [cut, last.clone()] {
            let Some(one) = self.stands_for(&stack, sum, widest, (&first, &last), &around) else { continue };
            self.last_parsed = Some(self.lines.len());
            self.before = last_line;
            self.lines.push(one);
            return true;
        }
        false
    }

    /// `stack` with the run's counts, if inferno reads it so and it stands where the run's
    /// `ends` (its first and last stacks) stood between the lines `around` it.
    fn stands_for(&self, stack: &str, sum: u64, widest: Option<isize>, ends: (&str, &str), around: &Around<'_>) -> Option<String> {
        let one = match widest {
            None => format!("{stack} {sum}"),
            Some(d) => format!("{stack} {} {sum}", u64::try_from(i128::from(sum) - d as i128).ok()?),
        };
        if parse(&one) != Some(Parsed { stack, samples: sum, delta: widest }) {
            return None;
        }
        // Strictly between the lines around it: inferno sorts what it is given, and a line equal
        // to its neighbour would be one stack with it.
        let sorted = self.lines.last().is_none_or(|p| p.as_str() < one.as_str()) && around.next.is_none_or(|n| one.as_str() < n);
        let previous = self.last_parsed.and_then(|i| parse(&self.lines[i])).map(|p| p.stack);
        let next = around.next.and_then(parse).map(|p| p.stack);
        let shares = |a: Option<&str>, b: &str| a.map(|a| shared(a, b));
        let same_sharing = shares(previous, stack) == shares(around.before, ends.0) && shares(next, stack) == shares(next, ends.1);
        (sorted && same_sharing).then_some(one)
    }
}

/// What is around a run: the stack of the last line before it that inferno reads, as it was
/// given, and the line after it.
struct Around<'a> {
    before: Option<&'a str>,
    next: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferno::flamegraph::{self, Options};

    /// A small generator, for lines that are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// `n` lines of frames from a few names, among them names with spaces, digits after a space,
    /// characters that sort below `;`, kernel marks and leading or trailing whitespace; most
    /// counts small, a few large; one count or two.
    fn lines(rng: &mut Rng, n: usize, two_counts: bool) -> Vec<String> {
        const NAMES: &[&str] = &["a", "b", "b 1", "b1", "b(x)", "c_[k]", "c [k]", " lead", "trail ", "d 12", "e", "f:g", "x.y", "main", "m"];
        let mut out: Vec<String> = (0..n)
            .map(|_| {
                let depth = 1 + rng.below(7);
                let stack: Vec<&str> = (0..depth).map(|d| NAMES[rng.below(if d < 2 { 3 } else { NAMES.len() })]).collect();
                let count = if rng.below(10) == 0 { 1 + rng.below(500) } else { 1 + rng.below(3) };
                let line = if two_counts { format!("{} {} {count}", stack.join(";"), rng.below(600)) } else { format!("{} {count}", stack.join(";")) };
                line.trim().to_string()
            })
            .collect();
        out.sort_unstable();
        out
    }

    fn svg(lines: &[String], min_width: f64) -> Vec<u8> {
        let mut options = Options::default();
        options.min_width = min_width;
        options.deterministic = true;
        let mut svg = Vec::new();
        flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg).unwrap();
        svg
    }

    /// The point of it all: inferno draws the same from the lines kept as from all the lines.
    #[test]
    fn the_lines_kept_draw_what_all_the_lines_draw() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut fewer = 0;
        for case in 0..300 {
            let n = 20 + rng.below(400);
            let all = lines(&mut rng, n, case % 3 == 0);
            let min_width = [0.01, 0.3, 1.0, 4.0][case % 4];
            let kept = super::lines(all.len(), min_width, |i, out| out.push_str(&all[i]));
            fewer += usize::from(kept.len() < all.len());
            assert_eq!(String::from_utf8(svg(&kept, min_width)).unwrap(), String::from_utf8(svg(&all, min_width)).unwrap(), "case {case}: {all:?}");
        }
        assert!(fewer > 200, "only {fewer} of 300 cases were drawn from fewer lines");
    }

    #[test]
    fn lines_are_read_as_inferno_reads_them() {
        assert_eq!(parse("a;b 12"), Some(Parsed { stack: "a;b", samples: 12, delta: None }));
        assert_eq!(parse("a;b 3 12"), Some(Parsed { stack: "a;b", samples: 12, delta: Some(9) }));
        assert_eq!(parse("a;b  5.0"), Some(Parsed { stack: "a;b", samples: 5, delta: None }));
        assert_eq!(parse("a;b x"), None);
        assert_eq!(parse("12"), None);
        assert_eq!(parse("# a 1"), None);
    }
}
