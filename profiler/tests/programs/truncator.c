/* A hostile process: maps copies of a big ELF file executable and truncates each one once some
 * other process opens it (inotify IN_OPEN), after a delay that varies per round, so that a
 * profiler reading the file through an mmap touches pages past the new end (SIGBUS).
 * Usage: truncator SRC DIR ROUNDS. Waits for DIR/go, then prints one line per round. */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const int delays_us[] = {0, 2000, 10000, 50000, 200000, 500, 5000, 100000};

/* A new build-id per round: a profiler that caches tables by build-id reads every copy anew. */
static void change_build_id(unsigned char *data, size_t size, int round)
{
	static const unsigned char head[] = {4, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, 'G', 'N', 'U', 0};
	for (size_t i = 0; i + sizeof(head) + 20 <= size && i < (1 << 20); i += 4)
		if (memcmp(data + i, head, sizeof(head)) == 0) {
			memcpy(data + i + sizeof(head), &round, sizeof(round));
			data[i + sizeof(head) + 4] ^= 0x5a;
			return;
		}
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	int src = open(argv[1], O_RDONLY);
	struct stat st;
	if (src < 0 || fstat(src, &st) != 0)
		return 3;
	unsigned char *data = malloc(st.st_size);
	if (!data || pread(src, data, st.st_size, 0) != st.st_size)
		return 4;
	char path[4096];
	snprintf(path, sizeof(path), "%s/go", argv[2]);
	while (access(path, F_OK) != 0)
		usleep(10000);
	int in = inotify_init1(IN_CLOEXEC);
	int rounds = atoi(argv[3]);
	for (int r = 0; r < rounds; r++) {
		change_build_id(data, st.st_size, r);
		snprintf(path, sizeof(path), "%s/lib%d.so", argv[2], r);
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, data, st.st_size) != st.st_size)
			return 5;
		int wd = inotify_add_watch(in, path, IN_OPEN);
		if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
			return 6;
		struct pollfd p = {.fd = in, .events = POLLIN};
		int opened = poll(&p, 1, 5000) == 1;
		if (opened) {
			char buf[4096];
			if (read(in, buf, sizeof(buf)) < 0)
				return 7;
		}
		usleep(delays_us[r % (sizeof(delays_us) / sizeof(delays_us[0]))]);
		if (ftruncate(fd, 0) != 0)
			return 8;
		inotify_rm_watch(in, wd);
		printf("round %d: %s\n", r, opened ? "opened by another process, then truncated" : "truncated, nobody opened it");
		fflush(stdout);
	}
	return 0;
}
