# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The shortest-path feature map's Gram matrix on the CPU: the scattered product of its rare
columns (graphkern/spgk/features.py sends the frequent ones through BLAS) and the mirror of an
upper triangle onto the lower one, both parallel over rows with OpenMP."""

from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t

import numpy as np


def gram_sparse(a_indptr, a_indices, a_data, bt_indptr, bt_rows, bt_data, double[:, ::1] out, int64_t row0,
                bint upper, int n_threads, bint mirror_block=True):
    """``out[i, j] += sum_f A[i, f] B[j, f]`` for the rows ``i`` of the CSR matrix ``A``, with ``B``
    given by column (CSC: ``bt_indptr``, ``bt_rows`` sorted, ``bt_data``); every row of ``out``
    scattered into by one thread.  ``upper``: the rows of ``A`` are rows ``row0...`` of ``B``; only
    ``j >= row0 + i`` is summed, then (``mirror_block``; not when the caller mirrors the whole
    matrix afterwards) the square block ``out[:, row0:row0 + rows]`` gets its lower triangle from
    its upper one.  Counts are int64, sums float64 (exact below 2**53)."""
    cdef const int64_t[::1] aip = a_indptr
    cdef const int32_t[::1] aix = a_indices
    cdef const int64_t[::1] ad = a_data
    cdef const int64_t[::1] bip = bt_indptr
    cdef const int32_t[::1] brow = bt_rows
    cdef const int64_t[::1] bd = bt_data
    cdef int64_t n_rows = out.shape[0], i, j, k, m, lo, hi, f
    cdef double a
    cdef double* row
    with nogil:
        for i in prange(n_rows, schedule="dynamic", chunksize=4, num_threads=n_threads):
            row = &out[i, 0]
            for k in range(aip[i], aip[i + 1]):
                f = aix[k]
                a = <double>ad[k]
                lo = bip[f]
                hi = bip[f + 1]
                if upper:  # bisect for the first row >= i + row0 of column f
                    while lo < hi:
                        m = (lo + hi) // 2
                        if brow[m] < i + row0:
                            lo = m + 1
                        else:
                            hi = m
                    hi = bip[f + 1]
                for m in range(lo, hi):
                    row[brow[m]] += a * <double>bd[m]
        if upper and mirror_block:
            for i in prange(n_rows, schedule="static", num_threads=n_threads):
                for j in range(i):
                    out[i, row0 + j] = out[j, row0 + i]


def mirror_upper(double[:, ::1] out, int n_threads):
    """``out[j, i] = out[i, j]`` for every ``j > i``: the upper triangle of the square ``out``
    copied onto the lower one in 64 x 64 tiles (both sides stay in cache), a thread per band of
    64 columns of the lower triangle, so no two threads write one entry.  NumPy's transposed copy
    of the same blocks walks the lower side a row per column and runs on one core."""
    cdef Py_ssize_t n = out.shape[0], b, i0, i1, j0, j1, i, j, lo
    if out.shape[1] != n:
        raise ValueError(f"mirror_upper needs a square matrix, got {out.shape[0]} x {out.shape[1]}")
    for b in prange((n + 63) // 64, nogil=True, schedule="dynamic", num_threads=n_threads,
                    use_threads_if=n_threads > 1):
        i0 = b * 64
        i1 = min(n, i0 + 64)
        j0 = i0
        while j0 < n:
            j1 = min(n, j0 + 64)
            for i in range(i0, i1):
                lo = max(j0, i + 1)
                for j in range(lo, j1):
                    out[j, i] = out[i, j]
            j0 = j1
    return np.asarray(out)
