//! The CUDA functions gpuflame hooks, and how each is hooked. The records their hooks send are
//! decoded with the other records, in `events`.

use crate::skel::types::cuda_api as raw;

/// What a hooked function does, which decides how its calls are counted and whether its hooks
/// may stay attached (memory functions are called rarely; launches thousands of times a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaClass {
    /// Device memory comes into existence: out-pointer and size.
    Alloc,
    /// Device memory (or a physical handle) goes.
    Free,
    /// A physical handle is mapped at, or unmapped from, device addresses.
    Map,
    Launch,
    /// Synchronisations and copies: only their time matters.
    Api,
    /// Bookkeeping: kernel names, the current device.
    Meta,
    /// gpuflame's CUPTI injection library: launches with their correlation ids, kernel records.
    Cupti,
    /// NCCL's collectives and point-to-point calls: element count and datatype. Tens to
    /// thousands a second, each microseconds of NCCL's own: every call is hooked.
    Collective,
    /// PyTorch's caching allocator hands a tensor a block: out-pointer, device, size.
    TensorAlloc,
    /// A tensor's block goes back to the allocator's cache: its pointer, at entry.
    TensorFree,
    /// The allocator's own out-of-memory report: size asked, its allocated and reserved bytes.
    TensorOom,
}

macro_rules! cuda_apis {
    ($($variant:ident = $raw:ident, $symbol:literal, $class:ident;)*) => {
        /// A hooked CUDA runtime or driver function.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum CudaApi { $($variant),* }

        impl CudaApi {
            pub const ALL: &'static [CudaApi] = &[$(CudaApi::$variant),*];

            /// The exported name the hook attaches to.
            pub fn symbol(self) -> &'static str {
                match self { $(CudaApi::$variant => $symbol),* }
            }

            pub fn class(self) -> CudaClass {
                match self { $(CudaApi::$variant => CudaClass::$class),* }
            }

            /// The value the BPF programs know it by (their attach cookie); from the generated
            /// mirror of the C enum, so the two cannot drift apart.
            pub(crate) fn raw(self) -> u32 {
                match self { $(CudaApi::$variant => raw::$raw.0),* }
            }

            pub(crate) fn from_raw(v: u32) -> Option<CudaApi> {
                $(if v == raw::$raw.0 { return Some(CudaApi::$variant); })*
                None
            }
        }
    };
}

