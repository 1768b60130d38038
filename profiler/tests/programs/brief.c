/* Lives about 300 microseconds, most of it in brief_work: one process of a storm (spawn_storm.c)
 * that is gone long before anything could read its maps. */
#include <time.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void brief_work(double end)
{
	while (now() < end)
		for (int i = 0; i < 1000; i++)
			sink += i;
}

int main(void)
{
	brief_work(now() + 0.0003);
	return 0;
}
