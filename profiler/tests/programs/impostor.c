/* Spins in its own functions for argv[1] seconds. The test links it with the build-id of another
 * program (chain.c): its code, unwind information and names are its own all the same. */
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

__attribute__((noinline)) void PWNED_pad(int n)
{
	for (int i = 0; i < n; i++)
		sink += i * 3;
}

__attribute__((noinline)) void PWNED_spin(double end)
{
	char buf[4096];
	while (now() < end) {
		buf[sink % sizeof(buf)] = (char)sink;
		PWNED_pad(200000 + buf[0]);
	}
}

int main(int argc, char **argv)
{
	gate();
	PWNED_spin(now() + (argc > 1 ? atof(argv[1]) : 2.0));
	return 0;
}
