//! Building an [`UnwindTable`] from an ELF file's call frame information.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use gpuflame_elfread::limits::{MAX_CFI_SECTION, MAX_FDES, MAX_UNWIND_ROWS};
use gpuflame_elfread::{consts, open_regular, ElfError, ElfFile, ReadAt};

use crate::entry::EntryMarker;
use crate::error::UnwindError;
use crate::rule::{classify, CfaRule, UnwindRule};
use crate::stream::{Merged, PieceSink, RowSink, TablePiece, TableSummary};
use crate::table::{LoadSegment, PackedRows, TableStats, UnwindRow, UnwindTable};
use crate::without_cfi::{synthesized_functions, SynthesizedFunction};

type Slice<'a> = gimli::EndianSlice<'a, LittleEndian>;

/// One FDE, covering [start, end): where it is (its section, its offset there), found in a first
/// pass that evaluates no rows. The rows are evaluated in a second pass, FDE by FDE in address
/// order, straight into the merged table: a file's raw rows are never held all at once
/// (libtorch_cpu.so's 2.9M took 108 MiB, and merging them 70 MiB more).
#[derive(Debug, Clone, Copy)]
struct FdeSpan {
    start: u64,
    len: u32,
    /// Its offset in its section (under MAX_CFI_SECTION), the top bit set for `.debug_frame`:
    /// 16 bytes a span (libtorch_cpu.so has 346k FDEs).
    at: u32,
}

const IN_DEBUG_FRAME: u32 = 1 << 31;

impl FdeSpan {
    fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }

    fn offset(&self) -> usize {
        (self.at & !IN_DEBUG_FRAME) as usize
    }

    fn debug_frame(&self) -> bool {
        self.at & IN_DEBUG_FRAME != 0
    }
}

/// What is left of the limits for one file: FDEs and rows are counted across `.eh_frame` and
/// `.debug_frame` together.
struct Budget {
    fdes: usize,
    rows: usize,
}

impl UnwindTable {
    /// Reads and builds the table of the ELF file at `path` (a /proc/PID/map_files/… path for
    /// a mapped file: it reaches the mapped file itself). Only a regular file is opened, without
    /// blocking, and it is read with pread: a file truncated meanwhile gives an error.
    pub fn from_path(path: &Path) -> Result<Self, UnwindError> {
        let read = |source: ElfError| UnwindError::Read { path: path.display().to_string(), source };
        let file = open_regular(path).map_err(|e| read(e.into()))?;
        Self::from_file(&file).map_err(|e| match e {
            UnwindError::Elf(source) => read(source),
            e => e,
        })
    }

    /// Builds the table of an open ELF file.
    pub fn from_file(file: &File) -> Result<Self, UnwindError> {
        from_elf(&ElfFile::parse(file)?)
    }

    /// Builds the table from the bytes of an ELF file.
    pub fn from_elf(data: &[u8]) -> Result<Self, UnwindError> {
        from_elf(&ElfFile::parse(data)?)
    }

