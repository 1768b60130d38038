//! Building an [`UnwindTable`] from an ELF file's call frame information.

use std::collections::HashMap;

use gimli::{BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use object::{Object, ObjectSection, ObjectSegment};

use crate::rule::{classify, UnwindRule};
use crate::{TableStats, UnwindError, UnwindRow, UnwindTable};

type Slice<'a> = gimli::EndianSlice<'a, LittleEndian>;

/// The rows of one FDE, covering [start, end).
struct FdeRows {
    start: u64,
    end: u64,
    rows: Vec<UnwindRow>,
}

pub(crate) fn from_elf(data: &[u8]) -> Result<UnwindTable, UnwindError> {
    let file = object::File::parse(data)?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(UnwindError::Architecture(file.architecture()));
    }
    let mut stats = TableStats::default();
    let section_addr = |name: &str| file.section_by_name(name).map(|s| s.address());

    let mut fdes = Vec::new();
    if let Some(section) = file.section_by_name(".eh_frame") {
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(a) = section_addr(".eh_frame_hdr") {
            bases = bases.set_eh_frame_hdr(a);
        }
        if let Some(a) = section_addr(".text") {
            bases = bases.set_text(a);
        }
        if let Some(a) = section_addr(".got") {
            bases = bases.set_got(a);
        }
        let eh = EhFrame::new(section.data()?, LittleEndian);
        collect(&eh, &bases, &mut fdes, &mut stats);
    }
    if let Some(section) = file.section_by_name(".debug_frame") {
        // Compressed .debug_frame sections are decompressed by object.
        let data = section.uncompressed_data()?;
        let mut df = DebugFrame::new(&data, LittleEndian);
        df.set_address_size(8);
        let mut extra = Vec::new();
        collect(&df, &BaseAddresses::default(), &mut extra, &mut stats);
        // .eh_frame wins where both describe the same code.
        let covered: Vec<(u64, u64)> = fdes.iter().map(|f| (f.start, f.end)).collect();
        let before = fdes.len();
        fdes.extend(extra.into_iter().filter(|f| !covered.iter().any(|&(s, e)| f.start < e && s < f.end)));
        stats.from_debug_frame = fdes.len() > before;
    }
    let segments = file
        .segments()
        .map(|seg| {
            let (file_offset, file_size) = seg.file_range();
            crate::LoadSegment { file_offset, vaddr: seg.address(), file_size }
        })
        .collect();
    Ok(UnwindTable { rows: merge(fdes), segments, stats })
}

fn collect<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut Vec<FdeRows>,
    stats: &mut TableStats,
) where
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
        let mut rows = Vec::new();
        while let Ok(Some(row)) = table.next_row() {
            let rule = classify(row, section);
            if matches!(rule.cfa, crate::CfaRule::Unsupported) {
                stats.unsupported_rows += 1;
            }
            rows.push(UnwindRow { pc: row.start_address(), rule });
        }
        stats.fdes += 1;
        stats.raw_rows += rows.len();
        out.push(FdeRows { start: fde.initial_address(), end: fde.end_address(), rows });
    }
}

/// Sorts FDEs, concatenates their rows, marks the gaps between them as having no information and
/// merges consecutive rows with the same rule.
fn merge(mut fdes: Vec<FdeRows>) -> Vec<UnwindRow> {
    fdes.sort_by_key(|f| f.start);
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(fdes.iter().map(|f| f.rows.len() + 1).sum());
    let push = |row: UnwindRow, rows: &mut Vec<UnwindRow>| {
        match rows.last_mut() {
            Some(last) if last.pc == row.pc => *last = row,
            Some(last) if last.rule == row.rule => {}
            _ => rows.push(row),
        }
    };
    for i in 0..fdes.len() {
        for row in &fdes[i].rows {
            push(*row, &mut rows);
        }
        let end = fdes[i].end;
        let next_start = fdes.get(i + 1).map(|f| f.start);
        if next_start.is_none_or(|s| s > end) {
            push(UnwindRow { pc: end, rule: UnwindRule::NO_INFO }, &mut rows);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CfaRule, RbpRule};

    fn rule(off: i32) -> UnwindRule {
        UnwindRule { cfa: CfaRule::RspOffset(off), rbp: RbpRule::Unchanged }
    }

    #[test]
    fn merge_marks_gaps_and_drops_repeats() {
        let fdes = vec![
            FdeRows { start: 0x200, end: 0x210, rows: vec![UnwindRow { pc: 0x200, rule: rule(8) }] },
            FdeRows {
                start: 0x100,
                end: 0x200,
                rows: vec![UnwindRow { pc: 0x100, rule: rule(8) }, UnwindRow { pc: 0x101, rule: rule(16) }, UnwindRow { pc: 0x1f0, rule: rule(8) }],
            },
        ];
        let rows = merge(fdes);
        let pcs: Vec<u64> = rows.iter().map(|r| r.pc).collect();
        assert_eq!(pcs, [0x100, 0x101, 0x1f0, 0x210]);
        assert_eq!(rows[3].rule, UnwindRule::NO_INFO);
    }

    #[test]
    fn corrupt_elf_is_an_error() {
        assert!(from_elf(b"\x7fELF garbage").is_err());
        assert!(from_elf(b"").is_err());
    }
}
