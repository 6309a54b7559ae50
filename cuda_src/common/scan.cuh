// The block-wide exclusive prefix sum shared by every module (Jaccard's work lists, exp's degree
// order and SpMV plan on the device).
#pragma once

#include <cstdint>

#include "reductions.cuh"

namespace gk {

// Exclusive prefix sum of one value per thread over the block; *total gets the block's sum.
// blockDim.x must be a multiple of 32 (at most 1024).  Ends with a barrier so that it can be
// called again in a loop.
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t v, int64_t* total) {
    __shared__ int64_t warp_totals[32];
    const int lane = threadIdx.x & 31;
    const int wid = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    int64_t x = v;
    for (int off = 1; off < 32; off <<= 1) {
        const int64_t y = __shfl_up_sync(kFullMask, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) warp_totals[wid] = x;
    __syncthreads();
    if (wid == 0) {
        int64_t t = lane < n_warps ? warp_totals[lane] : 0;
        for (int off = 1; off < 32; off <<= 1) {
            const int64_t y = __shfl_up_sync(kFullMask, t, off);
            if (lane >= off) t += y;
        }
        warp_totals[lane] = t;
    }
    __syncthreads();
    const int64_t before = wid > 0 ? warp_totals[wid - 1] : 0;
    *total = warp_totals[n_warps - 1];
    __syncthreads();
    return before + x - v;
}

}  // namespace gk
