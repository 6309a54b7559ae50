// The shortest-path kernel's explicit features (graphkern.spgk.features) on the GPU: each graph's
// triplet counts, and the Gram matrix K = A B^T of two triplet-count matrices, in row tiles, exact in
// double (counts are integers; every product and partial sum stays an integer below 2^53).
//
//   spgk_count_graphs       a warp a graph of at most 64 vertices, unweighted: a breadth-first search
//                           from each vertex over 64-bit rows, each path a < b counted once in a
//                           shared table over (rank of its lower label, rank of the higher, hops), the
//                           graph's labels ranked among its own; read back in (label a, label b, hops)
//                           order, both directions of a path (a cell of one label doubled).  Pass 0
//                           counts each graph's triplets and their squares and marks the batch's
//                           (label, label, hops) cells; pass 1 writes them at the graph's offset, each
//                           with its cell's column.  A graph whose table does not fit is flagged.
//   spgk_count_offsets      one block: each graph's first triplet (prefix sums of the counts)
//   spgk_count_columns      one block: the marked cells numbered in order, their keys and lengths
//   spgk_features_scatter   a CSR count matrix into a zeroed dense row-major matrix (a warp a row),
//                           column c at rank[c], and the flags of the (64-row tile, 16-column step)
//                           blocks that hold a nonzero (zeroed before; every writer stores 1)
//   spgk_features_gram      C = A[rows] B^T for one tile of rows of A: 64 x 64 outputs a block,
//                           4 x 4 a thread, the depth in steps of 16 through shared memory;
//                           optionally normalised, C / sqrt(dx dy) (0 where that is 0), with the
//                           same correctly rounded operations as the host.  A step of the depth
//                           is skipped where the tile of A or of B has no nonzero in it (with the
//                           columns ordered by frequency the rare triplets gather in steps most
//                           tiles skip).  ``mirror`` (B is A, C the whole N x N matrix, the tile's
//                           rows start at row0): only the blocks on and above the diagonal are
//                           computed, each off-diagonal one written to both sides, so after the
//                           launches of tiles 0..t the rows of tile t are complete.
// A and B are padded with zero rows to a multiple of 64 and zero columns to a multiple of 16, so
// the loads need no bounds checks; the stores check the true sizes.
#include <cstdint>

#include "common/exports.cuh"
#include "common/scan.cuh"

namespace {
constexpr int TILE = 64;
constexpr int DEPTH = 16;
constexpr int THREADS = 256;  // 16 x 16, each 4 x 4 outputs strided by 16
constexpr int COUNT_WARPS = 2;
constexpr int MAX_VERTICES = 64;  // a vertex's neighbours in one 64-bit row
// a graph's (label rank, label rank, hops) table, per warp: 16-bit cells (a graph of 64 vertices has
// 2016 paths), two to a 32-bit word
constexpr int LOCAL_CELLS = 8192;
constexpr int SCAN_THREADS = 1024;
}  // namespace

// The counting's output, in 64-bit words: a header (triplets, columns, distinct lengths, overflow),
// then row_offsets (G + 1), self_dot (G, double), the distinct lengths (MAX_VERTICES slots, double),
// the columns' keys and the graphs holding each column: what the host reads back in one copy once
// it knows the sizes from the header.  Pass 1 writes the CSR rows the Gram product reads on the
// device into `rows`, sized by then: after G + 1 words (for the offsets) each triplet's count, then
// each triplet's column (int32).
constexpr int64_t HEADER = 4;

__device__ __forceinline__ int64_t* column_keys(int64_t* out, int64_t n_graphs) {
    return out + HEADER + (n_graphs + 1) + n_graphs + MAX_VERTICES;
}

