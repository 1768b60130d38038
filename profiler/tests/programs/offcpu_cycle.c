/* Alternates 200 ms of spinning under spin_outer -> spin_inner and 300 ms of nanosleep under
 * sleep_outer -> sleep_inner, for argv[1] cycles (default 6): off-CPU time is about 60% of its
 * wall time, under the sleep chain. A loaded machine stretches the sleeps (the thread waits for
 * a CPU once woken), so at the end it says on stderr how long each part took, by its clock:
 * "offcpu_cycle: spin_ns=N sleep_ns=N". */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

volatile unsigned long sink;

__attribute__((noinline)) void spin_inner(double seconds)
{
	double end = now() + seconds;
	while (now() < end)
		for (int i = 0; i < 1000; i++)
			sink += i;
}

__attribute__((noinline)) void spin_outer(double seconds) { spin_inner(seconds); sink++; }

__attribute__((noinline)) void sleep_inner(long ms)
{
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
	while (nanosleep(&t, &t))
		;
	sink++;
}

__attribute__((noinline)) void sleep_outer(long ms) { sleep_inner(ms); sink++; }

int main(int argc, char **argv)
{
	int cycles = argc > 1 ? atoi(argv[1]) : 6;
	double spun = 0, slept = 0;
	gate();
	for (int i = 0; i < cycles; i++) {
		double t0 = now();
		spin_outer(0.2);
		double t1 = now();
		sleep_outer(300);
		spun += t1 - t0;
		slept += now() - t1;
	}
	fprintf(stderr, "offcpu_cycle: spin_ns=%.0f sleep_ns=%.0f\n", spun * 1e9, slept * 1e9);
	return 0;
}
