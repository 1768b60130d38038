/* Holds a test program at the start of its work while the recording loads its unwind tables:
 * with GPUFLAME_TEST_GATE=PATH set, the program creates PATH.PID (it has mapped all its code
 * by now) and waits for PATH to exist (tests/common/mod.rs, Gate). Unset, it does nothing. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void gate(void)
{
	const char *path = getenv("GPUFLAME_TEST_GATE");
	if (!path)
		return;
	char here[4096];
	snprintf(here, sizeof here, "%s.%d", path, (int)getpid());
	int fd = open(here, O_CREAT | O_WRONLY, 0644);
	if (fd >= 0)
		close(fd);
	struct timespec pause = { 0, 5 * 1000 * 1000 };
	while (access(path, F_OK) != 0)
		nanosleep(&pause, NULL);
}
