// Vertex and edge kernels of the marginalized graph kernel, read as the numeric programs of
// graphkern.basekernels: a sum of products of base kernels over feature slots.
//
//   code   = [n_groups, per group: n_terms, per term: kind, slot, width]
//   params = [per group: weight, per term: theta, aux]
//
// An interpreter (rather than code generated per composition) lets any user composition run
// with no CUDA toolkit on the user's machine; the common edge kernels also have shortcuts in
// mgk.cu.  The terms keep their raw hyperparameter (theta) so that derivatives with respect
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

}  // namespace mgk
