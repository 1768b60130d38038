//! Finds CUDA in an ELF file: the runtime and driver entry points it defines, by its dynamic and
//! static symbols, so that copies linked into other libraries are found as well as libcudart and
//! libcuda themselves.

use std::fs::File;
use std::path::Path;

use gpuflame_bpf::CudaApi;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not a readable ELF file: {source}")]
    Elf { path: String, source: object::Error },
}

/// The hookable CUDA functions a file defines, with the file offsets the uprobes take; empty for
/// a file without CUDA.
pub fn cuda_functions(path: &Path) -> Result<Vec<(CudaApi, u64)>, DiscoverError> {
    let file = File::open(path).map_err(|source| DiscoverError::Io { path: path.display().to_string(), source })?;
    // SAFETY: the mapping is read-only; a file truncated under us would fault, as for any mmap
    // reader; library files are not rewritten in place.
    let data = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| DiscoverError::Io { path: path.display().to_string(), source })?;
    functions_in(&data).map_err(|source| DiscoverError::Elf { path: path.display().to_string(), source })
}

fn functions_in(data: &[u8]) -> Result<Vec<(CudaApi, u64)>, object::Error> {
    let elf = object::File::parse(data)?;
    let segments: Vec<(u64, u64, u64)> = elf
        .segments()
        .filter_map(|s| {
            let (offset, size) = s.file_range();
            (size > 0).then_some((s.address(), s.address() + size, offset))
        })
        .collect();
    let mut found: Vec<(CudaApi, u64)> = Vec::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // Versioned names in .symtab read `name@@VERSION`.
        let name = name.split('@').next().unwrap_or(name);
        let Some(api) = CudaApi::from_symbol(name) else { continue };
        let addr = sym.address();
        let Some(&(start, _, offset)) = segments.iter().find(|&&(s, e, _)| addr >= s && addr < e) else { continue };
        let file_offset = addr - start + offset;
        if !found.iter().any(|&(a, o)| a == api || o == file_offset) {
            found.push((api, file_offset));
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_cuda_has_no_functions() {
        let exe = std::env::current_exe().unwrap();
        assert!(cuda_functions(&exe).unwrap().is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(functions_in(b"\x7fELF garbage that is not an ELF file").is_err());
        assert!(cuda_functions(Path::new("/nonexistent/libcuda.so.1")).is_err());
    }
}