// The graphs a counting reads (graphkern.spgk.features.pack: each graph's first vertex and first stored
// entry, its local row pointers, column indices, each vertex's label id) and the batch's sizes: label
// ids below n_labels, graphs of at most `width` vertices.
struct PackedGraphs {
    const int64_t* __restrict__ node_offsets;
    const int64_t* __restrict__ edge_offsets;
    const int64_t* __restrict__ indptr;
    const int32_t* __restrict__ indices;
    const int64_t* __restrict__ labels;
    int64_t n_graphs, n_labels, width;
};
#define SPGK_PACKED_GRAPHS_FIELDS(X, N, S)                                                                      \
    X(N, S, node_offsets) X(N, S, edge_offsets) X(N, S, indptr) X(N, S, indices) X(N, S, labels) X(N, S, n_graphs) \
    X(N, S, n_labels) X(N, S, width)

// What both passes of a counting share: the (label, label, hops) cells used and the hop counts seen
// (zeroed before pass 0), each graph's number of triplets, the cells' columns (spgk_count_columns
// writes them, pass 1 reads them) and the output described above.
struct CountTables {
    int32_t* __restrict__ used;
    int32_t* __restrict__ hops;
    int32_t* __restrict__ found;
    int64_t* __restrict__ columns;
    int64_t* __restrict__ out;
};
#define SPGK_COUNT_TABLES_FIELDS(X, N, S) X(N, S, used) X(N, S, hops) X(N, S, found) X(N, S, columns) X(N, S, out)

