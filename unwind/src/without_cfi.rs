//! The functions of a file that no FDE covers, with rows made from their prologues
//! (prologue.rs). Their bounds come from the symbol tables (`.symtab`, else `.dynsym`): a
//! stripped file's code without CFI keeps today's way.

use gpuflame_elfread::{consts, ElfError, ElfFile, ReadAt};

use crate::body::{rows_through_body, MAX_BODY_BYTES};
use crate::prologue::{rows_from_prologue, PROLOGUE_BYTES};
use crate::table::UnwindRow;

/// Set to 1: no rows from prologues.
pub const OFF_VAR: &str = "GPUFLAME_NO_PROLOGUE_ROWS";

/// At most this many functions without CFI are read a file (each a read of its first bytes).
const MAX_FUNCTIONS: usize = 1 << 16;

/// A function without CFI whose prologue gave rows: [start, end).
pub(crate) struct SynthesizedFunction {
    pub start: u64,
    pub end: u64,
    pub rows: Vec<UnwindRow>,
}

/// Those of the file's functions outside `covered` (sorted, FDE ranges) whose prologue is of a
/// known form, in address order.
pub(crate) fn synthesized_functions<R: ReadAt>(elf: &ElfFile<R>, covered: &[(u64, u64)]) -> Result<Vec<SynthesizedFunction>, ElfError> {
    // A way back to how such code was unwound before (frame pointers, the stack scan), should a
    // prologue's rows turn out wrong somewhere; and the benchmarks' "before".
    if std::env::var_os(OFF_VAR).is_some_and(|v| v == "1") {
        return Ok(Vec::new());
    }
    let symbols = match elf.symbols(consts::SHT_SYMTAB)? {
        Some(s) if !s.is_empty() => Some(s),
        _ => elf.symbols(consts::SHT_DYNSYM)?,
    };
    let Some(symbols) = symbols else { return Ok(Vec::new()) };
    let mut functions: Vec<(u64, u64)> = symbols
        .iter()
        .filter(|s| s.is_function() && s.is_defined() && s.value != 0 && s.size > 0)
        .filter_map(|s| Some((s.value, s.value.checked_add(s.size)?)))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    // Ranges of FDEs that start before an address, and the largest end among them.
    let mut max_end = Vec::with_capacity(covered.len());
    let mut running = 0;
    for &(_, e) in covered {
        running = running.max(e);
        max_end.push(running);
    }
    let has_cfi = |(start, end): (u64, u64)| {
        let n = covered.partition_point(|&(s, _)| s < end);
        n > 0 && max_end[n - 1] > start
    };
    // Where [start, end) is in the file, at most `max` bytes of it.
    let code = |start: u64, end: u64, max: usize| -> Option<(u64, u64)> {
        let seg = elf.load_segments().find(|s| s.flags & consts::PF_X != 0 && s.vaddr <= start && end <= s.vaddr + s.file_size)?;
        Some((start - seg.vaddr + seg.offset, (end - start).min(max as u64)))
    };
    let mut out = Vec::new();
    let mut last_end = 0;
    for (start, end) in functions.into_iter().filter(|&f| !has_cfi(f)).take(MAX_FUNCTIONS) {
        // Aliases and nested symbols: the first one that covers an address is its function.
        if start < last_end {
            continue;
        }
        let Some((offset, len)) = code(start, end, PROLOGUE_BYTES) else { continue };
        let bytes = elf.read(offset, len, "a function's prologue", PROLOGUE_BYTES as u64)?;
        let Some(prologue) = rows_from_prologue(&bytes, start) else { continue };
        let mut rows = prologue.rows;
        // rbp goes free in the body: its rows, where the whole body reads as known.
        if let Some(base) = prologue.base_saved {
            if let Some((offset, len)) = code(base.after, end, MAX_BODY_BYTES) {
                let body = elf.read(offset, len, "a function's body", MAX_BODY_BYTES as u64)?;
                if let Some(more) = rows_through_body(&body, &base) {
                    rows.extend(more);
                }
            }
        }
        last_end = end;
        out.push(SynthesizedFunction { start, end, rows });
    }
    Ok(out)
}

