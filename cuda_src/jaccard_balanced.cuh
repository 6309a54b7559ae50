// The balanced, hub and longrow variants of cuda_src/jaccard.cu: the work of every upper entry laid
// on one line by a prefix sum and cut into equal chunks, partial intersections met through
// atomics, then a finalize pass; the hub bitmaps and row hash tables their searches use.
#pragma once

#include "jaccard_core.cuh"

namespace jaccard {

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

// The rows given a hash table (jaccard_row_hashes' argument, graphkern/similarity/gpu.py packs it):
// the rows listed, their first items on one line and the first slots of their tables, how many rows
// and items; where the tables go: each vertex's first slot (-1: none) and the slots.
struct RowTables {
    const int32_t* __restrict__ rows;
    const int64_t* __restrict__ items;
    const int64_t* __restrict__ slots;
    int32_t n_rows;
    int64_t n_items;
    int64_t* __restrict__ hash_off;
    int32_t* __restrict__ hash_keys;
};
#define JACCARD_ROW_TABLES_FIELDS(X, N, S) \
    X(N, S, rows) X(N, S, items) X(N, S, slots) X(N, S, n_rows) X(N, S, n_items) X(N, S, hash_off) X(N, S, hash_keys)

// The tables of the rows listed in table_rows (longrow, unweighted: the rows the host chose, see
// graphkern/similarity/plan.py hash_table_rows), in hash_keys, which the host clears to kHashEmpty on
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

}  // namespace jaccard
