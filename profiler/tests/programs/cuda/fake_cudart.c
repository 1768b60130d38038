/* A stand-in for the CUDA runtime, libcudart.so.13: the real names and C signatures, implemented
 * on the driver as the real runtime is (cudaMalloc calls cuMemAlloc_v2; a launch looks the kernel
 * up by name once, with cuModuleGetFunction, then calls cuLaunchKernel). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int cudaError_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct { unsigned int x, y, z; } dim3;

#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorInvalidDevice 101

CUresult cuInit(unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, cudaStream_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, cudaStream_t);
CUresult cuModuleGetFunction(CUfunction *, void *, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, cudaStream_t, void **, void **);
CUresult cuGraphLaunch(cudaGraphExec_t, cudaStream_t);
CUresult cuCtxSynchronize(void);
CUresult cuStreamSynchronize(cudaStream_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);

static __thread int current_device;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void) { cuInit(0); }

static cudaError_t from_driver(CUresult rc)
{
	switch (rc) {
	case 0: return cudaSuccess;
	case 2: return cudaErrorMemoryAllocation;
	default: return cudaErrorInvalidValue;
	}
}

cudaError_t cudaSetDevice(int device)
{
	pthread_once(&init_once, init);
	if (device < 0 || device >= 8)
		return cudaErrorInvalidDevice;
	current_device = device;
	return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) { *device = current_device; return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *count) { pthread_once(&init_once, init); *count = 8; return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t size)
{
	pthread_once(&init_once, init);
	return from_driver(cuMemAlloc_v2((CUdeviceptr *)p, size));
}
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
	pthread_once(&init_once, init);
	return from_driver(cuMemAllocAsync((CUdeviceptr *)p, size, s));
}
cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
	pthread_once(&init_once, init);
	return from_driver(cuMemAllocManaged((CUdeviceptr *)p, size, flags));
}
cudaError_t cudaFree(void *p) { return p ? from_driver(cuMemFree_v2((CUdeviceptr)p)) : cudaSuccess; }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return from_driver(cuMemFreeAsync((CUdeviceptr)p, s)); }

/* What nvcc's generated constructors register: each host stub with its kernel's name. The real
 * runtime launches by these, so a stub needs no symbol (PyTorch's libraries have none). */
static struct { const void *stub; const char *name; } registered[256];
static int registered_count;

void __cudaRegisterFunction(void **fatbin, const char *host_fun, char *device_fun, const char *device_name, int thread_limit,
			    void *tid, void *bid, void *block, void *grid, int *warp_size)
{
	(void)fatbin; (void)device_fun; (void)thread_limit; (void)tid; (void)bid; (void)block; (void)grid; (void)warp_size;
	if (registered_count < 256) {
		registered[registered_count].stub = host_fun;
		registered[registered_count].name = device_name;
		registered_count++;
	}
}

static const char *registered_name(const void *func)
{
	for (int i = 0; i < registered_count; i++)
		if (registered[i].stub == func)
			return registered[i].name;
	return NULL;
}

/* The kernel of a host stub, by its registered name or else the stub's symbol, looked up once. */
static CUfunction kernel_of(const void *func)
{
	static struct { const void *stub; CUfunction f; } cache[256];
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	CUfunction f = NULL;
	Dl_info info;
	int i;

	pthread_mutex_lock(&lock);
	for (i = 0; i < 256 && cache[i].stub; i++)
		if (cache[i].stub == func) {
			f = cache[i].f;
			break;
		}
	if (!f && i < 256) {
		const char *name = registered_name(func);
		if (!name)
			name = dladdr(func, &info) && info.dli_sname ? info.dli_sname : "unknown_kernel";
		if (cuModuleGetFunction(&f, NULL, name) == 0) {
			cache[i].stub = func;
			cache[i].f = f;
		}
	}
	pthread_mutex_unlock(&lock);
	return f;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t s)
{
	CUfunction f = kernel_of(func);
	if (!f)
		return cudaErrorInvalidValue;
	return from_driver(cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shared, s, args, NULL));
}
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t s)
{
	return cudaLaunchKernel(func, grid, block, args, shared, s);
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) { return from_driver(cuGraphLaunch(g, s)); }

cudaError_t cudaDeviceSynchronize(void) { return from_driver(cuCtxSynchronize()); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return from_driver(cuStreamSynchronize(s)); }

enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	if (kind == cudaMemcpyHostToDevice)
		return from_driver(cuMemcpyHtoD_v2((CUdeviceptr)dst, src, n));
	if (kind == cudaMemcpyDeviceToHost)
		return from_driver(cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, n));
	memmove(dst, src, n);
	return cudaSuccess;
}
