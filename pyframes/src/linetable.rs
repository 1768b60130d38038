//! Line numbers from a code object's line table, in each version's format.

/// The line of the instruction at `lasti` (bytes for 3.8/3.9, code units from 3.10, as the BPF
/// walker reports it). None when the table says the instruction has no line.
pub fn line_for(version: (u8, u8), first_line: u32, table: &[u8], lasti: u32) -> Option<u32> {
    match version {
        (3, 8) | (3, 9) => lnotab(first_line, table, lasti),
        (3, 10) => linetable_310(first_line, table, lasti.saturating_mul(2)),
        _ => locations(first_line, table, lasti),
    }
}

/// 3.8, 3.9: `co_lnotab`, pairs of (bytecode delta, signed line delta).
fn lnotab(first_line: u32, table: &[u8], lasti: u32) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut addr = 0u32;
    for pair in table.chunks_exact(2) {
        addr += u32::from(pair[0]);
        if addr > lasti {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    u32::try_from(line).ok()
}

/// 3.10: `co_linetable`, pairs of (bytecode delta in bytes, signed line delta; -128: no line).
fn linetable_310(first_line: u32, table: &[u8], addr: u32) -> Option<u32> {
    let mut line = i64::from(first_line);
    let mut end = 0u32;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u32::from(pair[0]);
        let delta = pair[1] as i8;
        let current = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if start <= addr && addr < end {
            return current.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut value = u64::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 60 {
                return None;
            }
            value |= u64::from(b & 63) << shift;
        }
        Some(value)
    }

    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some(if v & 1 != 0 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
    }
}

/// 3.11+: the location table (Objects/locations.md in CPython), entries of 1-8 code units.
fn locations(first_line: u32, table: &[u8], lasti: u32) -> Option<u32> {
    let mut r = Reader { bytes: table, pos: 0 };
    let mut line = i64::from(first_line);
    let mut addr = 0u32;
    while let Some(head) = r.byte() {
        if head & 0x80 == 0 {
            return None; // lost the entry boundaries: a corrupt table
        }
        let code = (head >> 3) & 15;
        let length = u32::from(head & 7) + 1;
        let current = match code {
            15 => None,
            14 => {
                line += r.svarint()?;
                r.varint()?;
                r.varint()?;
                r.varint()?;
                Some(line)
            }
            13 => {
                line += r.svarint()?;
                Some(line)
            }
            10..=12 => {
                line += i64::from(code - 10);
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?;
                Some(line)
            }
        };
        if addr <= lasti && lasti < addr + length {
            return current.and_then(|l| u32::try_from(l).ok());
        }
        addr += length;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_lines() {
        // line 10 at 0, +1 at byte 6, +2 at byte 14.
        let t = [6, 1, 8, 2];
        assert_eq!(line_for((3, 8), 10, &t, 0), Some(10));
        assert_eq!(line_for((3, 8), 10, &t, 6), Some(11));
        assert_eq!(line_for((3, 9), 10, &t, 20), Some(13));
    }

    #[test]
    fn linetable_310_lines() {
        // bytes 0-4: line +1, 4-10: no line, 10-16: +2.
        let t = [4, 1, 6, 0x80, 6, 2];
        assert_eq!(line_for((3, 10), 5, &t, 1), Some(6));
        assert_eq!(line_for((3, 10), 5, &t, 3), None);
        assert_eq!(line_for((3, 10), 5, &t, 6), Some(8));
    }

    #[test]
    fn location_table_lines() {
        // A short entry (2 units, same line), a one-line entry (+1, 1 unit), a no-column entry
        // (svarint +3, 3 units), a no-location entry (1 unit).
        let t = [0x80 | 1, 0, 0x80 | (11 << 3), 4, 8, 0x80 | (13 << 3) | 2, 6, 0x80 | (15 << 3)];
        assert_eq!(line_for((3, 12), 20, &t, 0), Some(20));
        assert_eq!(line_for((3, 12), 20, &t, 1), Some(20));
        assert_eq!(line_for((3, 12), 20, &t, 2), Some(21));
        assert_eq!(line_for((3, 13), 20, &t, 5), Some(24));
        assert_eq!(line_for((3, 14), 20, &t, 6), None);
    }
}
