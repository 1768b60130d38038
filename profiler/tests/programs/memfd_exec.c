/* Runs a program from a memfd (as some launchers and packers do): argv[1] is copied into an
 * anonymous file and executed from there with argv[2]; /proc/PID/maps names "/memfd:chainmem". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv)
{
	if (argc != 3)
		return 3;
	int src = open(argv[1], O_RDONLY);
	if (src < 0)
		return 4;
	int fd = memfd_create("chainmem", 0);
	char buf[65536];
	ssize_t n;
	while ((n = read(src, buf, sizeof buf)) > 0)
		if (write(fd, buf, n) != n) return 1;
	char *args[] = {"chainmem", argv[2], NULL};
	char *env[] = {NULL};
	fexecve(fd, args, env);
	return 2;
}
