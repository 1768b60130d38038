/* Reads /dev/zero one byte at a time for argv[1] seconds: most time is in the kernel. */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) void do_reads(int fd, time_t end)
{
	char byte;
	while (time(NULL) < end)
		for (int i = 0; i < 10000; i++)
			if (read(fd, &byte, 1) != 1)
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
