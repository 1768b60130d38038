//! Differential flame graphs, the usual way to see what a change did: the stacks of the new
//! profile drawn as usual, each frame coloured by how its time changed against the base (red:
//! more, blue: less, white: the same), after Brendan Gregg's `difffolded.pl` and inferno.

use std::io::{self, Write};

use inferno::flamegraph::Options;

use super::drawn::{draw, Drawn, NameSeq, MAX_DEPTH};
use super::fold::{fold, FoldedLines};
use super::frame_names::{FrameNames, Tail};
use super::rendering::Detail;
use super::svg;
use crate::frame::Rgb;
use crate::names::sanitize;
use crate::profile::Profile;
use crate::samples::Samples;

/// What a differential graph compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffSummary {
    pub base_samples: i64,
    pub new_samples: i64,
    /// Stacks with more samples in the new profile (new stacks included), and with fewer (gone
    /// stacks included).
    pub grew: usize,
    pub shrank: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("the profiles measure different things: {base} against {new}")]
    Mismatch { base: String, new: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Whether two profiles measure the same thing, as a diff needs.
pub fn check<A, B>(base: &Profile<A>, new: &Profile<B>) -> Result<(), DiffError> {
    let (b, n) = (base.sample_type(), new.sample_type());
    if b.kind != n.kind || b.unit != n.unit {
        return Err(DiffError::Mismatch { base: format!("{}/{}", b.kind, b.unit), new: format!("{}/{}", n.kind, n.unit) });
    }
    Ok(())
}

/// Every stack of either profile with its count in each, sorted as text: what inferno's
/// `differential` makes of the two profiles' folded lines (a stack's trailing whitespace trimmed,
/// as it trims it), without the lines' text. With `normalize`, the base is scaled to the new
/// profile's total, so that a longer or busier recording does not paint everything red.
pub struct Diff {
    names: FrameNames,
    sides: [FoldedLines; 2],
    /// Each name's index with its trailing whitespace trimmed, for the last frame of a stack.
    trimmed: Vec<u32>,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// 0: base, 1: new; the side and line the stack's names are read from.
    side: u8,
    line: u32,
    base: i64,
    new: i64,
}

impl Diff {
    pub fn of<A: Samples, B: Samples>(base: &Profile<A>, new: &Profile<B>, detail: Detail, normalize: bool) -> Result<Diff, DiffError> {
        check(base, new)?;
        let mut names = FrameNames::default();
        let base = fold(base, detail, &mut names);
        let new = fold(new, detail, &mut names);
        Ok(Diff::new(names, base, new, normalize))
    }

    /// The diff of two profiles' folded lines, whose names are `names`.
    pub fn new(mut names: FrameNames, base: FoldedLines, new: FoldedLines, normalize: bool) -> Diff {
        let ends: Vec<(u32, String)> = (0..names.len() as u32).filter_map(|id| Some((id, names.get(id).trim_end().to_string())).filter(|(id, t)| t.len() < names.get(*id).len())).collect();
        let mut trimmed: Vec<u32> = (0..names.len() as u32).collect();
        for (id, t) in ends {
            trimmed[id as usize] = names.id_owned(t);
        }
        let mut diff = Diff { names, sides: [base, new], trimmed, entries: Vec::new() };
        let mut order: Vec<(u8, u32)> = Vec::with_capacity(diff.sides[0].len() + diff.sides[1].len());
        order.extend((0..2u8).flat_map(|side| (0..diff.sides[side as usize].len() as u32).map(move |line| (side, line))));
        let cmp = |a: &(u8, u32), b: &(u8, u32)| diff.names.cmp_lines(diff.key(a.0, a.1).iter(), Tail::none, diff.key(b.0, b.1).iter(), Tail::none);
        order.sort_unstable_by(cmp);
        let mut entries = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let run = order[at..].iter().take_while(|k| cmp(&order[at], k).is_eq()).count();
            let (side, line) = order[at];
            let mut entry = Entry { side, line, base: 0, new: 0 };
            for &(s, l) in &order[at..at + run] {
                let n = diff.sides[s as usize].count(l as usize);
                *(if s == 0 { &mut entry.base } else { &mut entry.new }) += n;
            }
            entries.push(entry);
            at += run;
        }
        let total = |side: &FoldedLines| (0..side.len()).map(|i| side.count(i)).sum::<i64>();
        let (total1, total2) = (total(&diff.sides[0]), total(&diff.sides[1]));
        if normalize && total1 != total2 {
            for e in &mut entries {
                e.base = (e.base as f64 * total2 as f64 / total1 as f64) as usize as i64;
            }
        }
        diff.entries = entries;
        diff
    }

    /// Line `line` of `side`, its last name trimmed.
    fn key(&self, side: u8, line: u32) -> NameSeq<'_> {
        let names = self.sides[side as usize].names(line as usize);
        let last = names.len().checked_sub(1).map(|l| self.trimmed[names.get(l) as usize]);
        NameSeq { last, ..names }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stack `i`, its count in the base and in the new profile.
    pub fn line(&self, i: usize) -> (NameSeq<'_>, i64, i64) {
        let e = self.entries[i];
        (self.key(e.side, e.line), e.base, e.new)
    }

    pub fn summary(&self) -> DiffSummary {
        let mut s = DiffSummary { base_samples: 0, new_samples: 0, grew: 0, shrank: 0 };
        for e in &self.entries {
            s.base_samples += e.base;
            s.new_samples += e.new;
            s.grew += usize::from(e.new > e.base);
            s.shrank += usize::from(e.new < e.base);
        }
        s
    }

    /// `stack BASE NEW` lines.
    pub fn write_folded(&self, mut out: impl Write) -> io::Result<()> {
        let mut text = String::new();
        for i in 0..self.len() {
            let (seq, base, new) = self.line(i);
            text.clear();
            self.stack_text(seq, &mut text);
            writeln!(out, "{text} {base} {new}")?;
        }
        Ok(())
    }

    fn stack_text(&self, seq: NameSeq<'_>, out: &mut String) {
        for (k, id) in seq.iter().enumerate() {
            if k > 0 {
                out.push(';');
            }
            out.push_str(self.names.get(id));
        }
    }

    /// The differential flame graph.
    pub fn write_svg(&self, title: &str, subtitle: &str, count_name: &str, mut out: impl Write) -> io::Result<()> {
        let title = sanitize(title);
        let summary = self.summary();
        // Stacks gone from the new profile have no width to draw.
        let drawn_lines: Vec<u32> = (0..self.len() as u32).filter(|&i| self.entries[i as usize].new > 0).collect();
        let line = |k: usize| {
            let (seq, base, new) = self.line(drawn_lines[k] as usize);
            (seq, [base, new], 2)
        };
        let collapsed: i64 = (0..drawn_lines.len()).map(line).filter(|(seq, _, _)| seq.len() > MAX_DEPTH).map(|(_, [_, new], _)| new).sum();
        if drawn_lines.is_empty() {
            return svg::write_empty(&title, out);
        }
        let mut options = Options::default();
        options.title = title.into_owned();
        options.count_name = count_name.to_string();
        let mut sub = format!("{} · {} {count_name} → {} · {} stacks grew, {} shrank or went", sanitize(subtitle), summary.base_samples, summary.new_samples, summary.grew, summary.shrank);
        if collapsed > 0 {
            sub.push_str(&format!(" · {collapsed} in stacks over {MAX_DEPTH} frames (middle collapsed)"));
        }
        options.subtitle = Some(sub);
        let drawn = Drawn::new(&self.names);
        let mut svg = Vec::new();
        draw(&drawn, drawn_lines.len(), line, &mut options, &mut svg)?;
        let svg = String::from_utf8(svg).map_err(io::Error::other)?;
        let legend = [("more than in the base", Rgb(230, 60, 60)), ("fewer", Rgb(60, 60, 230)), ("the same", Rgb(250, 250, 250))];
        out.write_all(svg::with_legend(&svg::label_root(&svg), &legend).as_bytes())
    }
}

