//! The memory timeline as an SVG: per device, the bytes in use over time stacked by the stacks
//! that held the most, the rest as one band, out-of-memory failures marked. Plain SVG with
//! `<title>` tooltips: a browser shows them on hover, and `rsvg-convert` draws it without
//! scripts or CSS.
//!
//! Each point is also a transparent column carrying its numbers (`data-t-s`, `data-total`,
//! `data-bands`: the bands' bytes then, the last being all other stacks), so a tool or a test
//! reads the values the picture was drawn from.

use std::fmt::Write as _;
use std::io::{self, Write};

use crate::units::human_bytes;

#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// The holder's Python line first (`allocate_kv_cache (serve.py:40) ← main (serve.py:90)`).
    pub label: String,
    /// Its whole stack on one line.
    pub stack: String,
    pub peak: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChartPoint {
    /// Seconds since the first event.
    pub t_s: f64,
    pub total: u64,
    /// Bytes per band, then of all other stacks: they add up to `total`.
    pub values: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChartOom {
    pub t_s: f64,
    pub requested: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceChart {
    pub device: u32,
    pub bands: Vec<Band>,
    pub points: Vec<ChartPoint>,
    pub ooms: Vec<ChartOom>,
}

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const PLOT_HEIGHT: f64 = 260.0;
const PALETTE: [&str; 9] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
const OTHER_COLOUR: &str = "#bab0ac";

pub fn write_svg(charts: &[DeviceChart], title: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut svg = String::new();
    let legend_rows: usize = charts.iter().map(|c| c.bands.len() + 1).sum();
    let height = 50.0 + charts.len() as f64 * (PLOT_HEIGHT + 70.0) + legend_rows as f64 * 18.0 + 20.0;
    let _ = writeln!(
        svg,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="24" font-size="16">{}</text>"#,
        escape(title)
    );
    let mut y = 50.0;
    for chart in charts {
        draw_device(&mut svg, chart, y);
        y += PLOT_HEIGHT + 70.0;
    }
    for chart in charts {
        let _ = writeln!(svg, r#"<text x="{LEFT}" y="{y:.0}" font-weight="bold">device {}</text>"#, chart.device);
        y += 18.0;
        let others = (chart.bands.len(), "all other stacks".to_string(), String::new());
        let rows = chart.bands.iter().enumerate().map(|(i, b)| (i, format!("{} — peak {}", b.label, human_bytes(b.peak)), b.stack.clone()));
        for (i, text, stack) in rows.chain(std::iter::once(others)) {
            let _ = writeln!(
                svg,
                r#"<g><title>{}</title><rect x="{LEFT}" y="{:.0}" width="12" height="12" fill="{}"/><text x="{:.0}" y="{:.0}">{}</text></g>"#,
                escape(&stack),
                y - 11.0,
                colour(i, chart.bands.len()),
                LEFT + 18.0,
                y,
                escape(&text)
            );
            y += 18.0;
        }
    }
    svg.push_str("</svg>\n");
    out.write_all(svg.as_bytes())
}

fn colour(band: usize, bands: usize) -> &'static str {
    if band >= bands {
        OTHER_COLOUR
    } else {
        PALETTE[band % PALETTE.len()]
    }
}

fn draw_device(svg: &mut String, chart: &DeviceChart, top: f64) {
    let plot_width = WIDTH - LEFT - RIGHT;
    let bottom = top + PLOT_HEIGHT;
    let t_end = chart.points.last().map_or(0.0, |p| p.t_s).max(chart.ooms.iter().map(|o| o.t_s).fold(0.0, f64::max)).max(1e-3);
    let max = chart.points.iter().map(|p| p.total).max().unwrap_or(0).max(1) as f64;
    let x = |t: f64| LEFT + t / t_end * plot_width;
    let y = |bytes: f64| bottom - bytes / max * PLOT_HEIGHT;
    let _ = writeln!(svg, r#"<g class="device" data-device="{}">"#, chart.device);
    let _ = writeln!(svg, r#"<text x="{LEFT}" y="{:.0}" font-weight="bold">device {} — peak {} in use</text>"#, top - 6.0, chart.device, human_bytes(max as u64));
    let _ = writeln!(svg, r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PLOT_HEIGHT}" fill="#f8f8f8" stroke="#ccc"/>"##);
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let _ = writeln!(svg, r#"<text x="{:.0}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, y(v) + 4.0, human_bytes(v as u64));
    }
    for i in 0..=5 {
        let t = t_end * f64::from(i) / 5.0;
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.0}" text-anchor="middle">{t:.2} s</text>"#, x(t), bottom + 16.0);
    }
    // Memory holds its value from one point to the next: each band is a staircase.
    let n = chart.bands.len() + 1;
    let mut below = vec![0u64; chart.points.len()];
    for band in 0..n {
        let mut upper = Vec::new();
        let mut lower = Vec::new();
        for (i, p) in chart.points.iter().enumerate() {
            let next_t = chart.points.get(i + 1).map_or(p.t_s, |q| q.t_s);
            let v = p.values.get(band).copied().unwrap_or(0);
            let (lo, hi) = (below[i], below[i] + v);
            below[i] = hi;
            upper.push((x(p.t_s), y(hi as f64)));
            upper.push((x(next_t), y(hi as f64)));
            lower.push((x(p.t_s), y(lo as f64)));
            lower.push((x(next_t), y(lo as f64)));
        }
        if upper.is_empty() {
            continue;
        }
        let mut d = String::new();
        for (i, (px, py)) in upper.iter().chain(lower.iter().rev()).enumerate() {
            let _ = write!(d, "{}{px:.1},{py:.1} ", if i == 0 { "M" } else { "L" });
        }
        let label = chart.bands.get(band).map_or("all other stacks".to_string(), |b| format!("{} — peak {}", b.label, human_bytes(b.peak)));
        let _ = writeln!(svg, r#"<path d="{}Z" fill="{}" stroke="none"><title>{}</title></path>"#, d, colour(band, chart.bands.len()), escape(&label));
    }
    for (i, p) in chart.points.iter().enumerate() {
        let next_t = chart.points.get(i + 1).map_or(p.t_s, |q| q.t_s);
        let width = (x(next_t) - x(p.t_s)).max(1.0);
        let values: Vec<String> = p.values.iter().map(u64::to_string).collect();
        let mut tip = format!("{:.3} s: {} in use", p.t_s, human_bytes(p.total));
        for (b, v) in chart.bands.iter().zip(&p.values) {
            if *v > 0 {
                let _ = write!(tip, "\n{}: {}", b.label, human_bytes(*v));
            }
        }
        if let Some(other) = p.values.last().filter(|v| **v > 0) {
            let _ = write!(tip, "\nall other stacks: {}", human_bytes(*other));
        }
        let _ = writeln!(
            svg,
            r#"<rect class="point" x="{:.1}" y="{top}" width="{width:.1}" height="{PLOT_HEIGHT}" fill="white" fill-opacity="0" data-t-s="{:.6}" data-total="{}" data-bands="{}"><title>{}</title></rect>"#,
            x(p.t_s),
            p.t_s,
            p.total,
            values.join(","),
            escape(&tip)
        );
    }
    for oom in &chart.ooms {
        let text = format!("out of memory: {} requested", human_bytes(oom.requested));
        // The label reads leftwards from the line; an OOM early in the run has no room there
        // (the label was cut at the chart's edge), and reads rightwards instead.
        let at = x(oom.t_s);
        let (anchor, text_x) = if at - 4.0 - text_width(&text) < LEFT { ("start", at + 4.0) } else { ("end", at - 4.0) };
        let _ = writeln!(
            svg,
            r#"<g class="oom" data-t-s="{:.6}" data-requested="{}"><title>{:.3} s: {}</title><line x1="{at:.1}" x2="{at:.1}" y1="{top}" y2="{bottom}" stroke="red" stroke-width="2"/><text x="{text_x:.1}" y="{:.0}" fill="red" text-anchor="{anchor}">{}</text></g>"#,
            oom.t_s,
            oom.requested,
            oom.t_s,
            escape(&text),
            top + 14.0,
            escape(&text),
        );
    }
    svg.push_str("</g>\n");
}

/// About how wide `text` is drawn at the chart's font size (12 px Verdana: ~7 px a character).
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * 7.0
}

/// Text for XML: markup characters escaped, control characters (which XML forbids) dropped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\n' => out.push_str("&#10;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_whose_columns_carry_their_numbers() {
        let chart = DeviceChart {
            device: 0,
            bands: vec![Band { label: "kv <cache> & co".into(), stack: "main → kv".into(), peak: 100 }],
            points: vec![ChartPoint { t_s: 0.0, total: 100, values: vec![100, 0] }, ChartPoint { t_s: 1.0, total: 150, values: vec![100, 50] }],
            ooms: vec![ChartOom { t_s: 1.0, requested: 30 }],
        };
        let mut out = Vec::new();
        write_svg(&[chart], "memory \u{7} of pid 1", &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(r#"data-total="150" data-bands="100,50""#), "{text}");
        assert!(text.contains("kv &lt;cache&gt; &amp; co") && !text.contains('\u{7}'));
        assert!(text.contains(r#"class="oom" data-t-s="1.000000""#));
        assert!(text.trim_end().ends_with("</svg>"));
    }

    /// An OOM at the start of the run: its label reads rightwards from the line, whole inside the
    /// picture (it was cut at the left edge: `…: 30.0 MiB requested`); a late one leftwards.
    #[test]
    fn an_early_ooms_label_is_whole() {
        let points = vec![ChartPoint { t_s: 0.0, total: 100, values: vec![100] }, ChartPoint { t_s: 10.0, total: 100, values: vec![100] }];
        for (t, anchor) in [(0.05, "start"), (9.0, "end")] {
            let chart = DeviceChart { device: 0, bands: vec![], points: points.clone(), ooms: vec![ChartOom { t_s: t, requested: 30 << 20 }] };
            let mut out = Vec::new();
            write_svg(&[chart], "early", &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            let label = text.lines().find(|l| l.contains(r#"class="oom""#)).unwrap();
            assert!(label.contains(&format!(r#"text-anchor="{anchor}""#)), "{label}");
            let x: f64 = label.split("<text x=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
            let width = text_width("out of memory: 30.0 MiB requested");
            let (left, right) = if anchor == "start" { (x, x + width) } else { (x - width, x) };
            assert!(left >= 0.0 && right <= WIDTH, "{left}..{right} of {WIDTH}: {label}");
        }
    }
}
