// Jaccard, Sorensen and overlap similarity on every stored entry (i, j) of a symmetric CSR
// (graphkern/jaccard.py launches these; graphkern/_cpu/jaccard.pyx is the CPU twin).
//
// How the pieces fit:
//  * Kernels intersect the raw stored rows i and j, self-loops included.  The per-vertex terms
//    written by jaccard_vertex_counts / jaccard_vertex_weights_* turn that raw intersection into
//    the intersection of the neighbour sets the caller asked for (self-loops dropped, or every
//    vertex put in its own set) and give each vertex its set's size or weight sum.
//  * Unweighted counts are exact integers and the ratio is divided in double before the cast to
//    the output type, so the CPU and every GPU variant give bit-identical results.  Weighted sums
//    (sum of min(w_ik, w_jk) over the intersection) accumulate in the output type.
//  * Variants (graphkern.jaccard(variant=...)):
//      element   the paper's baseline: a thread per stored entry merges both rows; every entry,
//                both triangles, computed on its own.
//      binary    a thread per upper-triangle entry gallops each element of the shorter row
//                through the longer one, then writes the entry and its mirror (j, i).
//      warp      a group of G lanes per upper-triangle entry shares the shorter row's elements.
//      balanced  the work of upper entry (i, j) is min(d_i, d_j) searches; a prefix sum over
//                entries lays all of it on one line and every thread takes `chunk` consecutive
//                searches, so a hub-to-hub entry is spread over many threads; partial counts meet
//                through warp-aggregated atomics, and a finalize pass writes every entry.
#include <cstdint>
#include <type_traits>

#include "jaccard_search.cuh"

