// Marginalized graph kernel on the GPU for dense graphs: the XMV as a few small dense GEMMs.
//
// When the edge kernel is a constant c or scale * KroneckerDelta(h) of one edge-label column, the
// product-graph operator factorizes.  With X the n1 x n2 matrix of a product vector
// (X[i][j] = p[i n2 + j]), W1, W2 the weighted adjacency matrices and W^c the entries of W whose
// edge label is category c,
//
//   ((A1 (x) A2 (.) E) p)[a n2 + b] = sum_{i, j} W1[a][i] W2[b][j] E(e1[a][i], e2[b][j]) X[i][j]
//                                   = scale (h W1 X W2^T + (1 - h) sum_c W1^c X W2^cT)[a][b],
//
// and the same sum regrouped by the categories of one graph: scale sum_{c in G1} W1^c X B_c^T
// with B_c = W2 masked to 1 at category c and h elsewhere (or, symmetrically, over G2's
// categories).  Every form is a sum of T "terms" alpha_t L_t X R_t^T whose operands are masked
// adjacency matrices,
//
//   L_t[a][i] = W1[a][i] (e1[a][i] == c1_t ? 1 : lam1_t),   R_t[b][j] = W2[b][j] (e2[b][j] == c2_t ? 1 : lam2_t)
//
// (c = -1 matches nothing: lam W).  pair_terms picks, per pair, the fewest terms: the constant
// form 1; the Kronecker form min(1 + common categories, categories of G1, categories of G2)
// (h = 0: the common categories).  graphkern/mgk/gemm.py has the same rule (pair_terms) for its
// cost model and flop counts.
//
// One thread block of 16 x 16 threads solves a pair (grid-stride over the pairs of one tile
// class, largest first) by the other solvers' system and CG (common/cg.cuh), K = p^2 sum(x), the
// nodal matrix p^2 x on request.  Each term is two GEMMs over shared memory,
//
//   GEMM1  Z = L_t X        (n1 x n1 times n1 x n2; stored transposed, Zt[j][a] = Z[a][j])
//   GEMM2  Y += Z R_t^T     (n1 x n2 times n2 x n2; Y kept in the scratch slot between terms)
//
// register-tiled: thread (ty, tx) owns an R x R tile of each output (GEMM2: rows ty R.., columns
// tx R..; GEMM1 the transposed roles, so that its tile is stored into Zt as contiguous rows), and
// per k it loads R values of each operand (vector loads; one operand's 16 distinct addresses per
// warp are contiguous, the other's two are broadcasts) for R^2 FMAs.  LD = 16 R is the padded
// side: pairs with max(n1, n2) <= 16 R run in the entry point of tile R (mgk_gemm_r<R>_<f32|f64>).
//
// Shared memory (header_bytes, then three LD x LD arrays):
//   Xs[i][j]  the search direction p as X (zero outside n1 x n2)
//   Zt[j][a]  GEMM1's output, transposed
//   op[k][.]  the operand being multiplied: L_t^T for GEMM1 (op[i][a] = L_t[a][i]), then R_t^T for
//             GEMM2 (op[j][b] = R_t[b][j]); staged from global memory before each GEMM
// Global (graphkern/mgk/gemm.py: GemmData): per graph the transposed dense weights
// wt[k n4 + a] = W[a][k] and local edge categories cat[k n4 + a] (uint8) with rows of n4 =
// n rounded up to 4 (16-byte vector loads), its sorted category codes (at most kMaxCategories);
// the CG vectors x, r, D / V and the XMV's running sum Y of the thread's own tile in a scratch slot
// per block, laid out [tile element][thread] so that every access of a warp is one coalesced line
// (only their owner reads them: no barrier orders them).
//
// Cost: 2 T (n1^2 n2 + n1 n2^2) flops per XMV against nnz1 nnz2 element terms of the octile and
// CSR solvers; per k and warp R^2 FFMA against 2 R / 2 vector loads (FFMA-bound), plus about
// 2 LD^2 element transforms and four barriers per term for the operand staging.
#include <cstdint>

#include "common/cg.cuh"
#include "common/exports.cuh"
#include "common/kernel_program.cuh"
#include "common/reductions.cuh"
#include "mgk_gemm_xmv.cuh"

