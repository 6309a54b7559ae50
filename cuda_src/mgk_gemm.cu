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
// (h = 0: the common categories).  graphkern/_mgk_gemm.py has the same rule (pair_terms) for its
// cost model and flop counts.
//
// One thread block of 16 x 16 threads solves a pair (grid-stride over the pairs of one tile
// class, largest first): the preconditioned CG of the other solvers (cuda_src/mgk_csr.cu): M = D /
// V - A1 (x) A2 (.) E, b = D q^2, x0 = 0, diagonal preconditioner D / V (V floored at 1e-20),
// stop at ||r|| <= tol ||b|| or when p^T A p <= 0 (an exactly zero residual), scalars in double,
// K = p^2 sum(x), the nodal matrix p^2 x on request.  Each term is two GEMMs over shared memory,
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
// Global (graphkern/_mgk_gemm.py: GemmData): per graph the transposed dense weights
// wt[k n4 + a] = W[a][k] and local edge categories cat[k n4 + a] (uint8) with rows of n4 =
// n rounded up to 4 (16-byte vector loads), its sorted category codes (at most kMaxCategories);
// the CG vectors x, r, D / V and the XMV's running sum Y of the thread's own tile in a scratch slot
// per block, laid out [tile element][thread] so that every access of a warp is one coalesced line
// (only their owner reads them: no barrier orders them).
//
// Cost floor: 2 T (n1^2 n2 + n1 n2^2) flops per XMV, 10.6 MFLOP for two 96-vertex graphs with
// 3 edge categories (T = 3), 14 MFLOP in the 1 + C form, against 135 MFLOP of element terms
// (nnz1 nnz2 = 67M) of the octile and CSR solvers.  On an H100 (FP32 67 TFLOP/s): 0.16 us per
// pair-iteration over the whole GPU, 21 us for one SM.  Per k and warp: R^2 FFMA against 2 R / 2
// vector loads whose unique data (2 R + 16 R values) is ~3.4 shared-memory wavefronts at R = 6:
// FFMA-bound with two resident blocks per SM.  Operand staging adds about 2 LD^2 element
// transforms per term (1-2% of the GEMMs at n = 96, more for small graphs), and each term needs
// four barriers.
#include <cstdint>

#include "mgk_program.cuh"

namespace {

constexpr int kTileThreads = 16;                       // the block is a kTileThreads^2 grid of threads
constexpr int kThreads = kTileThreads * kTileThreads;  // graphkern/_mgk_gemm.py: THREADS_PER_BLOCK
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxReduce = 2;                          // values summed by one reduction of the K solver
constexpr int kReduceBytes = kWarps * kMaxReduce * 8;  // graphkern/_mgk_gemm.py: REDUCE_BYTES
constexpr int kGradientReduce = 4;                     // ... and of the gradient solver
constexpr int kGradientReduceBytes = kWarps * kGradientReduce * 8;  // graphkern/_mgk_gemm.py: GRADIENT_REDUCE_BYTES
constexpr int kMaxCategories = 16;                     // graphkern/_mgk_gemm.py: MAX_CATEGORIES
constexpr int kMaxTerms = kMaxCategories;              // pair_terms never needs more
constexpr int kMaxGradientTerms = kMaxCategories + 1;  // contraction_terms: 1 + the common categories
constexpr int kVectors = 4;                            // x, r, D / V, the XMV (graphkern/_mgk_gemm.py: N_VECTORS)
// x, r, the XMV of the forward solve, the same of the adjoint one, D / V (graphkern/_mgk_gemm.py:
// N_GRADIENT_VECTORS)
constexpr int kGradientVectors = 7;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr double kVertexKernelFloor = 1e-20;  // as cuda_src/mgk.cu and the CPU solver

enum : int { FORM_CONSTANT = 0, FORM_KRONECKER = 1 };  // graphkern/_mgk_gemm.py: FORM_CODES
// The edge contractions' forms a gradient launch takes (graphkern/_mgk_gradient.py: EDGE_FORMS)
enum : int { CONTRACT_CONSTANT = 1, CONTRACT_KRONECKER = 2, CONTRACT_KRONECKER_DERIVATIVE = 4 };

__host__ __device__ constexpr int align16(int n) { return (n + 15) & ~15; }

// alpha_t L_t X R_t^T with L_t = W1 (cat1 == c1 ? 1 : lam1), R_t = W2 (cat2 == c2 ? 1 : lam2).
template <typename T>
struct Term {
    int c1;
    int c2;
    T lam1;
    T lam2;
    T alpha;
};

// Bytes before the node program: reduction slots, the term table, the term count (the K solver's;
// GRADIENT: the gradient solver's, with more reduction slots and room for a contraction's terms).
template <typename T, bool GRADIENT = false>
__host__ __device__ constexpr int terms_end() {
    return GRADIENT ? kGradientReduceBytes + align16(kMaxGradientTerms * (int)sizeof(Term<T>)) + 16
                    : kReduceBytes + align16(kMaxTerms * (int)sizeof(Term<T>)) + 16;
}

// Blocks per SM each tile class asks for.  ptxas -v (sm_90, CUDA 13.0): float R = 4..6 fit 128
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
// from float R = 5 and double R = 4 (graphkern/_mgk_gemm.py: gradient_shared_bytes), and whose
// paired GEMMs keep two R x R accumulators live.
template <typename T, int R>
__host__ __device__ constexpr int gradient_min_blocks_per_sm() {
    return sizeof(T) == 4 ? (R <= 4 ? 2 : 1) : (R <= 3 ? 2 : 1);
}

// One graph set of a launch (graphkern/_mgk_gemm.py: GemmData, in the caller's vertex numbering).
template <typename T>
struct GemmSet {
    const int64_t* __restrict__ node_off;   // graph -> first vertex (n_graphs + 1)
    const T* __restrict__ degree;           // per vertex (row sums of the weights)
    const T* __restrict__ node_feat;        // [vertex][n_nfeat]
    const int64_t* __restrict__ dense_off;  // graph -> first element of its wt / cat (-1: not laid out)
    const T* __restrict__ wt;               // transposed dense weights, rows of n4
    const uint8_t* __restrict__ cat;        // local edge categories, same layout
    const int32_t* __restrict__ cats;       // [graph][kMaxCategories] sorted category codes
    const int32_t* __restrict__ n_cats;     // categories per graph
    int n_nfeat;
};

// R consecutive values (16 R-aligned row base plus a multiple of R): the widest loads the
// alignment allows.
template <typename T, int R>
__device__ __forceinline__ void load_row(const T* __restrict__ src, T (&v)[R]) {
    if constexpr (sizeof(T) == 4 && R % 4 == 0) {
#pragma unroll
        for (int i = 0; i < R / 4; ++i) {
            const float4 f = reinterpret_cast<const float4*>(src)[i];
            v[4 * i] = f.x;
            v[4 * i + 1] = f.y;
            v[4 * i + 2] = f.z;
            v[4 * i + 3] = f.w;
        }
    } else if constexpr (sizeof(T) == 4 && R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) {
            const float2 f = reinterpret_cast<const float2*>(src)[i];
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        }
    } else if constexpr (sizeof(T) == 8 && R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) {
            const double2 f = reinterpret_cast<const double2*>(src)[i];
            v[2 * i] = f.x;
            v[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i) v[i] = src[i];
    }
}