namespace jaccard {

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

// The similarity of off-diagonal entry (i, j) from the raw intersection of rows i and j.
template <bool kWeighted, typename T>
__device__ __forceinline__ T finish(int32_t metric, Acc<kWeighted, T> raw, int32_t i, int32_t j, T w_ij,
                                    const VertexTerms<T>& v) {
    if constexpr (kWeighted) {
        const T inter = raw + v.sign * (smaller(v.selfw[i], w_ij) + smaller(v.selfw[j], w_ij));
        return weight_ratio<T>(metric, inter, v.wsum[i], v.wsum[j]);
    } else {
        const int64_t inter = (int64_t)raw + v.adj[i] + v.adj[j];
        return count_ratio<T>(metric, inter, v.deg[i], v.deg[j]);
    }
}

template <bool kWeighted, typename T>
__device__ __forceinline__ Acc<kWeighted, T> match_value(const T* __restrict__ w, int64_t a, int64_t b) {
    if constexpr (kWeighted) return smaller(w[a], w[b]);
    else return 1;
}

// Branch-free merge of two sorted rows (the paper's inner loop).
template <bool kWeighted, typename T>
__device__ __forceinline__ Acc<kWeighted, T> merge_intersection(const int32_t* __restrict__ idx,
                                                               const T* __restrict__ w, int64_t a, int64_t a_end,
                                                               int64_t b, int64_t b_end) {
    Acc<kWeighted, T> acc = 0;
    while (a < a_end && b < b_end) {
        const int32_t x = idx[a], y = idx[b];
        if constexpr (kWeighted) {
            if (x == y) acc += smaller(w[a], w[b]);
        } else {
            acc += (x == y);
        }
        a += (x <= y);
        b += (y <= x);
    }
    return acc;
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
};

// The shorter of rows i and j (row i on a tie): the same rule in the work prefix sum and in the
// balanced kernel, which must agree on what item s of an entry is.
__device__ __forceinline__ RowPair row_pair(const int64_t* __restrict__ indptr, int32_t i, int32_t j) {
    const int64_t a = indptr[i], a_end = indptr[i + 1], b = indptr[j], b_end = indptr[j + 1];
    if (a_end - a <= b_end - b) return {a, a_end, b, b_end};
    return {b, b_end, a, a_end};
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
    const int32_t len = (int32_t)(e - b);
    if (self_loops) {
        deg[i] = len + 1 - stored;
        adj[i] = 1 - stored;
    } else {
        deg[i] = len - stored;
        adj[i] = -stored;
    }
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
    if (self_loops) {
        wsum[i] = found ? sum : sum + T(1);
        selfw[i] = found ? T(0) : T(1);
    } else {
        wsum[i] = sum - loop_w;
        selfw[i] = loop_w;
    }
}

// ------------------------------------------------------------------ fused variants

#define JACCARD_SIMILARITY_PARAMS(T)                                                                       \
    const int64_t *__restrict__ indptr, const int32_t *__restrict__ idx, const T *__restrict__ w, int32_t n, \
        int64_t nnz, int32_t metric, const int32_t *__restrict__ deg, const int32_t *__restrict__ adj,     \
        const T *__restrict__ wsum, const T *__restrict__ selfw, T sign, T *__restrict__ out
#define JACCARD_SIMILARITY_ARGS(T) indptr, idx, w, n, nnz, metric, VertexTerms<T>{deg, adj, wsum, selfw, sign}, out

struct Entry {
    int64_t k;  // -1: past the last entry
    int32_t i, j;
};

// The entry of this thread's group of `group` consecutive lanes (one entry per thread when 1).
// Every thread of the block must call it.
__device__ __forceinline__ Entry group_entry(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                             int32_t n, int64_t nnz, int32_t group) {
    const int32_t per_block = blockDim.x / group;
    const int64_t first = blockIdx.x * (int64_t)per_block;
    const int64_t k = first + threadIdx.x / group;
    const int32_t i = block_entry_row(indptr, n, k, first, min(nnz - 1, first + per_block - 1));
    if (k >= nnz) return {-1, 0, 0};
    return {k, i, idx[k]};
}

template <bool kWeighted, typename T>
__device__ __forceinline__ void element_similarity(const int64_t* __restrict__ indptr,
                                                   const int32_t* __restrict__ idx, const T* __restrict__ w,
                                                   int32_t n, int64_t nnz, int32_t metric, const VertexTerms<T>& v,
                                                   T* __restrict__ out) {
    const Entry e = group_entry(indptr, idx, n, nnz, 1);
    if (e.k < 0) return;
    if (e.i == e.j) {
        out[e.k] = T(1);
        return;
    }
    const auto raw = merge_intersection<kWeighted, T>(idx, w, indptr[e.i], indptr[e.i + 1], indptr[e.j],
                                                      indptr[e.j + 1]);
    out[e.k] = finish<kWeighted, T>(metric, raw, e.i, e.j, kWeighted ? w[e.k] : T(1), v);
}

// Writes the similarity of upper entry k = (i, j) into k and into the mirror entry (j, i).
template <bool kWeighted, typename T>
__device__ __forceinline__ void write_pair(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                           const T* __restrict__ w, int32_t metric, const VertexTerms<T>& v,
                                           int64_t k, int32_t i, int32_t j, Acc<kWeighted, T> raw,
                                           T* __restrict__ out) {
    const T value = finish<kWeighted, T>(metric, raw, i, j, kWeighted ? w[k] : T(1), v);
    out[k] = value;
    out[lower_bound(idx, indptr[j], indptr[j + 1], i)] = value;
}

template <bool kWeighted, typename T>
__device__ __forceinline__ void binary_similarity(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                  const T* __restrict__ w, int32_t n, int64_t nnz, int32_t metric,
                                                  const VertexTerms<T>& v, T* __restrict__ out) {
    const Entry e = group_entry(indptr, idx, n, nnz, 1);
    if (e.k < 0 || e.j < e.i) return;  // a lower entry is written by its mirror's thread
    if (e.j == e.i) {
        out[e.k] = T(1);
        return;
    }
    const RowPair r = row_pair(indptr, e.i, e.j);
    const auto raw = gallop_intersection<kWeighted, T>(idx, w, r.short_begin, r.short_end, 1, r.long_begin, r.long_end);
    write_pair<kWeighted, T>(indptr, idx, w, metric, v, e.k, e.i, e.j, raw, out);
}

// `group` lanes (a power of two, at most 32) per entry, each taking every group-th element of
// the shorter row; the group's sum meets by shuffles within the group's lanes only.
template <bool kWeighted, typename T>
__device__ __forceinline__ void warp_similarity(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                const T* __restrict__ w, int32_t n, int64_t nnz, int32_t metric,
                                                const VertexTerms<T>& v, T* __restrict__ out, int32_t group) {
    const int32_t rank = threadIdx.x % group;
    const Entry e = group_entry(indptr, idx, n, nnz, group);
    if (e.k < 0 || e.j < e.i) return;  // uniform within a group, as is the diagonal case
    if (e.j == e.i) {
        if (rank == 0) out[e.k] = T(1);
        return;
    }
    const RowPair r = row_pair(indptr, e.i, e.j);
    auto acc = gallop_intersection<kWeighted, T>(idx, w, r.short_begin + rank, r.short_end, group, r.long_begin,
                                                 r.long_end);
    const int lane = threadIdx.x & 31;
    const unsigned mask = group == 32 ? kFullMask : ((1u << group) - 1u) << (lane & ~(group - 1));
    for (int off = group >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(mask, acc, off);
    if (rank == 0) write_pair<kWeighted, T>(indptr, idx, w, metric, v, e.k, e.i, e.j, acc, out);
}

// ------------------------------------------------------------------ balanced variant

// Work of entry k: min(d_i, d_j) searches for an upper entry, none otherwise.  Also writes the
// row of every entry (the later passes read it instead of searching indptr) and each tile's sum.
__device__ __forceinline__ void balanced_work(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                              int32_t n, int64_t nnz, int32_t* __restrict__ rows,
                                              int64_t* __restrict__ work, int64_t* __restrict__ tile_sums) {
    const int64_t tile = blockIdx.x * (int64_t)kScanTile;
    const int64_t tile_last = min(nnz - 1, tile + kScanTile - 1);
    const int64_t k_first = tile + (int64_t)threadIdx.x * kScanItems;
    int64_t r = block_entry_row(indptr, n, k_first, tile, tile_last);
    int64_t sum = 0;
    for (int q = 0; q < kScanItems; ++q) {
        const int64_t k = k_first + q;
        if (k >= nnz) break;
        while (indptr[r + 1] <= k) ++r;
        rows[k] = (int32_t)r;
        const int32_t j = idx[k];
        int64_t wk = 0;
        if (r < j) wk = smaller(indptr[r + 1] - indptr[r], indptr[j + 1] - indptr[j]);
        work[k] = wk;
        sum += wk;
    }
    int64_t total;
    block_exclusive_scan(sum, &total);
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// One block: exclusive prefix sum of the tile sums in place; the grand total goes to *work_total.
__device__ __forceinline__ void scan_tile_sums(int64_t* __restrict__ tile_sums, int64_t n_tiles,
                                               int64_t* __restrict__ work_total) {
    int64_t carry = 0;
    for (int64_t base = 0; base < n_tiles; base += blockDim.x) {
        const int64_t k = base + threadIdx.x;
        const int64_t v = k < n_tiles ? tile_sums[k] : 0;
        int64_t total;
        const int64_t before = block_exclusive_scan(v, &total);
        if (k < n_tiles) tile_sums[k] = carry + before;
        carry += total;
    }
    if (threadIdx.x == 0) *work_total = carry;
}

// Turns the per-entry work of one tile into exclusive offsets (in place).
__device__ __forceinline__ void scan_tiles(int64_t* __restrict__ work, int64_t nnz,
                                           const int64_t* __restrict__ tile_sums) {
    const int64_t k_first = blockIdx.x * (int64_t)kScanTile + (int64_t)threadIdx.x * kScanItems;
    int64_t v[kScanItems];
    int64_t local = 0;
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        v[q] = k_first + q < nnz ? work[k_first + q] : 0;
        local += v[q];
    }
    int64_t total;
    int64_t run = tile_sums[blockIdx.x] + block_exclusive_scan(local, &total);
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        if (k_first + q < nnz) work[k_first + q] = run;
        run += v[q];
    }
}

// Work item t of entry e (offsets[e] <= t < offsets[e + 1]) is element t - offsets[e] of the
// shorter row, galloped through the longer one.  Threads take `chunk` consecutive items; the 32
// lanes of a warp take 32 consecutive chunks, so lanes that end inside the same entry add their
// partial sums by a segmented shuffle reduction before one atomic per entry.  The grid is
// persistent (grid-stride over warps of chunks); the total work is read from offsets[nnz], so
// the host never waits for the prefix sum.
template <bool kWeighted, typename T>
__device__ __forceinline__ void balanced_intersections(const int64_t* __restrict__ indptr,
                                                       const int32_t* __restrict__ idx, const T* __restrict__ w,
                                                       const int32_t* __restrict__ rows,
                                                       const int64_t* __restrict__ offsets, int64_t nnz,
                                                       int32_t chunk, Acc<kWeighted, T>* __restrict__ inter) {
    using A = Acc<kWeighted, T>;
    const int64_t total_work = offsets[nnz];
    const int64_t n_chunks = (total_work + chunk - 1) / chunk;
    const int lane = threadIdx.x & 31;
    const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int64_t n_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t c0 = warp * 32; c0 < n_chunks; c0 += n_warps * 32) {  // warp-uniform
        const int64_t c = c0 + lane;
        int64_t e = -1;
        A acc = 0;
        if (c < n_chunks) {
            int64_t t = c * chunk;
            const int64_t t_end = min(total_work, t + chunk);
            e = last_not_above(offsets, 0, nnz, t);
            int64_t off_cur = offsets[e], off_next = offsets[e + 1];
            while (true) {
                const RowPair r = row_pair(indptr, rows[e], idx[e]);
                const int64_t stop = min(off_next, t_end);
                int64_t p = r.long_begin;
                for (int64_t s = r.short_begin + (t - off_cur); t < stop; ++t, ++s) {
                    const int32_t x = idx[s];
                    p = gallop_lower_bound(idx, p, r.long_end, x);
                    if (p == r.long_end) {  // nothing left of this entry can match
                        t = stop;
                        break;
                    }
                    if (idx[p] == x) {
                        acc += match_value<kWeighted, T>(w, s, p);
                        ++p;
                    }
                }
                if (t >= t_end) break;
                if (acc != A(0)) atomicAdd(inter + e, acc);  // entry e ended inside this chunk
                acc = 0;
                do {  // skip entries without work (lower triangle, diagonal, empty rows)
                    ++e;
                    off_cur = off_next;
                    off_next = offsets[e + 1];
                } while (off_next <= t);
            }
        }
        // lanes' last entries are non-decreasing in lane order (chunks are consecutive), so equal
        // entries form runs: a segmented suffix sum leaves each run's total on its first lane
        for (int off = 1; off < 32; off <<= 1) {
            const A other = __shfl_down_sync(kFullMask, acc, off);
            const int64_t other_e = __shfl_down_sync(kFullMask, e, off);
            if (lane + off < 32 && other_e == e) acc += other;
        }
        const int64_t prev_e = __shfl_up_sync(kFullMask, e, 1);
        if (e >= 0 && (lane == 0 || prev_e != e) && acc != A(0)) atomicAdd(inter + e, acc);
    }
}

