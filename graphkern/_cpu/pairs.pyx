# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Per-pair host work of the marginalized kernel's GPU solvers in O(pairs) compiled passes over
threads: the launch order (a counting sort), gathers and scatters by it, a Gram matrix's pairs."""

import numpy as np

cimport openmp
from cython.parallel cimport prange
from libc.stdlib cimport calloc, free
from libc.stdint cimport int32_t, int64_t, uint16_t

ctypedef fused item_t:
    int32_t
    int64_t
    float
    double

ctypedef fused out_t:
    float
    double


cdef inline uint16_t _key(double cost, double scale, bint positive) noexcept nogil:
    """The 16-bit launch key of ``cost``: 0 for the largest, 65535 for 0 (all 65535 when none is positive)."""
    return <uint16_t>(cost * scale + 65535.0) if positive else 65535


cdef inline double _pair_cost(const int64_t[:, ::1] pair_arr, Py_ssize_t i, const int64_t[::1] n1,
                              const int64_t[::1] n2, const int64_t[::1] w1, const int64_t[::1] w2) noexcept nogil:
    """``w1[a] w2[b] + n1[a] n2[b]`` of pair i = (a, b), summed in integers: the float64 value
    NumPy's ``w1[a].astype(float) * w2[b] + n1[a] * n2[b]`` gives while it is below 2^53."""
    cdef int64_t a = pair_arr[i, 0], b = pair_arr[i, 1]
    return <double>(w1[a] * w2[b] + n1[a] * n2[b])


cdef enum:
    SMALL_SORT = 8192  # below this many pairs the launch order is a stable sort of the keys, not a counting sort
    SORT_ITEMS = 65536  # pairs per thread of a counting sort: each thread's histogram has 65536 buckets
    TEAM_ITEMS = 8192  # items per thread of a gather, scatter or fill: a parallel region costs more on fewer
    CUT_BLOCK = 1 << 16  # pairs a thread sums at a time in balanced_cuts (the scan for a cut reads one block)


