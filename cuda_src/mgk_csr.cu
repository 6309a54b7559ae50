// Marginalized graph kernel on the GPU for sparse graphs: one thread block per pair, the XMV as
// a sum over pairs of stored entries (CSR x CSR) instead of dense 8x8 octile products.
//
// The linear system, the preconditioner, the stopping rule and the outputs are those of the core
// solver (cuda_src/mgk.cu): M = D / V - A1 (x) A2 (.) E, b = D q^2, x0 = 0, diagonally
// preconditioned CG with the scalars accumulated in double, K = p^2 sum(x).
//
// Data (graphkern/_mgk_csr.py builds it): every graph's vertices renumbered by decreasing
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
// here (graphkern/_mgk_csr.py routes them to the core solver).
#include <cstdint>

#include "mgk_program.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;               // graphkern/_mgk_csr.py: THREADS_PER_BLOCK
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxReduce = 2;               // values summed by one block reduction at most
constexpr int kReduceBytes = kWarps * kMaxReduce * 8;  // graphkern/_mgk_csr.py: REDUCE_BYTES
constexpr unsigned kFullMask = 0xffffffffu;
constexpr double kVertexKernelFloor = 1e-20;  // as cuda_src/mgk.cu and the CPU solver

// Edge-kernel forms (graphkern/mgk.py: _EDGE_FORM_CODES)
enum : int { EDGE_GENERAL = 0, EDGE_CONSTANT = 1, EDGE_KRONECKER = 2, EDGE_SQEXP = 3 };

// ptxas -v (sm_90): at 3 blocks per SM (80 registers) the float entry points do not spill and a
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

// One graph set of a launch (graphkern/_mgk_csr.py: CSRData, in the renumbered vertices).
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

// The edge kernel as the XMV needs it.
template <typename T>
struct EdgeKernel {
    T scale;  // the factor the shortcut forms take out of the sum (1 for the general form)
    T theta;  // Kronecker: the value where labels differ
    T aux;    // square exponential: -1 / (2 l^2)
    int slot; // the edge feature the shortcut forms compare
    const int* code;  // the general form's program (shared memory)
    const T* par;
};

template <typename T>
struct Scratch {
    T* __restrict__ x;
    T* __restrict__ r;
    T* __restrict__ Ap;
    T* __restrict__ diag;
};

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

// E(e1, e2) w1 for G1's record g and G2's record f (k1, k2: their entries, for the general
// form's feature rows f1 + k1 * nf, f2 + k2 * nf).
template <typename T, int FORM>
__device__ __forceinline__ T weighted_edge(const CsrEntry<T>& g, const CsrEntry<T>& f, const EdgeKernel<T>& ek,
                                           const T* f1, const T* f2, int nf, int k1, int k2) {
    if (FORM == EDGE_CONSTANT) return g.w;
    if (FORM == EDGE_KRONECKER) return g.e == f.e ? g.w : g.tw;
    if (FORM == EDGE_SQEXP) {
        const T diff = g.e - f.e;
        return g.w * mgk::exp_of(ek.aux * diff * diff);
    }
    return g.w * mgk::eval_program(ek.code, ek.par, f1 + (int64_t)k1 * nf, 1, f2 + (int64_t)k2 * nf, 1);
}

// One pair's staged data in shared memory.
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

// Ap = diag p - scale (A1 (x) A2 (.) E) p for this thread's outputs; returns its share of p^T Ap.
template <typename T, int FORM>
__device__ double system_product(const PairShared<T>& ps, const EdgeKernel<T>& ek, const Scratch<T>& sc, int nf) {
    const int n2 = ps.n2;
    const int N = ps.n1 * n2;
    double pAp = 0;
    for (int L = threadIdx.x; L < N; L += kThreads) {
        const int a = L / n2, b = L - a * n2;
        const int k1_begin = ps.rp1[a], k1_end = ps.rp1[a + 1];
        const int k2_end = ps.rp2[b + 1];
        T acc = 0;
        for (int k2 = ps.rp2[b]; k2 < k2_end; ++k2) {
            const CsrEntry<T> f = load_entry(ps.ent2 + k2);
            const T* __restrict__ pcol = ps.p + f.col;
            T s = 0;
#pragma unroll 4
            for (int k1 = k1_begin; k1 < k1_end; ++k1) {
                const CsrEntry<T> g = load_entry(ps.ent1 + k1);
                s += weighted_edge<T, FORM>(g, f, ek, ps.feat1, ps.feat2, nf, k1, k2) * pcol[g.col];
            }
            acc += f.w * s;
        }
        const T pL = ps.p[L];
        const T ap = sc.diag[L] * pL - ek.scale * acc;
        sc.Ap[L] = ap;
        pAp += (double)pL * ap;
    }
    return pAp;
}

