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

#include "mgk_program.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kOctile = 8;
constexpr int kOctileSize = 64;
constexpr int kWarpsPerBlock = 4;  // graphkern/_mgk_gpu.py launches 128 threads and sizes shared memory for 4 warps
// ptxas -v (sm_90): 136-168 registers and no spills with 3 resident blocks (12 warps) per SM;
// asking for 4 or more blocks spills inside the XMV.
constexpr int kMinBlocksPerSM = 3;
// The gradient's paired XMV keeps two slices' sums and, in double, the octile row in registers:
// at 3 blocks/SM its f64 shortcut forms spill (ptxas -v), so f64 gradients ask for 2.
template <typename T>
constexpr int gradient_min_blocks() {
    return sizeof(T) == 8 ? 2 : kMinBlocksPerSM;
}
constexpr int kMaxParams = 96;     // params per program (graphkern.basekernels.MAX_TERMS = 24 terms fit)
constexpr unsigned kFullMask = 0xffffffffu;

// Edge-kernel forms (graphkern/_mgk_gradient.py: EDGE_FORMS).  The derivative forms are d/dh of
// the Kronecker delta (1 where the labels differ) and d^2 exp(aux d^2), the square exponential's
// derivative by its length scale up to the factor 1 / length_scale^3 (applied by the host).
enum : int {
    EDGE_GENERAL = 0,
    EDGE_CONSTANT = 1,
    EDGE_KRONECKER = 2,
    EDGE_SQEXP = 3,
    EDGE_KRONECKER_DERIVATIVE = 4,
    EDGE_SQEXP_DERIVATIVE = 5
};
// The adjoint's y, r, p, Ap: gradient launches only (graphkern/_mgk_gpu.py: N_GRADIENT_VECTORS)
enum : int { VEC_X = 0, VEC_R = 1, VEC_P = 2, VEC_AP = 3, VEC_DIAG = 4, N_VECTORS = 5 };
enum : int { VEC_Y = 5, VEC_RY = 6, VEC_PY = 7, VEC_APY = 8, N_GRADIENT_VECTORS = 9 };

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

// Forms that compare one scalar edge feature (staged as plane 1 of an octile).
template <int FORM>
__host__ __device__ constexpr bool single_feature() {
    return FORM == EDGE_KRONECKER || FORM == EDGE_SQEXP || FORM == EDGE_KRONECKER_DERIVATIVE ||
           FORM == EDGE_SQEXP_DERIVATIVE;
}

// The form of the derivative of a shortcut edge kernel by its labeled term's hyperparameter
// (Constant factors and general programs keep their form).
template <int FORM>
__host__ __device__ constexpr int derivative_form() {
    return FORM == EDGE_KRONECKER ? EDGE_KRONECKER_DERIVATIVE : (FORM == EDGE_SQEXP ? EDGE_SQEXP_DERIVATIVE : FORM);
}

// The edge kernel as the XMV reads it: the shortcut's parameters, the feature plane it compares
// (1 + slot), and the program the general form interprets.
template <typename T>
struct EdgeKernel {
    T theta;
    T aux;
    int channel;
    const int* code;
    const T* par;
};

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

template <typename T, int FORM>
__device__ __forceinline__ T edge_shortcut(T e1, T e2, T ek_theta, T ek_aux) {
    if (FORM == EDGE_KRONECKER) return e1 == e2 ? T(1) : ek_theta;
    if (FORM == EDGE_KRONECKER_DERIVATIVE) return e1 == e2 ? T(0) : T(1);
    const T diff = e1 - e2;
    if (FORM == EDGE_SQEXP_DERIVATIVE) return diff * diff * mgk::exp_of(ek_aux * diff * diff);
    return mgk::exp_of(ek_aux * diff * diff);
}

// su[r] / sl[r] += the edge kernel (ku / kl for rows u / l) times w2 times the staged x_r at column
// (c, d) (xs points at slice 0's element; the slices are 64 apart).
template <typename T, int NRHS>
__device__ __forceinline__ void add_edge(T ku, T kl, T w2, const T* __restrict__ xs, T (&su)[NRHS], T (&sl)[NRHS]) {
#pragma unroll
    for (int r = 0; r < NRHS; ++r) {
        const T s = w2 * xs[r * kOctileSize];
        su[r] += ku * s;
        sl[r] += kl * s;
    }
}

