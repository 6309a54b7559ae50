// Jaccard, Sorensen and overlap similarity on every stored entry (i, j) of a symmetric CSR
// (graphkern/similarity/gpu.py launches these; graphkern/_cpu/jaccard.pyx is the CPU twin).
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
//                These three take their launch's entries [start, nnz), so that the host runs
//                them in pieces of consecutive rows and copies finished rows out meanwhile.
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

#include "jaccard_balanced.cuh"
#include "jaccard_core.cuh"
#include "jaccard_pair.cuh"
#include "common/csr_check.cuh"
#include "common/exports.cuh"
namespace jaccard {

// ------------------------------------------------------------------ fused variants

// What every similarity entry point reads (one argument, graphkern/similarity/gpu.py packs it): the
// CSR (row pointers, columns, weights `w`), its rows, the entries the launch covers (`nnz`: their
// end), the metric, the per-vertex terms (VertexTerms) and the output, a value per stored entry.
template <typename T>
struct Similarity {
    const int64_t* indptr;
    const int32_t* idx;
    const T* w;
    int32_t n;
    int64_t nnz;
    int32_t metric;
    const int32_t* deg;
    const int32_t* adj;
    const T* wsum;
    const T* selfw;
    T sign;
    T* out;
};
#define JACCARD_SIMILARITY_FIELDS(X, N, S)                                                                  \
    X(N, S, indptr) X(N, S, idx) X(N, S, w) X(N, S, n) X(N, S, nnz) X(N, S, metric) X(N, S, deg) X(N, S, adj) \
    X(N, S, wsum) X(N, S, selfw) X(N, S, sign) X(N, S, out)
#define JACCARD_SIMILARITY_PARAMS(T) const __grid_constant__ Similarity<T> s
#define JACCARD_SIMILARITY_TERMS(T) VertexTerms<T>{s.deg, s.adj, s.wsum, s.selfw, s.sign}
#define JACCARD_SIMILARITY_ARGS(T) s.indptr, s.idx, s.w, s.n, s.nnz, s.metric, JACCARD_SIMILARITY_TERMS(T), s.out


template <bool kWeighted, typename T>
__device__ __forceinline__ void element_similarity(const int64_t* __restrict__ indptr,
                                                   const int32_t* __restrict__ idx, const T* __restrict__ w,
                                                   int32_t n, int64_t nnz, int32_t metric, const VertexTerms<T>& v,
                                                   T* __restrict__ out, int64_t start) {
    const Entry e = group_entry(indptr, idx, n, start, nnz, 1);
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
                                                  const VertexTerms<T>& v, T* __restrict__ out, int64_t start) {
    const Entry e = group_entry(indptr, idx, n, start, nnz, 1);
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
                                                const VertexTerms<T>& v, T* __restrict__ out, int32_t group,
                                                int64_t start) {
    const int32_t rank = threadIdx.x % group;
    const Entry e = group_entry(indptr, idx, n, start, nnz, group);
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
    acc = group_sum(mask, acc, group);
    if (rank == 0) write_pair<kWeighted, T>(indptr, idx, w, metric, v, e.k, e.i, e.j, acc, out);
}

// ------------------------------------------------------------------ shortrow variant

// Sum over the `group` lanes of mask (xor partners stay inside an aligned group).
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
    jaccard_row_hashes(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx, const RowTables t) {
    row_hashes(indptr, idx, t.rows, t.items, t.slots, t.n_rows, t.n_items, t.hash_off, t.hash_keys);
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

// The content check of the uploaded CSR (cuda_src/common/csr_check.cuh), with int64 row pointers.
GK_CSR_CHECK_ENTRY(csr_check_i64, int64_t)

// The balanced kernels and balanced_work take their arrays as restrict parameters: read through the
// fields of a struct, the loads of kernels with barriers or warp shuffles no longer take the
// read-only path (ld.global.nc), which the gathers of the hub and longrow variants pay for (their
// figures are in docs/performance.md).
// The balanced kernels are bound to five blocks per SM: the bound leaves 48 registers, which the
// weighted flavours need not to spill (with __launch_bounds__(kBlock) alone the compiler keeps
// fewer and spills).  sm_75 holds 1024 threads per SM, so four there.
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
        jaccard_element_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int64_t start) {                            \
        element_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T), start);                                                \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_binary_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int64_t start) {                             \
        binary_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T), start);                                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_warp_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t group, int64_t start) {                \
        warp_similarity<W, T>(JACCARD_SIMILARITY_ARGS(T), group, start);                                            \
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
        balanced_finalize<W, T>(s.indptr, s.idx, s.w, rows, hub_slot, long_owner, s.nnz, s.metric,               \
                                JACCARD_SIMILARITY_TERMS(T), inter, mirror_off, s.out);                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                         \
        jaccard_pair_##kind##_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops, int32_t rows_per_block) {   \
        pair_similarity<W, T, 1>(s.indptr, s.idx, s.w, s.n, s.metric, self_loops, JACCARD_SIMILARITY_TERMS(T),   \
                                 s.out, rows_per_block);                                                         \
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
        pair_similarity<false, T, V>(s.indptr, s.idx, s.w, s.n, s.metric, self_loops, JACCARD_SIMILARITY_TERMS(T), \
                                     s.out, rows_per_block);                                                     \
    }