// Bytes of the block's fixed part: the reduction slots, then the programs' parameters and code.
template <typename T>
__device__ __forceinline__ int header_bytes(int param_len, int code_len) {
    return kReduceBytes + align16(param_len * (int)sizeof(T)) + align16(code_len * 4);
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
    const int param_len = nparam_len + eparam_len, code_len = ncode_len + ecode_len;
    T* s_par = reinterpret_cast<T*>(smem + kReduceBytes);
    int* s_code = reinterpret_cast<int*>(smem + kReduceBytes + align16(param_len * (int)sizeof(T)));
    unsigned char* pair_area = smem + header_bytes<T>(param_len, code_len);
    for (int i = threadIdx.x; i < param_len; i += kThreads) s_par[i] = params[i];
    for (int i = threadIdx.x; i < code_len; i += kThreads) s_code[i] = code[i];
    const int* ncode = s_code;
    const T* npar = s_par;
    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, ek_slot, s_code + ncode_len, s_par + nparam_len};
    const Scratch<T> sc{scratch + (int64_t)blockIdx.x * 4 * stride, scratch + ((int64_t)blockIdx.x * 4 + 1) * stride,
                        scratch + ((int64_t)blockIdx.x * 4 + 2) * stride,
                        scratch + ((int64_t)blockIdx.x * 4 + 3) * stride};
    const int nf = FORM == EDGE_GENERAL ? s1.n_efeat : 0;  // both sets have the same widths

    for (int64_t k = blockIdx.x; k < n_pairs; k += gridDim.x) {
        const int64_t g1 = pair_g1[k], g2 = pair_g2[k];
        const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
        const int n1 = (int)(s1.node_off[g1 + 1] - v1), n2 = (int)(s2.node_off[g2 + 1] - v2);
        const int64_t e1 = s1.rowptr[v1], e2 = s2.rowptr[v2];
        const int nnz1 = (int)(s1.rowptr[v1 + n1] - e1), nnz2 = (int)(s2.rowptr[v2 + n2] - e2);
        const int N = n1 * n2;

        // the pair's layout (graphkern/_mgk_csr.py: pair_shared_bytes)
        EntrySlot<T>* ent1 = reinterpret_cast<EntrySlot<T>*>(pair_area);
        EntrySlot<T>* ent2 = ent1 + nnz1;
        T* p = reinterpret_cast<T*>(ent2 + nnz2);
        T* feat1 = p + N;
        T* feat2 = feat1 + (int64_t)nnz1 * nf;
        int* rp1 = reinterpret_cast<int*>(feat2 + (int64_t)nnz2 * nf);
        int* rp2 = rp1 + n1 + 1;

        __syncthreads();  // the programs are staged; the previous pair's readers are done
        for (int i = threadIdx.x; i <= n1; i += kThreads) rp1[i] = (int)(s1.rowptr[v1 + i] - e1);
        for (int i = threadIdx.x; i <= n2; i += kThreads) rp2[i] = (int)(s2.rowptr[v2 + i] - e2);
        for (int i = threadIdx.x; i < nnz1; i += kThreads) {
            const T w = s1.weights[e1 + i];
            const T e = FORM == EDGE_KRONECKER || FORM == EDGE_SQEXP ? s1.edge_feat[(e1 + i) * s1.n_efeat + ek_slot]
                                                                    : T(0);
            store_entry(ent1 + i, w, e, ek_theta * w, s1.indices[e1 + i] * n2);
        }
        for (int i = threadIdx.x; i < nnz2; i += kThreads) {
            const T e = FORM == EDGE_KRONECKER || FORM == EDGE_SQEXP ? s2.edge_feat[(e2 + i) * s2.n_efeat + ek_slot]
                                                                    : T(0);
            store_entry(ent2 + i, s2.weights[e2 + i], e, T(0), s2.indices[e2 + i]);
        }
        if (FORM == EDGE_GENERAL) {
            for (int64_t i = threadIdx.x; i < (int64_t)nnz1 * nf; i += kThreads) feat1[i] = s1.edge_feat[e1 * nf + i];
            for (int64_t i = threadIdx.x; i < (int64_t)nnz2 * nf; i += kThreads) feat2[i] = s2.edge_feat[e2 * nf + i];
        }

        // diag = D / V (V floored), x0 = 0, r0 = b = D q^2, p0 = r0 / diag: this thread's outputs
        double init[2] = {0.0, 0.0};  // r^T z, ||b||^2
        const T floor_v = T(kVertexKernelFloor);
        for (int L = threadIdx.x; L < N; L += kThreads) {
            const int a = L / n2, b = L - a * n2;
            const T d = (s1.degree[v1 + a] + q) * (s2.degree[v2 + b] + q);
            T v = mgk::eval_program(ncode, npar, s1.node_feat + (v1 + a) * s1.n_nfeat, 1,
                                    s2.node_feat + (v2 + b) * s2.n_nfeat, 1);
            if (v < floor_v) v = floor_v;
            const T m = d / v;
            const T bi = d * q * q;
            const T z = bi / m;
            sc.diag[L] = m;
            sc.x[L] = 0;
            sc.r[L] = bi;
            p[L] = z;
            init[0] += (double)bi * z;
            init[1] += (double)bi * bi;
        }
        block_sum(init, red);  // its barriers also publish the staged records and p
        double rz = init[0];
        const double bnorm = sqrt(init[1]);
        double rnorm = bnorm;
        int it = 0;
        const PairShared<T> ps{ent1, ent2, p, feat1, feat2, rp1, rp2, n1, n2};

        while (it < max_iter) {
            double pAp[1] = {system_product<T, FORM>(ps, ek, sc, nf)};
            block_sum(pAp, red);
            if (!(pAp[0] > 0)) break;  // an exactly zero residual (M is positive definite)
            const T alpha = (T)(rz / pAp[0]);
            double upd[2] = {0.0, 0.0};  // ||r||^2, r^T z
            for (int L = threadIdx.x; L < N; L += kThreads) {
                const T di = sc.diag[L];
                sc.x[L] = sc.x[L] + alpha * p[L];
                const T ri = sc.r[L] - alpha * sc.Ap[L];
                sc.r[L] = ri;
                upd[0] += (double)ri * ri;
                upd[1] += (double)ri * (ri / di);
            }
            block_sum(upd, red);  // also: every thread is done reading p in the product
            ++it;
            rnorm = sqrt(upd[0]);
            if (rnorm <= tol * bnorm) break;
            const T beta = (T)(upd[1] / rz);
            rz = upd[1];
            for (int L = threadIdx.x; L < N; L += kThreads) p[L] = sc.r[L] / sc.diag[L] + beta * p[L];
            __syncthreads();  // the next product reads p across threads
        }

        double total[1] = {0.0};
        for (int L = threadIdx.x; L < N; L += kThreads) total[0] += (double)sc.x[L];
        block_sum(total, red);
        if (nodal != nullptr) {
            T* out = nodal + nodal_off[k];
            for (int L = threadIdx.x; L < N; L += kThreads) {
                const int a = L / n2, b = L - a * n2;
                out[(int64_t)s1.orig[v1 + a] * n2 + s2.orig[v2 + b]] = (T)((double)p2 * sc.x[L]);
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

#define CSR_SET_ARGS(T, S)                                                                                  \
    const int64_t *node_off##S, const int64_t *rowptr##S, const int32_t *indices##S, const T *weights##S,     \
        const T *edge_feat##S, const T *degree##S, const T *node_feat##S, const int32_t *orig##S, int n_efeat##S, \
        int n_nfeat##S
#define CSR_SET(T, S)                                                                                       \
    CsrSet<T> {                                                                                             \
        node_off##S, rowptr##S, indices##S, weights##S, edge_feat##S, degree##S, node_feat##S, orig##S, n_efeat##S, \
            n_nfeat##S                                                                                      \
    }

// Entry points mgk_csr_<form>_<f32|f64> (graphkern/_mgk_csr.py: CSRGPUEngine).
#define CSR_ENTRY(NAME, T, FORM)                                                                           \
    extern "C" __global__ void __launch_bounds__(kThreads, min_blocks_per_sm<T>())                        \
        NAME(CSR_SET_ARGS(T, 1), CSR_SET_ARGS(T, 2), const int64_t* pair_g1, const int64_t* pair_g2,        \
             int64_t n_pairs, const int* code, const T* params, int ncode_len, int nparam_len, int ecode_len, \
             int eparam_len, T ek_scale, T ek_theta, T ek_aux, int ek_slot, T q, T p2, double tol,          \
             int max_iter, T* scratch, int64_t stride, double* k_out, int32_t* it_out, double* res_out,     \
             T* nodal, const int64_t* nodal_off) {                                                         \
        csr_solve<T, FORM>(CSR_SET(T, 1), CSR_SET(T, 2), pair_g1, pair_g2, n_pairs, code, params, ncode_len, \
                           nparam_len, ecode_len, eparam_len, ek_scale, ek_theta, ek_aux, ek_slot, q, p2, tol, \
                           max_iter, scratch, stride, k_out, it_out, res_out, nodal, nodal_off);           \
    }

CSR_ENTRY(mgk_csr_general_f32, float, EDGE_GENERAL)
CSR_ENTRY(mgk_csr_constant_f32, float, EDGE_CONSTANT)
CSR_ENTRY(mgk_csr_kronecker_f32, float, EDGE_KRONECKER)
CSR_ENTRY(mgk_csr_sqexp_f32, float, EDGE_SQEXP)
CSR_ENTRY(mgk_csr_general_f64, double, EDGE_GENERAL)
CSR_ENTRY(mgk_csr_constant_f64, double, EDGE_CONSTANT)
CSR_ENTRY(mgk_csr_kronecker_f64, double, EDGE_KRONECKER)
CSR_ENTRY(mgk_csr_sqexp_f64, double, EDGE_SQEXP)