template <typename T, int R>
__device__ __forceinline__ void store_row(T* __restrict__ dst, const T (&v)[R]) {
    if constexpr (sizeof(T) == 4 && R % 4 == 0) {
#pragma unroll
        for (int i = 0; i < R / 4; ++i)
            reinterpret_cast<float4*>(dst)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    } else if constexpr (sizeof(T) == 4 && R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) reinterpret_cast<float2*>(dst)[i] = make_float2(v[2 * i], v[2 * i + 1]);
    } else if constexpr (sizeof(T) == 8 && R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) reinterpret_cast<double2*>(dst)[i] = make_double2(v[2 * i], v[2 * i + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i) dst[i] = v[i];
    }
}

// Four consecutive values of a 16-byte aligned global array.
__device__ __forceinline__ void load4(const float* __restrict__ src, float (&v)[4]) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(src));
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
}
__device__ __forceinline__ void load4(const double* __restrict__ src, double (&v)[4]) {
    const double2 f = __ldg(reinterpret_cast<const double2*>(src));
    const double2 g = __ldg(reinterpret_cast<const double2*>(src) + 1);
    v[0] = f.x;
    v[1] = f.y;
    v[2] = g.x;
    v[3] = g.y;
}

// acc[s][u][v] += sum_{k < K} P_s[k LD + u] Q_s[k LD + v] for the N products s (N = 2: the forward
// and adjoint directions of a gradient), where one operand is the same for all of them and loaded
// once per k: P (SHARED_P, P[s] unused past 0) or Q (Q[s] unused past 0).  The pointers already
// point at the thread's columns.
template <typename T, int R, int N, bool SHARED_P>
__device__ __forceinline__ void tile_product(const T* const (&P)[N], const T* const (&Q)[N], int K,
                                             T (&acc)[N][R][R]) {
    constexpr int LD = kTileThreads * R;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        T a[N][R], b[N][R];
#pragma unroll
        for (int s = 0; s < N; ++s) {
            if (s == 0 || !SHARED_P) load_row<T, R>(P[s] + k * LD, a[s]);
            if (s == 0 || SHARED_P) load_row<T, R>(Q[s] + k * LD, b[s]);
        }
#pragma unroll
        for (int s = 0; s < N; ++s) {
            const T(&as)[R] = a[SHARED_P ? 0 : s];
            const T(&bs)[R] = b[SHARED_P ? s : 0];
#pragma unroll
            for (int u = 0; u < R; ++u) {
#pragma unroll
                for (int v = 0; v < R; ++v) acc[s][u][v] = fma(as[u], bs[v], acc[s][u][v]);
            }
        }
    }
}