namespace {

using namespace mgk;
using namespace mgk_gemm;
using gk::kWarp;

constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxReduce = 2;                          // values summed by one reduction of the K solver
constexpr int kReduceBytes = kWarps * kMaxReduce * 8;
constexpr int kGradientReduce = 4;                     // ... and of the gradient solver
constexpr int kGradientReduceBytes = kWarps * kGradientReduce * 8;
constexpr int kMaxTerms = kMaxCategories;              // pair_terms never needs more
constexpr int kMaxGradientTerms = kMaxCategories + 1;  // contraction_terms: 1 + the common categories
constexpr int kVectors = 4;                            // x, r, D / V, the XMV
// x, r, the XMV of the forward solve, the same of the adjoint one, D / V
constexpr int kGradientVectors = 7;


__host__ __device__ constexpr int align16(int n) { return (n + 15) & ~15; }

// Bytes before the node program: reduction slots, the term table, the term count (the K solver's;
// GRADIENT: the gradient solver's, with more reduction slots and room for a contraction's terms).
template <typename T, bool GRADIENT = false>
__host__ __device__ constexpr int terms_end() {
    return GRADIENT ? kGradientReduceBytes + align16(kMaxGradientTerms * (int)sizeof(Term<T>)) + 16
                    : kReduceBytes + align16(kMaxTerms * (int)sizeof(Term<T>)) + 16;
}

// Blocks per SM each tile class asks for (sm_90 register counts): float R = 4..6 fit 128
// registers (two blocks: 16 warps to hide the staging loads and barriers; at R = 6 shared memory
// allows no more), R = 7, 8 take 167-205 with one block (their shared memory allows one); R <= 3
// at 80 registers (three blocks) spill at most 16 bytes; double R <= 4 at 128 (R = 3: 8 bytes),
// R = 5, 6 at 192-208.  The XMV sum over the terms waits in the scratch slot, so one R x R
// accumulator is live at a time.
template <typename T, int R>
__host__ __device__ constexpr int min_blocks_per_sm() {
    return sizeof(T) == 4 ? (R <= 3 ? 3 : (R <= 6 ? 2 : 1)) : (R <= 4 ? 2 : 1);
}

// ... and each tile class of the gradient solver, whose five LD x LD arrays allow one block per SM
// from float R = 5 and double R = 4 (graphkern/mgk/gemm.py: gradient_shared_bytes), and whose
// paired GEMMs keep two R x R accumulators live.
template <typename T, int R>
__host__ __device__ constexpr int gradient_min_blocks_per_sm() {
    return sizeof(T) == 4 ? (R <= 4 ? 2 : 1) : (R <= 3 ? 2 : 1);
}

// D = (d1 + q)(d2 + q) and the system's diagonal D / V (V floored) of a vertex pair.
// Once per pair and vertex pair: out of line, so that the interpreter's registers do not weigh
// on the CG loop's.
template <typename T>
__device__ __noinline__ T system_diagonal(T degree1, T degree2, const T* feat1, const T* feat2, const int* ncode,
                                          const T* npar, T q, T& d) {
    return mgk::system_diagonal(degree1, degree2, feat1, feat2, ncode, npar, q, d);
}

// The tile element (u, v) of this thread is a vertex pair of the n1 x n2 product graph.
template <int R>
__device__ __forceinline__ bool owns(int u, int v, int n1, int n2) {
    return (int)(threadIdx.x / kTileThreads) * R + u < n1 && (int)(threadIdx.x % kTileThreads) * R + v < n2;
}

// One CG system's vectors of this thread's tile ([tile element][thread] in the scratch slot) and
// its direction Xs (shared memory).
template <typename T>
struct TileCG {
    T* Xs;
    T* x;
    T* r;
    T* ysum;  // the XMV, then Ap, then z = r / diag
};

// Ap = diag p - ysum (into ysum); returns this thread's share of p^T Ap.
template <typename T, int R>
__device__ __forceinline__ double tile_system_product(const TileCG<T>& cg, const T* diag, int n_terms, int n1,
                                                      int n2) {
    double pAp = 0.0;
    over_tile_rows<T, R, false>(cg.Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
        for (int v = 0; v < R; ++v) {
            const int e = (u * R + v) * kThreads;
            if (owns<R>(u, v, n1, n2)) {
                const T ap = diag[e] * pv[v] - (n_terms > 0 ? cg.ysum[e] : T(0));
                cg.ysum[e] = ap;
                pAp += (double)pv[v] * ap;
            }
        }
    });
    return pAp;
}

// x += alpha p, r -= alpha Ap, z = r / diag (into ysum); adds this thread's share of r^T r and r^T z.
template <typename T, int R>
__device__ __forceinline__ void tile_cg_step(const TileCG<T>& cg, const T* diag, T alpha, int n1, int n2, double& rr,
                                             double& rz) {
    over_tile_rows<T, R, false>(cg.Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
        for (int v = 0; v < R; ++v) {
            const int e = (u * R + v) * kThreads;
            if (owns<R>(u, v, n1, n2)) {
                cg.x[e] = cg.x[e] + alpha * pv[v];
                const T ri = cg.r[e] - alpha * cg.ysum[e];
                cg.r[e] = ri;
                const T zi = ri / diag[e];
                cg.ysum[e] = zi;
                rr += (double)ri * ri;
                rz += (double)ri * zi;
            }
        }
    });
}

// p = z + beta p (outside n1 x n2 it stays 0); the next product's first barrier publishes it.
template <typename T, int R>
__device__ __forceinline__ void tile_new_direction(const TileCG<T>& cg, T beta, int n1, int n2) {
    over_tile_rows<T, R, true>(cg.Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
        for (int v = 0; v < R; ++v) {
            if (owns<R>(u, v, n1, n2)) pv[v] = cg.ysum[(u * R + v) * kThreads] + beta * pv[v];
        }
    });
}

