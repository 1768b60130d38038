/* A stand-in for libcupti.so.13, for tests without a GPU: the subscriber and activity-buffer API
 * that gpuflame's injection library uses, with the real signatures and record layout. The fake
 * driver (fake_cuda.c) reports each launch through fake_cupti_launch(): a launch callback with a
 * new correlation id, then one kernel record per kernel the launch runs, lasting 1000 ns per
 * character of the kernel's name, so that tests know every record's duration, unless the launching
 * thread called fake_cupti_next_kernel_ns() just before (the stand-in NCCL, fake_nccl.c, does: its
 * kernels last as long as the rank waited for its peers). FAKE_CUPTI_BUSY=1 plays another
 * subscriber (the PyTorch profiler, Nsight). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUptiResult;
typedef void (*CUpti_CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*BufferRequested)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*BufferCompleted)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);

struct callback_data {
	uint32_t callback_site;
	const char *function_name;
	const void *function_params;
	void *function_return_value;
	const char *symbol_name;
	void *context;
	uint32_t context_uid;
	uint64_t *correlation_data;
	uint32_t correlation_id;
};

/* CUpti_ActivityKernel9's leading fields, at their offsets; 192 bytes per record. */
#define RECORD 192
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_CallbackFunc callback;
static int subscribed, kernels_enabled;
static BufferRequested requested;
static BufferCompleted completed;
static uint8_t *buffer;
static size_t buffer_size, used;
static uint32_t next_correlation = 1;
static uint64_t clock_ns = 1000000;
static __thread uint64_t next_kernel_ns; /* fake_cupti_next_kernel_ns()'s duration; 0: none */

CUptiResult cuptiSubscribe(void **subscriber, CUpti_CallbackFunc cb, void *userdata)
{
	(void)userdata;
	if (getenv("FAKE_CUPTI_BUSY"))
		return 39; /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED */
	*subscriber = (void *)1;
	callback = cb;
	subscribed = 1;
	return 0;
}
CUptiResult cuptiEnableDomain(uint32_t enable, void *subscriber, int domain) { (void)enable; (void)subscriber; (void)domain; return 0; }
CUptiResult cuptiActivityEnable(int kind) { kernels_enabled |= kind == 10; return 0; }
CUptiResult cuptiActivityRegisterCallbacks(BufferRequested r, BufferCompleted c) { requested = r; completed = c; return 0; }
CUptiResult cuptiActivityFlushPeriod(uint32_t ms) { (void)ms; return 0; }

CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, void **record)
{
	uint8_t *next = *record ? (uint8_t *)*record + RECORD : buf;
	if (next + RECORD > buf + valid)
		return 3; /* CUPTI_ERROR_MAX_LIMIT_REACHED */
	*record = next;
	return 0;
}

/* Hands the full buffer over; called with the lock held. */
static void deliver(void)
{
	if (!buffer)
		return;
	uint8_t *b = buffer;
	size_t n = used;
	buffer = NULL;
	used = 0;
	pthread_mutex_unlock(&lock);
	completed(NULL, 0, b, buffer_size, n);
	pthread_mutex_lock(&lock);
}

CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
	(void)flag;
	pthread_mutex_lock(&lock);
	deliver();
	pthread_mutex_unlock(&lock);
	return 0;
}

/* `ns`: the record's duration; 0 for 1000 ns per character of the name. */
static void add_record(const char *name, uint32_t correlation, uint32_t graph, uint64_t node, uint64_t ns)
{
	uint8_t *r;
	uint32_t kind = 10, device = 0, stream = 7;
	uint64_t start, end;

	if (!buffer) {
		size_t max;
		requested(&buffer, &buffer_size, &max);
		used = 0;
	}
	r = buffer + used;
	memset(r, 0, RECORD);
	start = clock_ns;
	end = start + (ns ? ns : 1000ULL * strlen(name));
	clock_ns = end + 500;
	memcpy(r + 0, &kind, 4);
	memcpy(r + 16, &start, 8);
	memcpy(r + 24, &end, 8);
	memcpy(r + 40, &device, 4);
	memcpy(r + 48, &stream, 4);
	memcpy(r + 92, &correlation, 4);
	memcpy(r + 104, &name, sizeof(name));
	memcpy(r + 144, &node, 8);
	memcpy(r + 156, &graph, 4);
	used += RECORD;
	if (used + RECORD > buffer_size)
		deliver();
}

/* For the stand-in NCCL: the next launch this thread reports (whether it makes a record or not)
 * records its first kernel as lasting `ns` nanoseconds. */
void fake_cupti_next_kernel_ns(uint64_t ns) { next_kernel_ns = ns; }

/* Called by the fake driver for each launch: `kernels` names what it runs (a graph runs several). */
void fake_cupti_launch(const char *function, const char **kernels, int count, uint32_t graph)
{
	struct callback_data cb = { 0 };
	uint64_t ns = next_kernel_ns;

	next_kernel_ns = 0;
	if (!subscribed)
		return;
	pthread_mutex_lock(&lock);
	cb.correlation_id = next_correlation++;
	pthread_mutex_unlock(&lock);
	cb.callback_site = 0;
	cb.function_name = function;
	callback(NULL, 1, 307, &cb);
	if (!kernels_enabled)
		return;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < count; i++)
		add_record(kernels[i], cb.correlation_id, graph, graph ? (uint64_t)i + 1 : 0, i ? 0 : ns);
	pthread_mutex_unlock(&lock);
}
