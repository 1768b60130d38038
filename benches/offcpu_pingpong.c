/* Two threads pass a byte back and forth over two pipes for argv[1] round trips (default 200000):
 * every pass is a switch-out and a switch-in. Prints the round trips per second. With argv[2], waits
 * a second first (for a profiler to attach). argv[3]: iterations of busy work before each pass
 * (default 0), to bring the switch rate down to that of a real service. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static long rounds, work;
static volatile unsigned long sink;

static void *echo(void *arg)
{
	char c;
	(void)arg;
	for (long i = 0; i < rounds; i++) {
		if (read(ping[0], &c, 1) != 1 || write(pong[1], &c, 1) != 1)
			break;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct timespec a, b;
	pthread_t th;
	char c = 'x';

	rounds = argc > 1 ? atol(argv[1]) : 200000;
	work = argc > 3 ? atol(argv[3]) : 0;
	if (argc > 2 && atoi(argv[2]))
		sleep(1);
	if (pipe(ping) || pipe(pong))
		return 1;
	pthread_create(&th, NULL, echo, NULL);
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < rounds; i++) {
		for (long w = 0; w < work; w++)
			sink += w;
		if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1)
			return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	pthread_join(th, NULL);
	double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
	printf("round_trips_per_s=%.0f switches_per_s=%.0f seconds=%.3f\n", rounds / s, 2 * rounds / s, s);
	return 0;
}
