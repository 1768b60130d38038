//! Finds CUDA in an ELF file: the runtime and driver entry points it defines, by its dynamic and
//! static symbols, so that copies linked into other libraries are found as well as libcudart and
//! libcuda themselves.

use std::path::Path;

use gpuflame_bpf::CudaApi;
use gpuflame_elfread::{consts, open_regular, ElfError, ElfFile, ReadAt};

use super::call_sites::{return_sites, CALL_LEN};

#[derive(Debug, thiserror::Error)]
#[error("cannot search {path} for CUDA: {source}")]
pub struct DiscoverError {
    path: String,
    source: ElfError,
}

/// What a file holds of CUDA.
#[derive(Debug, Default, PartialEq)]
pub struct CudaSearch {
    /// The hookable functions, with the file offsets the uprobes take.
    pub functions: Vec<(CudaApi, u64)>,
    /// The file is PyTorch's libc10_cuda (it exports the caching allocator's configuration) but
    /// the allocator's methods were not all found: why, in words.
    pub allocator_missing: Option<String>,
    /// The file carries PyTorch's USDT probes pytorch:malloc and pytorch:free: how the hooks
    /// change when they are attached.
    pub probes_replace: Option<ProbesReplace>,
}

/// What attaching PyTorch's probes changes in a file's hooks.
#[derive(Debug, Default, PartialEq)]
pub struct ProbesReplace {
    /// Hooks among `functions` that the probes make redundant.
    pub replaced: Vec<(CudaApi, u64)>,
    /// Hooks on call instructions that stand in for malloc's entry, which would trap for every
    /// tensor: raw_alloc's call of malloc, and alloc_block's calls and returns.
    pub added: Vec<(CudaApi, u64)>,
}

/// Mangled names start so in PyTorch's caching allocator.
const ALLOCATOR_PREFIX: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator";
const NATIVE_MALLOC_PREFIX: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator6malloc";
/// DeviceCachingAllocator::alloc_block, whose parameters change between versions of PyTorch.
const ALLOC_BLOCK_PREFIX: &[u8] = b"_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockE";
/// c10::reportOutOfMemoryToProfiler, in libc10.so.
const OOM_REPORT_PREFIX: &[u8] = b"_ZN3c1027reportOutOfMemoryToProfiler";

/// The hookable CUDA functions a file defines, with the file offsets the uprobes take; empty for
/// a file without CUDA. `path` is best /proc/PID/map_files/…: the mapped file itself. The file
/// is read with pread (a file truncated meanwhile is an error, not a SIGBUS), and only if it is
/// a regular file (a FIFO at the path cannot block the search).
pub fn cuda_functions(path: &Path) -> Result<CudaSearch, DiscoverError> {
    let err = |source: ElfError| DiscoverError { path: path.display().to_string(), source };
    let file = open_regular(path).map_err(|e| err(e.into()))?;
    functions_in(&file).map_err(err)
}

