// Marginalized graph kernel on the GPU for sparse graphs: one thread block per pair, the XMV as
// a sum over pairs of stored entries (CSR x CSR) instead of dense 8x8 octile products.
//
// The system M = D / V - A1 (x) A2 (.) E, b = D q^2, x0 = 0, and its CG (common/cg.cuh) are the
// core solver's (cuda_src/mgk.cu); K = p^2 sum(x).
//
// Data (graphkern/mgk/csr.py builds it): every graph's vertices renumbered by decreasing
// degree (so that the 32 outputs of a warp, which differ in their G2 vertex, have rows of
// similar length and the warp rarely waits on one long row), its CSR in that numbering (global
// row pointers, local column indices, weights, edge features), the degree and vertex features
// in that numbering, and `orig`: each renumbered vertex's index in the caller's numbering (for
// the nodal output only; K does not depend on the numbering).
//
// Per pair the block stages both graphs' CSR in shared memory, one 16-byte (float) or 32-byte
// (double) record per stored entry: G1's column pre-multiplied by n2, its weight, the edge
// feature the shortcut compares and theta * weight (Kronecker: the weight times the edge kernel
// where labels differ); G2's column, weight and feature.  The search direction p lives in shared
// memory too; x, r, Ap and the diagonal D / V in a global scratch slot of the block.  Thread t
// owns the outputs L = t, t + blockDim, ... (L = a n2 + b in the renumbered vertices), for the
// XMV and for every vector update, so only p is ever read across threads.
//
//   (A1 (x) A2 (.) E) p [a n2 + b] = sum_{k2 in row b of G2} w2 sum_{k1 in row a of G1}
//                                      E(e1, e2) w1 p[j1 n2 + j2]
//
// The inner loop runs over G1's row a, the same for the lanes of a warp (32 consecutive b of one
// a when n2 is a multiple of 32): its record is a broadcast read; the only scattered read is p.
// Per entry pair: one 128-bit broadcast load, one gathered load of p, the edge kernel (compare
// and select for the Kronecker shortcut) and an FMA, ~7-8 instructions.
//
// Pairs whose records and p do not fit the device's shared memory per block are never launched
// here (graphkern/mgk/csr.py routes them to the fallback solver).
//
// Gradients (mgk_csr_gradient_*, graphkern/mgk/gradient.py has the math): the block also solves
// the adjoint M y = 1, after M x = b from a warm start (mgk_csr_gradient_seq_*, the default; see
// csr_gradient) or in lockstep with it (mgk_csr_gradient_*).  In lockstep the two search
// directions are interleaved in shared memory (p[2 L] forward, p[2 L + 1] adjoint; G1's records
// then hold j1 * 2 n2), so while both solves run one 64-bit (float) or 128-bit (double) gather
// fetches both and the record load and the edge kernel of an entry pair serve both FMAs.  A side that has converged stops: the
// other runs on alone, gathering only its half.  Then the contractions: diagonal sums for the
// vertex-kernel derivatives, q and the edge contractions the plan marks free (a constant factor
// of the edge kernel: y^T (A (.) E) x = y^T (D V^-1 x - b) + y^T r_x, r_x the forward residual,
// the size of K's own error), and for the others one XMV of x (copied into p's forward half)
// with the derivative edge kernel, dotted with y.
#include <cstdint>

#include "common/cg.cuh"
#include "common/exports.cuh"
#include "common/kernel_program.cuh"
#include "common/reductions.cuh"

