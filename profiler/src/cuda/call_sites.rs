//! Where a function returns to: the instructions after the direct calls of it (x86-64 `call
//! rel32`), found in the executable segments of its file.
//!
//! PyTorch's allocator throws C++ exceptions through its `malloc` when memory runs out. A return
//! probe there would replace the return address with the kernel's trampoline, which has no unwind
//! information: the exception could not pass it and the program would abort. So the pointer that
//! malloc wrote is read by probes on the instructions its callers resume at, which an exception
//! never reaches and which leave the stack as it is.
//!
//! A probe put anywhere but on an instruction's first byte would corrupt the program. An offset
//! taken here is the end of five bytes that decode as a call to exactly the target; a run of data
//! or of another instruction's bytes matching that by chance is a one in 2^40 event per byte, and
//! a site is also kept only if it lies in the range of a function symbol of the file.

use gpuflame_elfread::{consts, ElfError, ElfFile, ReadAt};

/// Executable bytes searched at most (libc10_cuda.so has 0.4 MiB of code; a file that claims
/// the allocator's symbols is searched once, and a hostile one costs no more than this), and
/// read at a time.
const MAX_SCAN_BYTES: u64 = 64 << 20;
const CHUNK: u64 = 4 << 20;
/// The length of the calls found: a site's call instruction starts this far before it.
pub const CALL_LEN: u64 = 5;
/// Call sites kept at most: a function called from more places is followed where it is.
pub const MAX_SITES: usize = 64;

/// The file offsets of the instructions after each `call target` (`target`: a virtual address
/// of the file), inside `functions` (virtual address ranges).
pub fn return_sites<R: ReadAt>(elf: &ElfFile<R>, target: u64, functions: &[(u64, u64)]) -> Result<Vec<u64>, ElfError> {
    let mut out = Vec::new();
    if elf.machine() != consts::EM_X86_64 {
        return Ok(out);
    }
    let mut scanned = 0u64;
    for seg in elf.load_segments().filter(|s| s.flags & 1 != 0 && s.file_size > 0) {
        let mut at = 0u64;
        while at < seg.file_size && scanned < MAX_SCAN_BYTES {
            // Chunks overlap by four bytes: a call cut at a chunk's end is whole in the next.
            let len = (seg.file_size - at).min(CHUNK + 4);
            let bytes = elf.read(seg.offset + at, len, "executable segment", CHUNK + 4)?;
            scanned += len;
            for i in 0..bytes.len().saturating_sub(4) {
                if bytes[i] != 0xe8 {
                    continue;
                }
                let rel = i32::from_le_bytes([bytes[i + 1], bytes[i + 2], bytes[i + 3], bytes[i + 4]]);
                let next = seg.vaddr + at + i as u64 + CALL_LEN;
                if next.wrapping_add_signed(i64::from(rel)) != target {
                    continue;
                }
                let site = next - CALL_LEN;
                if !functions.iter().any(|&(start, end)| site >= start && next <= end) {
                    continue;
                }
                let offset = seg.offset + at + i as u64 + CALL_LEN;
                if !out.contains(&offset) && out.len() < MAX_SITES {
                    out.push(offset);
                }
            }
            if len <= 4 {
                break;
            }
            at += len - 4;
        }
    }
    Ok(out)
}