// The sum of x over this thread's vertex pairs.
template <typename T, int R>
__device__ __forceinline__ double tile_sum(const T* x, int n1, int n2) {
    double total = 0.0;
#pragma unroll
    for (int u = 0; u < R; ++u) {
#pragma unroll
        for (int v = 0; v < R; ++v) {
            if (owns<R>(u, v, n1, n2)) total += (double)x[(u * R + v) * kThreads];
        }
    }
    return total;
}

// Copies the node program to `at` (parameters, then code) for every thread; returns where the
// LD x LD arrays begin (16-byte aligned).
template <typename T>
__device__ __forceinline__ T* stage_node_program(unsigned char* at, const int* __restrict__ ncode,
                                                 const T* __restrict__ nparam, int ncode_len, int nparam_len,
                                                 int*& s_code, T*& s_par) {
    s_par = reinterpret_cast<T*>(at);
    s_code = reinterpret_cast<int*>(at + align16(nparam_len * (int)sizeof(T)));
    for (int i = threadIdx.x; i < nparam_len; i += kThreads) s_par[i] = nparam[i];
    for (int i = threadIdx.x; i < ncode_len; i += kThreads) s_code[i] = ncode[i];
    __syncthreads();  // the node program, before the first diagonal
    return reinterpret_cast<T*>(at + align16(nparam_len * (int)sizeof(T)) + align16(ncode_len * 4));
}

// diag = D / V (V floored), x0 = 0, r0 = b = D q^2 and its direction r0 / diag in cx.Xs for this
// thread's tile (directions zero outside n1 x n2); with the adjoint (S = 2) also y0 = 0, r0 = 1 and
// its direction in cy.Xs.  Adds this thread's shares of r^T z, ||b||^2 (and the adjoint's r^T z).
template <typename T, int R, int S, int K>
__device__ __forceinline__ void start_tile_systems(const GemmSet<T>& s1, const GemmSet<T>& s2, int64_t v1, int64_t v2,
                                                   int n1, int n2, const int* s_code, const T* s_par, T q, T* diag,
                                                   const TileCG<T>& cx, const TileCG<T>& cy, double (&init)[K]) {
    constexpr int LD = kTileThreads * R;
    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
#pragma unroll 1
    for (int u = 0; u < R; ++u) {
        const int a = ty * R + u;
        T row_x[R], row_y[R];
#pragma unroll
        for (int v = 0; v < R; ++v) {
            const int b = tx * R + v;
            row_x[v] = row_y[v] = T(0);
            if (a < n1 && b < n2) {
                const int e = (u * R + v) * kThreads;
                T d;
                const T m = system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b], s1.node_feat + (v1 + a) * s1.n_nfeat,
                                            s2.node_feat + (v2 + b) * s2.n_nfeat, s_code, s_par, q, d);
                const T bi = d * q * q;
                const T zx = bi / m;
                diag[e] = m;
                cx.x[e] = T(0);
                cx.r[e] = bi;
                row_x[v] = zx;
                init[0] += (double)bi * zx;
                init[1] += (double)bi * bi;
                if constexpr (S == 2) {
                    const T zy = T(1) / m;
                    cy.x[e] = T(0);
                    cy.r[e] = T(1);
                    row_y[v] = zy;
                    init[2] += (double)zy;
                }
            }
        }
        store_row<T, R>(cx.Xs + a * LD + tx * R, row_x);
        if constexpr (S == 2) store_row<T, R>(cy.Xs + a * LD + tx * R, row_y);
    }
}

// The CG operator of one pair (common/cg.cuh): the factorized XMV of the direction Xs, the vector
// updates on the thread's own tile (factorized_xmv's first barrier publishes a new direction).
template <typename T, int R>
struct GemmOperator {
    const Term<T>* terms;
    int n_terms;
    const PairOperands<T>& po;
    T *op, *Zt;
    const TileCG<T>& cg;
    const T* diag;
    int n1, n2;
    __device__ __forceinline__ double product() {
        T* const X1[1] = {cg.Xs};
        T* const Z1[1] = {Zt};
        T* const Y1[1] = {cg.ysum};
        factorized_xmv<T, R, 1>(terms, n_terms, po, op, X1, Z1, Y1);
        return tile_system_product<T, R>(cg, diag, n_terms, n1, n2);
    }
    __device__ __forceinline__ void step(T alpha, double& rr, double& rz) {
        tile_cg_step<T, R>(cg, diag, alpha, n1, n2, rr, rz);
    }
    __device__ __forceinline__ void new_direction(T beta) { tile_new_direction<T, R>(cg, beta, n1, n2); }
};