namespace {

using namespace mgk;
using gk::kWarp;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxReduce = 4;               // values summed by one block reduction at most
constexpr int kReduceBytes = kWarps * kMaxReduce * 8;
constexpr int kVectors = 4;          // a block's scratch vectors: x, r, Ap, the diagonal (p is in shared memory)
constexpr int kGradientVectors = 7;  // x, r, Ap of both solves and the diagonal
// Blocks per SM (sm_90 register counts): at 3 (80 registers) the float entry points do not spill and a
// 96-vertex pair's ~75 KB of shared memory lets 3 blocks share an SM; the double ones spill there
// (their 32-byte records), so they ask for 2 (128 registers).
template <typename T>
constexpr int min_blocks_per_sm() {
    return sizeof(T) == 8 ? 2 : 3;
}

__host__ __device__ constexpr int align16(int n) { return (n + 15) & ~15; }

// One stored entry as the XMV reads it.
template <typename T>
struct CsrEntry {
    T w;    // weight
    T e;    // the edge feature of the shortcut forms
    T tw;   // G1: theta * w (the Kronecker shortcut's value where labels differ)
    int col;  // G1: j1 * n2 (its row of p); G2: j2
};

// Shared-memory records: 16 bytes (float) or 32 bytes (double), loaded with 128-bit loads.
template <typename T>
struct EntrySlot;
template <>
struct EntrySlot<float> {
    float4 v;
};
template <>
struct EntrySlot<double> {
    double2 a;
    double2 b;
};

__device__ __forceinline__ void store_entry(EntrySlot<float>* s, float w, float e, float tw, int col) {
    s->v = make_float4(w, e, tw, __int_as_float(col));
}
__device__ __forceinline__ void store_entry(EntrySlot<double>* s, double w, double e, double tw, int col) {
    s->a = make_double2(w, e);
    s->b = make_double2(tw, __longlong_as_double((long long)col));
}
__device__ __forceinline__ CsrEntry<float> load_entry(const EntrySlot<float>* s) {
    const float4 v = s->v;
    return CsrEntry<float>{v.x, v.y, v.z, __float_as_int(v.w)};
}
__device__ __forceinline__ CsrEntry<double> load_entry(const EntrySlot<double>* s) {
    const double2 a = s->a, b = s->b;
    return CsrEntry<double>{a.x, a.y, b.x, (int)__double_as_longlong(b.y)};
}

// One graph set of a launch (graphkern/mgk/csr.py: CSRData, in the renumbered vertices).
template <typename T>
struct CsrSet {
    const int64_t* __restrict__ node_off;  // graph -> first vertex (n_graphs + 1)
    const int64_t* __restrict__ rowptr;    // global vertex -> first entry (n_vertices + 1)
    const int32_t* __restrict__ indices;   // local column of each entry
    const T* __restrict__ weights;
    const T* __restrict__ edge_feat;       // [entry][n_efeat]
    const T* __restrict__ degree;          // per vertex (row sums of the weights)
    const T* __restrict__ node_feat;       // [vertex][n_nfeat]
    const int32_t* __restrict__ orig;      // renumbered vertex -> its local index in the caller's graph
    int n_efeat;
    int n_nfeat;
};
#define CSR_SET_FIELDS(X, N, S)                                                                            \
    X(N, S, node_off) X(N, S, rowptr) X(N, S, indices) X(N, S, weights) X(N, S, edge_feat) X(N, S, degree)  \
    X(N, S, node_feat) X(N, S, orig) X(N, S, n_efeat) X(N, S, n_nfeat)

template <typename T>
struct Scratch {
    T* __restrict__ x;
    T* __restrict__ r;
    T* __restrict__ Ap;
    T* __restrict__ diag;
};

// E(e1, e2) w1 for G1's record g and G2's record f (k1, k2: their entries, for the general
// form's feature rows f1 + k1 * nf, f2 + k2 * nf).
template <typename T, int FORM>
__device__ __forceinline__ T weighted_edge(const CsrEntry<T>& g, const CsrEntry<T>& f, const EdgeKernel<T>& ek,
                                           const T* f1, const T* f2, int nf, int k1, int k2) {
    if (FORM == EDGE_CONSTANT) return g.w;
    if (FORM == EDGE_KRONECKER) return g.e == f.e ? g.w : g.tw;
    if (FORM == EDGE_KRONECKER_DERIVATIVE) return g.e == f.e ? T(0) : g.w;
    if (FORM == EDGE_SQEXP || FORM == EDGE_SQEXP_DERIVATIVE) {
        const T diff = g.e - f.e;
        const T d2 = diff * diff;
        const T k = exp_of(ek.aux * d2);
        return FORM == EDGE_SQEXP ? g.w * k : g.w * (d2 * k);
    }
    return g.w * eval_program(ek.code, ek.par, f1 + (int64_t)k1 * nf, 1, f2 + (int64_t)k2 * nf, 1);
}

// One pair's staged data in shared memory.  The search directions: p[L S + side] (S = 1 for K;
// S = 2 for gradients, the forward direction at side 0 and the adjoint's at side 1); G1's
// records hold j1 * S n2, so that p + S j2 + side + col is the element (j1, j2).
template <typename T>
struct PairShared {
    const EntrySlot<T>* ent1;
    const EntrySlot<T>* ent2;
    T* p;
    const T* feat1;  // general form: [entry][nf] of each graph
    const T* feat2;
    const int* rp1;  // local row pointers (n1 + 1, n2 + 1)
    const int* rp2;
    int n1;
    int n2;
};

// Both elements of an interleaved pair of directions (one 64- or 128-bit load).
__device__ __forceinline__ float2 load_both(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ double2 load_both(const double* p) { return *reinterpret_cast<const double2*>(p); }

// acc[r] = ((A1 (x) A2 (.) E) v_r)[(a, b)] where v_r[(j1, j2)] = pv[S j2 + r + col(j1)] (NRHS = 2:
// the two interleaved directions of a gradient, S = 2).  The edge kernel of each entry pair is
// evaluated once for all NRHS vectors.
template <typename T, int FORM, int NRHS, int S>
__device__ __forceinline__ void entry_pair_sum(const PairShared<T>& ps, const EdgeKernel<T>& ek, int nf, int a,
                                               int b, const T* __restrict__ pv, T (&acc)[NRHS]) {
    static_assert(NRHS == 1 || (NRHS == 2 && S == 2), "one vector, or the interleaved pair");
    const int k1_begin = ps.rp1[a], k1_end = ps.rp1[a + 1];
    const int k2_end = ps.rp2[b + 1];
#pragma unroll
    for (int r = 0; r < NRHS; ++r) acc[r] = 0;
    for (int k2 = ps.rp2[b]; k2 < k2_end; ++k2) {
        const CsrEntry<T> f = load_entry(ps.ent2 + k2);
        const T* __restrict__ pcol = pv + S * f.col;
        T s[NRHS];
#pragma unroll
        for (int r = 0; r < NRHS; ++r) s[r] = 0;
#pragma unroll 4
        for (int k1 = k1_begin; k1 < k1_end; ++k1) {
            const CsrEntry<T> g = load_entry(ps.ent1 + k1);
            const T e = weighted_edge<T, FORM>(g, f, ek, ps.feat1, ps.feat2, nf, k1, k2);
            if constexpr (NRHS == 1) {
                s[0] += e * pcol[g.col];
            } else {
                const auto v = load_both(pcol + g.col);
                s[0] += e * v.x;
                s[1] += e * v.y;
            }
        }
#pragma unroll
        for (int r = 0; r < NRHS; ++r) acc[r] += f.w * s[r];
    }
}

// Ap_r = diag v_r - scale (A1 (x) A2 (.) E) v_r for this thread's outputs, v_r[L] = pv[L S + r];
// adds this thread's share of v_r^T Ap_r to pAp[r].
template <typename T, int FORM, int NRHS, int S>
__device__ __forceinline__ void system_product(const PairShared<T>& ps, const EdgeKernel<T>& ek, const T* diag,
                                               const T* __restrict__ pv, T* const (&Ap)[NRHS], int nf,
                                               double (&pAp)[NRHS]) {
    const int n2 = ps.n2;
    const int N = ps.n1 * n2;
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const int a = L / n2, b = L - a * n2;
        T acc[NRHS];
        entry_pair_sum<T, FORM, NRHS, S>(ps, ek, nf, a, b, pv, acc);
        const T d = diag[L];
#pragma unroll
        for (int r = 0; r < NRHS; ++r) {
            const T pL = pv[L * S + r];
            const T ap = d * pL - ek.scale * acc[r];
            Ap[r][L] = ap;
            pAp[r] += (double)pL * ap;
        }
    }
}

// Bytes of the block's fixed part: the reduction slots, then the programs' parameters and code
// (graphkern/mgk/csr.py: header_bytes).
template <typename T>
__device__ __forceinline__ int header_bytes(int param_len, int code_len) {
    return kReduceBytes + align16(param_len * (int)sizeof(T)) + align16(code_len * 4);
}

// Copies the programs, then a gradient's contraction programs (`extra`), behind the reduction
// slots; returns where the pair's data begins.  Published by the first barrier of a pair.
template <typename T>
__device__ __forceinline__ unsigned char* stage_programs(unsigned char* smem, const int* __restrict__ code,
                                         const T* __restrict__ params, int code_len, int param_len,
                                         const int* __restrict__ extra_code, const T* __restrict__ extra_par,
                                         int extra_code_len, int extra_par_len, int*& s_code, T*& s_par) {
    const int all_par = param_len + extra_par_len, all_code = code_len + extra_code_len;
    s_par = reinterpret_cast<T*>(smem + kReduceBytes);
    s_code = reinterpret_cast<int*>(smem + kReduceBytes + align16(all_par * (int)sizeof(T)));
    for (int i = threadIdx.x; i < param_len; i += kThreads) s_par[i] = params[i];
    for (int i = threadIdx.x; i < extra_par_len; i += kThreads) s_par[param_len + i] = extra_par[i];
    for (int i = threadIdx.x; i < code_len; i += kThreads) s_code[i] = code[i];
    for (int i = threadIdx.x; i < extra_code_len; i += kThreads) s_code[code_len + i] = extra_code[i];
    return smem + header_bytes<T>(all_par, all_code);
}

// Where pair (g1, g2) lies in the sets: first global vertices, sizes, stored entries.
struct PairDims {
    int64_t v1, v2, e1, e2;
    int n1, n2, nnz1, nnz2;
};

template <typename T>
__device__ __forceinline__ PairDims pair_dims(const CsrSet<T>& s1, const CsrSet<T>& s2, int64_t g1, int64_t g2) {
    PairDims pd;
    pd.v1 = s1.node_off[g1];
    pd.v2 = s2.node_off[g2];
    pd.n1 = (int)(s1.node_off[g1 + 1] - pd.v1);
    pd.n2 = (int)(s2.node_off[g2 + 1] - pd.v2);
    pd.e1 = s1.rowptr[pd.v1];
    pd.e2 = s2.rowptr[pd.v2];
    pd.nnz1 = (int)(s1.rowptr[pd.v1 + pd.n1] - pd.e1);
    pd.nnz2 = (int)(s2.rowptr[pd.v2 + pd.n2] - pd.e2);
    return pd;
}

// The pair's layout in shared memory (graphkern/mgk/csr.py: pair_shared_bytes), S directions
// interleaved in p.  Cheap to recompute: callers form it where they need it, which keeps the
// pointers out of registers across the set-up loops.
template <typename T, int S>
__device__ __forceinline__ PairShared<T> pair_layout(unsigned char* pair_area, const PairDims& pd, int nf) {
    EntrySlot<T>* ent1 = reinterpret_cast<EntrySlot<T>*>(pair_area);
    EntrySlot<T>* ent2 = ent1 + pd.nnz1;
    T* p = reinterpret_cast<T*>(ent2 + pd.nnz2);
    T* feat1 = p + S * pd.n1 * pd.n2;
    T* feat2 = feat1 + (int64_t)pd.nnz1 * nf;
    int* rp1 = reinterpret_cast<int*>(feat2 + (int64_t)pd.nnz2 * nf);
    int* rp2 = rp1 + pd.n1 + 1;
    return PairShared<T>{ent1, ent2, p, feat1, feat2, rp1, rp2, pd.n1, pd.n2};
}

// Stages the pair's records, row pointers and (general form) edge features.  Starts with a
// barrier (the previous pair's readers are done); the caller's next barrier publishes them.
template <typename T, int FORM, int S>
__device__ __forceinline__ void stage_pair(const CsrSet<T>& s1, const CsrSet<T>& s2, const PairDims& pd, T ek_theta,
                                           int ek_slot, int nf, unsigned char* pair_area) {
    const PairShared<T> ps = pair_layout<T, S>(pair_area, pd, nf);
    EntrySlot<T>* ent1 = const_cast<EntrySlot<T>*>(ps.ent1);
    EntrySlot<T>* ent2 = const_cast<EntrySlot<T>*>(ps.ent2);
    T* feat1 = const_cast<T*>(ps.feat1);
    T* feat2 = const_cast<T*>(ps.feat2);
    int* rp1 = const_cast<int*>(ps.rp1);
    int* rp2 = const_cast<int*>(ps.rp2);
    const int64_t e1 = pd.e1, e2 = pd.e2;
    const int n2s = S * pd.n2;
    __syncthreads();
    for (int i = threadIdx.x; i <= pd.n1; i += kThreads) rp1[i] = (int)(s1.rowptr[pd.v1 + i] - e1);
    for (int i = threadIdx.x; i <= pd.n2; i += kThreads) rp2[i] = (int)(s2.rowptr[pd.v2 + i] - e2);
    for (int i = threadIdx.x; i < pd.nnz1; i += kThreads) {
        const T w = s1.weights[e1 + i];
        const T e = single_feature<FORM>() ? s1.edge_feat[(e1 + i) * s1.n_efeat + ek_slot] : T(0);
        store_entry(ent1 + i, w, e, ek_theta * w, s1.indices[e1 + i] * n2s);
    }
    for (int i = threadIdx.x; i < pd.nnz2; i += kThreads) {
        const T e = single_feature<FORM>() ? s2.edge_feat[(e2 + i) * s2.n_efeat + ek_slot] : T(0);
        store_entry(ent2 + i, s2.weights[e2 + i], e, T(0), s2.indices[e2 + i]);
    }
    if (FORM == EDGE_GENERAL) {
        for (int64_t i = threadIdx.x; i < (int64_t)pd.nnz1 * nf; i += kThreads) feat1[i] = s1.edge_feat[e1 * nf + i];
        for (int64_t i = threadIdx.x; i < (int64_t)pd.nnz2 * nf; i += kThreads) feat2[i] = s2.edge_feat[e2 * nf + i];
    }
}

// The CG operator of one pair (common/cg.cuh): thread t owns the outputs t, t + kThreads, ...
// of every vector; the block's barriers order the direction p in shared memory (the product's
// sums are the first barrier after a direction is written: every thread is done with p by the
// second sum of an iteration).
template <typename T, int FORM>
struct CsrOperator {
    const PairShared<T>& ps;
    const EdgeKernel<T>& ek;
    const Scratch<T>& sc;
    T* p;
    int N, nf;
    __device__ __forceinline__ double product() {
        double pAp[1] = {0.0};
        T* const Ap[1] = {sc.Ap};
        system_product<T, FORM, 1, 1>(ps, ek, sc.diag, p, Ap, nf, pAp);
        return pAp[0];
    }
    __device__ __forceinline__ void step(T alpha, double& rr, double& rz) {
        for (int L = threadIdx.x; L < N; L += kThreads) {
            const T di = sc.diag[L];
            sc.x[L] = sc.x[L] + alpha * p[L];
            const T ri = sc.r[L] - alpha * sc.Ap[L];
            sc.r[L] = ri;
            rr += (double)ri * ri;
            rz += (double)ri * (ri / di);
        }
    }
    __device__ __forceinline__ void new_direction(T beta) {
        for (int L = threadIdx.x; L < N; L += kThreads) p[L] = sc.r[L] / sc.diag[L] + beta * p[L];
        __syncthreads();  // the next product reads p across threads
    }
};

// diag = D / V (V floored), x0 = 0, r0 = b = D q^2 and its direction r0 / diag at p[S L] for this
// thread's outputs; with the adjoint (S = 2) also y0 = 0, r0 = 1 and its direction at p[2 L + 1].
// Adds this thread's shares of r^T z, ||b||^2 (and the adjoint's r^T z) to init.
template <typename T, int S, int K>
__device__ __forceinline__ void start_systems(const CsrSet<T>& s1, const CsrSet<T>& s2, int64_t v1, int64_t v2, int n2,
                                              int N, const int* ncode, const T* npar, T q, T* diag, T* x, T* r, T* y,
                                              T* ry, T* p, double (&init)[K]) {
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const int a = L / n2, b = L - a * n2;
        T d;
        const T m = system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b], s1.node_feat + (v1 + a) * s1.n_nfeat,
                                    s2.node_feat + (v2 + b) * s2.n_nfeat, ncode, npar, q, d);
        const T bi = d * q * q;
        const T zx = bi / m;
        diag[L] = m;
        x[L] = 0;
        r[L] = bi;
        p[S * L] = zx;
        init[0] += (double)bi * zx;
        init[1] += (double)bi * bi;
        if constexpr (S == 2) {
            const T zy = T(1) / m;
            y[L] = 0;
            ry[L] = 1;
            p[2 * L + 1] = zy;
            init[2] += (double)zy;
        }
    }
}

