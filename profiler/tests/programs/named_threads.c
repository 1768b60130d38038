/* Three threads named worker-a, worker-b and worker-c spin in work -> spin for argv[1] seconds;
 * the main thread (named after the program) waits in join. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;
static double end;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(void)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}

__attribute__((noinline)) void *work(void *name)
{
	pthread_setname_np(pthread_self(), name);
	spin();
	sink++;
	return NULL;
}

int main(int argc, char **argv)
{
	static char *names[] = {"worker-a", "worker-b", "worker-c"};
	pthread_t t[3];
	end = now() + (argc > 1 ? atof(argv[1]) : 2.0);
	for (int i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, work, names[i]);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	return 0;
}
