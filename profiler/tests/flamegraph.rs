//! Flame graphs of real processes as a person reads them: frames coloured by kind with a legend,
//! a title that names the program, a labelled root, deep stacks collapsed, and summary lines
//! that count samples. Run as root.

mod common;

use std::path::Path;

use common::*;

const PYTHON: &str = "/root/.pyenv/versions/3.11.7/bin/python3.11";

fn program(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(name).display().to_string()
}

fn parse(svg: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse_with_options(svg, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).expect("well-formed XML")
}

/// (frame name, fill) of every frame drawn.
fn frames(doc: &roxmltree::Document<'_>) -> Vec<(String, (i32, i32, i32))> {
    doc.descendants()
        .filter(|n| n.has_tag_name("g"))
        .filter_map(|g| {
            let title = g.children().find(|c| c.has_tag_name("title"))?.text()?.to_string();
            let fill = g.children().find(|c| c.has_tag_name("rect"))?.attribute("fill")?;
            let rgb: Vec<i32> = fill.trim_start_matches("rgb(").trim_end_matches(')').split(',').filter_map(|v| v.trim().parse().ok()).collect();
            let name = title.rsplit_once(" (").map_or(title.clone(), |(n, _)| n.to_string());
            Some((name, (*rgb.first()?, *rgb.get(1)?, *rgb.get(2)?)))
        })
        .collect()
}

fn near(c: (i32, i32, i32), base: (i32, i32, i32)) -> bool {
    (c.0 - base.0).abs() <= 20 && (c.1 - base.1).abs() <= 20 && (c.2 - base.2).abs() <= 20
}

#[test]
fn python_and_native_frames_are_coloured_by_kind_with_a_legend_title_and_root() {
    require_bpf();
    assert!(Path::new(PYTHON).exists(), "this test needs pyenv's Python 3.11 at {PYTHON} (scripts/setup.sh)");
    let dir = tempfile::tempdir().unwrap();
    let pb = dir.path().join("py.pb.gz");
    let svg_path = dir.path().join("py.svg");
    gpuflame_ok(&["record", "-F", "199", "-o", pb.to_str().unwrap(), "--", PYTHON, &program("pystack.py"), "2"], 0);
    let out = gpuflame_ok(&["convert", pb.to_str().unwrap(), "-o", svg_path.to_str().unwrap()], 0);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = parse(&svg);

    let drawn = frames(&doc);
    // One frame per function by default, the file relative to the script's directory, its full
    // path in the tooltip.
    let python: Vec<_> = drawn.iter().filter(|(n, _)| n == "compress_it (pystack.py)").collect();
    assert!(!drawn.iter().any(|(n, _)| n.contains("(pystack.py:")), "line numbers drawn by default");
    let full = format!("; {})</title>", program("pystack.py"));
    assert!(svg.contains("<title>compress_it (pystack.py) (") && svg.contains(&full), "no full path {full} in the tooltips");
    let native: Vec<_> = drawn.iter().filter(|(n, _)| n == "deflate" || n.starts_with("PyEval_EvalCode")).collect();
    assert!(!python.is_empty() && !native.is_empty(), "frames drawn: {:?}", drawn.iter().map(|(n, _)| n).collect::<Vec<_>>());
    assert!(python.iter().all(|(_, c)| near(*c, (96, 160, 220))), "Python frames not blue: {python:?}");
    assert!(native.iter().all(|(_, c)| near(*c, (232, 130, 60))), "native frames not orange: {native:?}");

    let legend = doc.descendants().find(|n| n.attribute("id") == Some("legend")).expect("a legend");
    let entries: Vec<&str> = legend.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(entries.contains(&"Python") && entries.contains(&"native"), "legend: {entries:?}");

    // The title names the program's file, not a path or the whole command line.
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(texts.contains(&"py.pb.gz · cpu"), "texts: {:?}", &texts[..texts.len().min(8)]);
    assert!(texts.contains(&"all"), "the root frame is not labelled");

    // --lines: one frame per line.
    let by_line = dir.path().join("lines.svg");
    gpuflame_ok(&["convert", "--lines", pb.to_str().unwrap(), "-o", by_line.to_str().unwrap()], 0);
    let lines: Vec<String> = frames(&parse(&std::fs::read_to_string(&by_line).unwrap())).into_iter().map(|(n, _)| n).filter(|n| n.starts_with("compress_it (pystack.py:")).collect();
    assert!(lines.iter().any(|n| n.starts_with("compress_it (pystack.py:1")), "--lines drew {lines:?}");

    // The summary line counts samples, as the profile does.
    let folded = dir.path().join("py.folded");
    gpuflame_ok(&["convert", pb.to_str().unwrap(), "-o", folded.to_str().unwrap()], 0);
    let samples = total(&read_folded(&folded));
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains(&format!(" {samples} samples in ")), "summary {line:?} against {samples} samples in the profile");

    // Recorded straight to SVG: the title is the script, the command in the subtitle.
    let direct = dir.path().join("direct.svg");
    gpuflame_ok(&["record", "-F", "99", "-o", direct.to_str().unwrap(), "--", PYTHON, &program("pystack.py"), "1"], 0);
    let svg = std::fs::read_to_string(&direct).unwrap();
    let doc = parse(&svg);
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(texts.contains(&"pystack.py · cpu"), "texts: {:?}", &texts[..texts.len().min(8)]);
    assert!(texts.iter().any(|t| t.contains("command: ") && t.contains("pystack.py 1")), "no command line in the subtitle: {texts:?}");
}