cdef int _threads(Py_ssize_t m, Py_ssize_t per_thread) noexcept nogil:
    """Threads for a pass over m items: one per ``per_thread``, at most omp_get_max_threads()."""
    cdef int nt = openmp.omp_get_max_threads()
    if m // per_thread < nt:
        nt = <int>(m // per_thread)
    return nt if nt > 1 else 1


cdef inline void _place(Py_ssize_t i, Py_ssize_t pos, int64_t[::1] order, const int64_t[:, ::1] pair_arr,
                        int64_t[::1] g1, int64_t[::1] g2, bint gather, int64_t[::1] positions,
                        bint place) noexcept nogil:
    """Pair i goes to slot ``pos`` of the launch order (and its graphs and place with it)."""
    order[pos] = i
    if place:
        positions[i] = pos
    if gather:
        g1[pos] = pair_arr[i, 0]
        g2[pos] = pair_arr[i, 1]


cdef int _stable_place(const uint16_t[::1] key, int nt, int64_t[::1] order, const int64_t[:, ::1] pair_arr,
                       int64_t[::1] g1, int64_t[::1] g2, bint gather, int64_t[::1] positions,
                       bint place) except -1 nogil:
    """``order = np.argsort(key, kind="stable")`` as a counting sort over ``nt`` contiguous runs of
    the pairs (each run's histogram, then every run places its pairs in index order), with
    ``g1, g2 = pair_arr[order].T`` written alongside when ``gather``, ``positions[order] = arange(m)``
    when ``place``."""
    cdef Py_ssize_t m = key.shape[0], i, lo, hi, pos
    cdef int t, k
    cdef int64_t run = 0
    cdef int64_t[::1] sorted_order
    cdef int64_t *counts
    if m < SMALL_SORT:  # a stable sort of a few keys costs less than 65536 buckets
        with gil:
            sorted_order = np.argsort(np.asarray(key), kind="stable").astype(np.int64, copy=False)
        for pos in range(m):
            _place(sorted_order[pos], pos, order, pair_arr, g1, g2, gather, positions, place)
        return 0
    counts = <int64_t *> calloc(<size_t>nt * 65536, sizeof(int64_t))
    if counts == NULL:
        with gil:
            raise MemoryError()
    try:
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static", chunksize=1):
            lo = m * t // nt
            hi = m * (t + 1) // nt
            for i in range(lo, hi):
                counts[<Py_ssize_t>t * 65536 + key[i]] += 1
        for k in range(65536):  # counts become each run's first slot per key
            for t in range(nt):
                pos = counts[<Py_ssize_t>t * 65536 + k]
                counts[<Py_ssize_t>t * 65536 + k] = run
                run = run + pos
        for t in prange(nt, nogil=True, num_threads=nt, schedule="static", chunksize=1):
            lo = m * t // nt
            hi = m * (t + 1) // nt
            for i in range(lo, hi):
                pos = counts[<Py_ssize_t>t * 65536 + key[i]]
                counts[<Py_ssize_t>t * 65536 + key[i]] = pos + 1
                _place(i, pos, order, pair_arr, g1, g2, gather, positions, place)
    finally:
        free(counts)
    return 0


def launch_order(const double[::1] cost):
    """``np.argsort(key.astype(np.uint16), kind="stable")`` for ``key = cost * (-65535 / max) + 65535``
    (all keys 65535 when the largest cost is 0), by counting: O(m), the same permutation."""
    cdef Py_ssize_t m = cost.shape[0], i
    cdef int nt = _threads(m, SORT_ITEMS), t
    cdef double top = 0.0, scale, local
    cdef double[::1] tops = np.zeros(nt)
    cdef uint16_t[::1] key = np.empty(m, dtype=np.uint16)
    order = np.empty(m, dtype=np.int64)
    cdef int64_t[:, ::1] no_pairs = np.empty((0, 2), dtype=np.int64)
    cdef int64_t[::1] no_out = np.empty(0, dtype=np.int64)
    for t in prange(nt, nogil=True, num_threads=nt, schedule="static", chunksize=1):
        local = 0.0
        for i in range(m * t // nt, m * (t + 1) // nt):
            if cost[i] > local:
                local = cost[i]
        tops[t] = local
    for t in range(nt):
        top = max(top, tops[t])
    scale = -65535.0 / top if top > 0 else 0.0
    for i in prange(m, nogil=True, num_threads=nt, schedule="static"):
        key[i] = _key(cost[i], scale, top > 0)
    _stable_place(key, nt, order, no_pairs, no_out, no_out, False, no_out, False)
    return order


def pair_plan(const int64_t[:, ::1] pair_arr, const int64_t[::1] n1, const int64_t[::1] n2,
              const int64_t[::1] w1, const int64_t[::1] w2, const int64_t[::1] f1, const int64_t[::1] f2,
              int64_t cross, int64_t[::1] positions=None):
    """The per-pair host work of one launch over pairs (a, b) = ``pair_arr[k]`` in three passes.

    The cost ``w1[a] w2[b] + n1[a] n2[b]`` orders the launch as :func:`launch_order` of those costs
    does (longest first, the same permutation); returns ``(order, g1, g2, largest size, total size,
    largest footprint)``: ``g1, g2`` the pairs' graphs in launch order, the sizes ``n1[a] n2[b]``,
    the footprint ``f1[a] + f2[b] + cross n1[a] n2[b]``.  ``n1, w1, f1`` (``n2, w2, f2``) have one
    entry per graph of the first (second) set; costs must stay below 2^53.  ``positions``: each pair's place."""
    cdef Py_ssize_t m = pair_arr.shape[0], i
    cdef Py_ssize_t n_first = n1.shape[0], n_second = n2.shape[0]
    cdef int nt = _threads(m, SORT_ITEMS), t
    cdef int64_t a, b, size, big, total, foot, bad
    cdef double top = 0.0, scale, local
    # per run: largest cost; largest size, total size, largest footprint, first pair out of range
    cdef double[::1] tops = np.zeros(nt)
    cdef int64_t[:, ::1] stats = np.zeros((nt, 4), dtype=np.int64)
    cdef uint16_t[::1] key = np.empty(m, dtype=np.uint16)
    if pair_arr.shape[1] != 2:
        raise ValueError(f"pair_arr must have shape (m, 2), got ({m}, {pair_arr.shape[1]})")
    if w1.shape[0] != n_first or f1.shape[0] != n_first or w2.shape[0] != n_second or f2.shape[0] != n_second:
        raise ValueError("n1, w1, f1 (and n2, w2, f2) must have one entry per graph")
    cdef bint place = positions is not None
    if place and positions.shape[0] != m:
        raise ValueError(f"positions has {positions.shape[0]} entries for {m} pairs")
    order = np.empty(m, dtype=np.int64)
    out1 = np.empty(m, dtype=np.int64)
    out2 = np.empty(m, dtype=np.int64)
    for t in prange(nt, nogil=True, num_threads=nt, schedule="static", chunksize=1):
        local = 0.0
        big = 0
        total = 0
        foot = 0
        bad = -1
        for i in range(m * t // nt, m * (t + 1) // nt):
            a = pair_arr[i, 0]
            b = pair_arr[i, 1]
            if a < 0 or a >= n_first or b < 0 or b >= n_second:
                if bad < 0:
                    bad = i
                continue
            size = n1[a] * n2[b]
            local = max(local, <double>(w1[a] * w2[b] + size))
            big = max(big, size)
            foot = max(foot, f1[a] + f2[b] + cross * size)
            total = total + size
        tops[t] = local
        stats[t, 0] = big
        stats[t, 1] = total
        stats[t, 2] = foot
        stats[t, 3] = bad
    big = total = foot = 0
    for t in range(nt):
        if stats[t, 3] >= 0:
            i = stats[t, 3]
            raise ValueError(f"pair_arr[{i}] = ({pair_arr[i, 0]}, {pair_arr[i, 1]}) names a graph out of range "
                             f"({n_first} and {n_second} graphs)")
        top = max(top, tops[t])
        big = max(big, stats[t, 0])
        total += stats[t, 1]
        foot = max(foot, stats[t, 2])
    scale = -65535.0 / top if top > 0 else 0.0
    for i in prange(m, nogil=True, num_threads=nt, schedule="static"):
        key[i] = _key(_pair_cost(pair_arr, i, n1, n2, w1, w2), scale, top > 0)
    _stable_place(key, nt, order, pair_arr, out1, out2, True, positions if place else out1, place)
    return order, out1, out2, int(big), int(total), int(foot)


def pair_costs(const int64_t[:, ::1] pair_arr, const int64_t[::1] n1, const int64_t[::1] n2,
               const int64_t[::1] w1, const int64_t[::1] w2):
    """Each pair's solve cost as :func:`pair_plan` orders by it, ``w1[a] w2[b] + n1[a] n2[b]``, over threads."""
    cdef Py_ssize_t m = pair_arr.shape[0], i
    out = np.empty(m)
    cdef double[::1] o = out
    for i in prange(m, nogil=True, num_threads=_threads(m, TEAM_ITEMS), schedule="static"):
        o[i] = _pair_cost(pair_arr, i, n1, n2, w1, w2)
    return out


def balanced_cuts(const int64_t[:, ::1] pair_arr, const int64_t[::1] n1, const int64_t[::1] n2,
                  const int64_t[::1] w1, const int64_t[::1] w2, int parts):
    """Boundaries ``b`` (int64, ``parts + 1`` of them) cutting the pairs, in their order, into
    ``parts`` contiguous runs of about equal :func:`pair_costs` sums: run ``k`` is pairs
    ``b[k]:b[k + 1]``, and the pair at which the running sum first reaches ``k / parts`` of the total
    starts run ``k`` (NumPy's ``searchsorted(cumsum(costs), total * k / parts)``; the costs are whole
    numbers, so their sums agree exactly below 2^53).  Two passes computing each cost where it is
    needed, no array of them: the sums of blocks of pairs over threads, then a scan inside the block
    each cut falls in."""
    if parts < 1:
        raise ValueError(f"balanced_cuts needs at least one run, got parts={parts}")
    cdef Py_ssize_t m = pair_arr.shape[0], n_blocks = (m + CUT_BLOCK - 1) // CUT_BLOCK, blk, i, hi
    cuts_out = np.zeros(parts + 1, np.int64)
    cdef int64_t[::1] cuts = cuts_out
    cuts[parts] = m
    sums_out = np.zeros(n_blocks + 1, np.float64)
    cdef double[::1] before = sums_out  # before[blk]: the costs of the pairs before block blk
    cdef double acc, target
    cdef int k
    for blk in prange(n_blocks, nogil=True, num_threads=_threads(m, TEAM_ITEMS), schedule="static"):
        acc = 0.0
        for i in range(blk * CUT_BLOCK, min(m, (blk + 1) * CUT_BLOCK)):
            acc = acc + _pair_cost(pair_arr, i, n1, n2, w1, w2)
        before[blk + 1] = acc
    for blk in range(n_blocks):
        before[blk + 1] += before[blk]
    if m == 0 or before[n_blocks] <= 0:
        return np.linspace(0, m, parts + 1).astype(np.int64)
    blk = 0
    for k in range(1, parts):
        target = before[n_blocks] * k / parts
        while blk < n_blocks - 1 and before[blk + 1] < target:
            blk += 1
        acc, i = before[blk], blk * CUT_BLOCK
        hi = min(m, (blk + 1) * CUT_BLOCK)
        while i < hi:
            acc += _pair_cost(pair_arr, i, n1, n2, w1, w2)
            if acc >= target:
                break
            i += 1
        cuts[k] = i
    return cuts_out


def take(const item_t[::1] values, const int64_t[::1] order):
    """``values[order]`` over threads."""
    cdef Py_ssize_t m = order.shape[0], i
    out = np.empty(m, dtype=np.asarray(values).dtype)
    cdef item_t[::1] o = out
    for i in prange(m, nogil=True, num_threads=_threads(m, TEAM_ITEMS), schedule="static"):
        o[i] = values[order[i]]
    return out


def scatter(item_t[::1] out, const int64_t[::1] order, const item_t[::1] values):
    """``out[order] = values`` over threads (``order`` a permutation)."""
    cdef Py_ssize_t m = order.shape[0], i
    if values.shape[0] != m or out.shape[0] < m:
        raise ValueError(f"scatter of {values.shape[0]} values by {m} indices into {out.shape[0]}")
    for i in prange(m, nogil=True, num_threads=_threads(m, TEAM_ITEMS), schedule="static"):
        out[order[i]] = values[i]
    return np.asarray(out)


def upper_pairs(Py_ssize_t n):
    """The pairs (i, j), i <= j < n, row by row (the order of ``np.triu_indices(n)``), shape (m, 2)."""
    pairs = np.empty((n * (n + 1) // 2, 2), dtype=np.int64)
    cdef int64_t[:, ::1] p = pairs
    cdef Py_ssize_t i, j, start
    for i in prange(n, nogil=True, num_threads=_threads(n * (n + 1) // 2, TEAM_ITEMS), schedule="dynamic", chunksize=16):
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
    for i in prange(n, nogil=True, num_threads=_threads(K.shape[0], TEAM_ITEMS), schedule="dynamic", chunksize=16):
        start = i * n - i * (i - 1) // 2
        for j in range(i, n):
            out[i, j] = <out_t>K[start + j - i]
            out[j, i] = <out_t>K[start + j - i]
    return np.asarray(out)


def symmetric_fill_rows(const double[:, ::1] G, double[:, :, ::1] out):
    """``out[i, j, :] = out[j, i, :] = G[p]`` for the p-th pair of :func:`upper_pairs`: the fill of
    :func:`symmetric_fill` for a row per pair (a gradient's derivatives)."""
    cdef Py_ssize_t n = out.shape[0], w = out.shape[2], i, j, k, start
    if out.shape[1] != n or G.shape[0] != n * (n + 1) // 2 or G.shape[1] != w:
        raise ValueError(f"{G.shape[0]} rows of {G.shape[1]} do not fill the upper triangle of a {n} x "
                         f"{out.shape[1]} x {w} array")
    for i in prange(n, nogil=True, num_threads=_threads(G.shape[0] * w, TEAM_ITEMS), schedule="dynamic", chunksize=16):
        start = i * n - i * (i - 1) // 2
        for j in range(i, n):
            for k in range(w):
                out[i, j, k] = G[start + j - i, k]
                out[j, i, k] = G[start + j - i, k]
    return np.asarray(out)
