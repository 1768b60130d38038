/* Spins for argv[1] seconds, argv[2] percent of each 10 ms in parse() and the rest in compute(),
 * both under main -> step (compute may be a tail call): two runs with other percentages make a differential profile. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Each spins itself, so that its own time is what changes: a differential graph colours a
 * frame by the change of its self time. */
#define SPIN(end)                                   \
	while (now() < (end))                       \
		for (int i = 0; i < 2000; i++)      \
			sink += i
__attribute__((noinline)) void parse(double end) { SPIN(end); sink++; }
__attribute__((noinline)) void compute(double end) { SPIN(end); sink++; }

__attribute__((noinline)) void step(double share)
{
	double start = now();
	parse(start + 0.01 * share);
	compute(start + 0.01);
}

int main(int argc, char **argv)
{
	/* Asleep while the recording builds this program's tables at low priority: the stacks of
	 * both runs must be whole for their frames to match (under load, a run whose first samples
	 * stopped at the leaf drew parse nearly white instead of blue). */
	usleep(300000);
	double end = now() + (argc > 1 ? atof(argv[1]) : 2.0);
	double share = (argc > 2 ? atof(argv[2]) : 50.0) / 100.0;
	while (now() < end)
		step(share);
	return 0;
}
