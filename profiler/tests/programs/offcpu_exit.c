/* A process that exits while one of its threads sleeps: the thread blocks in
 * park_forever -> park_inner (nanosleep of an hour) and main exits after argv[1] ms (default 500).
 * It waits at the test's gate first (gate.h), so that the recording has its tables by the time
 * the thread parks (its one wait). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gate.h"

volatile unsigned long sink;

__attribute__((noinline)) void park_inner(void)
{
	struct timespec t = { .tv_sec = 3600 };
	nanosleep(&t, NULL);
	sink++;
}

__attribute__((noinline)) void *park_forever(void *arg)
{
	(void)arg;
	park_inner();
	sink++;
	return NULL;
}

int main(int argc, char **argv)
{
	long ms = argc > 1 ? atol(argv[1]) : 500;
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
	pthread_t th;

	gate();
	pthread_create(&th, NULL, park_forever, NULL);
	nanosleep(&t, NULL);
	exit(0);
}
