// A PyTorch-like program on the stand-in caching allocator (libc10_cuda.so): tensors allocated and
// freed from named functions, so that a profiler's stacks show them. Modes (argv[1]):
//   exact            known live bytes per function, a reuse of a freed block, raw_alloc/raw_delete,
//                    NativeCachingAllocator::free and a device other than 0
//   loop SECONDS RATE  one 64 KiB tensor allocated and freed RATE times a second, paced by a busy
//                    wait; prints the time the allocator itself took per iteration
//   oom              weights, a KV cache, then decode steps until an allocation fails (run under
//                    FAKE_CUDA_BUDGET, or C10_LIMIT: the allocator's own limit, in bytes)
//   sampled          what byte sampling estimates: 200,000 tensors of 4 KiB allocated and freed
//                    (churn_small), 8 of 4 MiB kept (keep_big), 5,000 of 4 KiB kept (keep_small)
//   burst            a burst no profiler keeps up with, made while the test holds the profiler
//                    stopped (BURST_MARK: a file made 1,000 tensors in; BURST_STOPPED: the file
//                    the test makes once it stopped it): 200,000 tensors of 4 KiB, one in 20 kept;
//                    20,000 segments of 64 KiB by cudaMalloc, one in 20 kept; 4 tensors of 4 MiB
//                    from a new stack; then 4 MiB tensors until the allocator's limit (reserved +
//                    64 MiB) refuses one, half of them freed after (as an exception would);
//                    BURST_DONE: a file made then
//   hold N           N tensors of 512 bytes kept (the live set's memory, benches/live_set_memory.sh);
//                    prints held=N once they are
//   late             5 tensors of 1 MiB before the gate (a profiler attaching with -p), then
//                    frees them and keeps 2 of 2 MiB
// With GPUFLAME_TEST_GATE set, waits at the gate (../gate.h) first, or in `late` after its
// first tensors.
// Prints key=value lines, ends with allocated= and reserved= (device 0), then sleeps LINGER_MS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

#include "../gate.h"

extern "C" {
void *gf_tensor_alloc(size_t size, int device);
void gf_tensor_free(void *ptr);
void *gf_raw_alloc(size_t size);
void gf_raw_delete(void *ptr);
void gf_free(void *ptr);
void gf_empty_cache(void);
void gf_memory_stats(int device, unsigned long *allocated, unsigned long *reserved);
void gf_set_limit(unsigned long bytes);
void gf_call_counts(unsigned long counts[4]);
}

// As a C++ PyTorch program calls at::empty: tensors are allocated in the functions below, which
// call it themselves (tensor() and try_tensor() are macros: an inlined function would still be
// a frame of the stack, from the debug information).
namespace at {
void *empty(size_t size, int device);
}

#define NOINLINE __attribute__((noinline))

static const size_t MiB = 1 << 20;

// The storage, or the end of the program at an out-of-memory; called after at::empty returned.
static void *checked(void *p, size_t size, int device)
{
	if (!p) {
		fprintf(stderr, "tensor_app: out of memory allocating %zu bytes on device %d\n", size, device);
		exit(1);
	}
	return p;
}

#define tensor_on(size, device) checked(at::empty((size), (device)), (size), (device))
#define tensor(size) tensor_on((size), 0)

static void print_stats(const char *suffix, int device)
{
	unsigned long allocated = 0, reserved = 0;
	gf_memory_stats(device, &allocated, &reserved);
	printf("allocated%s=%lu\nreserved%s=%lu\n", suffix, allocated, suffix, reserved);
}

static void live(const char *function, size_t bytes, int count)
{
	printf("live_%s_bytes=%zu\nlive_%s_count=%d\n", function, bytes, function, count);
}

// --- exact ---------------------------------------------------------------------------------------

static std::vector<void *> weights, kept_activations, device_two;
static void *second, *raw_kept;

// Four tensors of `each` bytes, kept (8 MiB in exact, 16 MiB in oom).
NOINLINE void load_weights(size_t each)
{
	for (int i = 0; i < 4; i++)
		weights.push_back(tensor(each));
}

