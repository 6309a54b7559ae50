# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""All-pairs shortest paths of many graphs, and their (label, label, length) triplet counts.

Graphs come packed: ``node_offsets`` (where each graph's vertices begin), ``indptr`` (each graph's
local CSR row pointers, ``n_g + 1`` entries per graph, laid end to end, entries counted from the
graph's first edge ``edge_offsets[g]``), ``indices`` (local column indices) and ``weights``
(float64, or None for hop counts).  One OpenMP pass runs over the graphs; per graph, one
single-source search per vertex: breadth-first for hop counts, Dijkstra with a binary heap for
weights.  Lengths are always taken from the search of the smaller endpoint (``a < b``), so a pair
has one length even where floating-point sums along the two directions would differ.  Self-loops
never shorten a path and are ignored.  Scratch is allocated before the parallel region, one slice
per thread.
"""

from cython.parallel cimport parallel, prange, threadid
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy, memmove
from libcpp.algorithm cimport sort
from libcpp.utility cimport pair
from libcpp.vector cimport vector

import numpy as np


ctypedef pair[int64_t, int64_t] Key          # (label pair code, length's bits)
ctypedef pair[double, int32_t] HeapItem      # (-distance, vertex): std heaps are max-heaps


cdef extern from "<algorithm>" namespace "std" nogil:
    void push_heap[It](It first, It last)
    void pop_heap[It](It first, It last)


# per-thread std::vector headers (24 bytes each) are kept this many apart: packed side by side,
# one thread's push_back would keep moving the cache line its neighbours' headers sit in
cdef enum:
    SPREAD = 8
# per-thread scratch rows are padded to this many elements (a multiple of the 64-byte line)
cdef enum:
    ROW_ALIGN = 16


cdef struct Packed:
    const int64_t* node_offsets
    const int64_t* edge_offsets
    const int64_t* indptr
    const int32_t* indices
    const double* weights


cdef inline int64_t length_bits(double d) noexcept nogil:
    """The bit pattern of ``d`` (+0.0 for -0.0): orders non-negative lengths as their values do."""
    cdef double x = d + 0.0
    cdef int64_t bits
    memcpy(&bits, &x, 8)
    return bits


cdef void single_source(const Packed* p, int64_t g, int32_t s, double* dist, int32_t* queue,
                        vector[HeapItem]* heap) noexcept nogil:
    """``dist[t]``: the shortest-path length from ``s`` to every vertex of graph ``g`` (+inf: none)."""
    cdef int64_t n = p.node_offsets[g + 1] - p.node_offsets[g]
    cdef const int64_t* rp = p.indptr + p.node_offsets[g] + g
    cdef const int32_t* col = p.indices + p.edge_offsets[g]
    cdef const double* w = NULL
    cdef int64_t i, k, head = 0, tail = 0
    cdef int32_t u, v
    cdef double du, dv
    for i in range(n):
        dist[i] = INFINITY
    dist[s] = 0.0
    if p.weights == NULL:
        queue[tail] = s
        tail += 1
        while head < tail:
            u = queue[head]
            head += 1
            du = dist[u] + 1.0
            for k in range(rp[u], rp[u + 1]):
                v = col[k]
                if dist[v] == INFINITY:
                    dist[v] = du
                    queue[tail] = v
                    tail += 1
        return
    w = p.weights + p.edge_offsets[g]
    heap.clear()
    heap.push_back(HeapItem(-0.0, s))
    while heap.size() > 0:
        pop_heap(heap.begin(), heap.end())
        du = -heap.back().first
        u = heap.back().second
        heap.pop_back()
        if du > dist[u]:
            continue
        for k in range(rp[u], rp[u + 1]):
            v = col[k]
            dv = du + w[k]
            if dv < dist[v]:
                dist[v] = dv
                heap.push_back(HeapItem(-dv, v))
                push_heap(heap.begin(), heap.end())


cdef class Searches:
    """Per-thread scratch of :func:`single_source`, allocated before the parallel region."""

    cdef double[:, ::1] dist
    cdef int32_t[:, ::1] queue
    cdef vector[vector[HeapItem]] heaps

    def __cinit__(self, node_offsets, int n_threads):
        n_max = int(np.diff(node_offsets).max()) if len(node_offsets) > 1 else 0
        width = -(-max(n_max, 1) // ROW_ALIGN) * ROW_ALIGN
        self.dist = np.empty((n_threads, width))
        self.queue = np.empty((n_threads, width), np.int32)
        self.heaps = vector[vector[HeapItem]](n_threads * SPREAD)

    cdef inline void run(self, const Packed* p, int64_t g, int32_t source, int t) noexcept nogil:
        single_source(p, g, source, &self.dist[t, 0], &self.queue[t, 0], &self.heaps[t * SPREAD])


cdef Packed _packed(node_offsets, edge_offsets, indptr, indices, weights):
    cdef Packed p
    cdef const int64_t[::1] no = node_offsets
    cdef const int64_t[::1] eo = edge_offsets
    cdef const int64_t[::1] ip = indptr
    cdef const int32_t[::1] ix = indices
    cdef const double[::1] wt
    p.node_offsets = &no[0]
    p.edge_offsets = &eo[0]
    p.indptr = &ip[0]
    p.indices = &ix[0] if ix.shape[0] else NULL
    p.weights = NULL
    if weights is not None:
        wt = weights
        p.weights = &wt[0] if wt.shape[0] else <const double*>p.edge_offsets  # never read: no edges
    return p


def shortest_paths(node_offsets, edge_offsets, indptr, indices, weights, int n_threads):
    """The shortest-path graphs of a packed batch as unordered paths ``a < b``.

    Returns ``(path_offsets, ends, lengths)``: int64 ``(G + 1,)``, int32 ``(P, 2)`` (sorted by
    ``a`` then ``b`` within each graph), float64 ``(P,)``; unreachable pairs are left out.
    """
    cdef Packed p = _packed(node_offsets, edge_offsets, indptr, indices, weights)
    cdef int64_t G = len(node_offsets) - 1
    sizes = np.diff(node_offsets)
    bound = np.zeros(G + 1, np.int64)
    np.cumsum(sizes * (sizes - 1) // 2, out=bound[1:])
    cdef int64_t[::1] start = bound
    cdef int64_t[::1] found = np.zeros(G, np.int64)
    ends_all = np.empty((int(bound[G]), 2), np.int32)
    lengths_all = np.empty(int(bound[G]), np.float64)
    cdef int32_t[:, ::1] ends = ends_all
    cdef double[::1] lengths = lengths_all
    cdef Searches s = Searches(node_offsets, n_threads)
    cdef int64_t g, n, at
    cdef int32_t a, b
    cdef int t
    with nogil, parallel(num_threads=n_threads):
        t = threadid()
        for g in prange(G, schedule="dynamic", chunksize=16):
            n = p.node_offsets[g + 1] - p.node_offsets[g]
            at = start[g]
            for a in range(n - 1):
                s.run(&p, g, a, t)
                for b in range(a + 1, n):
                    if s.dist[t, b] < INFINITY:
                        ends[at, 0] = a
                        ends[at, 1] = b
                        lengths[at] = s.dist[t, b] + 0.0
                        at = at + 1
            found[g] = at - start[g]
    path_offsets = np.zeros(G + 1, np.int64)
    np.cumsum(np.asarray(found), out=path_offsets[1:])
    cdef int64_t[::1] po = path_offsets
    with nogil:  # move each graph's paths down to their final place (offsets never grow)
        for g in range(G):
            if po[g] != start[g] and found[g] > 0:
                memmove(&ends[po[g], 0], &ends[start[g], 0], found[g] * 2 * sizeof(int32_t))
                memmove(&lengths[po[g]], &lengths[start[g]], found[g] * sizeof(double))
    P = int(path_offsets[G])
    return path_offsets, ends_all[:P].copy() if P < len(lengths_all) else ends_all, lengths_all[:P].copy()


def triplet_counts(node_offsets, edge_offsets, indptr, indices, weights, labels, int64_t n_labels,
                   int n_threads):
    """Each graph's histogram of ``(label a, label b, length)`` over ordered pairs of distinct
    vertices with a path (both directions of each unordered path ``a < b``, one length).

    ``labels``: int64, a label id in ``[0, n_labels)`` per vertex of the batch.  Returns
    ``(row_offsets, label_pairs, lengths, counts)``: per graph its distinct triplets (label pair
    code ``la * n_labels + lb``, length) with their counts (int64), in no particular order.
    Unordered paths are counted once under their labels in increasing order (one sort of half
    the ordered pairs), then written out in both orders.
    """
    cdef Packed p = _packed(node_offsets, edge_offsets, indptr, indices, weights)
    cdef const int64_t[::1] lab = labels
    cdef int64_t G = len(node_offsets) - 1
    cdef Searches s = Searches(node_offsets, n_threads)
    # thread t's vectors at t * SPREAD; out_*: its graphs' triplets, graph after graph
    cdef vector[vector[Key]] keys = vector[vector[Key]](n_threads * SPREAD)
    cdef vector[vector[Key]] out_keys = vector[vector[Key]](n_threads * SPREAD)
    cdef vector[vector[int64_t]] out_counts = vector[vector[int64_t]](n_threads * SPREAD)
    cdef int64_t[::1] owner = np.empty(G, np.int64)
    cdef int64_t[::1] begin = np.empty(G, np.int64)
    cdef int64_t[::1] found = np.empty(G, np.int64)
    cdef int64_t g, n, base, i, j, la, lb, x, y, run
    cdef int32_t a, b
    cdef int t, v
    with nogil, parallel(num_threads=n_threads):
        t = threadid()
        v = t * SPREAD
        for g in prange(G, schedule="dynamic", chunksize=16):
            n = p.node_offsets[g + 1] - p.node_offsets[g]
            base = p.node_offsets[g]
            keys[v].clear()
            for a in range(n - 1):
                s.run(&p, g, a, t)
                la = lab[base + a]
                for b in range(a + 1, n):
                    if s.dist[t, b] < INFINITY:
                        lb = lab[base + b]
                        keys[v].push_back(Key(min(la, lb) * n_labels + max(la, lb), length_bits(s.dist[t, b])))
            sort(keys[v].begin(), keys[v].end())
            owner[g] = v
            begin[g] = out_keys[v].size()
            i = 0
            while i < <int64_t>keys[v].size():
                j = i + 1
                while j < <int64_t>keys[v].size() and keys[v][j] == keys[v][i]:
                    j = j + 1
                run = j - i
                x = keys[v][i].first // n_labels
                y = keys[v][i].first % n_labels
                if x == y:
                    out_keys[v].push_back(keys[v][i])
                    out_counts[v].push_back(2 * run)
                else:
                    out_keys[v].push_back(keys[v][i])
                    out_counts[v].push_back(run)
                    out_keys[v].push_back(Key(y * n_labels + x, keys[v][i].second))
                    out_counts[v].push_back(run)
                i = j
            found[g] = <int64_t>out_keys[v].size() - begin[g]
    row_offsets = np.zeros(G + 1, np.int64)
    np.cumsum(np.asarray(found), out=row_offsets[1:])
    cdef int64_t[::1] ro = row_offsets
    cdef int64_t F = ro[G]
    pairs_out = np.empty(F, np.int64)
    bits_out = np.empty(F, np.int64)
    counts_out = np.empty(F, np.int64)
    cdef int64_t[::1] po = pairs_out
    cdef int64_t[::1] bo = bits_out
    cdef int64_t[::1] co = counts_out
    with nogil:
        for g in range(G):
            t = owner[g]
            for i in range(found[g]):
                po[ro[g] + i] = out_keys[t][begin[g] + i].first
                bo[ro[g] + i] = out_keys[t][begin[g] + i].second
                co[ro[g] + i] = out_counts[t][begin[g] + i]
    return row_offsets, pairs_out, bits_out.view(np.float64), counts_out


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
