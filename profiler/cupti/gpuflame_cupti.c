/* gpuflame's CUPTI injection library, loaded by the CUDA driver through CUDA_INJECTION64_PATH.
 *
 * It subscribes to kernel activity records and to launch callbacks, and hands both to gpuflame
 * through functions that gpuflame's uprobes watch: gpuflame_cupti_launch() at a sample of launches,
 * with the launch's correlation id (gpuflame captures the stack there), and
 * gpuflame_cupti_kernels() once per batch of kernel records (start, end, device, stream,
 * correlation id, kernel name id, graph id and node). Without gpuflame attached these are plain
 * function calls. Records beyond a rate bound (GPUFLAME_CUPTI_MAX_RATE per second, default
 * 500000) are dropped and counted.
 *
 * Launches are sampled here rather than by attaching gpuflame's hook in windows: a window of 10 ms
 * a second missed every launch of a program whose GPU work took under a second, and all its GPU
 * time went unattributed (on an H200, 2,611 kernels of a 5 s run). Each kernel's first
 * FIRST_LAUNCHES launches are passed on, so that every kernel has a stack its time can go to,
 * then at most GPUFLAME_CUPTI_LAUNCH_RATE a second (default 100; 0 passes every launch, as
 * `gpuflame record --cuda-exact` asks). Each passed launch costs a uprobe trap and an unwind, a few
 * microseconds; the others cost a clock read.
 *
 * With GPUFLAME_CUPTI_WAIT_MS set (gpuflame record sets it), initialisation waits up to that long
 * for gpuflame to say that it has the unwind tables of the files just loaded (this library, CUPTI):
 * a program launches its first kernels within milliseconds of cuInit, before gpuflame could read
 * its new mappings, and those launches would have no stack. gpuflame says so by writing 1 to the
 * word whose address gpuflame_cupti_status(STATUS_WAITING, &word) gave it. Past the limit, or
 * without gpuflame, the program goes on; otherwise it is never stopped or slowed beyond CUPTI's
 * own cost.
 *
 * CUPTI is opened at run time (GPUFLAME_CUPTI_PATH, else libcupti.so.13, .so.12, .so), so the
 * library builds without the CUDA toolkit. The few CUPTI types used are declared here with the
 * layout of cupti_activity.h and cupti_callbacks.h (cupti_layout.h, which a test compiles against
 * the real headers of CUPTI 12 and 13); kernel records are read by field offsets that every
 * CUpti_ActivityKernel version since 4 shares. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

typedef int CUptiResult;
typedef void *CUpti_SubscriberHandle;
typedef void (*CUpti_CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*BufferRequested)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*BufferCompleted)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);

#define CUPTI_SUCCESS 0
#define CUPTI_CB_DOMAIN_DRIVER_API 1
#define CUPTI_API_ENTER 0
#define CUPTI_ACTIVITY_KIND_KERNEL 3
#define CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL 10

#include "cupti_layout.h"

/* What gpuflame reads: a batch of these per call of gpuflame_cupti_kernels(). */
struct gpuflame_kernel {
	uint64_t start;
	uint64_t end;
	uint32_t correlation;
	uint32_t device;
	uint32_t stream;
	uint32_t name_id;
	uint32_t graph;
	uint32_t pad;
	uint64_t graph_node;
};

#define BATCH 682 /* 682 * 48 bytes: what one gpuflame record carries */

/* Status codes for gpuflame_cupti_status(). */
#define STATUS_ACTIVE 0
#define STATUS_NO_CUPTI 1
#define STATUS_OTHER_SUBSCRIBER 2
#define STATUS_CUPTI_ERROR 3
#define STATUS_WAITING 4 /* with the address of the word gpuflame sets when it is ready */

static struct {
	CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
	CUptiResult (*enable_domain)(uint32_t, CUpti_SubscriberHandle, int);
	CUptiResult (*activity_enable)(int);
	CUptiResult (*register_callbacks)(BufferRequested, BufferCompleted);
	CUptiResult (*next_record)(uint8_t *, size_t, void **);
	CUptiResult (*flush_all)(uint32_t);
	CUptiResult (*flush_period)(uint32_t);
} cupti;

static CUpti_SubscriberHandle subscriber;
static int status = STATUS_ACTIVE;
static uint64_t max_rate, window_start_ns, window_records, dropped;
static uint64_t launch_rate = 100, launch_next_ns;
#define FIRST_LAUNCHES 4
#define KERNEL_SLOTS 4096
static const char *kernel_key[KERNEL_SLOTS];
static uint32_t kernel_launches[KERNEL_SLOTS];
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *names[4096];
static uint32_t name_count;

/* --- What gpuflame hooks. Kept out of line and with their arguments used, so that each call
 * really happens at the symbol gpuflame finds. --- */

EXPORT NOINLINE void gpuflame_cupti_launch(uint32_t correlation_id, uint32_t cbid)
{
	__asm__ volatile("" : : "r"(correlation_id), "r"(cbid) : "memory");
}

