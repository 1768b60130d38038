// A stand-in for PyTorch's libc10_cuda.so, for tests without PyTorch: the CUDA caching allocator,
// under the real mangled names of the methods that a profiler hooks, with a simple caching
// behaviour on the stand-in runtime (libcudart.so.13).
//
// As in the real library, built with -fvisibility=hidden: the methods are local symbols (`t` in
// .symtab, absent from the dynamic table), and each of these is a function of its own:
//   NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)
//   NativeCachingAllocator::free(void*), ::raw_delete(void*), ::raw_alloc(unsigned long),
//   ::emptyCache(std::pair<unsigned long long, unsigned long long>), ::allocate(unsigned long)
//   DeviceCachingAllocator::malloc(unsigned long, CUstream_st*), which returns the Block
//   Native::local_raw_delete(void*), static: the deleter of every tensor's DataPtr.
// As in the real binary, free, raw_delete and local_raw_delete never call one another: each finds
// the block (get_allocated_block) and frees it with DeviceCachingAllocator::free_locked, so that a
// free passes exactly one of the three. allocate and raw_alloc call malloc once.
//
// The caching, per device (0..7): requests up to 10 MiB are carved, in multiples of 512 bytes, out
// of 20 MiB segments (best fit among the free blocks; a freed block is coalesced with its free
// neighbours and reused); a larger request gets a segment of its own, its size rounded up to 2 MiB,
// which a later request of the same rounded size reuses once it is free. Segments come from
// cudaMalloc on the device (cudaSetDevice around it when the thread is on another one). When
// cudaMalloc fails, or a limit set by gf_set_limit would be passed (then cudaMalloc is not
// called), the segments without a live block are given back (cudaFree) and the segment is tried
// once more; if that fails too, c10::reportOutOfMemoryToProfiler(size, allocated, reserved, device)
// is called and c10::OutOfMemoryError thrown. "allocated" is the requested bytes of the live
// blocks (torch's requested_bytes), "reserved" the bytes of the segments.
//
// The C functions gf_* (default visibility) are for ctypes and the C++ drivers.
//
// Built with -DGF_SDT, it carries PyTorch's USDT probes as the real library (2.15) does, each
// behind a semaphore that a tracer raises: pytorch:malloc (pointer, device, size, stream) in
// allocate() once its malloc has returned, and pytorch:free (pointer) at the start of the tensor
// deleter, local_raw_delete. raw_alloc and raw_delete carry none, as in the real library.
#ifdef GF_SDT
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
extern "C" {
__attribute__((visibility("default"), section(".probes"), used)) volatile unsigned short pytorch_malloc_semaphore;
__attribute__((visibility("default"), section(".probes"), used)) volatile unsigned short pytorch_free_semaphore;
}
#define GF_PROBE_MALLOC(ptr, device, size, stream) \
	do { \
		if (pytorch_malloc_semaphore) \
			STAP_PROBE4(pytorch, malloc, ptr, device, size, stream); \
	} while (0)
#define GF_PROBE_FREE(ptr) \
	do { \
		if (pytorch_free_semaphore) \
			STAP_PROBE1(pytorch, free, ptr); \
	} while (0)
#else
#define GF_PROBE_MALLOC(ptr, device, size, stream) \
	do { \
	} while (0)
#define GF_PROBE_FREE(ptr) \
	do { \
	} while (0)
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// GCC: noipa keeps the function whole, under its own name: not inlined, not cloned (.isra,
// .constprop), not folded with an identical one (ICF). Clang knows only noinline.
#if defined(__clang__)
#define GF_OWN_FUNCTION __attribute__((noinline, used))
#define GF_NOT_SPLIT
#define GF_PROLOGUE_FIRST
#else
#define GF_OWN_FUNCTION __attribute__((noipa, used))
// The out-of-memory path kept in the function's own body rather than in a .cold part, as it is
// in the real library: its call to reportOutOfMemoryToProfiler returns into
// DeviceCachingAllocator::malloc itself.
#define GF_NOT_SPLIT __attribute__((optimize("no-reorder-blocks-and-partition")))
// The frees begin with their prologue's push, as in the real library (whose first instruction
// in each is `push %r12`), not with the test of a null pointer that shrink-wrapping puts first:
// what a probe at a function's entry costs depends on that instruction (a push is emulated by
// the kernel; a test is stepped over, tens of times dearer in a VM).
#define GF_PROLOGUE_FIRST __attribute__((optimize("no-shrink-wrap")))
#endif