// op[k][a] = alpha W[a][k] (cat[a][k] == c ? 1 : lam) for k < n, a < LD (0 past n), from the
// graph's transposed dense layout (rows of n4, zero-padded past n).  Called by every thread;
// the caller's barriers order it against the readers of op.
template <typename T, int R>
__device__ __forceinline__ void stage_operand(T* __restrict__ op, const T* __restrict__ wt,
                                              const uint8_t* __restrict__ cat, int n, int n4, int c, T lam,
                                              T alpha) {
    constexpr int LD = kTileThreads * R;
    constexpr int kGroups = LD / 4;  // 4-value groups per row of op
    // every group of an LD x LD operand in flight at once: one round trip to L2 per staging
    constexpr int kStageBatch = (LD * kGroups + kThreads - 1) / kThreads;
    const int total = n * kGroups;
    const T hit = alpha, miss = alpha * lam;
    const bool masked = c >= 0;  // c = -1: no entry has the category, every value is miss
    for (int g0 = threadIdx.x; g0 < total; g0 += kStageBatch * kThreads) {
        T w[kStageBatch][4];
        uint32_t cv[kStageBatch];
#pragma unroll
        for (int s = 0; s < kStageBatch; ++s) {
            const int g = g0 + s * kThreads;
            const int k = g / kGroups, a = (g - k * kGroups) * 4;
            cv[s] = 0;
            if (g < total && a < n4) {
                load4(wt + (int64_t)k * n4 + a, w[s]);
                if (masked) cv[s] = __ldg(reinterpret_cast<const uint32_t*>(cat + (int64_t)k * n4 + a));
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) w[s][i] = T(0);
            }
        }
#pragma unroll
        for (int s = 0; s < kStageBatch; ++s) {
            const int g = g0 + s * kThreads;
            if (g < total) {
                const int k = g / kGroups, a = (g - k * kGroups) * 4;
                T v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const bool is_c = masked && (int)((cv[s] >> (8 * i)) & 0xffu) == c;
                    v[i] = w[s][i] * (is_c ? hit : miss);
                }
                store_row<T, 4>(op + k * LD + a, v);
            }
        }
    }
}

// f(u, p_row) for each row u of the thread's tile of Xs (rows ty R + u, columns tx R ..), p_row
// its R values, stored back when WRITE.  One row at a time: whole-tile arrays would cost the
// registers the GEMMs need.
template <typename T, int R, bool WRITE, typename F>
__device__ __forceinline__ void over_tile_rows(T* Xs, F f) {
    constexpr int LD = kTileThreads * R;
    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
#pragma unroll 1
    for (int u = 0; u < R; ++u) {
        T* row = Xs + (ty * R + u) * LD + tx * R;
        T pv[R];
        load_row<T, R>(row, pv);
        f(u, pv);
        if constexpr (WRITE) store_row<T, R>(row, pv);
    }
}

// The sum of v[k] over the block, the same bits in every thread (each sums the warps' partial
// sums in the same order).  Called by every thread of the block; red holds kWarps K doubles.
template <int K>
__device__ __forceinline__ void block_sum(double (&v)[K], double* red) {
    static_assert(K <= kGradientReduce, "raise kGradientReduce");
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int off = kWarp / 2; off > 0; off >>= 1) v[k] += __shfl_xor_sync(kFullMask, v[k], off);
    }
    __syncthreads();  // every thread has read the previous reduction's partial sums
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) red[warp * K + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int w = 0; w < kWarps; ++w) s += red[w * K + k];
        v[k] = s;
    }
}

// D = (d1 + q)(d2 + q) and the system's diagonal D / V (V floored) of a vertex pair.
// Once per pair and vertex pair: out of line, so that the interpreter's registers do not weigh
// on the CG loop's.
template <typename T>
__device__ __noinline__ T system_diagonal(T degree1, T degree2, const T* feat1, const T* feat2, const int* ncode,
                                          const T* npar, T q, T& d) {
    d = (degree1 + q) * (degree2 + q);
    T v = mgk::eval_program(ncode, npar, feat1, 1, feat2, 1);
    if (v < T(kVertexKernelFloor)) v = T(kVertexKernelFloor);
    return d / v;
}