template <typename T, int NRHS>
__device__ __forceinline__ void add_rows(T w1u, T w1l, const T (&su)[NRHS], const T (&sl)[NRHS], T (&acc_u)[NRHS],
                                         T (&acc_l)[NRHS]) {
#pragma unroll
    for (int r = 0; r < NRHS; ++r) {
        acc_u[r] += w1u * su[r];
        acc_l[r] += w1l * sl[r];
    }
}

// acc_u[r]/acc_l[r] += rows a and a + 4 (against column b) of (W1 (x) W2 (.) E) applied to slice r
// of xs (NRHS slices of 64, one per vector: the edge kernel is evaluated once for all of them).
template <typename T, int FORM, int NRHS>
__device__ __forceinline__ void octile_product(const T* __restrict__ t1, const T* __restrict__ t2,
                                               const T* __restrict__ xs, int a, int b, T (&acc_u)[NRHS],
                                               T (&acc_l)[NRHS], T ek_theta, T ek_aux, const int* ecode,
                                               const T* epar) {
    if (FORM == EDGE_CONSTANT) {
        T w2[kOctile];
#pragma unroll
        for (int d = 0; d < kOctile; ++d) w2[d] = t2[b * kOctile + d];
#pragma unroll 1  // unrolling the columns too costs registers (spills at 4 blocks/SM)
        for (int c = 0; c < kOctile; ++c) {
            const T w1u = t1[a * kOctile + c], w1l = t1[(a + 4) * kOctile + c];
            T s[NRHS] = {};
#pragma unroll
            for (int r = 0; r < NRHS; ++r) {
#pragma unroll
                for (int d = 0; d < kOctile; ++d) s[r] += w2[d] * xs[r * kOctileSize + c * kOctile + d];
            }
            add_rows(w1u, w1l, s, s, acc_u, acc_l);
        }
    } else if (single_feature<FORM>()) {
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
            T su[NRHS] = {}, sl[NRHS] = {};
#pragma unroll
            for (int d = 0; d < kOctile; ++d) {
                add_edge(edge_shortcut<T, FORM>(e1u, e2[d], ek_theta, ek_aux),
                         edge_shortcut<T, FORM>(e1l, e2[d], ek_theta, ek_aux), w2[d], xs + c * kOctile + d, su, sl);
            }
            add_rows(w1u, w1l, su, sl, acc_u, acc_l);
        }
    } else {
        for (int c = 0; c < kOctile; ++c) {
            const int iu = a * kOctile + c, il = (a + 4) * kOctile + c;
            T su[NRHS] = {}, sl[NRHS] = {};
            for (int d = 0; d < kOctile; ++d) {
                const int j = b * kOctile + d;
                add_edge(mgk::eval_program(ecode, epar, t1 + kOctileSize + iu, kOctileSize, t2 + kOctileSize + j,
                                           kOctileSize),
                         mgk::eval_program(ecode, epar, t1 + kOctileSize + il, kOctileSize, t2 + kOctileSize + j,
                                           kOctileSize),
                         t2[j], xs + c * kOctile + d, su, sl);
            }
            add_rows(t1[iu], t1[il], su, sl, acc_u, acc_l);
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
                stage_octile<T, FORM>(pt.s_t1, s1.tile_val + t1 * val_stride1, s1.channels, ek.channel, lane);
                for (int t2 = t2_begin; t2 < t2_end; ++t2) {
                    const int J2 = s2.tile_col[t2];
                    __syncwarp();  // ... and of the previous octile of G2 and slices of the vectors
                    stage_octile<T, FORM>(pt.s_t2, s2.tile_val + t2 * val_stride2, s2.channels, ek.channel, lane);
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

// One CG system: its vectors and scalars (rz = r^T z, the norms, the iterations done).
template <typename T>
struct CGSystem {
    T* __restrict__ x;
    T* __restrict__ r;
    T* __restrict__ p;
    T* __restrict__ Ap;
    double rz;
    double bnorm;
    double rnorm;
    int it;
};

// The rest of a CG iteration once Ap = M p is known (Ap written by other lanes: the caller
// synchronizes the warp first).  Returns false when the system has converged (or has an exactly
// zero residual, the only way to get pAp <= 0 here); then x is final and p untouched.
template <typename T>
__device__ bool cg_update(CGSystem<T>& cg, const T* __restrict__ diag, int64_t N, double tol, int lane) {
    double pAp = 0;
    for (int64_t i = lane; i < N; i += kWarp) pAp += (double)cg.p[i] * cg.Ap[i];
    pAp = warp_sum(pAp);
    if (!(pAp > 0)) return false;
    const double alpha = cg.rz / pAp;
    const T a = (T)alpha;
    double rr = 0, rzn = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        cg.x[i] = cg.x[i] + a * cg.p[i];
        const T ri = cg.r[i] - a * cg.Ap[i];
        cg.r[i] = ri;
        rr += (double)ri * ri;
        rzn += (double)ri * (ri / diag[i]);
    }
    rr = warp_sum(rr);
    rzn = warp_sum(rzn);
    ++cg.it;
    cg.rnorm = sqrt(rr);
    if (cg.rnorm <= tol * cg.bnorm) return false;
    const T beta = (T)(rzn / cg.rz);
    cg.rz = rzn;
    for (int64_t i = lane; i < N; i += kWarp) cg.p[i] = cg.r[i] / diag[i] + beta * cg.p[i];
    return true;
}

// CG iterations on M x = b from the state the caller set up: x, the residual r, the direction
// p = r / diag, rz = r^T p, bnorm = ||b|| and rnorm = bnorm.
template <typename T, int FORM>
__device__ void conjugate_gradient(const GraphSet<T>& s1, const GraphSet<T>& s2, const PairTiles<T>& pt,
                                   const EdgeKernel<T>& ek, T ek_scale, CGSystem<T>& cg, const T* __restrict__ diag,
                                   double tol, int max_iter, int lane) {
    const int64_t N = (int64_t)pt.n1 * pt.n2;
    __syncwarp();
    while (cg.it < max_iter) {
        SystemProduct<T> product{cg.p, diag, cg.Ap, ek_scale};
        xmv<T, FORM, 1>(s1, s2, pt, cg.p, nullptr, product, ek, lane);
        __syncwarp();  // Ap was written by the lanes owning each output block
        if (!cg_update(cg, diag, N, tol, lane)) break;
        __syncwarp();  // the next XMV reads p across lanes
    }
}

// Two CG systems with the same matrix in lockstep: while both run, one XMV serves both.
template <typename T, int FORM>
__device__ void paired_conjugate_gradient(const GraphSet<T>& s1, const GraphSet<T>& s2, const PairTiles<T>& pt,
                                          const EdgeKernel<T>& ek, T ek_scale, CGSystem<T>& cx, CGSystem<T>& cy,
                                          const T* __restrict__ diag, double tol, int max_iter, int lane) {
    const int64_t N = (int64_t)pt.n1 * pt.n2;
    bool run_x = true, run_y = true;
    __syncwarp();
    while (true) {
        run_x = run_x && cx.it < max_iter;
        run_y = run_y && cy.it < max_iter;
        if (run_x && run_y) {
            PairedSystemProduct<T> product{cx.p, cy.p, diag, cx.Ap, cy.Ap, ek_scale};
            xmv<T, FORM, 2>(s1, s2, pt, cx.p, cy.p, product, ek, lane);
        } else if (run_x || run_y) {
            T* p = run_x ? cx.p : cy.p;
            SystemProduct<T> product{p, diag, run_x ? cx.Ap : cy.Ap, ek_scale};
            xmv<T, FORM, 1>(s1, s2, pt, p, nullptr, product, ek, lane);
        } else {
            break;
        }
        __syncwarp();  // Ap was written by the lanes owning each output block
        if (run_x) run_x = cg_update(cx, diag, N, tol, lane);
        if (run_y) run_y = cg_update(cy, diag, N, tol, lane);
        __syncwarp();  // the next XMV reads p across lanes
    }
}

// diag_i = D_i / V_i of the pair's system at vertex pair (i1, i2), and D_i (V floored as on the CPU).
template <typename T>
__device__ __forceinline__ T system_diagonal(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t v1, int64_t v2,
                                             int i1, int i2, const int* ncode, const T* npar, T q, T& d) {
    d = (s1.degree[v1 + i1] + q) * (s2.degree[v2 + i2] + q);
    T v = mgk::eval_program(ncode, npar, s1.node_feat + (v1 + i1) * s1.n_feat, 1, s2.node_feat + (v2 + i2) * s2.n_feat,
                            1);
    const T floor_v = T(kVertexKernelFloor);
    if (v < floor_v) v = floor_v;
    return d / v;
}

// The pair's system (diag = D / V, x0 = 0, r0 = b = D q_x, z0 = p0 = r0 / diag) and the CG on it;
// returns sum(x) with x left in the work vectors, writes the iterations and relative residual.
template <typename T, int FORM>
__device__ double solve_forward(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t v1, int64_t v2,
                                const PairTiles<T>& pt, const int* ncode, const T* npar, const EdgeKernel<T>& ek,
                                T ek_scale, T q, double tol, int max_iter, T* __restrict__ work, int64_t stride,
                                int lane, int32_t* it_out, double* res_out) {
    CGSystem<T> cg{work + VEC_X * stride, work + VEC_R * stride, work + VEC_P * stride, work + VEC_AP * stride,
                   0.0, 0.0, 0.0, 0};
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const int n2 = pt.n2;
    const int64_t N = (int64_t)pt.n1 * n2;
    double bb = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
        T d;
        const T m = system_diagonal(s1, s2, v1, v2, i1, i2, ncode, npar, q, d);
        const T bi = d * q * q;
        const T z = bi / m;
        diag[i] = m;
        cg.x[i] = 0;
        cg.r[i] = bi;
        cg.p[i] = z;
        cg.rz += (double)bi * z;
        bb += (double)bi * bi;
    }
    cg.rz = warp_sum(cg.rz);
    cg.bnorm = cg.rnorm = sqrt(warp_sum(bb));
    conjugate_gradient<T, FORM>(s1, s2, pt, ek, ek_scale, cg, diag, tol, max_iter, lane);
    double total = 0;
    for (int64_t i = lane; i < N; i += kWarp) total += (double)cg.x[i];
    total = warp_sum(total);
    if (lane == 0) {
        *it_out = cg.it;
        *res_out = cg.bnorm > 0 ? cg.rnorm / cg.bnorm : 0.0;
    }
    return total;
}

template <typename T, int FORM>
__device__ void solve_pair(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t g1, int64_t g2,
                           const int* ncode, const T* npar, const EdgeKernel<T>& ek, T ek_scale, T q, T p2,
                           double tol, int max_iter, T* __restrict__ work, int64_t stride, T* s_t1, T* s_t2, T* s_x,
                           int lane, double* k_out, int32_t* it_out, double* res_out, T* nodal) {
    const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
    const PairTiles<T> pt{s1.tile_rowptr + s1.rowptr_off[g1], s2.tile_rowptr + s2.rowptr_off[g2],
                          (int)(s1.node_off[g1 + 1] - v1), (int)(s2.node_off[g2 + 1] - v2), s_t1, s_t2, s_x};
    const double total = solve_forward<T, FORM>(s1, s2, v1, v2, pt, ncode, npar, ek, ek_scale, q, tol, max_iter,
                                                work, stride, lane, it_out, res_out);
    if (nodal != nullptr) {
        const T* __restrict__ x = work + VEC_X * stride;
        const int64_t N = (int64_t)pt.n1 * pt.n2;
        for (int64_t i = lane; i < N; i += kWarp) nodal[i] = (T)((double)p2 * x[i]);
    }
    if (lane == 0) *k_out = (double)p2 * total;
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
    const EdgeKernel<T> ek{ek_theta, ek_aux, ek_channel, w.code + ncode_len, w.par + nparam_len};
    for (int64_t k = w.warp_global; k < n_pairs; k += w.n_warps) {
        solve_pair<T, FORM>(s1, s2, pair_g1[k], pair_g2[k], w.code, w.par, ek, ek_scale, q, p2, tol, max_iter, work,
                            stride, w.s_t1, w.s_t2, w.s_x, w.lane, k_out + k, it_out + k, res_out + k,
                            nodal != nullptr ? nodal + nodal_off[k] : nullptr);
    }
}

// The derivative programs and edge contractions of a gradient launch (graphkern/_mgk_gradient.py).
template <typename T>
struct GradientTerms {
    int n_node;                // vertex-kernel derivative programs, read from global memory:
    const int* ncode;          //   program j at ncode + ncode_off[j], npar + npar_off[j]
    const T* npar;
    const int64_t* ncode_off;
    const int64_t* npar_off;
    int n_contractions;        // edge contractions: form, shortcut parameters and (general form)
    const int* cform;          //   program, staged in shared memory
    const T* ctheta;
    const T* caux;
    const int* ccode;
    const T* cpar;
    const int64_t* ccode_off;
    const int64_t* cpar_off;
    const double* cfree;       // 0, or the factor making contraction c cfree[c] y^T (D V^-1 x - b): free
};

// K of one pair and its raw derivatives grad = [p^2 y^T D V^-2 dV_j x for each vertex-kernel
// derivative program j, dK/dq, p^2 y^T (A1 (x) A2 (.) dE_c) x for each edge contraction c].
template <typename T, int FORM>
__device__ void gradient_pair(const GraphSet<T>& s1, const GraphSet<T>& s2, int64_t g1, int64_t g2,
                              const int* ncode, const T* npar, const EdgeKernel<T>& ek, T ek_scale, T q, T p2,
                              double tol, int max_iter, T* __restrict__ work, int64_t stride, T* s_t1, T* s_t2,
                              T* s_x, int lane, const GradientTerms<T>& gt, double* k_out, int32_t* it_out,
                              double* res_out, int32_t* adj_it_out, double* adj_res_out, double* grad) {
    const int64_t v1 = s1.node_off[g1], v2 = s2.node_off[g2];
    const PairTiles<T> pt{s1.tile_rowptr + s1.rowptr_off[g1], s2.tile_rowptr + s2.rowptr_off[g2],
                          (int)(s1.node_off[g1 + 1] - v1), (int)(s2.node_off[g2 + 1] - v2), s_t1, s_t2, s_x};
    CGSystem<T> cx{work + VEC_X * stride, work + VEC_R * stride, work + VEC_P * stride, work + VEC_AP * stride,
                   0.0, 0.0, 0.0, 0};
    CGSystem<T> cy{work + VEC_Y * stride, work + VEC_RY * stride, work + VEC_PY * stride, work + VEC_APY * stride,
                   0.0, 0.0, 0.0, 0};
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const T* x = cx.x;  // the solutions, read-only once the solves are done
    const T* y = cy.x;
    const int n2 = pt.n2;
    const int64_t N = (int64_t)pt.n1 * n2;

    // M x = b = D q_x and the adjoint M y = 1, both from 0 with the preconditioner diag = D / V
    double bb = 0;
    for (int64_t i = lane; i < N; i += kWarp) {
        const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
        T d;
        const T m = system_diagonal(s1, s2, v1, v2, i1, i2, ncode, npar, q, d);
        const T bi = d * q * q;
        const T zx = bi / m, zy = T(1) / m;
        diag[i] = m;
        cx.x[i] = 0;
        cx.r[i] = bi;
        cx.p[i] = zx;
        cy.x[i] = 0;
        cy.r[i] = 1;
        cy.p[i] = zy;
        cx.rz += (double)bi * zx;
        cy.rz += (double)zy;
        bb += (double)bi * bi;
    }
    cx.rz = warp_sum(cx.rz);
    cy.rz = warp_sum(cy.rz);
    cx.bnorm = cx.rnorm = sqrt(warp_sum(bb));
    cy.bnorm = cy.rnorm = sqrt((double)N);
    paired_conjugate_gradient<T, FORM>(s1, s2, pt, ek, ek_scale, cx, cy, diag, tol, max_iter, lane);
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
    const T floor_v = T(kVertexKernelFloor);
    for (int j = 0; j < gt.n_node; ++j) {
        const int* dcode = gt.ncode + gt.ncode_off[j];
        const T* dpar = gt.npar + gt.npar_off[j];
        double acc = 0;
        for (int64_t i = lane; i < N; i += kWarp) {
            const int i1 = (int)(i / n2), i2 = (int)(i - (int64_t)i1 * n2);
            const T* f1 = s1.node_feat + (v1 + i1) * s1.n_feat;
            const T* f2 = s2.node_feat + (v2 + i2) * s2.n_feat;
            const T v = mgk::eval_program(ncode, npar, f1, 1, f2, 1);
            if (v < floor_v) continue;
            const T dv = mgk::eval_program(dcode, dpar, f1, 1, f2, 1);
            acc += (double)y[i] * x[i] * ((double)diag[i] / v) * dv;
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
        const EdgeKernel<T> ck{gt.ctheta[c], gt.caux[c], ek.channel, gt.ccode + gt.ccode_off[c],
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
    const EdgeKernel<T> ek{ek_theta, ek_aux, ek_channel, w.code + ncode_len, w.par + nparam_len};
    for (int64_t k = w.warp_global; k < n_pairs; k += w.n_warps) {
        gradient_pair<T, FORM>(s1, s2, pair_g1[k], pair_g2[k], w.code, w.par, ek, ek_scale, q, p2, tol, max_iter,
                               work, stride, w.s_t1, w.s_t2, w.s_x, w.lane, gt, k_out + k, it_out + k, res_out + k,
                               adj_it_out + k, adj_res_out + k, grad_out + k * n_raw);
    }
}

}  // namespace

// Argument list shared by every entry point: the two graph sets ...
#define MGK_SET_ARGS(T, S)                                                                          \
    const int64_t *node_off##S, const int64_t *rowptr_off##S, const int32_t *tile_rowptr##S,        \
        const int32_t *tile_col##S, const T *tile_val##S, const T *degree##S, const T *node_feat##S, \
        int n_feat##S, int channels##S
#define MGK_SET(T, S) \
    GraphSet<T> { node_off##S, rowptr_off##S, tile_rowptr##S, tile_col##S, tile_val##S, degree##S, node_feat##S, n_feat##S, channels##S }

// ... then the pairs, the programs, the edge-kernel shortcut, the hyperparameters and the scratch.
#define MGK_PAIR_ARGS(T)                                                                                    \
    const int64_t *pair_g1, const int64_t *pair_g2, int64_t n_pairs, const int *code, const T *params,      \
        int ncode_len, int nparam_len, int ecode_len, int eparam_len, T ek_scale, T ek_theta, T ek_aux,     \
        int ek_channel, T q, T p2, double tol, int max_iter, T *scratch, int64_t stride
#define MGK_PAIRS                                                                                          \
    pair_g1, pair_g2, n_pairs, code, params, ncode_len, nparam_len, ecode_len, eparam_len, ek_scale, ek_theta, \
        ek_aux, ek_channel, q, p2, tol, max_iter, scratch, stride

#define MGK_ENTRY(NAME, T, FORM)                                                                           \
    extern "C" __global__ void __launch_bounds__(kWarpsPerBlock * kWarp, kMinBlocksPerSM)                 \
        NAME(MGK_SET_ARGS(T, 1), MGK_SET_ARGS(T, 2), MGK_PAIR_ARGS(T), double* k_out, int32_t* it_out,      \
             double* res_out, T* nodal, const int64_t* nodal_off) {                                        \
        mgk_solve<T, FORM>(MGK_SET(T, 1), MGK_SET(T, 2), MGK_PAIRS, k_out, it_out, res_out, nodal, nodal_off); \
    }

// Gradient entry points: the same head (no nodal output), then the derivative programs, the edge
// contractions and the gradient outputs (graphkern/_mgk_gpu.py: GPUEngine.solve_gradient).
#define MGK_GRADIENT_ENTRY(NAME, T, FORM)                                                                   \
    extern "C" __global__ void __launch_bounds__(kWarpsPerBlock * kWarp, gradient_min_blocks<T>())         \
        NAME(MGK_SET_ARGS(T, 1), MGK_SET_ARGS(T, 2), MGK_PAIR_ARGS(T), int n_node, const int* ncode,         \
             const T* npar, const int64_t* ncode_off, const int64_t* npar_off, int n_contractions,          \
             const int* cform, const T* ctheta, const T* caux, const int* ccode, const T* cpar,             \
             const int64_t* ccode_off, const int64_t* cpar_off, const double* cfree, int ccode_len,          \
             int cpar_len, int n_raw,                                                                       \
             double* k_out, int32_t* it_out, double* res_out, int32_t* adj_it_out, double* adj_res_out,     \
             double* grad_out) {                                                                            \
        const GradientTerms<T> gt{n_node, ncode, npar, ncode_off, npar_off, n_contractions, cform,          \
                                  ctheta, caux,  ccode, cpar, ccode_off, cpar_off, cfree};                   \
        mgk_gradient<T, FORM>(MGK_SET(T, 1), MGK_SET(T, 2), MGK_PAIRS, gt, ccode_len, cpar_len, n_raw, k_out, \
                              it_out, res_out, adj_it_out, adj_res_out, grad_out);                          \
    }

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

MGK_EVERY_FORM(MGK_ENTRY, mgk_solve)
MGK_EVERY_FORM(MGK_GRADIENT_ENTRY, mgk_gradient)
