//! Memory of building unwind tables as the agent does: `table-pieces [--whole] LIB…` builds each
//! file's table in pieces of 65,536 rows, each renumbered into shared rules and dropped (the
//! agent writes it into BPF), or `--whole` as one table. Prints, per file, its rows, a hash of
//! every row's address and rule (the two ways must agree), and the build time; run it under
//! `/usr/bin/time -v` for the peak RSS.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use gpuflame_unwind::{CompactTable, RuleTable, UnwindTable};

fn main() {
    let mut whole = false;
    let mut paths = Vec::new();
    for arg in std::env::args_os().skip(1) {
        if arg == "--whole" {
            whole = true;
        } else {
            paths.push(PathBuf::from(arg));
        }
    }
    for path in paths {
        let start = Instant::now();
        let mut rules = RuleTable::default();
        let mut hash = DefaultHasher::new();
        let mut add = |t: &CompactTable, rules: &RuleTable| {
            for (&pc, &id) in t.pcs.iter().zip(&t.rules) {
                (t.base + u64::from(pc), rules.get(id)).hash(&mut hash);
            }
        };
        let rows = if whole {
            let table = match UnwindTable::from_path(&path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    continue;
                }
            };
            let compact = CompactTable::from_table(table, &mut rules).expect("compacting");
            add(&compact, &rules);
            compact.len()
        } else {
            let built = UnwindTable::build_in_pieces(&path, 1 << 16, &mut |piece| {
                let compact = CompactTable::from_piece(&piece, &mut rules).map_err(|_| gpuflame_unwind::UnwindError::RulesFull)?;
                add(&compact, &rules);
                Ok(())
            });
            match built {
                Ok(summary) => summary.rows,
                Err(e) => {
                    eprintln!("{}: {e}", path.display());
                    continue;
                }
            }
        };
        println!("{} rows={rows} hash={:016x} ms={:.0}", path.display(), hash.finish(), start.elapsed().as_secs_f64() * 1e3);
    }
}
