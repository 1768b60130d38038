/* A stand-in for NCCL 2.30's libnccl.so.2, for tests without a GPU: the names and C signatures of
 * nccl.h, each pnccl* function defined and its nccl* name a weak alias of it (nm -D: pnccl* T,
 * nccl* W at the same address, as in the real library), and the behaviour that matters to a
 * profiler. No data moves: buffers may be device pointers that this process cannot read.
 *
 * The ranks of a communicator are processes on this machine. ncclCommInitRank creates (O_EXCL) or
 * opens the POSIX shared-memory segment /fake_nccl_<hex of the unique id's first 8 bytes>; its
 * creator sizes it and sets `initialised`, which the others wait for. Initialisation is collective,
 * as NCCL's is: once every rank has the segment mapped, each unlinks its name (no leftovers in
 * /dev/shm, even if a rank dies later).
 *
 * Collectives: each call blocks its caller at a generation-counting barrier (atomics and a futex in
 * the segment) until every rank of the communicator has made its Nth collective call, whichever
 * collective it is, as a real NCCL kernel spins on the device until its peers arrive. Then, still
 * inside the call, so that the launching stack is the caller's, it launches one kernel through the
 * driver (cuModuleGetFunction, cuLaunchKernel), named like the real ones
 * (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_AllGather_RING_LL; AlltoAll, Gather and
 * Scatter, which the real library runs as ncclDevKernel_SendRecv, get ncclDevKernel_AlltoAll etc.
 * here, to be told apart), and first tells the stand-in CUPTI (fake_cupti.c), when it is loaded,
 * that this kernel lasts as long as the rank waited, at least 1 us: a fast rank's kernel is long,
 * the slowest rank's short, as on a GPU.
 * ncclSend/ncclRecv rendezvous with their peer only: the kth Send from A to B completes with B's
 * kth Recv from A. They launch ncclDevKernel_SendRecv.
 * Groups: between ncclGroupStart and ncclGroupEnd (nested; the outermost End counts) calls are
 * checked, then queued per thread. ncclGroupEnd posts the queued sends and receives, goes through
 * one barrier per queued collective (so collectives match by number whether or not a rank groups
 * them), waits for the sends and receives, and launches one kernel, named after the first queued
 * call, lasting the whole wait.
 * Invalid arguments (NULL comm, datatype >= ncclNumTypes, op >= ncclNumOps, root or peer out of
 * range) return ncclInvalidArgument without blocking.
 *
 * FAKE_NCCL_LOG=1 prints each call's wait on stderr. FAKE_NCCL_TIMEOUT_S (default 300) bounds
 * every wait; past it the call fails with ncclRemoteError, as when a peer died, and the
 * communicator is unusable. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* nccl.h 2.30's types. */
typedef void *cudaStream_t; /* struct CUstream_st *, from cuda_runtime.h */
typedef struct ncclComm *ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	       ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
	       ncclTimeout = 8, ncclNumResults = 9 } ncclResult_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5,
	       ncclMaxRedOp = 0x7fffffff } ncclRedOp_t;
typedef enum { ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3,
	       ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7,
	       ncclFloat64 = 8, ncclDouble = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11,
	       ncclNumTypes = 12 } ncclDataType_t;
#define NCCL_VERSION_CODE 23007

/* The stand-in driver (fake_cuda.c). */
typedef int CUresult;
typedef struct CUfunc_st *CUfunction;
CUresult cuInit(unsigned int);
CUresult cuModuleGetFunction(CUfunction *, void *, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			cudaStream_t, void **, void **);

/* nccl* as a weak alias of pnccl*, as the real library exports them. */
#define ALIAS(name) __typeof__(p##name) name __attribute__((weak, alias("p" #name)))

#include "fake_nccl_rendezvous.h"

static const char *coll_names[] = { "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
				    "AlltoAll", "Gather", "Scatter", "Send", "Recv" };
static const char *op_names[] = { "Sum", "Prod", "Max", "Min", "Avg" };
static const char *type_names[] = { "i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2" };
static const size_t type_sizes[] = { 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1 };

#define MAX_QUEUED 256
static __thread struct call queued[MAX_QUEUED];
static __thread int queued_count, group_depth;