template <typename T, int FORM>
__device__ void csr_solve(const CsrSet<T> s1, const CsrSet<T> s2, const int64_t* __restrict__ pair_g1,
                          const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ code,
                          const T* __restrict__ params, int ncode_len, int nparam_len, int ecode_len, int eparam_len,
                          T ek_scale, T ek_theta, T ek_aux, int ek_slot, T q, T p2, double tol, int max_iter,
                          T* __restrict__ scratch, int64_t stride, double* __restrict__ k_out,
                          int32_t* __restrict__ it_out, double* __restrict__ res_out, T* __restrict__ nodal,
                          const int64_t* __restrict__ nodal_off) {
    extern __shared__ __align__(16) unsigned char smem[];
    double* red = reinterpret_cast<double*>(smem);
    T* s_par;
    int* s_code;
    // stage_programs' layout, copied here: its call costs this loop registers (the float general form spills)
    const int param_len = nparam_len + eparam_len, code_len = ncode_len + ecode_len;
    s_par = reinterpret_cast<T*>(smem + kReduceBytes);
    s_code = reinterpret_cast<int*>(smem + kReduceBytes + align16(param_len * (int)sizeof(T)));
    unsigned char* pair_area = smem + header_bytes<T>(param_len, code_len);
    for (int i = threadIdx.x; i < param_len; i += kThreads) s_par[i] = params[i];
    for (int i = threadIdx.x; i < code_len; i += kThreads) s_code[i] = code[i];
    const int* ncode = s_code;
    const T* npar = s_par;
    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, ek_slot, s_code + ncode_len, s_par + nparam_len};
    T* const work = scratch + (int64_t)blockIdx.x * kVectors * stride;
    const Scratch<T> sc{work, work + stride, work + 2 * stride, work + 3 * stride};
    const int nf = FORM == EDGE_GENERAL ? s1.n_efeat : 0;  // both sets have the same widths

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const int64_t g1 = pair_g1[k], g2 = pair_g2[k];
        const PairDims pd = pair_dims(s1, s2, g1, g2);
        stage_pair<T, FORM, 1>(s1, s2, pd, ek_theta, ek_slot, nf, pair_area);
        const int64_t v1 = pd.v1, v2 = pd.v2;
        const int n1 = pd.n1, n2 = pd.n2, N = n1 * n2;
        T* p = pair_layout<T, 1>(pair_area, pd, nf).p;

        // diag = D / V (V floored), x0 = 0, r0 = b = D q^2, p0 = r0 / diag: this thread's outputs
        double init[2] = {0.0, 0.0};  // r^T z, ||b||^2
        start_systems<T, 1>(s1, s2, v1, v2, n2, N, ncode, npar, q, sc.diag, sc.x, sc.r, nullptr, nullptr, p, init);
        gk::block_sum<kWarps, kMaxReduce>(init, red);  // its barriers also publish the staged records and p
        CGState cg{init[0], sqrt(init[1]), sqrt(init[1]), 0, true};
        const PairShared<T> ps = pair_layout<T, 1>(pair_area, pd, nf);
        CsrOperator<T, FORM> op{ps, ek, sc, p, N, nf};
        preconditioned_cg<T>(gk::BlockTeam<kWarps, kMaxReduce>{red}, op, cg, tol, max_iter);

        double total[1] = {0.0};
        for (int L = threadIdx.x; L < N; L += kThreads) total[0] += (double)sc.x[L];
        gk::block_sum<kWarps, kMaxReduce>(total, red);
        if (nodal != nullptr) {
            T* out = nodal + nodal_off[k];
            for (int L = threadIdx.x; L < N; L += kThreads) {
                const int a = L / n2, b = L - a * n2;
                out[(int64_t)s1.orig[v1 + a] * n2 + s2.orig[v2 + b]] = (T)((double)p2 * sc.x[L]);
            }
        }
        if (threadIdx.x == 0) {
            k_out[k] = (double)p2 * total[0];
            it_out[k] = cg.it;
            res_out[k] = cg.bnorm > 0 ? cg.rnorm / cg.bnorm : 0.0;
        }
    }
}