// Taken by value: the fields are read where they are used, as parameters (no reference into the
// parameter space).
extern "C" __global__ void __launch_bounds__(COUNT_WARPS * 32)
spgk_count_graphs(const PackedGraphs graphs, const CountTables tables, int pass, int64_t* __restrict__ rows_out) {
    const int64_t* __restrict__ node_offsets = graphs.node_offsets;
    const int64_t* __restrict__ edge_offsets = graphs.edge_offsets;
    const int64_t* __restrict__ indptr = graphs.indptr;
    const int32_t* __restrict__ indices = graphs.indices;
    const int64_t* __restrict__ labels = graphs.labels;
    const int64_t n_graphs = graphs.n_graphs, n_labels = graphs.n_labels, width = graphs.width;
    int32_t* __restrict__ used = tables.used;
    int32_t* __restrict__ hops = tables.hops;
    int32_t* __restrict__ found = tables.found;
    const int64_t* __restrict__ columns = tables.columns;
    int64_t* __restrict__ out = tables.out;
    __shared__ uint64_t rows_s[COUNT_WARPS][MAX_VERTICES];
    __shared__ int64_t label_s[COUNT_WARPS][MAX_VERTICES];  // the graph's distinct labels, in order
    __shared__ int32_t rank_s[COUNT_WARPS][MAX_VERTICES];  // each vertex's label's place among them
    __shared__ uint32_t cells_s[COUNT_WARPS][LOCAL_CELLS / 2];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint64_t* rows = rows_s[w];
    int64_t* distinct = label_s[w];
    int32_t* rank = rank_s[w];
    uint32_t* cells = cells_s[w];
    const uint64_t below = (1ull << lane) - 1;
    const int64_t* row_offsets = out + HEADER;
    double* self_dot = reinterpret_cast<double*>(out + HEADER + n_graphs + 1);
    int64_t* keys = column_keys(out, n_graphs);
    unsigned long long* holding = reinterpret_cast<unsigned long long*>(keys + (pass ? out[1] : 0));
    int64_t* counts = pass ? rows_out + n_graphs + 1 : nullptr;
    int32_t* col = pass ? reinterpret_cast<int32_t*>(counts + out[0]) : nullptr;
    for (int64_t g = (int64_t)blockIdx.x * COUNT_WARPS + w; g < n_graphs; g += (int64_t)gridDim.x * COUNT_WARPS) {
        const int64_t base = node_offsets[g];
        const int n = (int)(node_offsets[g + 1] - base);  // at most MAX_VERTICES (the caller's check)
        const int64_t* rp = indptr + base + g;
        const int32_t* ix = indices + edge_offsets[g];
        const int64_t* lab = labels + base;
        // the rows, and which vertices hold the first occurrence of their label
        uint64_t first = 0;
        for (int k = 0; k < 2; ++k) {
            const int v = lane + 32 * k;
            bool is_first = false;
            if (v < n) {
                uint64_t row = 0;
                for (int64_t e = rp[v]; e < rp[v + 1]; ++e) row |= 1ull << ix[e];
                rows[v] = row;
                is_first = true;
                for (int u = 0; u < v && is_first; ++u) is_first = lab[u] != lab[v];
            }
            first |= (uint64_t)__ballot_sync(gk::kFullMask, is_first) << (32 * k);
        }
        const int L = __popcll(first);
        for (int k = 0; k < 2; ++k) {
            const int v = lane + 32 * k;
            if (v < n) {
                int r = 0;
                for (uint64_t f = first; f; f &= f - 1) r += lab[__ffsll(f) - 1] < lab[v];
                rank[v] = r;
                if ((first >> v) & 1) distinct[r] = lab[v];
            }
        }
        const int T = L * L * n;
        if (T > LOCAL_CELLS) {
            if (lane == 0 && !pass) {
                out[3] = 1;
                found[g] = 0;  // the offsets stay within the output; pass 1 skips the graph too
            }
            continue;
        }
        for (int q = lane; q < (T + 1) / 2; q += 32) cells[q] = 0;
        __syncwarp();
        // each path once, in the cell of its labels' ranks in increasing order
        for (int k = 0; k < 2; ++k) {
            const int a = lane + 32 * k;
            if (a >= n - 1) continue;
            const int ra = rank[a];
            uint64_t seen = 1ull << a, level = seen;
            for (int d = 1; level; ++d) {
                uint64_t next = 0;
                for (uint64_t f = level; f; f &= f - 1) next |= rows[__ffsll(f) - 1];
                level = next & ~seen;
                seen |= level;
                for (uint64_t rest = level & ~((2ull << a) - 1); rest; rest &= rest - 1) {
                    const int rb = rank[__ffsll(rest) - 1];
                    const int cell = (min(ra, rb) * L + max(ra, rb)) * n + d;
                    atomicAdd(&cells[cell >> 1], 1u << (16 * (cell & 1)));
                }
            }
        }
        __syncwarp();
        // read in (label a, label b, hops) order
        int64_t running = pass ? row_offsets[g] : 0, squares = 0;
        for (int q0 = 0; q0 < T; q0 += 32) {
            const int q = q0 + lane;
            int64_t c = 0;
            int x = 0, y = 0, d = 0;
            if (q < T) {
                x = q / (L * n);
                y = q / n % L;
                d = q % n;
                const int cell = (min(x, y) * L + max(x, y)) * n + d;
                c = (cells[cell >> 1] >> (16 * (cell & 1))) & 0xffff;
                if (x == y) c *= 2;
            }
            const unsigned mask = __ballot_sync(gk::kFullMask, c != 0);
            if (c) {
                const int64_t cell = (distinct[x] * n_labels + distinct[y]) * width + d;
                if (pass) {
                    const int64_t at = running + __popc(mask & (unsigned)below);
                    col[at] = (int32_t)columns[cell];
                    counts[at] = c;
                    atomicAdd(&holding[columns[cell]], 1ull);
                } else {
                    used[cell] = 1;
                    hops[d] = 1;
                    squares += c * c;
                }
            }
            running += __popc(mask);
        }
        if (!pass) {
            squares = gk::group_sum_down(squares, 32);
            if (lane == 0) {
                found[g] = (int32_t)running;
                self_dot[g] = (double)squares;
            }
        }
        __syncwarp();  // the tables are free for the next graph
    }
}

// Each thread a run of consecutive values: their sum, the block's exclusive scan of the sums.
__device__ __forceinline__ int64_t scan_runs(const int32_t* in, int64_t n, int64_t* lo, int64_t* hi, int64_t* total) {
    const int64_t run = (n + SCAN_THREADS - 1) / SCAN_THREADS;
    *lo = min(n, (int64_t)threadIdx.x * run);
    *hi = min(n, *lo + run);
    int64_t local = 0;
    for (int64_t i = *lo; i < *hi; ++i) local += in[i];
    return gk::block_exclusive_scan(local, total);
}

