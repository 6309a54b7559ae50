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
// written once per block with no atomics (common/octile_product.cuh; no product matrix is stored).
//
// CG vectors live in global scratch, one slot per resident warp (grid-stride over pairs);
// dot products are accumulated in double in both precisions and reduced by warp shuffles.
//
// Gradients (mgk_gradient_*): the same warp also solves the adjoint M y = 1 (M is symmetric),
// in lockstep with M x = b: each iteration's XMV stages the octiles and evaluates the edge
// kernel once and applies them to both search directions (two slices of the vector staged),
// so an iteration of the pair of solves costs ~1.5 XMVs rather than 2.  Then x and y are
// contracted into dK/dtheta (graphkern/_mgk_gradient.py): a diagonal sum per vertex-kernel
// derivative program, for q and for the free edge contractions (multiples of the edge kernel
// itself), and per other edge contraction the XMV of x with the edge kernel's derivative, dotted
// with y in registers instead of stored.
#include <cstdint>

#include "common/cg.cuh"
#include "common/exports.cuh"
#include "common/kernel_program.cuh"
#include "common/octile_product.cuh"
#include "common/reductions.cuh"

namespace {

using namespace mgk;
using gk::kFullMask;
using gk::kWarp;
using gk::warp_sum;

constexpr int kWarpsPerBlock = 4;
// 3 resident blocks (12 warps) per SM: the XMV fits the 168 registers this leaves without
// spilling; 4 or more blocks would spill inside it.
constexpr int kMinBlocksPerSM = 3;
// The gradient's paired XMV keeps two slices' sums and, in double, the octile row in registers:
// at 3 blocks/SM its f64 shortcut forms spill, so f64 gradients ask for 2.
template <typename T>
constexpr int gradient_min_blocks() {
    return sizeof(T) == 8 ? 2 : kMinBlocksPerSM;
}
constexpr int kMaxParams = 96;     // params per program (graphkern.basekernels.MAX_TERMS = 24 terms fit)
// The adjoint's y, r, p, Ap: gradient launches only
enum : int { VEC_X = 0, VEC_R = 1, VEC_P = 2, VEC_AP = 3, VEC_DIAG = 4, N_VECTORS = 5 };
enum : int { VEC_Y = 5, VEC_RY = 6, VEC_PY = 7, VEC_APY = 8, N_GRADIENT_VECTORS = 9 };

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
#define MGK_GRAPH_SET_FIELDS(X, N, S)                                                                      \
    X(N, S, node_off) X(N, S, rowptr_off) X(N, S, tile_rowptr) X(N, S, tile_col) X(N, S, tile_val)          \
    X(N, S, degree) X(N, S, node_feat) X(N, S, n_feat) X(N, S, channels)

template <int FORM>
__host__ __device__ constexpr int fixed_staged_channels() {
    return FORM == EDGE_CONSTANT ? 1 : (FORM == EDGE_GENERAL ? 0 : 2);
}

// One pair's two graphs as the XMV walks them, and the warp's shared staging area: an octile of
// each graph (`staged` planes of 64) and the matching 64-entry slice of each vector.
template <typename T>
struct PairTiles {
    const int32_t* trp1;  // tile-row pointers of G1 and G2
    const int32_t* trp2;
    int n1;
    int n2;
    T* s_t1;
    T* s_t2;
    T* s_x;
};

// What the XMV does with each output i of acc[r] = ((A1 (x) A2 (.) E) p_r)[i]: the CG's system
// product (for one direction, or for the forward and adjoint ones together), or the gradient's
// contraction with the adjoint y.
template <typename T>
struct SystemProduct {
    const T* __restrict__ p;
    const T* __restrict__ diag;
    T* __restrict__ Ap;
    T scale;
    __device__ __forceinline__ void operator()(int64_t i, const T (&acc)[1]) {
        Ap[i] = diag[i] * p[i] - scale * acc[0];
    }
};

template <typename T>
struct PairedSystemProduct {
    const T* __restrict__ px;
    const T* __restrict__ py;
    const T* __restrict__ diag;
    T* __restrict__ Apx;
    T* __restrict__ Apy;
    T scale;
    __device__ __forceinline__ void operator()(int64_t i, const T (&acc)[2]) {
        const T d = diag[i];
        Apx[i] = d * px[i] - scale * acc[0];
        Apy[i] = d * py[i] - scale * acc[1];
    }
};

template <typename T>
struct AdjointContraction {
    const T* __restrict__ y;
    double sum;
    __device__ __forceinline__ void operator()(int64_t i, const T (&acc)[1]) { sum += (double)y[i] * (double)acc[0]; }
};

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

// out(i, acc) with acc[r] = ((A1 (x) A2 (.) E) p_r)[i] for every output i of one pair and each of
// the NRHS vectors p0 (, p1), called by the lane that owns i (see the top of the file).
template <typename T, int FORM, int NRHS, typename Output>
__device__ void xmv(const GraphSet<T>& s1, const GraphSet<T>& s2, const PairTiles<T>& pt, const T* __restrict__ p0,
                    const T* __restrict__ p1, Output& out, const EdgeKernel<T>& ek, int lane) {
    static_assert(NRHS == 1 || NRHS == 2, "one or two vectors");
    const int a = lane / kOctile, b = lane % kOctile;
    const int n1 = pt.n1, n2 = pt.n2;
    const int nb1 = (n1 + kOctile - 1) / kOctile, nb2 = (n2 + kOctile - 1) / kOctile;
    const int64_t val_stride1 = (int64_t)s1.channels * kOctileSize, val_stride2 = (int64_t)s2.channels * kOctileSize;
    for (int R1 = 0; R1 < nb1; ++R1) {
        const int t1_begin = pt.trp1[R1], t1_end = pt.trp1[R1 + 1];
        for (int R2 = 0; R2 < nb2; ++R2) {
            const int t2_begin = pt.trp2[R2], t2_end = pt.trp2[R2 + 1];
            T acc_u[NRHS], acc_l[NRHS];
#pragma unroll
            for (int r = 0; r < NRHS; ++r) acc_u[r] = acc_l[r] = 0;
            for (int t1 = t1_begin; t1 < t1_end; ++t1) {
                const int J1 = s1.tile_col[t1];
                __syncwarp();  // every lane is done reading the previous octile of G1
                stage_octile<T, FORM>(pt.s_t1, s1.tile_val + t1 * val_stride1, s1.channels, ek.slot, lane);
                for (int t2 = t2_begin; t2 < t2_end; ++t2) {
                    const int J2 = s2.tile_col[t2];
                    __syncwarp();  // ... and of the previous octile of G2 and slices of the vectors
                    stage_octile<T, FORM>(pt.s_t2, s2.tile_val + t2 * val_stride2, s2.channels, ek.slot, lane);
                    for (int e = lane; e < kOctileSize; e += kWarp) {
                        const int j1 = J1 * kOctile + e / kOctile, j2 = J2 * kOctile + e % kOctile;
                        const bool inside = j1 < n1 && j2 < n2;
                        const int64_t j = (int64_t)j1 * n2 + j2;
                        pt.s_x[e] = inside ? p0[j] : T(0);
                        if (NRHS == 2) pt.s_x[kOctileSize + e] = inside ? p1[j] : T(0);
                    }
                    __syncwarp();  // staged octiles and slices visible to the whole warp
                    octile_product<T, FORM, NRHS>(pt.s_t1, pt.s_t2, pt.s_x, a, b, acc_u, acc_l, ek.theta, ek.aux,
                                                  ek.code, ek.par);
                }
            }
            const int o1u = R1 * kOctile + a, o1l = o1u + 4, o2 = R2 * kOctile + b;
            if (o2 < n2) {
                if (o1u < n1) out((int64_t)o1u * n2 + o2, acc_u);
                if (o1l < n1) out((int64_t)o1l * n2 + o2, acc_l);
            }
        }
    }
}

// One CG system: its scalars and its vectors.
template <typename T>
struct CGSystem : CGState {
    T* __restrict__ x;
    T* __restrict__ r;
    T* __restrict__ p;
    T* __restrict__ Ap;
};

template <typename T>
__device__ __forceinline__ CGSystem<T> cg_system(T* work, int64_t stride, int first) {
    return CGSystem<T>{{0.0, 0.0, 0.0, 0, true}, work + first * stride, work + (first + 1) * stride,
                       work + (first + 2) * stride, work + (first + 3) * stride};
}

// The CG operator of one pair (common/cg.cuh) for the warp's lanes: the XMV of the direction of x
// (and, in lockstep, of the adjoint y), the vector updates lane-strided.  The XMV's outputs are
// written by the lanes owning each output block, the directions read across lanes: each phase
// ends with a warp barrier.
template <typename T, int FORM>
struct WarpOperator {
    const GraphSet<T>&s1, &s2;
    const PairTiles<T>& pt;
    const EdgeKernel<T>& ek;
    CGSystem<T>&cx, &cy;  // x, and (lockstep) the adjoint y
    const T* __restrict__ diag;
    int64_t N;
    int lane;