// The pair's terms (module comment; graphkern/_mgk_gemm.py: pair_terms is the same rule).  One
// thread.  cats1/cats2: the graphs' category codes (nc1, nc2 <= kMaxCategories, distinct).
template <typename T>
__device__ __noinline__ int pair_terms(const int32_t* __restrict__ cats1, int nc1, const int32_t* __restrict__ cats2,
                                       int nc2, int form, T scale, T h, Term<T>* terms) {
    if (scale == T(0)) return 0;
    if (form == FORM_CONSTANT) {
        terms[0] = Term<T>{-1, -1, T(1), T(1), scale};
        return 1;
    }
    nc1 = min(nc1, kMaxCategories);  // the host routes no pair with more; this only keeps in bounds
    nc2 = min(nc2, kMaxCategories);
    int in2[kMaxCategories];  // G1's category i is G2's category in2[i] (-1: G2 has none)
    int in1[kMaxCategories];  // and G2's category j is G1's in1[j]
    int common = 0;
    for (int j = 0; j < nc2; ++j) in1[j] = -1;
    for (int i = 0; i < nc1; ++i) {
        in2[i] = -1;
        for (int j = 0; j < nc2; ++j) {
            if (cats1[i] == cats2[j]) {
                in2[i] = j;
                in1[j] = i;
                ++common;
            }
        }
    }
    int nt = 0;
    if (h == T(0)) {  // only equal labels contribute
        for (int i = 0; i < nc1; ++i)
            if (in2[i] >= 0) terms[nt++] = Term<T>{i, in2[i], T(0), T(0), scale};
        return nt;
    }
    const int shared_form = 1 + common;
    if (shared_form <= nc1 && shared_form <= nc2) {
        terms[nt++] = Term<T>{-1, -1, T(1), T(1), scale * h};
        for (int i = 0; i < nc1; ++i)
            if (in2[i] >= 0) terms[nt++] = Term<T>{i, in2[i], T(0), T(0), scale * (T(1) - h)};
    } else if (nc1 <= nc2) {
        for (int i = 0; i < nc1; ++i) terms[nt++] = Term<T>{i, in2[i], T(0), h, scale};
    } else {
        for (int j = 0; j < nc2; ++j) terms[nt++] = Term<T>{in1[j], j, h, T(0), scale};
    }
    return nt;
}

// One pair's graphs as the operand stagings read them (their transposed dense layouts).
template <typename T>
struct PairOperands {
    const T* wt1;
    const uint8_t* cat1;
    const T* wt2;
    const uint8_t* cat2;
    int n1, n4_1, n2, n4_2;
};

template <typename T>
__device__ __forceinline__ PairOperands<T> pair_operands(const GemmSet<T>& s1, const GemmSet<T>& s2, int64_t g1,
                                                         int64_t g2, int n1, int n2) {
    return PairOperands<T>{s1.wt + s1.dense_off[g1], s1.cat + s1.dense_off[g1], s2.wt + s2.dense_off[g2],
                           s2.cat + s2.dense_off[g2], n1, (n1 + 3) & ~3, n2, (n2 + 3) & ~3};
}