template <typename T, int R>
__device__ void gemm_solve(const GemmSet<T> s1, const GemmSet<T> s2, const int64_t* __restrict__ pair_g1,
                           const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ ncode,
                           const T* __restrict__ nparam, int ncode_len, int nparam_len, int form, T scale, T h, T q,
                           T p2, double tol, int max_iter, T* __restrict__ scratch, double* __restrict__ k_out,
                           int32_t* __restrict__ it_out, double* __restrict__ res_out, T* __restrict__ nodal,
                           const int64_t* __restrict__ nodal_off) {
    constexpr int LD = kTileThreads * R;
    constexpr int RR = R * R;
    extern __shared__ __align__(16) unsigned char smem[];
    double* red = reinterpret_cast<double*>(smem);
    Term<T>* terms = reinterpret_cast<Term<T>*>(smem + kReduceBytes);
    int* term_count = reinterpret_cast<int*>(smem + terms_end<T>() - 16);
    T* s_par;
    int* s_code;
    T* Xs = stage_node_program<T>(smem + terms_end<T>(), ncode, nparam, ncode_len, nparam_len, s_code, s_par);
    T* Zt = Xs + LD * LD;
    T* op = Zt + LD * LD;

    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
    // this thread's tile element (u, v) of a vector: x[(u R + v) kThreads]
    T* const base = scratch + (int64_t)blockIdx.x * kVectors * RR * kThreads + threadIdx.x;
    const TileCG<T> cg{Xs, base, base + RR * kThreads, base + 3 * RR * kThreads};
    T* const diag = base + 2 * RR * kThreads;

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const int64_t g1 = pair_g1[k], g2 = pair_g2[k];
        const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
        const int n1 = (int)(s1.node_off[g1 + 1] - v1), n2 = (int)(s2.node_off[g2 + 1] - v2);
        const PairOperands<T> po = pair_operands(s1, s2, g1, g2, n1, n2);
        // the previous pair's last readers of the term table passed its final reduction
        if (threadIdx.x == 0) {
            *term_count = pair_terms<T>(s1.cats + g1 * kMaxCategories, s1.n_cats[g1], s2.cats + g2 * kMaxCategories,
                                        s2.n_cats[g2], form, scale, h, terms);
        }

        double init[2] = {0.0, 0.0};  // r^T z, ||b||^2
        start_tile_systems<T, R, 1>(s1, s2, v1, v2, n1, n2, s_code, s_par, q, diag, cg, cg, init);
        gk::block_sum<kWarps>(init, red);  // its barriers also publish Xs and the terms
        const int n_terms = *term_count;
        CGState st{init[0], sqrt(init[1]), sqrt(init[1]), 0, true};
        GemmOperator<T, R> xmv_op{terms, n_terms, po, op, Zt, cg, diag, n1, n2};
        preconditioned_cg<T>(gk::BlockTeam<kWarps>{red}, xmv_op, st, tol, max_iter);

        double total[1] = {tile_sum<T, R>(cg.x, n1, n2)};
        gk::block_sum<kWarps>(total, red);
        if (nodal != nullptr) {
            T* out = nodal + nodal_off[k];
#pragma unroll
            for (int u = 0; u < R; ++u) {
                const int a = ty * R + u;
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    const int b = tx * R + v;
                    if (a < n1 && b < n2) out[(int64_t)a * n2 + b] = (T)((double)p2 * cg.x[(u * R + v) * kThreads]);
                }
            }
        }
        if (threadIdx.x == 0) {
            k_out[k] = (double)p2 * total[0];
            it_out[k] = st.it;
            res_out[k] = st.bnorm > 0 ? st.rnorm / st.bnorm : 0.0;
        }
    }
}

// The vertex-kernel derivative term, out of line like system_diagonal: two program interpretations.
template <typename T>
__device__ __noinline__ double vertex_derivative_term(const T* feat1, const T* feat2, const int* ncode, const T* npar,
                                                      const int* dcode, const T* dpar, T x, T y, T diag) {
    double term = 0.0;  // +0.0 plus the term: the same addend for the caller's sum
    add_vertex_derivative(term, feat1, feat2, ncode, npar, dcode, dpar, x, y, diag);
    return term;
}

// The sequential gradient's adjoint start (S = 1): y0 = alpha x, r0 = 1 - alpha (b - r_x), its
// direction z0 = r0 / diag into cy.Xs (the forward direction's array: every thread passed the
// forward solve's last reduction after its last XMV); returns whether the adjoint has to run.
template <typename T, int R>
__device__ bool gemm_warm_adjoint(const GemmSet<T>& s1, const GemmSet<T>& s2, int64_t v1, int64_t v2, int n1, int n2,
                                  const int* s_code, const T* s_par, T q, double tol, const TileCG<T>& cx,
                                  const TileCG<T>& cy, CGState& sy, const T* __restrict__ diag, double* red) {
    constexpr int LD = kTileThreads * R;
    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
    double w[2] = {0.0, 0.0};  // 1^T x and x^T (b - r_x) = x^T M x
#pragma unroll 1
    for (int u = 0; u < R; ++u) {
#pragma unroll 1
        for (int v = 0; v < R; ++v) {
            const int a = ty * R + u, b = tx * R + v;
            if (a < n1 && b < n2) {
                const int e = (u * R + v) * kThreads;
                T d;
                system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b], s1.node_feat + (v1 + a) * s1.n_nfeat,
                                s2.node_feat + (v2 + b) * s2.n_nfeat, s_code, s_par, q, d);
                const T mx = d * q * q - cx.r[e];  // (M x)_e, kept in the adjoint's r
                cy.r[e] = mx;
                w[0] += (double)cx.x[e];
                w[1] += (double)cx.x[e] * mx;
            }
        }
    }
    gk::block_sum<kWarps>(w, red);
    const T alpha = w[1] > 0 ? (T)(w[0] / w[1]) : T(0);
    double rs[2] = {0.0, 0.0};  // r^T z and r^T r of the adjoint's start