    /// Builds the table of the ELF file at `path` (opened as [`Self::from_path`] does) and hands
    /// its rows to `each` in pieces of `rows_per_piece` (the last one shorter), in address order,
    /// as they are made: the rows are never all in memory (libtorch_cpu.so's are 16 MiB packed).
    /// An error from `each` stops the build and is returned.
    pub fn build_in_pieces(path: &Path, rows_per_piece: usize, each: &mut dyn FnMut(TablePiece<'_>) -> Result<(), UnwindError>) -> Result<TableSummary, UnwindError> {
        let read = |source: ElfError| UnwindError::Read { path: path.display().to_string(), source };
        let file = open_regular(path).map_err(|e| read(e.into()))?;
        let elf = ElfFile::parse(&file).map_err(read)?;
        let mut sink = PieceSink::new(rows_per_piece, each);
        let (segments, stats) = stream_rows(&elf, Budget { fdes: MAX_FDES, rows: MAX_UNWIND_ROWS }, &mut sink).map_err(|e| match e {
            UnwindError::Elf(source) => read(source),
            e => e,
        })?;
        sink.flush()?;
        Ok(TableSummary { rows: sink.total(), segments, stats })
    }
}

fn from_elf<R: ReadAt>(elf: &ElfFile<R>) -> Result<UnwindTable, UnwindError> {
    from_elf_within(elf, Budget { fdes: MAX_FDES, rows: MAX_UNWIND_ROWS })
}

fn from_elf_within<R: ReadAt>(elf: &ElfFile<R>, budget: Budget) -> Result<UnwindTable, UnwindError> {
    let mut rows = PackedRows::default();
    let (segments, stats) = stream_rows(elf, budget, &mut rows)?;
    rows.shrink_to_fit();
    Ok(UnwindTable { rows, segments, stats })
}

/// Builds the file's rows into `sink`; returns its load segments and what went into the rows.
fn stream_rows<R: ReadAt>(elf: &ElfFile<R>, mut budget: Budget, sink: &mut dyn RowSink) -> Result<(Vec<LoadSegment>, TableStats), UnwindError> {
    if elf.machine() != consts::EM_X86_64 {
        return Err(UnwindError::Architecture(elf.machine()));
    }
    let mut stats = TableStats::default();
    let section_addr = |name: &str| elf.section(name).map(|s| s.addr);

    let mut spans = Vec::new();
    let eh_data = match elf.section(".eh_frame") {
        Some(section) => Some((section.clone(), elf.section_data(section, MAX_CFI_SECTION)?)),
        None => None,
    };
    let mut eh_bases = BaseAddresses::default();
    if let Some((section, data)) = &eh_data {
        eh_bases = eh_bases.set_eh_frame(section.addr);
        if let Some(a) = section_addr(".eh_frame_hdr") {
            eh_bases = eh_bases.set_eh_frame_hdr(a);
        }
        if let Some(a) = section_addr(".text") {
            eh_bases = eh_bases.set_text(a);
        }
        if let Some(a) = section_addr(".got") {
            eh_bases = eh_bases.set_got(a);
        }
        find_fdes(&EhFrame::new(data, LittleEndian), &eh_bases, false, &mut spans, &mut budget)?;
    }
    // A compressed .debug_frame is left out (no decompressor here): .eh_frame covers most code.
    let df_data = match elf.section(".debug_frame").filter(|s| s.flags & consts::SHF_COMPRESSED == 0) {
        Some(section) => Some(elf.section_data(section, MAX_CFI_SECTION)?),
        None => None,
    };
    let df_bases = BaseAddresses::default();
    if let Some(data) = &df_data {
        let mut extra = Vec::new();
        find_fdes(&debug_frame(data), &df_bases, true, &mut extra, &mut budget)?;
        // .eh_frame wins where both describe the same code; sorted ranges keep this n log n
        // for files with millions of FDEs.
        let mut covered: Vec<(u64, u64)> = spans.iter().map(|f: &FdeSpan| (f.start, f.end())).collect();
        covered.sort_unstable();
        let mut max_end = Vec::with_capacity(covered.len());
        let mut running = 0;
        for &(_, e) in &covered {
            running = running.max(e);
            max_end.push(running);
        }
        let overlaps = |f: &FdeSpan| {
            // Ranges that start before f ends; one of them overlaps if the largest end among
            // them lies past f's start.
            let n = covered.partition_point(|&(s, _)| s < f.end());
            n > 0 && max_end[n - 1] > f.start
        };
        let before = spans.len();
        spans.extend(extra.into_iter().filter(|f| !overlaps(f)));
        stats.from_debug_frame = spans.len() > before;
    }
    spans.sort_by_key(|f| f.start);
    // Functions no FDE covers, whose prologues say where their frames are (MKL's kernels).
    let covered: Vec<(u64, u64)> = spans.iter().map(|f| (f.start, f.end())).collect();
    let synthesized = synthesized_functions(elf, &covered)?;
    stats.synthesized_functions = synthesized.len();
    // Rows are packed relative to the lowest address the table will have: its first FDE's, or
    // the entry point's where entry code comes before it.
    let base = spans
        .first()
        .map(|s| s.start)
        .into_iter()
        .chain(synthesized.first().map(|f| f.start))
        .chain((elf.entry() != 0).then(|| elf.entry()))
        .min()
        .unwrap_or(0);
    sink.start(base);
    let mut merged = Merged::new(EntryMarker::new(elf.entry()), sink);
    let mut ctx = Box::new(UnwindContext::new());
    let mut synthesized = synthesized.into_iter().peekable();
    for span in &spans {
        while let Some(f) = synthesized.next_if(|f| f.start < span.start) {
            synthesized_rows(&f, &mut merged, &mut budget)?;
        }
        let evaluated = match (span.debug_frame(), &eh_data, &df_data) {
            (false, Some((_, data)), _) => rows_of(&EhFrame::new(data, LittleEndian), &eh_bases, span, &mut ctx, &mut merged, &mut stats, &mut budget),
            (true, _, Some(data)) => rows_of(&debug_frame(data), &df_bases, span, &mut ctx, &mut merged, &mut stats, &mut budget),
            _ => Ok(false),
        };
        if evaluated? {
            merged.pending_gap = Some(span.end());
        }
    }
    for f in synthesized {
        synthesized_rows(&f, &mut merged, &mut budget)?;
    }
    merged.finish()?;
    let segments = elf
        .load_segments()
        .map(|seg| LoadSegment { file_offset: seg.offset, vaddr: seg.vaddr, file_size: seg.file_size })
        .collect();
    Ok((segments, stats))
}

fn debug_frame(data: &[u8]) -> DebugFrame<Slice<'_>> {
    let mut df = DebugFrame::new(data, LittleEndian);
    df.set_address_size(8);
    df
}

