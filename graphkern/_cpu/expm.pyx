# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""OpenMP kernels of the Lanczos engine for f(beta A) x on the CPU (see graphkern.expm.lanczos).

The Lanczos vectors are kept unnormalised, ``w_k = beta_{k-1} q_k``, with ``q_k = rscale_k * w_k``
(the GPU path does the same so that one engine drives both).  A step is two passes over memory:

* :func:`lanczos_spmv`: ``v = rscale * (A w_k) - sub * w_{k-1}`` and, in the same pass,
  ``alpha_k = v . q_k``;
* :func:`lanczos_update`: ``w_{k+1} = v - coef * w_k`` in place and ``||w_{k+1}||^2`` (and, in the
  second pass of the basis-free mode, ``y += g * w_{k+1}``).

Rows are split into fixed chunks balanced on ``nnz + rows`` (``row_chunks`` in the engine), a few
per thread, handed out dynamically: each thread gets about the same number of nonzeros, and a thread
that the OS delays does not hold the others up for its whole share.  Partial sums are kept per chunk
and added in chunk order, so every reduction is deterministic for a given chunking.  Vectors are
float32 or float64; dot products accumulate in float64.

Around the solve: :func:`hash_words` (the matrix cache's content key), :func:`first_index_out_of_range`
(no index outside the matrix reaches a kernel) and :func:`degree_order` (the GPU's vertex order),
each one pass at memory speed.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.math cimport fabs

import numpy as np

ctypedef fused real:
    float
    double

ctypedef fused index_t:
    int32_t
    int64_t

cdef enum:
    HASH_BLOCK = 65536  # words per parallel block of the hash and index scans


def lanczos_spmv(const index_t[::1] indptr, const int32_t[::1] indices, const real[::1] values,
                 const real[::1] w_cur, const real[::1] w_prev, real[::1] w_out,
                 double rscale, double sub, const int64_t[::1] chunks, int n_threads):
    """``w_out = rscale * A w_cur - sub * w_prev``; returns ``(w_out . w_cur) * rscale`` (float64).

    ``values`` is empty for an unweighted matrix (every stored entry is 1) and ``w_prev`` is empty
    (or ``sub`` zero) on the first step.
    """
    cdef bint weighted = values.shape[0] > 0
    cdef bint has_prev = w_prev.shape[0] > 0 and sub != 0.0
    cdef Py_ssize_t n_chunks = chunks.shape[0] - 1
    cdef Py_ssize_t c
    cdef int64_t i, e
    cdef real acc, v
    cdef real rs = <real>rscale
    cdef real sb = <real>sub
    cdef double local
    cdef double[::1] partial = np.zeros(max(n_chunks, 1), dtype=np.float64)
    with nogil:
        for c in prange(n_chunks, schedule="dynamic", chunksize=1, num_threads=n_threads):
            local = 0.0
            for i in range(chunks[c], chunks[c + 1]):
                acc = 0
                if weighted:
                    for e in range(indptr[i], indptr[i + 1]):
                        acc = acc + values[e] * w_cur[indices[e]]
                else:
                    for e in range(indptr[i], indptr[i + 1]):
                        acc = acc + w_cur[indices[e]]
                v = rs * acc
                if has_prev:
                    v = v - sb * w_prev[i]
                w_out[i] = v
                local = local + <double>v * (<double>w_cur[i] * rscale)
            partial[c] = local
    return _ordered_sum(partial)


def lanczos_update(const real[::1] w_cur, real[::1] w_out, double coef, double[::1] y, double g,
                   const int64_t[::1] chunks, int n_threads):
    """``w_out -= coef * w_cur`` in place; returns ``||w_out||^2`` (float64).

    With a non-empty ``y`` (float64) also ``y += g * w_out`` (the basis-free second pass).
    """
    cdef bint accumulate = y.shape[0] > 0
    cdef Py_ssize_t n_chunks = chunks.shape[0] - 1
    cdef Py_ssize_t c
    cdef int64_t i
    cdef real w
    cdef real a = <real>coef
    cdef double local
    cdef double[::1] partial = np.zeros(max(n_chunks, 1), dtype=np.float64)
    with nogil:
        for c in prange(n_chunks, schedule="dynamic", chunksize=1, num_threads=n_threads):
            local = 0.0
            for i in range(chunks[c], chunks[c + 1]):
                w = w_out[i] - a * w_cur[i]
                w_out[i] = w
                local = local + <double>w * <double>w
                if accumulate:
                    y[i] = y[i] + g * <double>w
            partial[c] = local
    return _ordered_sum(partial)


def accumulate_columns(double[::1] y, const real[:, ::1] columns, const double[::1] g, int n_threads):
    """``y += g @ columns`` for a block of basis vectors stored as rows, accumulated in float64."""
    cdef Py_ssize_t n = y.shape[0]
    cdef Py_ssize_t n_cols = columns.shape[0]
    cdef Py_ssize_t i, j
    cdef double acc
    if columns.shape[1] != n or g.shape[0] < n_cols:
        raise ValueError("accumulate_columns: shapes do not match")
    with nogil:
        for i in prange(n, schedule="static", num_threads=n_threads):
            acc = 0.0
            for j in range(n_cols):
                acc = acc + g[j] * <double>columns[j, i]
            y[i] = y[i] + acc


def max_abs_row_sum(const index_t[::1] indptr, const double[::1] values, double scale, const int64_t[::1] chunks,
                    int n_threads):
    """``max_i sum_j |scale * a_ij|``: the infinity norm of ``scale * A``, an upper bound of its spectral
    norm for a symmetric A (``scale`` keeps the sums finite when the entries are huge)."""
    cdef Py_ssize_t n_chunks = chunks.shape[0] - 1
    cdef Py_ssize_t c
    cdef int64_t i, e
    cdef double s, local
    cdef double[::1] partial = np.zeros(max(n_chunks, 1), dtype=np.float64)
    with nogil:
        for c in prange(n_chunks, schedule="dynamic", chunksize=1, num_threads=n_threads):
            local = 0.0
            for i in range(chunks[c], chunks[c + 1]):
                s = 0.0
                for e in range(indptr[i], indptr[i + 1]):
                    s = s + fabs(scale * values[e])
                if s > local:
                    local = s
            partial[c] = local
    return float(np.max(partial))


def degree_moments(const index_t[::1] indptr, int n_threads):
    """``(sum, sum of squares, max)`` of the row lengths ``indptr[i + 1] - indptr[i]`` in one parallel
    pass (the sum and max exact, the squares summed in float64)."""
    cdef int64_t n = max(indptr.shape[0] - 1, 0)
    cdef Py_ssize_t parts = max(1, min(4 * n_threads, n // 4096)), c
    cdef int64_t i, d, local_total, local_top
    cdef double local_squares
    totals_arr = np.zeros(parts, dtype=np.int64)
    squares_arr = np.zeros(parts, dtype=np.float64)
    tops_arr = np.zeros(parts, dtype=np.int64)
    cdef int64_t[::1] totals = totals_arr, tops = tops_arr
    cdef double[::1] squares = squares_arr
    for c in prange(parts, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=parts > 1):
        local_total = 0
        local_top = 0
        local_squares = 0.0
        for i in range(n * c // parts, n * (c + 1) // parts):
            d = indptr[i + 1] - indptr[i]
            local_total = local_total + d
            local_squares = local_squares + <double>d * <double>d
            if d > local_top:
                local_top = d
        totals[c] = local_total
        squares[c] = local_squares
        tops[c] = local_top
    return int(totals_arr.sum()), float(squares_arr.sum()), int(tops_arr.max())


cdef double _ordered_sum(double[::1] partial) noexcept:
    cdef double s = 0.0
    cdef Py_ssize_t c
    for c in range(partial.shape[0]):
        s += partial[c]
    return s


# ----------------------------------------------------------------------------- cache keys and index checks

cdef inline uint64_t _mix(uint64_t h, uint64_t w) noexcept nogil:
    h ^= w * 0x9E3779B97F4A7C15ULL
    h = (h << 31) | (h >> 33)
    return h * 0xC2B2AE3D27D4EB4FULL


cdef inline uint64_t _finish(uint64_t h0, uint64_t h1, uint64_t h2, uint64_t h3) noexcept nogil:
    cdef uint64_t h = _mix(_mix(_mix(h0, h1), h2), h3)
    return h ^ (h >> 29)


def hash_words(const uint64_t[::1] words, int n_threads):
    """A 64-bit hash of ``words``, a cache key (not cryptographic).  Each block runs eight lanes of
    ``h = (h ^ w) * K`` (K odd: every step is a bijection of h, so changing any one word always
    changes the lane, and eight independent multiply chains keep the loop at memory speed); the
    lanes and then the blocks are combined in order by a stronger mix."""
    cdef int64_t n = words.shape[0]
    cdef int64_t block = HASH_BLOCK
    cdef Py_ssize_t parts = (n + block - 1) // block, b
    cdef int64_t k, end, k8
    cdef uint64_t h0, h1, h2, h3, h4, h5, h6, h7
    cdef uint64_t K = 0x9E3779B97F4A7C15ULL
    out_arr = np.zeros(max(parts, 1), dtype=np.uint64)
    cdef uint64_t[::1] out = out_arr
    cdef const uint64_t* w
    if n:
        w = &words[0]
    with nogil:
        for b in prange(parts, schedule="static", num_threads=n_threads):
            h0 = 0x243F6A8885A308D3ULL + <uint64_t>b
            h1 = h2 = h3 = h4 = h5 = h6 = h7 = 0x13198A2E03707344ULL
            end = min((b + 1) * block, n)
            k = b * block
            k8 = k + ((end - k) // 8) * 8
            while k < k8:
                h0 = (h0 ^ w[k]) * K
                h1 = (h1 ^ w[k + 1]) * K
                h2 = (h2 ^ w[k + 2]) * K
                h3 = (h3 ^ w[k + 3]) * K
                h4 = (h4 ^ w[k + 4]) * K
                h5 = (h5 ^ w[k + 5]) * K
                h6 = (h6 ^ w[k + 6]) * K
                h7 = (h7 ^ w[k + 7]) * K
                k = k + 8
            while k < end:
                h0 = (h0 ^ w[k]) * K
                k = k + 1
            out[b] = _finish(_mix(_mix(h0, h1), h2), _mix(h3, h4), _mix(h5, h6), h7)
    cdef uint64_t h = <uint64_t>n
    for b in range(parts):
        h = _mix(h, out[b])
    return int(h ^ (h >> 29))


cdef inline bint _out_of_range(const index_t* v, int64_t count, int64_t n) noexcept nogil:
    """Whether any of ``v[:count]`` is outside ``[0, n)``: as unsigned numbers the negative ones are
    huge, so one comparison per entry, counted without branches (a loop the compiler vectorises)."""
    cdef uint64_t limit = <uint64_t>n
    cdef int64_t k, outside = 0
    if sizeof(index_t) == 4:
        for k in range(count):
            outside += <uint32_t>v[k] >= <uint32_t>limit
    else:
        for k in range(count):
            outside += <uint64_t>v[k] >= limit
    return outside != 0


def first_index_out_of_range(const index_t[::1] indices, int64_t n, int n_threads):
    """The first position whose column index is not in ``[0, n)``, or -1.  Each block takes its
    minimum and maximum (a loop without branches, vectorised); only a block out of range is
    searched for the position."""
    cdef int64_t nnz = indices.shape[0]
    cdef int64_t block = HASH_BLOCK
    cdef Py_ssize_t parts = (nnz + block - 1) // block, b
    cdef int64_t k
    bad_arr = np.zeros(max(parts, 1), dtype=np.uint8)
    cdef unsigned char[::1] bad = bad_arr
    if nnz == 0:
        return -1
    cdef const index_t* idx = &indices[0]
    with nogil:
        for b in prange(parts, schedule="static", num_threads=n_threads):
            bad[b] = _out_of_range(idx + b * block, min(block, nnz - b * block), n)
    for b in range(parts):
        if bad[b]:
            for k in range(b * block, min((b + 1) * block, nnz)):
                if indices[k] < 0 or indices[k] >= n:
                    return int(k)
    return -1


def degree_order(const index_t[::1] indptr):
    """The rows by decreasing degree, ties in row order (a stable counting sort, O(n + max degree)):
    ``order`` (int32; ``order[i]`` is the old id of new row i), ``inverse`` (int32) and the row
    pointers of the reordered matrix (int64)."""
    cdef int64_t n = indptr.shape[0] - 1, i, d, dmax = 0, running = 0, p, c
    for i in range(n):
        d = indptr[i + 1] - indptr[i]
        if d > dmax:
            dmax = d
    start_arr = np.zeros(dmax + 1, dtype=np.int64)
    order_arr = np.empty(max(n, 0), dtype=np.int32)
    inverse_arr = np.empty(max(n, 0), dtype=np.int32)
    cdef int64_t[::1] start = start_arr
    cdef int32_t[::1] order = order_arr
    cdef int32_t[::1] inverse = inverse_arr
    new_indptr_arr = np.zeros(max(n, 0) + 1, dtype=np.int64)
    cdef int64_t[::1] new_indptr = new_indptr_arr
    with nogil:
        for i in range(n):
            start[indptr[i + 1] - indptr[i]] += 1
        for d in range(dmax, -1, -1):  # the positions of each degree, highest first
            p = start[d]
            for c in range(running, running + p):  # the new rows of degree d
                new_indptr[c + 1] = new_indptr[c] + d
            start[d] = running
            running = running + p
        for i in range(n):
            d = indptr[i + 1] - indptr[i]
            p = start[d]
            start[d] = p + 1
            order[p] = <int32_t>i
            inverse[i] = <int32_t>p
    return order_arr, inverse_arr, new_indptr_arr


def rowblock_cuts(const index_t[::1] indptr, int64_t block_cost, int64_t long_row):
    """The sorted distinct row cuts of the GPU's row blocks, in one pass: 0 and n; for each multiple
    ``t`` of ``block_cost`` below ``nnz + n``, the first row r with ``indptr[r] + r >= t``; and r, r + 1
    around every row longer than ``long_row`` (graphkern.expm.plans._rowblock_tasks)."""
    cdef Py_ssize_t n = indptr.shape[0] - 1, r
    cdef int64_t total = <int64_t>indptr[n] + n, target = block_cost, last = 0, k = 1
    cuts = np.empty(n + 2 + 2 * (total // max(block_cost, 1) + 1), dtype=np.int64) if n > 0 else np.zeros(2, np.int64)
    cdef int64_t[::1] out = cuts
    if n <= 0:
        return cuts[:1 if n == 0 else 0]
    out[0] = 0
    with nogil:
        for r in range(n):
            if target < total and <int64_t>indptr[r] + r >= target:
                if r != last:
                    out[k] = r
                    k += 1
                    last = r
                while target < total and <int64_t>indptr[r] + r >= target:
                    target += block_cost
            if <int64_t>(indptr[r + 1] - indptr[r]) > long_row:
                if r != last:
                    out[k] = r
                    k += 1
                    last = r
                out[k] = r + 1
                k += 1
                last = r + 1
        if target < total and last != n:  # targets past the last row's start: searchsorted gives n
            out[k] = n
            k += 1
            last = n
        if last != n:
            out[k] = n
            k += 1
    return cuts[:k]


def magnitude_range(const double[::1] values, int n_threads):
    """``(smallest nonzero |v|, largest |v|)`` of ``values`` in one parallel pass (inf and 0 when no
    value is nonzero): whether a matrix's entries span more than the Lanczos norms can hold."""
    cdef int64_t n = values.shape[0]
    cdef Py_ssize_t parts = max(1, min(4 * n_threads, n // HASH_BLOCK)), c
    cdef int64_t i
    cdef double a, low, high
    lows_arr = np.full(parts, np.inf)
    highs_arr = np.zeros(parts)
    cdef double[::1] lows = lows_arr, highs = highs_arr
    for c in prange(parts, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=parts > 1):
        low = lows[c]
        high = 0.0
        for i in range(n * c // parts, n * (c + 1) // parts):
            a = fabs(values[i])
            if a > high:
                high = a
            if 0.0 < a < low:
                low = a
        lows[c] = low
        highs[c] = high
    return float(lows_arr.min()), float(highs_arr.max())
