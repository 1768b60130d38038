//! Differential flame graphs, the usual way to see what a change did: the stacks of the new
//! profile drawn as usual, each frame coloured by how its time changed against the base (red:
//! more, blue: less, white: the same), after Brendan Gregg's `difffolded.pl` and inferno.

use crate::frame::Rgb;
use std::io::{self, Write};

use inferno::differential;
use inferno::flamegraph::{self, Options};

use super::rendering::Detail;
use super::{folded, svg};
use crate::names::sanitize;
use crate::profile::Profile;

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

/// `stack BASE NEW` lines: every stack of either profile with its count in each. With
/// `normalize`, the base is scaled to the new profile's total first, so that a longer or busier
/// recording does not paint everything red.
pub fn lines(base: &Profile, new: &Profile, detail: Detail, normalize: bool) -> Result<Vec<String>, DiffError> {
    let (b, n) = (base.sample_type(), new.sample_type());
    if b.kind != n.kind || b.unit != n.unit {
        return Err(DiffError::Mismatch { base: format!("{}/{}", b.kind, b.unit), new: format!("{}/{}", n.kind, n.unit) });
    }
    let text = |p: &Profile| folded::lines(p, detail).join("\n").into_bytes();
    let mut out = Vec::new();
    let options = differential::Options { normalize, strip_hex: false };
    differential::from_readers(options, text(base).as_slice(), text(new).as_slice(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).lines().map(str::to_string).collect())
}

fn counts(line: &str) -> Option<(i64, i64)> {
    let mut parts = line.rsplitn(3, ' ');
    let new = parts.next()?.parse().ok()?;
    let base = parts.next()?.parse().ok()?;
    Some((base, new))
}

pub fn summary(lines: &[String]) -> DiffSummary {
    let mut s = DiffSummary { base_samples: 0, new_samples: 0, grew: 0, shrank: 0 };
    for (base, new) in lines.iter().filter_map(|l| counts(l)) {
        s.base_samples += base;
        s.new_samples += new;
        s.grew += usize::from(new > base);
        s.shrank += usize::from(new < base);
    }
    s
}

/// The differential flame graph of `lines` (from [`lines`]).
pub fn write_svg(lines: &[String], title: &str, subtitle: &str, count_name: &str, mut out: impl Write) -> io::Result<()> {
    let title = sanitize(title);
    let summary = summary(lines);
    // Stacks gone from the new profile have no width to draw.
    let drawn: Vec<String> = lines.iter().filter(|l| counts(l).is_some_and(|(_, new)| new > 0)).cloned().collect();
    let (drawn, collapsed) = svg::drawn_lines(drawn, 2);
    if drawn.is_empty() {
        return svg::write_empty(&title, out);
    }
    let mut options = Options::default();
    options.title = title.into_owned();
    options.count_name = count_name.to_string();
    let mut sub = format!("{} · {} {count_name} → {} · {} stacks grew, {} shrank or went", sanitize(subtitle), summary.base_samples, summary.new_samples, summary.grew, summary.shrank);
    if collapsed > 0 {
        sub.push_str(&format!(" · {collapsed} in stacks over {} frames (middle collapsed)", svg::MAX_DEPTH));
    }
    options.subtitle = Some(sub);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, drawn.iter().map(String::as_str), &mut svg).map_err(io::Error::other)?;
    let svg = String::from_utf8(svg).map_err(io::Error::other)?;
    let legend = [("more than in the base", Rgb(230, 60, 60)), ("fewer", Rgb(60, 60, 230)), ("the same", Rgb(250, 250, 250))];
    out.write_all(svg::with_legend(&svg::label_root(&svg), &legend).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(summary(&lines), DiffSummary { base_samples: 110, new_samples: 205, grew: 2, shrank: 1 });
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
        let lines = vec!["app;main;compute 50 150".to_string(), "app;main;parse 50 50".to_string(), "app;main;gone 10 0".to_string()];
        let mut out = Vec::new();
        write_svg(&lines, "base.pb.gz → new.pb.gz · cpu", "diff", "samples", &mut out).unwrap();
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
