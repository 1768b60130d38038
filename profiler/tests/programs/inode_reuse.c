/* A library whose file is deleted after dlclose, and a different library written as a new file
 * at the same path, which the file system gives the freed inode: usage
 *   inode_reuse DIR LIB_A LIB_B SECONDS
 * copies LIB_A to DIR/plugin.so, runs its lib_work for SECONDS, dlcloses and deletes it, copies
 * LIB_B to DIR/plugin.so, runs its lib_work for SECONDS. Prints "inodes A B", then "at X Y": where
 * each lib_work was (the loader usually maps the second library where the first was). */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int copy(const char *from, const char *to)
{
	char buf[65536];
	ssize_t n;
	int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0755);

	if (in < 0 || out < 0)
		return -1;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, n) != n)
			return -1;
	close(in);
	return close(out);
}

__attribute__((noinline)) static unsigned long run(const char *path, double seconds, void **at)
{
	struct stat st;
	void *lib = dlopen(path, RTLD_NOW);
	void (*work)(double);

	if (!lib || stat(path, &st)) {
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		exit(1);
	}
	work = (void (*)(double))dlsym(lib, "lib_work");
	*at = (void *)work;
	work(seconds);
	dlclose(lib);
	return st.st_ino;
}

int main(int argc, char **argv)
{
	char path[4096];
	unsigned long a, b;
	void *at_a, *at_b;
	double seconds = atof(argv[4]);

	snprintf(path, sizeof(path), "%s/plugin.so", argv[1]);
	if (copy(argv[2], path))
		return 1;
	a = run(path, seconds, &at_a);
	unlink(path);
	if (copy(argv[3], path))
		return 1;
	b = run(path, seconds, &at_b);
	printf("inodes %lu %lu\nat %p %p\n", a, b, at_a, at_b);
	return 0;
}
