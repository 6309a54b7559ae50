// Jaccard, Sorensen and overlap similarity on every stored entry (i, j) of a symmetric CSR
// (graphkern/similarity.py launches these; graphkern/_cpu/jaccard.pyx is the CPU twin).
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
//      hub       balanced, except where the long row of a pair belongs to one of the highest-
//                degree vertices (a "hub"): each short-row element is then one bit test in a
//                bitmap of the hub's row instead of a gallop.  Such a pair's work is carried by
//                its entry in the hub's own row, so a stretch of the work line shares one hub's
//                bitmap (L2/L1-resident) however many hubs there are.  The bitmaps are built by
//                the same launch sequence.  Unweighted only: a weighted match needs the element's
//                position in the long row, so weighted "hub" runs as balanced.
//      shortrow  rows of at most 32 entries: a group of lanes per row i keeps N(i) in shared
//                memory; for each upper entry (i, j) the group loads row j (a lane per element),
//                each lane looks its element up in N(i) and a ballot counts the matches; the lane
//                that holds i writes the mirror entry.  The per-vertex terms come from the rows
//                the group has loaded anyway, so the whole computation is one launch.
//      pair      a block lists the upper entries of its rows in shared memory and a thread merges
//                each pair once (by V-element aligned vector loads where V = 2 or 4, unweighted)
//                and writes its mirror; one launch.
//      longrow   hub, with every pair's work carried by its long row; the balanced kernel notes
//                where the short row stores the long vertex, so that the finalize pass writes
//                both entries of a pair without searching (see balanced_finalize).  Unweighted,
//                a long row without a bitmap but with at least a threshold of entries (chosen
//                by the host, which then also gives fewer rows bitmaps) has an open-addressing
//                hash table of its columns, built by the same launch sequence (row_hashes):
//                each short-row element is then mostly one 16-byte load from the table instead
//                of a gallop of about 2 log2(d_long / d_short) + 1 dependent loads, whose count
//                differs from lane to lane.
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

// A tile's kScanTile values of type V in shared memory, with one pad element after every 128
// bytes.  The work line passes read a tile striped (pass q: thread t at element q * kBlock + t,
// so a warp's global loads and stores are 128 contiguous bytes) and work on it blocked (thread t
// at elements t * kScanItems + q, in order: the row walk of balanced_work and the running sum of
// scan_tiles need consecutive entries).  Unpadded, the blocked pass would put the lanes of a
// warp kScanItems elements apart, 16 lanes on one bank; with the pad they meet 32 distinct banks
// (int32), or 16 distinct 8-byte bank pairs per half-warp (int64), as does the striped pass.
template <typename V>
struct TileSlots {
    static constexpr int kRun = 128 / (int)sizeof(V);
    static constexpr int kSize = kScanTile + kScanTile / kRun;
    static __device__ __forceinline__ int at(int c) { return c + c / kRun; }
};

// Work of entry k = (r, j): min(d_r, d_j) searches if r is the owner row of the pair (see
// owner_row), none otherwise.  Also writes the row of every entry (the later passes read it
// instead of searching indptr) and each tile's sum.  The columns are loaded into shared memory
// and the rows and work written back from it striped (see TileSlots); the work is staged as
// int32: it is at most a row's length, and a row stores distinct columns below n <= 2^31 - 1.
__device__ __forceinline__ void balanced_work(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                              const int32_t* __restrict__ hub_slot, int32_t long_owner, int32_t n,
                                              int64_t nnz, int32_t* __restrict__ rows, int64_t* __restrict__ work,
                                              int64_t* __restrict__ tile_sums) {
    using Slots = TileSlots<int32_t>;
    __shared__ int32_t s_rows[Slots::kSize];  // the tile's columns, overwritten by their rows
    __shared__ int32_t s_work[Slots::kSize];
    const int32_t t = threadIdx.x;
    const int64_t tile = blockIdx.x * (int64_t)kScanTile;
    const int64_t tile_last = min(nnz - 1, tile + kScanTile - 1);
    int32_t col[kScanItems];  // in flight while block_entry_row searches indptr
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        const int64_t k = tile + q * kBlock + t;
        col[q] = k < nnz ? idx[k] : 0;
    }
    const int32_t first = t * kScanItems;  // this thread's first entry in the tile
    int64_t r = block_entry_row(indptr, n, tile + first, tile, tile_last);
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) s_rows[Slots::at(q * kBlock + t)] = col[q];
    __syncthreads();
    int64_t sum = 0;
    for (int q = 0; q < kScanItems; ++q) {
        const int64_t k = tile + first + q;
        if (k >= nnz) break;
        while (indptr[r + 1] <= k) ++r;
        const int32_t c = Slots::at(first + q);
        const int32_t j = s_rows[c];
        int64_t wk = 0;
        if (r != j && owner_row(indptr, hub_slot, long_owner, (int32_t)r, j) == r)
            wk = smaller(indptr[r + 1] - indptr[r], indptr[j + 1] - indptr[j]);
        s_rows[c] = (int32_t)r;
        s_work[c] = (int32_t)wk;
        sum += wk;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        const int32_t c = q * kBlock + t;
        if (tile + c < nnz) {
            rows[tile + c] = s_rows[Slots::at(c)];
            work[tile + c] = s_work[Slots::at(c)];
        }
    }
    int64_t total;
    block_exclusive_scan(sum, &total);
    if (t == 0) tile_sums[blockIdx.x] = total;
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

