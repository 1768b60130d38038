// A stand-in for PyTorch's libc10.so, for tests without PyTorch: the two things of it that the CUDA
// caching allocator (fake_c10_cuda.cpp) uses at an out-of-memory, under their real names.
//
// c10::reportOutOfMemoryToProfiler(long, unsigned long, unsigned long, c10::Device) is the dynamic
// symbol _ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE, as in the real libc10.so: the
// caching allocator calls it, through the PLT, just before it throws c10::OutOfMemoryError, with
// the size it failed to allocate, what it had allocated and reserved, and the device.
#include "fake_c10.h"

namespace c10 {

// The destructor is the key function: the vtable and typeinfo are emitted here, exported, and
// shared by every library that throws or catches the exception.
OutOfMemoryError::OutOfMemoryError(std::string msg) : msg_(std::move(msg)) {}
OutOfMemoryError::~OutOfMemoryError() = default;
const char *OutOfMemoryError::what() const noexcept { return msg_.c_str(); }

// What the last report said, stored through volatile so that the body is never optimised away.
static volatile int64_t last_alloc_size;
static volatile uint64_t last_allocated, last_reserved, reports;
static volatile int last_device_type, last_device_index;

__attribute__((noinline)) void reportOutOfMemoryToProfiler(int64_t alloc_size, size_t total_allocated, size_t total_reserved, Device device)
{
	last_alloc_size = alloc_size;
	last_allocated = total_allocated;
	last_reserved = total_reserved;
	last_device_type = static_cast<int>(device.type_);
	last_device_index = device.index_;
	reports = reports + 1;
}

} // namespace c10

// For tests: how many out-of-memory reports there were.
extern "C" unsigned long fake_c10_oom_reports(void) { return c10::reports; }