// ysum[s] = sum_t alpha_t L_t X_s R_t^T (this thread's R x R tile) for the N directions X_s in
// Xs[s] (N = 2: a gradient's forward and adjoint directions, each staged operand serving both
// GEMMs); Zt[s] holds GEMM1's output.  Nothing written when n_terms = 0.  Called by every thread;
// starts each term with a barrier (the readers of op and Zt are done; Xs is published), the
// caller's next barrier orders ysum's owner against nothing (only the owner reads it).
template <typename T, int R, int N>
__device__ __forceinline__ void factorized_xmv(const Term<T>* terms, int n_terms, const PairOperands<T>& po, T* op,
                                               T* const (&Xs)[N], T* const (&Zt)[N], T* const (&ysum)[N]) {
    constexpr int LD = kTileThreads * R;
    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
    for (int t = 0; t < n_terms; ++t) {
        const Term<T> term = terms[t];
        __syncthreads();  // every thread is done reading op and Zt (previous term, previous product)
        stage_operand<T, R>(op, po.wt1, po.cat1, po.n1, po.n4_1, term.c1, term.lam1, term.alpha);
        __syncthreads();  // op = alpha L^T; Xs holds the directions
        {
            T z[N][R][R];  // Z_s[tx R + u][ty R + v] = (L X_s)[a][j]
#pragma unroll
            for (int s = 0; s < N; ++s) {
#pragma unroll
                for (int u = 0; u < R; ++u) {
#pragma unroll
                    for (int v = 0; v < R; ++v) z[s][u][v] = T(0);
                }
            }
            const T* P[N];
            const T* Q[N];
#pragma unroll
            for (int s = 0; s < N; ++s) {
                P[s] = op + tx * R;
                Q[s] = Xs[s] + ty * R;
            }
            tile_product<T, R, N, true>(P, Q, po.n1, z);
#pragma unroll
            for (int s = 0; s < N; ++s) {
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    T col[R];
#pragma unroll
                    for (int u = 0; u < R; ++u) col[u] = z[s][u][v];
                    store_row<T, R>(Zt[s] + (ty * R + v) * LD + tx * R, col);
                }
            }
        }
        __syncthreads();  // Zt is complete and nobody reads op as L^T any more
        stage_operand<T, R>(op, po.wt2, po.cat2, po.n2, po.n4_2, term.c2, term.lam2, T(1));
        __syncthreads();  // op = R^T
        // the sum over the terms waits in the scratch slot between terms: registers for it
        // across GEMM1 would cost the second block per SM (ptxas spilled at 128 at R = 6)
        T y[N][R][R];
#pragma unroll
        for (int s = 0; s < N; ++s) {
#pragma unroll
            for (int u = 0; u < R; ++u) {
#pragma unroll
                for (int v = 0; v < R; ++v) y[s][u][v] = t == 0 ? T(0) : ysum[s][(u * R + v) * kThreads];
            }
        }
        const T* P[N];
        const T* Q[N];
#pragma unroll
        for (int s = 0; s < N; ++s) {
            P[s] = Zt[s] + ty * R;
            Q[s] = op + tx * R;
        }
        tile_product<T, R, N, false>(P, Q, po.n2, y);
#pragma unroll
        for (int s = 0; s < N; ++s) {
#pragma unroll
            for (int u = 0; u < R; ++u) {
#pragma unroll
                for (int v = 0; v < R; ++v) ysum[s][(u * R + v) * kThreads] = y[s][u][v];
            }
        }
    }
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

        // diag = D / V (V floored), x0 = 0, r0 = b = D q^2, p0 = r0 / diag; zero outside n1 x n2
        double init[2] = {0.0, 0.0};  // r^T z, ||b||^2
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
                    T d;
                    const T m = system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b],
                                                s1.node_feat + (v1 + a) * s1.n_nfeat,
                                                s2.node_feat + (v2 + b) * s2.n_nfeat, s_code, s_par, q, d);
                    const T bi = d * q * q;
                    const T z = bi / m;
                    diag[e] = m;
                    cg.x[e] = T(0);
                    cg.r[e] = bi;
                    row[v] = z;
                    init[0] += (double)bi * z;
                    init[1] += (double)bi * bi;
                }
            }
            store_row<T, R>(Xs + a * LD + tx * R, row);
        }
        block_sum(init, red);  // its barriers also publish Xs and the terms
        const int n_terms = *term_count;
        double rz = init[0];
        const double bnorm = sqrt(init[1]);
        double rnorm = bnorm;
        int it = 0;

        while (it < max_iter) {
            T* const X1[1] = {Xs};
            T* const Z1[1] = {Zt};
            T* const Y1[1] = {cg.ysum};
            factorized_xmv<T, R, 1>(terms, n_terms, po, op, X1, Z1, Y1);
            double pAp[1] = {tile_system_product<T, R>(cg, diag, n_terms, n1, n2)};
            block_sum(pAp, red);
            if (!(pAp[0] > 0)) break;  // an exactly zero residual (M is positive definite)
            const T alpha = (T)(rz / pAp[0]);
            double upd[2] = {0.0, 0.0};  // ||r||^2, r^T z
            tile_cg_step<T, R>(cg, diag, alpha, n1, n2, upd[0], upd[1]);
            block_sum(upd, red);
            ++it;
            rnorm = sqrt(upd[0]);
            if (rnorm <= tol * bnorm) break;
            const T beta = (T)(upd[1] / rz);
            rz = upd[1];
            tile_new_direction<T, R>(cg, beta, n1, n2);
        }

        double total[1] = {tile_sum<T, R>(cg.x, n1, n2)};
        block_sum(total, red);
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
            it_out[k] = it;
            res_out[k] = bnorm > 0 ? rnorm / bnorm : 0.0;
        }
    }
}

// The derivative programs and edge contractions of a gradient launch (graphkern/_mgk_gradient.py:
// GradientPlan; the arguments of cuda_src/mgk_csr.cu's gradient entry points): vertex-kernel
// derivative program j at ncode + ncode_off[j] (global memory); edge contraction c of form
// cform[c] (CONTRACT_*), its Kronecker theta, and cfree[c]: 0, or the factor that makes it
// cfree[c] y^T (A (.) E) x (a diagonal sum, no XMV).
template <typename T>
struct GradientTerms {
    int n_node;
    const int* ncode;
    const T* npar;
    const int64_t* ncode_off;
    const int64_t* npar_off;
    int n_contractions;
    const int* cform;
    const T* ctheta;
    const double* cfree;
};