/// The FDEs of a section, with their ranges: no rows evaluated.
fn find_fdes<'a, S: UnwindSection<Slice<'a>>>(section: &S, bases: &BaseAddresses, debug_frame: bool, out: &mut Vec<FdeSpan>, budget: &mut Budget) -> Result<(), UnwindError>
where
    S::Offset: std::hash::Hash,
{
    let mut cies = HashMap::new();
    let mut entries = section.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            // The rest of the section cannot be walked; what was read so far stays usable.
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else { continue };
        let fde = partial.parse(|section, bases, offset| {
            cies.entry(offset).or_insert_with(|| section.cie_from_offset(bases, offset)).clone()
        });
        let Ok(fde) = fde else { continue };
        if fde.len() == 0 {
            continue;
        }
        budget.fdes = budget.fdes.checked_sub(1).ok_or(UnwindError::Limit { what: "FDEs", limit: MAX_FDES })?;
        // A function over 4 GiB, or an offset past the section limit, is no real FDE.
        let (Ok(len), Ok(at)) = (u32::try_from(fde.len()), u32::try_from(fde.offset())) else { continue };
        if at & IN_DEBUG_FRAME != 0 {
            continue;
        }
        out.push(FdeSpan { start: fde.initial_address(), len, at: at | if debug_frame { IN_DEBUG_FRAME } else { 0 } });
    }
    Ok(())
}

/// A function without CFI's rows from its prologue, after the gap before it.
fn synthesized_rows(f: &SynthesizedFunction, merged: &mut Merged<'_>, budget: &mut Budget) -> Result<(), UnwindError> {
    if let Some(end) = merged.pending_gap.take() {
        if f.start > end {
            merged.push(UnwindRow { pc: end, rule: UnwindRule::NO_INFO });
        }
    }
    for &row in &f.rows {
        budget.rows = budget.rows.checked_sub(1).ok_or(UnwindError::Limit { what: "unwind rows", limit: MAX_UNWIND_ROWS })?;
        merged.push(row);
    }
    merged.pending_gap = Some(f.end);
    Ok(())
}