// y^T (A1 (x) A2 (.) E_c) x for this thread's outputs: x at p[S L] (the forward half when S = 2).
template <typename T, int CFORM, int S>
__device__ double contraction_share(const PairShared<T>& ps, const EdgeKernel<T>& ck, const T* __restrict__ y,
                                    int nf) {
    const int n2 = ps.n2;
    const int N = ps.n1 * n2;
    double sum = 0;
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const int a = L / n2, b = L - a * n2;
        T acc[1];
        entry_pair_sum<T, CFORM, 1, S>(ps, ck, nf, a, b, ps.p, acc);
        sum += (double)y[L] * (double)acc[0];
    }
    return sum;
}

// One CG system of a gradient's pair: its scalars and vectors (x, r, Ap in global scratch; the
// direction at p[S L + side]).
template <typename T>
struct CGSide : CGState {
    T* __restrict__ x;
    T* __restrict__ r;
    T* __restrict__ Ap;
    int side;
};

// The sequential gradient's adjoint start (S = 1, after the forward solve): y0 = alpha x, r0 =
// 1 - alpha (b - r_x), z0 = r0 / diag into p; returns whether the adjoint still has to run.  Its
// first reduction also tells every thread that the forward solve's last reads of p are done.
template <typename T>
__device__ bool adjoint_warm_start(const CsrSet<T>& s1, const CsrSet<T>& s2, int64_t v1, int64_t v2, int n2, int N,
                             const int* ncode, const T* npar, T q, double tol, const CGSide<T>& cx, CGSide<T>& cy,
                             T* p, const T* __restrict__ diag, double* red) {
    double w[2] = {0.0, 0.0};  // 1^T x and x^T (b - r_x) = x^T M x
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const int a = L / n2, b = L - a * n2;
        T d;
        system_diagonal(s1.degree[v1 + a], s2.degree[v2 + b], s1.node_feat + (v1 + a) * s1.n_nfeat,
                        s2.node_feat + (v2 + b) * s2.n_nfeat, ncode, npar, q, d);
        const T mx = d * q * q - cx.r[L];  // (M x)_L, kept in the adjoint's r
        cy.r[L] = mx;
        w[0] += (double)cx.x[L];
        w[1] += (double)cx.x[L] * mx;
    }
    gk::block_sum<kWarps, kMaxReduce>(w, red);
    const T alpha = w[1] > 0 ? (T)(w[0] / w[1]) : T(0);
    double rs[2] = {0.0, 0.0};  // r^T z and r^T r of the adjoint's start
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const T ri = T(1) - alpha * cy.r[L];
        const T zi = ri / diag[L];
        cy.x[L] = alpha * cx.x[L];
        cy.r[L] = ri;
        p[L] = zi;
        rs[0] += (double)ri * zi;
        rs[1] += (double)ri * ri;
    }
    gk::block_sum<kWarps, kMaxReduce>(rs, red);  // also publishes p
    cy.rz = rs[0];
    cy.bnorm = sqrt((double)N);
    cy.rnorm = sqrt(rs[1]);
    cy.it = 0;
    return cy.rnorm > tol * cy.bnorm && rs[0] > 0;
}

