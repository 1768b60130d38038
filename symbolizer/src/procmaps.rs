//! The file mappings of a live process, from /proc/PID/maps, for addresses the process tracker
//! has not placed.

pub(crate) struct MapsLine {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
}

/// Parses maps text; lines that do not parse are skipped (the process may exit meanwhile).
pub(crate) fn parse(text: &str) -> Vec<MapsLine> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, char::is_whitespace);
            let (start, end) = f.next()?.split_once('-')?;
            let _perms = f.next()?;
            let offset = f.next()?;
            let _dev = f.next()?;
            let inode = f.next()?;
            Some(MapsLine {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                inode: inode.parse().ok()?,
                path: f.next().unwrap_or("").trim_start().to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_vdso_and_anonymous_lines() {
        let m = super::parse("1000-2000 r-xp 00001000 fe:01 42   /usr/lib/libx.so (deleted)\n3000-4000 r-xp 00000000 00:00 0 [vdso]\n5000-6000 rwxp 00000000 00:00 0 \nbad\n");
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].start, m[0].end, m[0].offset, m[0].inode), (0x1000, 0x2000, 0x1000, 42));
        assert_eq!(m[0].path, "/usr/lib/libx.so (deleted)");
        assert_eq!(m[1].path, "[vdso]");
        assert_eq!(m[2].path, "");
    }
}