// The graphs' offsets: row_offsets = the exclusive prefix sums of found, out[0] the triplets.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
spgk_count_offsets(const int32_t* __restrict__ found, int64_t n_graphs, int64_t* __restrict__ out) {
    int64_t lo, hi, total;
    int64_t running = scan_runs(found, n_graphs, &lo, &hi, &total);
    for (int64_t i = lo; i < hi; ++i) {
        out[HEADER + i] = running;
        running += found[i];
    }
    if (threadIdx.x == 0) {
        out[HEADER + n_graphs] = total;
        out[0] = total;
    }
}

// The columns: each marked cell (label a, label b, hops) numbered in order (columns), its key
// a << 2 id_bits | b << id_bits | the hop count's place among the distinct ones, its count of graphs
// zeroed; out[1] the columns, out[2] the distinct hop counts, listed as doubles after self_dot.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
spgk_count_columns(const PackedGraphs graphs, const CountTables tables, int id_bits) {
    const int32_t* __restrict__ used = tables.used;
    const int32_t* __restrict__ hops = tables.hops;
    int64_t* __restrict__ columns = tables.columns;
    int64_t* __restrict__ out = tables.out;
    const int64_t n_labels = graphs.n_labels, width = graphs.width, n_graphs = graphs.n_graphs;
    const int64_t n_cells = n_labels * n_labels * width;
    __shared__ int64_t place[MAX_VERTICES];
    if (threadIdx.x == 0) {
        double* lengths = reinterpret_cast<double*>(out + HEADER + (n_graphs + 1) + n_graphs);
        int64_t k = 0;
        for (int d = 0; d < width; ++d) {
            place[d] = k;
            if (hops[d]) lengths[k++] = (double)d;
        }
        out[2] = k;
    }
    int64_t lo, hi, total;
    int64_t running = scan_runs(used, n_cells, &lo, &hi, &total);  // (its barriers publish place)
    int64_t* keys = column_keys(out, n_graphs);
    int64_t* holding = keys + total;
    for (int64_t i = lo; i < hi; ++i) {
        columns[i] = running;
        if (used[i]) {
            const int64_t pair = i / width, a = pair / n_labels, b = pair % n_labels;
            holding[running] = 0;
            keys[running++] = a << (2 * id_bits) | b << id_bits | place[i % width];
        }
    }
    if (threadIdx.x == 0) out[1] = total;
}

extern "C" __global__ void __launch_bounds__(THREADS)
spgk_features_scatter(const int64_t* __restrict__ indptr, const int32_t* __restrict__ cols,
                      const int64_t* __restrict__ counts, const int32_t* __restrict__ rank, int64_t n_rows,
                      double* __restrict__ dense, int64_t ld, uint8_t* __restrict__ steps) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    for (int64_t r = (int64_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32; r < n_rows; r += warps) {
        for (int64_t k = indptr[r] + lane; k < indptr[r + 1]; k += 32) {
            const int64_t c = rank[cols[k]];
            dense[r * ld + c] = (double)counts[k];
            steps[r / TILE * (ld / DEPTH) + c / DEPTH] = 1;
        }
    }
}

// One operand of the product: dense rows of `ld` columns (a multiple of DEPTH, zero-padded rows to a
// multiple of TILE), the flags of its (TILE rows, DEPTH columns) blocks that hold a nonzero, `count`
// true rows, and for a normalised product each row's K(G, G) (null: raw).
struct DenseRows {
    const double* __restrict__ values;
    const uint8_t* __restrict__ steps;
    const double* __restrict__ self_dot;
    int64_t count, ld;
};
#define SPGK_DENSE_ROWS_FIELDS(X, N, S) X(N, S, values) X(N, S, steps) X(N, S, self_dot) X(N, S, count) X(N, S, ld)

