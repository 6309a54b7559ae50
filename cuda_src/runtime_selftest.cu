// Kernels used by the runtime layer's own tests: a known computation to check
// launches, argument passing and copies end to end.
#include <cstdint>

extern "C" __global__ void selftest_axpy_f64(double a, const double* __restrict__ x, double* __restrict__ y,
                                             int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void selftest_iota_i32(int32_t* out, int32_t start, int32_t n) {
    int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = start + i;
}
