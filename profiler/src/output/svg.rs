//! Interactive SVG flame graphs, drawn by inferno from the folded lines: frames coloured by
//! kind (Python, native, kernel, CUDA API, GPU kernel) with a legend, kernel frames marked
//! ` [k]`, and stacks deeper than [`MAX_DEPTH`] collapsed in the middle so that a deep import
//! does not make a picture thousands of pixels tall (`drawn.rs`).

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};

use inferno::flamegraph::color::{Color, PaletteMap};
use inferno::flamegraph::Options;

pub use super::drawn::MAX_DEPTH;
use super::drawn::{draw, Drawn, COLLAPSED};
use super::fold::{fold, FoldedLines};
use super::frame_names::FrameNames;
use super::rendering::Rendering;
use crate::frame::{FrameKind, Rgb};
use crate::names::sanitize;
use crate::profile::Profile;
use crate::samples::Samples;

/// Each comment in the subtitle is cut to this many characters (the whole command line stays in
/// pprof), and only the first few are shown.
const MAX_COMMENT: usize = 72;
const MAX_COMMENTS: usize = 2;

/// Cuts `text` to `max` characters in its middle: a command line keeps its program and its
/// arguments, the ends people tell runs apart by.
fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.into();
    }
    let head = max * 2 / 5;
    let tail = max - head - 1;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out.into()
}

pub fn write<S: Samples>(profile: &Profile<S>, rendering: &Rendering<'_>, out: impl Write) -> io::Result<()> {
    let mut names = FrameNames::default();
    let folded = fold(profile, rendering.detail, &mut names);
    write_folded(profile, &folded, &names, rendering, out)
}

/// The flame graph of `folded`, the lines of `profile` (whose samples are not read: a profile
/// without them will do, see [`Profile::without_samples`]).
pub fn write_folded<S>(profile: &Profile<S>, folded: &FoldedLines, names: &FrameNames, rendering: &Rendering<'_>, out: impl Write) -> io::Result<()> {
    // The title holds the profiled program's name, which may hold anything; inferno escapes only
    // XML's markup characters, not the control characters XML forbids.
    let title = sanitize(rendering.title);
    let title = title.as_ref();
    let drawn = Drawn::new(names);
    let seq = |i: usize| folded.names(i);
    let mut options = Options::default();
    options.title = title.to_string();
    let sample_type = profile.sample_type();
    options.count_name = if sample_type.unit == "nanoseconds" && profile.period > 1 { "samples".into() } else { sample_type.unit.clone() };
    // Samples in all, those in stacks drawn collapsed, and every name drawn.
    let (mut total, mut collapsed) = (0, 0);
    let mut used = vec![false; drawn.names.len()];
    for i in 0..folded.len() {
        total += folded.count(i);
        if seq(i).len() > MAX_DEPTH {
            collapsed += folded.count(i);
        }
        drawn.ids(seq(i), false).for_each(|id| used[id as usize] = true);
    }
    let what = if sample_type.unit == "nanoseconds" && profile.period > 1 { "samples" } else { sample_type.unit.as_str() };
    let mut subtitle = format!("{} · {total} {what}", sample_type.kind);
    // Which ranks of a job: what tells one rank's graph from another's.
    if let Some(ranks) = super::identity::describe(&profile.process_labels) {
        subtitle.push_str(" · ");
        subtitle.push_str(&cut(&ranks, MAX_COMMENT));
    }
    // Comments (the command line) are cut, never what the graph itself needs said.
    for comment in profile.comments.iter().take(MAX_COMMENTS) {
        subtitle.push_str(" · ");
        subtitle.push_str(&cut(comment, MAX_COMMENT));
    }
    if collapsed > 0 {
        subtitle.push_str(&format!(" · {collapsed} in stacks over {MAX_DEPTH} frames (middle collapsed)"));
    }
    options.subtitle = Some(sanitize(&subtitle).into_owned());
    if folded.is_empty() {
        // inferno refuses an empty input; an empty graph that says so beats no file at all.
        return write_empty(title, out);
    }
    let mut palette = PaletteMap::default();
    // inferno's own root, which it names "all".
    palette.insert("", color(FrameKind::Marker, ""));
    let mut kinds = HashSet::new();
    for id in (0..used.len()).filter(|&id| used[id]) {
        let frame = drawn.names.get(id as u32);
        let kind = drawn_kind(frame, folded, names);
        kinds.insert(kind);
        palette.insert(frame, color(kind, frame));
    }
    options.palette_map = Some(&mut palette);
    let mut svg = Vec::new();
    draw(&drawn, folded.len(), |i| (seq(i), [folded.count(i), 0], 1), &mut options, &mut svg)?;
    let svg = String::from_utf8(svg).map_err(io::Error::other)?;
    let mut out = out;
    let legend: Vec<(&str, Rgb)> = FrameKind::LEGEND.iter().filter(|k| kinds.contains(k)).map(|k| (k.name(), k.base())).collect();
    out.write_all(with_legend(&with_full_paths(&label_root(&svg), &folded.full_paths), &legend).as_bytes())
}