struct CUstream_st;
typedef CUstream_st *cudaStream_t;

// What the stand-in runtime (and libc10.so) export: default visibility, whatever -fvisibility says.
#pragma GCC visibility push(default)
extern "C" {
int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
int cudaSetDevice(int device);
int cudaGetDevice(int *device);
}

#include "fake_c10.h"
#pragma GCC visibility pop

namespace c10 {

// As c10::DataPtr, reduced: the pointer, its context and its deleter.
struct DataPtr {
	void *ptr;
	void *ctx;
	void (*deleter)(void *);
	Device device;
};

namespace cuda {
namespace CUDACachingAllocator {
namespace Native {

namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallRequest = 10u << 20;
constexpr size_t kSmallSegment = 20u << 20;
constexpr size_t kLargeRound = 2u << 20;
constexpr int kDevices = 8;
constexpr int kErrorMemoryAllocation = 2;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Segment;

// A part of a segment: free, or one allocation.
struct Block {
	DeviceIndex device;
	cudaStream_t stream;
	size_t size;      // the bytes it covers
	size_t requested; // the bytes asked for, while allocated
	void *ptr;
	bool allocated;
	Block *prev, *next; // its neighbours in the segment
	Segment *segment;
};

// What one cudaMalloc gave; its blocks in address order from first.
struct Segment {
	void *ptr;
	size_t size;
	bool small;
	Block *first;
};

std::atomic<unsigned long> memory_limit{0};
// How many calls came through NativeCachingAllocator::malloc, and how many frees through each of
// the three ways in (which also keeps the three from being alike).
std::atomic<unsigned long> mallocs{0}, frees_by_free{0}, frees_by_raw_delete{0}, frees_by_deleter{0};

// The thread on `device` while it lives, as c10::cuda::CUDAGuard: cudaSetDevice only when needed.
struct DeviceGuard {
	int prev = -1;
	explicit DeviceGuard(int device)
	{
		int current = 0;
		cudaGetDevice(&current);
		if (current != device) {
			cudaSetDevice(device);
			prev = current;
		}
	}
	~DeviceGuard()
	{
		if (prev >= 0)
			cudaSetDevice(prev);
	}
	DeviceGuard(const DeviceGuard &) = delete;
	DeviceGuard &operator=(const DeviceGuard &) = delete;
};

std::string mib(size_t bytes)
{
	char s[64];
	snprintf(s, sizeof(s), "%.2f MiB", bytes / 1048576.0);
	return s;
}

} // namespace

class DeviceCachingAllocator {
public:
	explicit DeviceCachingAllocator(DeviceIndex device) : device_(device) {}

	GF_OWN_FUNCTION GF_NOT_SPLIT Block *malloc(size_t orig_size, cudaStream_t stream);
	// The one way a block is freed; the caller holds mutex.
	GF_OWN_FUNCTION void free_locked(Block *block);
	void emptyCache()
	{
		std::lock_guard<std::recursive_mutex> lock(mutex);
		release_cached_segments();
	}
	void stats(size_t *allocated, size_t *reserved)
	{
		std::lock_guard<std::recursive_mutex> lock(mutex);
		*allocated = allocated_;
		*reserved = reserved_;
	}

	std::recursive_mutex mutex;

private:
	Block *find_free_block(size_t size, bool small);
	// alloc_block, as the real one is named: gpuflame hooks its calls and their returns.
	GF_OWN_FUNCTION int alloc_block(size_t segment_size, bool small, cudaStream_t stream, Block **out);
	void release_cached_segments();

