/* A stand-in for the CUDA driver, libcuda.so.1, for tests without a GPU: the real names and C
 * signatures, and the behaviour that matters to a profiler. Device pointers and handles are unique
 * and never reused; FAKE_CUDA_BUDGET (bytes, default 80 GiB) makes allocations beyond it fail
 * with CUDA_ERROR_OUT_OF_MEMORY; FAKE_CUDA_SYNC_US is how long a synchronisation takes, and
 * FAKE_CUDA_INIT_MS how long cuInit takes (default 300 ms: a real driver takes hundreds of
 * milliseconds to seconds to initialise, which is when a profiler that sees the library mapped
 * gets its hooks in). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmod_st *CUmodule;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct CUlaunchConfig_st CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_va = 0x302000000ULL, next_handle = 1;
static unsigned long long used, budget;
static volatile unsigned long long launches;

/* What each live allocation or handle holds, to give the bytes back. */
#define MAX_LIVE 65536
static struct { unsigned long long key, size; } live[MAX_LIVE];

static unsigned long long env_ull(const char *name, unsigned long long dflt)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static void init_budget(void)
{
	if (!budget)
		budget = env_ull("FAKE_CUDA_BUDGET", 80ULL << 30);
}

static CUresult take(unsigned long long size, unsigned long long *key, int is_handle)
{
	CUresult rc = CUDA_SUCCESS;
	int i;

	if (!size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	init_budget();
	if (used + size > budget) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (i = 0; i < MAX_LIVE && live[i].key; i++)
		;
	if (i == MAX_LIVE) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (is_handle) {
		*key = next_handle++;
	} else {
		*key = next_va;
		next_va += (size + 0x1fffff) & ~0x1fffffULL; /* 2 MiB granularity, like the driver */
	}
	live[i].key = *key;
	live[i].size = size;
	used += size;
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

static CUresult give(unsigned long long key)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live[i].key == key) {
			used -= live[i].size;
			live[i].key = 0;
			rc = CUDA_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* A real launch costs the CPU microseconds (7-9 us in PyTorch on an H200): FAKE_CUDA_LAUNCH_NS
 * spins that long, for benchmarks of what hooks add to a launch-bound loop. */
static void launch_cost(void)
{
	static long long ns = -1;
	struct timespec a, b;
	if (ns < 0)
		ns = (long long)env_ull("FAKE_CUDA_LAUNCH_NS", 0);
	if (!ns)
		return;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec) < ns);
}

/* FAKE_CUDA_SYNC_FUTEX_MS: a synchronisation blocks on a futex that nobody wakes for that long, as
 * the real driver's blocking sync waits for the GPU. */
static void sync_wait(void)
{
	unsigned long long us = env_ull("FAKE_CUDA_SYNC_US", 0), ms = env_ull("FAKE_CUDA_SYNC_FUTEX_MS", 0);
	static int never;

	if (us)
		usleep(us);
	if (ms) {
		struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
		syscall(SYS_futex, &never, FUTEX_WAIT_PRIVATE, 0, &t, NULL, 0);
	}
}

/* As the real driver does at initialisation: load the CUPTI injection library that
 * CUDA_INJECTION64_PATH names and call its InitializeInjection(). */
static void load_injection(void)
{
	const char *path = getenv("CUDA_INJECTION64_PATH");
	void *h;
	int (*init)(void);

	if (!path || !*path || !(h = dlopen(path, RTLD_NOW)))
		return;
	if ((init = (int (*)(void))dlsym(h, "InitializeInjection")))
		init();
}

/* The stand-in CUPTI's launch report, if an injection library loaded it. */
static void report_launch(const char *function, const char **kernels, int count, unsigned graph)
{
	static void (*report)(const char *, const char **, int, unsigned);
	static int looked;

	if (!looked) {
		void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
		if (h)
			report = (void (*)(const char *, const char **, int, unsigned))dlsym(h, "fake_cupti_launch");
		looked = 1;
	}
	if (report)
		report(function, kernels, count, graph);
}