// The lockstep CG operator of a gradient's pair (common/cg.cuh): csr_solve's, for the directions
// of x and y interleaved in p (S = 2) or sharing it one after the other (S = 1).
template <typename T, int FORM, int S>
struct CsrLockstepOperator {
    const PairShared<T>& ps;
    const EdgeKernel<T>& ek;
    CGSide<T>&cx, &cy;
    T* p;
    const T* __restrict__ diag;
    int N, nf;
    // the adjoint's warm start (S = 1)
    const CsrSet<T>&s1, &s2;
    int64_t v1, v2;
    const int* ncode;
    const T* npar;
    T q;
    double tol;
    double* red;

    __device__ __forceinline__ void product(bool run_x, bool run_y, double (&pAp)[2]) {
        bool both = false;
        if constexpr (S == 2) {
            if (run_x && run_y) {
                T* const Ap[2] = {cx.Ap, cy.Ap};
                system_product<T, FORM, 2, S>(ps, ek, diag, p, Ap, nf, pAp);
                both = true;
            }
        }
        if (!both) {
            // one side runs on alone, gathering only its half of p (S = 2) or all of it
            const int side = run_x ? cx.side : cy.side;
            double one[1] = {0.0};
            T* const Ap[1] = {run_x ? cx.Ap : cy.Ap};
            system_product<T, FORM, 1, S>(ps, ek, diag, p + side, Ap, nf, one);
            pAp[0] = run_x ? one[0] : 0.0;
            pAp[1] = run_x ? 0.0 : one[0];
        }
    }
    __device__ __forceinline__ void step(int side, T alpha, double& rr, double& rz) {
        CGSide<T>& cg = side == 0 ? cx : cy;
        cg_update<S>(cg.x, cg.r, p + cg.side, cg.Ap, diag, alpha, (int)threadIdx.x, kThreads, N, rr, rz);
    }
    __device__ __forceinline__ void new_directions(bool run_x, bool run_y, T beta_x, T beta_y) {
        if (run_x || run_y) {
            for (int L = threadIdx.x; L < N; L += kThreads) {
                const T di = diag[L];
                if (run_x) p[S * L] = cx.r[L] / di + beta_x * p[S * L];
                if (run_y) p[S * L + cy.side] = cy.r[L] / di + beta_y * p[S * L + cy.side];
            }
        }
        __syncthreads();  // the next product reads p across threads
    }
    __device__ __forceinline__ bool warm_adjoint(CGState&) {
        return adjoint_warm_start<T>(s1, s2, v1, v2, ps.n2, N, ncode, npar, q, tol, cx, cy, p, diag, red);
    }
};