	DeviceIndex device_;
	std::vector<Segment *> segments_;
	size_t allocated_ = 0, reserved_ = 0;
};

// Best fit among the free blocks of the pool (small: the 20 MiB segments; large: segments of their
// own, reused only at the same rounded size); the first of equal fits, in segment order.
Block *DeviceCachingAllocator::find_free_block(size_t size, bool small)
{
	Block *best = nullptr;
	for (Segment *s : segments_) {
		if (s->small != small)
			continue;
		for (Block *b = s->first; b; b = b->next) {
			if (b->allocated || b->size < size)
				continue;
			if (!small && b->size != round_up(size, kLargeRound))
				continue;
			if (!best || b->size < best->size)
				best = b;
		}
	}
	return best;
}

// A new segment, as one free block; 0, or the error (kErrorMemoryAllocation past the limit).
int DeviceCachingAllocator::alloc_block(size_t segment_size, bool small, cudaStream_t stream, Block **out)
{
	unsigned long limit = memory_limit.load(std::memory_order_relaxed);
	if (limit && reserved_ + segment_size > limit)
		return kErrorMemoryAllocation;
	void *ptr = nullptr;
	int rc;
	{
		DeviceGuard guard(device_);
		rc = cudaMalloc(&ptr, segment_size);
	}
	if (rc != 0)
		return rc;
	Segment *s = new Segment{ptr, segment_size, small, nullptr};
	Block *b = new Block{device_, stream, segment_size, 0, ptr, false, nullptr, nullptr, s};
	s->first = b;
	segments_.push_back(s);
	reserved_ += segment_size;
	*out = b;
	return 0;
}

// Gives back the segments that hold no live block.
void DeviceCachingAllocator::release_cached_segments()
{
	std::vector<Segment *> kept;
	for (Segment *s : segments_) {
		if (s->first->allocated || s->first->next) {
			kept.push_back(s);
			continue;
		}
		{
			DeviceGuard guard(device_);
			cudaFree(s->ptr);
		}
		reserved_ -= s->size;
		delete s->first;
		delete s;
	}
	segments_.swap(kept);
}

Block *DeviceCachingAllocator::malloc(size_t orig_size, cudaStream_t stream)
{
	std::unique_lock<std::recursive_mutex> lock(mutex);
	size_t size = round_up(orig_size ? orig_size : 1, kMinBlockSize);
	bool small = orig_size <= kSmallRequest;
	Block *block = find_free_block(size, small);
	if (!block) {
		size_t segment_size = small ? kSmallSegment : round_up(size, kLargeRound);
		int rc = alloc_block(segment_size, small, stream, &block);
		if (rc != 0) {
			release_cached_segments();
			rc = alloc_block(segment_size, small, stream, &block);
		}
		if (rc != 0) {
			size_t allocated = allocated_, reserved = reserved_;
			lock.unlock();
			c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated, reserved, Device{DeviceType::CUDA, device_});
			throw c10::OutOfMemoryError("CUDA out of memory. Tried to allocate " + mib(size) + ". GPU " + std::to_string(device_) + ": " +
						    mib(allocated) + " allocated by PyTorch, " + mib(reserved) + " reserved.");
		}
	}
	if (small && block->size > size) {
		Block *rest = new Block{device_, stream, block->size - size, 0, static_cast<char *>(block->ptr) + size, false, block, block->next, block->segment};
		if (block->next)
			block->next->prev = rest;
		block->next = rest;
		block->size = size;
	}
	block->allocated = true;
	block->requested = orig_size;
	block->stream = stream;
	allocated_ += orig_size;
	return block;
}

void DeviceCachingAllocator::free_locked(Block *block)
{
	block->allocated = false;
	allocated_ -= block->requested;
	block->requested = 0;
	if (!block->segment->small)
		return;
	Block *next = block->next;
	if (next && !next->allocated) {
		block->size += next->size;
		block->next = next->next;
		if (next->next)
			next->next->prev = block;
		delete next;
	}
	Block *prev = block->prev;
	if (prev && !prev->allocated) {
		prev->size += block->size;
		prev->next = block->next;
		if (block->next)
			block->next->prev = prev;
		delete block;
	}
}

class NativeCachingAllocator {
public:
	NativeCachingAllocator()
	{
		for (int d = 0; d < kDevices; d++)
			device_allocator.push_back(new DeviceCachingAllocator(static_cast<DeviceIndex>(d)));
	}

	GF_OWN_FUNCTION DataPtr allocate(size_t size);
	GF_OWN_FUNCTION void malloc(void **devPtr, DeviceIndex device, size_t size, cudaStream_t stream);
	GF_OWN_FUNCTION GF_PROLOGUE_FIRST void free(void *ptr);
	GF_OWN_FUNCTION GF_PROLOGUE_FIRST void raw_delete(void *ptr);
	GF_OWN_FUNCTION void *raw_alloc(size_t nbytes);
	GF_OWN_FUNCTION void emptyCache(std::pair<unsigned long long, unsigned long long> mempool_id);
	GF_OWN_FUNCTION Block *get_allocated_block(const void *ptr, bool remove = false);

