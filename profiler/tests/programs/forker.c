/* Forks a grandchild; both spin in their own function for about a second; exits with code 7. */
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

/* CPU time, not wall time: the work, and so its samples, is the same on a loaded machine,
 * where it takes longer. */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin(double seconds)
{
	double end = now() + seconds;
	while (now() < end)
		for (int i = 0; i < 200000; i++)
			sink += i;
}
__attribute__((noinline)) void grandchild_work(void) { spin(1.0); sink++; }
__attribute__((noinline)) void parent_work(void) { spin(1.0); sink++; }

int main(void)
{
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		grandchild_work();
		_exit(0);
	}
	parent_work();
	waitpid(pid, NULL, 0);
	return 7;
}
