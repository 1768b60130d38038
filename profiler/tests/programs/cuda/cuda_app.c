/* Drives the CUDA stand-ins from named functions, so that tests know the stack of every call.
 *   cuda_app memory          allocations of known sizes through every path, some freed
 *   cuda_app oom             a model load, then a KV cache that does not fit (FAKE_CUDA_BUDGET)
 *   cuda_app launches N      N runtime launches from train_step, N/2 cuLaunchKernelEx from
 *                            gemm, N/10 graph launches from replay_graph
 *   cuda_app sync N          N synchronisations from wait_for_gpu (FAKE_CUDA_SYNC_US each)
 *   cuda_app bench N         N cuLaunchKernel calls; prints ns per call
 *   cuda_app stripped N      N runtime launches from attention, through libtorch_kernels.so, whose
 *                            host stub has no symbol (a stripped library, as PyTorch's are)
 * Each mode prints what it did as `key=value` lines. With GATE=path it waits for the file first. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUfunc_st *CUfunction;
typedef struct { unsigned int x, y, z; } dim3;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	unsigned char allocFlags[8];
} CUmemAllocationProp;

cudaError_t cudaSetDevice(int);
CUresult cuInit(unsigned int);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaMallocAsync(void **, size_t, void *);
cudaError_t cudaMallocManaged(void **, size_t, unsigned int);
cudaError_t cudaFree(void *);
cudaError_t cudaFreeAsync(void *, void *);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
cudaError_t cudaGraphLaunch(void *, void *);
cudaError_t cudaDeviceSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuModuleGetFunction(CUfunction *, void *, const char *);
CUresult cuLibraryGetKernel(CUfunction *, void *, const char *);
/* From libtorch_kernels.so, loaded as Python loads PyTorch's libraries: with dlopen. */
static void (*launch_softmax)(void);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
CUresult cuLaunchKernelEx(const void *, CUfunction, void **, void **);

#define MiB (1024ULL * 1024)
#define NOINLINE __attribute__((noinline))

static int failures;
static void check(int rc, const char *what)
{
	if (rc) {
		fprintf(stderr, "%s failed: %d\n", what, rc);
		failures++;
	}
}

/* A kernel's host stub: launched by address, named by its symbol. */
NOINLINE void vector_add_kernel(void) { __asm__ volatile(""); }

NOINLINE void alloc_weights(void **out)
{
	for (int i = 0; i < 3; i++)
		check(cudaMalloc(&out[i], 64 * MiB), "cudaMalloc");
}

NOINLINE void alloc_activations(void)
{
	void *p[4];
	for (int i = 0; i < 4; i++)
		check(cudaMallocAsync(&p[i], 16 * MiB, NULL), "cudaMallocAsync");
	check(cudaFreeAsync(p[0], NULL), "cudaFreeAsync");
	check(cudaFreeAsync(p[1], NULL), "cudaFreeAsync");
}

NOINLINE void alloc_driver(void)
{
	CUdeviceptr p[2];
	for (int i = 0; i < 2; i++)
		check(cuMemAlloc_v2(&p[i], 8 * MiB), "cuMemAlloc_v2");
	check(cuMemFree_v2(p[1]), "cuMemFree_v2");
}

NOINLINE void expandable_segment(void)
{
	CUmemAllocationProp prop = { .type = 1, .location = { .type = 1, .id = 3 } };
	CUmemGenericAllocationHandle h[3];
	CUdeviceptr base;
	check(cuMemAddressReserve(&base, 1024 * MiB, 0, 0, 0), "cuMemAddressReserve");
	for (int i = 0; i < 3; i++) {
		check(cuMemCreate(&h[i], 20 * MiB, &prop, 0), "cuMemCreate");
		check(cuMemMap(base + i * 20 * MiB, 20 * MiB, 0, h[i], 0), "cuMemMap");
	}
	/* The segment shrinks: the last piece is unmapped and released. */
	check(cuMemUnmap(base + 2 * 20 * MiB, 20 * MiB), "cuMemUnmap");
	check(cuMemRelease(h[2]), "cuMemRelease");
}

NOINLINE void alloc_managed(void)
{
	void *p;
	check(cudaMallocManaged(&p, 4 * MiB, 1), "cudaMallocManaged");
}