template <bool kWeighted, typename T>
__device__ __forceinline__ void balanced_finalize(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                  const T* __restrict__ w, const int32_t* __restrict__ rows,
                                                  int64_t nnz, int32_t metric, const VertexTerms<T>& v,
                                                  const Acc<kWeighted, T>* __restrict__ inter, T* __restrict__ out) {
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k >= nnz) return;
    const int32_t i = rows[k], j = idx[k];
    if (i == j) {
        out[k] = T(1);
        return;
    }
    const int64_t upper = i < j ? k : lower_bound(idx, indptr[j], indptr[j + 1], i);
    out[k] = finish<kWeighted, T>(metric, inter[upper], i, j, kWeighted ? w[k] : T(1), v);
}

}  // namespace jaccard

using namespace jaccard;

// ------------------------------------------------------------------ entry points

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_vertex_counts(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx, int32_t n,
                          int32_t self_loops, int32_t* __restrict__ deg, int32_t* __restrict__ adj) {
    vertex_counts(indptr, idx, n, self_loops, deg, adj);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_balanced_work(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx, int32_t n, int64_t nnz,
                          int32_t* __restrict__ rows, int64_t* __restrict__ work, int64_t* __restrict__ tile_sums) {
    balanced_work(indptr, idx, n, nnz, rows, work, tile_sums);
}

extern "C" __global__ void __launch_bounds__(1024)
    jaccard_scan_tile_sums(int64_t* __restrict__ tile_sums, int64_t n_tiles, int64_t* __restrict__ work_total) {
    scan_tile_sums(tile_sums, n_tiles, work_total);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_scan_tiles(int64_t* __restrict__ work, int64_t nnz, const int64_t* __restrict__ tile_sums) {
    scan_tiles(work, nnz, tile_sums);
}

// Entry points per flavour: count (unweighted; `w`, `wsum`, `selfw` unused) or weight, and the
// output type (f32 / f64).
#define JACCARD_FLAVOURS(X)       \
    X(count, false, float, f32)   \
    X(count, false, double, f64)  \
    X(weight, true, float, f32)   \
    X(weight, true, double, f64)

#define JACCARD_ENTRY_POINTS(kind, W, T, sfx)                                                                    \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_element_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T)) {                                           \
        element_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T));                                                       \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_binary_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T)) {                                            \
        binary_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T));                                                        \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_warp_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t group) {                               \
        warp_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T), group);                                                   \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_balanced_##kind##_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,     \
                                        const T* __restrict__ w, const int32_t* __restrict__ rows,               \
                                        const int64_t* __restrict__ offsets, int64_t nnz, int32_t chunk,         \
                                        Acc<W, T>* __restrict__ inter) {                                         \
        balanced_intersections<W, T>(indptr, idx, w, rows, offsets, nnz, chunk, inter);                        \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_finalize_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), const int32_t* __restrict__ rows,          \
                                        const Acc<W, T>* __restrict__ inter) {                                   \
        balanced_finalize<W, T>(indptr, idx, w, rows, nnz, metric, VertexTerms<T>{deg, adj, wsum, selfw, sign},  \
                                inter, out);                                                                     \
    }

JACCARD_FLAVOURS(JACCARD_ENTRY_POINTS)

#define JACCARD_WEIGHT_ENTRY_POINTS(T, sfx)                                                                        \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                           \
        jaccard_vertex_weights_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,          \
                                     const T* __restrict__ w, int32_t n, int32_t self_loops, T* __restrict__ wsum, \
                                     T* __restrict__ selfw) {                                                      \
        vertex_weights<T>(indptr, idx, w, n, self_loops, wsum, selfw);                                             \
    }

JACCARD_WEIGHT_ENTRY_POINTS(float, f32)
JACCARD_WEIGHT_ENTRY_POINTS(double, f64)