fn functions_in(src: impl ReadAt) -> Result<CudaSearch, ElfError> {
    let elf = ElfFile::parse(src)?;
    let segments: Vec<(u64, u64, u64)> =
        elf.load_segments().filter(|s| s.file_size > 0).map(|s| (s.vaddr, s.vaddr.saturating_add(s.file_size), s.offset)).collect();
    let mut found: Vec<(CudaApi, u64)> = Vec::new();
    // A file whose dynamic symbols define or import the CUDA entry points uses them from there
    // (libcudart itself, or libtorch_cuda.so calling it): no static copy to look for in .symtab,
    // which in libtorch_cuda.so is 100 ms of reading.
    // PyTorch's libc10_cuda imports the runtime, but its allocator's methods are local symbols:
    // in .symtab only.
    let mut dynamic_cuda = false;
    let mut c10_cuda = false;
    let mut other_malloc: Option<String> = None;
    let mut malloc_vaddr = None;
    let mut alloc_blocks: Vec<u64> = Vec::new();
    for kind in [consts::SHT_DYNSYM, consts::SHT_SYMTAB] {
        if kind == consts::SHT_SYMTAB && dynamic_cuda && !c10_cuda {
            break;
        }
        let Some(symbols) = elf.symbols(kind)? else { continue };
        for sym in symbols.iter() {
            if kind == consts::SHT_DYNSYM && sym.is_defined() && sym.name.starts_with(ALLOCATOR_PREFIX) {
                c10_cuda = true;
            }
            if !could_be_hooked(sym.name) || !sym.is_function() {
                continue;
            }
            let Some(name) = sym.name_str() else { continue };
            // Versioned names in .symtab read `name@@VERSION`.
            let name = name.split('@').next().unwrap_or(name);
            let Some(api) = CudaApi::from_symbol(name) else {
                if sym.name.starts_with(NATIVE_MALLOC_PREFIX) {
                    other_malloc = Some(name.to_string());
                }
                if sym.name.starts_with(ALLOC_BLOCK_PREFIX) && sym.is_defined() && alloc_blocks.len() < 8 {
                    alloc_blocks.push(sym.value);
                }
                continue;
            };
            dynamic_cuda |= kind == consts::SHT_DYNSYM;
            if !sym.is_defined() || sym.value == 0 {
                continue;
            }
            let addr = sym.value;
            if api == CudaApi::C10Malloc {
                malloc_vaddr = Some(addr);
            }
            let Some(&(start, _, offset)) = segments.iter().find(|&&(s, e, _)| addr >= s && addr < e) else { continue };
            let file_offset = (addr - start).saturating_add(offset);
            if !found.iter().any(|&(a, o)| a == api || o == file_offset) {
                found.push((api, file_offset));
            }
        }
    }
    let mut no_return = None;
    // The static functions' ranges, where call sites are looked for: read once, for the
    // allocator's files alone (libtorch_cuda's table is 100 ms of reading).
    let functions: Vec<(u64, u64)> = match (malloc_vaddr.is_some() || c10_cuda).then(|| elf.symbols(consts::SHT_SYMTAB)).transpose()?.flatten() {
        Some(symbols) => symbols.iter().filter(|s| s.is_function() && s.size > 0).map(|s| (s.value, s.value.saturating_add(s.size))).collect(),
        None => Vec::new(),
    };
    if let Some(target) = malloc_vaddr {
        // Its return is seen where its callers resume (call_sites.rs): without one, not at all.
        let sites = return_sites(&elf, target, &functions)?;
        if sites.is_empty() {
            found.retain(|(api, _)| *api != CudaApi::C10Malloc);
            no_return = Some("no call of its malloc was found (gpuflame follows direct calls on x86-64)".to_string());
        }
        found.extend(sites.into_iter().map(|offset| (CudaApi::C10MallocReturned, offset)));
    }
    found.sort();
    let allocator_missing = c10_cuda.then(|| no_return.or_else(|| allocator_check(&found, other_malloc))).flatten();
    let probes_replace = if c10_cuda { replaced_by_probes(&elf, &found, &segments, &functions, &alloc_blocks)? } else { None };
    Ok(CudaSearch { functions: found, allocator_missing, probes_replace })
}

