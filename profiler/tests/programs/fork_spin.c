/* Forks argv[1] children one after another, each spinning in child_work for argv[2] ms of CPU
 * time and exiting without exec, while the parent spins in parent_work between them. A child
 * that lives a few milliseconds runs its parent's code, gone before its own maps could be read:
 * its samples are whole only if it is unwound and named with its parent's mappings. */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gate.h"

static volatile unsigned long sink;

/* CPU time, not wall time: the work, and so its samples, is the same on a loaded machine. */
static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(double seconds)
{
	double end = cpu_now() + seconds;
	while (cpu_now() < end)
		for (int i = 0; i < 20000; i++)
			sink += i;
}

__attribute__((noinline)) void child_work(double seconds) { spin(seconds); sink++; }
__attribute__((noinline)) void parent_work(double seconds) { spin(seconds); sink++; }

int main(int argc, char **argv)
{
	int children = argc > 1 ? atoi(argv[1]) : 100;
	double seconds = (argc > 2 ? atof(argv[2]) : 5) / 1000;

	gate();
	for (int i = 0; i < children; i++) {
		pid_t pid = fork();
		if (pid < 0)
			return 1;
		if (pid == 0) {
			child_work(seconds);
			_exit(0);
		}
		parent_work(seconds);
		waitpid(pid, NULL, 0);
	}
	return 0;
}
