// Marginalized graph kernel on the GPU: all pairs of a Gram matrix in one launch, one warp per
// pair, diagonally preconditioned CG with the Kronecker matrix-vector product (XMV) formed on
// the fly from 8x8 tiles ("octiles") of the two graphs.
//
// Data (graphkern/_mgk_data.py builds it):
//   per graph: its vertices' degree (row sums of the weights) and feature rows, and its
//   non-empty octiles, sorted by tile row then tile column; tile_rowptr gives each tile row's
//   first tile.  An octile holds `channels` planes of 64 values, element (r, s) at 8 r + s:
//   plane 0 the edge weights (0 where there is no edge), plane 1 + f edge feature f.
//
// The XMV y = (A1 (x) A2 (.) E) p for one pair visits output blocks (R1, R2) of 8 x 8 vertex
// pairs; for each tile t1 in tile row R1 of G1 and t2 in tile row R2 of G2 it applies the
// 64 x 64 block A1[t1] (x) A2[t2] (.) E to the 64-entry slice of p at (col(t1), col(t2)).
// Octiles and the slice are staged in shared memory; lane (a, b) owns the two outputs
// (R1*8 + a, R2*8 + b) and (R1*8 + a + 4, R2*8 + b) in registers for the whole block, so y is
// written once per block with no atomics.  The edge kernel is evaluated per element pair:
// no product matrix is ever stored.  Edge kernels that ignore labels factorize the block as
// W1 X W2^T (2 * 2 * 8^3 flops instead of 64 * 64 * 3).
//
// CG vectors live in global scratch, one slot per resident warp (grid-stride over pairs);
// dot products are accumulated in double in both precisions and reduced by warp shuffles.
#include <cstdint>

#include "mgk_program.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kOctile = 8;
constexpr int kOctileSize = 64;
constexpr int kWarpsPerBlock = 4;  // graphkern/_mgk_gpu.py launches 128 threads and sizes shared memory for 4 warps
// ptxas -v (sm_90): 136-168 registers and no spills with 3 resident blocks (12 warps) per SM;
// asking for 4 or more blocks spills inside the XMV.
constexpr int kMinBlocksPerSM = 3;
constexpr int kMaxParams = 96;     // params per program (graphkern.basekernels.MAX_TERMS = 24 terms fit)
constexpr unsigned kFullMask = 0xffffffffu;

enum : int { EDGE_GENERAL = 0, EDGE_CONSTANT = 1, EDGE_KRONECKER = 2, EDGE_SQEXP = 3 };
enum : int { VEC_X = 0, VEC_R = 1, VEC_P = 2, VEC_AP = 3, VEC_DIAG = 4, N_VECTORS = 5 };

// Vertex-kernel values that underflow would make the diagonal D/V infinite (same floor as the CPU).
constexpr double kVertexKernelFloor = 1e-20;