// Turns the per-entry work of one tile into exclusive offsets (in place), and writes
// group_entry[g] = the entry holding work item g * group_items, for every group start the tile's
// entries hold (each lies in exactly one entry with work, so each has one writer).  The balanced
// kernel reads a warp's entry range from it instead of searching all nnz offsets per chunk.  The
// tile is loaded into shared memory and stored back from it striped (see TileSlots); each thread
// sums and rewrites its kScanItems consecutive entries there.
__device__ __forceinline__ void scan_tiles(int64_t* __restrict__ work, int64_t nnz,
                                           const int64_t* __restrict__ tile_sums, int64_t group_items,
                                           int64_t* __restrict__ group_entry) {
    using Slots = TileSlots<int64_t>;
    __shared__ int64_t s_work[Slots::kSize];  // the tile's work, overwritten by its offsets
    const int32_t t = threadIdx.x;
    const int64_t tile = blockIdx.x * (int64_t)kScanTile;
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        const int32_t c = q * kBlock + t;
        s_work[Slots::at(c)] = tile + c < nnz ? work[tile + c] : 0;
    }
    __syncthreads();
    const int32_t first = t * kScanItems;  // this thread's first entry in the tile
    int64_t local = 0;
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) local += s_work[Slots::at(first + q)];
    int64_t total;
    int64_t run = tile_sums[blockIdx.x] + block_exclusive_scan(local, &total);
    const int64_t k_first = tile + first;
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        const int32_t c = Slots::at(first + q);
        const int64_t v = s_work[c];  // 0 past nnz: no group start, and never stored
        s_work[c] = run;
        for (int64_t g = (run + group_items - 1) / group_items; g * group_items < run + v; ++g)
            group_entry[g] = k_first + q;
        run += v;
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
        const int32_t c = q * kBlock + t;
        if (tile + c < nnz) work[tile + c] = s_work[Slots::at(c)];
    }
}

