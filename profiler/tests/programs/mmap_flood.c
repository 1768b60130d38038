/* Maps and unmaps argv[1] as code, as fast as it can, for argv[2] seconds; prints how many times.
 * Each mapping is one page longer than the last, so that the process's executable memory grows
 * past every earlier high: news to a profiler, every time. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int fd = open(argc > 1 ? argv[1] : "/proc/self/exe", O_RDONLY);
	double end = now() + (argc > 2 ? atof(argv[2]) : 5.0);
	unsigned long n = 0;

	if (fd < 0) {
		perror("open");
		return 1;
	}
	while (now() < end) {
		for (int i = 0; i < 1000; i++) {
			/* Pages past the end of the file are never touched: only the mapping counts. */
			size_t len = (n + i + 1) * 4096UL;
			void *p = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
			if (p == MAP_FAILED) {
				perror("mmap");
				return 1;
			}
			munmap(p, len);
		}
		n += 1000;
	}
	printf("%lu mappings\n", n);
	return 0;
}
