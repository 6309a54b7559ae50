// The degree order of A, built on the device from A's row pointers as uploaded (int64): the rows by
// decreasing degree, ties in row order, dealt round robin to `parts` blocks (graphkern.expm.order.
// DeviceOrder launches these kernels).  A stable counting sort:
//   degree_order_count     each tile of rows counts its degrees below `buckets`; longer ("big") rows
//                          leave a key (degree, row) in a list instead;
//   degree_order_tiles     per degree, the tiles' counts become each tile's first place within it;
//   degree_order_starts    degrees in decreasing order give each degree's first place (after the
//                          big rows);
//   degree_order_scatter   one warp per tile walks its rows in order, ranking equal degrees within
//                          each 32 rows by __match_any_sync, so ties keep row order;
//   degree_order_big       each big row's place is the number of big keys ahead of it;
// then each device's block takes its row pointers, the prefix sums of its rows' degrees in their
// new places (chunk sums, their scan, the pointers), and its rowblock SpMV plan, the task table
// of graphkern._cpu.expm.rowblock_tasks built the same way (counts per chunk of rows, their scan,
// the tasks), so that the host does no pass over A while A's entries cross the link.
#pragma once

#include <cstdint>

#include "common/reductions.cuh"
#include "common/scan.cuh"

namespace {

using gk::block_exclusive_scan;

// Rows per chunk of the scans: kBlock threads, kScanItems consecutive rows each.
constexpr int kScanItems = 16;
constexpr int64_t kScanChunk = (int64_t)kBlock * kScanItems;

// Where the q-th row by degree lands when the rows are dealt round robin to `parts` blocks of
// `per` rows (the first `extra` blocks one more).
__device__ __forceinline__ int64_t dealt(int64_t q, int64_t parts, int64_t per, int64_t extra) {
    const int64_t p = q % parts;
    return p * per + (p < extra ? p : extra) + q / parts;
}

}  // namespace

// What the degree order's kernels share (graphkern/expm/order.py packs it once per order): A's row
// pointers and rows; the counting's tiles of `tile_rows` rows, `buckets` degrees counted (longer
// rows are big: their keys and count); per degree the tiles' counts, its total and first place; the
// deal over `parts` blocks of `per` rows (the first `extra` one more); and the outputs.
struct DegreeOrder {
    const int64_t* indptr;
    int64_t n;
    int64_t tile_rows, tiles;
    int32_t buckets;
    int32_t* tile_counts;
    int32_t* totals;
    int32_t* starts;
    uint64_t* big_keys;
    unsigned long long* n_big;
    int64_t parts, per, extra;
    int32_t *order, *inverse, *new_degree;
};
#define EXPM_DEGREE_ORDER_FIELDS(X, N, S)                                                                        \
    X(N, S, indptr) X(N, S, n) X(N, S, tile_rows) X(N, S, tiles) X(N, S, buckets) X(N, S, tile_counts)           \
    X(N, S, totals) X(N, S, starts) X(N, S, big_keys) X(N, S, n_big) X(N, S, parts) X(N, S, per) X(N, S, extra) \
    X(N, S, order) X(N, S, inverse) X(N, S, new_degree)

namespace {

__device__ __forceinline__ void place_row(const DegreeOrder& o, int64_t q, int64_t row, int64_t degree) {
    const int64_t p = dealt(q, o.parts, o.per, o.extra);
    o.order[p] = (int32_t)row;
    o.inverse[row] = (int32_t)p;
    o.new_degree[p] = (int32_t)degree;
}

}  // namespace

// dst[i] = src[i], i < n: row pointers uploaded as int32, widened for the kernels that read A as given.
extern "C" __global__ void __launch_bounds__(kBlock) widen_pointers(const int32_t* __restrict__ src, int64_t n,
                                                                    int64_t* __restrict__ dst) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}

