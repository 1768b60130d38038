//! Finds CUDA in an ELF file: the runtime and driver entry points it defines, by its dynamic and
//! static symbols, so that copies linked into other libraries are found as well as libcudart and
//! libcuda themselves.

use std::path::Path;

use gpuflame_bpf::CudaApi;
use gpuflame_elfread::{consts, open_regular, ElfError, ElfFile, ReadAt};

#[derive(Debug, thiserror::Error)]
#[error("cannot search {path} for CUDA: {source}")]
pub struct DiscoverError {
    path: String,
    source: ElfError,
}

/// The hookable CUDA functions a file defines, with the file offsets the uprobes take; empty for
/// a file without CUDA. `path` is best /proc/PID/map_files/…: the mapped file itself. The file
/// is read with pread (a file truncated meanwhile is an error, not a SIGBUS), and only if it is
/// a regular file (a FIFO at the path cannot block the search).
pub fn cuda_functions(path: &Path) -> Result<Vec<(CudaApi, u64)>, DiscoverError> {
    let err = |source: ElfError| DiscoverError { path: path.display().to_string(), source };
    let file = open_regular(path).map_err(|e| err(e.into()))?;
    functions_in(&file).map_err(err)
}

fn functions_in(src: impl ReadAt) -> Result<Vec<(CudaApi, u64)>, ElfError> {
    let elf = ElfFile::parse(src)?;
    let segments: Vec<(u64, u64, u64)> =
        elf.load_segments().filter(|s| s.file_size > 0).map(|s| (s.vaddr, s.vaddr.saturating_add(s.file_size), s.offset)).collect();
    let mut found: Vec<(CudaApi, u64)> = Vec::new();
    // A file whose dynamic symbols define or import the CUDA entry points uses them from there
    // (libcudart itself, or libtorch_cuda.so calling it): no static copy to look for in .symtab,
    // which in libtorch_cuda.so is 100 ms of reading.
    let mut dynamic_cuda = false;
    for kind in [consts::SHT_DYNSYM, consts::SHT_SYMTAB] {
        if kind == consts::SHT_SYMTAB && dynamic_cuda {
            break;
        }
        let Some(symbols) = elf.symbols(kind)? else { continue };
        for sym in symbols.iter() {
            if !could_be_hooked(sym.name) || !sym.is_function() {
                continue;
            }
            let Some(name) = sym.name_str() else { continue };
            // Versioned names in .symtab read `name@@VERSION`.
            let name = name.split('@').next().unwrap_or(name);
            let Some(api) = CudaApi::from_symbol(name) else { continue };
            dynamic_cuda |= kind == consts::SHT_DYNSYM;
            if !sym.is_defined() || sym.value == 0 {
                continue;
            }
            let addr = sym.value;
            let Some(&(start, _, offset)) = segments.iter().find(|&&(s, e, _)| addr >= s && addr < e) else { continue };
            let file_offset = (addr - start).saturating_add(offset);
            if !found.iter().any(|&(a, o)| a == api || o == file_offset) {
                found.push((api, file_offset));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether a symbol name may be one of the hooked functions: they all start with "cu" (CUDA's
/// runtime and driver), "nccl" (NCCL's collectives) or "gpuflame_cupti_" (the injection
/// library), so most of a big table is passed over without comparing it with each.
fn could_be_hooked(name: &[u8]) -> bool {
    name.starts_with(b"cu") || name.starts_with(b"nccl") || name.starts_with(b"gpuflame_cupti_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hooked_name_passes_the_quick_filter() {
        for api in CudaApi::ALL {
            assert!(could_be_hooked(api.symbol().as_bytes()), "{}", api.symbol());
        }
    }

    #[test]
    fn a_file_without_cuda_has_no_functions() {
        let exe = std::env::current_exe().unwrap();
        assert!(cuda_functions(&exe).unwrap().is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(functions_in(&b"\x7fELF garbage that is not an ELF file"[..]).is_err());
        assert!(cuda_functions(Path::new("/nonexistent/libcuda.so.1")).is_err());
        assert!(cuda_functions(Path::new("/dev/zero")).is_err_and(|e| e.to_string().contains("not a regular file")));
    }

    #[test]
    fn a_truncated_library_is_an_error_not_a_crash() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for cut in [0, 64, exe.len() / 3, exe.len() - 1] {
            assert!(functions_in(&exe[..cut]).is_err(), "cut at {cut}");
        }
    }
}
