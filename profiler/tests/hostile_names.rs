//! Names made by hostile processes (control characters, `;`, newlines, lone surrogates, bytes that
//! are not UTF-8, 100,000 characters) recorded to folded, SVG and pprof: every output must stay
//! parseable and show the name escaped, as one frame. Run as root.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::*;

const PYTHON: &str = "/usr/bin/python3.11";

/// What the profile holds for tests/programs/hostile_names.py's HOSTILE_NAME and HOSTILE_FILE:
/// control characters escaped, the lone surrogate turned into U+FFFD, `;` kept (pprof has no
/// separator to protect).
const FUNC: &str = concat!(r"evil\x1b[31m\x00;\n<&>\x7f\x85", "\u{fffd}");
const FILE: &str = concat!(r"bad\x1b\x00;\r\n", "\u{1f600}\u{fffd}.py");
/// hostile_comm.c's comm; \xff is not UTF-8.
const COMM: &str = concat!(r"h\x1b;\t\x7f", "\u{fffd}", r"<&\x01z");

/// Folded stacks cannot hold `;` inside a frame: the writer turns it into `:`.
fn folded(name: &str) -> String {
    name.replace(';', ":")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hostile_names.py")
}

struct Outputs {
    folded: String,
    svg: String,
    pprof: Vec<u8>,
    pprof_path: PathBuf,
}

/// Records `command` three times, once to each format.
fn record(dir: &Path, command: &[&str], formats: &[&str]) -> Outputs {
    let path = |ext: &str| dir.join(format!("out.{ext}"));
    for ext in formats {
        let out = path(ext);
        let mut args = vec!["record", "--lines", "-F", "499", "-o", out.to_str().unwrap(), "--"];
        args.extend_from_slice(command);
        gpuflame_ok(&args, 0);
    }
    let read = |ext: &str| if formats.contains(&ext) { std::fs::read(path(ext)).unwrap() } else { Vec::new() };
    Outputs {
        folded: String::from_utf8(read("folded")).expect("folded output is UTF-8"),
        svg: String::from_utf8(read("svg")).expect("SVG output is UTF-8"),
        pprof: read("pb.gz"),
        pprof_path: path("pb.gz"),
    }
}

/// Every line is `frames count`, with no empty frame and no control character.
fn check_folded_lines(text: &str) -> Vec<Stack> {
    for line in text.lines() {
        assert!(!line.chars().any(char::is_control), "control character in folded line {line:?}");
        let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no count in {line:?}"));
        assert!(count.parse::<u64>().is_ok(), "bad count in {line:?}");
        assert!(stack.split(';').all(|f| !f.is_empty()), "empty frame in {line:?}");
    }
    parse_folded(text)
}

/// The flame graph's tooltips, after a real XML parser read the document.
fn svg_titles(svg: &str) -> Vec<String> {
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(svg, options).unwrap_or_else(|e| panic!("SVG is not well-formed XML: {e}"));
    doc.descendants().filter(|n| n.has_tag_name("title")).filter_map(|n| n.text().map(str::to_string)).collect()
}

fn varint(b: &[u8], i: &mut usize) -> u64 {
    let mut v = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i).expect("truncated varint");
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

/// The string table (field 6 of profile.proto), read straight from the protobuf: gpuflame's own
/// decoder sanitizes what it reads and would hide raw names.
fn pprof_strings(gz: &[u8]) -> Vec<String> {
    let mut pb = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut pb).expect("pprof output is gzip");
    let (mut i, mut strings) = (0, Vec::new());
    while i < pb.len() {
        let key = varint(&pb, &mut i);
        match key & 7 {
            0 => {
                varint(&pb, &mut i);
            }
            1 => i += 8,
            2 => {
                let len = varint(&pb, &mut i) as usize;
                if key >> 3 == 6 {
                    strings.push(String::from_utf8(pb[i..i + len].to_vec()).expect("pprof strings must be UTF-8"));
                }
                i += len;
            }
            5 => i += 4,
            w => panic!("wire type {w} at byte {i}"),
        }
    }
    assert!(strings.iter().all(|s| !s.chars().any(char::is_control)), "control characters in the string table: {strings:?}");
    strings
}

