//! Interactive SVG flame graphs, drawn by inferno from the folded lines.

use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use crate::names::sanitize;
use crate::profile::Profile;

pub fn write(profile: &Profile, title: &str, out: impl Write) -> io::Result<()> {
    // The title holds the profiled command line, which may hold anything; inferno escapes only
    // XML's markup characters, not the control characters XML forbids.
    let title = sanitize(title);
    let title = title.as_ref();
    let lines = super::folded::lines(profile);
    let mut options = Options::default();
    options.title = title.to_string();
    let sample_type = profile.sample_type();
    options.count_name = if sample_type.unit == "nanoseconds" && profile.period > 1 { "samples".into() } else { sample_type.unit.clone() };
    let total: i64 = lines.iter().filter_map(|l| l.rsplit_once(' ')?.1.parse::<i64>().ok()).sum();
    let what = if sample_type.unit == "nanoseconds" && profile.period > 1 { "samples" } else { sample_type.unit.as_str() };
    let mut subtitle = format!("{} · {total} {what} · gpuflame", sample_type.kind);
    for comment in &profile.comments {
        subtitle.push_str(" · ");
        subtitle.push_str(comment);
    }
    options.subtitle = Some(sanitize(&subtitle).into_owned());
    if lines.is_empty() {
        // inferno refuses an empty input; an empty graph that says so beats no file at all.
        return write_empty(title, out);
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
}

fn write_empty(title: &str, mut out: impl Write) -> io::Result<()> {
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

    #[test]
    fn svg_is_well_formed_and_names_frames() {
        let profile = folded::read("app;main;compute_&_sum<int>;leaf 5\napp;main;other 2\n", 1).unwrap();
        let mut out = Vec::new();
        write(&profile, "test", &mut out).unwrap();
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
            write(&profile, "python3 -c \x1bx\0", &mut out).unwrap();
            let svg = String::from_utf8(out).unwrap();
            let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
            roxmltree::Document::parse_with_options(&svg, options).expect("well-formed XML");
            assert!(svg.contains(r"python3 -c \x1bx\x00"));
        }
    }

    #[test]
    fn empty_profile_is_a_valid_svg_that_says_so() {
        let mut out = Vec::new();
        write(&crate::profile::Profile::cpu(99), "a <title> & more", &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        roxmltree::Document::parse(&svg).expect("well-formed XML");
        assert!(svg.contains("no samples were recorded") && svg.contains("a &lt;title&gt; &amp; more"));
    }
}