// S = 2: the two solves in lockstep (both directions interleaved in p).  S = 1: one after the
// other, sharing one direction array (the footprint of K): M x = b first, then M y = 1 from the
// warm start y0 = alpha x, alpha = 1^T x / x^T M x (the multiple of x closest to y in the M-norm;
// M x = b - r_x, so no XMV is needed), r0 = 1 - alpha (b - r_x).
template <typename T, int FORM, int S>
__device__ void csr_gradient(const CsrSet<T> s1, const CsrSet<T> s2, const int64_t* __restrict__ pair_g1,
                             const int64_t* __restrict__ pair_g2, int64_t n_pairs, const int* __restrict__ code,
                             const T* __restrict__ params, int ncode_len, int nparam_len, int ecode_len,
                             int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_slot, T q, T p2, double tol,
                             int max_iter, T* __restrict__ scratch, int64_t stride, GradientTerms<T> gt,
                             int ccode_len, int cpar_len, int n_raw, double* __restrict__ k_out,
                             int32_t* __restrict__ it_out, double* __restrict__ res_out,
                             int32_t* __restrict__ adj_it_out, double* __restrict__ adj_res_out,
                             double* __restrict__ grad_out) {
    extern __shared__ __align__(16) unsigned char smem[];
    double* red = reinterpret_cast<double*>(smem);
    const int code_len = ncode_len + ecode_len, param_len = nparam_len + eparam_len;
    T* s_par;
    int* s_code;
    unsigned char* pair_area = stage_programs<T>(smem, code, params, code_len, param_len, gt.ccode, gt.cpar,
                                                 ccode_len, cpar_len, s_code, s_par);
    gt.ccode = s_code + code_len;
    gt.cpar = s_par + param_len;
    const int* ncode = s_code;
    const T* npar = s_par;
    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, ek_slot, s_code + ncode_len, s_par + nparam_len};
    // x, r, Ap of the forward solve, then y, r, Ap of the adjoint, then the diagonal
    // (graphkern/mgk/csr.py: N_GRADIENT_VECTORS)
    T* const work = scratch + (int64_t)blockIdx.x * kGradientVectors * stride;
    T* __restrict__ diag = work + 6 * stride;
    const int nf = FORM == EDGE_GENERAL ? s1.n_efeat : 0;
    bool any_xmv = false;  // a contraction that gathers x (not free)
    for (int c = 0; c < gt.n_contractions; ++c) any_xmv = any_xmv || gt.cfree[c] == 0;

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const PairDims pd = pair_dims(s1, s2, pair_g1[k], pair_g2[k]);
        stage_pair<T, FORM, S>(s1, s2, pd, ek_theta, ek_slot, nf, pair_area);
        const int64_t v1 = pd.v1, v2 = pd.v2;
        const int n2 = pd.n2, N = pd.n1 * n2;
        T* p = pair_layout<T, S>(pair_area, pd, nf).p;
        CGSide<T> cx{{0.0, 0.0, 0.0, 0, true}, work, work + stride, work + 2 * stride, 0};
        CGSide<T> cy{{0.0, 0.0, 0.0, 0, S == 2}, work + 3 * stride, work + 4 * stride, work + 5 * stride, S - 1};

        // M x = b = D q^2 and M y = 1, both from 0, preconditioned by diag = D / V
        double init[3] = {0.0, 0.0, 0.0};  // r^T z of x, ||b||^2, r^T z of y
        start_systems<T, S>(s1, s2, v1, v2, n2, N, ncode, npar, q, diag, cx.x, cx.r, cy.x, cy.r, p, init);
        gk::block_sum<kWarps, kMaxReduce>(init, red);  // its barriers also publish the staged records and p
        cx.rz = init[0];
        cx.bnorm = cx.rnorm = sqrt(init[1]);
        cy.rz = init[2];
        cy.bnorm = cy.rnorm = sqrt((double)N);
        const PairShared<T> ps = pair_layout<T, S>(pair_area, pd, nf);

        CsrLockstepOperator<T, FORM, S> op{ps, ek, cx, cy, p, diag, N, nf, s1, s2, v1, v2, ncode, npar, q, tol, red};
        lockstep_cg<T>(gk::BlockTeam<kWarps, kMaxReduce>{red}, op, cx, cy, S == 2, tol, max_iter);

        const T* __restrict__ x = cx.x;
        const T* __restrict__ y = cy.x;
        double* grad = grad_out + k * n_raw;
        // K, dK/dq and the free contraction's y^T (D V^-1 x - b) in one pass.  q: D = (d1 + q)(d2 + q)
        // and b = D q^2, so dD/dq = d1 + d2 and db/dq = q^2 dD/dq + 2 q D.
        double sums[3] = {0.0, 0.0, 0.0};
        const double qd = (double)q;
        for (int L = threadIdx.x; L < N; L += kThreads) {
            const int a = L / n2, b = L - a * n2;
            const double d1 = (double)(s1.degree[v1 + a] + q), d2 = (double)(s2.degree[v2 + b] + q);
            const double d = d1 * d2, xi = x[L], yi = y[L], m = diag[L];
            sums[0] += xi;
            sums[1] += yi * ((qd * qd * (d1 + d2) + 2 * qd * d) - xi * (d1 + d2) * m / d);
            sums[2] += yi * (m * xi - d * qd * qd);
            if (any_xmv) p[S * L] = x[L];  // the contractions' XMVs gather x
        }
        gk::block_sum<kWarps, kMaxReduce>(sums, red);  // also publishes x in p
        if (threadIdx.x == 0) {
            k_out[k] = (double)p2 * sums[0];
            it_out[k] = cx.it;
            res_out[k] = cx.bnorm > 0 ? cx.rnorm / cx.bnorm : 0.0;
            adj_it_out[k] = cy.it;
            adj_res_out[k] = cy.bnorm > 0 ? cy.rnorm / cy.bnorm : 0.0;
            grad[gt.n_node] = (double)p2 * sums[1];
        }
        // vertex-kernel terms: dM/dtheta = -D V^-2 dV/dtheta (diag = D / V; a floored V has no derivative)
        for (int j = 0; j < gt.n_node; ++j) {
            const int* dcode = gt.ncode + gt.ncode_off[j];
            const T* dpar = gt.npar + gt.npar_off[j];
            double acc[1] = {0.0};
            for (int L = threadIdx.x; L < N; L += kThreads) {
                const int a = L / n2, b = L - a * n2;
                add_vertex_derivative(acc[0], s1.node_feat + (v1 + a) * s1.n_nfeat,
                                      s2.node_feat + (v2 + b) * s2.n_nfeat, ncode, npar, dcode, dpar, x[L], y[L],
                                      diag[L]);
            }
            gk::block_sum<kWarps, kMaxReduce>(acc, red);
            if (threadIdx.x == 0) grad[j] = (double)p2 * acc[0];
        }
        // edge-kernel terms: y^T (A1 (x) A2 (.) dE_c) x, free or by one XMV of x
        for (int c = 0; c < gt.n_contractions; ++c) {
            double acc[1] = {0.0};
            if (gt.cfree[c] != 0) {
                acc[0] = gt.cfree[c] * sums[2];
            } else {
                const EdgeKernel<T> ck{T(1), gt.ctheta[c], gt.caux[c], ek_slot, gt.ccode + gt.ccode_off[c],
                                       gt.cpar + gt.cpar_off[c]};
                if (gt.cform[c] == FORM) {
                    acc[0] = contraction_share<T, FORM, S>(ps, ck, y, nf);
                } else if constexpr (derivative_form<FORM>() != FORM) {
                    acc[0] = contraction_share<T, derivative_form<FORM>(), S>(ps, ck, y, nf);
                }
                gk::block_sum<kWarps, kMaxReduce>(acc, red);
            }
            if (threadIdx.x == 0) grad[gt.n_node + 1 + c] = (double)p2 * acc[0];
        }
    }
}

}  // namespace