NOINLINE void activations()
{
	std::vector<void *> a;
	for (int i = 0; i < 10; i++)
		a.push_back(tensor(1 * MiB));
	for (int i = 0; i < 10; i++) {
		if (i % 5 < 3) /* 0, 1, 2, 5, 6, 7: six freed */
			gf_tensor_free(a[i]);
		else
			kept_activations.push_back(a[i]);
	}
}

NOINLINE void *second_owner()
{
	return tensor(8 * MiB);
}

// The first weight freed, and its 8 MiB block taken by a new tensor: the same pointer, owned now
// by second_owner.
NOINLINE int reuse()
{
	void *old = weights[0];
	gf_tensor_free(old);
	weights.erase(weights.begin());
	second = second_owner();
	return second == old;
}

NOINLINE void raw()
{
	raw_kept = gf_raw_alloc(2 * MiB);
	void *scratch = gf_raw_alloc(3 * MiB);
	if (!raw_kept || !scratch) {
		fprintf(stderr, "tensor_app: raw_alloc failed\n");
		exit(1);
	}
	gf_raw_delete(scratch);
}

NOINLINE void direct_free()
{
	void *p = tensor(5 * MiB);
	gf_free(p);
}

NOINLINE void on_device_two()
{
	for (int i = 0; i < 3; i++)
		device_two.push_back(tensor_on(4 * MiB, 2));
}

static void exact()
{
	load_weights(8 * MiB);
	activations();
	int reused = reuse();
	raw();
	direct_free();
	on_device_two();
	printf("reused=%d\n", reused);
	live("load_weights", 3 * 8 * MiB, 3);
	live("activations", 4 * 1 * MiB, 4);
	live("reuse", 0, 0);
	live("second_owner", 8 * MiB, 1);
	live("raw", 2 * MiB, 1);
	live("direct_free", 0, 0);
	live("on_device_two", 3 * 4 * MiB, 3);
	printf("expected_allocated=%zu\n", (3 * 8 + 4 + 8 + 2) * MiB);
	printf("expected_allocated_dev2=%zu\n", 12 * MiB);
	// Each tensor and raw allocation is one NativeCachingAllocator::malloc; each free one of the
	// three ways in: local_raw_delete (6 activations and a weight), raw_delete, free.
	unsigned long counts[4];
	gf_call_counts(counts);
	printf("expected_mallocs=21\nmallocs=%lu\n", counts[0]);
	printf("expected_frees=1\nfrees=%lu\n", counts[1]);
	printf("expected_raw_deletes=1\nraw_deletes=%lu\n", counts[2]);
	printf("expected_local_raw_deletes=7\nlocal_raw_deletes=%lu\n", counts[3]);
	print_stats("_dev2", 2);
}

// --- loop ----------------------------------------------------------------------------------------

static long long now_ns()
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

NOINLINE void loop_step()
{
	void *p = tensor(64 << 10);
	gf_tensor_free(p);
}

static void loop(double seconds, double rate)
{
	// Once before the clock starts: CUDA's initialisation and the first segment are not the
	// allocator's cost per tensor.
	loop_step();
	long long period = rate > 0 ? (long long)(1e9 / rate) : 0;
	long long start = now_ns(), end = start + (long long)(seconds * 1e9), work = 0, iterations = 0;
	for (long long t = start; t < end; iterations++) {
		long long a = now_ns();
		loop_step();
		long long b = now_ns();
		work += b - a;
		long long next = start + (iterations + 1) * period;
		do
			t = now_ns();
		while (t < next && t < end);
	}
	printf("iterations=%lld\n", iterations);
	printf("work_ns_per_iteration=%lld\n", iterations ? work / iterations : 0);
}

// --- oom -----------------------------------------------------------------------------------------

static size_t oom_requested;
static const char *oom_function;
static std::vector<void *> kv_cache, prefix_cache;

// The storage, or NULL at an out-of-memory, which is noted; called after at::empty returned.
static void *noted(void *p, size_t size, const char *function)
{
	if (!p && !oom_function) {
		oom_requested = size;
		oom_function = function;
	}
	return p;
}

