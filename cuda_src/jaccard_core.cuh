// The core every Jaccard variant shares (cuda_src/jaccard.cu has the overview): the per-vertex
// terms of the neighbour-set convention, the raw intersection of two stored rows (merge, gallop),
// its finalization into the Jaccard, Sorensen or overlap value, and the row of an entry.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/reductions.cuh"
#include "jaccard_search.cuh"

namespace jaccard {

using gk::group_sum;

enum Metric : int32_t { kJaccard = 0, kSorensen = 1, kOverlap = 2 };

constexpr int kBlock = 256;
constexpr int kScanItems = 16;  // entries per thread in the work prefix sum
constexpr int kScanTile = kBlock * kScanItems;

template <typename T>
__device__ __forceinline__ T smaller(T a, T b) {
    return a < b ? a : b;
}

// Counts for unweighted similarity, the output type for weighted sums.
template <bool kWeighted, typename T>
using Acc = typename std::conditional<kWeighted, T, int32_t>::type;

// Per-vertex terms of the chosen neighbour-set convention (written by the vertex kernels).
template <typename T>
struct VertexTerms {
    const int32_t* deg;  // unweighted: |N(i)|
    const int32_t* adj;  // unweighted: |N(i) ∩ {i}| minus [i stored in row i], in {-1, 0, 1}
    const T* wsum;       // weighted: sum of w_ik over N(i)
    const T* selfw;      // weighted: the weight to add (sign +1) or remove (sign -1) for k = i
    T sign;
};

// One vertex's unweighted terms, from its stored row length and whether the row stores i itself.
struct CountTerms {
    int32_t deg, adj;
};

__device__ __forceinline__ CountTerms count_terms(int32_t len, int32_t stored, int32_t self_loops) {
    if (self_loops) return {len + 1 - stored, 1 - stored};
    return {len - stored, -stored};
}

// One vertex's weighted terms, from its row's weight sum and stored self-loop weight.
template <typename T>
struct WeightTerms {
    T wsum, selfw;
};

template <typename T>
__device__ __forceinline__ WeightTerms<T> weight_terms(T sum, T loop_w, int32_t found, int32_t self_loops) {
    if (self_loops) return {found ? sum : sum + T(1), found ? T(0) : T(1)};
    return {sum - loop_w, loop_w};
}

// Same arithmetic as graphkern/_cpu/jaccard.pyx: keep the two in step.
template <typename T>
__device__ __forceinline__ T count_ratio(int32_t metric, int64_t inter, int64_t di, int64_t dj) {
    double num, den;
    if (metric == kJaccard) {
        num = (double)inter;
        den = (double)(di + dj - inter);
    } else if (metric == kSorensen) {
        num = 2.0 * (double)inter;
        den = (double)(di + dj);
    } else {
        num = (double)inter;
        den = (double)smaller(di, dj);
    }
    return den > 0.0 ? (T)(num / den) : T(0);
}

template <typename T>
__device__ __forceinline__ T weight_ratio(int32_t metric, T inter, T wi, T wj) {
    T num, den;
    if (metric == kJaccard) {
        num = inter;
        den = wi + wj - inter;
    } else if (metric == kSorensen) {
        num = T(2) * inter;
        den = wi + wj;
    } else {
        num = inter;
        den = smaller(wi, wj);
    }
    return den > T(0) ? num / den : T(0);
}

// The similarity of off-diagonal entry (i, j) from the raw intersection of rows i and j and the
// two vertices' terms (sign: +1 puts every vertex in its own set, -1 drops stored self-loops).
template <typename T>
__device__ __forceinline__ T count_similarity(int32_t metric, int32_t raw, CountTerms a, CountTerms b) {
    return count_ratio<T>(metric, (int64_t)raw + a.adj + b.adj, a.deg, b.deg);
}

template <typename T>
__device__ __forceinline__ T weight_similarity(int32_t metric, T raw, WeightTerms<T> a, WeightTerms<T> b, T w_ij,
                                               T sign) {
    const T inter = raw + sign * (smaller(a.selfw, w_ij) + smaller(b.selfw, w_ij));
    return weight_ratio<T>(metric, inter, a.wsum, b.wsum);
}

template <bool kWeighted, typename T>
__device__ __forceinline__ T finish(int32_t metric, Acc<kWeighted, T> raw, int32_t i, int32_t j, T w_ij,
                                    const VertexTerms<T>& v) {
    if constexpr (kWeighted) {
        return weight_similarity<T>(metric, raw, {v.wsum[i], v.selfw[i]}, {v.wsum[j], v.selfw[j]}, w_ij, v.sign);
    } else {
        return count_similarity<T>(metric, raw, {v.deg[i], v.adj[i]}, {v.deg[j], v.adj[j]});
    }
}

template <bool kWeighted, typename T>
__device__ __forceinline__ Acc<kWeighted, T> match_value(const T* __restrict__ w, int64_t a, int64_t b) {
    if constexpr (kWeighted) return smaller(w[a], w[b]);
    else return 1;
}

// Branch-free merge of two sorted rows (the paper's inner loop); `I` is the type of the offsets
// inside the rows: int32 where rows are known to be short saves an instruction per index.
template <bool kWeighted, typename T, typename I>
__device__ __forceinline__ Acc<kWeighted, T> merge_rows(const int32_t* __restrict__ a, const T* __restrict__ wa,
                                                       I la, const int32_t* __restrict__ b,
                                                       const T* __restrict__ wb, I lb) {
    Acc<kWeighted, T> acc = 0;
    I p = 0, q = 0;
    while (p < la && q < lb) {
        const int32_t x = a[p], y = b[q];
        if constexpr (kWeighted) {
            if (x == y) acc += smaller(wa[p], wb[q]);
        } else {
            acc += (x == y);
        }
        p += (x <= y);
        q += (y <= x);
    }
    return acc;
}

// Rows [a, a_end) and [b, b_end) of the CSR arrays idx and w (w unused when unweighted).
template <bool kWeighted, typename T>
__device__ __forceinline__ Acc<kWeighted, T> merge_intersection(const int32_t* __restrict__ idx,
                                                               const T* __restrict__ w, int64_t a, int64_t a_end,
                                                               int64_t b, int64_t b_end) {
    return merge_rows<kWeighted, T, int64_t>(idx + a, kWeighted ? w + a : nullptr, a_end - a, idx + b,
                                             kWeighted ? w + b : nullptr, b_end - b);
}

// Every `step`-th element of the short range [s, s_end) galloped through the long range.
template <bool kWeighted, typename T>
__device__ __forceinline__ Acc<kWeighted, T> gallop_intersection(const int32_t* __restrict__ idx,
                                                                const T* __restrict__ w, int64_t s, int64_t s_end,
                                                                int64_t step, int64_t l, int64_t l_end) {
    Acc<kWeighted, T> acc = 0;
    int64_t p = l;
    for (; s < s_end; s += step) {
        const int32_t x = idx[s];
        p = gallop_lower_bound(idx, p, l_end, x);
        if (p == l_end) break;  // the rest of the short range is larger than the whole long one
        if (idx[p] == x) {
            acc += match_value<kWeighted, T>(w, s, p);
            ++p;
        }
    }
    return acc;
}

struct RowPair {
    int64_t short_begin, short_end, long_begin, long_end;
    int32_t long_vertex;
};

// Whether i is the long side of pair {i, j}: the larger degree, the larger index on a tie (the
// owner rule of graphkern/_cpu/jaccard.pyx).  The rule depends on the pair, not on the order of
// its arguments, so the work prefix sum, the balanced kernel and its finalize pass agree on it
// whichever of (i, j) and (j, i) they look at.
__device__ __forceinline__ bool is_long_side(int32_t i, int64_t di, int32_t j, int64_t dj) {
    return di > dj || (di == dj && i > j);
}

__device__ __forceinline__ RowPair row_pair(const int64_t* __restrict__ indptr, int32_t i, int32_t j) {
    const int64_t a = indptr[i], a_end = indptr[i + 1], b = indptr[j], b_end = indptr[j + 1];
    if (is_long_side(i, a_end - a, j, b_end - b)) return {b, b_end, a, a_end, i};
    return {a, a_end, b, b_end, j};
}

// The row whose entry of pair {i, j} carries its work in the balanced, hub and longrow variants:
// the long side when long_owner is set (longrow) or when that vertex has a hub bitmap (hub_slot
// non-null and >= 0), else the smaller index.
__device__ __forceinline__ int32_t owner_row(const int64_t* __restrict__ indptr, const int32_t* __restrict__ hub_slot,
                                             int32_t long_owner, int32_t i, int32_t j) {
    if (long_owner || hub_slot != nullptr) {
        const int32_t l = is_long_side(i, indptr[i + 1] - indptr[i], j, indptr[j + 1] - indptr[j]) ? i : j;
        if (long_owner || hub_slot[l] >= 0) return l;
    }
    return i < j ? i : j;
}

// ------------------------------------------------------------------ per-vertex terms

__device__ __forceinline__ void vertex_counts(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                              int32_t n, int32_t self_loops, int32_t* __restrict__ deg,
                                              int32_t* __restrict__ adj) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t b = indptr[i], e = indptr[i + 1];
    const int64_t p = lower_bound(idx, b, e, (int32_t)i);
    const int32_t stored = (p < e && idx[p] == (int32_t)i) ? 1 : 0;
    const CountTerms t = count_terms((int32_t)(e - b), stored, self_loops);
    deg[i] = t.deg;
    adj[i] = t.adj;
}

