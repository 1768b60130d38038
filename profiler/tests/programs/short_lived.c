/* Spins in short_lived_work for argv[1] seconds of CPU time (the same samples on a loaded
 * machine), then exits: it is gone before symbolization. */
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static volatile unsigned long sink;

__attribute__((noinline)) void short_lived_work(double seconds)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	double end = t.tv_sec + t.tv_nsec / 1e9 + seconds;
	for (;;) {
		for (int i = 0; i < 200000; i++)
			sink += i;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
		if (t.tv_sec + t.tv_nsec / 1e9 >= end)
			break;
	}
}

int main(int argc, char **argv)
{
	gate();
	short_lived_work(argc > 1 ? atof(argv[1]) : 1.0);
	return 0;
}