// The terms of edge contraction y^T (A1 (x) A2 (.) E_c) x (one thread): the base kernel
// h + (1 - h) delta (scale 1: pair_terms' rule) or the constant 1, or the Kronecker delta's
// derivative by h, 1 - delta = W1 X W2^T minus the terms of the common categories.
template <typename T>
__device__ __noinline__ int contraction_terms(const int32_t* __restrict__ cats1, int nc1,
                                              const int32_t* __restrict__ cats2, int nc2, int cform, T theta,
                                              Term<T>* terms) {
    if (cform == CONTRACT_CONSTANT) return pair_terms<T>(cats1, nc1, cats2, nc2, FORM_CONSTANT, T(1), T(1), terms);
    if (cform == CONTRACT_KRONECKER) {
        return pair_terms<T>(cats1, nc1, cats2, nc2, theta == T(1) ? FORM_CONSTANT : FORM_KRONECKER, T(1), theta,
                             terms);
    }
    nc1 = min(nc1, kMaxCategories);  // as pair_terms: the host routes no pair with more
    nc2 = min(nc2, kMaxCategories);
    int nt = 0;
    terms[nt++] = Term<T>{-1, -1, T(1), T(1), T(1)};
    for (int i = 0; i < nc1; ++i) {
        for (int j = 0; j < nc2; ++j) {
            if (cats1[i] == cats2[j]) terms[nt++] = Term<T>{i, j, T(0), T(0), T(-1)};
        }
    }
    return nt;
}

// y_L x_L D_L V_L^-2 dV_L/dtheta of one vertex pair (0 where V is floored: no derivative there).
// Out of line, like system_diagonal: two program interpretations.
template <typename T>
__device__ __noinline__ double vertex_derivative_term(const T* feat1, const T* feat2, const int* ncode, const T* npar,
                                                      const int* dcode, const T* dpar, T x, T y, T diag) {
    const T v = mgk::eval_program(ncode, npar, feat1, 1, feat2, 1);
    if (v < T(kVertexKernelFloor)) return 0.0;
    const T dv = mgk::eval_program(dcode, dpar, feat1, 1, feat2, 1);
    return (double)y * x * ((double)diag / v) * dv;
}

// One side of a gradient's lockstep CG (cuda_src/mgk_csr.cu: CGSide).
struct SideState {
    double rz;
    double bnorm;
    double rnorm;
    int it;
    bool running;
};

// After the reduction of r^T r and r^T z: counts the iteration, stops a converged side, else
// returns beta (cuda_src/mgk_csr.cu: cg_finish).
template <typename T>
__device__ __forceinline__ T side_finish(SideState& st, double rr, double rzn, double tol) {
    ++st.it;
    st.rnorm = sqrt(rr);
    if (st.rnorm <= tol * st.bnorm) {
        st.running = false;
        return T(0);
    }
    const T beta = (T)(rzn / st.rz);
    st.rz = rzn;
    return beta;
}