/// Evaluates the rows of one FDE into the merged table. False when its rows cannot be
/// evaluated: it is then left out, as if the section did not have it.
fn rows_of<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    span: &FdeSpan,
    ctx: &mut UnwindContext<usize>,
    merged: &mut Merged<'_>,
    stats: &mut TableStats,
    budget: &mut Budget,
) -> Result<bool, UnwindError> {
    let Ok(fde) = section.fde_from_offset(bases, S::Offset::from(span.offset()), |section, bases, offset| section.cie_from_offset(bases, offset)) else {
        return Ok(false);
    };
    let Ok(mut table) = fde.rows(section, bases, ctx) else { return Ok(false) };
    // The gap before it (if any) has no information.
    if let Some(end) = merged.pending_gap.take() {
        if span.start > end {
            merged.push(UnwindRow { pc: end, rule: UnwindRule::NO_INFO });
        }
    }
    let mut count = 0;
    while let Ok(Some(row)) = table.next_row() {
        budget.rows = budget.rows.checked_sub(1).ok_or(UnwindError::Limit { what: "unwind rows", limit: MAX_UNWIND_ROWS })?;
        let rule = classify(row, section);
        if matches!(rule.cfa, CfaRule::Unsupported) {
            stats.unsupported_rows += 1;
        }
        merged.push(UnwindRow { pc: row.start_address(), rule });
        count += 1;
    }
    stats.fdes += 1;
    stats.raw_rows += count;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of the file's table, built in pieces of `per_piece` rows; the pieces' sizes.
    fn in_pieces(path: &str, per_piece: usize) -> (Vec<UnwindRow>, Vec<usize>) {
        let (mut rows, mut sizes) = (Vec::new(), Vec::new());
        UnwindTable::build_in_pieces(Path::new(path), per_piece, &mut |p| {
            sizes.push(p.pcs.len());
            rows.extend(p.pcs.iter().zip(p.ids).map(|(&pc, &id)| UnwindRow { pc: p.base + u64::from(pc), rule: p.rules.get(id).unwrap() }));
            Ok(())
        })
        .unwrap();
        (rows, sizes)
    }

    /// A table built in pieces is the table built whole, cut.
    #[test]
    fn pieces_make_the_whole_table() {
        let whole = UnwindTable::from_path(Path::new(LIBC)).unwrap();
        let (rows, sizes) = in_pieces(LIBC, 4096);
        assert!(sizes.len() > 2 && sizes[..sizes.len() - 1].iter().all(|&n| n == 4096), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), whole.len());
        assert!(rows.iter().copied().eq(whole.rows()));
        let summary = UnwindTable::build_in_pieces(Path::new(LIBC), 4096, &mut |_| Ok(())).unwrap();
        assert_eq!(summary.rows, whole.len());
        assert_eq!(summary.segments, whole.segments);
        // The loader's entry code is marked in pieces too.
        const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
        let whole = UnwindTable::from_path(Path::new(LOADER)).unwrap();
        assert!(in_pieces(LOADER, 4096).0.iter().copied().eq(whole.rows()));
        // A piece refused stops the build with its error.
        let err = UnwindTable::build_in_pieces(Path::new(LIBC), 4096, &mut |_| Err(UnwindError::TooLarge)).unwrap_err();
        assert!(matches!(err, UnwindError::TooLarge), "{err}");
    }

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    #[test]
    fn truncated_or_corrupt_libc_is_an_error_or_a_smaller_table_never_a_panic() {
        let data = std::fs::read(LIBC).unwrap();
        let full = UnwindTable::from_elf(&data).unwrap();
        assert!(full.stats.fdes > 1000);
        // Cut anywhere: before the section headers (at the end) nothing parses.
        for cut in (0..data.len()).step_by(data.len() / 97) {
            assert!(UnwindTable::from_elf(&data[..cut]).is_err(), "a file cut at {cut} has no section headers");
        }
        // .eh_frame overwritten with noise: gimli stops where it cannot go on.
        let elf = ElfFile::parse(&data[..]).unwrap();
        let eh = elf.section(".eh_frame").unwrap().clone();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..8 {
            let mut bad = data.clone();
            for _ in 0..(1 << round) * 16 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = eh.offset as usize + (seed % eh.size) as usize;
                bad[at] = (seed >> 40) as u8;
            }
            if let Ok(t) = UnwindTable::from_elf(&bad) {
                assert!(t.stats.fdes <= full.stats.fdes + 64);
            }
        }
    }

    #[test]
    fn fde_and_row_limits_refuse_the_file() {
        let data = std::fs::read(LIBC).unwrap();
        let elf = ElfFile::parse(&data[..]).unwrap();
        let err = from_elf_within(&elf, Budget { fdes: 100, rows: usize::MAX }).unwrap_err();
        assert!(err.is_limit() && err.to_string().contains("FDEs"), "{err}");
        let err = from_elf_within(&elf, Budget { fdes: usize::MAX, rows: 1000 }).unwrap_err();
        assert!(err.is_limit() && err.to_string().contains("rows"), "{err}");
    }

    #[test]
    fn corrupt_elf_is_an_error() {
        assert!(UnwindTable::from_elf(b"\x7fELF garbage").is_err());
        assert!(UnwindTable::from_elf(b"").is_err());
    }
}
