/* Reads /dev/zero 64 KiB at a time for argv[1] seconds: most time is in the kernel, clearing the
 * buffer. (One byte at a time, the entry and exit of each call took most of it, and on some
 * machines most samples landed in user mode: 28-30% had the syscall's kernel frames, against the
 * test's 30%.) */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char buffer[64 << 10];

__attribute__((noinline)) void do_reads(int fd, time_t end)
{
	while (time(NULL) < end)
		for (int i = 0; i < 1000; i++)
			if (read(fd, buffer, sizeof buffer) != sizeof buffer)
				exit(1);
}

int main(int argc, char **argv)
{
	int fd = open("/dev/zero", O_RDONLY);
	if (fd < 0)
		return 1;
	do_reads(fd, time(NULL) + (argc > 1 ? atoi(argv[1]) : 2));
	return 0;
}