cuda_apis! {
    CudaMalloc = CUDA_MALLOC, "cudaMalloc", Alloc;
    CudaMallocAsync = CUDA_MALLOC_ASYNC, "cudaMallocAsync", Alloc;
    CudaMallocManaged = CUDA_MALLOC_MANAGED, "cudaMallocManaged", Alloc;
    CuMemAlloc = CU_MEM_ALLOC, "cuMemAlloc_v2", Alloc;
    CuMemAllocAsync = CU_MEM_ALLOC_ASYNC, "cuMemAllocAsync", Alloc;
    CuMemAllocManaged = CU_MEM_ALLOC_MANAGED, "cuMemAllocManaged", Alloc;
    CuMemCreate = CU_MEM_CREATE, "cuMemCreate", Alloc;
    CudaFree = CUDA_FREE, "cudaFree", Free;
    CudaFreeAsync = CUDA_FREE_ASYNC, "cudaFreeAsync", Free;
    CuMemFree = CU_MEM_FREE, "cuMemFree_v2", Free;
    CuMemFreeAsync = CU_MEM_FREE_ASYNC, "cuMemFreeAsync", Free;
    CuMemRelease = CU_MEM_RELEASE, "cuMemRelease", Free;
    CuMemMap = CU_MEM_MAP, "cuMemMap", Map;
    CuMemUnmap = CU_MEM_UNMAP, "cuMemUnmap", Map;
    CudaLaunchKernel = CUDA_LAUNCH_KERNEL, "cudaLaunchKernel", Launch;
    CudaLaunchKernelPtsz = CUDA_LAUNCH_KERNEL_PTSZ, "cudaLaunchKernel_ptsz", Launch;
    CudaLaunchKernelExC = CUDA_LAUNCH_KERNEL_EXC, "cudaLaunchKernelExC", Launch;
    CudaLaunchKernelExCPtsz = CUDA_LAUNCH_KERNEL_EXC_PTSZ, "cudaLaunchKernelExC_ptsz", Launch;
    CuLaunchKernel = CU_LAUNCH_KERNEL, "cuLaunchKernel", Launch;
    CuLaunchKernelPtsz = CU_LAUNCH_KERNEL_PTSZ, "cuLaunchKernel_ptsz", Launch;
    CuLaunchKernelEx = CU_LAUNCH_KERNEL_EX, "cuLaunchKernelEx", Launch;
    CuLaunchKernelExPtsz = CU_LAUNCH_KERNEL_EX_PTSZ, "cuLaunchKernelEx_ptsz", Launch;
    CudaGraphLaunch = CUDA_GRAPH_LAUNCH, "cudaGraphLaunch", Launch;
    CudaGraphLaunchPtsz = CUDA_GRAPH_LAUNCH_PTSZ, "cudaGraphLaunch_ptsz", Launch;
    CuGraphLaunch = CU_GRAPH_LAUNCH, "cuGraphLaunch", Launch;
    CuGraphLaunchPtsz = CU_GRAPH_LAUNCH_PTSZ, "cuGraphLaunch_ptsz", Launch;
    CudaDeviceSynchronize = CUDA_DEVICE_SYNCHRONIZE, "cudaDeviceSynchronize", Api;
    CudaStreamSynchronize = CUDA_STREAM_SYNCHRONIZE, "cudaStreamSynchronize", Api;
    CudaEventSynchronize = CUDA_EVENT_SYNCHRONIZE, "cudaEventSynchronize", Api;
    CudaMemcpy = CUDA_MEMCPY, "cudaMemcpy", Api;
    CudaMemcpyAsync = CUDA_MEMCPY_ASYNC, "cudaMemcpyAsync", Api;
    CuCtxSynchronize = CU_CTX_SYNCHRONIZE, "cuCtxSynchronize", Api;
    CuStreamSynchronize = CU_STREAM_SYNCHRONIZE, "cuStreamSynchronize", Api;
    CuEventSynchronize = CU_EVENT_SYNCHRONIZE, "cuEventSynchronize", Api;
    CuMemcpyHtoD = CU_MEMCPY_HTOD, "cuMemcpyHtoD_v2", Api;
    CuMemcpyDtoH = CU_MEMCPY_DTOH, "cuMemcpyDtoH_v2", Api;
    CuMemcpyDtoD = CU_MEMCPY_DTOD, "cuMemcpyDtoD_v2", Api;
    CuMemcpyAsync = CU_MEMCPY_ASYNC, "cuMemcpyAsync", Api;
    CuMemcpyHtoDAsync = CU_MEMCPY_HTOD_ASYNC, "cuMemcpyHtoDAsync_v2", Api;
    CuMemcpyDtoHAsync = CU_MEMCPY_DTOH_ASYNC, "cuMemcpyDtoHAsync_v2", Api;
    CuModuleGetFunction = CU_MODULE_GET_FUNCTION, "cuModuleGetFunction", Meta;
    CudaSetDevice = CUDA_SET_DEVICE, "cudaSetDevice", Meta;
    CuptiLaunch = CUPTI_LAUNCH, "gpuflame_cupti_launch", Cupti;
    CuptiKernels = CUPTI_KERNELS, "gpuflame_cupti_kernels", Cupti;
    CuptiName = CUPTI_NAME, "gpuflame_cupti_name", Cupti;
    CuptiStatus = CUPTI_STATUS, "gpuflame_cupti_status", Cupti;
    NcclAllReduce = NCCL_ALL_REDUCE, "ncclAllReduce", Collective;
    NcclAllGather = NCCL_ALL_GATHER, "ncclAllGather", Collective;
    NcclReduceScatter = NCCL_REDUCE_SCATTER, "ncclReduceScatter", Collective;
    NcclBroadcast = NCCL_BROADCAST, "ncclBroadcast", Collective;
    NcclBcast = NCCL_BCAST, "ncclBcast", Collective;
    NcclReduce = NCCL_REDUCE, "ncclReduce", Collective;
    NcclAlltoAll = NCCL_ALLTOALL, "ncclAlltoAll", Collective;
    NcclGather = NCCL_GATHER, "ncclGather", Collective;
    NcclScatter = NCCL_SCATTER, "ncclScatter", Collective;
    NcclSend = NCCL_SEND, "ncclSend", Collective;
    NcclRecv = NCCL_RECV, "ncclRecv", Collective;
    C10Malloc = C10_MALLOC, "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator6mallocEPPvamP11CUstream_st", TensorAlloc;
    C10Free = C10_FREE, "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator4freeEPv", TensorFree;
    C10RawDelete = C10_RAW_DELETE, "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator10raw_deleteEPv", TensorFree;
    C10LocalRawDelete = C10_LOCAL_RAW_DELETE, "_ZN3c104cuda20CUDACachingAllocator6NativeL16local_raw_deleteEPv", TensorFree;
    C10OutOfMemory = C10_OUT_OF_MEMORY, "_ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE", TensorOom;
    // Not a symbol (no name has a space): the instructions after the calls of C10Malloc.
    C10MallocReturned = C10_MALLOC_RETURNED, "_ZN3c104cuda20CUDACachingAllocator (return of malloc)", TensorAlloc;
    CuLibraryGetKernel = CU_LIBRARY_GET_KERNEL, "cuLibraryGetKernel", Meta;
    // Not symbols either: call instructions, and the instructions after the calls of alloc_block.
    C10MallocCalled = C10_MALLOC_CALLED, "_ZN3c104cuda20CUDACachingAllocator (call of malloc)", TensorAlloc;
    C10AllocBlockCalled = C10_ALLOC_BLOCK_CALLED, "_ZN3c104cuda20CUDACachingAllocator (call of alloc_block)", TensorAlloc;
    C10AllocBlockReturned = C10_ALLOC_BLOCK_RETURNED, "_ZN3c104cuda20CUDACachingAllocator (return of alloc_block)", TensorAlloc;
}