    __device__ __forceinline__ double p_dot_Ap(const CGSystem<T>& cg) const {
        double pAp = 0;
        for (int64_t i = lane; i < N; i += kWarp) pAp += (double)cg.p[i] * cg.Ap[i];
        return pAp;
    }
    __device__ __forceinline__ void update(CGSystem<T>& cg, T a, double& rr, double& rz) const {
        cg_update(cg.x, cg.r, cg.p, cg.Ap, diag, a, (int64_t)lane, (int64_t)kWarp, N, rr, rz);
    }
    __device__ __forceinline__ void direction(CGSystem<T>& cg, T beta) const {
        for (int64_t i = lane; i < N; i += kWarp) cg.p[i] = cg.r[i] / diag[i] + beta * cg.p[i];
    }

    __device__ __forceinline__ double product() {
        SystemProduct<T> product{cx.p, diag, cx.Ap, ek.scale};
        xmv<T, FORM, 1>(s1, s2, pt, cx.p, nullptr, product, ek, lane);
        __syncwarp();
        return p_dot_Ap(cx);
    }
    __device__ __forceinline__ void step(T alpha, double& rr, double& rz) { update(cx, alpha, rr, rz); }
    __device__ __forceinline__ void new_direction(T beta) {
        direction(cx, beta);
        __syncwarp();
    }

