/* Starts argv[1] over and over for argv[2] seconds, one at a time, and prints how many it ran. */
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
	double end = now() + (argc > 2 ? atof(argv[2]) : 2.0);
	char *args[] = { argv[1], NULL };
	long n = 0;

	while (now() < end) {
		pid_t pid;
		if (posix_spawn(&pid, argv[1], NULL, NULL, args, environ) == 0 && waitpid(pid, NULL, 0) == pid)
			n++;
	}
	printf("%ld\n", n);
	return 0;
}
