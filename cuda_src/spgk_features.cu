// The shortest-path kernel's explicit features (graphkern.spgk.features) on the GPU: the Gram
// matrix K = A B^T of two triplet-count matrices, in row tiles, exact in double (counts are
// integers; every product and partial sum stays an integer below 2^53).
//
//   spgk_features_scatter   a CSR count matrix into a zeroed dense row-major matrix (a warp a row)
//   spgk_features_gram      C = A[rows] B^T for one tile of rows of A: 64 x 64 outputs a block,
//                           4 x 4 a thread, the depth in steps of 16 through shared memory;
//                           optionally normalised, C / sqrt(dx dy) (0 where that is 0), with the
//                           same correctly rounded operations as the host.  A step of the depth
//                           is skipped where the tile of A or of B has no nonzero in it (flags per
//                           64-row tile and 16-column step, made on the host; with the columns
//                           ordered by frequency the rare triplets gather in steps most tiles skip).
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
                      const int64_t* __restrict__ counts, int64_t n_rows, double* __restrict__ dense, int64_t ld) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    for (int64_t r = (int64_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32; r < n_rows; r += warps) {
        for (int64_t k = indptr[r] + lane; k < indptr[r + 1]; k += 32) dense[r * ld + cols[k]] = (double)counts[k];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
spgk_features_gram(const double* __restrict__ A, int64_t rows, const double* __restrict__ B, int64_t cols,
                   int64_t depth, const uint8_t* __restrict__ a_steps, const uint8_t* __restrict__ b_steps,
                   const double* __restrict__ dx, const double* __restrict__ dy, double* __restrict__ C,
                   int64_t ldc) {
    __shared__ double As[DEPTH][TILE + 1];
    __shared__ double Bs[DEPTH][TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t i0 = (int64_t)blockIdx.y * TILE, j0 = (int64_t)blockIdx.x * TILE;
    const double* a = A + i0 * depth;
    const double* b = B + j0 * depth;
    const int64_t n_steps = depth / DEPTH;
    const uint8_t* fa = a_steps + blockIdx.y * n_steps;
    const uint8_t* fb = b_steps + blockIdx.x * n_steps;
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
            C[i * ldc + j] = value;
        }
    }
}