    __device__ __forceinline__ void product(bool run_x, bool run_y, double (&pAp)[2]) {
        if (run_x && run_y) {
            PairedSystemProduct<T> product{cx.p, cy.p, diag, cx.Ap, cy.Ap, ek.scale};
            xmv<T, FORM, 2>(s1, s2, pt, cx.p, cy.p, product, ek, lane);
        } else {
            T* p = run_x ? cx.p : cy.p;
            SystemProduct<T> product{p, diag, run_x ? cx.Ap : cy.Ap, ek.scale};
            xmv<T, FORM, 1>(s1, s2, pt, p, nullptr, product, ek, lane);
        }
        __syncwarp();
        if (run_x) pAp[0] += p_dot_Ap(cx);
        if (run_y) pAp[1] += p_dot_Ap(cy);
    }
    __device__ __forceinline__ void step(int side, T alpha, double& rr, double& rz) {
        update(side == 0 ? cx : cy, alpha, rr, rz);
    }
    __device__ __forceinline__ void new_directions(bool run_x, bool run_y, T beta_x, T beta_y) {
        if (run_x) direction(cx, beta_x);
        if (run_y) direction(cy, beta_y);
        __syncwarp();
    }
    __device__ __forceinline__ bool warm_adjoint(CGState&) { return false; }  // the adjoint starts with x
};

// diag = D / V, x0 = 0, r0 = b = D q_x, z0 = p0 = r0 / diag, and with the ADJOINT y0 = 0, r0 = 1,
// p0 = 1 / diag; their r^T z and norms summed over the warp.
template <typename T, bool ADJOINT>
__device__ __forceinline__ void start_systems(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t v1, int64_t v2,
                                              int n2, int64_t N, const int* ncode, const T* npar, T q, T* diag,
                                              CGSystem<T>& cx, CGSystem<T>& cy, int lane) {
    double bb = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
        T d;
        const T m = system_diagonal(s1.degree[v1 + i1], s2.degree[v2 + i2], s1.node_feat + (v1 + i1) * s1.n_feat,
                                    s2.node_feat + (v2 + i2) * s2.n_feat, ncode, npar, q, d);
        const T bi = d * q * q;
        const T zx = bi / m;
        diag[i] = m;
        cx.x[i] = 0;
        cx.r[i] = bi;
        cx.p[i] = zx;
        cx.rz += (double)bi * zx;
        bb += (double)bi * bi;
        if constexpr (ADJOINT) {
            const T zy = T(1) / m;
            cy.x[i] = 0;
            cy.r[i] = 1;
            cy.p[i] = zy;
            cy.rz += (double)zy;
        }
    }
    cx.rz = warp_sum(cx.rz);
    if constexpr (ADJOINT) cy.rz = warp_sum(cy.rz);
    cx.bnorm = cx.rnorm = sqrt(warp_sum(bb));
    if constexpr (ADJOINT) cy.bnorm = cy.rnorm = sqrt((double)N);
}