/// `stack BASE NEW` lines: every stack of either profile with its count in each (see [`Diff`]).
pub fn lines<A: Samples, B: Samples>(base: &Profile<A>, new: &Profile<B>, detail: Detail, normalize: bool) -> Result<Vec<String>, DiffError> {
    let diff = Diff::of(base, new, detail, normalize)?;
    let mut out = Vec::new();
    diff.write_folded(&mut out)?;
    Ok(String::from_utf8_lossy(&out).lines().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::folded;

    fn profile(text: &str) -> Profile {
        folded::read(text, 1).unwrap()
    }

    #[test]
    fn lines_pair_the_counts_of_both_profiles() {
        let base = profile("app;main;parse 50\napp;main;compute 50\napp;main;gone 10\n");
        let new = profile("app;main;parse 50\napp;main;compute 150\napp;main;added 5\n");
        let mut lines = lines(&base, &new, Detail::Functions, false).unwrap();
        lines.sort();
        assert_eq!(lines, ["app;main;added 0 5", "app;main;compute 50 150", "app;main;gone 10 0", "app;main;parse 50 50"]);
        let summary = Diff::of(&base, &new, Detail::Functions, false).unwrap().summary();
        assert_eq!(summary, DiffSummary { base_samples: 110, new_samples: 205, grew: 2, shrank: 1 });
    }

    /// As inferno's `differential` reads folded lines: a stack's trailing whitespace is no part
    /// of it.
    #[test]
    fn stacks_are_paired_without_their_trailing_whitespace() {
        let lines = lines(&profile("app;f  3\napp;f\u{3000} 1\napp;g 1\n"), &profile("app;f 2\n"), Detail::Functions, false).unwrap();
        assert_eq!(lines, ["app;f 4 2", "app;g 1 0"]);
    }

    #[test]
    fn normalize_scales_the_base_to_the_new_total() {
        let base = profile("app;a 10\napp;b 10\n");
        let new = profile("app;a 20\napp;b 20\n");
        let mut lines = lines(&base, &new, Detail::Functions, true).unwrap();
        lines.sort();
        assert_eq!(lines, ["app;a 20 20", "app;b 20 20"]);
    }

    #[test]
    fn profiles_of_different_things_are_refused() {
        let mut hbm = Profile::of(vec![crate::profile::ValueType::new("hbm_alloc", "bytes")]);
        hbm.period = 1;
        let err = lines(&profile("app;a 1\n"), &hbm, Detail::Functions, false).unwrap_err();
        assert!(err.to_string().contains("cpu/nanoseconds against hbm_alloc/bytes"), "{err}");
    }

    #[test]
    fn svg_colours_frames_by_change_with_a_legend() {
        let base = profile("app;main;compute 50\napp;main;parse 50\napp;main;gone 10\n");
        let new = profile("app;main;compute 150\napp;main;parse 50\n");
        let mut out = Vec::new();
        Diff::of(&base, &new, Detail::Functions, false).unwrap().write_svg("base.pb.gz → new.pb.gz · cpu", "diff", "samples", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse_with_options(&svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).expect("well-formed XML");
        let fill = |name: &str| {
            let g = doc.descendants().filter(|n| n.has_tag_name("g")).find(|g| g.children().any(|c| c.has_tag_name("title") && c.text().is_some_and(|t| t.starts_with(&format!("{name} (")))));
            g.and_then(|g| g.children().find(|c| c.has_tag_name("rect"))?.attribute("fill").map(str::to_string))
        };
        let compute = fill("compute").expect("compute drawn");
        let parse = fill("parse").expect("parse drawn");
        assert!(compute.starts_with("rgb(255,"), "grown frame {compute}");
        assert_eq!(parse, "rgb(250,250,250)", "unchanged frame");
        assert!(fill("gone").is_none(), "a stack gone from the new profile has no width");
        assert!(svg.contains("1 stacks grew, 1 shrank or went") && svg.contains("more than in the base"));
    }
}