static void kernel_name(char *out, size_t size, const struct call *c)
{
	const char *coll = coll_names[c->coll];
	switch (c->coll) {
	case AllReduce: case ReduceScatter: case Reduce:
		snprintf(out, size, "ncclDevKernel_%s_%s_%s_RING_LL", coll, op_names[c->op], type_names[c->type]);
		break;
	case AllGather: case Broadcast:
		snprintf(out, size, "ncclDevKernel_%s_RING_LL", coll);
		break;
	case Send: case Recv:
		snprintf(out, size, "ncclDevKernel_SendRecv");
		break;
	default:
		snprintf(out, size, "ncclDevKernel_%s", coll);
	}
}

/* Launches the kernel of `c`, which the stand-in CUPTI, if loaded, records as lasting `ns`. The
 * kernel is looked up once per name and libcupti once per process, as the real library resolves
 * its kernels at initialisation: a collective costs what the real one does, a launch. */
static ncclResult_t launch(const struct call *c, uint64_t ns)
{
	static void (*next_kernel_ns)(uint64_t);
	static int looked_for_cupti;
	static struct { char name[96]; CUfunction f; } kernels[32];
	static int kernel_count;
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	char name[96];
	CUfunction f = NULL;
	int i;

	kernel_name(name, sizeof(name), c);
	pthread_mutex_lock(&lock);
	if (!looked_for_cupti) {
		void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
		looked_for_cupti = 1;
		if (h && !(next_kernel_ns = (void (*)(uint64_t))dlsym(h, "fake_cupti_next_kernel_ns")))
			dlclose(h);
	}
	for (i = 0; i < kernel_count && strcmp(kernels[i].name, name); i++)
		;
	if (i < kernel_count) {
		f = kernels[i].f;
	} else if (cuModuleGetFunction(&f, NULL, name) == 0 && kernel_count < 32) {
		snprintf(kernels[kernel_count].name, sizeof(kernels[0].name), "%s", name);
		kernels[kernel_count++].f = f;
	}
	pthread_mutex_unlock(&lock);
	if (!f)
		return ncclUnhandledCudaError;
	if (next_kernel_ns)
		next_kernel_ns(ns < 1000 ? 1000 : ns);
	return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, c->stream, NULL, NULL) ? ncclUnhandledCudaError : ncclSuccess;
}

/* Runs `n` calls (one, or a group's): sends and receives posted first, so that a group's exchanges
 * cannot deadlock, then the collectives' barriers, then the sends' and receives' completions. */
static ncclResult_t run(struct call *calls, int n)
{
	uint64_t start = now_ns(), until = deadline(), waited;
	ncclResult_t rc = ncclSuccess;
	int i;

	for (i = 0; i < n; i++)
		if (calls[i].coll >= Send)
			p2p_post(&calls[i]);
	for (i = 0; i < n && rc == ncclSuccess; i++)
		if (calls[i].coll < Send)
			rc = barrier(calls[i].comm, until);
	for (i = 0; i < n && rc == ncclSuccess; i++)
		if (calls[i].coll >= Send)
			rc = p2p_wait(&calls[i], until);
	waited = now_ns() - start;
	calls[0].comm->calls++;
	if (getenv("FAKE_NCCL_LOG") && atoi(getenv("FAKE_NCCL_LOG")))
		fprintf(stderr, "fake_nccl: rank=%d pid=%d call=%llu coll=%s calls=%d bytes=%zu waited_ns=%llu rc=%d\n",
			calls[0].comm->rank, (int)getpid(), calls[0].comm->calls, coll_names[calls[0].coll], n,
			calls[0].count * type_sizes[calls[0].type], (unsigned long long)waited, (int)rc);
	return rc == ncclSuccess ? launch(&calls[0], waited) : rc;
}

/* Checks a call, then runs it, or queues it inside a group. */
static ncclResult_t submit(struct call c)
{
	if (!c.comm || (unsigned)c.type >= ncclNumTypes || (unsigned)c.op >= ncclNumOps || c.peer < 0 ||
	    c.peer >= c.comm->nranks)
		return ncclInvalidArgument;
	if (group_depth) {
		if (queued_count == MAX_QUEUED)
			return ncclInvalidUsage;
		queued[queued_count++] = c;
		return ncclSuccess;
	}
	return run(&c, 1);
}

