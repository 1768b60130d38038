//! Where ELF bytes come from: a file (pread) or memory already owned (the vDSO, tests).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Positioned reads that never map the file.
#[allow(clippy::len_without_is_empty)]
pub trait ReadAt {
    /// The length as of now (a file may shrink later: reads then fail).
    fn len(&self) -> std::io::Result<u64>;
    /// Fills `buf` from `offset`; a short read is an `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn len(&self) -> std::io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let start = usize::try_from(offset).map_err(|_| eof())?;
        let src = start.checked_add(buf.len()).and_then(|end| self.get(start..end)).ok_or_else(eof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn len(&self) -> std::io::Result<u64> {
        (**self).len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
}