template <typename T>
struct GraphSet {
    const int64_t* __restrict__ node_off;    // graph -> first vertex (n_graphs + 1)
    const int64_t* __restrict__ rowptr_off;  // graph -> its tile-row pointers in tile_rowptr
    const int32_t* __restrict__ tile_rowptr; // global index of each tile row's first tile
    const int32_t* __restrict__ tile_col;    // tile column of each tile
    const T* __restrict__ tile_val;          // [tile][channel][64]
    const T* __restrict__ degree;            // per vertex
    const T* __restrict__ node_feat;         // [vertex][n_feat]
    int n_feat;
    int channels;
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

template <int FORM>
__host__ __device__ constexpr int fixed_staged_channels() {
    return FORM == EDGE_CONSTANT ? 1 : (FORM == EDGE_GENERAL ? 0 : 2);
}

// Planes of an octile copied to shared memory: the weights, plus the edge kernel's feature
// plane (shortcut forms) or every feature plane (the general interpreter).
template <typename T, int FORM>
__device__ __forceinline__ void stage_octile(T* __restrict__ dst, const T* __restrict__ tile, int channels,
                                             int ek_channel, int lane) {
    if (FORM == EDGE_GENERAL) {
        for (int c = 0; c < channels; ++c) {
            dst[c * kOctileSize + lane] = tile[c * kOctileSize + lane];
            dst[c * kOctileSize + lane + kWarp] = tile[c * kOctileSize + lane + kWarp];
        }
    } else {
        dst[lane] = tile[lane];
        dst[lane + kWarp] = tile[lane + kWarp];
        if (FORM != EDGE_CONSTANT) {
            dst[kOctileSize + lane] = tile[ek_channel * kOctileSize + lane];
            dst[kOctileSize + lane + kWarp] = tile[ek_channel * kOctileSize + lane + kWarp];
        }
    }
}

template <typename T, int FORM>
__device__ __forceinline__ T edge_shortcut(T e1, T e2, T ek_theta, T ek_aux) {
    if (FORM == EDGE_KRONECKER) return e1 == e2 ? T(1) : ek_theta;
    const T diff = e1 - e2;
    return mgk::exp_of(ek_aux * diff * diff);
}

// acc_u/acc_l += rows a and a + 4 (against column b) of (W1 (x) W2 (.) E) applied to the slice xs.
template <typename T, int FORM>
__device__ __forceinline__ void octile_product(const T* __restrict__ t1, const T* __restrict__ t2,
                                               const T* __restrict__ xs, int a, int b, T& acc_u, T& acc_l,
                                               T ek_theta, T ek_aux, const int* ecode, const T* epar) {
    if (FORM == EDGE_CONSTANT) {
        T w2[kOctile];
#pragma unroll
        for (int d = 0; d < kOctile; ++d) w2[d] = t2[b * kOctile + d];
#pragma unroll 1  // unrolling the columns too costs registers (spills at 4 blocks/SM)
        for (int c = 0; c < kOctile; ++c) {
            T s = 0;
#pragma unroll
            for (int d = 0; d < kOctile; ++d) s += w2[d] * xs[c * kOctile + d];
            acc_u += t1[a * kOctile + c] * s;
            acc_l += t1[(a + 4) * kOctile + c] * s;
        }
    } else if (FORM == EDGE_KRONECKER || FORM == EDGE_SQEXP) {
        T w2[kOctile], e2[kOctile];
#pragma unroll
        for (int d = 0; d < kOctile; ++d) {
            w2[d] = t2[b * kOctile + d];
            e2[d] = t2[kOctileSize + b * kOctile + d];
        }
#pragma unroll 1  // unrolling the columns too costs registers (spills at 4 blocks/SM)
        for (int c = 0; c < kOctile; ++c) {
            const T w1u = t1[a * kOctile + c], w1l = t1[(a + 4) * kOctile + c];
            const T e1u = t1[kOctileSize + a * kOctile + c], e1l = t1[kOctileSize + (a + 4) * kOctile + c];
            T su = 0, sl = 0;
#pragma unroll
            for (int d = 0; d < kOctile; ++d) {
                const T s = w2[d] * xs[c * kOctile + d];
                su += edge_shortcut<T, FORM>(e1u, e2[d], ek_theta, ek_aux) * s;
                sl += edge_shortcut<T, FORM>(e1l, e2[d], ek_theta, ek_aux) * s;
            }
            acc_u += w1u * su;
            acc_l += w1l * sl;
        }
    } else {
        for (int c = 0; c < kOctile; ++c) {
            const int iu = a * kOctile + c, il = (a + 4) * kOctile + c;
            T su = 0, sl = 0;
            for (int d = 0; d < kOctile; ++d) {
                const int j = b * kOctile + d;
                const T s = t2[j] * xs[c * kOctile + d];
                su += mgk::eval_program(ecode, epar, t1 + kOctileSize + iu, kOctileSize, t2 + kOctileSize + j,
                                        kOctileSize) * s;
                sl += mgk::eval_program(ecode, epar, t1 + kOctileSize + il, kOctileSize, t2 + kOctileSize + j,
                                        kOctileSize) * s;
            }
            acc_u += t1[iu] * su;
            acc_l += t1[il] * sl;
        }
    }
}

// Ap = diag .* p - ek_scale * (A1 (x) A2 (.) E) p for one pair; the warp's shared staging area is
// s_t1 (octile of G1), s_t2 (octile of G2), s_x (slice of p), each `staged` planes of 64.
template <typename T, int FORM>
__device__ void xmv(const GraphSet<T>& s1, const GraphSet<T>& s2, const int32_t* trp1, const int32_t* trp2,
                    int n1, int n2, const T* __restrict__ p, const T* __restrict__ diag, T* __restrict__ Ap,
                    T* s_t1, T* s_t2, T* s_x, T ek_scale, T ek_theta, T ek_aux, int ek_channel,
                    const int* ecode, const T* epar, int lane) {
    const int a = lane / kOctile, b = lane % kOctile;
    const int nb1 = (n1 + kOctile - 1) / kOctile, nb2 = (n2 + kOctile - 1) / kOctile;
    const int64_t val_stride1 = (int64_t)s1.channels * kOctileSize, val_stride2 = (int64_t)s2.channels * kOctileSize;
    for (int R1 = 0; R1 < nb1; ++R1) {
        const int t1_begin = trp1[R1], t1_end = trp1[R1 + 1];
        for (int R2 = 0; R2 < nb2; ++R2) {
            const int t2_begin = trp2[R2], t2_end = trp2[R2 + 1];
            T acc_u = 0, acc_l = 0;
            for (int t1 = t1_begin; t1 < t1_end; ++t1) {
                const int J1 = s1.tile_col[t1];
                __syncwarp();  // every lane is done reading the previous octile of G1
                stage_octile<T, FORM>(s_t1, s1.tile_val + t1 * val_stride1, s1.channels, ek_channel, lane);
                for (int t2 = t2_begin; t2 < t2_end; ++t2) {
                    const int J2 = s2.tile_col[t2];
                    __syncwarp();  // ... and of the previous octile of G2 and slice of p
                    stage_octile<T, FORM>(s_t2, s2.tile_val + t2 * val_stride2, s2.channels, ek_channel, lane);
                    for (int e = lane; e < kOctileSize; e += kWarp) {
                        const int j1 = J1 * kOctile + e / kOctile, j2 = J2 * kOctile + e % kOctile;
                        s_x[e] = (j1 < n1 && j2 < n2) ? p[(int64_t)j1 * n2 + j2] : T(0);
                    }
                    __syncwarp();  // staged octiles and slice visible to the whole warp
                    octile_product<T, FORM>(s_t1, s_t2, s_x, a, b, acc_u, acc_l, ek_theta, ek_aux, ecode, epar);
                }
            }
            const int o1u = R1 * kOctile + a, o1l = o1u + 4, o2 = R2 * kOctile + b;
            if (o2 < n2) {
                if (o1u < n1) {
                    const int64_t i = (int64_t)o1u * n2 + o2;
                    Ap[i] = diag[i] * p[i] - ek_scale * acc_u;
                }
                if (o1l < n1) {
                    const int64_t i = (int64_t)o1l * n2 + o2;
                    Ap[i] = diag[i] * p[i] - ek_scale * acc_l;
                }
            }
        }
    }
}

template <typename T, int FORM>
__device__ void solve_pair(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t g1, int64_t g2,
                           const int* ncode, const T* npar, const int* ecode, const T* epar, T ek_scale,
                           T ek_theta, T ek_aux, int ek_channel, T q, T p2, double tol, int max_iter,
                           T* __restrict__ work, int64_t stride, T* s_t1, T* s_t2, T* s_x, int lane,
                           double* k_out, int32_t* it_out, double* res_out, T* nodal) {
    T* __restrict__ x = work + VEC_X * stride;
    T* __restrict__ r = work + VEC_R * stride;
    T* __restrict__ p = work + VEC_P * stride;
    T* __restrict__ Ap = work + VEC_AP * stride;
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
    const int n1 = (int)(s1.node_off[g1 + 1] - v1), n2 = (int)(s2.node_off[g2 + 1] - v2);
    const int64_t N = (int64_t)n1 * n2;
    const int32_t* trp1 = s1.tile_rowptr + s1.rowptr_off[g1];
    const int32_t* trp2 = s2.tile_rowptr + s2.rowptr_off[g2];
    const T floor_v = T(kVertexKernelFloor);

    // x0 = 0, r0 = b = D q_x, z0 = p0 = r0 / diag with diag = D / V (the preconditioner)
    double rz = 0, bb = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
        const T d = (s1.degree[v1 + i1] + q) * (s2.degree[v2 + i2] + q);
        T v = mgk::eval_program(ncode, npar, s1.node_feat + (v1 + i1) * s1.n_feat, 1,
                                s2.node_feat + (v2 + i2) * s2.n_feat, 1);
        if (v < floor_v) v = floor_v;
        const T m = d / v;
        const T bi = d * q * q;
        const T z = bi / m;
        diag[i] = m;
        x[i] = 0;
        r[i] = bi;
        p[i] = z;
        rz += (double)bi * z;
        bb += (double)bi * bi;
    }
    rz = warp_sum(rz);
    bb = warp_sum(bb);
    const double bnorm = sqrt(bb);
    double rnorm = bnorm;
    int it = 0;
    __syncwarp();
    while (it < max_iter) {
        xmv<T, FORM>(s1, s2, trp1, trp2, n1, n2, p, diag, Ap, s_t1, s_t2, s_x, ek_scale, ek_theta, ek_aux,
                     ek_channel, ecode, epar, lane);
        __syncwarp();  // Ap was written by the lanes owning each output block
        double pAp = 0;
        for (int64_t i = lane; i < N; i += kWarp) pAp += (double)p[i] * Ap[i];
        pAp = warp_sum(pAp);
        if (!(pAp > 0)) break;  // only an exactly zero residual gets here
        const double alpha = rz / pAp;
        const T a = (T)alpha;
        double rr = 0, rzn = 0;
        for (int64_t i = lane; i < N; i += kWarp) {
            x[i] = x[i] + a * p[i];
            const T ri = r[i] - a * Ap[i];
            r[i] = ri;
            rr += (double)ri * ri;
            rzn += (double)ri * (ri / diag[i]);
        }
        rr = warp_sum(rr);
        rzn = warp_sum(rzn);
        ++it;
        rnorm = sqrt(rr);
        if (rnorm <= tol * bnorm) break;
        const T beta = (T)(rzn / rz);
        rz = rzn;
        for (int64_t i = lane; i < N; i += kWarp) p[i] = r[i] / diag[i] + beta * p[i];
        __syncwarp();  // the next XMV reads p across lanes
    }
    double total = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        total += (double)x[i];
        if (nodal != nullptr) nodal[i] = (T)((double)p2 * x[i]);
    }
    total = warp_sum(total);
    if (lane == 0) {
        *k_out = (double)p2 * total;
        *it_out = it;
        *res_out = bnorm > 0 ? rnorm / bnorm : 0.0;
    }
    __syncwarp();  // the next pair reuses the scratch vectors
}

