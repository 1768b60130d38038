//! /proc/PID/maps: the one place gpuflame reads and parses it.

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub writable: bool,
    pub offset: u64,
    /// "major:minor" as the kernel prints it, and the inode: the file's identity.
    pub dev: String,
    pub inode: u64,
    /// A file path, `[vdso]`-style name, or empty for anonymous memory.
    pub path: String,
}

/// The mappings of `pid` now; None when they cannot be read or there are none (the process is
/// gone, or exiting).
pub fn read_maps(pid: u32) -> Option<Vec<MapsEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let maps = parse_maps(&text);
    (!maps.is_empty()).then_some(maps)
}

/// The mappings of `pid` now, as the symbolizer takes them for addresses no recorded mapping
/// holds.
pub fn read_for_symbolizer(pid: u32) -> Option<Vec<gpuflame_symbolizer::ProcessMapping>> {
    let maps = read_maps(pid)?;
    Some(maps.into_iter().map(|e| gpuflame_symbolizer::ProcessMapping { start: e.start, end: e.end, offset: e.offset, inode: e.inode, path: e.path }).collect())
}

/// Parses maps text; malformed lines are skipped (the file is the kernel's, but a process can
/// exit while it is read).
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MapsEntry> {
    let mut fields = line.splitn(6, char::is_whitespace);
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        writable: perms.as_bytes().get(1) == Some(&b'w'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_string(),
        inode: inode.parse().ok()?,
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_anonymous_and_special_mappings() {
        let text = "\
55d0c0a00000-55d0c0a28000 r--p 00000000 fe:01 1234   /usr/bin/python3.11
55d0c0a28000-55d0c0c00000 r-xp 00028000 fe:01 1234   /usr/bin/python3.11
7f0000000000-7f0000001000 rwxp 00000000 00:00 0 
7ffd1a3f3000-7ffd1a3f5000 r-xp 00000000 00:00 0      [vdso]
7f1111111000-7f1111112000 r-xp 00000000 fe:01 99     /tmp/with space (deleted)
garbage
";
        let e = parse_maps(text);
        assert_eq!(e.len(), 5);
        assert!(!e[0].executable && e[1].executable);
        assert_eq!((e[1].start, e[1].offset, e[1].inode), (0x55d0c0a28000, 0x28000, 1234));
        assert_eq!(e[1].path, "/usr/bin/python3.11");
        assert_eq!(e[2].path, "");
        assert_eq!(e[3].path, "[vdso]");
        assert_eq!(e[4].path, "/tmp/with space (deleted)");
    }
}
