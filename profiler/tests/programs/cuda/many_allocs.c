/* Allocates and frees 4 KiB through cuMemAlloc_v2 once from each of 2^15 distinct stacks (each
 * level of walk() called from one of two call sites by one bit of the counter), paced over about
 * three seconds: a window of more distinct stacks than Pyroscope takes in one profile. Build with
 * -O0 so that the two call sites stay apart. With GATE=path it waits for the file first; then it
 * prints what it did and lingers LINGER_MS. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

#define DEPTH 15

static volatile unsigned long sink;
static int failures;

__attribute__((noinline)) void alloc_here(void)
{
	CUdeviceptr p;
	if (cuMemAlloc_v2(&p, 4096))
		failures++;
	else
		cuMemFree_v2(p);
}

__attribute__((noinline)) void walk(int depth, unsigned k)
{
	if (depth == DEPTH) {
		alloc_here();
		return;
	}
	if (k & (1u << depth)) {
		walk(depth + 1, k);
		sink += 1;
	} else {
		walk(depth + 1, k);
		sink += 2;
	}
}

int main(void)
{
	const char *gate = getenv("GATE");
	while (gate && access(gate, F_OK) != 0)
		usleep(10000);
	cuInit(0);
	for (unsigned k = 0; k < (1u << DEPTH); k++) {
		walk(0, k);
		if ((k & 255) == 255)
			usleep(20000);
	}
	printf("allocations=%u\nfailures=%d\n", 1u << DEPTH, failures);
	fflush(stdout);
	if (getenv("LINGER_MS"))
		usleep(atoi(getenv("LINGER_MS")) * 1000);
	return failures ? 1 : 0;
}