static void run_memory(void)
{
	void *weights[3];
	check(cudaSetDevice(1), "cudaSetDevice");
	alloc_weights(weights);
	alloc_activations();
	alloc_driver();
	expandable_segment();
	alloc_managed();
	check(cudaFree(weights[2]), "cudaFree");
	/* alloc: 3x64 + 4x16 + 2x8 + 2x20 (+20 created, released) + 4 MiB; live at the end:
	 * 2x64 + 2x16 + 8 + 2x20 + 4 MiB. */
	printf("alloc_bytes=%llu\ninuse_bytes=%llu\nfailures=%d\n", (192 + 64 + 16 + 60 + 4) * MiB,
	       (128 + 32 + 8 + 40 + 4) * MiB, failures);
}

NOINLINE int load_model(void **weights)
{
	int rc = cudaMalloc(weights, 64 * MiB);
	if (rc)
		fprintf(stderr, "loading the model: error %d\n", rc);
	return rc;
}

NOINLINE int allocate_kv_cache(void **cache, size_t bytes)
{
	int rc = cudaMalloc(cache, bytes);
	if (rc)
		fprintf(stderr, "KV cache of %zu bytes: error %d\n", bytes, rc);
	return rc;
}

static void run_oom(void)
{
	void *w, *kv;
	check(load_model(&w), "load_model");
	int rc = allocate_kv_cache(&kv, 128 * MiB);
	printf("kv_cache_result=%d\n", rc);
}

NOINLINE void train_step(void)
{
	dim3 grid = { 1, 1, 1 }, block = { 32, 1, 1 };
	check(cudaLaunchKernel((const void *)vector_add_kernel, grid, block, NULL, 0, NULL), "cudaLaunchKernel");
}

NOINLINE void gemm(CUfunction f)
{
	check(cuLaunchKernelEx(NULL, f, NULL, NULL), "cuLaunchKernelEx");
}

NOINLINE void replay_graph(void)
{
	check(cudaGraphLaunch((void *)0x1, NULL), "cudaGraphLaunch");
}

static void run_launches(long n)
{
	CUfunction gemm_kernel;
	/* As cuBLAS 13 does: a CUkernel from its library, launched as a CUfunction. */
	check(cuLibraryGetKernel(&gemm_kernel, NULL, "sm90_xmma_gemm_bf16"), "cuLibraryGetKernel");
	for (long i = 0; i < n; i++) {
		train_step();
		if (i % 2 == 0)
			gemm(gemm_kernel);
		if (i % 10 == 0)
			replay_graph();
	}
	printf("runtime_launches=%ld\nex_launches=%ld\ngraph_launches=%ld\nfailures=%d\n", n, (n + 1) / 2, (n + 9) / 10, failures);
}

NOINLINE void attention(void)
{
	launch_softmax();
	__asm__ volatile(""); /* not a tail call: attention stays in the stack */
}

static void run_stripped(long n)
{
	void *lib = dlopen("libtorch_kernels.so", RTLD_NOW);
	launch_softmax = lib ? (void (*)(void))dlsym(lib, "launch_softmax") : NULL;
	if (!launch_softmax) {
		fprintf(stderr, "libtorch_kernels.so: %s\n", dlerror());
		failures++;
		n = 0;
	}
	for (long i = 0; i < n; i++)
		attention();
	printf("stripped_launches=%ld\nfailures=%d\n", n, failures);
}

NOINLINE void wait_for_gpu(void)
{
	check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static void run_sync(long n)
{
	for (long i = 0; i < n; i++)
		wait_for_gpu();
	printf("syncs=%ld\n", n);
}

static void run_bench(long n)
{
	CUfunction f;
	struct timespec a, b;
	check(cuModuleGetFunction(&f, NULL, "bench_kernel"), "cuModuleGetFunction");
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("launches=%ld\nns_per_launch=%.1f\nseconds=%.3f\n", n, ns / n, ns / 1e9);
}

int main(int argc, char **argv)
{
	const char *gate = getenv("GATE");
	if (argc < 2)
		return 2;
	while (gate && access(gate, F_OK) != 0)
		usleep(10000);
	long n = argc > 2 ? atol(argv[2]) : 1000;
	cuInit(0); /* as the runtime does on its first call */
	if (!strcmp(argv[1], "memory"))
		run_memory();
	else if (!strcmp(argv[1], "oom"))
		run_oom();
	else if (!strcmp(argv[1], "launches"))
		run_launches(n);
	else if (!strcmp(argv[1], "sync"))
		run_sync(n);
	else if (!strcmp(argv[1], "bench"))
		run_bench(n);
	else if (!strcmp(argv[1], "stripped"))
		run_stripped(n);
	else
		return 2;
	fflush(stdout);
	if (getenv("LINGER_MS"))
		usleep(atoi(getenv("LINGER_MS")) * 1000);
	return failures ? 1 : 0;
}