#pragma unroll 1
    for (int u = 0; u < R; ++u) {
        const int a = ty * R + u;
        T row[R];
#pragma unroll
        for (int v = 0; v < R; ++v) {
            const int b = tx * R + v;
            row[v] = T(0);
            if (a < n1 && b < n2) {
                const int e = (u * R + v) * kThreads;
                const T ri = T(1) - alpha * cy.r[e];
                const T zi = ri / diag[e];
                cy.x[e] = alpha * cx.x[e];
                cy.r[e] = ri;
                row[v] = zi;
                rs[0] += (double)ri * zi;
                rs[1] += (double)ri * ri;
            }
        }
        store_row<T, R>(cy.Xs + a * LD + tx * R, row);
    }
    gk::block_sum<kWarps>(rs, red);  // also publishes the direction
    sy.rz = rs[0];
    sy.rnorm = sqrt(rs[1]);
    sy.it = 0;
    return sy.rnorm > tol * sy.bnorm && rs[0] > 0;
}

// The lockstep CG operator of a gradient's pair (common/cg.cuh): GemmOperator's, for the
// directions of x and y (S = 2: in Xx and Xy, each staged operand serving both GEMMs; S = 1: one
// after the other in one array).
template <typename T, int R, int S>
struct GemmLockstepOperator {
    const Term<T>* terms;
    int n_terms;
    const PairOperands<T>& po;
    T *op, *Ztx, *Zty;
    const TileCG<T>&cx, &cy;
    const T* diag;
    int n1, n2;
    // the adjoint's warm start (S = 1)
    const GemmSet<T>&s1, &s2;
    int64_t v1, v2;
    const int* s_code;
    const T* s_par;
    T q;
    double tol;
    double* red;

    __device__ __forceinline__ void product(bool run_x, bool run_y, double (&pAp)[2]) {
        bool both = false;
        if constexpr (S == 2) {
            if (run_x && run_y) {
                T* const X2[2] = {cx.Xs, cy.Xs};
                T* const Z2[2] = {Ztx, Zty};
                T* const Y2[2] = {cx.ysum, cy.ysum};
                factorized_xmv<T, R, 2>(terms, n_terms, po, op, X2, Z2, Y2);
                both = true;
            }
        }
        if (!both) {
            // one side runs on alone
            const TileCG<T>& one = run_x ? cx : cy;
            T* const X1[1] = {one.Xs};
            T* const Z1[1] = {Ztx};
            T* const Y1[1] = {one.ysum};
            factorized_xmv<T, R, 1>(terms, n_terms, po, op, X1, Z1, Y1);
        }
        if (run_x) pAp[0] = tile_system_product<T, R>(cx, diag, n_terms, n1, n2);
        if (run_y) pAp[1] = tile_system_product<T, R>(cy, diag, n_terms, n1, n2);
    }
    __device__ __forceinline__ void step(int side, T alpha, double& rr, double& rz) {
        tile_cg_step<T, R>(side == 0 ? cx : cy, diag, alpha, n1, n2, rr, rz);
    }
    __device__ __forceinline__ void new_directions(bool run_x, bool run_y, T beta_x, T beta_y) {
        if (run_x) tile_new_direction<T, R>(cx, beta_x, n1, n2);
        if (run_y) tile_new_direction<T, R>(cy, beta_y, n1, n2);
    }
    __device__ __forceinline__ bool warm_adjoint(CGState& sy) {
        return gemm_warm_adjoint<T, R>(s1, s2, v1, v2, n1, n2, s_code, s_par, q, tol, cx, cy, sy, diag, red);
    }
};

