// Vertex and edge kernels of the marginalized graph kernel, shared by its four solvers (mgk.cu,
// mgk_csr.cu, mgk_gemm.cu, mgk_tiled.cu): the numeric programs of graphkern.basekernels (a sum
// of products of base kernels over feature slots), the edge-kernel forms with shortcuts, the
// gradient's derivative programs and contractions, and the diagonal of the product system.
//
//   code   = [n_groups, per group: n_terms, per term: kind, slot, width]
//   params = [per group: weight, per term: theta, aux]
//
// An interpreter (rather than code generated per composition) lets any user composition run
// with no CUDA toolkit on the user's machine; the common edge kernels also have shortcuts
// (EDGE_*).  The terms keep their raw hyperparameter (theta) so that derivatives with respect
// to it can be evaluated from the same encoding: the derivative of a kernel by one term's
// hyperparameter is a program in which that term has a derivative kind (d/dh of the Kronecker
// delta: 1 where the labels differ; d/dl of the square exponential: exp(aux d^2) d^2 / l^3).
#pragma once

#include <cstdint>

namespace mgk {

enum : int {
    KIND_CONSTANT = 0,
    KIND_KRONECKER_DELTA = 1,
    KIND_SQUARE_EXPONENTIAL = 2,
    KIND_KRONECKER_DELTA_DERIVATIVE = 3,
    KIND_SQUARE_EXPONENTIAL_DERIVATIVE = 4
};

__device__ __forceinline__ float exp_of(float v) { return expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }

// The kernel value between feature rows a and b, whose consecutive features lie sa and sb
// elements apart (1 for the row-major vertex features, 64 for edge features inside an octile).
template <typename T>
__device__ __forceinline__ T eval_program(const int* __restrict__ code, const T* __restrict__ par, const T* a, int sa,
                          const T* b, int sb) {
    const int n_groups = code[0];
    int pos = 1, pp = 0;
    T total = 0;
    for (int g = 0; g < n_groups; ++g) {
        const int n_terms = code[pos++];
        T prod = par[pp++];
        for (int t = 0; t < n_terms; ++t) {
            const int kind = code[pos], slot = code[pos + 1], width = code[pos + 2];
            pos += 3;
            if (kind == KIND_CONSTANT) {
                prod = prod * par[pp];
            } else if (kind == KIND_KRONECKER_DELTA) {
                if (a[slot * sa] != b[slot * sb]) prod = prod * par[pp];
            } else if (kind == KIND_KRONECKER_DELTA_DERIVATIVE) {
                if (a[slot * sa] == b[slot * sb]) prod = T(0);
            } else {
                T d2 = 0;
                for (int c = 0; c < width; ++c) {
                    const T diff = a[(slot + c) * sa] - b[(slot + c) * sb];
                    d2 = d2 + diff * diff;
                }
                if (kind == KIND_SQUARE_EXPONENTIAL) {
                    prod = prod * exp_of(par[pp + 1] * d2);
                } else {
                    const T ell = par[pp];
                    prod = prod * (exp_of(par[pp + 1] * d2) * d2 / (ell * ell * ell));
                }
            }
            pp += 2;
        }
        total = total + prod;
    }
    return total;
}

// Edge-kernel forms (graphkern/_mgk_gradient.py: EDGE_FORMS; the first four are the forward
// solvers' entry points).  The derivative forms are d/dh of the Kronecker delta (1 where the
// labels differ) and d^2 exp(aux d^2), the square exponential's derivative by its length scale up
// to the factor 1 / length_scale^3 (applied by the host).
enum : int { EDGE_GENERAL = 0, EDGE_CONSTANT = 1, EDGE_KRONECKER = 2, EDGE_SQEXP = 3 };
enum : int { EDGE_KRONECKER_DERIVATIVE = 4, EDGE_SQEXP_DERIVATIVE = 5 };

// Forms that compare one scalar edge feature.
template <int FORM>
__host__ __device__ constexpr bool single_feature() {
    return FORM == EDGE_KRONECKER || FORM == EDGE_SQEXP || FORM == EDGE_KRONECKER_DERIVATIVE ||
           FORM == EDGE_SQEXP_DERIVATIVE;
}

// The form of the derivative of a shortcut edge kernel by its labeled term's hyperparameter
// (constant factors and general programs keep their form).
template <int FORM>
__host__ __device__ constexpr int derivative_form() {
    return FORM == EDGE_KRONECKER ? EDGE_KRONECKER_DERIVATIVE : (FORM == EDGE_SQEXP ? EDGE_SQEXP_DERIVATIVE : FORM);
}

// The edge kernel as a product reads it.
template <typename T>
struct EdgeKernel {
    T scale;          // the factor the shortcut forms take out of the sum (1 for the general form)
    T theta;          // KroneckerDelta: the value where the labels differ
    T aux;            // SquareExponential: -1 / (2 length_scale^2)
    int slot;         // where the shortcut forms find the compared feature: an edge-feature column
                      // (CSR records) or an octile plane (1 + column, the core solver)
    const int* code;  // the general form's program
    const T* par;
};

// The derivative programs and edge contractions of a gradient launch (graphkern/_mgk_gradient.py:
// GradientPlan): vertex-kernel derivative program j at ncode + ncode_off[j], npar + npar_off[j]
// (global memory); edge contraction c of form cform[c], its shortcut's theta and aux, its program
// (general form; the solvers stage it in shared memory) and cfree[c]: 0, or the factor that makes
// it cfree[c] y^T (D V^-1 x - b) (the free contraction: a diagonal sum, no XMV).
template <typename T>
struct GradientTerms {
    int n_node;
    const int* ncode;
    const T* npar;
    const int64_t *ncode_off, *npar_off;
    int n_contractions;
    const int* cform;
    const T *ctheta, *caux;
    const int* ccode;
    const T* cpar;
    const int64_t *ccode_off, *cpar_off;
    const double* cfree;
    int ccode_len, cpar_len;  // the contractions' programs, all of them (staged in shared memory)
    int n_raw;                // the raw gradient's width per pair
};
#define MGK_TERMS_FIELDS(X, N, S)                                                                          \
    X(N, S, n_node) X(N, S, ncode) X(N, S, npar) X(N, S, ncode_off) X(N, S, npar_off) X(N, S, n_contractions) \
    X(N, S, cform) X(N, S, ctheta) X(N, S, caux) X(N, S, ccode) X(N, S, cpar) X(N, S, ccode_off)            \
    X(N, S, cpar_off) X(N, S, cfree) X(N, S, ccode_len) X(N, S, cpar_len) X(N, S, n_raw)

// What a core, CSR or tiled launch solves after its two graph sets (graphkern/mgk/core.py:
// pair_job): the pairs in launch order, the vertex program then the edge program, the edge
// kernel's shortcut (EdgeKernel), the hyperparameters, and the scratch with `stride` values per
// CG vector.
template <typename T>
struct PairJob {
    const int64_t* pair_g1;
    const int64_t* pair_g2;
    int64_t n_pairs;
    const int* code;
    const T* params;
    int ncode_len, nparam_len, ecode_len, eparam_len;
    T ek_scale, ek_theta, ek_aux;
    int ek_slot;
    T q, p2;
    double tol;
    int max_iter;
    T* scratch;
    int64_t stride;
};
#define MGK_JOB_FIELDS(X, N, S)                                                                            \
    X(N, S, pair_g1) X(N, S, pair_g2) X(N, S, n_pairs) X(N, S, code) X(N, S, params) X(N, S, ncode_len)     \
    X(N, S, nparam_len) X(N, S, ecode_len) X(N, S, eparam_len) X(N, S, ek_scale) X(N, S, ek_theta)          \
    X(N, S, ek_aux) X(N, S, ek_slot) X(N, S, q) X(N, S, p2) X(N, S, tol) X(N, S, max_iter) X(N, S, scratch) \
    X(N, S, stride)
// A PairJob as the solvers' functions take it, field by field
#define MGK_JOB(j)                                                                                          \
    j.pair_g1, j.pair_g2, j.n_pairs, j.code, j.params, j.ncode_len, j.nparam_len, j.ecode_len, j.eparam_len, \
        j.ek_scale, j.ek_theta, j.ek_aux, j.ek_slot, j.q, j.p2, j.tol, j.max_iter, j.scratch, j.stride

// Where a solve writes, per pair in launch order: K, CG iterations, final residual norm, and (when
// nodal is not null) the pair's nodal block at nodal + nodal_off[k].
template <typename T>
struct SolveOutputs {
    double* k;
    int32_t* iterations;
    double* residuals;
    T* nodal;
    const int64_t* nodal_off;
};
#define MGK_SOLVE_OUTPUT_FIELDS(X, N, S) \
    X(N, S, k) X(N, S, iterations) X(N, S, residuals) X(N, S, nodal) X(N, S, nodal_off)

// ... and a gradient launch: K, both solves' iterations and residuals, n_raw derivatives per pair.
struct GradientOutputs {
    double* k;
    int32_t* iterations;
    double* residuals;
    int32_t* adjoint_iterations;
    double* adjoint_residuals;
    double* gradient;
};
#define MGK_GRADIENT_OUTPUT_FIELDS(X, N, S)                                                              \
    X(N, S, k) X(N, S, iterations) X(N, S, residuals) X(N, S, adjoint_iterations) X(N, S, adjoint_residuals) \
    X(N, S, gradient)
#define MGK_GRADIENT_OUTPUTS(o) o.k, o.iterations, o.residuals, o.adjoint_iterations, o.adjoint_residuals, o.gradient

// The struct layouts every MGK module's launches pack (graphkern._cuda.runtime.layout)
#define MGK_OUTPUT_EXPORTS                                                                     \
    GK_STRUCT("out_f32", mgk::SolveOutputs<float>, MGK_SOLVE_OUTPUT_FIELDS)                    \
    GK_STRUCT("out_f64", mgk::SolveOutputs<double>, MGK_SOLVE_OUTPUT_FIELDS)                   \
    GK_STRUCT("gradient_out", mgk::GradientOutputs, MGK_GRADIENT_OUTPUT_FIELDS)                \
    GK_STRUCT("terms_f32", mgk::GradientTerms<float>, MGK_TERMS_FIELDS)                        \
    GK_STRUCT("terms_f64", mgk::GradientTerms<double>, MGK_TERMS_FIELDS)
#define MGK_JOB_EXPORTS                                                    \
    GK_STRUCT("job_f32", mgk::PairJob<float>, MGK_JOB_FIELDS)              \
    GK_STRUCT("job_f64", mgk::PairJob<double>, MGK_JOB_FIELDS)

// <prefix>_<form>_<f32|f64> for every edge-kernel form and both precisions
#define MGK_EVERY_FORM(ENTRY, PREFIX)                          \
    ENTRY(PREFIX##_general_f32, float, EDGE_GENERAL)           \
    ENTRY(PREFIX##_constant_f32, float, EDGE_CONSTANT)         \
    ENTRY(PREFIX##_kronecker_f32, float, EDGE_KRONECKER)       \
    ENTRY(PREFIX##_sqexp_f32, float, EDGE_SQEXP)               \
    ENTRY(PREFIX##_general_f64, double, EDGE_GENERAL)          \
    ENTRY(PREFIX##_constant_f64, double, EDGE_CONSTANT)        \
    ENTRY(PREFIX##_kronecker_f64, double, EDGE_KRONECKER)      \
    ENTRY(PREFIX##_sqexp_f64, double, EDGE_SQEXP)

// Vertex-kernel values that underflow would make the diagonal D / V infinite (same floor as the CPU).
constexpr double kVertexKernelFloor = 1e-20;

// The product system's diagonal D / V at a vertex pair, and D = (deg1 + q)(deg2 + q) (V floored).
template <typename T>
__device__ __forceinline__ T system_diagonal(T degree1, T degree2, const T* feat1, const T* feat2, const int* ncode,
                                             const T* npar, T q, T& d) {
    d = (degree1 + q) * (degree2 + q);
    T v = eval_program(ncode, npar, feat1, 1, feat2, 1);
    const T floor_v = T(kVertexKernelFloor);
    if (v < floor_v) v = floor_v;
    return d / v;
}

// Adds y x D V^-2 dV/dtheta, a vertex-kernel derivative program's term at one vertex pair with
// solutions x, y and diag = D / V, to acc; nothing where V is floored (no derivative there).  The
// sum is formed in acc (not returned) so that its last product and add fuse as in a plain loop.
template <typename T>
__device__ __forceinline__ void add_vertex_derivative(double& acc, const T* feat1, const T* feat2, const int* ncode,
                                                      const T* npar, const int* dcode, const T* dpar, T x, T y,
                                                      T diag) {
    const T v = eval_program(ncode, npar, feat1, 1, feat2, 1);
    if (v < T(kVertexKernelFloor)) return;
    const T dv = eval_program(dcode, dpar, feat1, 1, feat2, 1);
    acc += (double)y * x * ((double)diag / v) * dv;
}

}  // namespace mgk
