/* A process blocked in read() on a pipe nobody writes to: main -> wait_for_input -> read_all ->
 * read. Built without frame pointers: its stack comes from CFI alone. Says "ready" on stdout
 * right before it blocks. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) static long read_all(int fd, char *buf, size_t n)
{
	long got = read(fd, buf, n);
	__asm__ volatile("" ::: "memory");
	return got;
}

__attribute__((noinline)) static long wait_for_input(int fd)
{
	char buf[64];
	long got = read_all(fd, buf, sizeof(buf));
	__asm__ volatile("" ::: "memory");
	return got;
}

int main(void)
{
	int fds[2];

	if (pipe(fds))
		return 1;
	printf("ready\n");
	fflush(stdout);
	return (int)wait_for_input(fds[0]);
}
