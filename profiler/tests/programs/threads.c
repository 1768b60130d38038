/* Four threads spin in worker -> a -> b -> c for argv[1] seconds; main waits in join. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "gate.h"

static volatile unsigned long sink;
static double end;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void c(void)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void b(void) { c(); sink++; }
__attribute__((noinline)) void a(void) { b(); sink++; }
__attribute__((noinline)) void *worker(void *arg) { a(); sink++; return arg; }

int main(int argc, char **argv)
{
	pthread_t t[4];
	gate();
	end = now() + (argc > 1 ? atof(argv[1]) : 2.0);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	return 0;
}