// One pair: its system (diag = D / V, x0 = 0, r0 = b = D q_x, z0 = p0 = r0 / diag), the CG on it,
// K = p^2 sum(x), the iterations and relative residual, and on request the nodal matrix p^2 x.
template <typename T, int FORM>
__device__ void solve_pair(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t g1, int64_t g2,
                           const int* ncode, const T* npar, const EdgeKernel<T>& ek, T q, T p2, double tol,
                           int max_iter, T* __restrict__ work, int64_t stride, T* s_t1, T* s_t2, T* s_x, int lane,
                           double* k_out, int32_t* it_out, double* res_out, T* nodal) {
    const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
    const PairTiles<T> pt{s1.tile_rowptr + s1.rowptr_off[g1], s2.tile_rowptr + s2.rowptr_off[g2],
                          (int)(s1.node_off[g1 + 1] - v1), (int)(s2.node_off[g2 + 1] - v2), s_t1, s_t2, s_x};
    CGSystem<T> cg = cg_system(work, stride, VEC_X);
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const int n2 = pt.n2;
    const int64_t N = (int64_t)pt.n1 * n2;
    start_systems<T, false>(s1, s2, v1, v2, n2, N, ncode, npar, q, diag, cg, cg, lane);
    WarpOperator<T, FORM> op{s1, s2, pt, ek, cg, cg, diag, N, lane};
    __syncwarp();
    preconditioned_cg<T>(gk::WarpTeam{}, op, cg, tol, max_iter);
    double total = 0;
    for (int64_t i = lane; i < N; i += kWarp) total += (double)cg.x[i];
    total = warp_sum(total);
    if (nodal != nullptr) {
        for (int64_t i = lane; i < N; i += kWarp) nodal[i] = (T)((double)p2 * cg.x[i]);
    }
    if (lane == 0) {
        *k_out = (double)p2 * total;
        *it_out = cg.it;
        *res_out = cg.bnorm > 0 ? cg.rnorm / cg.bnorm : 0.0;
    }
    __syncwarp();  // the next pair reuses the scratch vectors
}

// A block's shared memory, filled with the programs, and one warp's share of it:
//   [params of both programs (2 kMaxParams)][extra params][per warp: octile of G1, octile of G2,
//   SLICES slices of vectors][code of both programs][extra code]
// (the extra program tables are the gradient's edge contractions and its XMVs stage two
// slices, the forward and adjoint directions; K has no extra tables and one slice).
template <typename T>
struct WarpShare {
    T* par;
    T* extra_par;
    int* code;
    int* extra_code;
    T* s_t1;
    T* s_t2;
    T* s_x;
    int lane;
    int64_t warp_global;
    int64_t n_warps;
};

