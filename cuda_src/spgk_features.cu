// The shortest-path kernel's explicit features (graphkern.spgk.features) on the GPU: the Gram
// matrix K = A B^T of two triplet-count matrices, in row tiles, exact in double (counts are
// integers; every product and partial sum stays an integer below 2^53).
//
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

namespace {
constexpr int TILE = 64;
constexpr int DEPTH = 16;
constexpr int THREADS = 256;  // 16 x 16, each 4 x 4 outputs strided by 16
}  // namespace

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

extern "C" __global__ void __launch_bounds__(THREADS)
spgk_features_gram(const double* __restrict__ A, int64_t rows, const double* __restrict__ B, int64_t cols,
                   int64_t depth, const uint8_t* __restrict__ a_steps, const uint8_t* __restrict__ b_steps,
                   const double* __restrict__ dx, const double* __restrict__ dy, double* __restrict__ C,
                   int64_t ldc, int64_t row0, int mirror) {
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