// Block t counts the degrees of rows [t * tile_rows, (t + 1) * tile_rows) below `buckets` into
// tile_counts[t * buckets + d] (dynamic shared memory: `buckets` ints); each longer row appends the
// key (degree << 32 | ~row), larger for an earlier place, to big_keys (n_big counts them).
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_count(const DegreeOrder o) {
    extern __shared__ int32_t hist[];
    const int32_t buckets = o.buckets;
    for (int b = threadIdx.x; b < buckets; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const int64_t r0 = (int64_t)blockIdx.x * o.tile_rows;
    const int64_t r1 = min(o.n, r0 + o.tile_rows);
    for (int64_t i = r0 + threadIdx.x; i < r1; i += blockDim.x) {
        const int64_t d = o.indptr[i + 1] - o.indptr[i];
        if (d < buckets) {
            atomicAdd(&hist[d], 1);
        } else {
            o.big_keys[atomicAdd(o.n_big, 1ULL)] = ((uint64_t)d << 32) | (uint32_t)~(uint32_t)i;
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < buckets; b += blockDim.x) o.tile_counts[(int64_t)blockIdx.x * buckets + b] = hist[b];
}

// For each degree d (a thread each): the tiles' counts become their exclusive prefix over the tiles
// (each tile's first place among the rows of degree d) and totals[d] the number of such rows.
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_tiles(const DegreeOrder o) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= o.buckets) return;
    int32_t running = 0;
    for (int64_t t = 0; t < o.tiles; ++t) {
        const int32_t c = o.tile_counts[t * o.buckets + d];
        o.tile_counts[t * o.buckets + d] = running;
        running += c;
    }
    o.totals[d] = running;
}

// One block: starts[d] = the big rows, then every row of degree above d (degrees decreasing).
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_starts(const DegreeOrder o) {
    const int32_t buckets = o.buckets;
    int64_t carry = (int64_t)*o.n_big;
    for (int32_t base = 0; base < buckets; base += kBlock) {
        const int32_t k = base + (int32_t)threadIdx.x;  // k-th degree from the largest
        const int32_t d = buckets - 1 - k;
        const int64_t v = k < buckets ? o.totals[d] : 0;
        int64_t total;
        const int64_t before = block_exclusive_scan(v, &total);
        if (k < buckets) o.starts[d] = (int32_t)(carry + before);
        carry += total;
    }
}

// One warp per tile: the tile's rows in order, 32 at a time; lanes of one degree take consecutive
// places in lane order (their rank among the equal keys of __match_any_sync), then the last of them
// advances that degree's next place.
extern "C" __global__ void __launch_bounds__(kWarp) degree_order_scatter(const DegreeOrder o) {
    extern __shared__ int32_t next[];
    const int lane = threadIdx.x;
    const int32_t buckets = o.buckets;
    for (int b = lane; b < buckets; b += kWarp)
        next[b] = o.starts[b] + o.tile_counts[(int64_t)blockIdx.x * buckets + b];
    __syncwarp();
    const int64_t r0 = (int64_t)blockIdx.x * o.tile_rows;
    const int64_t r1 = min(o.n, r0 + o.tile_rows);
    for (int64_t base = r0; base < r1; base += kWarp) {
        const int64_t i = base + lane;
        const int64_t d = i < r1 ? o.indptr[i + 1] - o.indptr[i] : -1;
        const bool counted = d >= 0 && d < buckets;
        const unsigned peers = __match_any_sync(kFullMask, counted ? (unsigned)d : 0xffffffffu);
        const int rank = __popc(peers & ((1u << lane) - 1));
        const int64_t q = counted ? (int64_t)next[d] + rank : 0;
        __syncwarp();
        if (counted && rank == __popc(peers) - 1) next[d] += __popc(peers);
        __syncwarp();
        if (counted) place_row(o, q, i, d);
    }
}

// Each big row's place: how many big keys are larger (a longer row, or as long and earlier).  The
// keys pass through shared memory in tiles; at most nnz / buckets rows are big.
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_big(const DegreeOrder o) {
    __shared__ uint64_t tile[kBlock];
    const uint64_t* __restrict__ big_keys = o.big_keys;
    const int64_t count = (int64_t)*o.n_big;
    for (int64_t first = (int64_t)blockIdx.x * blockDim.x; first < count; first += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = first + threadIdx.x;
        const uint64_t key = j < count ? big_keys[j] : 0;
        int64_t ahead = 0;
        for (int64_t t0 = 0; t0 < count; t0 += kBlock) {
            __syncthreads();
            if (t0 + threadIdx.x < count) tile[threadIdx.x] = big_keys[t0 + threadIdx.x];
            __syncthreads();
            const int m = (int)(count - t0 < kBlock ? count - t0 : kBlock);
            for (int k = 0; k < m; ++k) ahead += tile[k] > key;
        }
        if (j < count) {
            const int64_t row = (uint32_t)~(uint32_t)(key & 0xffffffffu);
            place_row(o, ahead, row, (int64_t)(key >> 32));
        }
    }
}