template <typename T, int FORM, int SLICES>
__device__ WarpShare<T> share_block(const int* code, const T* params, int code_len, int param_len,
                                    const int* extra_code, const T* extra_par, int extra_code_len, int extra_par_len,
                                    int channels) {
    extern __shared__ __align__(16) unsigned char smem[];
    WarpShare<T> w;
    w.par = reinterpret_cast<T*>(smem);
    w.extra_par = w.par + 2 * kMaxParams;
    T* s_warps = w.extra_par + extra_par_len;
    const int staged = fixed_staged_channels<FORM>() ? fixed_staged_channels<FORM>() : channels;
    const int per_warp = (2 * staged + SLICES) * kOctileSize;
    w.code = reinterpret_cast<int*>(s_warps + kWarpsPerBlock * per_warp);
    w.extra_code = w.code + code_len;
    for (int i = threadIdx.x; i < code_len; i += blockDim.x) w.code[i] = code[i];
    for (int i = threadIdx.x; i < param_len; i += blockDim.x) w.par[i] = params[i];
    for (int i = threadIdx.x; i < extra_code_len; i += blockDim.x) w.extra_code[i] = extra_code[i];
    for (int i = threadIdx.x; i < extra_par_len; i += blockDim.x) w.extra_par[i] = extra_par[i];
    __syncthreads();

    const int warp_local = threadIdx.x / kWarp;
    w.lane = threadIdx.x % kWarp;
    w.s_t1 = s_warps + warp_local * per_warp;
    w.s_t2 = w.s_t1 + staged * kOctileSize;
    w.s_x = w.s_t2 + staged * kOctileSize;
    const int64_t warps_per_block = blockDim.x / kWarp;
    w.warp_global = (int64_t)blockIdx.x * warps_per_block + warp_local;
    w.n_warps = (int64_t)gridDim.x * warps_per_block;
    return w;
}

template <typename T, int FORM>
__device__ void mgk_solve(const GraphSet<T> s1, const GraphSet<T> s2, const int64_t* __restrict__ pair_g1,
                          const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ code,
                          const T* __restrict__ params, int ncode_len, int nparam_len, int ecode_len,
                          int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_channel, T q, T p2, double tol,
                          int max_iter, T* __restrict__ scratch, int64_t stride, double* __restrict__ k_out,
                          int32_t* __restrict__ it_out, double* __restrict__ res_out, T* __restrict__ nodal,
                          const int64_t* __restrict__ nodal_off) {
    const WarpShare<T> w = share_block<T, FORM, 1>(code, params, ncode_len + ecode_len, nparam_len + eparam_len,
                                                   nullptr, nullptr, 0, 0, s1.channels);
    T* work = scratch + w.warp_global * N_VECTORS * stride;
    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, ek_channel, w.code + ncode_len, w.par + nparam_len};
    for (int64_t k = w.warp_global; k < n_pairs; k += w.n_warps) {
        solve_pair<T, FORM>(s1, s2, pair_g1[k], pair_g2[k], w.code, w.par, ek, q, p2, tol, max_iter, work,
                            stride, w.s_t1, w.s_t2, w.s_x, w.lane, k_out + k, it_out + k, res_out + k,
                            nodal != nullptr ? nodal + nodal_off[k] : nullptr);
    }
}