/// `go tool pprof -raw`, an independent decoder.
fn go_pprof_raw(path: &Path) -> String {
    let out = std::process::Command::new("go").args(["tool", "pprof", "-raw"]).arg(path).output().expect("`go` is needed to decode pprof");
    assert!(out.status.success(), "go tool pprof failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("go tool pprof output is UTF-8")
}

/// Enough samples (2 s at 499 Hz), most in the expected stack. Not all: a few stacks of Debian's
/// python3.11 stop at an interpreter leaf without frame pointers (about 10%), unrelated to names.
fn mostly(right: u64, all: u64) -> bool {
    all >= 300 && right * 100 >= all * 70
}

/// The Python frames of a folded stack (`name (file:line)`), root first.
fn python_frames(s: &Stack) -> Vec<&str> {
    let is_python = |f: &&str| {
        let loc = f.strip_suffix(')').and_then(|f| f.rsplit_once(" (")).map(|(_, loc)| loc);
        loc.and_then(|l| l.rsplit_once(':')).is_some_and(|(_, line)| !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
    };
    s.user().into_iter().filter(is_python).collect()
}

/// `<module> -> main -> outer -> hot`, with `hot` one frame that `is_hot` accepts.
fn python_chain_is(s: &Stack, is_hot: impl Fn(&str) -> bool) -> bool {
    match python_frames(s).as_slice() {
        [m, main, outer, hot] => {
            m.starts_with("<module> (hostile_names.py:")
                && main.starts_with("main (hostile_names.py:")
                && outer.starts_with("outer (hostile_names.py:")
                && is_hot(hot)
        }
        _ => false,
    }
}

#[test]
fn hostile_python_names_are_escaped_in_every_format() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = record(dir.path(), &[PYTHON, script().to_str().unwrap(), "hostile", "2"], &["folded", "svg", "pb.gz"]);

    let stacks = check_folded_lines(&out.folded);
    let frame_prefix = format!("{} ({}:", folded(FUNC), folded(FILE));
    let is_hot = |f: &str| f.strip_prefix(&frame_prefix).and_then(|l| l.strip_suffix(')')).is_some_and(|l| l.parse::<u32>().is_ok());
    let all = total(&stacks);
    let right: u64 = stacks.iter().filter(|s| python_chain_is(s, is_hot)).map(|s| s.count).sum();
    eprintln!("folded: {right} of {all} samples in <module> -> main -> outer -> {frame_prefix}…");
    assert!(mostly(right, all), "{right} of {all} samples have the hostile frame as one frame:\n{}", describe(&stacks));

    let titles = svg_titles(&out.svg);
    assert!(titles.iter().any(|t| t.starts_with(&frame_prefix)), "no SVG frame {frame_prefix:?} in {} titles", titles.len());

    let strings = pprof_strings(&out.pprof);
    for name in [FUNC, FILE] {
        assert!(strings.iter().any(|s| s == name), "pprof string table lacks {name:?}");
    }
    let profile = gpuflame::output::pprof::read(&out.pprof).expect("gpuflame decodes its pprof");
    let hot = profile.locations.iter().position(|l| l.lines.iter().any(|line| line.function == FUNC && line.file.as_deref() == Some(FILE)));
    let hot = hot.expect("a location of the hostile function in its hostile file");
    assert!(profile.samples.iter().any(|s| s.stack.contains(&hot)), "no sample in the hostile function");
    assert!(go_pprof_raw(&out.pprof_path).contains(FUNC), "go tool pprof -raw does not show {FUNC:?}");
}

#[test]
fn hostile_comm_is_escaped_in_every_format() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_c(dir.path(), "hostile_comm", FP_FLAGS);
    let out = record(dir.path(), &[exe.to_str().unwrap(), "2"], &["folded", "svg", "pb.gz"]);

    let stacks = check_folded_lines(&out.folded);
    let comm = folded(COMM);
    let all = total(&stacks);
    let right: u64 = stacks.iter().filter(|s| s.comm() == comm && s.has_sequence(&["main", "a", "b", "c"])).map(|s| s.count).sum();
    eprintln!("folded: {right} of {all} samples in {comm};…;main;a;b;c");
    assert!(mostly(right, all), "{right} of {all} samples under comm {comm:?}:\n{}", describe(&stacks));

    let titles = svg_titles(&out.svg);
    assert!(titles.iter().any(|t| t.starts_with(&format!("{comm} ("))), "no SVG frame for comm {comm:?} in {titles:?}");

    let strings = pprof_strings(&out.pprof);
    assert!(strings.iter().any(|s| s == COMM), "pprof string table lacks {COMM:?}: {strings:?}");
    let profile = gpuflame::output::pprof::read(&out.pprof).expect("gpuflame decodes its pprof");
    assert!(profile.samples.iter().any(|s| s.labels.comm.as_deref() == Some(COMM)), "no sample labelled comm={COMM:?}");
    assert!(go_pprof_raw(&out.pprof_path).contains(&format!("comm:[{COMM}]")), "go tool pprof -raw lacks the comm label");
}

#[test]
fn a_100000_character_name_is_capped_keeping_its_end() {
    require_bpf();
    let dir = tempfile::tempdir().unwrap();
    let out = record(dir.path(), &[PYTHON, script().to_str().unwrap(), "long", "2"], &["folded", "pb.gz"]);
    // hostile_names.py's LONG_NAME, as the cap leaves it: `…` and the last 4093 bytes.
    let long = format!("start_{}_tail_marker", "x".repeat(99_984));
    let capped = format!("…{}", &long[long.len() - 4093..]);
    assert_eq!(capped.len(), 4096);

    let stacks = check_folded_lines(&out.folded);
    let frame_prefix = format!("{capped} (long.py:");
    let all = total(&stacks);
    let right: u64 = stacks.iter().filter(|s| python_chain_is(s, |f| f.starts_with(&frame_prefix))).map(|s| s.count).sum();
    eprintln!("folded: {right} of {all} samples in the capped function; longest line {} bytes", out.folded.lines().map(str::len).max().unwrap_or(0));
    assert!(mostly(right, all), "{right} of {all} samples in the capped long function");
    assert!(!out.folded.contains("start_x"), "the start of the long name should have been cut");

    let strings = pprof_strings(&out.pprof);
    assert!(strings.contains(&capped), "pprof string table lacks the capped name");
    assert!(strings.iter().all(|s| s.len() <= 4096), "a pprof string is longer than the cap");
}
