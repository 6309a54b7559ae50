// The pair, staged and window variants of cuda_src/jaccard.cu: a block lists the upper entries of
// its rows and a thread merges each pair once (scalar or vector merges), or finds near pairs from
// row masks, and writes both entries.
#pragma once

#include "jaccard_core.cuh"

namespace jaccard {

// ------------------------------------------------------------------ pair variant

constexpr int32_t kPairList = 2048;  // upper entries a block lists in shared memory per pass

// First offset r in [0, len) with row[r] >= x, or len.
__device__ __forceinline__ int32_t row_lower_bound(const int32_t* __restrict__ row, int32_t len, int32_t x) {
    int32_t lo = 0;
    while (len > 0) {
        const int32_t half = len >> 1;
        if (row[lo + half] < x) {
            lo += half + 1;
            len -= half + 1;
        } else {
            len = half;
        }
    }
    return lo;
}

// |a ∩ b| for the rows a = N(i), b = N(j) (i < j), with the offset of i in b (the mirror entry:
// b stores i in a symmetric input; lb if not) and whether b stores j.  Both offsets are the
// first element of b at or above i, j: the merge notes them as its walk over b passes them and
// searches only the part of b it did not reach, instead of two binary searches of all of b
// after the merge (a quarter of the scalar pair's dependent loads on small-world rows).
struct MergeMirror {
    int32_t count, mirror, j_stored;
};

__device__ __forceinline__ MergeMirror merge_count_mirror(const int32_t* __restrict__ a, int32_t la,
                                                          const int32_t* __restrict__ b, int32_t lb, int32_t i,
                                                          int32_t j) {
    int32_t count = 0, p = 0, q = 0;
    int32_t at_i = -1, at_j = -1;  // first q with b[q] >= i, >= j, once the walk has seen it
    while (p < la && q < lb) {
        const int32_t x = a[p], y = b[q];
        at_i = (at_i < 0 && y >= i) ? q : at_i;
        at_j = (at_j < 0 && y >= j) ? q : at_j;
        count += (x == y);
        p += (x <= y);
        q += (y <= x);
    }
    if (at_i < 0) at_i = q + row_lower_bound(b + q, lb - q, i);
    if (at_j < 0) at_j = at_i + row_lower_bound(b + at_i, lb - at_i, j);  // j > i
    MergeMirror r;
    r.count = count;
    r.mirror = (at_i < lb && b[at_i] == i) ? at_i : lb;
    r.j_stored = (at_j < lb && b[at_j] == j) ? 1 : 0;
    return r;
}

// ---- the pair variant's vector merge (unweighted): rows read V aligned elements per load

template <int V>
struct IntVector;
template <>
struct IntVector<2> {
    using type = int2;
};
template <>
struct IntVector<4> {
    using type = int4;
};

// Stand-ins for the elements of an aligned block that lie outside its row, below the row
// (kBefore*) and after it (kAfter*): sorted with the row's elements (every vertex index lies in
// [0, 2^31 - 3], the host's limit for the vector merge) and never equal across the two rows.
constexpr int32_t kBeforeA = -1, kBeforeB = -2;
constexpr int32_t kAfterA = 0x7fffffff, kAfterB = 0x7ffffffe;

// Elements row[pos .. pos + V) (row + pos aligned to V elements), those outside [0, len) replaced
// by `before` and `after`.  The caller's buffer is padded to a multiple of 4 elements, so the
// aligned load never leaves it.
template <int V>
__device__ __forceinline__ void load_row_block(const int32_t* __restrict__ row, int32_t pos, int32_t len,
                                               int32_t before, int32_t after, int32_t (&x)[V]) {
    const auto v = *reinterpret_cast<const typename IntVector<V>::type*>(row + pos);
    int32_t raw[V];
    if constexpr (V == 2) {
        raw[0] = v.x, raw[1] = v.y;
    } else {
        raw[0] = v.x, raw[1] = v.y, raw[2] = v.z, raw[3] = v.w;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = pos + e < 0 ? before : (pos + e >= len ? after : raw[e]);
}

// Offset (<= 0) of the aligned block holding a row's first element: the index buffer starts
// aligned, so the row's position modulo V says it.
template <int V>
__device__ __forceinline__ int32_t first_block(int64_t row_begin) {
    return -(int32_t)(row_begin & (V - 1));
}

// |row a ∩ row b| by blocks of V: all V x V pairs of the two current blocks are compared, then
// the block with the smaller last element moves on (both on a tie).  A match (x, x) is counted
// when the blocks holding it meet, which happens exactly once in sorted rows without repeats.
// Against the scalar merge's two 4-byte loads per step, this issues one V-wide load per V
// elements: a warp whose lanes merge rows scattered over a few cache lines pays the L1 by
// wavefronts per load instruction, so fewer, wider loads are what shorten the merge.
template <int V>
__device__ __forceinline__ int32_t block_merge_count(const int32_t* __restrict__ a_row, int64_t a_begin, int32_t la,
                                                     const int32_t* __restrict__ b_row, int64_t b_begin,
                                                     int32_t lb) {
    int32_t pa = first_block<V>(a_begin), pb = first_block<V>(b_begin);
    int32_t x[V], y[V];
    load_row_block<V>(a_row, pa, la, kBeforeA, kAfterA, x);
    load_row_block<V>(b_row, pb, lb, kBeforeB, kAfterB, y);
    int32_t count = 0;
    while (true) {
#pragma unroll
        for (int e = 0; e < V; ++e)
#pragma unroll
            for (int f = 0; f < V; ++f) count += (x[e] == y[f]);
        const int32_t x_last = x[V - 1], y_last = y[V - 1];
        if (x_last <= y_last) {
            pa += V;
            if (pa >= la) break;
            load_row_block<V>(a_row, pa, la, kBeforeA, kAfterA, x);
        }
        if (y_last <= x_last) {
            pb += V;
            if (pb >= lb) break;
            load_row_block<V>(b_row, pb, lb, kBeforeB, kAfterB, y);
        }
    }
    return count;
}

struct MirrorSlot {
    int32_t offset;    // elements of row j below i: the offset of (j, i) in row j
    int32_t j_stored;  // row j stores j
};

// Row j scanned by blocks (L1-resident after the merge) up to the block that reaches j; i < j.
// Outside elements count as neither below i nor equal to j.
template <int V>
__device__ __forceinline__ MirrorSlot mirror_slot(const int32_t* __restrict__ b_row, int64_t b_begin, int32_t lb,
                                                  int32_t i, int32_t j) {
    MirrorSlot m{0, 0};
    for (int32_t pb = first_block<V>(b_begin); pb < lb; pb += V) {
        int32_t y[V];
        load_row_block<V>(b_row, pb, lb, kAfterA, kAfterA, y);
#pragma unroll
        for (int f = 0; f < V; ++f) {
            m.offset += (y[f] < i);
            m.j_stored |= (y[f] == j);
        }
        if (y[V - 1] >= j) break;  // an outside element here is kAfterA, past j too
    }
    return m;
}

// Upper entry k = (i, j), i < j: merges rows i and j, writes k and its mirror (j, i).  Unweighted
// terms come from searches of the rows the merge has just brought into L1 (i_stored: row i
// stores i); weighted ones from the vertex kernel.  V > 1 (unweighted only): the vector merge.
template <bool kWeighted, typename T, int V>
__device__ __forceinline__ void pair_entry(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                           const T* __restrict__ w, int32_t metric, int32_t self_loops,
                                           const VertexTerms<T>& v, int64_t k, int32_t i, int32_t i_stored,
                                           T* __restrict__ out) {
    static_assert(V == 1 || !kWeighted, "the vector merge counts; weighted pairs merge by element");
    const int32_t j = idx[k];
    const int64_t a0 = indptr[i], b0 = indptr[j];
    const int32_t la = (int32_t)(indptr[i + 1] - a0), lb = (int32_t)(indptr[j + 1] - b0);
    if constexpr (V > 1) {
        const int32_t raw = block_merge_count<V>(idx + a0, a0, la, idx + b0, b0, lb);
        const MirrorSlot m = mirror_slot<V>(idx + b0, b0, lb, i, j);
        if (m.offset >= lb) return;  // never for a validated input; no write past row j if it were not
        const T value = count_similarity<T>(metric, raw, count_terms(la, i_stored, self_loops),
                                            count_terms(lb, m.j_stored, self_loops));
        out[k] = value;
        out[b0 + m.offset] = value;
        return;
    }
    if constexpr (!kWeighted) {
        const MergeMirror mm = merge_count_mirror(idx + a0, la, idx + b0, lb, i, j);
        if (mm.mirror >= lb) return;  // never for a validated input; no write past row j if it were not
        const T value = count_similarity<T>(metric, mm.count, count_terms(la, i_stored, self_loops),
                                            count_terms(lb, mm.j_stored, self_loops));
        out[k] = value;
        out[b0 + mm.mirror] = value;
        return;
    }
    const auto raw = merge_rows<kWeighted, T, int32_t>(idx + a0, w + a0, la, idx + b0, w + b0, lb);
    const int32_t m = row_lower_bound(idx + b0, lb, i);  // row j stores i: the input is symmetric
    if (m >= lb) return;  // never for a validated input; no write past row j if it were not
    const T value = finish<kWeighted, T>(metric, raw, i, j, w[k], v);
    out[k] = value;
    out[b0 + m] = value;
}

// Block b takes rows [b R, b R + R) (R = rows_per_block <= blockDim.x).  Thread t < R finds the
// upper entries (j > i) of its row i = b R + t and writes the diagonal entry; a block-wide scan
// lists the block's upper entries in shared memory, and every thread of the block takes one
// listed entry at a time: a thread per undirected pair, with the lanes of a warp on consecutive
// pairs of a few neighbouring rows (whose lists share cache lines) and none idle on lower
// entries.  A block with more than kPairList upper entries lists them in several passes, so the
// kernel is correct on any graph (if slow where rows are long: a thread merges whole lists).
// The lower entries are the mirrors of upper ones.
template <bool kWeighted, typename T, int V>
__device__ __forceinline__ void pair_similarity(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                const T* __restrict__ w, int32_t n, int32_t metric,
                                                int32_t self_loops, const VertexTerms<T>& v, T* __restrict__ out,
                                                int32_t rows_per_block) {
    __shared__ int64_t listed_entry[kPairList];
    __shared__ uint8_t listed_row[kPairList];  // the entry's row minus the block's first row
    __shared__ uint8_t row_stored[kBlock];     // whether that row stores its own index
    const int64_t first_row = blockIdx.x * (int64_t)rows_per_block;
    const int32_t t = threadIdx.x;
    const bool has_row = t < rows_per_block && first_row + t < n;
    const int32_t i = (int32_t)(first_row + t);
    int64_t upper = 0, count = 0;
    if (has_row) {
        const int64_t b = indptr[i], e = indptr[i + 1];
        const int64_t p = lower_bound(idx, b, e, i);
        const int32_t stored = (p < e && idx[p] == i) ? 1 : 0;
        if (stored) out[p] = T(1);
        row_stored[t] = (uint8_t)stored;
        upper = p + stored;
        count = e - upper;
    }
    int64_t total;
    const int64_t at = block_exclusive_scan(count, &total);  // ends with a barrier
    for (int64_t base = 0; base < total; base += kPairList) {  // block-uniform: total is the block's sum
        const int64_t lo = at > base ? at : base;
        const int64_t hi = smaller(at + count, base + kPairList);
        for (int64_t u = lo; u < hi; ++u) {
            listed_entry[u - base] = upper + (u - at);
            listed_row[u - base] = (uint8_t)t;
        }
        __syncthreads();
        const int32_t listed = (int32_t)smaller(total - base, (int64_t)kPairList);
        for (int32_t u = t; u < listed; u += blockDim.x) {
            const int32_t r = listed_row[u];
            pair_entry<kWeighted, T, V>(indptr, idx, w, metric, self_loops, v, listed_entry[u],
                                     (int32_t)(first_row + r), row_stored[r], out);
        }
        __syncthreads();  // the list is read before the next pass overwrites it
    }
}

// ---- the staged variant: the pair variant with the block's own rows in shared memory

constexpr int32_t kStageCap = 2048;  // column indices a block stages

// The pair variant (unweighted) for graphs stored in an order that keeps neighbours close
// (meshes, small-world rings, road networks, RCM or space-filling-curve orders).  Block b takes
// rows [b R, b R + R) like the pair variant, but first copies its rows' column indices
// (coalesced, at most kStageCap of them) and row offsets into shared memory: a pair (i, j) whose
// row j is also one of the block's rows merges two shared-memory rows instead of chasing
// dependent global loads, and only pairs that leave the block read row j from global memory
// (the merge takes generic pointers, so both cases share one code path).  A block whose rows hold
// more than kStageCap entries reads every row from global memory, so the kernel is correct on any
// graph; the entries are listed in passes of kStageCap.
template <typename T>
__device__ __forceinline__ void staged_similarity(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                  int32_t n, int32_t metric, int32_t self_loops, T* __restrict__ out,
                                                  int32_t rows_per_block) {
    __shared__ int32_t s_idx[kStageCap];
    __shared__ int32_t s_ptr[kBlock + 1];      // staged rows: offsets into s_idx
    __shared__ int64_t row_begin[kBlock + 1];  // the block's row pointers
    __shared__ int32_t listed_off[kStageCap];  // a listed entry's offset in its row
    __shared__ uint8_t listed_row[kStageCap];  // and its row minus the block's first row
    __shared__ uint8_t row_stored[kBlock];     // whether that row stores its own index
    const int32_t first_row = (int32_t)(blockIdx.x * (int64_t)rows_per_block);
    const int32_t rows = (int32_t)smaller((int64_t)rows_per_block, (int64_t)n - first_row);
    const int32_t t = threadIdx.x;
    for (int32_t r = t; r <= rows; r += blockDim.x) row_begin[r] = indptr[first_row + r];
    __syncthreads();
    const int64_t s0 = row_begin[0], s1 = row_begin[rows];
    const bool staged = s1 - s0 <= kStageCap;  // block-uniform
    if (staged) {
        for (int64_t e = s0 + t; e < s1; e += blockDim.x) s_idx[e - s0] = idx[e];
        for (int32_t r = t; r <= rows; r += blockDim.x) s_ptr[r] = (int32_t)(row_begin[r] - s0);
        __syncthreads();
    }
    int64_t upper = 0, count = 0;
    if (t < rows) {
        const int32_t i = first_row + t;
        const int32_t* row = staged ? s_idx + s_ptr[t] : idx + row_begin[t];
        const int32_t len = (int32_t)(row_begin[t + 1] - row_begin[t]);
        const int32_t p = row_lower_bound(row, len, i);
        const int32_t stored = (p < len && row[p] == i) ? 1 : 0;
        if (stored) out[row_begin[t] + p] = T(1);
        row_stored[t] = (uint8_t)stored;
        upper = p + stored;
        count = len - upper;
    }
    int64_t total;
    const int64_t at = block_exclusive_scan(count, &total);  // ends with a barrier
    for (int64_t base = 0; base < total; base += kStageCap) {  // block-uniform: one pass when staged
        const int64_t lo = at > base ? at : base;
        const int64_t hi = smaller(at + count, base + kStageCap);
        for (int64_t u = lo; u < hi; ++u) {
            listed_off[u - base] = (int32_t)(upper + (u - at));
            listed_row[u - base] = (uint8_t)t;
        }
        __syncthreads();
        const int32_t listed = (int32_t)smaller(total - base, (int64_t)kStageCap);
        for (int32_t u = t; u < listed; u += blockDim.x) {
            const int32_t r = listed_row[u], off = listed_off[u];
            const int32_t i = first_row + r;
            const int64_t a0 = row_begin[r];
            const int32_t* a = staged ? s_idx + s_ptr[r] : idx + a0;
            const int32_t la = (int32_t)(row_begin[r + 1] - a0);
            const int32_t j = a[off];
            const int32_t rj = j - first_row;  // > r: the entry is upper
            const int32_t* b;
            int32_t lb;
            int64_t b0;
            if (rj < rows) {
                b0 = row_begin[rj];
                lb = (int32_t)(row_begin[rj + 1] - b0);
                b = staged ? s_idx + s_ptr[rj] : idx + b0;
            } else {
                b0 = indptr[j];
                lb = (int32_t)(indptr[j + 1] - b0);
                b = idx + b0;
            }
            const MergeMirror mm = merge_count_mirror(a, la, b, lb, i, j);
            if (mm.mirror >= lb) continue;  // never for a validated input; no write past row j if it were not
            const T value = count_similarity<T>(metric, mm.count, count_terms(la, row_stored[r], self_loops),
                                                count_terms(lb, mm.j_stored, self_loops));
            out[a0 + off] = value;
            out[b0 + mm.mirror] = value;
        }
        __syncthreads();  // the list is read before the next pass overwrites it
    }
}

// ---- the window variant: near pairs from 64-bit row masks, no merge

constexpr int32_t kWinHalf = 32;                    // row r's window: the vertices [r - 32, r + 32)
constexpr int32_t kWinFar = 4;                      // entries outside its window a row lists for near pairs
constexpr int32_t kWinRows = kBlock + 2 * kWinHalf; // a block's rows and the halo of rows either side
constexpr int32_t kWinList = 2048;                  // entries a block lists in shared memory per pass

// Row r as the window variant sees it: a bit per stored entry x in [r - 32, r + 32) (bit x - r + 32),
// how many entries lie below the window, and the entries outside it (the first kWinFar of them;
// n_far counts them all, so a row with more than kWinFar is known to be incomplete here).
struct WindowRow {
    uint64_t mask;
    int32_t below, n_far;
    int32_t far[kWinFar];
};

// x's bit in row r's window, or a value >= 64 when x lies outside it (x, r >= 0: no overflow).
__device__ __forceinline__ uint32_t window_bit(int32_t x, int32_t r) {
    return (uint32_t)(x - r) + (uint32_t)kWinHalf;
}

__device__ __forceinline__ WindowRow window_row(const int32_t* __restrict__ row, int32_t len, int32_t r) {
    WindowRow w;
    w.mask = 0;
    w.below = 0;
    w.n_far = 0;
#pragma unroll
    for (int32_t k = 0; k < kWinFar; ++k) w.far[k] = -1;
    for (int32_t q = 0; q < len; ++q) {
        const int32_t x = row[q];
        const uint32_t d = window_bit(x, r);
        if (d < 64u) {
            w.mask |= 1ull << d;
        } else {
            w.below += x < r ? 1 : 0;
#pragma unroll
            for (int32_t k = 0; k < kWinFar; ++k) w.far[k] = w.n_far == k ? x : w.far[k];
            ++w.n_far;
        }
    }
    return w;
}

__device__ __forceinline__ int32_t window_stores(const WindowRow& w, int32_t x, int32_t r) {
    const uint32_t d = window_bit(x, r);
    if (d < 64u) return (int32_t)((w.mask >> d) & 1ull);
    int32_t hit = 0;
#pragma unroll
    for (int32_t k = 0; k < kWinFar; ++k) hit |= w.far[k] == x ? 1 : 0;
    return hit;
}

// |N(i) ∩ N(j)| and the offset of i in row j for a near pair, 0 < j - i < 32, both rows complete
// (n_far <= kWinFar).  The common entries inside both windows are one popcount of the masks
// aligned to i's window; an entry outside i's window is one of i's far entries, looked up in j;
// an entry inside i's window but outside j's is one of j's far entries, looked up in i's mask.
__device__ __forceinline__ MergeMirror window_pair(const WindowRow& a, int32_t i, const WindowRow& b, int32_t j) {
    const int32_t delta = j - i;
    int32_t count = __popcll(a.mask & (b.mask << delta));
#pragma unroll
    for (int32_t k = 0; k < kWinFar; ++k) {
        if (k < a.n_far) count += window_stores(b, a.far[k], j);
        if (k < b.n_far) {
            const uint32_t d = window_bit(b.far[k], i);
            count += d < 64u ? (int32_t)((a.mask >> d) & 1ull) : 0;
        }
    }
    const uint32_t at_i = (uint32_t)(kWinHalf - delta);  // i's bit in j's window
    MergeMirror m;
    m.count = count;
    m.mirror = ((b.mask >> at_i) & 1ull) ? b.below + __popcll(b.mask & ((1ull << at_i) - 1ull)) : INT32_MAX;
    m.j_stored = (int32_t)((b.mask >> kWinHalf) & 1ull);
    return m;
}

// Block b takes rows [b R, b R + R) (R = rows_per_block <= blockDim.x) and first builds the
// WindowRow of each of them and of the 32 rows either side (its halo), a thread per row.  The
// upper entries (i, j) of its rows are then listed in two runs: the near ones (j - i < 32, a
// contiguous stretch of row i after i itself) and the far ones.  A thread computes one listed
// pair at a time: a near pair from the two WindowRows (window_pair: a few dozen instructions
// whatever the degrees, no dependent loads), a far pair, or a near pair whose row has more than
// kWinFar entries outside its window, by merging the two rows in global memory like "pair".  So
// the kernel is correct on any graph and fast where nearly all pairs are near and complete:
// rings, bands, meshes in a narrow banded order.  The lower entries are the mirrors.
template <typename T>
__device__ __forceinline__ void window_similarity(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                  int32_t n, int32_t metric, int32_t self_loops, T* __restrict__ out,
                                                  int32_t rows_per_block) {
    __shared__ WindowRow s_row[kWinRows];
    __shared__ int64_t s_begin[kWinRows + 1];
    __shared__ int32_t listed_off[kWinList];  // a listed entry's offset in its row
    __shared__ uint8_t listed_row[kWinList];  // and its row minus the block's first row
    const int32_t first_row = (int32_t)(blockIdx.x * (int64_t)rows_per_block);
    const int32_t rows = (int32_t)smaller((int64_t)rows_per_block, (int64_t)n - first_row);
    const int32_t lo_row = first_row > kWinHalf ? first_row - kWinHalf : 0;
    const int32_t hi_row = (int32_t)smaller((int64_t)first_row + rows + kWinHalf, (int64_t)n);
    const int32_t built = hi_row - lo_row;
    const int32_t t = threadIdx.x;
    for (int32_t c = t; c <= built; c += blockDim.x) s_begin[c] = indptr[lo_row + c];
    __syncthreads();
    for (int32_t c = t; c < built; c += blockDim.x)
        s_row[c] = window_row(idx + s_begin[c], (int32_t)(s_begin[c + 1] - s_begin[c]), lo_row + c);
    __syncthreads();
    // this thread's row: its upper entries are [upper, upper + near) near, then far ones
    int32_t upper = 0, near = 0, far = 0;
    const int32_t c0 = first_row - lo_row;  // the block's first row among the built ones
    if (t < rows) {
        const WindowRow& w = s_row[c0 + t];
        const int32_t len = (int32_t)(s_begin[c0 + t + 1] - s_begin[c0 + t]);
        const int32_t stored = (int32_t)((w.mask >> kWinHalf) & 1ull);
        upper = w.below + __popcll(w.mask & ((2ull << kWinHalf) - 1ull));  // entries <= i
        if (stored) out[s_begin[c0 + t] + upper - 1] = T(1);
        near = __popcll(w.mask >> (kWinHalf + 1));
        far = len - upper - near;
    }
    int64_t total;  // near counts in the high half, far counts in the low half: one scan for both
    const int64_t at = block_exclusive_scan(((int64_t)near << 32) | far, &total);
    for (int32_t run = 0; run < 2; ++run) {  // 0: near pairs, 1: far pairs
        const int64_t run_total = run == 0 ? total >> 32 : total & 0xFFFFFFFFll;
        const int64_t run_at = run == 0 ? at >> 32 : at & 0xFFFFFFFFll;
        const int32_t run_count = run == 0 ? near : far;
        const int32_t run_first = run == 0 ? upper : upper + near;
        for (int64_t base = 0; base < run_total; base += kWinList) {  // block-uniform
            const int64_t lo = run_at > base ? run_at : base;
            const int64_t hi = smaller(run_at + run_count, base + kWinList);
            for (int64_t u = lo; u < hi; ++u) {
                listed_off[u - base] = run_first + (int32_t)(u - run_at);
                listed_row[u - base] = (uint8_t)t;
            }
            __syncthreads();
            const int32_t listed = (int32_t)smaller(run_total - base, (int64_t)kWinList);
            for (int32_t u = t; u < listed; u += blockDim.x) {
                const int32_t r = listed_row[u], off = listed_off[u];
                const int32_t i = first_row + r, ci = c0 + r;
                const int64_t a0 = s_begin[ci];
                const int32_t la = (int32_t)(s_begin[ci + 1] - a0);
                const int32_t j = idx[a0 + off];
                const WindowRow& wi = s_row[ci];
                const int32_t i_stored = (int32_t)((wi.mask >> kWinHalf) & 1ull);
                int64_t b0;
                int32_t lb;
                MergeMirror mm;
                if (run == 0 && wi.n_far <= kWinFar && s_row[j - lo_row].n_far <= kWinFar) {
                    const int32_t cj = j - lo_row;  // near: j < i + 32 <= hi_row
                    b0 = s_begin[cj];
                    lb = (int32_t)(s_begin[cj + 1] - b0);
                    mm = window_pair(wi, i, s_row[cj], j);
                } else {
                    b0 = indptr[j];
                    lb = (int32_t)(indptr[j + 1] - b0);
                    mm = merge_count_mirror(idx + a0, la, idx + b0, lb, i, j);
                }
                if (mm.mirror >= lb) continue;  // never for a validated input; no write past row j if it were not
                const T value = count_similarity<T>(metric, mm.count, count_terms(la, i_stored, self_loops),
                                                    count_terms(lb, mm.j_stored, self_loops));
                out[a0 + off] = value;
                out[b0 + mm.mirror] = value;
            }
            __syncthreads();  // the list is read before the next pass overwrites it
        }
    }
}

}  // namespace jaccard
