/* Threads that wait, each its own way, for argv[1] seconds (default 2): one in nanosleep
 * (block_sleep), one on a condition variable, a futex (block_wait), one reading a pipe
 * (block_read); main joins them, then spins a little (block_spin) so that the wall profile has CPU
 * samples too. Something for the off-CPU and wall profiles to see. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double duration = 2.0;
static int pipefd[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
volatile unsigned long sink;

__attribute__((noinline)) static void *block_sleep(void *arg)
{
	struct timespec t = { (time_t)duration, (long)((duration - (time_t)duration) * 1e9) };
	nanosleep(&t, NULL);
	return arg;
}

__attribute__((noinline)) static void *block_wait(void *arg)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += (time_t)duration;
	pthread_mutex_lock(&lock);
	pthread_cond_timedwait(&never, &lock, &until);
	pthread_mutex_unlock(&lock);
	return arg;
}

__attribute__((noinline)) static void *block_read(void *arg)
{
	char c;
	if (read(pipefd[0], &c, 1) < 0)
		sink++;
	return arg;
}

__attribute__((noinline)) static void block_spin(double seconds)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	double end = t.tv_sec + t.tv_nsec / 1e9 + seconds, now;
	do {
		for (int i = 0; i < 100000; i++)
			sink += i;
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
		now = t.tv_sec + t.tv_nsec / 1e9;
	} while (now < end);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		duration = atof(argv[1]);
	if (pipe(pipefd) != 0)
		return 1;
	pthread_t threads[3];
	pthread_create(&threads[0], NULL, block_sleep, NULL);
	pthread_create(&threads[1], NULL, block_wait, NULL);
	pthread_create(&threads[2], NULL, block_read, NULL);
	pthread_join(threads[0], NULL);
	pthread_join(threads[1], NULL);
	if (write(pipefd[1], "x", 1) != 1)
		return 1;
	pthread_join(threads[2], NULL);
	block_spin(0.3);
	return 0;
}