// Gradients: M x = b and the adjoint M y = 1 in lockstep, then the raw derivative columns of
// graphkern/_mgk_gradient.py, as cuda_src/mgk_csr.cu's csr_gradient computes them (same
// stopping rule, same sums).  While both solves run, every staged operand of a term serves the
// GEMMs of both directions (factorized_xmv with N = 2: two X, two Zt in shared memory); a side
// that has converged stops and the other runs on alone.  Shared memory: the header of
// terms_end<T, true>, the node program, then Xs_x, Xs_y, Zt_x, Zt_y, op (five LD x LD arrays).
// S = 2: the solves in lockstep (above).  S = 1: one after the other with one direction array
// (K's three LD x LD arrays): M x = b, then M y = 1 from the warm start y0 = alpha x, alpha =
// 1^T x / x^T M x with M x = b - r_x (no XMV), as cuda_src/mgk_csr.cu's sequential gradient.
template <typename T, int R, int S>
__device__ void gemm_gradient(const GemmSet<T> s1, const GemmSet<T> s2, const int64_t* __restrict__ pair_g1,
                              const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ ncode,
                              const T* __restrict__ nparam, int ncode_len, int nparam_len, int form, T scale, T h,
                              T q, T p2, double tol, int max_iter, T* __restrict__ scratch, GradientTerms<T> gt,
                              int n_raw, double* __restrict__ k_out, int32_t* __restrict__ it_out,
                              double* __restrict__ res_out, int32_t* __restrict__ adj_it_out,
                              double* __restrict__ adj_res_out, double* __restrict__ grad_out) {
    constexpr int LD = kTileThreads * R;
    constexpr int RR = R * R;
    constexpr int kHead = terms_end<T, true>();
    extern __shared__ __align__(16) unsigned char smem[];
    double* red = reinterpret_cast<double*>(smem);
    Term<T>* terms = reinterpret_cast<Term<T>*>(smem + kGradientReduceBytes);
    int* term_count = reinterpret_cast<int*>(smem + kHead - 16);
    T* s_par;
    int* s_code;
    T* Xx = stage_node_program<T>(smem + kHead, ncode, nparam, ncode_len, nparam_len, s_code, s_par);
    T* Xy = S == 2 ? Xx + LD * LD : Xx;  // S = 1: the adjoint reuses the forward direction's array
    T* Ztx = Xx + S * LD * LD;
    T* Zty = S == 2 ? Ztx + LD * LD : Ztx;
    T* op = Ztx + S * LD * LD;

    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
    T* const base = scratch + (int64_t)blockIdx.x * kGradientVectors * RR * kThreads + threadIdx.x;
    const TileCG<T> cx{Xx, base, base + RR * kThreads, base + 2 * RR * kThreads};
    const TileCG<T> cy{Xy, base + 3 * RR * kThreads, base + 4 * RR * kThreads, base + 5 * RR * kThreads};
    T* const diag = base + 6 * RR * kThreads;
    bool any_xmv = false;  // a contraction that multiplies x (not free)
    for (int c = 0; c < gt.n_contractions; ++c) any_xmv = any_xmv || gt.cfree[c] == 0;

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const int64_t g1 = pair_g1[k], g2 = pair_g2[k];
        const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
        const int n1 = (int)(s1.node_off[g1 + 1] - v1), n2 = (int)(s2.node_off[g2 + 1] - v2);
        const PairOperands<T> po = pair_operands(s1, s2, g1, g2, n1, n2);
        const int32_t* cats1 = s1.cats + g1 * kMaxCategories;
        const int32_t* cats2 = s2.cats + g2 * kMaxCategories;
        // the previous pair's last readers of the term table passed its final reduction
        if (threadIdx.x == 0) *term_count = pair_terms<T>(cats1, s1.n_cats[g1], cats2, s2.n_cats[g2], form, scale, h,
                                                           terms);

        // M x = b = D q^2 and M y = 1, both from 0, preconditioned by diag = D / V
        double init[3] = {0.0, 0.0, 0.0};  // r^T z of x, ||b||^2, r^T z of y
        start_tile_systems<T, R, S>(s1, s2, v1, v2, n1, n2, s_code, s_par, q, diag, cx, cy, init);
        gk::block_sum<kWarps>(init, red);  // its barriers also publish Xx, Xy and the terms
        const int n_terms = *term_count;
        CGState sx{init[0], sqrt(init[1]), sqrt(init[1]), 0, true};
        CGState sy{init[2], sqrt((double)n1 * n2), sqrt((double)n1 * n2), 0, S == 2};

        GemmLockstepOperator<T, R, S> xmv_op{terms, n_terms, po, op,    Ztx,    Zty,   cx, cy, diag, n1,
                                             n2,    s1,      s2, v1, v2,     s_code, s_par, q,  tol, red};
        lockstep_cg<T>(gk::BlockTeam<kWarps>{red}, xmv_op, sx, sy, S == 2, tol, max_iter);

        // K, dK/dq and the free contraction's y^T (D V^-1 x - b) in one pass.  q: D = (d1 + q)(d2 + q)
        // and b = D q^2, so dD/dq = d1 + d2 and db/dq = q^2 dD/dq + 2 q D.  x goes into Xx (the
        // contractions' XMVs multiply it; outside n1 x n2 Xx holds zeros, as every direction did).
        double sums[3] = {0.0, 0.0, 0.0};
        const double qd = (double)q;
        over_tile_rows<T, R, true>(Xx, [&](int u, T(&pv)[R]) {
            const int a = ty * R + u;
#pragma unroll
            for (int v = 0; v < R; ++v) {
                const int b = tx * R + v;
                const int e = (u * R + v) * kThreads;
                if (a < n1 && b < n2) {
                    const double d1 = (double)(s1.degree[v1 + a] + q), d2 = (double)(s2.degree[v2 + b] + q);
                    const double d = d1 * d2, xi = cx.x[e], yi = cy.x[e], m = diag[e];
                    sums[0] += xi;
                    sums[1] += yi * ((qd * qd * (d1 + d2) + 2 * qd * d) - xi * (d1 + d2) * m / d);
                    sums[2] += yi * (m * xi - d * qd * qd);
                    if (any_xmv) pv[v] = cx.x[e];
                }
            }
        });
        gk::block_sum<kWarps>(sums, red);  // also publishes x in Xx
        double* grad = grad_out + k * n_raw;
        if (threadIdx.x == 0) {
            k_out[k] = (double)p2 * sums[0];
            it_out[k] = sx.it;
            res_out[k] = sx.bnorm > 0 ? sx.rnorm / sx.bnorm : 0.0;
            adj_it_out[k] = sy.it;
            adj_res_out[k] = sy.bnorm > 0 ? sy.rnorm / sy.bnorm : 0.0;
            grad[gt.n_node] = (double)p2 * sums[1];
        }
        // vertex-kernel terms: dM/dtheta = -D V^-2 dV/dtheta (diag = D / V)
        for (int j = 0; j < gt.n_node; ++j) {
            const int* dcode = gt.ncode + gt.ncode_off[j];
            const T* dpar = gt.npar + gt.npar_off[j];
            double acc[1] = {0.0};
#pragma unroll 1
            for (int u = 0; u < R; ++u) {
#pragma unroll 1
                for (int v = 0; v < R; ++v) {
                    const int a = ty * R + u, b = tx * R + v;
                    if (a < n1 && b < n2) {
                        const int e = (u * R + v) * kThreads;
                        acc[0] += vertex_derivative_term(s1.node_feat + (v1 + a) * s1.n_nfeat,
                                                         s2.node_feat + (v2 + b) * s2.n_nfeat, s_code, s_par, dcode,
                                                         dpar, cx.x[e], cy.x[e], diag[e]);
                    }
                }
            }
            gk::block_sum<kWarps>(acc, red);
            if (threadIdx.x == 0) grad[j] = (double)p2 * acc[0];
        }
        // edge-kernel terms: y^T (A1 (x) A2 (.) dE_c) x, free or by one factorized XMV of x
        for (int c = 0; c < gt.n_contractions; ++c) {
            double acc[1] = {0.0};
            if (gt.cfree[c] != 0) {
                acc[0] = gt.cfree[c] * sums[2];
            } else {
                // every thread passed a reduction since it last read the term table
                if (threadIdx.x == 0) {
                    *term_count = contraction_terms<T>(cats1, s1.n_cats[g1], cats2, s2.n_cats[g2], gt.cform[c],
                                                       gt.ctheta[c], terms);
                }
                __syncthreads();
                const int nt = *term_count;
                T* const X1[1] = {Xx};
                T* const Z1[1] = {Ztx};
                T* const Y1[1] = {cx.ysum};
                factorized_xmv<T, R, 1>(terms, nt, po, op, X1, Z1, Y1);
                if (nt > 0) {
#pragma unroll
                    for (int u = 0; u < R; ++u) {
#pragma unroll
                        for (int v = 0; v < R; ++v) {
                            const int e = (u * R + v) * kThreads;
                            if (owns<R>(u, v, n1, n2)) acc[0] += (double)cy.x[e] * (double)cx.ysum[e];
                        }
                    }
                }
                gk::block_sum<kWarps>(acc, red);
            }
            if (threadIdx.x == 0) grad[gt.n_node + 1 + c] = (double)p2 * acc[0];
        }
    }
}

}  // namespace

