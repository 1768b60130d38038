/* Maps argv[1] readable and executable, as a loader would, and calls the code at file offset
 * argv[2] (which never returns): code whose unwind information gpuflame must read. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((noinline)) static void call(void (*code)(void))
{
	code();
}

int main(int argc, char **argv)
{
	struct stat st;
	int fd = open(argv[1], O_RDONLY);
	void *base;

	if (fd < 0 || fstat(fd, &st))
		return 1;
	base = mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
	if (base == MAP_FAILED)
		return 1;
	call((void (*)(void))((char *)base + strtoul(argv[2], NULL, 0)));
	return 0;
}
