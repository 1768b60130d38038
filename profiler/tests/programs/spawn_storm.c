/* Starts argv[1] over and over, one at a time, argv[2] times, and prints how many it ran and in
 * how many seconds: a count, not a duration, so that a slow machine makes the same storm, slower. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	long count = argc > 2 ? atol(argv[2]) : 1000;
	char *args[] = { argv[1], NULL };
	double start = now();
	long n = 0;

	for (long i = 0; i < count; i++) {
		pid_t pid;
		if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) == 0 && waitpid(pid, NULL, 0) == pid)
			n++;
	}
	printf("%ld %.3f\n", n, now() - start);
	return 0;
}
