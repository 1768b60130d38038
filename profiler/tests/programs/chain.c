/* Spins in main -> a -> b -> c for argv[1] seconds of CPU time, then exits with code 3. */
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static volatile unsigned long sink;

/* CPU time, not wall time: the work, and so its samples, is the same on a loaded machine,
 * where it takes longer. */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void c(double end)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void b(double end) { c(end); sink++; }
__attribute__((noinline)) void a(double end) { b(end); sink++; }

int main(int argc, char **argv)
{
	gate();
	a(now() + (argc > 1 ? atof(argv[1]) : 2.0));
	return 3;
}
