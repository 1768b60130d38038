/* A stand-in for a stripped PyTorch CUDA library (libtorch_cuda.so has no .symtab): a kernel's host
 * stub with no symbol, registered with the runtime by a constructor as nvcc's generated code does,
 * and launched through cudaLaunchKernel from the one exported function. Built with -s. */
#include <stddef.h>

typedef struct { unsigned int x, y, z; } dim3;
int cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, void *);
void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *);

__attribute__((noinline)) static void softmax_stub(void) { __asm__ volatile(""); }

__attribute__((constructor)) static void register_kernels(void)
{
	__cudaRegisterFunction(NULL, (const char *)softmax_stub, "_Z14softmax_kernelPf", "_Z14softmax_kernelPf", -1, NULL, NULL, NULL, NULL, NULL);
}

__attribute__((noinline)) void launch_softmax(void)
{
	dim3 grid = { 1, 1, 1 }, block = { 128, 1, 1 };
	cudaLaunchKernel((const void *)softmax_stub, grid, block, NULL, 0, NULL);
}
