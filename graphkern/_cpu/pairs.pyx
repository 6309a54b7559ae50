# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Per-pair host work of the marginalized kernel's GPU solvers in O(pairs) compiled passes.

:func:`launch_order` is NumPy's stable argsort of the 16-bit keys ``65535 - cost * 65535 / max``
(the longest pairs first) as one counting sort; :func:`take` and :func:`scatter` are the gathers
``a[order]`` and scatters ``out[order] = a`` over threads; :func:`upper_pairs` lists the pairs
``i <= j`` row by row (``np.triu_indices`` order) and :func:`symmetric_fill` writes a Gram matrix
from their values.
"""

import numpy as np

from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint16_t

ctypedef fused item_t:
    int32_t
    int64_t
    float
    double

ctypedef fused out_t:
    float
    double


def launch_order(const double[::1] cost):
    """``np.argsort(key.astype(np.uint16), kind="stable")`` for ``key = cost * (-65535 / max) + 65535``
    (all keys 65535 when the largest cost is 0), by counting: O(m), the same permutation."""
    cdef Py_ssize_t m = cost.shape[0], i
    cdef double top = 0.0, scale
    cdef int64_t[::1] count = np.zeros(65537, dtype=np.int64)
    cdef uint16_t[::1] key = np.empty(m, dtype=np.uint16)
    order = np.empty(m, dtype=np.int64)
    cdef int64_t[::1] out = order
    cdef uint16_t k
    with nogil:
        for i in range(m):
            if cost[i] > top:
                top = cost[i]
        scale = -65535.0 / top if top > 0 else 0.0
        for i in range(m):
            k = <uint16_t>(cost[i] * scale + 65535.0) if top > 0 else 65535
            key[i] = k
            count[k + 1] += 1
        for i in range(65536):
            count[i + 1] += count[i]
        for i in range(m):
            out[count[key[i]]] = i
            count[key[i]] += 1
    return order


def take(const item_t[::1] values, const int64_t[::1] order):
    """``values[order]`` over threads."""
    cdef Py_ssize_t m = order.shape[0], i
    out = np.empty(m, dtype=np.asarray(values).dtype)
    cdef item_t[::1] o = out
    for i in prange(m, nogil=True, schedule="static"):
        o[i] = values[order[i]]
    return out


def scatter(item_t[::1] out, const int64_t[::1] order, const item_t[::1] values):
    """``out[order] = values`` over threads (``order`` a permutation)."""
    cdef Py_ssize_t m = order.shape[0], i
    if values.shape[0] != m or out.shape[0] < m:
        raise ValueError(f"scatter of {values.shape[0]} values by {m} indices into {out.shape[0]}")
    for i in prange(m, nogil=True, schedule="static"):
        out[order[i]] = values[i]
    return np.asarray(out)


def upper_pairs(Py_ssize_t n):
    """The pairs (i, j), i <= j < n, row by row (the order of ``np.triu_indices(n)``), shape (m, 2)."""
    pairs = np.empty((n * (n + 1) // 2, 2), dtype=np.int64)
    cdef int64_t[:, ::1] p = pairs
    cdef Py_ssize_t i, j, start
    for i in prange(n, nogil=True, schedule="dynamic", chunksize=16):
        start = i * n - i * (i - 1) // 2
        for j in range(i, n):
            p[start + j - i, 0] = i
            p[start + j - i, 1] = j
    return pairs


def symmetric_fill(const double[::1] K, out_t[:, ::1] out):
    """``out[i, j] = out[j, i] = K[p]`` for the p-th pair of :func:`upper_pairs` (cast to out's type)."""
    cdef Py_ssize_t n = out.shape[0], i, j, start
    if out.shape[1] != n or K.shape[0] != n * (n + 1) // 2:
        raise ValueError(f"{K.shape[0]} values do not fill the upper triangle of a {n} x {out.shape[1]} matrix")
    for i in prange(n, nogil=True, schedule="dynamic", chunksize=16):
        start = i * n - i * (i - 1) // 2
        for j in range(i, n):
            out[i, j] = <out_t>K[start + j - i]
            out[j, i] = <out_t>K[start + j - i]
    return np.asarray(out)
