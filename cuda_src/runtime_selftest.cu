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

// The device library's sums (common/reductions.cuh) over one block of 256 threads, as every
// thread sees them: warp_sum, block_sum, and block_sum_to_first (thread 0).
#include "common/reductions.cuh"

extern "C" __global__ void __launch_bounds__(256)
    selftest_reductions(const double* x, double* warp_out, double* block_out, double* first_out) {
    __shared__ double red[8];
    const int t = threadIdx.x;
    warp_out[t] = gk::warp_sum(x[t]);
    double v[1] = {x[t]};
    gk::block_sum<8>(v, red);
    block_out[t] = v[0];
    __syncthreads();  // every thread has read red
    v[0] = gk::block_sum_to_first(x[t], red, t, 8);
    if (t == 0) first_out[0] = v[0];
}
