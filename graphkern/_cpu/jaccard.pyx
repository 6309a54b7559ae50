# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Jaccard, Sorensen and overlap similarity of a symmetric CSR on the CPU (OpenMP over rows),
and the counting pass that plans the GPU kernels.

Each undirected pair {i, j} is computed once, by the row of its *owner*: the endpoint of larger
degree (the larger index on a tie).  That row's neighbours are marked in a per-thread array
(position in the row + 1), and the other endpoint's shorter row is scanned against the marks, so
the pair costs exactly min(d_i, d_j) lookups; the value is then written to (i, j) and to its
mirror (j, i), found by a binary search in the shorter row.  Merging both rows per entry, or
galloping the shorter row through the longer one, costs several times more on skewed graphs.
The marks cost 4 bytes x n per thread.

The raw intersection counts stored self-loops; the per-vertex terms of :func:`_vertex_terms`
then give the neighbour sets of the chosen convention, the same arithmetic as the CUDA kernels
(cuda_src/jaccard.cu), so unweighted results are bit-identical to the GPU's.
"""

import numpy as np

cimport openmp
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from graphkern._cpu._search cimport lower_bound, sorted_index_t

ctypedef fused bits_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t

cdef enum:
    JACCARD = 0
    SORENSEN = 1
    OVERLAP = 2


cdef inline floating metric_ratio(int metric, floating inter, floating wi, floating wj) noexcept nogil:
    """The metric of an intersection and two set sizes (weights, or counts in double: exact below 2^53)."""
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
                        bint weighted, bint self_loops, floating unit, int32_t* deg, int32_t* adj, floating* wsum,
                        floating* selfw, int n_threads) noexcept nogil:
    """Per-vertex terms of the neighbour-set convention (see VertexTerms in cuda_src/jaccard.cu);
    ``unit`` is the weight of a vertex in its own set where no self-loop is stored."""
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
                wsum[i] = total if stored else total + unit
                selfw[i] = 0 if stored else unit
            else:
                wsum[i] = total - loop_w
                selfw[i] = loop_w


def similarity(const int64_t[::1] indptr, const int32_t[::1] indices, const floating[::1] weights,
               floating[::1] out, int metric, bint weighted, bint self_loops, int n_threads, *,
               double unit=1.0, progress=None, int64_t progress_rows=0):
    """Fill ``out`` (one value per stored entry) with the similarity of each entry's endpoints.

    ``weights`` is ignored (and may be empty) unless ``weighted``; ``unit`` is a vertex's weight
    in its own set where it has no stored self-loop (``self_loops``), 1 unless the weights were
    scaled.  Indices must lie in range and be sorted within rows, and the pattern must be
    symmetric: the caller checks all three.  ``progress``, a callable, receives the number of rows
    finished after each block of about ``progress_rows`` rows (blocks end at a parallel region's
    barrier, so they are used only when progress is asked for).
    """
    cdef int64_t n = indptr.shape[0] - 1
    cdef int64_t nnz = indices.shape[0]
    if out.shape[0] != nnz or (weighted and weights.shape[0] != nnz):
        raise ValueError("out and weights must have one value per stored entry")
    if nnz == 0:
        if progress is not None:
            progress(n)
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
    cdef int64_t i, j, k, q, a0, a1, b0, b1, di, dj, count, r0, r1
    cdef int32_t m
    cdef floating raw, value, w_ij
    cdef int64_t step = n if progress is None or progress_rows <= 0 else progress_rows

    with nogil:
        _vertex_terms(ip, idx, w, n, weighted, self_loops, <floating>unit, &deg[0], &adj[0], ws, sw, n_threads)
    r0 = 0
    while r0 < n:
        r1 = min(n, r0 + step)
        with nogil, parallel(num_threads=n_threads):
            mark = &marks[openmp.omp_get_thread_num(), 0]
            # dynamic: a row's cost is the sum of the shorter degrees of the pairs it owns,
            # which varies by orders of magnitude between hubs and leaves
            for i in prange(r0, r1, schedule="dynamic", chunksize=64):
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
                        value = metric_ratio(metric, raw + sign * (smaller(sw[i], w_ij) + smaller(sw[j], w_ij)),
                                             ws[i], ws[j])
                    else:
                        count = 0
                        for q in range(b0, b1):
                            count = count + (mark[idx[q]] != 0)
                        value = <floating>metric_ratio(metric, <double>(count + adj[i] + adj[j]), <double>deg[i],
                                                       <double>deg[j])
                    res[k] = value
                    q = lower_bound(idx, b0, b1, <int32_t>i)
                    if q < b1:  # the mirror (j, i) of a symmetric pattern; never past row j
                        res[q] = value
                for k in range(a0, a1):
                    mark[idx[k]] = 0
        if progress is not None:
            progress(r1 - r0)
        r0 = r1


def plan_counts(const int64_t[::1] indptr, const int32_t[::1] indices, int64_t block_rows, bint window,
                int64_t window_half, int64_t window_far, int n_threads):
    """The counts the GPU plan's choice of variant needs, in one parallel pass over the stored
    entries (two with ``window``: each row's far entries first).

    Returns ``(bad, off, in_block, near)``: ``bad`` the entries whose column lies outside [0, n)
    (the other counts leave them out, and mean nothing unless ``bad`` is 0); ``off`` the
    off-diagonal entries; with ``block_rows`` > 0, ``in_block`` the off-diagonal entries whose row
    and column fall in one block of ``block_rows`` rows; with ``window``, ``near`` the off-diagonal
    entries with |i - j| < ``window_half`` whose two rows each have at most ``window_far`` entries
    ``window_half`` or more away from their own index.
    """
    cdef int64_t n = indptr.shape[0] - 1
    cdef int64_t i, j, k, gap
    cdef int64_t bad = 0, off = 0, in_block = 0, near = 0
    cdef const int64_t* ip = &indptr[0]
    cdef const int32_t* idx = &indices[0] if indices.shape[0] else NULL
    cdef int32_t[::1] far_counts = np.zeros(n if window else 0, dtype=np.int32)
    cdef int32_t* far = &far_counts[0] if (window and n) else NULL
    cdef int32_t count
    with nogil:
        if window:  # each row's far entries first: an entry's test reads both of its rows' counts
            for i in prange(n, schedule="guided", num_threads=n_threads):
                count = 0
                for k in range(ip[i], ip[i + 1]):
                    j = idx[k]
                    if j - i >= window_half or i - j >= window_half:
                        count = count + 1
                far[i] = count
        for i in prange(n, schedule="guided", num_threads=n_threads):
            for k in range(ip[i], ip[i + 1]):
                j = idx[k]
                if j < 0 or j >= n:
                    bad += 1
                    continue
                if j == i:
                    continue
                off += 1
                if block_rows > 0 and i // block_rows == j // block_rows:
                    in_block += 1
                if window:
                    gap = j - i if j > i else i - j
                    if gap < window_half and far[i] <= window_far and far[j] <= window_far:
                        near += 1
    return bad, off, in_block, near


def parallel_copy(src, int n_threads):
    """A copy of the C-contiguous array ``src``, its 1 MiB blocks copied on ``n_threads`` threads: a
    copy into fresh pages is paced by their first touch, a few GB/s on one thread, and a result's
    own column indices are as large as its input's."""
    out = np.empty_like(src, order="C")
    if src.nbytes == 0:
        return out
    cdef const unsigned char[::1] s = src.reshape(-1).view(np.uint8)
    cdef unsigned char[::1] d = out.reshape(-1).view(np.uint8)
    cdef Py_ssize_t n = s.shape[0], block = 1 << 20, b, lo, hi
    cdef Py_ssize_t blocks = (n + block - 1) // block
    for b in prange(blocks, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=blocks > 1):
        lo = b * block
        hi = lo + block if lo + block < n else n
        memcpy(&d[lo], &s[lo], hi - lo)
    return out


def row_figures(indptr, int n_threads):
    """``(indptr64, top, nonempty)`` of the row pointers ``indptr`` (any integer type) in one
    parallel pass: the pointers as int64 (``indptr`` itself when it is contiguous int64), the
    longest row and the number of non-empty rows.  Decreasing pointers (an invalid CSR, which
    the caller checks) give meaningless figures, never a fault."""
    if indptr.dtype != np.int32:
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    wide = indptr.dtype == np.int64
    out = indptr if wide else np.empty(indptr.shape, dtype=np.int64)
    figures = np.zeros((max(1, min(indptr.size - 1, 64 * n_threads)), 2), dtype=np.int64)  # per block
    _row_figures(np.ascontiguousarray(indptr), np.empty(0, dtype=np.int64) if wide else out, figures, n_threads)
    return out, int(figures[:, 0].max()), int(figures[:, 1].sum())


def _row_figures(const sorted_index_t[::1] indptr, int64_t[::1] out, int64_t[:, ::1] figures, int n_threads):
    """Each block's longest row and non-empty rows into ``figures``; ``out`` (unless empty) gets
    the pointers, its pages first touched by the threads that read them."""
    cdef int64_t n = indptr.shape[0] - 1, parts = figures.shape[0], b, i, d
    cdef bint widen = out.shape[0] > 0
    if widen and n >= 0:
        out[n] = indptr[n]
    for b in prange(parts if n > 0 else 0, nogil=True, num_threads=n_threads, use_threads_if=n > 1 << 16):
        for i in range(b * n // parts, (b + 1) * n // parts):
            d = <int64_t>indptr[i + 1] - indptr[i]
            if widen:
                out[i] = indptr[i]
            figures[b, 0] = max(figures[b, 0], d)
            figures[b, 1] += d > 0


def long_rows(const int64_t[::1] indptr, int64_t floor, int n_threads):
    """``(rows, degrees)``: the rows with at least ``floor`` entries, in increasing order (int64),
    and their lengths (int64), in one parallel pass over the row pointers: each block of rows
    counts its long rows, then writes them from its offset."""
    cdef int64_t n = indptr.shape[0] - 1, parts = max(1, min(n, 64 * n_threads)), b, i, k
    cdef int64_t[::1] found = np.zeros(parts + 1, dtype=np.int64)
    for b in prange(parts if n > 0 else 0, nogil=True, num_threads=n_threads, use_threads_if=n > 1 << 16):
        for i in range(b * n // parts, (b + 1) * n // parts):
            if indptr[i + 1] - indptr[i] >= floor:
                found[b + 1] += 1
    offsets = np.cumsum(found)
    cdef int64_t[::1] start = offsets
    rows = np.empty(start[parts], dtype=np.int64)
    lengths = np.empty(start[parts], dtype=np.int64)
    cdef int64_t[::1] r = rows
    cdef int64_t[::1] d = lengths
    for b in prange(parts if n > 0 else 0, nogil=True, num_threads=n_threads, use_threads_if=n > 1 << 16):
        k = start[b]
        for i in range(b * n // parts, (b + 1) * n // parts):
            if indptr[i + 1] - indptr[i] >= floor:
                r[k] = i
                d[k] = indptr[i + 1] - indptr[i]
                k = k + 1
    return rows, lengths


def _uniform(const bits_t[::1] v, int n_threads):
    cdef int64_t size = v.shape[0], block = 1 << 18, b, k, hi
    cdef int64_t blocks = (size + block - 1) // block
    cdef bits_t first = v[0]
    cdef uint8_t[::1] differs = np.zeros(blocks, dtype=np.uint8)
    for b in prange(blocks, nogil=True, num_threads=n_threads, schedule="dynamic", use_threads_if=blocks > 1):
        hi = min(size, (b + 1) * block)
        k = b * block
        while k < hi and v[k] == first:  # a block ends at its first difference
            k = k + 1
        differs[b] = k < hi
    return not np.any(differs)


def uniform_values(values, int n_threads):
    """True when every element of the contiguous, non-empty 1-D array ``values`` has the bits of
    the first (any type of 1, 2, 4 or 8 bytes), in one parallel pass."""
    return _uniform(values.view(f"u{values.dtype.itemsize}"), n_threads)