// The sequential gradient's adjoint start (S = 1): y0 = alpha x, r0 = 1 - alpha (b - r_x), its
// direction z0 = r0 / diag into cy.Xs (the forward direction's array: every thread passed the
// forward solve's last reduction after its last XMV); returns whether the adjoint has to run.
template <typename T, int R>
__device__ bool gemm_warm_adjoint(const GemmSet<T>& s1, const GemmSet<T>& s2, int64_t v1, int64_t v2, int n1, int n2,
                                  const int* s_code, const T* s_par, T q, double tol, const TileCG<T>& cx,
                                  const TileCG<T>& cy, SideState& sy, const T* __restrict__ diag, double* red) {
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
    block_sum(w, red);
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
    block_sum(rs, red);  // also publishes the direction
    sy.rz = rs[0];
    sy.rnorm = sqrt(rs[1]);
    sy.it = 0;
    return sy.rnorm > tol * sy.bnorm && rs[0] > 0;
}

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
                    const T m = system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b],
                                                s1.node_feat + (v1 + a) * s1.n_nfeat,
                                                s2.node_feat + (v2 + b) * s2.n_nfeat, s_code, s_par, q, d);
                    const T bi = d * q * q;
                    const T zx = bi / m, zy = T(1) / m;
                    diag[e] = m;
                    cx.x[e] = T(0);
                    cx.r[e] = bi;
                    row_x[v] = zx;
                    init[0] += (double)bi * zx;
                    init[1] += (double)bi * bi;
                    if (S == 2) {
                        cy.x[e] = T(0);
                        cy.r[e] = T(1);
                        row_y[v] = zy;
                        init[2] += (double)zy;
                    }
                }
            }
            store_row<T, R>(Xx + a * LD + tx * R, row_x);
            if (S == 2) store_row<T, R>(Xy + a * LD + tx * R, row_y);
        }
        block_sum(init, red);  // its barriers also publish Xx, Xy and the terms
        const int n_terms = *term_count;
        SideState sx{init[0], sqrt(init[1]), sqrt(init[1]), 0, true};
        SideState sy{init[2], sqrt((double)n1 * n2), sqrt((double)n1 * n2), 0, S == 2};
        bool adjoint_started = S == 2;

        // Lockstep.  Every decision below comes from block sums, the same bits in every thread.
        while (true) {
            sx.running = sx.running && sx.it < max_iter;
            sy.running = sy.running && sy.it < max_iter;
            if (!sx.running && !sy.running) {
                if (adjoint_started) break;
                adjoint_started = true;
                sy.running = gemm_warm_adjoint<T, R>(s1, s2, v1, v2, n1, n2, s_code, s_par, q, tol, cx, cy, sy,
                                                     diag, red);
                continue;
            }
            bool both = false;
            if constexpr (S == 2) {
                if (sx.running && sy.running) {
                    T* const X2[2] = {Xx, Xy};
                    T* const Z2[2] = {Ztx, Zty};
                    T* const Y2[2] = {cx.ysum, cy.ysum};
                    factorized_xmv<T, R, 2>(terms, n_terms, po, op, X2, Z2, Y2);
                    both = true;
                }
            }
            if (!both) {
                // one side runs on alone
                const TileCG<T>& one = sx.running ? cx : cy;
                T* const X1[1] = {one.Xs};
                T* const Z1[1] = {Ztx};
                T* const Y1[1] = {one.ysum};
                factorized_xmv<T, R, 1>(terms, n_terms, po, op, X1, Z1, Y1);
            }
            double pAp[2] = {0.0, 0.0};
            if (sx.running) pAp[0] = tile_system_product<T, R>(cx, diag, n_terms, n1, n2);
            if (sy.running) pAp[1] = tile_system_product<T, R>(cy, diag, n_terms, n1, n2);
            block_sum(pAp, red);
            // pAp <= 0 only for an exactly zero residual (M is positive definite): that side is done
            sx.running = sx.running && pAp[0] > 0;
            sy.running = sy.running && pAp[1] > 0;
            double upd[4] = {0.0, 0.0, 0.0, 0.0};  // r^T r and r^T z of x, then of y
            if (sx.running) tile_cg_step<T, R>(cx, diag, (T)(sx.rz / pAp[0]), n1, n2, upd[0], upd[1]);
            if (sy.running) tile_cg_step<T, R>(cy, diag, (T)(sy.rz / pAp[1]), n1, n2, upd[2], upd[3]);
            block_sum(upd, red);
            const T beta_x = sx.running ? side_finish<T>(sx, upd[0], upd[1], tol) : T(0);
            const T beta_y = sy.running ? side_finish<T>(sy, upd[2], upd[3], tol) : T(0);
            if (sx.running) tile_new_direction<T, R>(cx, beta_x, n1, n2);
            if (sy.running) tile_new_direction<T, R>(cy, beta_y, n1, n2);
        }

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
        block_sum(sums, red);  // also publishes x in Xx
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
            block_sum(acc, red);
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
                block_sum(acc, red);
            }
            if (threadIdx.x == 0) grad[gt.n_node + 1 + c] = (double)p2 * acc[0];
        }
    }
}

}  // namespace

#define GEMM_SET_ARGS(T, S)                                                                                    \
    const int64_t *node_off##S, const T *degree##S, const T *node_feat##S, const int64_t *dense_off##S,         \
        const T *wt##S, const uint8_t *cat##S, const int32_t *cats##S, const int32_t *n_cats##S, int n_nfeat##S
#define GEMM_SET(T, S)                                                                                         \
    GemmSet<T> {                                                                                               \
        node_off##S, degree##S, node_feat##S, dense_off##S, wt##S, cat##S, cats##S, n_cats##S, n_nfeat##S      \
    }

// Entry points mgk_gemm_r<R>_<f32|f64> (graphkern/_mgk_gemm.py: GEMMGPUEngine): pairs with
// max(n1, n2) <= 16 R.  Double stops at R = 6: three 112 x 112 arrays of doubles pass 227 KB.
#define GEMM_ENTRY(R, T, SUFFIX)                                                                               \
    extern "C" __global__ void __launch_bounds__(kThreads, (min_blocks_per_sm<T, R>()))                      \
        mgk_gemm_r##R##_##SUFFIX(GEMM_SET_ARGS(T, 1), GEMM_SET_ARGS(T, 2), const int64_t* pair_g1,           \
                                 const int64_t* pair_g2, int64_t n_pairs, const int* ncode, const T* nparam,  \
                                 int ncode_len, int nparam_len, int form, T scale, T h, T q, T p2, double tol, \
                                 int max_iter, T* scratch, double* k_out, int32_t* it_out, double* res_out,   \
                                 T* nodal, const int64_t* nodal_off) {                                         \
        gemm_solve<T, R>(GEMM_SET(T, 1), GEMM_SET(T, 2), pair_g1, pair_g2, n_pairs, ncode, nparam, ncode_len,  \
                         nparam_len, form, scale, h, q, p2, tol, max_iter, scratch, k_out, it_out, res_out,    \
                         nodal, nodal_off);                                                                    \
    }

