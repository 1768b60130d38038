/* Two libraries that take turns at one path (inode_reuse.c), built with -DPREFIX(x)=a_##x and
 * -DPREFIX(x)=b_##x -DPAD: other names, other addresses. */
#include <time.h>

#ifdef PAD
/* Moves everything after it: a table of the other library would be wrong here. */
__attribute__((noinline)) int pad(int x)
{
	volatile int v[1024];
	for (int i = 0; i < 1024; i++)
		v[i] = x * i + (x ^ i) * 7 + (i << 3) - x / (i + 1);
	return v[x & 1023];
}
#endif

static volatile unsigned long sink;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void PREFIX(inner)(double end)
{
	while (now() < end)
		for (int i = 0; i < 100000; i++)
			sink += i;
}

__attribute__((noinline)) void PREFIX(outer)(double end)
{
	PREFIX(inner)(end);
	sink++;
}

void lib_work(double seconds)
{
	PREFIX(outer)(now() + seconds);
	sink++;
}
