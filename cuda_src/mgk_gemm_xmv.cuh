// The factorized XMV of cuda_src/mgk_gemm.cu (its module comment has the math): the terms
// alpha_t L_t X R_t^T a pair needs, the operands staged from the graphs' dense layouts, and the
// register-tiled GEMMs over shared memory.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/kernel_program.cuh"

namespace mgk_gemm {

using mgk::EDGE_CONSTANT;
using mgk::EDGE_KRONECKER;

constexpr int kTileThreads = 16;                       // the block is a kTileThreads^2 grid of threads
constexpr int kThreads = kTileThreads * kTileThreads;
constexpr int kMaxCategories = 16;                     // edge categories per graph

enum : int { FORM_CONSTANT = 0, FORM_KRONECKER = 1 };

// alpha_t L_t X R_t^T with L_t = W1 (cat1 == c1 ? 1 : lam1), R_t = W2 (cat2 == c2 ? 1 : lam2).
template <typename T>
struct Term {
    int c1;
    int c2;
    T lam1;
    T lam2;
    T alpha;
};

// One graph set of a launch (graphkern/mgk/gemm.py: GemmData, in the caller's vertex numbering).
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
#define GEMM_SET_FIELDS(X, N, S)                                                                            \
    X(N, S, node_off) X(N, S, degree) X(N, S, node_feat) X(N, S, dense_off) X(N, S, wt) X(N, S, cat)          \
    X(N, S, cats) X(N, S, n_cats) X(N, S, n_nfeat)

// Two values of T in one vector load or store.
template <typename T>
using Vec2 = std::conditional_t<sizeof(T) == 4, float2, double2>;

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
    } else if constexpr (R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) {
            const Vec2<T> f = reinterpret_cast<const Vec2<T>*>(src)[i];
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
    } else if constexpr (R % 2 == 0) {
#pragma unroll
        for (int i = 0; i < R / 2; ++i) reinterpret_cast<Vec2<T>*>(dst)[i] = Vec2<T>{v[2 * i], v[2 * i + 1]};
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

// The pair's terms (module comment; graphkern/mgk/gemm.py: pair_terms is the same rule).  One
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
        // across GEMM1 would spill at 128 registers (R = 6), the bound of two blocks per SM
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

// The terms of edge contraction y^T (A1 (x) A2 (.) E_c) x (one thread): the base kernel
// h + (1 - h) delta (scale 1: pair_terms' rule) or the constant 1, or the Kronecker delta's
// derivative by h, 1 - delta = W1 X W2^T minus the terms of the common categories.
template <typename T>
__device__ __noinline__ int contraction_terms(const int32_t* __restrict__ cats1, int nc1,
                                              const int32_t* __restrict__ cats2, int nc2, int cform, T theta,
                                              Term<T>* terms) {
    if (cform == EDGE_CONSTANT) return pair_terms<T>(cats1, nc1, cats2, nc2, FORM_CONSTANT, T(1), T(1), terms);
    if (cform == EDGE_KRONECKER) {
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

}  // namespace mgk_gemm
