// The content check of a CSR after its upload, shared by every module that takes a CSR from the
// host (a thread per row pointer and per stored entry): row pointers from 0 to nnz, never
// decreasing; every column in [0, n_cols); strictly increasing columns in a row; finite values
// (floating types); non-negative values (signed types, with check_negative); and, with
// check_symmetry (the whole square matrix only), for entry (i, j) row j holds i with the same value
// bits.  status[0] gets the kCsr* flags of the problems found, status[1] the smallest offending
// entry (both start at 0 and nnz).  Values are compared as raw elements of `value_size` bytes (1,
// 2, 4 or 8; 0: none), so any dtype is read without a conversion; a flag may be raised where the
// host's check passes (-0.0 against 0.0), never the reverse, and the host runs its own check,
// which names the entry, wherever a flag is raised.  Any row pointers are read safely: rows and
// search ranges are clamped, and an invalid indptr only makes the other flags meaningless.
// A module exposes it by instantiating GK_CSR_CHECK_ENTRY(name, pointer type) and exporting the
// struct the entry point takes with GK_CSR_CHECK_STRUCT(name, pointer type).
#pragma once

#include <cstdint>

#include "search.cuh"

namespace gk {

constexpr uint64_t kCsrIndptr = 1, kCsrRange = 2, kCsrUnsorted = 4, kCsrNonFinite = 8, kCsrNegative = 16,
                   kCsrAsymmetric = 32;

__device__ __forceinline__ uint64_t csr_value_bits(const void* values, int32_t size, int64_t k) {
    switch (size) {
        case 1: return static_cast<const uint8_t*>(values)[k];
        case 2: return static_cast<const uint16_t*>(values)[k];
        case 4: return static_cast<const uint32_t*>(values)[k];
        case 8: return static_cast<const uint64_t*>(values)[k];
        default: return 0;
    }
}

__device__ __forceinline__ void csr_flag(uint64_t* status, uint64_t flag, int64_t k) {
    atomicOr(reinterpret_cast<unsigned long long*>(status), (unsigned long long)flag);
    if (k >= 0) atomicMin(reinterpret_cast<unsigned long long*>(status + 1), (unsigned long long)k);
}

// value_kind: 0 unsigned or bool, 1 signed integer, 2 floating point.
template <typename P>
__device__ __forceinline__ void csr_check(const P* __restrict__ indptr, const int32_t* __restrict__ idx,
                                          const void* __restrict__ values, int32_t value_size, int32_t value_kind,
                                          int32_t check_negative, int32_t check_symmetry, int64_t n_rows,
                                          int64_t n_cols, int64_t nnz, uint64_t* __restrict__ status) {
    const int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (k <= n_rows) {
        const int64_t p = indptr[k];
        if ((k == 0 && p != 0) || (k == n_rows && p != nnz) || (k < n_rows && p > (int64_t)indptr[k + 1]))
            csr_flag(status, kCsrIndptr, -1);
    }
    if (n_rows == 0 || (int64_t)blockIdx.x * blockDim.x >= nnz) return;  // the whole block: the row search syncs
    const int64_t k_first = blockIdx.x * (int64_t)blockDim.x;
    const int64_t k_last = min(k_first + (int64_t)blockDim.x, nnz) - 1;
    const int64_t i = block_entry_row(indptr, n_rows, k, k_first, k_last);
    if (k >= nnz) return;
    uint64_t flags = 0;
    const int32_t j = idx[k];
    if (j < 0 || j >= n_cols) flags |= kCsrRange;
    if (k > 0 && k > (int64_t)indptr[i] && idx[k - 1] >= j) flags |= kCsrUnsorted;
    const uint64_t bits = csr_value_bits(values, value_size, k);
    const int sign_shift = 8 * value_size - 1;
    if (value_kind == 2) {
        const uint64_t exponent = value_size == 8 ? 0x7FF0000000000000ull : value_size == 4 ? 0x7F800000ull : 0x7C00ull;
        if ((bits & exponent) == exponent) flags |= kCsrNonFinite;
    }
    if (check_negative && value_kind != 0 && value_size > 0 && ((bits >> sign_shift) & 1)) flags |= kCsrNegative;
    if (check_symmetry && !(flags & kCsrRange) && j < n_rows) {
        const int64_t b = min(max((int64_t)indptr[j], (int64_t)0), nnz);
        const int64_t e = min(max((int64_t)indptr[j + 1], b), nnz);
        const int64_t p = lower_bound(idx, b, e, (int32_t)i);
        if (p == e || idx[p] != i || csr_value_bits(values, value_size, p) != bits) flags |= kCsrAsymmetric;
    }
    if (flags) csr_flag(status, flags, k);
}

// The check's parameters, one struct per pointer type P (graphkern/_cuda/csr_check.py packs it).
template <typename P>
struct CsrCheck {
    const P* indptr;
    const int32_t* idx;
    const void* values;
    int32_t value_size, value_kind, check_negative, check_symmetry;
    int64_t n_rows, n_cols, nnz;
    uint64_t* status;
};

}  // namespace gk

// A module exporting the entry points exports the struct too, as "<name>": GK_CSR_CHECK_STRUCT(name, P).
#define GK_CSR_CHECK_FIELDS(X, N, S)                                                                            \
    X(N, S, indptr) X(N, S, idx) X(N, S, values) X(N, S, value_size) X(N, S, value_kind) X(N, S, check_negative) \
    X(N, S, check_symmetry) X(N, S, n_rows) X(N, S, n_cols) X(N, S, nnz) X(N, S, status)
#define GK_CSR_CHECK_STRUCT(name, P) GK_STRUCT(#name, gk::CsrCheck<P>, GK_CSR_CHECK_FIELDS)

#define GK_CSR_CHECK_ENTRY(name, P)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) name(const gk::CsrCheck<P> c) {                           \
        gk::csr_check<P>(c.indptr, c.idx, c.values, c.value_size, c.value_kind, c.check_negative,               \
                         c.check_symmetry, c.n_rows, c.n_cols, c.nnz, c.status);                                \
    }