template <typename T, int FORM>
__device__ void mgk_solve(const GraphSet<T> s1, const GraphSet<T> s2, const int64_t* __restrict__ pair_g1,
                          const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ code,
                          const T* __restrict__ params, int ncode_len, int nparam_len, int ecode_len,
                          int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_channel, T q, T p2, double tol,
                          int max_iter, T* __restrict__ scratch, int64_t stride, double* __restrict__ k_out,
                          int32_t* __restrict__ it_out, double* __restrict__ res_out, T* __restrict__ nodal,
                          const int64_t* __restrict__ nodal_off) {
    extern __shared__ __align__(16) unsigned char smem[];
    // [params of both programs][per warp: octile of G1, octile of G2, slice of p][code of both programs]
    T* s_par = reinterpret_cast<T*>(smem);
    T* s_warps = s_par + 2 * kMaxParams;
    const int staged = fixed_staged_channels<FORM>() ? fixed_staged_channels<FORM>() : s1.channels;
    const int per_warp = (2 * staged + 1) * kOctileSize;
    int* s_code = reinterpret_cast<int*>(s_warps + kWarpsPerBlock * per_warp);
    for (int i = threadIdx.x; i < ncode_len + ecode_len; i += blockDim.x) s_code[i] = code[i];
    for (int i = threadIdx.x; i < nparam_len + eparam_len; i += blockDim.x) s_par[i] = params[i];
    __syncthreads();

    const int warp_local = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    T* s_t1 = s_warps + warp_local * per_warp;
    T* s_t2 = s_t1 + staged * kOctileSize;
    T* s_x = s_t2 + staged * kOctileSize;
    const int64_t warps_per_block = blockDim.x / kWarp;
    const int64_t warp_global = (int64_t)blockIdx.x * warps_per_block + warp_local;
    const int64_t n_warps = (int64_t)gridDim.x * warps_per_block;
    T* work = scratch + warp_global * N_VECTORS * stride;
    for (int64_t k = warp_global; k < n_pairs; k += n_warps) {
        solve_pair<T, FORM>(s1, s2, pair_g1[k], pair_g2[k], s_code, s_par, s_code + ncode_len, s_par + nparam_len,
                            ek_scale, ek_theta, ek_aux, ek_channel, q, p2, tol, max_iter, work, stride, s_t1, s_t2,
                            s_x, lane, k_out + k, it_out + k, res_out + k,
                            nodal != nullptr ? nodal + nodal_off[k] : nullptr);
    }
}

}  // namespace