/// With pytorch:malloc and pytorch:free in the file's notes: the deleter's hook, and malloc's
/// return in the functions that hold a malloc probe (allocate, allocateWithAddress), which would
/// count their tensors twice. raw_alloc has no probe: its call of malloc keeps its return hook.
/// malloc's entry, which would trap for every tensor, goes where alloc_block's calls are found:
/// raw_alloc's call instruction is hooked instead, and alloc_block's calls and returns mark the
/// segment calls made for a tensor. Where they are not found, malloc's entry stays if raw_alloc
/// calls it. A file whose notes do not read is followed by its hooks.
fn replaced_by_probes<R: ReadAt>(
    elf: &ElfFile<R>,
    found: &[(CudaApi, u64)],
    segments: &[(u64, u64, u64)],
    functions: &[(u64, u64)],
    alloc_blocks: &[u64],
) -> Result<Option<ProbesReplace>, ElfError> {
    let probes = elf.sdt_probes().unwrap_or_default();
    let of = |name: &str| probes.iter().filter(|p| p.provider == "pytorch" && p.name == name).map(|p| p.address).collect::<Vec<u64>>();
    let (mallocs, frees) = (of("malloc"), of("free"));
    if mallocs.is_empty() || frees.is_empty() {
        return Ok(None);
    }
    let probed: Vec<(u64, u64)> = functions.iter().copied().filter(|&(s, e)| mallocs.iter().any(|&a| a >= s && a < e)).collect();
    let vaddr = |offset: u64| segments.iter().find(|&&(s, e, o)| offset >= o && offset - o < e - s).map(|&(s, _, o)| offset - o + s);
    let in_probed = |offset: u64| vaddr(offset).is_some_and(|a| probed.iter().any(|&(s, e)| a > s && a <= e));
    let mut replaced: Vec<(CudaApi, u64)> =
        found.iter().copied().filter(|&(api, off)| api == CudaApi::C10LocalRawDelete || (api == CudaApi::C10MallocReturned && in_probed(off))).collect();
    let raw_returns: Vec<u64> = found.iter().filter(|&&(api, off)| api == CudaApi::C10MallocReturned && !in_probed(off)).map(|&(_, off)| off).collect();
    let mut block_returns = Vec::new();
    for &target in alloc_blocks {
        block_returns.extend(return_sites(elf, target, functions)?);
    }
    let mut added = Vec::new();
    let malloc_entry = found.iter().copied().filter(|&(api, _)| api == CudaApi::C10Malloc);
    if !block_returns.is_empty() {
        replaced.extend(malloc_entry);
        // A return site found is the end of a five-byte `call rel32` (call_sites.rs).
        added.extend(raw_returns.iter().map(|&r| (CudaApi::C10MallocCalled, r - CALL_LEN)));
        for r in block_returns {
            added.extend([(CudaApi::C10AllocBlockCalled, r - CALL_LEN), (CudaApi::C10AllocBlockReturned, r)]);
        }
    } else if raw_returns.is_empty() {
        replaced.extend(malloc_entry);
    }
    Ok(Some(ProbesReplace { replaced, added }))
}

/// Why the caching allocator of a libc10_cuda cannot be followed, if it cannot.
fn allocator_check(found: &[(CudaApi, u64)], other_malloc: Option<String>) -> Option<String> {
    let has = |api| found.iter().any(|&(a, _)| a == api);
    if has(CudaApi::C10Malloc) && has(CudaApi::C10LocalRawDelete) {
        return None;
    }
    let missing: Vec<&str> = [CudaApi::C10Malloc, CudaApi::C10LocalRawDelete].into_iter().filter(|&a| !has(a)).map(CudaApi::frame_name).collect();
    Some(match other_malloc {
        Some(name) => format!("this PyTorch's allocator has another shape ({name} is not the malloc gpuflame knows); {} not found", missing.join(", ")),
        None => format!("{} not found (the library's static symbols are stripped, or this PyTorch differs)", missing.join(", ")),
    })
}

