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

Around the solve: :func:`hash_words` (the matrix cache's content key), and the host passes of the
GPU's setup: :func:`rowblock_tasks` (its SpMV plan) and :func:`rebased_indptr` (a device's row
pointers), each a few parallel passes at memory speed.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.math cimport INFINITY, fabs

import numpy as np

ctypedef fused real:
    float
    double

ctypedef fused index_t:
    int32_t
    int64_t

cdef enum:
    HASH_BLOCK = 65536  # words per parallel block of the hash
    ROWS_PER_BLOCK = 16384  # fewest rows per parallel block of the GPU setup's passes


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


# ----------------------------------------------------------------------------- host passes of the GPU setup

cdef Py_ssize_t _row_blocks(int64_t n, int n_threads) noexcept:
    return max(1, min(4 * n_threads, n // ROWS_PER_BLOCK))


cdef inline int64_t _next_target(const index_t* indptr, int64_t r, int64_t cost) noexcept nogil:
    """The first multiple of ``cost`` past ``indptr[r] + r``: where the next block by cost starts."""
    return ((indptr[r] + r) // cost + 1) * cost


def rowblock_tasks(const index_t[::1] indptr, int64_t block_cost, int64_t long_row, int64_t long_segment,
                   int64_t stream_kind, int64_t long_kind, int n_threads):
    """The task table of the GPU's row blocks (graphkern.expm.plans._rowblock_tasks) in two parallel
    passes over the rows: ``(tasks, n_segments, n_long)``, tasks int64 of width 8 in row order.

    A block starts at 0, at the first row r with ``indptr[r] + r`` at or past each multiple of
    ``block_cost`` (what a binary search over ``indptr + row`` finds), and on both sides of every row
    longer than ``long_row``, so each start is decided by rows r - 1 and r alone: each range of
    rows counts its blocks, the counts give its first task, and it writes its blocks.  A block is a
    stream task ``(stream_kind, r0, r1, indptr[r0], indptr[r1], 0, 0, 0)``; a long row is split into
    segments of ``long_segment`` entries, ``(long_kind, row, e0, e1, first segment of the row,
    segment, segments of the row, long row)``."""
    cdef int64_t n = max(indptr.shape[0] - 1, 0)
    if n == 0:
        return np.zeros((1, 8), dtype=np.int64), 0, 0  # one empty block keeps the grid valid
    cdef Py_ssize_t blocks = _row_blocks(n, n_threads), t
    cdef int64_t r, d, k, j, e0, start, w, tasks_before, longs, segments, lo, hi, target, previous
    cdef bint done
    cdef const index_t* ip = &indptr[0]
    offsets_arr = np.zeros((3, blocks + 1), dtype=np.int64)
    cdef int64_t[:, ::1] offsets = offsets_arr
    for t in prange(blocks, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=blocks > 1):
        tasks_before = 0
        longs = 0
        segments = 0
        lo = n * t // blocks
        target = _next_target(ip, lo - 1, block_cost) if lo else 0
        previous = ip[lo] - ip[lo - 1] if lo else 0
        for r in range(lo, n * (t + 1) // blocks):
            d = ip[r + 1] - ip[r]
            if ip[r] + r >= target or d > long_row or previous > long_row:  # a block starts at r
                if d > long_row:
                    k = (d + long_segment - 1) // long_segment
                    tasks_before = tasks_before + k
                    longs = longs + 1
                    segments = segments + k
                else:
                    tasks_before = tasks_before + 1
            if ip[r] + r >= target:
                target = _next_target(ip, r, block_cost)
            previous = d
        offsets[0, t + 1] = tasks_before
        offsets[1, t + 1] = longs
        offsets[2, t + 1] = segments
    for t in range(blocks):
        for j in range(3):
            offsets[j, t + 1] += offsets[j, t]
    tasks_arr = np.zeros((offsets[0, blocks], 8), dtype=np.int64)
    cdef int64_t[:, ::1] tasks = tasks_arr
    for t in prange(blocks, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=blocks > 1):
        w = offsets[0, t]
        longs = offsets[1, t]
        segments = offsets[2, t]
        lo = n * t // blocks
        hi = n * (t + 1) // blocks
        target = _next_target(ip, lo - 1, block_cost) if lo else 0
        previous = ip[lo] - ip[lo - 1] if lo else 0
        start = -1
        done = False
        r = lo
        while not done:
            d = ip[r + 1] - ip[r] if r < n else 0
            if r == n or ip[r] + r >= target or d > long_row or previous > long_row:
                if start >= 0:  # the block [start, r)
                    k = ip[start + 1] - ip[start]
                    if k > long_row:
                        k = (k + long_segment - 1) // long_segment
                        for j in range(k):
                            e0 = ip[start] + j * long_segment
                            tasks[w, 0] = long_kind
                            tasks[w, 1] = start
                            tasks[w, 2] = e0
                            tasks[w, 3] = min(e0 + long_segment, <int64_t>ip[start + 1])
                            tasks[w, 4] = segments
                            tasks[w, 5] = j
                            tasks[w, 6] = k
                            tasks[w, 7] = longs
                            w = w + 1
                        segments = segments + k
                        longs = longs + 1
                    else:
                        tasks[w, 0] = stream_kind
                        tasks[w, 1] = start
                        tasks[w, 2] = r
                        tasks[w, 3] = ip[start]
                        tasks[w, 4] = ip[r]
                        w = w + 1
                done = r >= hi
                start = r
            if r < n and ip[r] + r >= target:
                target = _next_target(ip, r, block_cost)
            previous = d
            r = r + 1
    return tasks_arr, int(offsets[2, blocks]), int(offsets[1, blocks])


def rebased_indptr(const index_t[::1] indptr, int64_t row0, int64_t row1, int64_t base, bint wide, int n_threads):
    """``indptr[row0:row1 + 1] - base`` as int64 (``wide``) or int32, in one parallel pass."""
    cdef int64_t count = row1 - row0 + 1, i
    out = np.empty(count, dtype=np.int64 if wide else np.int32)
    cdef int64_t[::1] wide_out
    cdef int32_t[::1] narrow_out
    if wide:
        wide_out = out
        for i in prange(count, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=count > 65536):
            wide_out[i] = indptr[row0 + i] - base
    else:
        narrow_out = out
        for i in prange(count, nogil=True, schedule="static", num_threads=n_threads, use_threads_if=count > 65536):
            narrow_out[i] = <int32_t>(indptr[row0 + i] - base)
    return out


def magnitude_range(const double[::1] values, int n_threads):
    """``(smallest nonzero |v|, largest |v|)`` of ``values`` in one parallel pass (inf and 0 when no
    value is nonzero; the largest is inf where a value is inf or NaN): the scale of a matrix, whether
    its entries span more than the Lanczos norms can hold, and whether every one is finite."""
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
            if a > high or a != a:
                high = INFINITY if a != a else a
            if 0.0 < a < low:
                low = a
        lows[c] = low
        highs[c] = high
    return float(lows_arr.min()), float(highs_arr.max())
