// A kernel that holds a stream for a set time, so that a benchmark can enqueue the launches it
// times behind it: CUDA events then measure the device's work, not the host's launch overhead
// (graphkern/bench/timing.py, time_gpu).
#include <cstdint>

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void hold_stream(uint64_t ns) {
    const uint64_t start = global_ns();
    while (global_ns() - start < ns) __nanosleep(2000);
}
