/* A shared library that the dlopen test program loads at run time. It spins for CPU time, not
 * wall time: the same samples on a loaded machine. */
#include <time.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void lib_spin(double end)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void lib_inner(double end) { lib_spin(end); sink++; }
__attribute__((noinline)) void lib_entry(double seconds) { lib_inner(now() + seconds); sink++; }
