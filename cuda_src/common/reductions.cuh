// Sums over a warp, a group of lanes and a block, shared by every module.  The order of the
// additions is part of each one's contract (a team's threads must get the same bits, and results
// must not change between builds), so both families stay: butterfly (xor) sums, the total in every
// lane, then block_sum adds the warps' totals in warp order in every thread (the MGK solvers' CG
// scalars); tree (shuffle-down) sums, the total in lane 0, then block_sum_to_first has warp 0 add
// the warps' totals by a second tree (exp(A) and SPGK partial sums, valid in thread 0 only).
#pragma once

namespace gk {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The sum of v over the warp, in every lane (xor butterfly, offsets 16, 8, 4, 2, 1).
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

// The sum of x over an aligned group of `group` lanes (a power of two), in every lane of it.
template <typename V>
__device__ __forceinline__ V group_sum(unsigned mask, V x, int group) {
    for (int off = group >> 1; off > 0; off >>= 1) x += __shfl_xor_sync(mask, x, off);
    return x;
}

// The sum of v over groups of `width` lanes (a power of two), in each group's first lane (tree).
template <typename V>
__device__ __forceinline__ V group_sum_down(V v, int width) {
    for (int o = width / 2; o > 0; o >>= 1) v += __shfl_down_sync(kFullMask, v, o, width);
    return v;
}

// The sums of v[k] over a block of WARPS full warps, the same bits in every thread (each adds the
// warps' totals in warp order).  Called by every thread; red holds WARPS * STRIDE doubles, warp w's
// totals at w * STRIDE (STRIDE = 0: packed, K).  A fixed stride is the layout some callers' register
// allocation prefers; the sums do not depend on it.  Starts after the shuffles with a barrier, so
// that consecutive calls may share red.
template <int WARPS, int STRIDE = 0, int K>
__device__ __forceinline__ void block_sum(double (&v)[K], double* red) {
    static_assert(STRIDE == 0 || K <= STRIDE, "K values per warp exceed the stride");
    constexpr int kStride = STRIDE ? STRIDE : K;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int off = kWarp / 2; off > 0; off >>= 1) v[k] += __shfl_xor_sync(kFullMask, v[k], off);
    }
    __syncthreads();  // every thread has read the previous reduction's partial sums
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) red[warp * kStride + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int w = 0; w < WARPS; ++w) s += red[w * kStride + k];
        v[k] = s;
    }
}

// The sum of v over the block (threads numbered tid, n_warps warps), valid in thread 0: a tree
// per warp, then warp 0 sums the warps' totals by a tree.  scratch holds one double per warp.
// REUSE: a barrier before scratch is written, so that consecutive calls may share it; otherwise
// the caller orders scratch against its earlier readers.
template <bool REUSE = false>
__device__ __forceinline__ double block_sum_to_first(double v, double* scratch, int tid, int n_warps) {
    v = group_sum_down(v, kWarp);
    const int lane = tid & (kWarp - 1), warp = tid / kWarp;
    if (REUSE) __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? scratch[lane] : 0.0;
        v = group_sum_down(v, kWarp);
    }
    return v;
}

// Teams for the CG template (common/cg.cuh): sum(v) leaves the sums of v[k] over the team in
// every thread of it.  A warp (the core solver's team) ...
struct WarpTeam {
    template <int K>
    __device__ __forceinline__ void sum(double (&v)[K]) const {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
    }
};

// ... and a block of WARPS warps reducing through red (block_sum's layout).
template <int WARPS, int STRIDE = 0>
struct BlockTeam {
    double* red;
    template <int K>
    __device__ __forceinline__ void sum(double (&v)[K]) const {
        block_sum<WARPS, STRIDE>(v, red);
    }
};

}  // namespace gk