// sums[c] = the degrees of chunk c (kScanChunk places).
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_chunk_sums(const int32_t* __restrict__ degree,
                                                                             int64_t n, int64_t* sums) {
    const int64_t i0 = (int64_t)blockIdx.x * kScanChunk + (int64_t)threadIdx.x * kScanItems;
    int64_t local = 0;
    for (int k = 0; k < kScanItems; ++k) local += i0 + k < n ? degree[i0 + k] : 0;
    int64_t total;
    block_exclusive_scan(local, &total);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

// One block: sums[0, chunks) become their exclusive prefix and sums[chunks] their total.
extern "C" __global__ void __launch_bounds__(kBlock) scan_chunk_sums(int64_t* sums, int64_t chunks) {
    int64_t carry = 0;
    for (int64_t base = 0; base < chunks; base += kBlock) {
        const int64_t c = base + threadIdx.x;
        const int64_t v = c < chunks ? sums[c] : 0;
        int64_t total;
        const int64_t before = block_exclusive_scan(v, &total);
        if (c < chunks) sums[c] = carry + before;
        carry += total;
    }
    if (threadIdx.x == 0) sums[chunks] = carry;
}

// new_indptr[i + 1] = the degrees of places [0, i], from each chunk's prefix.
extern "C" __global__ void __launch_bounds__(kBlock) degree_order_pointers(const int32_t* __restrict__ degree,
                                                                           int64_t n, const int64_t* __restrict__ sums,
                                                                           int64_t* __restrict__ new_indptr) {
    const int64_t i0 = (int64_t)blockIdx.x * kScanChunk + (int64_t)threadIdx.x * kScanItems;
    int32_t d[kScanItems];
    int64_t local = 0;
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
        d[k] = i0 + k < n ? degree[i0 + k] : 0;
        local += d[k];
    }
    int64_t total;
    int64_t running = sums[blockIdx.x] + block_exclusive_scan(local, &total);
    if (blockIdx.x == 0 && threadIdx.x == 0) new_indptr[0] = 0;
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
        running += d[k];
        if (i0 + k < n) new_indptr[i0 + k + 1] = running;
    }
}

// The rowblock plan's rules (graphkern._cpu.expm.rowblock_tasks): row r starts a block when it is
// the first, when ip[r] + r reaches a multiple of `cost` that ip[r - 1] + r - 1 did not, or when it
// or the row before is longer than long_row; a block is one stream task, a long row's block one
// task per segment of `segment` entries.  A kernel parameter (graphkern/expm/order.py packs it).
struct RowblockRule {
    int64_t nrows, cost, long_row, segment, stream_kind, long_kind;

    template <typename P>
    __device__ __forceinline__ bool starts(const P* ip, int64_t r) const {
        if (r == 0) return true;
        const int64_t a = ip[r - 1], b = ip[r], c = ip[r + 1];
        return (b + r) / cost > (a + r - 1) / cost || c - b > long_row || b - a > long_row;
    }

    // (tasks, long rows, segments) that row r adds
    template <typename P>
    __device__ __forceinline__ void counts(const P* ip, int64_t r, int64_t (&v)[3]) const {
        v[0] = v[1] = v[2] = 0;
        if (r >= nrows || !starts(ip, r)) return;
        const int64_t d = (int64_t)ip[r + 1] - ip[r];
        if (d > long_row) {
            v[1] = 1;
            v[0] = v[2] = (d + segment - 1) / segment;
        } else {
            v[0] = 1;
        }
    }
};
#define EXPM_ROWBLOCK_RULE_FIELDS(X, N, S) \
    X(N, S, nrows) X(N, S, cost) X(N, S, long_row) X(N, S, segment) X(N, S, stream_kind) X(N, S, long_kind)

namespace {

template <typename P>
__device__ void local_pointers(const int64_t* __restrict__ new_indptr, int64_t row0, int64_t nrows,
                               P* __restrict__ local) {
    const int64_t e0 = new_indptr[row0];
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= nrows; i += stride) {
        local[i] = (P)(new_indptr[row0 + i] - e0);
    }
}

