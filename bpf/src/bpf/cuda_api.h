/* The CUDA functions the hooks know (NCCL's collectives among them), and the records of gpuflame's CUPTI injection library: the
 * numbering both sides use (the attach cookie). Which class each function is in is a table in
 * cuda_classes.h that the Rust side checks against its own list. */
#ifndef GPUFLAME_CUDA_API_H
#define GPUFLAME_CUDA_API_H

/* The hooked CUDA functions, passed to the hooks as the attach cookie. */
enum cuda_api {
	CUDA_API_NONE = 0,
	/* allocations: out-pointer arg 0, size arg 1 */
	CUDA_MALLOC = 1,
	CUDA_MALLOC_ASYNC = 2,
	CUDA_MALLOC_MANAGED = 3,
	CU_MEM_ALLOC = 4,          /* cuMemAlloc_v2 */
	CU_MEM_ALLOC_ASYNC = 5,
	CU_MEM_ALLOC_MANAGED = 6,
	CU_MEM_CREATE = 7,         /* physical memory; out-handle arg 0, size arg 1, prop arg 2 */
	/* frees: pointer or handle arg 0 */
	CUDA_FREE = 8,
	CUDA_FREE_ASYNC = 9,
	CU_MEM_FREE = 10,          /* cuMemFree_v2 */
	CU_MEM_FREE_ASYNC = 11,
	CU_MEM_RELEASE = 12,
	/* virtual memory: which handle backs which addresses */
	CU_MEM_MAP = 13,           /* (ptr, size, offset, handle, flags) */
	CU_MEM_UNMAP = 14,         /* (ptr, size) */
	/* launches: kernel arg 0, or arg 1 for the Ex forms */
	CUDA_LAUNCH_KERNEL = 15,
	CUDA_LAUNCH_KERNEL_PTSZ = 16,
	CUDA_LAUNCH_KERNEL_EXC = 17,
	CUDA_LAUNCH_KERNEL_EXC_PTSZ = 18,
	CU_LAUNCH_KERNEL = 19,
	CU_LAUNCH_KERNEL_PTSZ = 20,
	CU_LAUNCH_KERNEL_EX = 21,
	CU_LAUNCH_KERNEL_EX_PTSZ = 22,
	CUDA_GRAPH_LAUNCH = 23,
	CUDA_GRAPH_LAUNCH_PTSZ = 24,
	CU_GRAPH_LAUNCH = 25,
	CU_GRAPH_LAUNCH_PTSZ = 26,
	/* synchronisations and copies: time only */
	CUDA_DEVICE_SYNCHRONIZE = 27,
	CUDA_STREAM_SYNCHRONIZE = 28,
	CUDA_EVENT_SYNCHRONIZE = 29,
	CUDA_MEMCPY = 30,
	CUDA_MEMCPY_ASYNC = 31,
	CU_CTX_SYNCHRONIZE = 32,
	CU_STREAM_SYNCHRONIZE = 33,
	CU_EVENT_SYNCHRONIZE = 34,
	CU_MEMCPY_HTOD = 35,       /* the _v2 entry points */
	CU_MEMCPY_DTOH = 36,
	CU_MEMCPY_DTOD = 37,
	CU_MEMCPY_ASYNC = 38,
	CU_MEMCPY_HTOD_ASYNC = 39,
	CU_MEMCPY_DTOH_ASYNC = 40,
	/* bookkeeping */
	CU_MODULE_GET_FUNCTION = 41, /* (CUfunction *out, CUmodule, const char *name) */
	CUDA_SET_DEVICE = 42,
	/* gpuflame's CUPTI injection library */
	CUPTI_LAUNCH = 43,         /* (correlation id, callback id): a launch, stack wanted */
	CUPTI_KERNELS = 44,        /* (records, count, dropped so far): kernel activity records */
	CUPTI_NAME = 45,           /* (name id, name) */
	CUPTI_STATUS = 46,         /* (code, ready word): 0 active, 1 no libcupti, 2 another subscriber,
	                            * 3 error, 4 waiting for gpuflame to set the ready word */
	/* NCCL's collectives (libnccl.so.2): count and datatype args 2 and 3, or 1 and 2 for
	 * ncclBcast, ncclSend and ncclRecv */
	NCCL_ALL_REDUCE = 47,
	NCCL_ALL_GATHER = 48,
	NCCL_REDUCE_SCATTER = 49,
	NCCL_BROADCAST = 50,
	NCCL_BCAST = 51,
	NCCL_REDUCE = 52,
	NCCL_ALLTOALL = 53,
	NCCL_GATHER = 54,
	NCCL_SCATTER = 55,
	NCCL_SEND = 56,
	NCCL_RECV = 57,
	/* PyTorch's caching allocator (libc10_cuda.so, static symbols; libc10.so): tensors, not
	 * segments. NativeCachingAllocator::malloc(this, void **ptr, int8 device, size, stream) */
	C10_MALLOC = 58,
	/* the three ways a tensor's block goes back to the cache: ptr arg 1, arg 0 for the deleter */
	C10_FREE = 59,             /* NativeCachingAllocator::free(this, ptr) */
	C10_RAW_DELETE = 60,       /* NativeCachingAllocator::raw_delete(this, ptr) */
	C10_LOCAL_RAW_DELETE = 61, /* Native::local_raw_delete(ptr): every tensor's DataPtr deleter */
	/* c10::reportOutOfMemoryToProfiler(size, allocated, reserved, Device): the allocator's
	 * out-of-memory path, just before it throws */
	C10_OUT_OF_MEMORY = 62,
	/* the instructions malloc's callers resume at: its return, without a return probe, which
	 * would stop the C++ exception it throws at an out-of-memory (see call_sites.rs) */
	C10_MALLOC_RETURNED = 63,
	/* (CUkernel *out, CUlibrary, const char *name): CUDA 12's context-independent loading, which
	 * cuBLAS 13 uses; its launches pass the CUkernel as their CUfunction */
	CU_LIBRARY_GET_KERNEL = 64,
	/* Where the USDT probes follow tensors, hooks on call instructions, not on functions: they
	 * trap only on the allocator's rare paths, where a hook on malloc's entry trapped for every
	 * tensor. The call of malloc in raw_alloc (which has no probe): C10_MALLOC, read at the call. */
	C10_MALLOC_CALLED = 65,
	/* The calls of DeviceCachingAllocator::alloc_block (a new segment, on a cache miss) and the
	 * instructions after them: the segment calls made between are made for a tensor. */
	C10_ALLOC_BLOCK_CALLED = 66,
	C10_ALLOC_BLOCK_RETURNED = 67,
	CUDA_API_MAX = 68,
};