#[test]
fn deep_stacks_are_collapsed_and_counted() {
    require_bpf();
    assert!(Path::new(PYTHON).exists(), "this test needs pyenv's Python 3.11 at {PYTHON} (scripts/setup.sh)");
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("deep.svg");
    gpuflame_ok(&["record", "-F", "199", "-o", svg_path.to_str().unwrap(), "--", PYTHON, &program("deep_recursion.py"), "150", "2"], 0);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = parse(&svg);
    let drawn = frames(&doc);
    assert!(drawn.iter().any(|(n, _)| n.starts_with("[… deep stack")), "no collapsed marker");
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    assert!(texts.iter().any(|t| t.contains("frames (middle collapsed)")), "the collapse is not said");
    let height: usize = doc.root_element().attribute("height").and_then(|h| h.parse().ok()).unwrap();
    // 64 frames of 16 px, the root, the title and the legend.
    assert!(height <= 64 * 16 + 200, "{height} px tall");
    // The leaf side is kept: the spinning function and the recursion right above it.
    assert!(drawn.iter().any(|(n, _)| n == "spin (deep_recursion.py)"));
}

#[test]
fn diff_colours_what_grew_red_and_what_shrank_blue() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "split_work", FP_FLAGS);
    let exe = exe.to_str().unwrap();
    // The same program twice: 80% parsing before, 20% after.
    let (base, new) = (dir.path().join("base.pb.gz"), dir.path().join("new.folded"));
    for (out, share) in [(&base, "80"), (&new, "20")] {
        // Each run does its work once its stacks can be whole: frames match across the runs.
        let gate = Gate::new(dir.path(), &format!("gate-{share}"));
        let (status, stderr) = record_gated(&gate, &["record", "-F", "199", "-o", out.to_str().unwrap(), "--", exe, "2", share], 1);
        assert!(status.success(), "{status:?}\n{stderr}");
    }
    let diff = dir.path().join("diff.svg");
    let out = gpuflame_ok(&["diff", "-F", "199", base.to_str().unwrap(), new.to_str().unwrap(), "-o", diff.to_str().unwrap()], 0);
    let svg = std::fs::read_to_string(&diff).unwrap();
    let drawn = frames(&parse(&svg));
    let fill = |name: &str| drawn.iter().find(|(n, _)| n == name).map(|(_, c)| *c).unwrap_or_else(|| panic!("{name} not drawn: {drawn:?}"));
    let (parse_fill, compute_fill) = (fill("parse"), fill("compute"));
    assert!(parse_fill.2 > parse_fill.0, "parse shrank but is drawn {parse_fill:?}");
    assert!(compute_fill.0 > compute_fill.2, "compute grew but is drawn {compute_fill:?}");
    let texts: Vec<String> = parse(&svg).descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text().map(str::to_string)).collect();
    assert!(texts.iter().any(|t| t == "base.pb.gz → new.folded · cpu"), "title: {texts:?}");

    // The summary line counts each profile's samples.
    let base_folded = dir.path().join("base.folded");
    gpuflame_ok(&["convert", base.to_str().unwrap(), "-o", base_folded.to_str().unwrap()], 0);
    let (b, n) = (total(&read_folded(&base_folded)), total(&read_folded(&new)));
    let line = String::from_utf8_lossy(&out.stderr);
    assert!(line.contains(&format!(" {b} samples in the base, {n} in the new profile")), "{line:?} against {b} and {n}");

    // Folded output: `stack BASE NEW`, and pprof refused with a clear error.
    let diff_folded = dir.path().join("diff.folded");
    gpuflame_ok(&["diff", "-F", "199", base.to_str().unwrap(), new.to_str().unwrap(), "-o", diff_folded.to_str().unwrap()], 0);
    let text = std::fs::read_to_string(&diff_folded).unwrap();
    let count = |f: &str| -> (u64, u64) {
        text.lines()
            .filter(|l| l.contains(&format!(";{f} ")))
            .filter_map(|l| {
                let mut p = l.rsplitn(3, ' ');
                let new: u64 = p.next()?.parse().ok()?;
                Some((p.next()?.parse::<u64>().ok()?, new))
            })
            .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1))
    };
    let ((pb, pn), (cb, cn)) = (count("parse"), count("compute"));
    assert!(pb > 2 * pn && cn > 2 * cb, "parse {pb} → {pn}, compute {cb} → {cn}:\n{text}");
    let refused = gpuflame(&["diff", base.to_str().unwrap(), new.to_str().unwrap(), "-o", dir.path().join("d.pb.gz").to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("svg or folded"));
}