// A warp per row: the row's weight sum and its stored self-loop weight.
template <typename T>
__device__ __forceinline__ void vertex_weights(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                               const T* __restrict__ w, int32_t n, int32_t self_loops,
                                               T* __restrict__ wsum, T* __restrict__ selfw) {
    const int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (i >= n) return;  // warp-uniform
    T sum = 0, loop_w = 0;
    int32_t found = 0;
    for (int64_t k = indptr[i] + lane; k < indptr[i + 1]; k += 32) {
        sum += w[k];
        if (idx[k] == (int32_t)i) {
            loop_w = w[k];
            found = 1;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_xor_sync(kFullMask, sum, off);
        loop_w += __shfl_xor_sync(kFullMask, loop_w, off);
        found |= __shfl_xor_sync(kFullMask, found, off);
    }
    if (lane != 0) return;
    const WeightTerms<T> t = weight_terms<T>(sum, loop_w, found, self_loops);
    wsum[i] = t.wsum;
    selfw[i] = t.selfw;
}

struct Entry {
    int64_t k;  // -1: past the last entry
    int32_t i, j;
};

// The entry of this thread's group of `group` consecutive lanes (one entry per thread when 1),
// among the entries [start, end) of a launch.  Every thread of the block must call it.
__device__ __forceinline__ Entry group_entry(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                             int32_t n, int64_t start, int64_t nnz, int32_t group) {
    const int32_t per_block = blockDim.x / group;
    const int64_t first = start + blockIdx.x * (int64_t)per_block;
    const int64_t k = first + threadIdx.x / group;
    const int32_t i = block_entry_row(indptr, n, k, first, min(nnz - 1, first + per_block - 1));
    if (k >= nnz) return {-1, 0, 0};
    return {k, i, idx[k]};
}

}  // namespace jaccard