// Work item t of entry e (offsets[e] <= t < offsets[e + 1]) is element t - offsets[e] of the
// shorter row, galloped through the longer one, or tested in the long row's bitmap when that row
// has one (hub_slot[long] >= 0), or else looked up in its hash table when it has one
// (hash_off[long] >= 0: the table's first slot in hash_keys; see row_hashes).  Bitmaps and tables
// are unweighted only: hub_slot and hash_off are null otherwise, or where the variant has none.
// Bitmap s holds `words` 32-bit words from bitmaps + s * words.  Threads take `chunk`
// consecutive items; the 32 lanes of a warp take 32 consecutive chunks, so lanes that end inside
// the same entry add their partial sums by a segmented shuffle reduction before one atomic per
// entry.  The grid is persistent (grid-stride over warps of chunks); the total work is read from
// offsets[nnz], so the host never waits for the prefix sum.  A warp's 32 chunks start at item
// g * 32 chunk and end before (g + 1) * 32 chunk, so their entries lie between group_entry[g]
// and group_entry[g + 1] (scan_tiles): each lane searches that span, a few offsets, where a
// search of all nnz offsets was ~25 dependent loads per chunk.
// mirror_off (longrow, where every owner entry e = (i, j) lies in the long row i; null
// otherwise): the item that loads the short row's element i writes its offset in row j to
// mirror_off[e], so that the finalize pass need not search row j for the mirror entry (j, i).
// An entry whose gallop stops early (p == long_end) may never load that element: its
// mirror_off[e] keeps the -1 it was set to before the launch.  The table lookups never stop early:
// an element past the long row's last costs one probe like any other, so every entry whose long
// row has a table records its mirror.
template <bool kWeighted, typename T>
__device__ __forceinline__ void balanced_intersections(const int64_t* __restrict__ indptr,
                                                       const int32_t* __restrict__ idx, const T* __restrict__ w,
                                                       const int32_t* __restrict__ rows,
                                                       const int64_t* __restrict__ offsets, int64_t nnz,
                                                       int32_t chunk, const int64_t* __restrict__ group_entry,
                                                       const int32_t* __restrict__ hub_slot,
                                                       const uint32_t* __restrict__ bitmaps, int64_t words,
                                                       const int64_t* __restrict__ hash_off,
                                                       const int32_t* __restrict__ hash_keys,
                                                       Acc<kWeighted, T>* __restrict__ inter,
                                                       int32_t* __restrict__ mirror_off) {
    using A = Acc<kWeighted, T>;
    const int64_t total_work = offsets[nnz];
    const int64_t n_chunks = (total_work + chunk - 1) / chunk;
    const int64_t n_groups = (n_chunks + 31) / 32;
    const int lane = threadIdx.x & 31;
    const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int64_t n_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t c0 = warp * 32; c0 < n_chunks; c0 += n_warps * 32) {  // warp-uniform
        const int64_t c = c0 + lane;
        const int64_t g = c0 / 32;
        const int64_t e_lo = group_entry[g];
        const int64_t e_hi = g + 1 < n_groups ? group_entry[g + 1] : nnz - 1;
        int64_t e = -1;
        A acc = 0;
        if (c < n_chunks) {
            int64_t t = c * chunk;
            const int64_t t_end = min(total_work, t + chunk);
            e = last_not_above(offsets, e_lo, e_hi + 1, t);
            int64_t off_cur = offsets[e], off_next = offsets[e + 1];
            while (true) {
                const RowPair r = row_pair(indptr, rows[e], idx[e]);
                const int64_t stop = min(off_next, t_end);
                const int32_t mirror_key = mirror_off != nullptr ? r.long_vertex : -1;  // -1: no column
                int32_t slot = -1;
                int64_t table = -1;
                if constexpr (!kWeighted) {
                    // both loads at once: the host gives a table only to a row without a bitmap
                    if (hub_slot != nullptr) slot = hub_slot[r.long_vertex];
                    if (hash_off != nullptr) table = hash_off[r.long_vertex];
                }
                if (slot >= 0) {
                    const uint32_t* __restrict__ bits = bitmaps + (int64_t)slot * words;
                    for (int64_t s = r.short_begin + (t - off_cur); t < stop; ++t, ++s) {
                        const int32_t x = idx[s];
                        if (x == mirror_key) mirror_off[e] = (int32_t)(s - r.short_begin);
                        acc += (A)((bits[x >> 5] >> (x & 31)) & 1u);
                    }
                } else if (table >= 0) {
                    const int32_t* __restrict__ keys = hash_keys + table;
                    const int32_t shift = hash_shift(r.long_end - r.long_begin);
                    for (int64_t s = r.short_begin + (t - off_cur); t < stop; ++t, ++s) {
                        const int32_t x = idx[s];
                        if (x == mirror_key) mirror_off[e] = (int32_t)(s - r.short_begin);
                        acc += (A)hash_contains(keys, shift, x);
                    }
                } else {
                    // a chunk that starts inside the short row: its first element sits anywhere in
                    // the long row, where a binary search beats a gallop from the row's start
                    int64_t p = r.long_begin;
                    if (t > off_cur) p = lower_bound(idx, p, r.long_end, idx[r.short_begin + (t - off_cur)]);
                    for (int64_t s = r.short_begin + (t - off_cur); t < stop; ++t, ++s) {
                        const int32_t x = idx[s];
                        if (x == mirror_key) mirror_off[e] = (int32_t)(s - r.short_begin);  // before the break
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

// Writes every entry from the partial sums of the owner entries.  balanced and hub
// (long_owner 0): each entry's thread reads its owner's sum, the non-owner one after a search of
// the owner's row, which on Chung-Lu means 4.3M searches through hub rows of 10^3 to 1.8e5
// entries.  longrow (long_owner 1, every owner in its pair's long row): only the thread of the
// entry in the long row works; it writes both entries, the mirror at the offset in the short row
// that the balanced pass recorded in mirror_off, or, where it recorded none (-1: an early end of
// the gallop; or mirror_off null), at the one a search of the short row finds.
template <bool kWeighted, typename T>
__device__ __forceinline__ void balanced_finalize(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                                  const T* __restrict__ w, const int32_t* __restrict__ rows,
                                                  const int32_t* __restrict__ hub_slot, int32_t long_owner,
                                                  int64_t nnz, int32_t metric, const VertexTerms<T>& v,
                                                  const Acc<kWeighted, T>* __restrict__ inter,
                                                  const int32_t* __restrict__ mirror_off, T* __restrict__ out) {
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k >= nnz) return;
    const int32_t i = rows[k], j = idx[k];
    if (i == j) {
        out[k] = T(1);
        return;
    }
    const T w_ij = kWeighted ? w[k] : T(1);
    const int64_t bj = indptr[j], ej = indptr[j + 1];
    if (!long_owner) {
        const int64_t owner = owner_row(indptr, hub_slot, 0, i, j) == i ? k : lower_bound(idx, bj, ej, i);
        out[k] = finish<kWeighted, T>(metric, inter[owner], i, j, w_ij, v);
        return;
    }
    if (!is_long_side(i, indptr[i + 1] - indptr[i], j, ej - bj)) return;  // written by its mirror's thread
    const int32_t off = mirror_off != nullptr ? mirror_off[k] : -1;
    const int64_t mirror = off >= 0 ? bj + off : lower_bound(idx, bj, ej, i);  // (j, i); the input is symmetric
    const T value = finish<kWeighted, T>(metric, inter[k], i, j, w_ij, v);
    out[k] = value;
    out[mirror] = value;
}

// ------------------------------------------------------------------ hub bitmaps

// Block s builds bitmap s, of hub vertex hubs[s] (bit x of word x >> 5 set iff the hub's row
// stores x), and sets hub_slot[hubs[s]] = s (hub_slot is reset to -1 before).  Only the words
// this row sets can hold bits of an earlier call on the same graph (the buffer is zeroed once,
// when allocated), so clearing them replaces a pass over all the bitmaps' memory.
__device__ __forceinline__ void hub_bitmaps(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                            const int32_t* __restrict__ hubs, int64_t words,
                                            uint32_t* __restrict__ bitmaps, int32_t* __restrict__ hub_slot) {
    const int32_t slot = blockIdx.x;
    const int32_t h = hubs[slot];
    uint32_t* __restrict__ bits = bitmaps + (int64_t)slot * words;
    const int64_t b = indptr[h], e = indptr[h + 1];
    if (threadIdx.x == 0) hub_slot[h] = slot;
    for (int64_t p = b + threadIdx.x; p < e; p += blockDim.x) bits[idx[p] >> 5] = 0u;
    __syncthreads();  // every clear before any set: two elements may share a word
    for (int64_t p = b + threadIdx.x; p < e; p += blockDim.x) {
        const int32_t x = idx[p];
        atomicOr(bits + (x >> 5), 1u << (x & 31));
    }
}

// ------------------------------------------------------------------ row hash tables

// The tables of the rows listed in table_rows (longrow, unweighted: the rows the host chose, see
// graphkern/similarity.py hash_table_rows), in hash_keys, which the host clears to kHashEmpty on
// the stream first.  Listed row w's entries are items [row_items[w], row_items[w + 1]) of one
// line and its table starts at slot row_tables[w]; a thread per item inserts one column, so a
// long row is spread over many threads, as on the work line, where a warp or a block per row
// would leave a few threads probing thousands of atomics in turn.  The thread of a row's first
// item also writes the row's hash_off (set to -1 once, when allocated: the list is fixed).
__device__ __forceinline__ void row_hashes(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                                           const int32_t* __restrict__ table_rows,
                                           const int64_t* __restrict__ row_items,
                                           const int64_t* __restrict__ row_tables, int32_t n_rows, int64_t items,
                                           int64_t* __restrict__ hash_off, int32_t* __restrict__ hash_keys) {
    const int64_t first = blockIdx.x * (int64_t)blockDim.x;
    const int64_t t = first + threadIdx.x;
    const int32_t w = block_entry_row(row_items, n_rows, t, first, min(items - 1, first + blockDim.x - 1));
    if (t >= items) return;
    const int32_t v = table_rows[w];
    const int64_t b = indptr[v], q = t - row_items[w], table = row_tables[w];
    if (q == 0) hash_off[v] = table;
    hash_insert(hash_keys + table, hash_shift(indptr[v + 1] - b), idx[b + q]);
}

// ------------------------------------------------------------------ shortrow variant

// Sum over the `group` lanes of mask (xor partners stay inside an aligned group).
template <typename V>
__device__ __forceinline__ V group_sum(unsigned mask, V x, int32_t group) {
    for (int off = group >> 1; off > 0; off >>= 1) x += __shfl_xor_sync(mask, x, off);
    return x;
}

template <bool kWeighted, typename T>
using Terms = typename std::conditional<kWeighted, WeightTerms<T>, CountTerms>::type;

// A row's terms from its elements held one per lane (`has`: this lane holds one, `col`, `wt`).
template <bool kWeighted, typename T>
__device__ __forceinline__ Terms<kWeighted, T> group_row_terms(unsigned mask, int32_t group, int32_t vertex,
                                                               int32_t len, bool has, int32_t col, T wt,
                                                               int32_t self_loops) {
    const bool loop = has && col == vertex;
    const int32_t stored = (__ballot_sync(mask, loop) & mask) != 0u;
    if constexpr (kWeighted) {
        const T sum = group_sum<T>(mask, has ? wt : T(0), group);
        const T loop_w = group_sum<T>(mask, loop ? wt : T(0), group);
        return weight_terms<T>(sum, loop_w, stored, self_loops);
    } else {
        return count_terms(len, stored, self_loops);
    }
}

constexpr int32_t kNoColumn = 0x7fffffff;  // pads a row past its length; no vertex has this index

// `group` lanes (a power of two, at least the longest row, at most 32) per row i.  Row i's
// columns (and weights) sit in this group's `group` slots of shared memory, padded with
// kNoColumn; for every upper entry (i, j) the group loads row j, one element per lane, and each
// lane finds its element among row i's by a branch-free binary search of log2(group) steps.
template <bool kWeighted, typename T>
__device__ __forceinline__ void shortrow_similarity(const int64_t* __restrict__ indptr,
                                                    const int32_t* __restrict__ idx, const T* __restrict__ w,
                                                    int32_t n, int32_t metric, int32_t self_loops,
                                                    T* __restrict__ out, int32_t group) {
    __shared__ int32_t row_cols[kBlock];
    __shared__ T row_w[kWeighted ? kBlock : 1];
    const int32_t rank = threadIdx.x & (group - 1);
    const int32_t base = threadIdx.x - rank;  // this group's slots
    const int lane = threadIdx.x & 31;
    const unsigned mask = group == 32 ? kFullMask : ((1u << group) - 1u) << (lane & ~(group - 1));
    const int64_t row = blockIdx.x * (int64_t)(blockDim.x / group) + threadIdx.x / group;
    if (row >= n) return;  // uniform within a group; no block-wide barrier follows
    const int32_t i = (int32_t)row;
    const int64_t a0 = indptr[i];
    const int32_t len_i = (int32_t)(indptr[i + 1] - a0);  // <= group, checked by the host
    const bool in_i = rank < len_i;
    const int32_t a = in_i ? idx[a0 + rank] : kNoColumn;
    T wa = T(0);
    if constexpr (kWeighted) {
        wa = in_i ? w[a0 + rank] : T(0);
        row_w[threadIdx.x] = wa;
    }
    row_cols[threadIdx.x] = a;
    __syncwarp(mask);
    const Terms<kWeighted, T> ti = group_row_terms<kWeighted, T>(mask, group, i, len_i, in_i, a, wa, self_loops);
    for (int32_t q = 0; q < len_i; ++q) {  // uniform within the group
        const int32_t j = __shfl_sync(mask, a, q, group);
        const int64_t k = a0 + q;
        if (j == i) {
            if (rank == 0) out[k] = T(1);
            continue;
        }
        if (j < i) continue;  // row j's group computes the pair and writes this entry as its mirror
        const int64_t b0 = indptr[j];
        const int32_t len_j = (int32_t)(indptr[j + 1] - b0);
        const bool in_j = rank < len_j;
        const int32_t b = in_j ? idx[b0 + rank] : -1;
        T wb = T(0);
        if constexpr (kWeighted) wb = in_j ? w[b0 + rank] : T(0);
        int32_t pos = 0;  // ends at b's slot in row i if row i stores b
        for (int32_t step = group >> 1; step > 0; step >>= 1)
            if (row_cols[base + pos + step - 1] < b) pos += step;
        const bool match = in_j && row_cols[base + pos] == b;
        const Terms<kWeighted, T> tj = group_row_terms<kWeighted, T>(mask, group, j, len_j, in_j, b, wb, self_loops);
        T value;
        if constexpr (kWeighted) {
            const T raw = group_sum<T>(mask, match ? smaller(row_w[base + pos], wb) : T(0), group);
            value = weight_similarity<T>(metric, raw, ti, tj, row_w[base + q], self_loops ? T(1) : T(-1));
        } else {
            const int32_t raw = __popc(__ballot_sync(mask, match) & mask);
            value = count_similarity<T>(metric, raw, ti, tj);
        }
        if (rank == 0) out[k] = value;
        if (in_j && b == i) out[b0 + rank] = value;  // the mirror entry (j, i); the input is symmetric
    }
}

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

constexpr int32_t kStageCap = 2048;  // column indices a block stages (graphkern/similarity.py: _STAGE_CAP)

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

using namespace jaccard;

// ------------------------------------------------------------------ entry points

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_vertex_counts(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx, int32_t n,
                          int32_t self_loops, int32_t* __restrict__ deg, int32_t* __restrict__ adj) {
    vertex_counts(indptr, idx, n, self_loops, deg, adj);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_balanced_work(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                          const int32_t* __restrict__ hub_slot, int32_t long_owner, int32_t n, int64_t nnz,
                          int32_t* __restrict__ rows, int64_t* __restrict__ work, int64_t* __restrict__ tile_sums) {
    balanced_work(indptr, idx, hub_slot, long_owner, n, nnz, rows, work, tile_sums);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_hub_bitmaps(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                        const int32_t* __restrict__ hubs, int64_t words, uint32_t* __restrict__ bitmaps,
                        int32_t* __restrict__ hub_slot) {
    hub_bitmaps(indptr, idx, hubs, words, bitmaps, hub_slot);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_row_hashes(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,
                       const int32_t* __restrict__ table_rows, const int64_t* __restrict__ row_items,
                       const int64_t* __restrict__ row_tables, int32_t n_rows, int64_t items,
                       int64_t* __restrict__ hash_off, int32_t* __restrict__ hash_keys) {
    row_hashes(indptr, idx, table_rows, row_items, row_tables, n_rows, items, hash_off, hash_keys);
}

extern "C" __global__ void __launch_bounds__(1024)
    jaccard_scan_tile_sums(int64_t* __restrict__ tile_sums, int64_t n_tiles, int64_t* __restrict__ work_total) {
    scan_tile_sums(tile_sums, n_tiles, work_total);
}

extern "C" __global__ void __launch_bounds__(kBlock)
    jaccard_scan_tiles(int64_t* __restrict__ work, int64_t nnz, const int64_t* __restrict__ tile_sums,
                       int64_t group_items, int64_t* __restrict__ group_entry) {
    scan_tiles(work, nnz, tile_sums, group_items, group_entry);
}

// The balanced kernels are bound to five blocks per SM: with __launch_bounds__(kBlock) alone,
// CUDA 13 ptxas kept 32 to 40 registers in the weighted flavours and spilled; the bound leaves 48
// registers (the count flavours' own choice, five blocks of 256 threads per SM), and ptxas
// settles at 48 (count) and 40 (weight) on sm_90, without spills.  sm_75 holds 1024 threads per
// SM, so four there (ptxas ignores a bound past that, with a warning).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define JACCARD_BALANCED_MIN_BLOCKS 4
#else
#define JACCARD_BALANCED_MIN_BLOCKS 5
#endif

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
    extern "C" __global__ void __launch_bounds__(kBlock, JACCARD_BALANCED_MIN_BLOCKS)                            \
        jaccard_balanced_##kind##_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,     \
                                        const T* __restrict__ w, const int32_t* __restrict__ rows,               \
                                        const int64_t* __restrict__ offsets, int64_t nnz, int32_t chunk,         \
                                        const int64_t* __restrict__ group_entry,                                 \
                                        const int32_t* __restrict__ hub_slot, const uint32_t* __restrict__ bitmaps, \
                                        int64_t words, const int64_t* __restrict__ hash_off,                     \
                                        const int32_t* __restrict__ hash_keys, Acc<W, T>* __restrict__ inter,    \
                                        int32_t* __restrict__ mirror_off) {                                      \
        balanced_intersections<W, T>(indptr, idx, w, rows, offsets, nnz, chunk, group_entry, hub_slot, bitmaps,  \
                                     words, hash_off, hash_keys, inter, mirror_off);                             \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_finalize_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), const int32_t* __restrict__ rows,          \
                                        const int32_t* __restrict__ hub_slot, int32_t long_owner,                \
                                        const Acc<W, T>* __restrict__ inter,                                     \
                                        const int32_t* __restrict__ mirror_off) {                                \
        balanced_finalize<W, T>(indptr, idx, w, rows, hub_slot, long_owner, nnz, metric,                         \
                                VertexTerms<T>{deg, adj, wsum, selfw, sign}, inter, mirror_off, out);            \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_pair_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops, int32_t rows_per_block) {   \
        pair_similarity<W, T, 1>(indptr, idx, w, n, metric, self_loops, VertexTerms<T>{deg, adj, wsum, selfw, sign}, \
                                 out, rows_per_block);                                                           \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_shortrow_##kind##_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,     \
                                        const T* __restrict__ w, int32_t n, int32_t metric, int32_t self_loops,  \
                                        T* __restrict__ out, int32_t group) {                                    \
        shortrow_similarity<W, T>(indptr, idx, w, n, metric, self_loops, out, group);                          \
    }

JACCARD_FLAVOURS(JACCARD_ENTRY_POINTS)

// The pair variant with the vector merge, unweighted only: V = 2 or 4 elements per load.
#define JACCARD_PAIR_VECTOR_ENTRY_POINTS(V, T, sfx)                                                             \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_pair_vec##V##_count_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops,                     \
                                          int32_t rows_per_block) {                                              \
        pair_similarity<false, T, V>(indptr, idx, w, n, metric, self_loops,                                      \
                                     VertexTerms<T>{deg, adj, wsum, selfw, sign}, out, rows_per_block);         \
    }

JACCARD_PAIR_VECTOR_ENTRY_POINTS(2, float, f32)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(2, double, f64)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(4, float, f32)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(4, double, f64)

// The staged variant, unweighted only (graphkern/similarity.py runs weighted "staged" as "pair").
#define JACCARD_STAGED_ENTRY_POINT(T, sfx)                                                                        \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_staged_count_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops, int32_t rows_per_block) {   \
        staged_similarity<T>(indptr, idx, n, metric, self_loops, out, rows_per_block);                          \
    }

JACCARD_STAGED_ENTRY_POINT(float, f32)
JACCARD_STAGED_ENTRY_POINT(double, f64)

// The window variant, unweighted only (graphkern/similarity.py runs weighted "window" as "pair").  Four
// blocks per SM: without the bound ptxas kept 32 registers and spilled a WindowRow to local memory.
#define JACCARD_WINDOW_ENTRY_POINT(T, sfx)                                                                        \
    extern "C" __global__ void __launch_bounds__(kBlock, 4)                                                         \
        jaccard_window_count_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops, int32_t rows_per_block) {   \
        window_similarity<T>(indptr, idx, n, metric, self_loops, out, rows_per_block);                          \
    }

JACCARD_WINDOW_ENTRY_POINT(float, f32)
JACCARD_WINDOW_ENTRY_POINT(double, f64)

#define JACCARD_WEIGHT_ENTRY_POINTS(T, sfx)                                                                        \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                           \
        jaccard_vertex_weights_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,          \
                                     const T* __restrict__ w, int32_t n, int32_t self_loops, T* __restrict__ wsum, \
                                     T* __restrict__ selfw) {                                                      \
        vertex_weights<T>(indptr, idx, w, n, self_loops, wsum, selfw);                                             \
    }

JACCARD_WEIGHT_ENTRY_POINTS(float, f32)
JACCARD_WEIGHT_ENTRY_POINTS(double, f64)