	// Never destroyed (leaked at exit, as the device allocators are in the real one).
	std::vector<DeviceCachingAllocator *> device_allocator;

private:
	void add_allocated_block(Block *block)
	{
		std::lock_guard<std::mutex> lock(mutex_);
		allocated_blocks_[block->ptr] = block;
	}

	std::mutex mutex_;
	std::unordered_map<const void *, Block *> allocated_blocks_;
};

NativeCachingAllocator allocator;

[[noreturn]] void invalid_pointer(const char *where, const void *ptr)
{
	fprintf(stderr, "fake_c10_cuda: %s: invalid device pointer: %p\n", where, ptr);
	abort();
}

Block *NativeCachingAllocator::get_allocated_block(const void *ptr, bool remove)
{
	std::lock_guard<std::mutex> lock(mutex_);
	auto it = allocated_blocks_.find(ptr);
	if (it == allocated_blocks_.end())
		return nullptr;
	Block *block = it->second;
	if (remove)
		allocated_blocks_.erase(it);
	return block;
}

void NativeCachingAllocator::malloc(void **devPtr, DeviceIndex device, size_t size, cudaStream_t stream)
{
	if (device < 0 || device >= kDevices) {
		fprintf(stderr, "fake_c10_cuda: malloc: invalid device %d\n", device);
		abort();
	}
	mallocs.fetch_add(1, std::memory_order_relaxed);
	Block *block = device_allocator[device]->malloc(size, stream);
	add_allocated_block(block);
	*devPtr = block->ptr;
}

void NativeCachingAllocator::free(void *ptr)
{
	if (!ptr)
		return;
	Block *block = get_allocated_block(ptr, true);
	if (!block)
		invalid_pointer("free", ptr);
	frees_by_free.fetch_add(1, std::memory_order_relaxed);
	DeviceCachingAllocator *d = device_allocator[block->device];
	std::lock_guard<std::recursive_mutex> lock(d->mutex);
	d->free_locked(block);
}

void NativeCachingAllocator::raw_delete(void *ptr)
{
	if (!ptr)
		return;
	Block *block = get_allocated_block(ptr, true);
	if (!block)
		invalid_pointer("raw_delete", ptr);
	frees_by_raw_delete.fetch_add(1, std::memory_order_relaxed);
	DeviceCachingAllocator *d = device_allocator[block->device];
	std::lock_guard<std::recursive_mutex> lock(d->mutex);
	d->free_locked(block);
}

// The deleter of every tensor's DataPtr; internal linkage, as in the real library. Built with
// -DGF_DELETER_CALLS_FREE, it frees through NativeCachingAllocator::free, as a build that does
// not inline does: one free passes two hooked functions.
static GF_OWN_FUNCTION GF_PROLOGUE_FIRST void local_raw_delete(void *ptr)
{
	if (!ptr)
		return;
	GF_PROBE_FREE(ptr);
#ifdef GF_DELETER_CALLS_FREE
	frees_by_deleter.fetch_add(1, std::memory_order_relaxed);
	allocator.free(ptr);
	return;
#endif
	Block *block = allocator.get_allocated_block(ptr, true);
	if (!block)
		invalid_pointer("local_raw_delete", ptr);
	frees_by_deleter.fetch_add(1, std::memory_order_relaxed);
	DeviceCachingAllocator *d = allocator.device_allocator[block->device];
	std::lock_guard<std::recursive_mutex> lock(d->mutex);
	d->free_locked(block);
}

// As torch's allocate(): on the current device, one malloc, and the DataPtr with its deleter.
DataPtr NativeCachingAllocator::allocate(size_t size)
{
	int device = 0;
	cudaGetDevice(&device);
	void *devPtr = nullptr;
	if (size != 0) {
		malloc(&devPtr, static_cast<DeviceIndex>(device), size, nullptr);
#ifdef GF_SDT_ARGS_IN_FRAME
		// Pointer and device read from the frame (8@8(%rsp) -1@4(%rsp)), as a build that keeps
		// them in memory gives them.
		GF_PROBE_MALLOC(devPtr, static_cast<DeviceIndex>(device), size, static_cast<long>(0));
#else
		// As the real library's note has them (-8@%rax -1@%dl -8@%r14 -8@-56(%rbp)): pointer,
		// device and size in registers, the stream in the frame.
		void *ptr = devPtr;
		DeviceIndex dev = static_cast<DeviceIndex>(device);
		asm volatile("" : "+r"(ptr), "+q"(dev));
		volatile long stream = 0;
		GF_PROBE_MALLOC(ptr, dev, size, stream);
#endif
	}
	return {devPtr, devPtr, &local_raw_delete, Device{DeviceType::CUDA, static_cast<DeviceIndex>(device)}};
}

void *NativeCachingAllocator::raw_alloc(size_t nbytes)
{
	if (nbytes == 0)
		return nullptr;
	int device = 0;
	cudaGetDevice(&device);
	void *r = nullptr;
	malloc(&r, static_cast<DeviceIndex>(device), nbytes, nullptr);
	return r;
}

void NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long> mempool_id)
{
	(void)mempool_id;
	for (DeviceCachingAllocator *d : device_allocator)
		d->emptyCache();
}

} // namespace Native

