/* A 40-deep call chain, f01 (called by main) down to f40, which spins for argv[1] seconds of CPU
 * time. Built with -O2 -fomit-frame-pointer: frame pointers cannot carry the unwind, so a whole
 * stack in the profile means the DWARF (.eh_frame) unwinder in BPF worked on this kernel.
 *
 * Each function is noinline and noclone (so it is a frame of its own) and does its work after the
 * call as well as before it (so the call is not a tail call, which would drop the caller's frame).
 * CPU time rather than wall time: under qemu's TCG a second of wall time is worth little work. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double cpu_seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline, noclone)) unsigned long f40(double seconds)
{
	double end = cpu_seconds() + seconds;
	unsigned long n = 0;
	/* The clock is a system call: read it every 200k iterations only, so that nearly every sample
	 * lands in user code of f40 rather than in the kernel. */
	do {
		for (int i = 0; i < 200000; i++)
			sink += i ^ n;
		n++;
	} while (cpu_seconds() < end);
	return n;
}

#define STEP(self, next, k)                                                   \
	__attribute__((noinline, noclone)) unsigned long self(double seconds) \
	{                                                                     \
		sink += k;                                                    \
		unsigned long r = next(seconds);                              \
		sink ^= r * k;                                                \
		return r + k;                                                 \
	}

STEP(f39, f40, 39) STEP(f38, f39, 38) STEP(f37, f38, 37) STEP(f36, f37, 36) STEP(f35, f36, 35)
STEP(f34, f35, 34) STEP(f33, f34, 33) STEP(f32, f33, 32) STEP(f31, f32, 31) STEP(f30, f31, 30)
STEP(f29, f30, 29) STEP(f28, f29, 28) STEP(f27, f28, 27) STEP(f26, f27, 26) STEP(f25, f26, 25)
STEP(f24, f25, 24) STEP(f23, f24, 23) STEP(f22, f23, 22) STEP(f21, f22, 21) STEP(f20, f21, 20)
STEP(f19, f20, 19) STEP(f18, f19, 18) STEP(f17, f18, 17) STEP(f16, f17, 16) STEP(f15, f16, 15)
STEP(f14, f15, 14) STEP(f13, f14, 13) STEP(f12, f13, 12) STEP(f11, f12, 11) STEP(f10, f11, 10)
STEP(f09, f10, 9) STEP(f08, f09, 8) STEP(f07, f08, 7) STEP(f06, f07, 6) STEP(f05, f06, 5)
STEP(f04, f05, 4) STEP(f03, f04, 3) STEP(f02, f03, 2) STEP(f01, f02, 1)

int main(int argc, char **argv)
{
	return f01(argc > 1 ? atof(argv[1]) : 3.0) == 0;
}