// Argument list shared by every entry point: the two graph sets, the pairs, the programs, the
// edge-kernel shortcut, the hyperparameters, the scratch and the outputs.
#define MGK_SET_ARGS(T, S)                                                                          \
    const int64_t *node_off##S, const int64_t *rowptr_off##S, const int32_t *tile_rowptr##S,        \
        const int32_t *tile_col##S, const T *tile_val##S, const T *degree##S, const T *node_feat##S, \
        int n_feat##S, int channels##S
#define MGK_SET(T, S) \
    GraphSet<T> { node_off##S, rowptr_off##S, tile_rowptr##S, tile_col##S, tile_val##S, degree##S, node_feat##S, n_feat##S, channels##S }

#define MGK_ENTRY(NAME, T, FORM)                                                                                  \
    extern "C" __global__ void __launch_bounds__(kWarpsPerBlock * kWarp, kMinBlocksPerSM)                                        \
        NAME(MGK_SET_ARGS(T, 1), MGK_SET_ARGS(T, 2), const int64_t* pair_g1, const int64_t* pair_g2,               \
             int64_t n_pairs, const int* code, const T* params, int ncode_len, int nparam_len, int ecode_len,     \
             int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_channel, T q, T p2, double tol, int max_iter, \
             T* scratch, int64_t stride, double* k_out, int32_t* it_out, double* res_out, T* nodal,                \
             const int64_t* nodal_off) {                                                                          \
        mgk_solve<T, FORM>(MGK_SET(T, 1), MGK_SET(T, 2), pair_g1, pair_g2, n_pairs, code, params, ncode_len,     \
                           nparam_len, ecode_len, eparam_len, ek_scale, ek_theta, ek_aux, ek_channel, q, p2, tol,  \
                           max_iter, scratch, stride, k_out, it_out, res_out, nodal, nodal_off);                  \
    }

MGK_ENTRY(mgk_solve_general_f32, float, EDGE_GENERAL)
MGK_ENTRY(mgk_solve_constant_f32, float, EDGE_CONSTANT)
MGK_ENTRY(mgk_solve_kronecker_f32, float, EDGE_KRONECKER)
MGK_ENTRY(mgk_solve_sqexp_f32, float, EDGE_SQEXP)
MGK_ENTRY(mgk_solve_general_f64, double, EDGE_GENERAL)
MGK_ENTRY(mgk_solve_constant_f64, double, EDGE_CONSTANT)
MGK_ENTRY(mgk_solve_kronecker_f64, double, EDGE_KRONECKER)
MGK_ENTRY(mgk_solve_sqexp_f64, double, EDGE_SQEXP)
