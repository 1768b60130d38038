/* Spins in main -> ns_a -> ns_b for argv[1] seconds. The container tests build it inside a mount
 * namespace, and with -Dns_a=host_a -Dns_b=host_b at the same path outside it: same layout,
 * other names. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void ns_b(double end)
{
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void ns_a(double end) { ns_b(end); sink++; }

int main(int argc, char **argv)
{
	ns_a(now() + (argc > 1 ? atof(argv[1]) : 2.0));
	return 0;
}