// Entry points mgk_csr_<form>_<f32|f64> (graphkern/mgk/csr.py: CSRGPUEngine): the two graph sets,
// the job and the outputs, each a struct passed by value whose layout the module exports.
#define CSR_ENTRY(NAME, T, FORM)                                                                           \
    extern "C" __global__ void __launch_bounds__(kThreads, min_blocks_per_sm<T>())                        \
        NAME(__grid_constant__ const CsrSet<T> set1, __grid_constant__ const CsrSet<T> set2, __grid_constant__ const PairJob<T> job, __grid_constant__ const SolveOutputs<T> out) { \
        csr_solve<T, FORM>(set1, set2, MGK_JOB(job), out.k, out.iterations, out.residuals, out.nodal,          \
                           out.nodal_off);                                                                 \
    }

MGK_EVERY_FORM(CSR_ENTRY, mgk_csr)

// Gradient entry points mgk_csr_gradient_<form>_<f32|f64>: the same sets and job, the derivative
// programs and edge contractions (GradientTerms), the gradient outputs (graphkern/mgk/csr.py:
// CSRGPUEngine.solve_gradient).  At 3 blocks per SM (80 registers, sm_90) the float
// ones spill (two accumulators per output, the paired gather); at 2 (128 registers) the constant
// and Kronecker forms do not, general f32 and sqexp f64 spill ~24 bytes; a 96-vertex pair's
// ~81-110 KB of shared memory (both directions) allows only 2 blocks per SM anyway.
constexpr int kGradientMinBlocksPerSM = 2;
#define CSR_GRADIENT_ENTRY(NAME, T, FORM, S, MINB)                                                            \
    extern "C" __global__ void __launch_bounds__(kThreads, MINB) NAME(                                       \
        __grid_constant__ const CsrSet<T> set1, __grid_constant__ const CsrSet<T> set2, __grid_constant__ const PairJob<T> job, __grid_constant__ const GradientTerms<T> terms,          \
        __grid_constant__ const GradientOutputs out) {                                                                          \
        csr_gradient<T, FORM, S>(set1, set2, MGK_JOB(job), terms, terms.ccode_len, terms.cpar_len, terms.n_raw,  \
                                 MGK_GRADIENT_OUTPUTS(out));                                                 \
    }