// What a launch solves after its two graph sets (graphkern/mgk/gemm.py: GEMMGPUEngine._prepare): the
// pairs in launch order, the node program, the edge kernel's form and parameters, the
// hyperparameters and the scratch.
template <typename T>
struct GemmJob {
    const int64_t* pair_g1;
    const int64_t* pair_g2;
    int64_t n_pairs;
    const int* ncode;
    const T* nparam;
    int ncode_len, nparam_len;
    int form;
    T scale, h, q, p2;
    double tol;
    int max_iter;
    T* scratch;
};
#define GEMM_JOB_FIELDS(X, N, S)                                                                              \
    X(N, S, pair_g1) X(N, S, pair_g2) X(N, S, n_pairs) X(N, S, ncode) X(N, S, nparam) X(N, S, ncode_len)       \
    X(N, S, nparam_len) X(N, S, form) X(N, S, scale) X(N, S, h) X(N, S, q) X(N, S, p2) X(N, S, tol)            \
    X(N, S, max_iter) X(N, S, scratch)
#define GEMM_JOB(j)                                                                                         \
    j.pair_g1, j.pair_g2, j.n_pairs, j.ncode, j.nparam, j.ncode_len, j.nparam_len, j.form, j.scale, j.h, j.q, \
        j.p2, j.tol, j.max_iter, j.scratch
