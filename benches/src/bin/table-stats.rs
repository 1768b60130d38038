//! Size and build time of unwind tables: `cargo run --release -p gpuflame-benches --bin
//! table-stats [LIB…]` (default: glibc and the largest library found). TABLE_AT=0xADDR,… also
//! prints the rule the table has at each address of the file (as `objdump -d` numbers them).

use std::path::PathBuf;
use std::time::Instant;

use gpuflame_benches::{largest_library, LIBC};
use gpuflame_unwind::{CompactTable, RuleTable, UnwindTable};

fn main() {
    let mut paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        paths.push(PathBuf::from(LIBC));
        paths.extend(largest_library());
    }
    println!("| library | file size | FDEs | rows (merged) | rows from CFI | build time (best of 5) | table bytes | bytes/row | unsupported rows | functions from prologues |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for path in paths {
        let mut best = f64::MAX;
        let mut result = None;
        for _ in 0..5 {
            let start = Instant::now();
            let table = match UnwindTable::from_path(&path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    break;
                }
            };
            let stats = table.stats;
            if result.is_none() {
                for at in std::env::var("TABLE_AT").unwrap_or_default().split(',').filter(|a| !a.is_empty()) {
                    match u64::from_str_radix(at.trim_start_matches("0x"), 16) {
                        Ok(pc) => println!("{}: {at}: {:?}", path.display(), table.lookup(pc)),
                        Err(e) => eprintln!("TABLE_AT: {at}: {e}"),
                    }
                }
            }
            let mut rules = RuleTable::default();
            let compact = CompactTable::from_table(table, &mut rules).expect("compacting");
            best = best.min(start.elapsed().as_secs_f64());
            result = Some((stats, compact, rules));
        }
        let Some((stats, compact, rules)) = result else { continue };
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        // The shared rule table is counted in full against this one library: an upper bound.
        let bytes = compact.size_bytes() + rules.len() * 8;
        println!(
            "| {} | {:.1} MiB | {} | {} | {} | {:.0} ms | {:.2} MiB | {:.2} | {} | {} |",
            path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size as f64 / (1 << 20) as f64,
            stats.fdes,
            compact.len(),
            stats.raw_rows,
            best * 1000.0,
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / compact.len().max(1) as f64,
            stats.unsupported_rows,
            stats.synthesized_functions,
        );
    }
}