EXPORT NOINLINE void gpuflame_cupti_kernels(const struct gpuflame_kernel *records, uint32_t n, uint64_t dropped_total)
{
	__asm__ volatile("" : : "r"(records), "r"(n), "r"(dropped_total) : "memory");
}

EXPORT NOINLINE void gpuflame_cupti_name(uint32_t id, const char *name)
{
	__asm__ volatile("" : : "r"(id), "r"(name) : "memory");
}

EXPORT NOINLINE void gpuflame_cupti_status(uint32_t code, volatile uint32_t *ready)
{
	__asm__ volatile("" : : "r"(code), "r"(ready) : "memory");
}

/* --- */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* Kernel names are few and live as long as CUPTI: they are numbered by their pointer. */
static uint32_t name_id(const char *name)
{
	uint32_t i, id;

	if (!name)
		return 0;
	pthread_mutex_lock(&names_lock);
	for (i = 0; i < name_count; i++)
		if (names[i] == name)
			break;
	if (i == name_count && name_count < 4096)
		names[name_count++] = name;
	pthread_mutex_unlock(&names_lock);
	id = i + 1;
	return id;
}

/* Whether this is one of the first launches of its kernel (keyed by the name's pointer, which the
 * driver keeps for the kernel's life; a launch without a name is keyed by its callback id). Races
 * between threads only pass a launch more or less. */