GEMM_ENTRY(1, float, f32)
GEMM_ENTRY(2, float, f32)
GEMM_ENTRY(3, float, f32)
GEMM_ENTRY(4, float, f32)
GEMM_ENTRY(5, float, f32)
GEMM_ENTRY(6, float, f32)
GEMM_ENTRY(7, float, f32)
GEMM_ENTRY(8, float, f32)
GEMM_ENTRY(1, double, f64)
GEMM_ENTRY(2, double, f64)
GEMM_ENTRY(3, double, f64)
GEMM_ENTRY(4, double, f64)
GEMM_ENTRY(5, double, f64)
GEMM_ENTRY(6, double, f64)

// Gradient entry points mgk_gemm_gradient_r<R>_<f32|f64> (graphkern/_mgk_gemm.py:
// GEMMGPUEngine.solve_gradient): the K entry points' head (no nodal output), then the gradient
// arguments of cuda_src/mgk_csr.cu's gradient entry points (graphkern/_mgk_gpu.py: gradient_terms;
// the general form's contraction programs and the square exponential's aux are not used here)
// and its outputs.  Five LD x LD arrays: float stops at R = 6, double at R = 4.
#define GEMM_GRADIENT_ENTRY(R, T, SUFFIX) GEMM_GRADIENT_ENTRY_OF(gradient, R, T, SUFFIX, 2, \
                                                                  (gradient_min_blocks_per_sm<T, R>()))
#define GEMM_GRADIENT_ENTRY_OF(KIND, R, T, SUFFIX, S, MINB)                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads, MINB)                                             \
        mgk_gemm_##KIND##_r##R##_##SUFFIX(                                                                   \
            GEMM_SET_ARGS(T, 1), GEMM_SET_ARGS(T, 2), const int64_t* pair_g1, const int64_t* pair_g2,        \
            int64_t n_pairs, const int* ncode, const T* nparam, int ncode_len, int nparam_len, int form,      \
            T scale, T h, T q, T p2, double tol, int max_iter, T* scratch, int n_node, const int* dncode,     \
            const T* dnpar, const int64_t* dncode_off, const int64_t* dnpar_off, int n_contractions,          \
            const int* cform, const T* ctheta, const T* caux, const int* ccode, const T* cpar,                \
            const int64_t* ccode_off, const int64_t* cpar_off, const double* cfree, int ccode_len,            \
            int cpar_len, int n_raw, double* k_out, int32_t* it_out, double* res_out, int32_t* adj_it_out,    \
            double* adj_res_out, double* grad_out) {                                                          \
        const GradientTerms<T> gt{n_node, dncode, dnpar, dncode_off, dnpar_off, n_contractions, cform,        \
                                  ctheta, cfree};                                                             \
        gemm_gradient<T, R, S>(GEMM_SET(T, 1), GEMM_SET(T, 2), pair_g1, pair_g2, n_pairs, ncode, nparam,      \
                            ncode_len, nparam_len, form, scale, h, q, p2, tol, max_iter, scratch, gt, n_raw,  \
                            k_out, it_out, res_out, adj_it_out, adj_res_out, grad_out);                       \
    }

GEMM_GRADIENT_ENTRY(1, float, f32)
GEMM_GRADIENT_ENTRY(2, float, f32)
GEMM_GRADIENT_ENTRY(3, float, f32)
GEMM_GRADIENT_ENTRY(4, float, f32)
GEMM_GRADIENT_ENTRY(5, float, f32)
GEMM_GRADIENT_ENTRY(6, float, f32)
GEMM_GRADIENT_ENTRY(1, double, f64)
GEMM_GRADIENT_ENTRY(2, double, f64)
GEMM_GRADIENT_ENTRY(3, double, f64)
GEMM_GRADIENT_ENTRY(4, double, f64)

// The sequential gradient (S = 1, K's three arrays and K's blocks per SM): mgk_gemm_gradient_seq_r<R>_*.
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 1, float, f32, 1, (min_blocks_per_sm<float, 1>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 2, float, f32, 1, (min_blocks_per_sm<float, 2>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 3, float, f32, 1, (min_blocks_per_sm<float, 3>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 4, float, f32, 1, (min_blocks_per_sm<float, 4>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 5, float, f32, 1, (min_blocks_per_sm<float, 5>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 6, float, f32, 1, (min_blocks_per_sm<float, 6>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 1, double, f64, 1, (min_blocks_per_sm<double, 1>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 2, double, f64, 1, (min_blocks_per_sm<double, 2>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 3, double, f64, 1, (min_blocks_per_sm<double, 3>()))
GEMM_GRADIENT_ENTRY_OF(gradient_seq, 4, double, f64, 1, (min_blocks_per_sm<double, 4>()))