#define try_tensor(size, function) noted(at::empty((size), 0), (size), (function))

NOINLINE void allocate_kv_cache()
{
	for (int layer = 0; layer < 16; layer++)
		kv_cache.push_back(tensor(8 * MiB));
}

NOINLINE bool grow_prefix_cache()
{
	void *p = try_tensor(1 * MiB, "grow_prefix_cache");
	if (!p)
		return false;
	prefix_cache.push_back(p);
	return true;
}

NOINLINE bool sample_logits()
{
	void *logits = try_tensor(30 * MiB, "sample_logits");
	if (!logits)
		return false;
	gf_tensor_free(logits);
	return true;
}

NOINLINE bool decode_step()
{
	return grow_prefix_cache() && sample_logits();
}

NOINLINE int serve()
{
	int steps = 0;
	while (decode_step())
		steps++;
	return steps;
}

static void oom()
{
	// As torch.cuda.set_per_process_memory_fraction: the allocator refuses on its own.
	const char *limit = getenv("C10_LIMIT");
	if (limit && *limit)
		gf_set_limit(strtoul(limit, NULL, 10));
	load_weights(16 * MiB);
	allocate_kv_cache();
	int steps = serve();
	printf("steps=%d\n", steps);
	printf("oom_requested=%zu\n", oom_requested);
	printf("oom_function=%s\n", oom_function ? oom_function : "none");
	printf("kv_cache_bytes=%zu\n", kv_cache.size() * 8 * MiB);
	printf("weights_bytes=%zu\n", weights.size() * 16 * MiB);
	printf("prefix_cache_bytes=%zu\n", prefix_cache.size() * MiB);
}

NOINLINE void before_attach(std::vector<void *> &kept)
{
	for (int i = 0; i < 5; i++)
		kept.push_back(tensor(1 * MiB));
}

NOINLINE void after_attach(std::vector<void *> &kept)
{
	for (void *p : kept)
		gf_tensor_free(p);
	kept.clear();
	for (int i = 0; i < 2; i++)
		kept.push_back(tensor(2 * MiB));
	printf("live_after_attach_bytes=%zu\n", 2 * 2 * MiB);
}

static void late()
{
	static std::vector<void *> kept;
	before_attach(kept);
	gate();
	after_attach(kept);
}

// --- sampled -------------------------------------------------------------------------------------

static std::vector<void *> kept_sampled;

// Paced: a pause after every 10,000 tensors lets the profiler drain its ring (a record per
// allocation and per free, 168 bytes each: 10,000 tensors are 3.4 MB of its 16 MiB). Unpaced,
// a CI run whose profiler the tests beside it kept off the CPU lost 2% of the records (counted
// and reported as lost); how fast the records are drained is a benchmark's question, and what
// this mode is for is what byte sampling estimates.
NOINLINE void churn_small(int n)
{
	for (int i = 0; i < n; i++) {
		gf_tensor_free(tensor(4096));
		if (i % 10000 == 9999)
			usleep(20000);
	}
}

NOINLINE void keep_big()
{
	for (int i = 0; i < 8; i++)
		kept_sampled.push_back(tensor(4 * MiB));
}

NOINLINE void keep_small()
{
	for (int i = 0; i < 5000; i++)
		kept_sampled.push_back(tensor(4096));
}

static void sampled()
{
	churn_small(200000);
	keep_big();
	keep_small();
	printf("churned_bytes=%zu\nlive_keep_big_bytes=%zu\nlive_keep_small_bytes=%zu\n", (size_t)200000 * 4096, 8 * 4 * MiB, (size_t)5000 * 4096);
}

// --- burst ---------------------------------------------------------------------------------------

static std::vector<void *> burst_kept, segments_kept, after_kept, filled;

// Says the burst began, and waits (up to 10 s) for the test to have stopped the profiler.
static void wait_for_stop()
{
	const char *mark = getenv("BURST_MARK"), *stopped = getenv("BURST_STOPPED");
	if (!mark || !stopped)
		return;
	close(open(mark, O_CREAT | O_WRONLY, 0644));
	for (int i = 0; i < 10000 && access(stopped, F_OK); i++)
		usleep(1000);
}

