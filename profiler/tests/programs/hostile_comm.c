/* Names itself with control characters, the folded separator, XML's specials and a byte that is
 * not UTF-8, then spins in main -> a -> b -> c for argv[1] seconds. */
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void c(double end)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void b(double end) { c(end); sink++; }
__attribute__((noinline)) void a(double end) { b(end); sink++; }

int main(int argc, char **argv)
{
	/* 15 bytes, the most a comm holds. */
	prctl(PR_SET_NAME, "h\x1b;\t\x7f\xff<&\x01z", 0, 0, 0);
	a(now() + (argc > 1 ? atof(argv[1]) : 2.0));
	return 0;
}
