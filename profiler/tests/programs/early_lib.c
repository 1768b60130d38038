/* A library whose constructor does the work: the dynamic loader runs it from _dl_init, called by
 * _dl_start_user, ld.so's entry code, which has no CFI. It spins in early_spin for EARLY_MS ms
 * of CPU time (500 unset) before the program's own _start has run. */
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static volatile unsigned long sink;

static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void early_spin(double seconds)
{
	double end = cpu_now() + seconds;
	while (cpu_now() < end)
		for (int i = 0; i < 20000; i++)
			sink += i;
}

__attribute__((constructor, noinline)) void early_init(void)
{
	const char *ms = getenv("EARLY_MS");

	/* Every file the program needs is mapped by now: the recording can have all their tables. */
	gate();
	early_spin((ms ? atof(ms) : 500) / 1000);
	sink++; /* not a tail call: early_init stays on the stack */
}

int early_value(void)
{
	return (int)(sink & 1);
}
