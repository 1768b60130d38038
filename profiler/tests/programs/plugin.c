/* Two libraries that take turns at one path (inode_reuse.c), built with -DPREFIX(x)=a_##x and
 * -DPREFIX(x)=b_##x -DPAD: other names, other addresses; or with -DFRAME=N of two sizes: the same
 * addresses, other unwind rules. */
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

/* The thread's CPU time, not the clock's: the work is the same however loaded the machine is,
 * and so is the number of its samples (a test that ran beside builds got a third of them). */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
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
#ifdef FRAME
	/* A frame of FRAME bytes: two builds that differ in it alone (and in their names' prefix, of
	 * one length) have their code at the same addresses and other rules for it. */
	volatile char frame[FRAME];

	frame[0] = 1;
	PREFIX(inner)(end);
	sink += frame[0];
#else
	PREFIX(inner)(end);
	sink++;
#endif
}

void lib_work(double seconds)
{
	PREFIX(outer)(now() + seconds);
	sink++;
}