ncclResult_t pncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
	if (!uniqueId)
		return ncclInvalidArgument;
	return getrandom(uniqueId->internal, sizeof(uniqueId->internal), 0) == sizeof(uniqueId->internal)
		       ? ncclSuccess : ncclSystemError;
}

ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	char name[32];
	struct shared *s;
	struct stat st;
	uint64_t until = deadline();
	ncclResult_t rc;
	int fd, created = 1, i;

	if (!comm || nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	cuInit(0); /* as the real one: CUDA first */
	strcpy(name, "/fake_nccl_");
	for (i = 0; i < 8; i++)
		sprintf(name + strlen(name), "%02x", (unsigned char)commId.internal[i]);
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 && errno == EEXIST) {
		created = 0;
		fd = shm_open(name, O_RDWR, 0);
	}
	if (fd < 0)
		return ncclSystemError;
	if (created && ftruncate(fd, sizeof(*s)) != 0) {
		close(fd);
		shm_unlink(name);
		return ncclSystemError;
	}
	/* An opener can get there before the creator has sized the segment. */
	while (!created && (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(*s))) {
		if (now_ns() > until) {
			close(fd);
			return ncclRemoteError;
		}
		usleep(1000);
	}
	s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (s == MAP_FAILED)
		return ncclSystemError;
	if (created) {
		s->nranks = nranks;
		atomic_store(&s->initialised, 1);
	}
	while (!atomic_load(&s->initialised) && now_ns() < until)
		usleep(1000);
	if (!atomic_load(&s->initialised) || s->nranks != nranks) {
		rc = atomic_load(&s->initialised) ? ncclInvalidUsage : ncclRemoteError;
		munmap(s, sizeof(*s));
		return rc;
	}
	if (!(*comm = calloc(1, sizeof(**comm)))) {
		munmap(s, sizeof(*s));
		return ncclSystemError;
	}
	(*comm)->s = s;
	(*comm)->rank = rank;
	(*comm)->nranks = nranks;
	rc = barrier(*comm, until);
	shm_unlink(name); /* every rank has it mapped (or the job is lost): the first here removes the name */
	if (rc != ncclSuccess) {
		munmap(s, sizeof(*s));
		free(*comm);
		*comm = NULL;
	}
	return rc;
}

ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess; /* as the real one */
	munmap(comm->s, sizeof(*comm->s));
	free(comm);
	return ncclSuccess;
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm || !count)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

const char *pncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	case ncclTimeout: return "timeout";
	default: return "unknown result code";
	}
}

/* The collectives; no data moves, so the buffers go unused. */
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ AllReduce, datatype, op, 0, count, comm, stream, 0 });
}

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
			    ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ AllGather, datatype, ncclSum, 0, sendcount, comm, stream, 0 });
}

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
				ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ ReduceScatter, datatype, op, 0, recvcount, comm, stream, 0 });
}

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			    ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ Broadcast, datatype, ncclSum, root, count, comm, stream, 0 });
}

ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
	return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
			 int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ Reduce, datatype, op, root, count, comm, stream, 0 });
}

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ AlltoAll, datatype, ncclSum, 0, count, comm, stream, 0 });
}

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			 ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ Gather, datatype, ncclSum, root, count, comm, stream, 0 });
}

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			  ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff;
	return submit((struct call){ Scatter, datatype, ncclSum, root, count, comm, stream, 0 });
}

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		       cudaStream_t stream)
{
	(void)sendbuff;
	return submit((struct call){ Send, datatype, ncclSum, peer, count, comm, stream, 0 });
}

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		       cudaStream_t stream)
{
	(void)recvbuff;
	return submit((struct call){ Recv, datatype, ncclSum, peer, count, comm, stream, 0 });
}

ncclResult_t pncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

ncclResult_t pncclGroupEnd(void)
{
	int n = queued_count;

	if (!group_depth)
		return ncclInvalidUsage;
	if (--group_depth)
		return ncclSuccess;
	queued_count = 0;
	return n ? run(queued, n) : ncclSuccess;
}

ALIAS(ncclGetVersion);
ALIAS(ncclGetUniqueId);
ALIAS(ncclCommInitRank);
ALIAS(ncclCommDestroy);
ALIAS(ncclCommCount);
ALIAS(ncclCommUserRank);
ALIAS(ncclGetErrorString);
ALIAS(ncclAllReduce);
ALIAS(ncclAllGather);
ALIAS(ncclReduceScatter);
ALIAS(ncclBroadcast);
ALIAS(ncclBcast);
ALIAS(ncclReduce);
ALIAS(ncclAlltoAll);
ALIAS(ncclGather);
ALIAS(ncclScatter);
ALIAS(ncclSend);
ALIAS(ncclRecv);
ALIAS(ncclGroupStart);
ALIAS(ncclGroupEnd);