// Lockstep (S = 2) entry points mgk_csr_gradient_<form>_<f32|f64>, and the sequential ones
// (S = 1) mgk_csr_gradient_seq_<form>_<f32|f64> with K's footprint: one direction in shared memory
// and K's blocks per SM (graphkern/mgk/csr.py: GRADIENT_SOLVES picks).
#define CSR_GRADIENT_ENTRIES(FORM_NAME, FORM)                                                                 \
    CSR_GRADIENT_ENTRY(mgk_csr_gradient_##FORM_NAME##_f32, float, FORM, 2, kGradientMinBlocksPerSM)           \
    CSR_GRADIENT_ENTRY(mgk_csr_gradient_##FORM_NAME##_f64, double, FORM, 2, kGradientMinBlocksPerSM)          \
    CSR_GRADIENT_ENTRY(mgk_csr_gradient_seq_##FORM_NAME##_f32, float, FORM, 1, min_blocks_per_sm<float>())    \
    CSR_GRADIENT_ENTRY(mgk_csr_gradient_seq_##FORM_NAME##_f64, double, FORM, 1, min_blocks_per_sm<double>())

CSR_GRADIENT_ENTRIES(general, EDGE_GENERAL)
CSR_GRADIENT_ENTRIES(constant, EDGE_CONSTANT)
CSR_GRADIENT_ENTRIES(kronecker, EDGE_KRONECKER)
CSR_GRADIENT_ENTRIES(sqexp, EDGE_SQEXP)

// header_bytes, pair_layout's records and the scratch vectors, for graphkern/mgk/csr.py
GRAPHKERN_EXPORTS = {
    {"threads", kThreads},
    {"reduce_bytes", kReduceBytes},
    {"entry_bytes_f32", sizeof(EntrySlot<float>)},
    {"entry_bytes_f64", sizeof(EntrySlot<double>)},
    {"vectors", kVectors},
    {"gradient_vectors", kGradientVectors},
    GK_STRUCT("set_f32", CsrSet<float>, CSR_SET_FIELDS)
    GK_STRUCT("set_f64", CsrSet<double>, CSR_SET_FIELDS)
    MGK_JOB_EXPORTS
    MGK_OUTPUT_EXPORTS
};