static int first_launches(const char *key)
{
	uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ULL;

	for (uint32_t i = 0; i < 16; i++) {
		uint32_t slot = (uint32_t)(h >> 40) + i;
		const char *k, *empty = NULL;

		slot &= KERNEL_SLOTS - 1;
		k = __atomic_load_n(&kernel_key[slot], __ATOMIC_ACQUIRE);
		if (!k && __atomic_compare_exchange_n(&kernel_key[slot], &empty, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			k = key;
		else if (!k)
			k = empty;
		if (k == key)
			return __atomic_fetch_add(&kernel_launches[slot], 1, __ATOMIC_RELAXED) < FIRST_LAUNCHES;
	}
	return 0; /* table full: the rate alone decides */
}

/* Past a kernel's first launches, one launch every 1/launch_rate s: spread over the run rather
 * than spent in the first milliseconds of each second, when a burst launches thousands. */
static int launch_sampled(const char *symbol, uint32_t cbid)
{
	uint64_t t, next;

	if (launch_rate == 0 || first_launches(symbol ? symbol : (const char *)(uintptr_t)(cbid + 1)))
		return 1;
	t = now_ns();
	next = __atomic_load_n(&launch_next_ns, __ATOMIC_RELAXED);
	if (t < next)
		return 0;
	return __atomic_compare_exchange_n(&launch_next_ns, &next, t + 1000000000ULL / launch_rate, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static void CUPTIAPI_callback(void *userdata, int domain, uint32_t cbid, const void *data)
{
	const struct cupti_callback_data *cb = data;

	(void)userdata;
	if (domain != CUPTI_CB_DOMAIN_DRIVER_API || cb->callback_site != CUPTI_API_ENTER || !cb->function_name)
		return;
	/* cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their
	 * _ptsz forms. */
	if (strstr(cb->function_name, "Launch") && launch_sampled(cb->symbol_name, cbid))
		gpuflame_cupti_launch(cb->correlation_id, cbid);
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*size = 4 << 20;
	*buffer = aligned_alloc(8, *size);
	*max_records = 0;
	if (!*buffer)
		*size = 0;
}

static void buffer_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
	static __thread struct gpuflame_kernel batch[BATCH];
	static uint32_t named[4097], buffers;
	uint32_t generation = __atomic_add_fetch(&buffers, 1, __ATOMIC_RELAXED);
	uint32_t n = 0;
	void *record = NULL;

	(void)ctx;
	(void)stream;
	(void)size;
	gpuflame_cupti_status(status, NULL);
	while (cupti.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
		const uint8_t *r = record;
		uint32_t kind;
		uint64_t t = now_ns();

		memcpy(&kind, r + K_KIND, 4);
		if (kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && kind != CUPTI_ACTIVITY_KIND_KERNEL)
			continue;
		if (t - window_start_ns > 1000000000ULL) {
			window_start_ns = t;
			window_records = 0;
		}
		if (++window_records > max_rate) {
			dropped++;
			continue;
		}
		struct gpuflame_kernel *k = &batch[n++];
		const char *name;
		memcpy(&k->start, r + K_START, 8);
		memcpy(&k->end, r + K_END, 8);
		memcpy(&k->device, r + K_DEVICE, 4);
		memcpy(&k->stream, r + K_STREAM, 4);
		memcpy(&k->correlation, r + K_CORRELATION, 4);
		memcpy(&name, r + K_NAME, sizeof(name));
		memcpy(&k->graph_node, r + K_GRAPH_NODE, 8);
		memcpy(&k->graph, r + K_GRAPH, 4);
		k->pad = 0;
		k->name_id = name_id(name);
		/* Named once per buffer that uses it: for a gpuflame that attached later, and not so
		 * often that the hook's cost adds up. */
		if (k->name_id && k->name_id <= 4096 && named[k->name_id] != generation) {
			named[k->name_id] = generation;
			gpuflame_cupti_name(k->name_id, name);
		}
		if (n == BATCH) {
			gpuflame_cupti_kernels(batch, n, dropped);
			n = 0;
		}
	}
	if (n)
		gpuflame_cupti_kernels(batch, n, dropped);
	free(buffer);
}

static void flush_at_exit(void)
{
	if (cupti.flush_all && status == STATUS_ACTIVE)
		cupti.flush_all(1 /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED */);
}

/* Tells gpuflame why there is no GPU time, now and a little later (it may attach after this). */
static void *announce(void *arg)
{
	(void)arg;
	for (int i = 0; i < 5; i++) {
		gpuflame_cupti_status(status, NULL);
		sleep(1);
	}
	return NULL;
}

static void fail(int code, const char *why)
{
	pthread_t t;

	status = code;
	fprintf(stderr, "gpuflame CUPTI: %s; no GPU time from this process\n", why);
	/* Once now: a program that exits at once never runs the thread (gpuflame missed the status
	 * in half the runs of such a test program). */
	gpuflame_cupti_status(status, NULL);
	if (pthread_create(&t, NULL, announce, NULL) == 0)
		pthread_detach(t);
}

static void *open_cupti(void)
{
	const char *env = getenv("GPUFLAME_CUPTI_PATH");
	const char *names_to_try[] = { "libcupti.so.13", "libcupti.so.12", "libcupti.so" };
	void *h;

	if (env && *env)
		return dlopen(env, RTLD_NOW | RTLD_GLOBAL);
	for (size_t i = 0; i < sizeof(names_to_try) / sizeof(names_to_try[0]); i++)
		if ((h = dlopen(names_to_try[i], RTLD_NOW | RTLD_GLOBAL)))
			return h;
	return NULL;
}

/* See the top of the file: gives gpuflame the time to read this process's new libraries. */
static void wait_for_gpuflame(void)
{
	static volatile uint32_t ready;
	const char *env = getenv("GPUFLAME_CUPTI_WAIT_MS");
	long limit_ms = env && *env ? strtol(env, NULL, 10) : 0;
	uint64_t deadline;

	if (limit_ms <= 0)
		return;
	if (limit_ms > 10000)
		limit_ms = 10000;
	deadline = now_ns() + (uint64_t)limit_ms * 1000000ULL;
	gpuflame_cupti_status(STATUS_WAITING, &ready);
	while (!ready && now_ns() < deadline)
		usleep(1000);
	/* A service started by hand with the variable and no gpuflame: say why it started late. */
	if (!ready)
		fprintf(stderr, "gpuflame CUPTI: no answer from gpuflame within %ld ms; going on\n", limit_ms);
}

EXPORT int InitializeInjection(void)
{
	const char *rate = getenv("GPUFLAME_CUPTI_MAX_RATE");
	const char *launches = getenv("GPUFLAME_CUPTI_LAUNCH_RATE");
	void *h = open_cupti();
	CUptiResult rc;

	max_rate = rate && *rate ? strtoull(rate, NULL, 0) : 500000;
	if (launches && *launches)
		launch_rate = strtoull(launches, NULL, 0);
	if (!h) {
		fail(STATUS_NO_CUPTI, "libcupti not found (set GPUFLAME_CUPTI_PATH)");
		return 1;
	}
	cupti.subscribe = dlsym(h, "cuptiSubscribe");
	cupti.enable_domain = dlsym(h, "cuptiEnableDomain");
	cupti.activity_enable = dlsym(h, "cuptiActivityEnable");
	cupti.register_callbacks = dlsym(h, "cuptiActivityRegisterCallbacks");
	cupti.next_record = dlsym(h, "cuptiActivityGetNextRecord");
	cupti.flush_all = dlsym(h, "cuptiActivityFlushAll");
	cupti.flush_period = dlsym(h, "cuptiActivityFlushPeriod");
	if (!cupti.subscribe || !cupti.enable_domain || !cupti.activity_enable || !cupti.register_callbacks || !cupti.next_record) {
		fail(STATUS_NO_CUPTI, "libcupti lacks the functions needed");
		return 1;
	}
	rc = cupti.subscribe(&subscriber, CUPTIAPI_callback, NULL);
	if (rc != CUPTI_SUCCESS) {
		/* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: the PyTorch profiler, Nsight, ... */
		fail(rc == 39 ? STATUS_OTHER_SUBSCRIBER : STATUS_CUPTI_ERROR,
		     rc == 39 ? "another CUPTI subscriber is active (PyTorch profiler, Nsight?)" : "cuptiSubscribe failed");
		return 1;
	}
	if (cupti.enable_domain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS ||
	    cupti.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
	    cupti.activity_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fail(STATUS_CUPTI_ERROR, "CUPTI refused the kernel activity");
		return 1;
	}
	if (cupti.flush_period)
		cupti.flush_period(200); /* ms: records reach gpuflame within a fraction of a second */
	atexit(flush_at_exit);
	wait_for_gpuflame();
	return 1;
}
