/* A thread blocked for a long time in one wait: main -> block_for -> poll(NULL, 0, ms). Says when
 * the wait began and ended (BLOCK_START=, BLOCK_END=, wall-clock ns) on stderr. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) static void block_for(int ms)
{
	fprintf(stderr, "BLOCK_START=%lld\n", now_ns());
	poll(NULL, 0, ms);
	fprintf(stderr, "BLOCK_END=%lld\n", now_ns());
}

int main(int argc, char **argv)
{
	block_for(argc > 1 ? atoi(argv[1]) : 60000);
	return 0;
}