/// Whether a symbol name may be one of the hooked functions: they all start with "cu" (CUDA's
/// runtime and driver), "nccl" (NCCL's collectives), "gpuflame_cupti_" (the injection library)
/// or one of PyTorch's allocator's two prefixes, so most of a big table (libtorch's thousands of
/// other `c10::` names among them) is passed over without comparing it with each.
fn could_be_hooked(name: &[u8]) -> bool {
    name.starts_with(b"cu")
        || name.starts_with(b"nccl")
        || name.starts_with(b"gpuflame_cupti_")
        || name.starts_with(ALLOCATOR_PREFIX)
        || name.starts_with(OOM_REPORT_PREFIX)
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
    fn an_allocator_of_another_shape_is_said_not_misread() {
        let both = [(CudaApi::C10Malloc, 0x10), (CudaApi::C10LocalRawDelete, 0x20)];
        assert_eq!(allocator_check(&both, None), None);
        let other = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator6mallocEPPvimP11CUstream_st".to_string();
        let why = allocator_check(&[(CudaApi::C10LocalRawDelete, 0x20)], Some(other.clone())).unwrap();
        assert!(why.contains("another shape") && why.contains(&other) && why.contains("CUDACachingAllocator::malloc"), "{why}");
        let why = allocator_check(&[], None).unwrap();
        assert!(why.contains("stripped"), "{why}");
    }

    /// The stand-in libc10_cuda with PyTorch's probes (sys/sdt.h): the probes replace the
    /// deleter's hook, malloc's return in allocate, which holds the malloc probe, and malloc's
    /// entry; raw_alloc's return stays, and its call of malloc and alloc_block's two calls (a
    /// first try and one after the cache is emptied) and their returns are hooked instead.
    /// Without the notes, nothing is replaced.
    #[test]
    fn the_probes_replace_the_hooks_of_what_they_see() {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/cuda/fake_c10_cuda.cpp");
        for notes in [true, false] {
            let lib = dir.path().join(format!("libc10_cuda_{notes}.so"));
            let out = std::process::Command::new("c++")
                .args(["-O2", "-g", "-shared", "-fPIC", "-fvisibility=hidden", if notes { "-DGF_SDT" } else { "-UGF_SDT" }, "-o"])
                .arg(&lib)
                .arg(&src)
                .output()
                .expect("a C++ compiler (c++) is needed");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let found = cuda_functions(&lib).unwrap();
            assert_eq!(found.allocator_missing, None);
            let Some(swap) = found.probes_replace else {
                assert!(!notes, "the probes were not found");
                continue;
            };
            assert!(notes, "probes found in a library built without them");
            let returns: Vec<u64> = found.functions.iter().filter(|(a, _)| *a == CudaApi::C10MallocReturned).map(|&(_, o)| o).collect();
            assert_eq!(returns.len(), 2, "malloc is called from allocate and raw_alloc: {:?}", found.functions);
            let replaced = &swap.replaced;
            let replaced_returns: Vec<u64> = replaced.iter().filter(|(a, _)| *a == CudaApi::C10MallocReturned).map(|&(_, o)| o).collect();
            assert_eq!(replaced_returns.len(), 1, "allocate's return site, not raw_alloc's: {replaced:?}");
            assert!(replaced.iter().any(|(a, _)| *a == CudaApi::C10LocalRawDelete));
            assert!(replaced.iter().any(|(a, _)| *a == CudaApi::C10Malloc), "malloc's entry: {replaced:?}");
            assert!(!replaced.iter().any(|(a, _)| matches!(a, CudaApi::C10Free | CudaApi::C10RawDelete | CudaApi::C10OutOfMemory)), "{replaced:?}");
            let raw_return = returns.iter().find(|r| !replaced_returns.contains(r)).unwrap();
            let added = |api| swap.added.iter().filter(|(a, _)| *a == api).map(|&(_, o)| o).collect::<Vec<u64>>();
            assert_eq!(added(CudaApi::C10MallocCalled), vec![raw_return - CALL_LEN], "{:?}", swap.added);
            let (calls, block_returns) = (added(CudaApi::C10AllocBlockCalled), added(CudaApi::C10AllocBlockReturned));
            assert_eq!(calls.len(), 2, "{:?}", swap.added);
            assert_eq!(calls.iter().map(|c| c + CALL_LEN).collect::<Vec<u64>>(), block_returns);
            // Each is a call instruction in the file (e8 rel32).
            let bytes = std::fs::read(&lib).unwrap();
            for c in calls.iter().chain(&added(CudaApi::C10MallocCalled)) {
                assert_eq!(bytes[*c as usize], 0xe8, "no call at {c:#x}");
            }
        }
    }

    #[test]
    fn a_file_without_cuda_has_no_functions() {
        let exe = std::env::current_exe().unwrap();
        assert_eq!(cuda_functions(&exe).unwrap(), CudaSearch::default());
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
