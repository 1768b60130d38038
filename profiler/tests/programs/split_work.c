/* Spins for argv[1] seconds, argv[2] percent of each step's CPU time in parse() and the rest in
 * compute(), both under main -> step (compute may be a tail call): two runs with other
 * percentages make a differential profile. CPU time, not wall time: on a loaded machine the
 * thread waits for the CPU in either function, and a wall-clock split came out 65/35 for 80/20.
 * Steps last 5-15 ms, drawn at random: steps of a fixed 10 ms ran in step with the 199 Hz
 * sampler's two periods on a quiet machine, and a run of 20/80 was sampled 35/65. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gate.h"

static volatile unsigned long sink;

static double clock_s(clockid_t clock)
{
	struct timespec t;
	clock_gettime(clock, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* A system call (no vDSO for CPU clocks): checked every ~50k iterations, so that samples seldom
 * land in it. */
static double cpu_now(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* Each spins itself, so that its own time is what changes: a differential graph colours a
 * frame by the change of its self time. */
#define SPIN(end)                                   \
	while (cpu_now() < (end))                   \
		for (int i = 0; i < 50000; i++)     \
			sink += i
__attribute__((noinline)) void parse(double end) { SPIN(end); sink++; }
__attribute__((noinline)) void compute(double end) { SPIN(end); sink++; }

__attribute__((noinline)) void step(double share, double length)
{
	double start = cpu_now();
	parse(start + length * share);
	compute(start + length);
}

int main(int argc, char **argv)
{
	/* The stacks of both runs must be whole for their frames to match (under load, a run whose
	 * first samples stopped at the leaf drew parse nearly white instead of blue). */
	gate();
	double end = now() + (argc > 1 ? atof(argv[1]) : 2.0);
	double share = (argc > 2 ? atof(argv[2]) : 50.0) / 100.0;
	srand48(getpid());
	while (now() < end)
		step(share, 0.005 + 0.01 * drand48());
	return 0;
}