impl CudaApi {
    /// Whether its hook has a return half. Call instructions and the instructions after them are
    /// hooked where they are, not at a function's entry (a return probe there would take the
    /// caller's return); CUPTI's transport and the frees are read at entry alone.
    pub(crate) fn has_return(self) -> bool {
        !matches!(self.class(), CudaClass::Cupti | CudaClass::TensorFree)
            && !matches!(self, CudaApi::C10MallocCalled | CudaApi::C10AllocBlockCalled)
            && !self.is_after_call()
    }

    /// Hooked at the instructions after a call, where the call it stands for returned.
    pub(crate) fn is_after_call(self) -> bool {
        matches!(self, CudaApi::C10MallocReturned | CudaApi::C10AllocBlockReturned)
    }

    pub fn from_symbol(name: &str) -> Option<CudaApi> {
        CudaApi::ALL.iter().copied().find(|a| a.symbol() == name)
    }

    /// A tensor's allocation or free (PyTorch's caching allocator): in the live set, apart from
    /// the segment of the same address.
    pub fn is_tensor(self) -> bool {
        matches!(self.class(), CudaClass::TensorAlloc | CudaClass::TensorFree)
    }

    /// PyTorch's caching allocator's, not CUDA's own.
    pub fn is_pytorch(self) -> bool {
        matches!(self.class(), CudaClass::TensorAlloc | CudaClass::TensorFree | CudaClass::TensorOom)
    }

