// Binary searches over sorted CSR arrays, shared by every module.  Column lists are sorted int32
// ranges of one array; positions are int64 because a graph may store more than 2^31 entries.
#pragma once

#include <cstdint>

namespace gk {

// First position p in [lo, hi) with idx[p] >= x, or hi.
__device__ __forceinline__ int64_t lower_bound(const int32_t* __restrict__ idx, int64_t lo, int64_t hi, int32_t x) {
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Largest r in [lo, hi) with a[r] <= key, for a non-decreasing a with a[lo] <= key
// (the row of entry `key` when a is indptr; the entry of work item `key` when a is a prefix sum).
template <typename P>
__device__ __forceinline__ int64_t last_not_above(const P* __restrict__ a, int64_t lo, int64_t hi, int64_t key) {
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((int64_t)a[mid] <= key) lo = mid;
        else hi = mid;
    }
    return lo;
}

// Row of entry k, for a block whose entries all lie in [k_first, k_last]: two threads search the
// whole indptr, the others only the rows the block spans (a few steps on low-degree graphs).
// Every thread of the block must call it; k past k_last is clamped (its caller ignores the row).
template <typename P>
__device__ __forceinline__ int64_t block_entry_row(const P* __restrict__ indptr, int64_t n, int64_t k, int64_t k_first,
                                                   int64_t k_last) {
    __shared__ int64_t span[2];
    if (threadIdx.x == 0) span[0] = last_not_above(indptr, 0, n, k_first);
    if (threadIdx.x == blockDim.x - 1) span[1] = last_not_above(indptr, 0, n, k_last);
    __syncthreads();
    return last_not_above(indptr, span[0], span[1] + 1, k < k_last ? k : k_last);
}

}  // namespace gk