// Exported by the real library as by this one: how a profiler tells a libc10_cuda from other
// files that import the CUDA runtime, before it reads the static symbols.
struct __attribute__((visibility("default"))) CUDAAllocatorConfig {
	static bool expandable_segments();
};
bool CUDAAllocatorConfig::expandable_segments() { return false; }

} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using c10::cuda::CUDACachingAllocator::Native::allocator;
using c10::cuda::CUDACachingAllocator::Native::DeviceGuard;
using c10::cuda::CUDACachingAllocator::Native::kDevices;

#define GF_API extern "C" __attribute__((visibility("default")))

// A tensor's storage on `device`, as torch.empty(size, device=f"cuda:{device}") and at::empty
// in C++: under a device guard, allocate() (one NativeCachingAllocator::malloc); NULL at an
// out-of-memory. In PyTorch's namespace, as at::empty is: a profiler names a tensor's holder by
// the first frame outside PyTorch's.
namespace at {
__attribute__((visibility("default"))) void *empty(size_t size, int device)
{
	if (device < 0 || device >= kDevices)
		return nullptr;
	DeviceGuard guard(device);
	try {
		return allocator.allocate(size).ptr;
	} catch (const c10::OutOfMemoryError &) {
		return nullptr;
	}
}
} // namespace at

// The same for ctypes.
GF_API void *gf_tensor_alloc(size_t size, int device) { return at::empty(size, device); }

// A tensor's storage freed, as its DataPtr's deleter does.
GF_API void gf_tensor_free(void *ptr) { c10::cuda::CUDACachingAllocator::Native::local_raw_delete(ptr); }

// torch.cuda.caching_allocator_alloc on device 0: raw_alloc; NULL at an out-of-memory.
GF_API void *gf_raw_alloc(size_t size)
{
	DeviceGuard guard(0);
	try {
		return allocator.raw_alloc(size);
	} catch (const c10::OutOfMemoryError &) {
		return nullptr;
	}
}

GF_API void gf_raw_delete(void *ptr) { allocator.raw_delete(ptr); }

GF_API void gf_free(void *ptr) { allocator.free(ptr); }

GF_API void gf_empty_cache(void) { allocator.emptyCache({0, 0}); }

GF_API void gf_memory_stats(int device, unsigned long *allocated, unsigned long *reserved)
{
	size_t a = 0, r = 0;
	if (device >= 0 && device < kDevices)
		allocator.device_allocator[device]->stats(&a, &r);
	if (allocated)
		*allocated = a;
	if (reserved)
		*reserved = r;
}

// For tests: calls of NativeCachingAllocator::malloc, ::free, ::raw_delete and local_raw_delete.
GF_API void gf_call_counts(unsigned long counts[4])
{
	using namespace c10::cuda::CUDACachingAllocator::Native;
	counts[0] = mallocs.load();
	counts[1] = frees_by_free.load();
	counts[2] = frees_by_raw_delete.load();
	counts[3] = frees_by_deleter.load();
}

// A cap on each device's reserved bytes (0: none), as torch.cuda.set_per_process_memory_fraction.
GF_API void gf_set_limit(unsigned long bytes) { c10::cuda::CUDACachingAllocator::Native::memory_limit.store(bytes); }
