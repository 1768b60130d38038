//! The rows built for glibc agree with `readelf --debug-dump=frames-interp` at every row address
//! and between rows.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use gpuflame_unwind::{CfaRule, RbpRule, UnwindTable};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Cfa(CfaRule),
    /// readelf prints `exp` for any CFA expression.
    Expression,
}

#[derive(Debug, Clone)]
struct Row {
    pc: u64,
    cfa: Expected,
    rbp: RbpRule,
    end_of_stack: bool,
    /// The return address is somewhere other than CFA-8 (vfork keeps it in a register).
    ra_elsewhere: bool,
}

fn parse_cfa(s: &str) -> Expected {
    let off = |p: &str| p.parse::<i32>().ok();
    if s == "exp" {
        return Expected::Expression;
    }
    match s.split_once('+').or_else(|| s.split_once('-').map(|(r, _)| (r, ""))) {
        Some(("rsp", o)) if off(o).is_some() => Expected::Cfa(CfaRule::RspOffset(off(o).unwrap())),
        Some(("rbp", o)) if off(o).is_some() => Expected::Cfa(CfaRule::RbpOffset(off(o).unwrap())),
        _ => Expected::Cfa(CfaRule::Unsupported),
    }
}

fn parse_reg(s: Option<&&str>) -> RbpRule {
    match s {
        None | Some(&"u") | Some(&"s") => RbpRule::Unchanged,
        Some(v) => match v.strip_prefix('c').and_then(|o| o.parse().ok()) {
            Some(off) => RbpRule::CfaOffset(off),
            None => RbpRule::Unsupported,
        },
    }
}

/// What is being read: a CIE (its offset) or an FDE (range and CIE), its column names, its rows.
type Entry = (Option<String>, Option<(u64, u64, String)>, Vec<String>, Vec<Row>);

/// FDE ranges and their rows; an FDE without rows of its own uses its CIE's.
fn readelf_rows(path: &str) -> Vec<(u64, u64, Vec<Row>)> {
    let out = Command::new("readelf")
        .args(["--debug-dump=frames-interp", path])
        .output()
        .expect("readelf (binutils) is needed for this test");
    // readelf exits 1 on glibc (it cannot follow the debug link) while printing everything.
    assert!(!out.stdout.is_empty(), "readelf printed nothing: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut cie_rows: HashMap<String, Vec<Row>> = HashMap::new();
    let mut fdes = Vec::new();
    let mut current: Option<Entry> = None;
    let mut finish = |cur: Option<Entry>, cie_rows: &mut HashMap<String, Vec<Row>>| {
        if let Some((cie_off, fde, _, rows)) = cur {
            if let Some(off) = cie_off {
                cie_rows.insert(off, rows);
            } else if let Some((start, end, cie)) = fde {
                let rows = if rows.is_empty() {
                    cie_rows.get(&cie).cloned().unwrap_or_default().into_iter().map(|r| Row { pc: start, ..r }).collect()
                } else {
                    rows
                };
                fdes.push((start, end, rows));
            }
        }
    };
    for line in text.lines() {
        // "r10 (r10)" is one column: a word in parentheses belongs to the word before.
        let mut words: Vec<&str> = Vec::new();
        let mut start = None;
        for (i, w) in line.split_whitespace().enumerate() {
            if w.starts_with('(') && i > 0 {
                if let (Some(s), Some(last)) = (start, words.last_mut()) {
                    let s: usize = s;
                    let end = w.as_ptr() as usize - line.as_ptr() as usize + w.len();
                    *last = &line[s..end];
                }
                continue;
            }
            start = Some(w.as_ptr() as usize - line.as_ptr() as usize);
            words.push(w);
        }
        if words.len() >= 4 && words[3] == "CIE" {
            finish(current.take(), &mut cie_rows);
            current = Some((Some(words[0].to_string()), None, Vec::new(), Vec::new()));
        } else if words.len() >= 6 && words[3] == "FDE" {
            finish(current.take(), &mut cie_rows);
            let cie = words[4].trim_start_matches("cie=").to_string();
            let (s, e) = words[5].trim_start_matches("pc=").split_once("..").unwrap();
            let range = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap(), cie);
            current = Some((None, Some(range), Vec::new(), Vec::new()));
        } else if words.first() == Some(&"LOC") {
            if let Some(cur) = current.as_mut() {
                cur.2 = words.iter().map(|w| w.to_string()).collect();
            }
        } else if let Some(cur) = current.as_mut() {
            if words.len() >= 2 && !cur.2.is_empty() && words[0].len() == 16 {
                let col = |name: &str| cur.2.iter().position(|c| c == name).and_then(|i| words.get(i));
                let ra = col("ra").copied();
                cur.3.push(Row {
                    pc: u64::from_str_radix(words[0], 16).unwrap(),
                    cfa: parse_cfa(words[1]),
                    rbp: parse_reg(col("rbp")),
                    end_of_stack: ra.is_none() || ra == Some("u"),
                    ra_elsewhere: ra.is_some_and(|r| r != "u" && r != "c-8"),
                });
            }
        }
    }
    finish(current.take(), &mut cie_rows);
    fdes
}

#[test]
fn glibc_rows_agree_with_readelf() {
    assert!(Path::new(LIBC).exists(), "{LIBC} is needed for this test");
    let table = UnwindTable::from_path(Path::new(LIBC)).unwrap();
    let fdes = readelf_rows(LIBC);
    assert!(fdes.len() > 1000, "readelf listed only {} FDEs", fdes.len());
    let mut checked = 0;
    for (start, end, rows) in &fdes {
        for (i, row) in rows.iter().enumerate() {
            let next = rows.get(i + 1).map_or(*end, |r| r.pc);
            for pc in [row.pc, row.pc + (next - row.pc) / 2, next - 1] {
                if pc < *start || pc >= *end {
                    continue;
                }
                let got = table.lookup(pc).unwrap_or_else(|| panic!("no row for {pc:#x}"));
                if row.end_of_stack {
                    assert_eq!(got.cfa, CfaRule::EndOfStack, "at {pc:#x}: {row:?}");
                    continue;
                }
                if row.ra_elsewhere {
                    assert_eq!(got.cfa, CfaRule::Unsupported, "at {pc:#x}: {row:?}");
                    continue;
                }
                match &row.cfa {
                    Expected::Cfa(cfa) => assert_eq!(got.cfa, *cfa, "CFA at {pc:#x}: readelf {row:?}"),
                    Expected::Expression => assert!(
                        matches!(got.cfa, CfaRule::Plt { .. } | CfaRule::DerefRbp(_) | CfaRule::Unsupported),
                        "CFA at {pc:#x}: readelf has an expression, we have {:?}",
                        got.cfa
                    ),
                }
                assert_eq!(got.rbp, row.rbp, "RBP at {pc:#x}: readelf {row:?}");
                checked += 1;
            }
        }
        // Just past the FDE: the next FDE's rule or no information, never this FDE's last rule
        // carried into a gap.
        if !fdes.iter().any(|(s, e, _)| *s <= *end && *end < *e) {
            assert_eq!(table.lookup(*end).map(|r| r.cfa), Some(CfaRule::NoInfo), "gap after {start:#x}..{end:#x}");
        }
    }
    assert!(checked > 10_000, "only {checked} addresses compared");
    // PLT entries are recognised, not reported as unsupported.
    assert!(table.rows().any(|r| matches!(r.rule.cfa, CfaRule::Plt { .. })), "no PLT rule in glibc");
    eprintln!("compared {checked} addresses over {} FDEs, {} rows", fdes.len(), table.len());
}
