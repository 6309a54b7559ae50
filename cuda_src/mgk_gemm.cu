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
constexpr int kMaxReduce = 2;                          // values summed by one block reduction at most
constexpr int kReduceBytes = kWarps * kMaxReduce * 8;  // graphkern/_mgk_gemm.py: REDUCE_BYTES
constexpr int kMaxCategories = 16;                     // graphkern/_mgk_gemm.py: MAX_CATEGORIES
constexpr int kMaxTerms = kMaxCategories;              // pair_terms never needs more
constexpr int kVectors = 4;                            // x, r, D / V, the XMV (graphkern/_mgk_gemm.py: N_VECTORS)
constexpr unsigned kFullMask = 0xffffffffu;
constexpr double kVertexKernelFloor = 1e-20;  // as cuda_src/mgk.cu and the CPU solver

enum : int { FORM_CONSTANT = 0, FORM_KRONECKER = 1 };  // graphkern/_mgk_gemm.py: FORM_CODES

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

// Bytes before the node program: reduction slots, the term table, the term count.
template <typename T>
__host__ __device__ constexpr int terms_end() {
    return kReduceBytes + align16(kMaxTerms * (int)sizeof(Term<T>)) + 16;
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

// acc[u][v] += sum_{k < K} P[k LD + u] Q[k LD + v]: P and Q already point at the thread's columns.
template <typename T, int R>
__device__ __forceinline__ void tile_product(const T* __restrict__ P, const T* __restrict__ Q, int K,
                                             T (&acc)[R][R]) {
    constexpr int LD = kTileThreads * R;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        T a[R], b[R];
        load_row<T, R>(P + k * LD, a);
        load_row<T, R>(Q + k * LD, b);
#pragma unroll
        for (int u = 0; u < R; ++u) {
#pragma unroll
            for (int v = 0; v < R; ++v) acc[u][v] = fma(a[u], b[v], acc[u][v]);
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
// sums in the same order).  Called by every thread of the block.
template <int K>
__device__ __forceinline__ void block_sum(double (&v)[K], double* red) {
    static_assert(K <= kMaxReduce, "raise kMaxReduce");
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int off = kWarp / 2; off > 0; off >>= 1) v[k] += __shfl_xor_sync(kFullMask, v[k], off);
    }
    __syncthreads();  // every thread has read the previous reduction's partial sums
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) red[warp * kMaxReduce + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int w = 0; w < kWarps; ++w) s += red[w * kMaxReduce + k];
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
    T* s_par = reinterpret_cast<T*>(smem + terms_end<T>());
    int* s_code = reinterpret_cast<int*>(smem + terms_end<T>() + align16(nparam_len * (int)sizeof(T)));
    T* Xs = reinterpret_cast<T*>(smem + terms_end<T>() + align16(nparam_len * (int)sizeof(T)) +
                                 align16(ncode_len * 4));
    T* Zt = Xs + LD * LD;
    T* op = Zt + LD * LD;
    for (int i = threadIdx.x; i < nparam_len; i += kThreads) s_par[i] = nparam[i];
    for (int i = threadIdx.x; i < ncode_len; i += kThreads) s_code[i] = ncode[i];
    __syncthreads();  // the node program, before the first diagonal

    const int tx = threadIdx.x % kTileThreads, ty = threadIdx.x / kTileThreads;
    // this thread's tile element (u, v) of a vector: x[(u R + v) kThreads]
    T* const x = scratch + (int64_t)blockIdx.x * kVectors * RR * kThreads + threadIdx.x;
    T* const r = x + RR * kThreads;
    T* const diag = r + RR * kThreads;
    T* const ysum = diag + RR * kThreads;  // (A1 (x) A2 (.) E) p, summed over the terms

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const int64_t g1 = pair_g1[k], g2 = pair_g2[k];
        const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
        const int n1 = (int)(s1.node_off[g1 + 1] - v1), n2 = (int)(s2.node_off[g2 + 1] - v2);
        const int n4_1 = (n1 + 3) & ~3, n4_2 = (n2 + 3) & ~3;
        const T* wt1 = s1.wt + s1.dense_off[g1];
        const T* wt2 = s2.wt + s2.dense_off[g2];
        const uint8_t* cat1 = s1.cat + s1.dense_off[g1];
        const uint8_t* cat2 = s2.cat + s2.dense_off[g2];
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
                    x[e] = T(0);
                    r[e] = bi;
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
            for (int t = 0; t < n_terms; ++t) {
                const Term<T> term = terms[t];
                __syncthreads();  // every thread is done reading op and Zt (previous term, previous iteration)
                stage_operand<T, R>(op, wt1, cat1, n1, n4_1, term.c1, term.lam1, term.alpha);
                __syncthreads();  // op = alpha L^T; Xs holds p
                {
                    T z[R][R];  // Z[tx R + u][ty R + v] = (L X)[a][j]
#pragma unroll
                    for (int u = 0; u < R; ++u) {
#pragma unroll
                        for (int v = 0; v < R; ++v) z[u][v] = T(0);
                    }
                    tile_product<T, R>(op + tx * R, Xs + ty * R, n1, z);
#pragma unroll
                    for (int v = 0; v < R; ++v) {
                        T col[R];
#pragma unroll
                        for (int u = 0; u < R; ++u) col[u] = z[u][v];
                        store_row<T, R>(Zt + (ty * R + v) * LD + tx * R, col);
                    }
                }
                __syncthreads();  // Zt is complete and nobody reads op as L^T any more
                stage_operand<T, R>(op, wt2, cat2, n2, n4_2, term.c2, term.lam2, T(1));
                __syncthreads();  // op = R^T
                // the sum over the terms waits in the scratch slot between terms: registers for it
                // across GEMM1 would cost the second block per SM (ptxas spilled at 128 at R = 6)
                T y[R][R];
#pragma unroll
                for (int u = 0; u < R; ++u) {
#pragma unroll
                    for (int v = 0; v < R; ++v) y[u][v] = t == 0 ? T(0) : ysum[(u * R + v) * kThreads];
                }
                tile_product<T, R>(Zt + ty * R, op + tx * R, n2, y);
#pragma unroll
                for (int u = 0; u < R; ++u) {
#pragma unroll
                    for (int v = 0; v < R; ++v) ysum[(u * R + v) * kThreads] = y[u][v];
                }
            }

            // Ap = diag p - y (into ysum), p^T Ap over the block
            const auto own = [&](int u, int v) { return ty * R + u < n1 && tx * R + v < n2; };
            double pAp[1] = {0.0};
            over_tile_rows<T, R, false>(Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    const int e = (u * R + v) * kThreads;
                    if (own(u, v)) {
                        const T ap = diag[e] * pv[v] - (n_terms > 0 ? ysum[e] : T(0));
                        ysum[e] = ap;
                        pAp[0] += (double)pv[v] * ap;
                    }
                }
            });
            block_sum(pAp, red);
            if (!(pAp[0] > 0)) break;  // an exactly zero residual (M is positive definite)
            const T alpha = (T)(rz / pAp[0]);
            double upd[2] = {0.0, 0.0};  // ||r||^2, r^T z
            over_tile_rows<T, R, false>(Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    const int e = (u * R + v) * kThreads;
                    if (own(u, v)) {
                        x[e] = x[e] + alpha * pv[v];
                        const T ri = r[e] - alpha * ysum[e];
                        r[e] = ri;
                        const T zi = ri / diag[e];
                        ysum[e] = zi;  // z = r / diag, for the new direction
                        upd[0] += (double)ri * ri;
                        upd[1] += (double)ri * zi;
                    }
                }
            });
            block_sum(upd, red);
            ++it;
            rnorm = sqrt(upd[0]);
            if (rnorm <= tol * bnorm) break;
            const T beta = (T)(upd[1] / rz);
            rz = upd[1];
            // p = z + beta p (outside n1 x n2 it stays 0); the next product's first barrier publishes it
            over_tile_rows<T, R, true>(Xs, [&](int u, T(&pv)[R]) {
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    if (own(u, v)) pv[v] = ysum[(u * R + v) * kThreads] + beta * pv[v];
                }
            });
        }

        double total[1] = {0.0};
#pragma unroll
        for (int u = 0; u < R; ++u) {
#pragma unroll
            for (int v = 0; v < R; ++v) {
                if (ty * R + u < n1 && tx * R + v < n2) total[0] += (double)x[(u * R + v) * kThreads];
            }
        }
        block_sum(total, red);
        if (nodal != nullptr) {
            T* out = nodal + nodal_off[k];
#pragma unroll
            for (int u = 0; u < R; ++u) {
                const int a = ty * R + u;
#pragma unroll
                for (int v = 0; v < R; ++v) {
                    const int b = tx * R + v;
                    if (a < n1 && b < n2) out[(int64_t)a * n2 + b] = (T)((double)p2 * x[(u * R + v) * kThreads]);
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