// K of one pair and its raw derivatives grad = [p^2 y^T D V^-2 dV_j x for each vertex-kernel
// derivative program j, dK/dq, p^2 y^T (A1 (x) A2 (.) dE_c) x for each edge contraction c].
template <typename T, int FORM>
__device__ void gradient_pair(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t g1, int64_t g2,
                              const int* ncode, const T* npar, const EdgeKernel<T>& ek, T q, T p2,
                              double tol, int max_iter, T* __restrict__ work, int64_t stride, T* s_t1, T* s_t2,
                              T* s_x, int lane, const GradientTerms<T>& gt, double* k_out, int32_t* it_out,
                              double* res_out, int32_t* adj_it_out, double* adj_res_out, double* grad) {
    const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
    const PairTiles<T> pt{s1.tile_rowptr + s1.rowptr_off[g1], s2.tile_rowptr + s2.rowptr_off[g2],
                          (int)(s1.node_off[g1 + 1] - v1), (int)(s2.node_off[g2 + 1] - v2), s_t1, s_t2, s_x};
    CGSystem<T> cx = cg_system(work, stride, VEC_X);
    CGSystem<T> cy = cg_system(work, stride, VEC_Y);
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const T* x = cx.x;  // the solutions, read-only once the solves are done
    const T* y = cy.x;
    const int n2 = pt.n2;
    const int64_t N = (int64_t)pt.n1 * n2;

    // M x = b = D q_x and the adjoint M y = 1, both from 0 with the preconditioner diag = D / V
    start_systems<T, true>(s1, s2, v1, v2, n2, N, ncode, npar, q, diag, cx, cy, lane);
    WarpOperator<T, FORM> op{s1, s2, pt, ek, cx, cy, diag, N, lane};
    __syncwarp();
    lockstep_cg<T>(gk::WarpTeam{}, op, cx, cy, true, tol, max_iter);
    double total = 0;
    for (int64_t i = lane; i < N; i += kWarp) total += (double)x[i];
    total = warp_sum(total);
    if (lane == 0) {
        *k_out = (double)p2 * total;
        *it_out = cx.it;
        *res_out = cx.bnorm > 0 ? cx.rnorm / cx.bnorm : 0.0;
        *adj_it_out = cy.it;
        *adj_res_out = cy.bnorm > 0 ? cy.rnorm / cy.bnorm : 0.0;
    }
    __syncwarp();  // x and y are read across lanes below

    // vertex-kernel terms: dM/dtheta = -D V^-2 dV/dtheta (diag = D / V; a floored V has no derivative)
    for (int j = 0; j < gt.n_node; ++j) {
        const int* dcode = gt.ncode + gt.ncode_off[j];
        const T* dpar = gt.npar + gt.npar_off[j];
        double acc = 0;
        for (int64_t i = lane; i < N; i += kWarp) {
            const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
            add_vertex_derivative(acc, s1.node_feat + (v1 + i1) * s1.n_feat, s2.node_feat + (v2 + i2) * s2.n_feat,
                                  ncode, npar, dcode, dpar, x[i], y[i], diag[i]);
        }
        acc = warp_sum(acc);
        if (lane == 0) grad[j] = (double)p2 * acc;
    }
    // q: D = (deg1 + q)(deg2 + q) and b = D q^2, so dD/dq = d1 + d2 and db/dq = q^2 dD/dq + 2 q D;
    // the same pass sums y^T (D V^-1 x - b) for the free edge contractions below
    double free_sum = 0;
    {
        const double qd = q;
        double acc = 0;
        for (int64_t i = lane; i < N; i += kWarp) {
            const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
            const double d1 = (double)(s1.degree[v1 + i1] + q), d2 = (double)(s2.degree[v2 + i2] + q);
            const double d = d1 * d2;
            acc += (double)y[i] * ((qd * qd * (d1 + d2) + 2 * qd * d) - (double)x[i] * (d1 + d2) * diag[i] / d);
            free_sum += (double)y[i] * ((double)diag[i] * x[i] - d * qd * qd);
        }
        acc = warp_sum(acc);
        free_sum = warp_sum(free_sum);
        if (lane == 0) grad[gt.n_node] = (double)p2 * acc;
    }
    // edge-kernel terms: y^T (A1 (x) A2 (.) dE) x, the XMV of x contracted with y, except for a
    // multiple of the edge kernel itself: M x = b - r makes it y^T (D V^-1 x - b) + y^T r, a diagonal
    // sum whose error y^T r is K's own (graphkern/_mgk_gradient.py)
    for (int c = 0; c < gt.n_contractions; ++c) {
        const EdgeKernel<T> ck{T(1), gt.ctheta[c], gt.caux[c], ek.slot, gt.ccode + gt.ccode_off[c],
                               gt.cpar + gt.cpar_off[c]};
        AdjointContraction<T> contraction{y, 0.0};
        if (gt.cfree[c] != 0) {
            contraction.sum = gt.cfree[c] * free_sum;  // summed over the warp already: a lane's share
            if (lane != 0) contraction.sum = 0;
        } else if (gt.cform[c] == FORM) {
            xmv<T, FORM, 1>(s1, s2, pt, x, nullptr, contraction, ck, lane);
        } else if constexpr (derivative_form<FORM>() != FORM) {
            xmv<T, derivative_form<FORM>(), 1>(s1, s2, pt, x, nullptr, contraction, ck, lane);
        }
        const double sum = warp_sum(contraction.sum);
        if (lane == 0) grad[gt.n_node + 1 + c] = (double)p2 * sum;
    }
    __syncwarp();  // the next pair reuses the scratch vectors and the staging area
}

