//! Building an [`UnwindTable`] from an ELF file's call frame information.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use gpuflame_elfread::limits::{MAX_CFI_SECTION, MAX_FDES, MAX_UNWIND_ROWS};
use gpuflame_elfread::{consts, open_regular, ElfError, ElfFile, ReadAt};

use crate::entry::mark_entry_code;
use crate::error::UnwindError;
use crate::rule::{classify, CfaRule, UnwindRule};
use crate::table::{LoadSegment, TableStats, UnwindRow, UnwindTable};

type Slice<'a> = gimli::EndianSlice<'a, LittleEndian>;

/// One FDE, covering [start, end), and where its rows are in [`Fdes::rows`].
#[derive(Debug, Clone, Copy)]
struct FdeSpan {
    start: u64,
    end: u64,
    first: u32,
    count: u32,
}

/// The FDEs of a file with the rows of all of them in one vector: one allocation per file, not
/// one per FDE (a file of 4M FDEs took ~530 MB the other way; rows are at most
/// `MAX_UNWIND_ROWS`, so u32 indices hold them).
#[derive(Default)]
struct Fdes {
    spans: Vec<FdeSpan>,
    rows: Vec<UnwindRow>,
}

impl Fdes {
    fn rows_of(&self, span: &FdeSpan) -> &[UnwindRow] {
        &self.rows[span.first as usize..span.first as usize + span.count as usize]
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
}

fn from_elf<R: ReadAt>(elf: &ElfFile<R>) -> Result<UnwindTable, UnwindError> {
    from_elf_within(elf, Budget { fdes: MAX_FDES, rows: MAX_UNWIND_ROWS })
}

fn from_elf_within<R: ReadAt>(elf: &ElfFile<R>, mut budget: Budget) -> Result<UnwindTable, UnwindError> {
    if elf.machine() != consts::EM_X86_64 {
        return Err(UnwindError::Architecture(elf.machine()));
    }
    let mut stats = TableStats::default();
    let section_addr = |name: &str| elf.section(name).map(|s| s.addr);

    let mut fdes = Fdes::default();
    if let Some(section) = elf.section(".eh_frame") {
        let mut bases = BaseAddresses::default().set_eh_frame(section.addr);
        if let Some(a) = section_addr(".eh_frame_hdr") {
            bases = bases.set_eh_frame_hdr(a);
        }
        if let Some(a) = section_addr(".text") {
            bases = bases.set_text(a);
        }
        if let Some(a) = section_addr(".got") {
            bases = bases.set_got(a);
        }
        let data = elf.section_data(section, MAX_CFI_SECTION)?;
        let eh = EhFrame::new(&data, LittleEndian);
        collect(&eh, &bases, &mut fdes, &mut stats, &mut budget)?;
    }
    // A compressed .debug_frame is left out (no decompressor here): .eh_frame covers most code.
    if let Some(section) = elf.section(".debug_frame").filter(|s| s.flags & consts::SHF_COMPRESSED == 0) {
        let data = elf.section_data(section, MAX_CFI_SECTION)?;
        let mut df = DebugFrame::new(&data, LittleEndian);
        df.set_address_size(8);
        let mut extra = Fdes::default();
        collect(&df, &BaseAddresses::default(), &mut extra, &mut stats, &mut budget)?;
        // .eh_frame wins where both describe the same code; sorted ranges keep this n log n
        // for files with millions of FDEs.
        let mut covered: Vec<(u64, u64)> = fdes.spans.iter().map(|f| (f.start, f.end)).collect();
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
            let n = covered.partition_point(|&(s, _)| s < f.end);
            n > 0 && max_end[n - 1] > f.start
        };
        let before = fdes.spans.len();
        for span in extra.spans.iter().filter(|f| !overlaps(f)) {
            let first = fdes.rows.len() as u32;
            fdes.rows.extend_from_slice(extra.rows_of(span));
            fdes.spans.push(FdeSpan { first, ..*span });
        }
        stats.from_debug_frame = fdes.spans.len() > before;
    }
    let segments = elf
        .load_segments()
        .map(|seg| LoadSegment { file_offset: seg.offset, vaddr: seg.vaddr, file_size: seg.file_size })
        .collect();
    let mut rows = merge(fdes);
    mark_entry_code(&mut rows, elf.entry());
    Ok(UnwindTable { rows, segments, stats })
}

fn collect<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut Fdes,
    stats: &mut TableStats,
    budget: &mut Budget,
) -> Result<(), UnwindError>
where
    S::Offset: std::hash::Hash,
{
    let mut ctx = Box::new(UnwindContext::new());
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
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else { continue };
        budget.fdes = budget.fdes.checked_sub(1).ok_or(UnwindError::Limit { what: "FDEs", limit: MAX_FDES })?;
        let first = out.rows.len();
        while let Ok(Some(row)) = table.next_row() {
            budget.rows = budget.rows.checked_sub(1).ok_or(UnwindError::Limit { what: "unwind rows", limit: MAX_UNWIND_ROWS })?;
            let rule = classify(row, section);
            if matches!(rule.cfa, CfaRule::Unsupported) {
                stats.unsupported_rows += 1;
            }
            out.rows.push(UnwindRow { pc: row.start_address(), rule });
        }
        let count = out.rows.len() - first;
        stats.fdes += 1;
        stats.raw_rows += count;
        out.spans.push(FdeSpan { start: fde.initial_address(), end: fde.end_address(), first: first as u32, count: count as u32 });
    }
    Ok(())
}

/// Sorts FDEs, concatenates their rows, marks the gaps between them as having no information and
/// merges consecutive rows with the same rule.
fn merge(mut fdes: Fdes) -> Vec<UnwindRow> {
    fdes.spans.sort_by_key(|f| f.start);
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(fdes.rows.len() + fdes.spans.len());
    let push = |row: UnwindRow, rows: &mut Vec<UnwindRow>| {
        match rows.last_mut() {
            Some(last) if last.pc == row.pc => *last = row,
            Some(last) if last.rule == row.rule => {}
            _ => rows.push(row),
        }
    };
    for (i, span) in fdes.spans.iter().enumerate() {
        for row in fdes.rows_of(span) {
            push(*row, &mut rows);
        }
        let next_start = fdes.spans.get(i + 1).map(|f| f.start);
        if next_start.is_none_or(|s| s > span.end) {
            push(UnwindRow { pc: span.end, rule: UnwindRule::NO_INFO }, &mut rows);
        }
    }
    // Merging leaves far fewer rows than FDEs in files like the one above: give the rest back.
    rows.shrink_to_fit();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::RbpRule;

    fn rule(off: i32) -> UnwindRule {
        UnwindRule { cfa: CfaRule::RspOffset(off), rbp: RbpRule::Unchanged }
    }

    #[test]
    fn merge_marks_gaps_and_drops_repeats() {
        let fdes = Fdes {
            spans: vec![FdeSpan { start: 0x200, end: 0x210, first: 0, count: 1 }, FdeSpan { start: 0x100, end: 0x200, first: 1, count: 3 }],
            rows: vec![
                UnwindRow { pc: 0x200, rule: rule(8) },
                UnwindRow { pc: 0x100, rule: rule(8) },
                UnwindRow { pc: 0x101, rule: rule(16) },
                UnwindRow { pc: 0x1f0, rule: rule(8) },
            ],
        };
        let rows = merge(fdes);
        let pcs: Vec<u64> = rows.iter().map(|r| r.pc).collect();
        assert_eq!(pcs, [0x100, 0x101, 0x1f0, 0x210]);
        assert_eq!(rows[3].rule, UnwindRule::NO_INFO);
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
