/* Functions that realign their stack (a 64-byte aligned local) and pass arguments on the stack:
 * GCC addresses their incoming frame through r10 (DRAP) and describes it with DWARF expressions:
 * the CFA is read from the frame (*(rbp - 8)) and the caller's rbp is saved at the function's own
 * rbp. PyTorch's AVX kernels are built so (threshold_kernel). Unwinding through `aligned_middle`
 * must give `aligned_outer` the rbp that its own CFA is read from. */
#include "gate.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void aligned_leaf(long n, long a, long b, long c, long d, long e, long f, long g)
{
	for (long i = 0; i < n + a + b + c + d + e + f + g; i++)
		__asm__ volatile("" : : : "memory");
}

__attribute__((noinline)) void aligned_middle(long n, long a, long b, long c, long d, long e, long f, long g)
{
	char buf[64] __attribute__((aligned(64)));
	__asm__ volatile("" : : "r"(buf) : "memory");
	aligned_leaf(n, a, b, c, d, e, f, g);
	__asm__ volatile("" : : "r"(buf) : "memory");
}

__attribute__((noinline)) void aligned_outer(long n, long a, long b, long c, long d, long e, long f, long g)
{
	char buf[64] __attribute__((aligned(64)));
	__asm__ volatile("" : : "r"(buf) : "memory");
	aligned_middle(n, a, b, c, d, e, f, g);
	__asm__ volatile("" : : "r"(buf) : "memory");
}

int main(int argc, char **argv)
{
	gate();
	double end = now() + (argc > 1 ? atof(argv[1]) : 3);
	/* Each call ~3 ms: the loop's own instructions and clock reads, outside the chain the test
	 * asks for, are a sample in thousands (at 1,000,000 they were up to 3 in 200 in CI). */
	while (now() < end)
		aligned_outer(10000000, 0, 0, 0, 0, 0, 0, argc - 1);
	return 0;
}
