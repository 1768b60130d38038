// What the stand-ins of PyTorch's libc10.so (fake_c10.cpp) and libc10_cuda.so
// (fake_c10_cuda.cpp) share: the types of c10 that the caching allocator's out-of-memory path
// uses, declared as in the real headers, so that the mangled names are the real ones.
#ifndef GPUFLAME_FAKE_C10_H
#define GPUFLAME_FAKE_C10_H

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

namespace c10 {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
using DeviceIndex = int8_t;

// As c10::Device: two bytes, trivially copyable, passed by value in a register.
struct Device {
	DeviceType type_;
	DeviceIndex index_;
};
static_assert(sizeof(Device) == 2, "c10::Device is two bytes");

// _ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE, defined in libc10.so.
void reportOutOfMemoryToProfiler(int64_t alloc_size, size_t total_allocated, size_t total_reserved, Device device);

// Defined in libc10.so, whose typeinfo libc10_cuda.so throws and its callers catch. The real one
// derives from c10::Error (itself a std::exception); what() is the message.
class OutOfMemoryError : public std::exception {
public:
	explicit OutOfMemoryError(std::string msg);
	~OutOfMemoryError() override;
	const char *what() const noexcept override;

private:
	std::string msg_;
};

} // namespace c10

#endif