CUresult cuInit(unsigned int flags)
{
	static int done;
	(void)flags;
	pthread_mutex_lock(&lock);
	if (!done) {
		usleep(env_ull("FAKE_CUDA_INIT_MS", 300) * 1000);
		done = 1;
		pthread_mutex_unlock(&lock);
		load_injection();
		pthread_mutex_lock(&lock);
	}
	init_budget();
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return dptr ? take(bytesize, dptr, 0) : CUDA_ERROR_INVALID_VALUE; }
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) { (void)s; return cuMemAlloc_v2(dptr, bytesize); }
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) { (void)flags; return cuMemAlloc_v2(dptr, bytesize); }
CUresult cuMemFree_v2(CUdeviceptr dptr) { return give(dptr); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { (void)s; return give(dptr); }

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
	(void)flags;
	if (!handle || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	return take(size, handle, 1);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return give(handle); }

/* Address space only: no memory is used, and none is counted. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)
{
	(void)alignment; (void)addr; (void)flags;
	pthread_mutex_lock(&lock);
	*ptr = next_va;
	next_va += (size + 0x1fffff) & ~0x1fffffULL;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return CUDA_SUCCESS; }
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	(void)ptr; (void)size; (void)offset; (void)flags;
	return handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return CUDA_SUCCESS; }

/* Kernels: a handle per name, as a loaded module gives them. */
static struct { char name[128]; } kernels[256];
static int kernel_count;

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	(void)hmod;
	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	int i;
	for (i = 0; i < kernel_count; i++)
		if (!strcmp(kernels[i].name, name))
			break;
	if (i == kernel_count && kernel_count < 256) {
		strncpy(kernels[i].name, name, sizeof(kernels[i].name) - 1);
		kernel_count++;
	}
	pthread_mutex_unlock(&lock);
	if (i >= 256)
		return CUDA_ERROR_NOT_FOUND;
	*hfunc = (CUfunction)(uintptr_t)(0xf0000000ULL + 0x100ULL * i);
	return CUDA_SUCCESS;
}

/* CUDA 12's context-independent loading, which cuBLAS 13 uses: a CUkernel, which launches take
 * in place of a CUfunction. The same handles here. */
CUresult cuLibraryGetKernel(CUfunction *kernel, void *library, const char *name)
{
	return cuModuleGetFunction(kernel, library, name);
}

static void report_kernel(const char *function, CUfunction f)
{
	unsigned i = (unsigned)(((uintptr_t)f - 0xf0000000ULL) / 0x100);
	const char *name = i < (unsigned)kernel_count ? kernels[i].name : "unknown";
	report_launch(function, &name, 1, 0);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			unsigned shared, CUstream s, void **params, void **extra)
{
	(void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s; (void)params; (void)extra;
	if (!f)
		return CUDA_ERROR_INVALID_VALUE;
	launch_cost();
	launches++;
	report_kernel("cuLaunchKernel", f);
	return CUDA_SUCCESS;
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			     unsigned shared, CUstream s, void **params, void **extra)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
	(void)config; (void)params; (void)extra;
	if (!f)
		return CUDA_ERROR_INVALID_VALUE;
	launches++;
	report_kernel("cuLaunchKernelEx", f);
	return CUDA_SUCCESS;
}
/* A graph of two kernels. */
CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	static const char *nodes[] = { "graph_node_a", "graph_node_bb" };
	(void)s;
	launches++;
	report_launch("cuGraphLaunch", nodes, 2, (unsigned)(uintptr_t)g);
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { sync_wait(); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; sync_wait(); return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent e) { (void)e; sync_wait(); return CUDA_SUCCESS; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; return CUDA_SUCCESS; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)src; memset(dst, 0, n); return CUDA_SUCCESS; }

/* For tests: what the driver counted. */
unsigned long long fake_cuda_launches(void) { return launches; }
unsigned long long fake_cuda_used(void) { return used; }