template <typename T, int FORM>
__device__ void mgk_gradient(const GraphSet<T> s1, const GraphSet<T> s2, const int64_t* __restrict__ pair_g1,
                             const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ code,
                             const T* __restrict__ params, int ncode_len, int nparam_len, int ecode_len,
                             int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_channel, T q, T p2, double tol,
                             int max_iter, T* __restrict__ scratch, int64_t stride, GradientTerms<T> gt,
                             int ccode_len, int cpar_len, int n_raw, double* __restrict__ k_out,
                             int32_t* __restrict__ it_out, double* __restrict__ res_out,
                             int32_t* __restrict__ adj_it_out, double* __restrict__ adj_res_out,
                             double* __restrict__ grad_out) {
    const WarpShare<T> w = share_block<T, FORM, 2>(code, params, ncode_len + ecode_len, nparam_len + eparam_len,
                                                   gt.ccode, gt.cpar, ccode_len, cpar_len, s1.channels);
    gt.ccode = w.extra_code;  // the contractions' programs are read from shared memory
    gt.cpar = w.extra_par;
    T* work = scratch + w.warp_global * N_GRADIENT_VECTORS * stride;
    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, ek_channel, w.code + ncode_len, w.par + nparam_len};
    for (int64_t k = w.warp_global; k < n_pairs; k += w.n_warps) {
        gradient_pair<T, FORM>(s1, s2, pair_g1[k], pair_g2[k], w.code, w.par, ek, q, p2, tol, max_iter,
                               work, stride, w.s_t1, w.s_t2, w.s_x, w.lane, gt, k_out + k, it_out + k, res_out + k,
                               adj_it_out + k, adj_res_out + k, grad_out + k * n_raw);
    }
}

}  // namespace

// Entry points mgk_solve_<form>_<f32|f64> (graphkern/mgk/core.py: GPUEngine.solve): the two graph
// sets, the job and the outputs, each a struct passed by value whose layout the module exports.
#define MGK_ENTRY(NAME, T, FORM)                                                                           \
    extern "C" __global__ void __launch_bounds__(kWarpsPerBlock * kWarp, kMinBlocksPerSM)                 \
        NAME(__grid_constant__ const GraphSet<T> set1, __grid_constant__ const GraphSet<T> set2, __grid_constant__ const PairJob<T> job, __grid_constant__ const SolveOutputs<T> out) { \
        mgk_solve<T, FORM>(set1, set2, MGK_JOB(job), out.k, out.iterations, out.residuals, out.nodal,          \
                           out.nodal_off);                                                                 \
    }

// Gradient entry points mgk_gradient_<form>_<f32|f64>: the same sets and job, the derivative
// programs and edge contractions (GradientTerms), the gradient outputs.
#define MGK_GRADIENT_ENTRY(NAME, T, FORM)                                                                   \
    extern "C" __global__ void __launch_bounds__(kWarpsPerBlock * kWarp, gradient_min_blocks<T>())         \
        NAME(__grid_constant__ const GraphSet<T> set1, __grid_constant__ const GraphSet<T> set2, __grid_constant__ const PairJob<T> job, __grid_constant__ const GradientTerms<T> terms, \
             __grid_constant__ const GradientOutputs out) {                                                                  \
        mgk_gradient<T, FORM>(set1, set2, MGK_JOB(job), terms, terms.ccode_len, terms.cpar_len, terms.n_raw,   \
                              MGK_GRADIENT_OUTPUTS(out));                                                  \
    }

MGK_EVERY_FORM(MGK_ENTRY, mgk_solve)
MGK_EVERY_FORM(MGK_GRADIENT_ENTRY, mgk_gradient)

// share_block's layout and the scratch vectors, for graphkern/mgk/core.py
GRAPHKERN_EXPORTS = {
    {"warps_per_block", kWarpsPerBlock},
    {"max_params", kMaxParams},
    {"octile_size", kOctileSize},
    {"vectors", N_VECTORS},
    {"gradient_vectors", N_GRADIENT_VECTORS},
    {"staged_channels_general", fixed_staged_channels<EDGE_GENERAL>()},
    {"staged_channels_constant", fixed_staged_channels<EDGE_CONSTANT>()},
    {"staged_channels_kronecker", fixed_staged_channels<EDGE_KRONECKER>()},
    {"staged_channels_sqexp", fixed_staged_channels<EDGE_SQEXP>()},
    GK_STRUCT("set_f32", GraphSet<float>, MGK_GRAPH_SET_FIELDS)
    GK_STRUCT("set_f64", GraphSet<double>, MGK_GRAPH_SET_FIELDS)
    MGK_JOB_EXPORTS
    MGK_OUTPUT_EXPORTS
};
