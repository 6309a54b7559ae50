# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Jaccard, Sorensen and overlap similarity of a symmetric CSR on the CPU (OpenMP over rows).

Each undirected pair {i, j} is computed once, by the row of its *owner*: the endpoint of larger
degree (the larger index on a tie).  That row's neighbours are marked in a per-thread array
(position in the row + 1), and the other endpoint's shorter row is scanned against the marks, so
the pair costs exactly min(d_i, d_j) lookups; the value is then written to (i, j) and to its
mirror (j, i), found by a binary search in the shorter row.  Measured on this machine (2 cores,
Watts-Strogatz 100k/k=10, Barabasi-Albert 100k/m=5, Chung-Lu 200k/gamma=2.3, 1M-3M entries), in
ms: merge of both rows per entry 31 / 114 / 5832; galloping the shorter row through the longer
one, each pair once 16 / 50 / 702; marking row i and scanning row j per upper entry 8.8 / 9.4 /
89; owner marking (kept) 7.5 / 9.1 / 61.  The marks cost 4 bytes x n per thread.

The raw intersection counts stored self-loops; the per-vertex terms of :func:`_vertex_terms`
then give the neighbour sets of the chosen convention, the same arithmetic as the CUDA kernels
(cuda_src/jaccard.cu), so unweighted results are bit-identical to the GPU's.
"""

import numpy as np

cimport openmp
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.stdint cimport int32_t, int64_t

cdef enum:
    JACCARD = 0
    SORENSEN = 1
    OVERLAP = 2


cdef inline int64_t lower_bound(const int32_t* idx, int64_t lo, int64_t hi, int32_t x) noexcept nogil:
    cdef int64_t mid
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if idx[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline double count_ratio(int metric, int64_t inter, int64_t di, int64_t dj) noexcept nogil:
    cdef double num, den
    if metric == JACCARD:
        num = <double>inter
        den = <double>(di + dj - inter)
    elif metric == SORENSEN:
        num = 2.0 * <double>inter
        den = <double>(di + dj)
    else:
        num = <double>inter
        den = <double>(di if di < dj else dj)
    return num / den if den > 0.0 else 0.0


cdef inline floating weight_ratio(int metric, floating inter, floating wi, floating wj) noexcept nogil:
    cdef floating num, den
    if metric == JACCARD:
        num = inter
        den = wi + wj - inter
    elif metric == SORENSEN:
        num = 2 * inter
        den = wi + wj
    else:
        num = inter
        den = wi if wi < wj else wj
    return num / den if den > 0 else 0


cdef inline floating smaller(floating a, floating b) noexcept nogil:
    return a if a < b else b


cdef void _vertex_terms(const int64_t* indptr, const int32_t* idx, const floating* w, int64_t n,
                        bint weighted, bint self_loops, int32_t* deg, int32_t* adj, floating* wsum,
                        floating* selfw, int n_threads) noexcept nogil:
    """Per-vertex terms of the neighbour-set convention (see VertexTerms in cuda_src/jaccard.cu)."""
    cdef int64_t i, k, a0, a1, p
    cdef int32_t stored
    cdef floating total, loop_w
    # guided: a weighted row costs its degree, and hubs come first in many generators
    for i in prange(n, schedule="guided", num_threads=n_threads):
        a0 = indptr[i]
        a1 = indptr[i + 1]
        p = lower_bound(idx, a0, a1, <int32_t>i)
        stored = 1 if (p < a1 and idx[p] == i) else 0
        if self_loops:
            deg[i] = <int32_t>(a1 - a0) + 1 - stored
            adj[i] = 1 - stored
        else:
            deg[i] = <int32_t>(a1 - a0) - stored
            adj[i] = -stored
        if weighted:
            total = 0
            for k in range(a0, a1):
                total = total + w[k]
            loop_w = w[p] if stored else 0
            if self_loops:
                wsum[i] = total if stored else total + 1
                selfw[i] = 0 if stored else 1
            else:
                wsum[i] = total - loop_w
                selfw[i] = loop_w


def similarity(const int64_t[::1] indptr, const int32_t[::1] indices, const floating[::1] weights,
               floating[::1] out, int metric, bint weighted, bint self_loops, int n_threads):
    """Fill ``out`` (one value per stored entry) with the similarity of each entry's endpoints.

    ``weights`` is ignored (and may be empty) unless ``weighted``.  Indices must be sorted
    within rows and the pattern symmetric: the caller (graphkern/jaccard.py) checks both.
    """
    cdef int64_t n = indptr.shape[0] - 1
    cdef int64_t nnz = indices.shape[0]
    if out.shape[0] != nnz or (weighted and weights.shape[0] != nnz):
        raise ValueError("out and weights must have one value per stored entry")
    if nnz == 0:
        return
    cdef floating[::1] wsum = np.zeros(n if weighted else 0, dtype=np.asarray(out).dtype)
    cdef floating[::1] selfw = np.zeros(n if weighted else 0, dtype=np.asarray(out).dtype)
    cdef int32_t[::1] deg = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] adj = np.empty(n, dtype=np.int32)
    # marks of the row being processed, one row per thread; unmarked again after each row
    cdef int32_t[:, ::1] marks = np.zeros((n_threads, n), dtype=np.int32)

    cdef const int64_t* ip = &indptr[0]
    cdef const int32_t* idx = &indices[0]
    cdef const floating* w = &weights[0] if weighted else NULL
    cdef floating* ws = &wsum[0] if weighted else NULL
    cdef floating* sw = &selfw[0] if weighted else NULL
    cdef floating* res = &out[0]
    cdef floating sign = 1 if self_loops else -1
    cdef int32_t* mark = NULL
    cdef int64_t i, j, k, q, a0, a1, b0, b1, di, dj, count
    cdef int32_t m
    cdef floating raw, value, w_ij

    with nogil:
        _vertex_terms(ip, idx, w, n, weighted, self_loops, &deg[0], &adj[0], ws, sw, n_threads)
        with parallel(num_threads=n_threads):
            mark = &marks[openmp.omp_get_thread_num(), 0]
            # dynamic: a row's cost is the sum of the shorter degrees of the pairs it owns,
            # which varies by orders of magnitude between hubs and leaves
            for i in prange(n, schedule="dynamic", chunksize=64):
                a0 = ip[i]
                a1 = ip[i + 1]
                di = a1 - a0
                for k in range(a0, a1):
                    mark[idx[k]] = <int32_t>(k - a0 + 1)
                for k in range(a0, a1):
                    j = idx[k]
                    if j == i:
                        res[k] = 1
                        continue
                    b0 = ip[j]
                    b1 = ip[j + 1]
                    dj = b1 - b0
                    if dj > di or (dj == di and j < i):
                        continue  # owned by row j
                    if weighted:
                        raw = 0
                        for q in range(b0, b1):
                            m = mark[idx[q]]
                            if m != 0:
                                raw = raw + smaller(w[q], w[a0 + m - 1])
                        w_ij = w[k]
                        value = weight_ratio(metric, raw + sign * (smaller(sw[i], w_ij) + smaller(sw[j], w_ij)),
                                             ws[i], ws[j])
                    else:
                        count = 0
                        for q in range(b0, b1):
                            count = count + (mark[idx[q]] != 0)
                        value = <floating>count_ratio(metric, count + adj[i] + adj[j], deg[i], deg[j])
                    res[k] = value
                    res[lower_bound(idx, b0, b1, <int32_t>i)] = value
                for k in range(a0, a1):
                    mark[idx[k]] = 0
