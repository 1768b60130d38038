//! Interactive SVG flame graphs, drawn by inferno from the folded lines.

use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use crate::profile::Profile;

pub fn write(profile: &Profile, title: &str, out: impl Write) -> io::Result<()> {
    let lines = super::folded::lines(profile);
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = if profile.sample_type.unit == "nanoseconds" { "samples".into() } else { profile.sample_type.unit.clone() };
    options.subtitle = Some(format!(
        "{} · {} samples · gpuflame",
        profile.sample_type.kind,
        lines.iter().filter_map(|l| l.rsplit_once(' ')?.1.parse::<i64>().ok()).sum::<i64>()
    ));
    if lines.is_empty() {
        // inferno refuses an empty input; an empty graph with its title says more than an error.
        options.subtitle = Some("no samples were recorded".into());
        return flamegraph::from_lines(&mut options, ["(no samples) 0"].iter().copied(), out).map_err(io::Error::other);
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(io::Error::other)
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
}