    /// What a stack's last frame calls it: the exported name, or for PyTorch's allocator, whose
    /// names are mangled C++, the method.
    pub fn frame_name(self) -> &'static str {
        match self {
            CudaApi::C10Malloc | CudaApi::C10MallocReturned | CudaApi::C10MallocCalled => "CUDACachingAllocator::malloc",
            CudaApi::C10AllocBlockCalled | CudaApi::C10AllocBlockReturned => "CUDACachingAllocator::alloc_block",
            CudaApi::C10Free => "CUDACachingAllocator::free",
            CudaApi::C10RawDelete => "CUDACachingAllocator::raw_delete",
            CudaApi::C10LocalRawDelete => "CUDACachingAllocator::local_raw_delete",
            CudaApi::C10OutOfMemory => "c10::reportOutOfMemoryToProfiler",
            api => api.symbol(),
        }
    }

    /// The hook must see every call (memory, names; the injection library samples its launch
    /// callbacks itself); the others may be duty-cycled.
    pub fn always_on(self) -> bool {
        matches!(
            self.class(),
            CudaClass::Alloc
                | CudaClass::Free
                | CudaClass::Map
                | CudaClass::Meta
                | CudaClass::Collective
                | CudaClass::TensorAlloc
                | CudaClass::TensorFree
                | CudaClass::TensorOom
                | CudaClass::Cupti
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_round_trips_through_its_raw_value() {
        for &api in CudaApi::ALL {
            assert_eq!(CudaApi::from_raw(api.raw()), Some(api), "{api:?}");
            assert_eq!(CudaApi::from_symbol(api.symbol()), Some(api));
        }
        assert_eq!(CudaApi::ALL.len() as u32 + 1, raw::CUDA_API_MAX.0);
        assert_eq!(std::mem::size_of::<crate::skel::types::cupti_kernel>(), 48);
        assert_eq!(CudaApi::from_raw(0), None);
    }

    /// The C enum's number of a class.
    fn class_raw(class: CudaClass) -> u32 {
        use crate::skel::types::cuda_class as c;
        match class {
            CudaClass::Alloc => c::CUDA_CLASS_ALLOC.0,
            CudaClass::Free => c::CUDA_CLASS_FREE.0,
            CudaClass::Map => c::CUDA_CLASS_MAP.0,
            CudaClass::Launch => c::CUDA_CLASS_LAUNCH.0,
            CudaClass::Api => c::CUDA_CLASS_API.0,
            CudaClass::Meta => c::CUDA_CLASS_META.0,
            CudaClass::Cupti => c::CUDA_CLASS_CUPTI.0,
            CudaClass::Collective => c::CUDA_CLASS_COLLECTIVE.0,
            CudaClass::TensorAlloc => c::CUDA_CLASS_TENSOR_ALLOC.0,
            CudaClass::TensorFree => c::CUDA_CLASS_TENSOR_FREE.0,
            CudaClass::TensorOom => c::CUDA_CLASS_TENSOR_OOM.0,
        }
    }

    /// The class the hooks give each call (which calls nest, which records wake user space) is
    /// the table cuda_class_by_api in the compiled object: read out of it, not out of the text.
    #[test]
    fn the_programs_classes_are_the_rust_ones() {
        use libbpf_rs::skel::SkelBuilder;
        let mut storage = std::mem::MaybeUninit::uninit();
        let open = crate::skel::CpuSamplerSkelBuilder::default().open(&mut storage).expect("the object opens");
        let table = open.maps.rodata_data.as_deref().expect("the object has a .rodata").cuda_class_by_api;
        for v in 0..raw::CUDA_API_MAX.0 {
            // Numbers of no function (CUDA_API_NONE) are bookkeeping to the hooks: nothing nests.
            let class = CudaApi::from_raw(v).map_or(CudaClass::Meta, CudaApi::class);
            assert_eq!(u32::from(table[v as usize]), class_raw(class), "{:?} (api {v})", CudaApi::from_raw(v));
        }
    }
}