template <typename P>
__device__ void rowblock_count(const P* __restrict__ ip, RowblockRule rule, int64_t chunks, int64_t* sums) {
    const int64_t r0 = (int64_t)blockIdx.x * kScanChunk + (int64_t)threadIdx.x * kScanItems;
    int64_t local[3] = {0, 0, 0}, v[3];
    for (int k = 0; k < kScanItems; ++k) {
        rule.counts(ip, r0 + k, v);
        for (int j = 0; j < 3; ++j) local[j] += v[j];
    }
    for (int j = 0; j < 3; ++j) {
        int64_t total;
        block_exclusive_scan(local[j], &total);
        if (threadIdx.x == 0) sums[j * (chunks + 1) + blockIdx.x] = total;
    }
}

template <typename P>
__device__ void rowblock_write(const P* __restrict__ ip, RowblockRule rule, int64_t chunks,
                               const int64_t* __restrict__ sums, int64_t* __restrict__ tasks) {
    const int64_t r0 = (int64_t)blockIdx.x * kScanChunk + (int64_t)threadIdx.x * kScanItems;
    int64_t local[3] = {0, 0, 0}, at[3], v[3];
    for (int k = 0; k < kScanItems; ++k) {
        rule.counts(ip, r0 + k, v);
        for (int j = 0; j < 3; ++j) local[j] += v[j];
    }
    for (int j = 0; j < 3; ++j) {
        int64_t total;
        at[j] = sums[j * (chunks + 1) + blockIdx.x] + block_exclusive_scan(local[j], &total);
    }
    const int64_t n_tasks = sums[chunks];
    for (int k = 0; k < kScanItems; ++k) {
        const int64_t r = r0 + k;
        if (r >= rule.nrows) break;
        const int64_t e0 = ip[r], e1 = ip[r + 1];
        if (r + 1 == rule.nrows && e1 - e0 <= rule.long_row) {  // the last block ends the rows
            tasks[(n_tasks - 1) * kTaskWidth + 2] = rule.nrows;
            tasks[(n_tasks - 1) * kTaskWidth + 4] = e1;
        }
        rule.counts(ip, r, v);
        if (v[0] == 0) continue;
        if (r > 0 && e0 - (int64_t)ip[r - 1] <= rule.long_row) {  // ends the stream block before it
            tasks[(at[0] - 1) * kTaskWidth + 2] = r;
            tasks[(at[0] - 1) * kTaskWidth + 4] = e0;
        }
        int64_t* t = tasks + at[0] * kTaskWidth;
        if (v[1]) {
            for (int64_t j = 0; j < v[2]; ++j, t += kTaskWidth) {
                const int64_t s0 = e0 + j * rule.segment;
                t[0] = rule.long_kind;
                t[1] = r;
                t[2] = s0;
                t[3] = s0 + rule.segment < e1 ? s0 + rule.segment : e1;
                t[4] = at[2];
                t[5] = j;
                t[6] = v[2];
                t[7] = at[1];
            }
        } else {
            t[0] = rule.stream_kind;
            t[1] = r;
            t[3] = e0;
            t[5] = t[6] = t[7] = 0;
        }
        for (int j = 0; j < 3; ++j) at[j] += v[j];
    }
}

}  // namespace

#define DEFINE_DEVICE_PLAN(P, PN)                                                                              \
    extern "C" __global__ void __launch_bounds__(kBlock) degree_order_local_pointers_##PN(                     \
        const int64_t *new_indptr, int64_t row0, int64_t nrows, P *local) {                                    \
        local_pointers<P>(new_indptr, row0, nrows, local);                                                    \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(kBlock) rowblock_count_##PN(                                 \
        const P *ip, const RowblockRule rule, int64_t chunks, int64_t *sums) {                                 \
        rowblock_count<P>(ip, rule, chunks, sums);                                                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(kBlock) rowblock_write_##PN(                                 \
        const P *ip, const RowblockRule rule, int64_t chunks, const int64_t *sums, int64_t *tasks) {           \
        rowblock_write<P>(ip, rule, chunks, sums, tasks);                                                      \
    }

DEFINE_DEVICE_PLAN(int32_t, i32)
DEFINE_DEVICE_PLAN(int64_t, i64)
