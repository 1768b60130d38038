//! Building an unwind table: glibc and the largest library on the machine.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use gpuflame_benches::{largest_library, LIBC};
use gpuflame_unwind::{CompactTable, RuleTable, UnwindTable};

fn build(path: &Path) -> usize {
    let table = UnwindTable::from_path(path).expect("building the table");
    let mut rules = RuleTable::default();
    CompactTable::from_table(table, &mut rules).expect("compacting").len()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("unwind_table_build");
    group.sample_size(10);
    group.bench_function("libc.so.6", |b| b.iter(|| build(Path::new(LIBC))));
    if let Some(big) = largest_library() {
        let name = big.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        group.bench_function(name, |b| b.iter(|| build(&big)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