NOINLINE void burst_tensors(int n)
{
	for (int i = 0; i < n; i++) {
		if (i == 1000)
			wait_for_stop();
		void *t = tensor(4096);
		if (i % 20 == 0)
			burst_kept.push_back(t);
		else
			gf_tensor_free(t);
	}
}

// cudaMalloc and cudaFree of the runtime libc10_cuda.so loaded, as a library of the program's
// (NCCL, a cuBLAS workspace) calls them.
NOINLINE void burst_segments(int n)
{
	typedef int (*malloc_fn)(void **, size_t);
	typedef int (*free_fn)(void *);
	malloc_fn cuda_malloc = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
	free_fn cuda_free = (free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
	if (!cuda_malloc || !cuda_free) {
		fprintf(stderr, "tensor_app: no cudaMalloc in the process\n");
		exit(1);
	}
	for (int i = 0; i < n; i++) {
		void *p = NULL;
		if (cuda_malloc(&p, 65536)) {
			fprintf(stderr, "tensor_app: cudaMalloc failed\n");
			exit(1);
		}
		if (i % 20 == 0)
			segments_kept.push_back(p);
		else
			cuda_free(p);
	}
}

NOINLINE void keep_after_burst()
{
	for (int i = 0; i < 4; i++)
		after_kept.push_back(tensor(4 * MiB));
}

NOINLINE void fill_until_oom()
{
	unsigned long allocated = 0, reserved = 0;
	gf_memory_stats(0, &allocated, &reserved);
	gf_set_limit(reserved + 64 * MiB);
	void *p;
	while ((p = try_tensor(4 * MiB, "fill_until_oom")))
		filled.push_back(p);
	print_stats("_at_oom", 0);
	printf("filled_bytes=%zu\n", filled.size() * 4 * MiB);
	// As the exception's unwinding would: what the step held goes.
	for (size_t i = 0; i < filled.size() / 2; i++)
		gf_tensor_free(filled[i]);
}

static void burst()
{
	keep_big();
	burst_tensors(200000);
	const char *segments = getenv("BURST_SEGMENTS");
	burst_segments(segments ? atoi(segments) : 20000);
	keep_after_burst();
	fill_until_oom();
	const char *done = getenv("BURST_DONE");
	if (done)
		close(open(done, O_CREAT | O_WRONLY, 0644));
	printf("live_keep_big_bytes=%zu\nlive_burst_tensors_bytes=%zu\nlive_keep_after_burst_bytes=%zu\n", 8 * 4 * MiB, burst_kept.size() * 4096, after_kept.size() * 4 * MiB);
	printf("live_fill_until_oom_bytes=%zu\nsegments_kept_bytes=%zu\n", (filled.size() - filled.size() / 2) * 4 * MiB, segments_kept.size() * 65536);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "exact";
	if (strcmp(mode, "late"))
		gate();
	if (!strcmp(mode, "late")) {
		late();
	} else if (!strcmp(mode, "exact")) {
		exact();
	} else if (!strcmp(mode, "loop")) {
		loop(argc > 2 ? atof(argv[2]) : 1.0, argc > 3 ? atof(argv[3]) : 1000.0);
	} else if (!strcmp(mode, "oom")) {
		oom();
	} else if (!strcmp(mode, "sampled")) {
		sampled();
	} else if (!strcmp(mode, "burst")) {
		burst();
	} else if (!strcmp(mode, "hold")) {
		long n = argc > 2 ? atol(argv[2]) : 1000000;
		for (long i = 0; i < n; i++)
			burst_kept.push_back(tensor(512));
		printf("held=%ld\n", n);
		fflush(stdout);
	} else {
		fprintf(stderr, "usage: tensor_app exact | loop SECONDS RATE | oom\n");
		return 2;
	}
	print_stats("", 0);
	fflush(stdout);
	const char *linger = getenv("LINGER_MS");
	if (linger && *linger)
		usleep(strtoul(linger, NULL, 10) * 1000);
	return 0;
}