/* Hooked calls nest (cudaMalloc calls cuMemAlloc_v2): per thread and class, only the outermost
 * call counts. */
enum cuda_class {
	CUDA_CLASS_ALLOC = 0,
	CUDA_CLASS_FREE = 1,
	CUDA_CLASS_MAP = 2,
	CUDA_CLASS_LAUNCH = 3,
	CUDA_CLASS_API = 4,
	CUDA_CLASS_META = 5,
	CUDA_CLASS_CUPTI = 6,  /* handled at entry: no return hook */
	CUDA_CLASS_COLLECTIVE = 7,
	CUDA_CLASS_TENSOR_ALLOC = 8,
	CUDA_CLASS_TENSOR_FREE = 9, /* handled at entry: no return hook, no stack */
	CUDA_CLASS_TENSOR_OOM = 10,
};

/* cuda_call_payload.flags */
enum cuda_call_flags {
	CUDA_CALL_IN_ALLOCATOR = 1, /* a segment call made inside a hooked tensor allocation */
	CUDA_CALL_STEPPED = 2,      /* its function's first instruction is stepped out of line */
	CUDA_CALL_SAMPLED_OUT = 4,  /* a tensor whose stack byte sampling passed over (torch_allocator.h) */
	/* Bits 8-15: hooked calls nested in this one (a runtime launch's driver launch), each an
	 * entry trap that hooking cost the caller besides this call's own; bits 16-23: those of
	 * them whose first instruction was stepped out of line, a trap more. */
	CUDA_CALL_NESTED_SHIFT = 8,
	CUDA_CALL_NESTED_STEPPED_SHIFT = 16,
	CUDA_CALL_NESTED_MAX = 255,
};

/* The cookie of a hooked function: its enum cuda_api, and whether the kernel steps its first
 * instruction out of line (a trap more per call) rather than emulating it (push, nop, jumps):
 * user space reads the instruction when it attaches. */
enum cuda_cookie {
	CUDA_COOKIE_API_MASK = 0xffff,
	CUDA_COOKIE_STEPPED = 0x10000,
};

/* A kernel activity record as the injection library passes it (struct gpuflame_kernel). */
struct cupti_kernel {
	__u64 start;
	__u64 end;
	__u32 correlation;
	__u32 device;
	__u32 stream;
	__u32 name_id;
	__u32 graph;
	__u32 pad;
	__u64 graph_node;
};

/* Records per EVENT_CUPTI_KERNELS, which follow the header where a user stack would: one hook
 * hit per 682 kernels (32 KiB of records). */
#define CUPTI_BATCH 682
#define CUPTI_BATCH_MASK 0x7fff

#endif