// Where a tile of the product goes: C with `ldc` columns; `row0` the tile's first row of A; `mirror`
// as described at the top of the file.
struct GramTile {
    double* __restrict__ C;
    int64_t ldc, row0;
    int32_t mirror;
};
#define SPGK_GRAM_TILE_FIELDS(X, N, S) X(N, S, C) X(N, S, ldc) X(N, S, row0) X(N, S, mirror)

// Taken by value, the fields read at entry (no reference into the parameter space in the loops).
extern "C" __global__ void __launch_bounds__(THREADS)
spgk_features_gram(const DenseRows tile_rows, const DenseRows all_rows, const GramTile out) {
    const double* __restrict__ A = tile_rows.values;
    const double* __restrict__ B = all_rows.values;
    const uint8_t* __restrict__ a_steps = tile_rows.steps;
    const uint8_t* __restrict__ b_steps = all_rows.steps;
    const double* __restrict__ dx = tile_rows.self_dot;
    const double* __restrict__ dy = all_rows.self_dot;
    const int64_t rows = tile_rows.count, cols = all_rows.count, depth = tile_rows.ld;
    double* __restrict__ C = out.C;
    const int64_t ldc = out.ldc, row0 = out.row0;
    const bool mirror = out.mirror != 0;
    __shared__ double As[DEPTH][TILE + 1];
    __shared__ double Bs[DEPTH][TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    // i counts from the tile's first row (A, dx, a_steps, and C unless mirror); j from B's first
    const int64_t i0 = (int64_t)blockIdx.y * TILE, j0 = (int64_t)blockIdx.x * TILE + (mirror ? row0 : 0);
    if (mirror && j0 < row0 + i0) return;  // below the diagonal: written by the block above it
    const double* a = A + i0 * depth;
    const double* b = B + j0 * depth;
    const int64_t n_steps = depth / DEPTH;
    const uint8_t* fa = a_steps + blockIdx.y * n_steps;
    const uint8_t* fb = b_steps + j0 / TILE * n_steps;
    const int64_t c_row = mirror ? row0 : 0;  // C's row of the tile's first row
    double acc[4][4] = {};
    for (int64_t k0 = 0; k0 < depth; k0 += DEPTH) {
        if (!(fa[k0 / DEPTH] & fb[k0 / DEPTH])) continue;  // the same for the whole block
#pragma unroll
        for (int q = 0; q < TILE * DEPTH / THREADS; ++q) {
            const int idx = threadIdx.x + q * THREADS;
            const int r = idx / DEPTH, k = idx % DEPTH;
            As[k][r] = a[r * depth + k0 + k];
            Bs[k][r] = b[r * depth + k0 + k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < DEPTH; ++k) {
            double av[4], bv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                av[u] = As[k][ty + 16 * u];
                bv[u] = Bs[k][tx + 16 * u];
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[u][v] = fma(av[u], bv[v], acc[u][v]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int64_t i = i0 + ty + 16 * u;
        if (i >= rows) continue;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int64_t j = j0 + tx + 16 * v;
            if (j >= cols) continue;
            double value = acc[u][v];
            if (dx != nullptr) {
                const double scale = sqrt(dx[i] * dy[j]);
                value = scale > 0.0 ? value / scale : 0.0;
            }
            C[(c_row + i) * ldc + j] = value;
            if (mirror && j0 != row0 + i0) C[j * ldc + row0 + i] = value;
        }
    }
}

// The tiles of the product and the counting's limits and output layout, for
// graphkern/spgk/features_gpu.py
GRAPHKERN_EXPORTS = {
    {"tile", TILE},
    {"depth", DEPTH},
    {"threads", THREADS},
    {"count_warps", COUNT_WARPS},
    {"max_vertices", MAX_VERTICES},
    {"header", HEADER},
    GK_STRUCT("graphs", PackedGraphs, SPGK_PACKED_GRAPHS_FIELDS)
    GK_STRUCT("tables", CountTables, SPGK_COUNT_TABLES_FIELDS)
    GK_STRUCT("dense_rows", DenseRows, SPGK_DENSE_ROWS_FIELDS)
    GK_STRUCT("gram_tile", GramTile, SPGK_GRAM_TILE_FIELDS)
};
