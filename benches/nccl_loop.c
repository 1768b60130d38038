/* A loop of ncclAllReduce calls on a one-rank communicator of the stand-in libnccl.so.2
 * (profiler/tests/programs/cuda/fake_nccl.c): what one hooked collective costs. Prints
 * ns_per_call= and seconds=. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclCommDestroy(ncclComm_t comm);
int ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op, ncclComm_t comm, void *stream);
int cuInit(unsigned int flags);

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	static float buf[1024];
	ncclUniqueId id;
	ncclComm_t comm;

	if (cuInit(0) || ncclGetUniqueId(&id) || ncclCommInitRank(&comm, 1, id, 0)) {
		fprintf(stderr, "cannot make a communicator\n");
		return 1;
	}
	double t0 = now();
	for (long i = 0; i < n; i++)
		if (ncclAllReduce(buf, buf, 1024, 7 /* float32 */, 0 /* sum */, comm, NULL)) {
			fprintf(stderr, "ncclAllReduce failed\n");
			return 1;
		}
	double s = now() - t0;
	printf("seconds=%.6f\nns_per_call=%.1f\n", s, s * 1e9 / n);
	ncclCommDestroy(comm);
	return 0;
}
