// C++: main -> gpuflame_test::Outer::a -> b<int> -> c, spinning for argv[1] seconds.
#include <chrono>
#include <cstdlib>

#include "gate.h"

static volatile unsigned long sink;

namespace gpuflame_test {
using clock = std::chrono::steady_clock;

__attribute__((noinline)) void c(clock::time_point end)
{
	while (clock::now() < end)
		for (int i = 0; i < 200000; i++)
			sink = sink + i;
}
template <typename T> __attribute__((noinline)) void b(clock::time_point end) { c(end); sink = sink + sizeof(T); }
struct Outer {
	__attribute__((noinline)) static void a(clock::time_point end) { b<int>(end); sink = sink + 1; }
};
} // namespace gpuflame_test

int main(int argc, char **argv)
{
	gate();
	auto seconds = std::chrono::duration<double>(argc > 1 ? std::atof(argv[1]) : 2.0);
	gpuflame_test::Outer::a(gpuflame_test::clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(seconds));
	return 0;
}