// X(R, ...) for the tile classes R = 1 .. 4 and 1 .. 6
#define GEMM_R4(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__)
#define GEMM_R6(X, ...) GEMM_R4(X, __VA_ARGS__) X(5, __VA_ARGS__) X(6, __VA_ARGS__)

// Entry points mgk_gemm_r<R>_<f32|f64> (graphkern/mgk/gemm.py: GEMMGPUEngine): pairs with
// max(n1, n2) <= 16 R.  Double stops at R = 6: three 112 x 112 arrays of doubles pass 227 KB.
#define GEMM_ENTRY(R, T, SUFFIX)                                                                               \
    extern "C" __global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<T, R>()))                      \
        mgk_gemm_r##R##_##SUFFIX(__grid_constant__ const GemmSet<T> set1, __grid_constant__ const GemmSet<T> set2, __grid_constant__ const GemmJob<T> job,           \
                                 __grid_constant__ const SolveOutputs<T> out) {                                                 \
        gemm_solve<T, R>(set1, set2, GEMM_JOB(job), out.k, out.iterations, out.residuals, out.nodal,           \
                         out.nodal_off);                                                                      \
    }

GEMM_R6(GEMM_ENTRY, float, f32)
GEMM_ENTRY(7, float, f32)
GEMM_ENTRY(8, float, f32)
GEMM_R6(GEMM_ENTRY, double, f64)

// Gradient entry points mgk_gemm_gradient_r<R>_<f32|f64> (graphkern/mgk/gemm.py:
// GEMMGPUEngine.solve_gradient): the sets and job, the GradientTerms (the contractions' programs
// and aux unused here), the gradient outputs.  Five LD x LD arrays: float stops at R = 6, double at R = 4.
#define GEMM_GRADIENT_ENTRY_OF(KIND, R, T, SUFFIX, S, MINB)                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads, MINB)                                             \
        mgk_gemm_##KIND##_r##R##_##SUFFIX(__grid_constant__ const GemmSet<T> set1, __grid_constant__ const GemmSet<T> set2, __grid_constant__ const GemmJob<T> job,  \
                                          __grid_constant__ const GradientTerms<T> terms, __grid_constant__ const GradientOutputs out) {          \
        gemm_gradient<T, R, S>(set1, set2, GEMM_JOB(job), terms, terms.n_raw, MGK_GRADIENT_OUTPUTS(out));      \
    }
#define GEMM_GRADIENT_ENTRY(R, T, SUFFIX) \
    GEMM_GRADIENT_ENTRY_OF(gradient, R, T, SUFFIX, 2, (gradient_min_blocks_per_sm<T, R>()))
// The sequential gradient (S = 1, K's three arrays and K's blocks per SM): mgk_gemm_gradient_seq_r<R>_*.
#define GEMM_SEQ_GRADIENT_ENTRY(R, T, SUFFIX) \
    GEMM_GRADIENT_ENTRY_OF(gradient_seq, R, T, SUFFIX, 1, (min_blocks_per_sm<T, R>()))

GEMM_R6(GEMM_GRADIENT_ENTRY, float, f32)
GEMM_R4(GEMM_GRADIENT_ENTRY, double, f64)
GEMM_R6(GEMM_SEQ_GRADIENT_ENTRY, float, f32)
GEMM_R4(GEMM_SEQ_GRADIENT_ENTRY, double, f64)

// The tiles and shared memory graphkern/mgk/gemm.py plans with (terms_end, the node program, the
// arrays of a block) and the largest tile R of each family of entry points above
GRAPHKERN_EXPORTS = {
    {"tile_threads", kTileThreads},
    {"max_categories", kMaxCategories},
    {"max_terms", kMaxTerms},
    {"max_gradient_terms", kMaxGradientTerms},
    {"reduce_bytes", kReduceBytes},
    {"gradient_reduce_bytes", kGradientReduceBytes},
    {"term_bytes_f32", sizeof(Term<float>)},
    {"term_bytes_f64", sizeof(Term<double>)},
    {"max_tile_f32", 8},
    {"max_tile_f64", 6},
    {"max_gradient_tile_f32", 6},
    {"max_gradient_tile_f64", 4},
    {"vectors", kVectors},
    {"gradient_vectors", kGradientVectors},
    {"form_constant", FORM_CONSTANT},
    {"form_kronecker", FORM_KRONECKER},
    GK_STRUCT("set_f32", GemmSet<float>, GEMM_SET_FIELDS)
    GK_STRUCT("set_f64", GemmSet<double>, GEMM_SET_FIELDS)
    GK_STRUCT("job_f32", GemmJob<float>, GEMM_JOB_FIELDS)
    GK_STRUCT("job_f64", GemmJob<double>, GEMM_JOB_FIELDS)
    MGK_OUTPUT_EXPORTS
};