JACCARD_PAIR_VECTOR_ENTRY_POINTS(2, float, f32)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(2, double, f64)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(4, float, f32)
JACCARD_PAIR_VECTOR_ENTRY_POINTS(4, double, f64)

// The staged and window variants, unweighted only (graphkern/similarity/plan.py runs their weighted
// forms as "pair"); the trailing arguments are the launch bounds.  Window asks for four blocks per
// SM: with fewer registers a WindowRow spills to local memory.
#define JACCARD_STAGED_ENTRY_POINT(VARIANT, T, sfx, ...)                                                           \
    extern "C" __global__ void __launch_bounds__(__VA_ARGS__)                                                      \
        jaccard_##VARIANT##_count_##sfx(JACCARD_SIMILARITY_PARAMS(T), int32_t self_loops, int32_t rows_per_block) { \
        VARIANT##_similarity<T>(s.indptr, s.idx, s.n, s.metric, self_loops, s.out, rows_per_block);               \
    }

JACCARD_STAGED_ENTRY_POINT(staged, float, f32, kBlock)
JACCARD_STAGED_ENTRY_POINT(staged, double, f64, kBlock)
JACCARD_STAGED_ENTRY_POINT(window, float, f32, kBlock, 4)
JACCARD_STAGED_ENTRY_POINT(window, double, f64, kBlock, 4)

#define JACCARD_WEIGHT_ENTRY_POINTS(T, sfx)                                                                        \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                           \
        jaccard_vertex_weights_##sfx(const int64_t* __restrict__ indptr, const int32_t* __restrict__ idx,          \
                                     const T* __restrict__ w, int32_t n, int32_t self_loops, T* __restrict__ wsum, \
                                     T* __restrict__ selfw) {                                                      \
        vertex_weights<T>(indptr, idx, w, n, self_loops, wsum, selfw);                                             \
    }

JACCARD_WEIGHT_ENTRY_POINTS(float, f32)
JACCARD_WEIGHT_ENTRY_POINTS(double, f64)

// The launch shapes, shared-memory capacities and index padding graphkern/similarity/plan.py plans with
GRAPHKERN_EXPORTS = {
    {"block", kBlock},
    {"scan_tile", kScanTile},
    {"stage_cap", kStageCap},
    {"window_half", kWinHalf},
    {"window_far", kWinFar},
    {"pad_after_b", kAfterB},
    {"hash_bucket", kHashBucket},
    GK_STRUCT("similarity_f32", Similarity<float>, JACCARD_SIMILARITY_FIELDS)
    GK_STRUCT("similarity_f64", Similarity<double>, JACCARD_SIMILARITY_FIELDS)
    GK_STRUCT("row_tables", RowTables, JACCARD_ROW_TABLES_FIELDS)
    GK_CSR_CHECK_STRUCT(csr_check_i64, int64_t)
};
