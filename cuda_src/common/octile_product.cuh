// 8 x 8 tiles ("octiles") of the marginalized graph kernel's solvers: the shortcut edge kernels of
// two edge-feature values (also the tiled solver's, mgk_tiled_octile.cuh), and the dense product of
// one pair of octiles with the edge kernel evaluated per element pair (the core solver's, mgk.cu):
// lane (a, b) of a warp owns rows a and a + 4 of column b of the 8 x 8 output block.  Edge kernels
// that ignore labels factorize the block as W1 X W2^T (2 * 2 * 8^3 flops instead of 64 * 64 * 3).
#pragma once

#include "common/kernel_program.cuh"

namespace mgk {

constexpr int kOctile = 8;
constexpr int kOctileSize = 64;

// exp, or (FAST) the fast single-precision intrinsic.
template <bool FAST>
__device__ __forceinline__ float exp_as(float v) {
    return FAST ? __expf(v) : expf(v);
}
template <bool FAST>
__device__ __forceinline__ double exp_as(double v) {
    return exp(v);
}

// A shortcut form's edge kernel of two edge-feature values.
template <typename T, int FORM, bool FAST_EXP>
__device__ __forceinline__ T edge_shortcut(T e1, T e2, T ek_theta, T ek_aux) {
    if (FORM == EDGE_KRONECKER) return e1 == e2 ? T(1) : ek_theta;
    if (FORM == EDGE_KRONECKER_DERIVATIVE) return e1 == e2 ? T(0) : T(1);
    const T diff = e1 - e2;
    if (FORM == EDGE_SQEXP_DERIVATIVE) return diff * diff * exp_as<FAST_EXP>(ek_aux * diff * diff);
    return exp_as<FAST_EXP>(ek_aux * diff * diff);
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
// t1, t2: the octiles' planes of 64 (plane 0 the weights, plane 1 + f edge feature f; the shortcut
// forms compare plane 1).
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
                add_edge(edge_shortcut<T, FORM, false>(e1u, e2[d], ek_theta, ek_aux),
                         edge_shortcut<T, FORM, false>(e1l, e2[d], ek_theta, ek_aux), w2[d], xs + c * kOctile + d,
                         su, sl);
            }
            add_rows(w1u, w1l, su, sl, acc_u, acc_l);
        }
    } else {
        for (int c = 0; c < kOctile; ++c) {
            const int iu = a * kOctile + c, il = (a + 4) * kOctile + c;
            T su[NRHS] = {}, sl[NRHS] = {};
            for (int d = 0; d < kOctile; ++d) {
                const int j = b * kOctile + d;
                const T* e2 = t2 + kOctileSize + j;
                add_edge(eval_program(ecode, epar, t1 + kOctileSize + iu, kOctileSize, e2, kOctileSize),
                         eval_program(ecode, epar, t1 + kOctileSize + il, kOctileSize, e2, kOctileSize),
                         t2[j], xs + c * kOctile + d, su, sl);
            }
            add_rows(t1[iu], t1[il], su, sl, acc_u, acc_l);
        }
    }
}

}  // namespace mgk
