/* Waits argv[3] seconds (default 0), dlopen()s argv[1], waits at the test's gate (gate.h) and
 * spins in its lib_entry for argv[2] seconds of CPU time. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gate.h"

static volatile unsigned long sink;

__attribute__((noinline)) int call_library(const char *path, double seconds)
{
	void *lib = dlopen(path, RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*entry)(double) = (void (*)(double))dlsym(lib, "lib_entry");
	if (!entry)
		return 1;
	gate();
	entry(seconds);
	sink++;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	if (argc > 3)
		usleep((useconds_t)(atof(argv[3]) * 1e6));
	int rc = call_library(argv[1], atof(argv[2]));
	sink++; /* not a tail call: main stays on the stack */
	return rc;
}