/// What a frame as drawn is: as the profile says, by its folded name (kernel frames drawn
/// ` [k]` are folded `_[k]`); the frame that stands for a deep stack's middle is a marker.
fn drawn_kind(frame: &str, folded: &FoldedLines, names: &FrameNames) -> FrameKind {
    if frame == COLLAPSED {
        return FrameKind::Marker;
    }
    let name = frame.strip_suffix(" [k]").map(|k| format!("{k}_[k]"));
    names.lookup(name.as_deref().unwrap_or(frame)).and_then(|id| folded.kind(id)).unwrap_or_else(|| FrameKind::guess(frame))
}

fn color(kind: FrameKind, frame: &str) -> Color {
    let Rgb(r, g, b) = kind.color(frame);
    Color { r, g, b }
}

/// Python frames' tooltips end with the file's full path, inside the parentheses that inferno's
/// script strips from a zoomed frame's label: `step (train.py:41) (52 samples, 3.10%;
/// /home/me/proj/train.py)`. Searching the graph then finds frames by directory too.
fn with_full_paths(svg: &str, full_paths: &HashMap<String, String>) -> String {
    if full_paths.is_empty() {
        return svg.to_string();
    }
    // Keyed as inferno draws them: control characters escaped (see `write`).
    let paths: HashMap<String, &str> = full_paths.iter().map(|(name, path)| (sanitize(name).into_owned(), path.as_str())).collect();
    let mut out = String::with_capacity(svg.len() + 64 * paths.len());
    let mut rest = svg;
    while let Some(start) = rest.find("<title>") {
        let body = start + "<title>".len();
        let Some(len) = rest[body..].find("</title>") else { break };
        let text = &rest[body..body + len];
        out.push_str(&rest[..body]);
        match text.rsplit_once(" (").filter(|(_, counts)| counts.ends_with(')')).and_then(|(name, counts)| Some((paths.get(&xml_unescape(name))?, counts))) {
            Some((path, counts)) => {
                out.push_str(&text[..text.len() - counts.len()]);
                out.push_str(&counts[..counts.len() - 1]);
                out.push_str("; ");
                out.push_str(&xml_escape(&sanitize(path)));
                out.push(')');
            }
            None => out.push_str(text),
        }
        rest = &rest[body + len..];
    }
    out.push_str(rest);
    out
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Text content as quick-xml escapes it (its escaping of quotes changed between versions).
fn xml_unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// inferno draws its root frame without a name (only its tooltip says "all"): name it.
pub(super) fn label_root(svg: &str) -> String {
    let Some(root) = svg.find("<title>all (") else { return svg.to_string() };
    let Some(text) = svg[root..].find("<text ").map(|t| root + t) else { return svg.to_string() };
    let Some(empty) = svg[text..].find("></text>").map(|e| text + e) else { return svg.to_string() };
    if svg[text + 1..empty].contains('<') {
        return svg.to_string();
    }
    format!("{}>all</text>{}", &svg[..empty], &svg[empty + 8..])
}

/// The SVG made 24 px taller, with a legend along the bottom: a swatch and a name per entry.
pub(super) fn with_legend(svg: &str, entries: &[(&str, Rgb)]) -> String {
    let Some(height) = svg_height(svg) else { return svg.to_string() };
    let taller = height + 24;
    let mut legend = r#"<g id="legend" font-family="Verdana" font-size="12">"#.to_string();
    let mut x = 10;
    for &(name, Rgb(r, g, b)) in entries {
        legend.push_str(&format!(
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="rgb({r},{g},{b})"/><text x="{}" y="{}">{}</text>"#,
            height + 4,
            x + 16,
            height + 14,
            name
        ));
        x += 30 + 8 * name.chars().count();
    }
    legend.push_str("</g></svg>");
    let svg = svg.replacen(&format!(r#"height="{height}""#), &format!(r#"height="{taller}""#), 1).replacen(&format!(" {height}\""), &format!(" {taller}\""), 1);
    let svg = svg.replacen(&format!(r#"viewBox="0 0 1200 {height}""#), &format!(r#"viewBox="0 0 1200 {taller}""#), 1);
    match svg.rfind("</svg>") {
        Some(end) => format!("{}{legend}{}", &svg[..end], &svg[end + 6..]),
        None => svg,
    }
}

/// The `height` of the root `<svg>` element.
fn svg_height(svg: &str) -> Option<usize> {
    let start = svg.find("<svg ")?;
    let tag = &svg[start..start + svg[start..].find('>')?];
    let at = tag.find(r#" height=""#)? + 9;
    tag[at..].split('"').next()?.parse().ok()
}

pub(super) fn write_empty(title: &str, mut out: impl Write) -> io::Result<()> {
    let escaped = title.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    write!(
        out,
        concat!(
            r#"<?xml version="1.0" standalone="no"?>"#,
            r#"<svg version="1.1" width="1200" height="80" xmlns="http://www.w3.org/2000/svg">"#,
            r#"<text x="600" y="30" text-anchor="middle" font-family="Verdana" font-size="17">{}</text>"#,
            r#"<text x="600" y="60" text-anchor="middle" font-family="Verdana" font-size="12">no samples were recorded</text>"#,
            "</svg>\n"
        ),
        escaped
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::folded;
    use crate::output::rendering::Detail;
    use crate::profile::{Labels, Line, Location, Mapping, ProfileBuilder, PYTHON_MAPPING};

    fn titled(title: &str) -> Rendering<'_> {
        Rendering { title, detail: Detail::Functions }
    }

    /// A profile of one Python stack: `<module>` of /srv/app/main.py calling `step` in a
    /// site-packages module.
    fn python_profile() -> Profile {
        let mut profile = Profile::cpu(99);
        let mut b = ProfileBuilder::default();
        let mapping = b.mapping(&mut profile, Mapping { path: PYTHON_MAPPING.into(), build_id: None });
        let frame = |function: &str, file: &str, line| Location {
            mapping: Some(mapping),
            address: 0,
            kind: FrameKind::Python,
            lines: vec![Line { function: function.into(), file: Some(file.into()), line: Some(line) }],
        };
        let module = b.location(&mut profile, frame("<module>", "/srv/app/main.py", 3));
        let step_41 = b.location(&mut profile, frame("step", "/venv/lib/python3.11/site-packages/it's/nn.py", 41));
        let step_42 = b.location(&mut profile, frame("step", "/venv/lib/python3.11/site-packages/it's/nn.py", 42));
        b.add(vec![module, step_41], Labels { comm: Some("python3".into()), pid: Some(7), ..Default::default() }, 3 * profile.period);
        b.add(vec![module, step_42], Labels { comm: Some("python3".into()), pid: Some(7), ..Default::default() }, profile.period);
        b.finish(&mut profile);
        profile
    }

    #[test]
    fn functions_by_default_lines_on_request_full_paths_in_tooltips() {
        let profile = python_profile();
        assert_eq!(folded::lines(&profile, Detail::Functions), ["python3;<module> (main.py);step (it's/nn.py) 4"]);
        assert_eq!(
            folded::lines(&profile, Detail::Lines),
            ["python3;<module> (main.py:3);step (it's/nn.py:41) 3", "python3;<module> (main.py:3);step (it's/nn.py:42) 1"]
        );
        let mut out = Vec::new();
        write(&profile, &titled("t"), &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse_with_options(&svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).expect("well-formed XML");
        let titles: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("title")).filter_map(|n| n.text()).collect();
        assert!(titles.contains(&"step (it's/nn.py) (4 samples, 100.00%; /venv/lib/python3.11/site-packages/it's/nn.py)"), "{titles:?}");
        assert!(titles.contains(&"<module> (main.py) (4 samples, 100.00%; /srv/app/main.py)"), "{titles:?}");
    }

    #[test]
    fn long_comments_keep_both_ends() {
        let command = format!("command: /usr/bin/python3 {}/train.py --epochs 3", "/very/long/path".repeat(10));
        let short = cut(&command, MAX_COMMENT);
        assert_eq!(short.chars().count(), MAX_COMMENT);
        assert!(short.starts_with("command: /usr/bin/python3") && short.ends_with("/train.py --epochs 3"), "{short}");
        assert_eq!(cut("short", MAX_COMMENT), "short");
    }

    #[test]
    fn svg_is_well_formed_and_names_frames() {
        let profile = folded::read("app;main;compute_&_sum<int>;leaf 5\napp;main;other 2\n", 1).unwrap();
        let mut out = Vec::new();
        write(&profile, &titled("test"), &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        let doc = roxmltree::Document::parse_with_options(&svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).expect("well-formed XML");
        let titles: Vec<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text().map(str::to_string))
            .collect();
        for name in ["main", "compute_&_sum<int>", "leaf", "other"] {
            assert!(titles.iter().any(|t| t.starts_with(name)), "{name} missing from {titles:?}");
        }
    }

    #[test]
    fn control_characters_in_the_title_stay_well_formed() {
        for profile in [folded::read("app;main 1\n", 1).unwrap(), crate::profile::Profile::cpu(99)] {
            let mut out = Vec::new();
            write(&profile, &titled("python3 -c \x1bx\0"), &mut out).unwrap();
            let svg = String::from_utf8(out).unwrap();
            let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
            roxmltree::Document::parse_with_options(&svg, options).expect("well-formed XML");
            assert!(svg.contains(r"python3 -c \x1bx\x00"));
        }
    }

    #[test]
    fn the_subtitle_names_the_ranks_of_the_processes() {
        let subtitle = |profile: &Profile| {
            let mut out = Vec::new();
            write(profile, &titled("t"), &mut out).unwrap();
            let svg = String::from_utf8(out).unwrap();
            let doc = roxmltree::Document::parse_with_options(&svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).unwrap();
            doc.descendants().find(|n| n.attribute("id") == Some("subtitle")).and_then(|n| n.text()).unwrap_or_default().to_string()
        };
        let mut profile = python_profile();
        assert_eq!(subtitle(&profile), "cpu · 4 samples");
        profile.process_labels.insert(7, vec![("rank".into(), "2".into()), ("world_size".into(), "4".into())]);
        assert_eq!(subtitle(&profile), "cpu · 4 samples · rank 2 · world_size 4");
    }

    #[test]
    fn empty_profile_is_a_valid_svg_that_says_so() {
        let mut out = Vec::new();
        write(&crate::profile::Profile::cpu(99), &titled("a <title> & more"), &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        roxmltree::Document::parse(&svg).expect("well-formed XML");
        assert!(svg.contains("no samples were recorded") && svg.contains("a &lt;title&gt; &amp; more"));
    }
}
