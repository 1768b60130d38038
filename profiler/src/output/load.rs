//! Reading the profile a file holds, pprof (gzipped or not) or folded stacks, told apart by
//! content, into a [`FlatProfile`]. Folded text is read a line at a time from a file, never held
//! whole; a pipe, which can be read only once, is read whole first, as is a pprof file, which is
//! inflated twice (its string table comes after its samples; see `pprof_read.rs`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::path::Path;

use super::folded::{self, FoldedError, FoldedReadError};
use super::pprof::{self, PprofError, MAX_PROFILE_BYTES};
use crate::samples::FlatProfile;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read, or is larger than [`MAX_PROFILE_BYTES`].
    #[error(transparent)]
    Read(#[from] io::Error),
    #[error(transparent)]
    Content(#[from] ReadError),
}

/// What is wrong with what a file holds.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Pprof(#[from] PprofError),
    #[error("folded stacks, {0}")]
    Folded(#[from] FoldedError),
    #[error("neither a pprof profile nor folded stacks (UTF-8 text)")]
    Unrecognised,
}

fn too_large() -> io::Error {
    io::Error::other(format!("larger than {} MiB, the most gpuflame reads", MAX_PROFILE_BYTES >> 20))
}

/// The profile in the file at `path`. Folded samples count `period` nanoseconds each. Text that
/// is UTF-8 throughout is folded stacks; anything else is a pprof, or nothing gpuflame reads.
pub fn load(path: &Path, period: i64) -> Result<FlatProfile, LoadError> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(read(read_bounded(file)?, period)?);
    }
    if meta.len() > MAX_PROFILE_BYTES as u64 {
        return Err(too_large().into());
    }
    let mut input = BufReader::with_capacity(1 << 16, file.take(MAX_PROFILE_BYTES as u64 + 1));
    if input.fill_buf()?.starts_with(&[0x1f, 0x8b]) {
        let mut bytes = Vec::new();
        input.read_to_end(&mut bytes)?;
        return whole(bytes, period);
    }
    let fallback = |input: BufReader<io::Take<File>>| -> Result<FlatProfile, LoadError> {
        // Not text after all: read again from the start, as bytes.
        let mut file = input.into_inner().into_inner();
        file.rewind()?;
        whole(read_bounded(file)?, period)
    };
    match folded::read_from(&mut input, period) {
        Ok(_) if input.get_ref().limit() == 0 => Err(too_large().into()),
        Ok(profile) => Ok(profile),
        Err(FoldedReadError::Io(e)) => Err(e.into()),
        Err(FoldedReadError::NotText) => fallback(input),
        // A bad line in text that is not UTF-8 further on is no folded stack's error.
        Err(FoldedReadError::Line(e)) => match rest_is_text(&mut input)? {
            true => Err(ReadError::Folded(e).into()),
            false => fallback(input),
        },
    }
}

/// Whether what is left of `input` is UTF-8.
fn rest_is_text(input: &mut impl BufRead) -> io::Result<bool> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(true);
        }
        if std::str::from_utf8(&line).is_err() {
            return Ok(false);
        }
    }
}

fn whole(bytes: Vec<u8>, period: i64) -> Result<FlatProfile, LoadError> {
    if bytes.len() > MAX_PROFILE_BYTES {
        return Err(too_large().into());
    }
    Ok(read(bytes, period)?)
}

/// Reads pprof (gzipped or not) or folded stacks from their bytes, telling them apart by
/// content. Folded samples count `period` nanoseconds each.
pub fn read(bytes: Vec<u8>, period: i64) -> Result<FlatProfile, ReadError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(pprof::read_flat(bytes)?);
    }
    if std::str::from_utf8(&bytes).is_ok() {
        return match folded::read_from(&mut bytes.as_slice(), period) {
            Ok(profile) => Ok(profile),
            Err(FoldedReadError::Line(e)) => Err(e.into()),
            // Neither can happen to bytes that are UTF-8.
            Err(FoldedReadError::NotText | FoldedReadError::Io(_)) => Err(ReadError::Unrecognised),
        };
    }
    pprof::read_flat(bytes).map_err(|_| ReadError::Unrecognised)
}

/// The input, refused past [`MAX_PROFILE_BYTES`] (it may be a pipe, whose size is not known
/// until it is read).
fn read_bounded(input: impl Read) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    input.take(MAX_PROFILE_BYTES as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > MAX_PROFILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}
