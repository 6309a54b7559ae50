# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""All-pairs shortest paths of many graphs, and their (label, label, length) triplet counts.

Graphs come packed: ``node_offsets`` (where each graph's vertices begin), ``indptr`` (each graph's
local CSR row pointers, ``n_g + 1`` entries per graph, laid end to end, entries counted from the
graph's first edge ``edge_offsets[g]``), ``indices`` (local column indices) and ``weights``
(float64, or None for hop counts); :func:`pack` lays a list of Graphs out so, checks included, in
one pass over their arrays.  One OpenMP pass runs over the graphs; per graph, one single-source
search per vertex: breadth-first for hop counts (on bit sets up to 64 vertices), Dijkstra with a
binary heap for weights.  Lengths are always taken from the search of the smaller endpoint
(``a < b``), so a pair has one length even where floating-point sums along the two directions
would differ.  Self-loops never shorten a path and are ignored.  Scratch is allocated before the
parallel region, one slice per thread.
"""

cimport numpy as cnp
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cython.parallel cimport parallel, prange, threadid
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove, memset
from libcpp.algorithm cimport sort
from libcpp.utility cimport pair
from libcpp.vector cimport vector

import numpy as np

cnp.import_array()

ctypedef pair[int64_t, int64_t] Key          # (label pair code, length's bits)
ctypedef pair[Key, int64_t] Item             # a triplet and its count
ctypedef pair[double, int32_t] HeapItem      # (-distance, vertex): std heaps are max-heaps


cdef extern from "<algorithm>" namespace "std" nogil:
    void push_heap[It](It first, It last)
    void pop_heap[It](It first, It last)
    It unique[It](It first, It last)
    It lower_bound[It, T](It first, It last, const T& value)


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


cdef extern from *:
    int count_trailing_zeros "__builtin_ctzll"(unsigned long long x) nogil


cdef inline uint64_t next_level(const uint64_t* adjacent, uint64_t frontier, uint64_t seen) noexcept nogil:
    """The vertices one step beyond ``frontier`` not in ``seen``: the union of its rows, less ``seen``."""
    cdef uint64_t level = 0
    while frontier:
        level |= adjacent[count_trailing_zeros(frontier)]
        frontier &= frontier - 1
    return level & ~seen


cdef void bit_search(const uint64_t* adjacent, int64_t n, int32_t s, double* dist) noexcept nogil:
    """Breadth-first search of a graph of at most 64 vertices as bit sets: ``adjacent[u]`` holds
    ``u``'s neighbours, a level is the union of its frontier's rows less the vertices seen."""
    cdef uint64_t seen = (<uint64_t>1) << s, frontier = seen, rest
    cdef double d = 0.0
    cdef int64_t i
    for i in range(n):
        dist[i] = INFINITY
    dist[s] = 0.0
    while frontier:
        d += 1.0
        frontier = next_level(adjacent, frontier, seen)
        seen |= frontier
        rest = frontier
        while rest:
            dist[count_trailing_zeros(rest)] = d
            rest &= rest - 1


cdef class Searches:
    """Per-thread scratch of :func:`single_source`, allocated before the parallel region; unweighted
    graphs of at most 64 vertices are searched as bit sets (:func:`bit_search`), their rows built
    once per graph."""

    cdef double[:, ::1] dist
    cdef int32_t[:, ::1] queue
    cdef uint64_t[:, ::1] adjacent
    cdef int64_t[::1] built  # the graph whose rows thread t's ``adjacent`` holds (at t * SPREAD)
    cdef vector[vector[HeapItem]] heaps
    cdef int64_t n_max  # the most vertices of a graph of the batch

    def __cinit__(self, const int64_t[::1] node_offsets, int n_threads):
        cdef Py_ssize_t g
        self.n_max = 0
        for g in range(node_offsets.shape[0] - 1):
            self.n_max = max(self.n_max, node_offsets[g + 1] - node_offsets[g])
        width = (max(self.n_max, 1) + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN
        self.dist = np.empty((n_threads, width))
        self.queue = np.empty((n_threads, width), np.int32)
        self.adjacent = np.empty((n_threads, 64), np.uint64)
        self.built = np.full(n_threads * SPREAD, -1, np.int64)
        self.heaps = vector[vector[HeapItem]](n_threads * SPREAD)

    cdef inline const uint64_t* rows(self, const Packed* p, int64_t g, int t) noexcept nogil:
        """Thread ``t``'s bit-set rows of unweighted graph ``g`` (at most 64 vertices), built once."""
        cdef int64_t n = p.node_offsets[g + 1] - p.node_offsets[g], u, k
        cdef const int64_t* rp
        cdef const int32_t* col
        cdef uint64_t row
        if self.built[t * SPREAD] != g:
            rp = p.indptr + p.node_offsets[g] + g
            col = p.indices + p.edge_offsets[g]
            for u in range(n):
                row = 0
                for k in range(rp[u], rp[u + 1]):
                    row |= (<uint64_t>1) << col[k]
                self.adjacent[t, u] = row
            self.built[t * SPREAD] = g
        return &self.adjacent[t, 0]

    cdef inline void run(self, const Packed* p, int64_t g, int32_t source, int t) noexcept nogil:
        if p.weights != NULL or p.node_offsets[g + 1] - p.node_offsets[g] > 64:
            single_source(p, g, source, &self.dist[t, 0], &self.queue[t, 0], &self.heaps[t * SPREAD])
        else:
            bit_search(self.rows(p, g, t), p.node_offsets[g + 1] - p.node_offsets[g], source, &self.dist[t, 0])


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


# what pack reports, in the order of its ``problems`` array
cdef enum:
    NOT_GRAPH = 0
    STRUCTURE = 1
    WEIGHT = 2
    LABEL = 3
# cells of a thread's triplet table in triplet_counts (2 MiB)
cdef enum:
    TABLE_CELLS = 1 << 18
# entries (row pointers, column indices, labels; triplets) a thread of a copying pass is started
# for: about a millisecond of copying, well above what starting a team costs
cdef enum:
    PACK_PER_THREAD = 1 << 18
# triplets a thread of triplet_counts' copy into the output arrays is started for
cdef enum:
    COPY_PER_THREAD = 1 << 12
# a triplet's two label ids in one key: ``la << LABEL_BITS | lb`` orders as ``(la, lb)`` does
cdef enum:
    LABEL_BITS = 32
cdef int64_t LABEL_MASK = (<int64_t>1 << LABEL_BITS) - 1


ctypedef const int64_t* Column
ctypedef PyObject* Borrowed


cdef struct Source:
    const void* indptr       # int32 or int64 (``wide``), n + 1 entries
    const int32_t* indices
    const double* weights    # NULL: unweighted
    int64_t n
    int64_t nnz
    bint wide


cdef inline object _get(object mapping, object key):
    """``mapping.get(key)`` for a dict (or a subclass that keeps dict's lookup), without a method call."""
    cdef PyObject* found = PyDict_GetItem(mapping, key)
    return None if found == NULL else <object>found


cdef extern from *:
    void prefetch "__builtin_prefetch"(const void* address) nogil


cdef inline PyObject* _hold(object obj):
    """A new reference to ``obj`` as a pointer (the caller gives it back), its first two cache lines
    (an array's header) asked for from memory."""
    cdef PyObject* p = <PyObject*>obj
    Py_INCREF(obj)
    prefetch(p)
    prefetch(<char*>p + 64)
    return p


cdef object _as_c(object arr, int typenum, list keep):
    """``arr`` itself when it is a C-contiguous array of ``typenum``, else a converted copy kept in ``keep``."""
    if cnp.PyArray_Check(arr) and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_TYPE(arr) == typenum:
        return arr
    arr = np.ascontiguousarray(arr, cnp.PyArray_DescrFromType(typenum))
    keep.append(arr)
    return arr


def pack(list graphs, graph_type, tuple columns, int n_threads):
    """Graphs laid end to end as :func:`shortest_paths` and :func:`triplet_counts` read them, in one
    pass over their arrays (parallel over the graphs when there are many entries).

    ``graphs``: ``graph_type`` (:class:`graphkern.Graph`) objects; ``columns``: names of integer node
    label columns.  Returns ``(node_offsets, edge_offsets, indptr, indices, weights, labels,
    problems)``: int64 offsets, ``indptr`` int64 (each graph's ``n + 1`` local row pointers),
    ``indices`` int32, ``weights`` float64 (ones for an unweighted graph among weighted ones) or
    None when no graph is weighted, ``labels`` int64 ``(N, len(columns))``.  Every graph's row
    pointers and column indices are checked on the way, also those of graphs known valid: the
    check costs less than reading each graph's cache of what is known of it.  Every weight is
    checked to be finite and non-negative.  ``problems`` (int64, 4): the first item that is not a
    ``graph_type`` (then nothing else is filled in), the first graph whose row pointers or column
    indices are invalid, the first stored entry of the batch with a negative or non-finite weight,
    the first graph lacking a column or holding one that is not 1-D integer; -1 where there is
    none.  The caller raises on any problem: the arrays are not to be used then.
    """
    cdef Py_ssize_t G = len(graphs), k = len(columns), g, c
    cdef vector[Source] src = vector[Source](G)
    cdef vector[Column] lab = vector[Column](G * k)
    problems_out = np.full(4, -1, np.int64)
    cdef int64_t[::1] problems = problems_out
    cdef list keep = []
    cdef object graph, arr, node_labels
    cdef bint weighted = False
    cdef Source* s
    # first each graph's arrays (held: a conversion below may run Python code), their headers asked
    # for on the way (a fresh graph's arrays are scattered over memory: read one by one, each header
    # would be a wait of its own)
    cdef Py_ssize_t per = 3 + k, acquired = 0
    cdef vector[Borrowed] held = vector[Borrowed](G * per)
    try:
        for g in range(G):
            graph = graphs[g]
            if not isinstance(graph, graph_type):
                problems[NOT_GRAPH] = g
                return None, None, None, None, None, None, problems_out
            held[acquired] = _hold(graph._indptr)
            acquired += 1
            held[acquired] = _hold(graph._indices)
            acquired += 1
            held[acquired] = _hold(graph._weights)
            acquired += 1
            if k:
                node_labels = graph._node_labels
                for c in range(k):
                    held[acquired] = _hold(_get(node_labels, columns[c]))
                    acquired += 1
        for g in range(G * per):  # then their shapes and first entries
            if cnp.PyArray_Check(<object>held[g]):
                prefetch(cnp.PyArray_DIMS(<cnp.ndarray>held[g]))
                prefetch(cnp.PyArray_DATA(<cnp.ndarray>held[g]))
                prefetch(<char*>cnp.PyArray_DATA(<cnp.ndarray>held[g]) + 64)
        for g in range(G):
            s = &src[g]
            arr = <object>held[g * per]
            if not (cnp.PyArray_Check(arr) and cnp.PyArray_TYPE(arr) == cnp.NPY_INT32):
                arr = _as_c(arr, cnp.NPY_INT64, keep)
            elif not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                arr = _as_c(arr, cnp.NPY_INT32, keep)
            s.wide = cnp.PyArray_TYPE(arr) == cnp.NPY_INT64
            s.indptr = cnp.PyArray_DATA(arr)
            s.n = cnp.PyArray_DIM(arr, 0) - 1
            arr = _as_c(<object>held[g * per + 1], cnp.NPY_INT32, keep)
            s.indices = <const int32_t*>cnp.PyArray_DATA(arr)
            s.nnz = cnp.PyArray_DIM(arr, 0)
            s.weights = NULL
            arr = <object>held[g * per + 2]
            if arr is not None:
                arr = _as_c(arr, cnp.NPY_FLOAT64, keep)
                s.weights = <const double*>cnp.PyArray_DATA(arr)
                weighted = True
            for c in range(k):
                arr = <object>held[g * per + 3 + c]
                lab[g * k + c] = NULL
                if (arr is None or not cnp.PyArray_Check(arr) or cnp.PyArray_NDIM(arr) != 1
                        or not cnp.PyArray_ISINTEGER(arr) or cnp.PyArray_DIM(arr, 0) != s.n):
                    if problems[LABEL] < 0:
                        problems[LABEL] = g
                    continue
                arr = _as_c(arr, cnp.NPY_INT64, keep)
                lab[g * k + c] = <const int64_t*>cnp.PyArray_DATA(arr)
    finally:
        for g in range(acquired):
            Py_DECREF(<object>held[g])
    node_offsets = np.empty(G + 1, np.int64)
    edge_offsets = np.empty(G + 1, np.int64)
    cdef int64_t[::1] no = node_offsets
    cdef int64_t[::1] eo = edge_offsets
    no[0] = eo[0] = 0
    for g in range(G):
        no[g + 1] = no[g] + src[g].n
        eo[g + 1] = eo[g] + src[g].nnz
    indptr_out = np.empty(no[G] + G, np.int64)
    indices_out = np.empty(eo[G], np.int32)
    weights_out = np.empty(eo[G] if weighted else 0, np.float64)
    labels_out = np.empty((no[G], k), np.int64)
    cdef int64_t[::1] ip_all = indptr_out
    cdef int32_t[::1] ix_all = indices_out
    cdef double[::1] w_all = weights_out
    cdef int64_t[:, ::1] lab_all = labels_out
    cdef uint8_t[::1] bad_structure = np.zeros(G, np.uint8)
    cdef int64_t[::1] bad_weight = np.full(G, -1, np.int64)
    cdef int threads = <int>max(1, min(<int64_t>n_threads, (no[G] * (k + 1) + eo[G]) // PACK_PER_THREAD))
    cdef int64_t i, e, n, m
    cdef bint bad
    cdef int64_t* ip
    cdef const int32_t* ix
    cdef const int64_t* col
    cdef double w
    with nogil:
        for g in prange(G, schedule="dynamic", chunksize=64, num_threads=threads, use_threads_if=threads > 1):
            n = src[g].n
            m = src[g].nnz
            ip = &ip_all[no[g] + g]
            if src[g].wide:
                for i in range(n + 1):
                    ip[i] = (<const int64_t*>src[g].indptr)[i]
            else:
                for i in range(n + 1):
                    ip[i] = (<const int32_t*>src[g].indptr)[i]
            ix = src[g].indices
            if m:
                memcpy(&ix_all[eo[g]], ix, m * sizeof(int32_t))
            bad = ip[0] != 0 or ip[n] != m
            for i in range(n):
                bad = bad | (ip[i + 1] < ip[i])
            for e in range(m):
                bad = bad | (<uint64_t><uint32_t>ix[e] >= <uint64_t>n)  # negative ones too
            bad_structure[g] = bad
            if weighted:
                if src[g].weights == NULL:
                    for e in range(m):
                        w_all[eo[g] + e] = 1.0
                else:
                    for e in range(m):
                        w = src[g].weights[e]
                        w_all[eo[g] + e] = w
                        if not (w >= 0.0 and w < INFINITY) and bad_weight[g] < 0:
                            bad_weight[g] = e
            for c in range(k):
                col = lab[g * k + c]
                if col != NULL:
                    for i in range(n):
                        lab_all[no[g] + i, c] = col[i]
    for g in range(G):
        if bad_structure[g] and problems[STRUCTURE] < 0:
            problems[STRUCTURE] = g
        if bad_weight[g] >= 0 and problems[WEIGHT] < 0:
            problems[WEIGHT] = eo[g] + bad_weight[g]
    return (node_offsets, edge_offsets, indptr_out, indices_out, weights_out if weighted else None, labels_out,
            problems_out)


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
    ``(row_offsets, la, lb, lengths, counts, self_dot)``: per graph its distinct triplets (label
    ids ``la``, ``lb``, length) with their counts (int64), sorted by ``(la, lb, length)``, and the
    sum of its squared counts (float64, exact below 2**53).  Hop counts of a graph with few distinct
    labels go through a table, read in order; otherwise its unordered paths are counted once under
    their labels in increasing order (one sort of half the ordered pairs), then written out in both
    orders.
    """
    if n_labels >= LABEL_MASK >> 1:
        raise ValueError(f"{n_labels} distinct label tuples: the triplet keys hold fewer than 2**31")
    cdef Packed p = _packed(node_offsets, edge_offsets, indptr, indices, weights)
    cdef const int64_t[::1] lab = labels
    cdef int64_t G = len(node_offsets) - 1
    cdef Searches s = Searches(node_offsets, n_threads)
    # hop counts (below the graph's size) of a graph with few distinct labels: its histogram in a
    # per-thread table over (its labels ranked, its labels ranked, hop count), counted in both
    # directions and read back in order, instead of a sort of its paths
    cdef int64_t n_max = s.n_max
    cdef bint hops = weights is None
    cdef int64_t m = min(n_labels, n_max) if hops else 0
    # the most cells a graph counted through the table can use (see the test in the loop below)
    # (zeroed by each thread, its own row: in one thread a memset of every row costs more than a count)
    cdef int64_t used = min(<int64_t>TABLE_CELLS, m * m * n_max, 4 * n_max * n_max + 256)
    cdef int64_t[:, ::1] cells = np.empty((n_threads, max(used, 1)), np.int64)
    width = (max(n_max, 1) + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN
    cdef int64_t[:, ::1] present = np.empty((n_threads, width), np.int64)  # a graph's labels
    cdef int64_t[:, ::1] local = np.empty((n_threads, width), np.int64)  # their ranks
    # thread t's vectors at t * SPREAD; out: its graphs' triplets, graph after graph
    cdef vector[vector[Key]] keys = vector[vector[Key]](n_threads * SPREAD)
    cdef vector[vector[Item]] runs = vector[vector[Item]](n_threads * SPREAD)
    cdef vector[vector[Item]] out = vector[vector[Item]](n_threads * SPREAD)
    cdef int64_t[::1] owner = np.empty(G, np.int64)
    cdef int64_t[::1] begin = np.empty(G, np.int64)
    cdef int64_t[::1] found = np.empty(G, np.int64)
    cdef int64_t g, n, base, i, j, la, lb, x, y, run, code, L, d, top, c, ra, rb
    cdef int64_t* my_cells
    cdef int64_t* my_local
    cdef int64_t* my_present
    cdef int32_t a, b
    cdef int t, v
    cdef int64_t reserve_items = 4 * p.node_offsets[G] // n_threads + 64
    cdef const uint64_t* adjacent
    cdef uint64_t seen, level, rest
    with nogil, parallel(num_threads=n_threads):
        t = threadid()
        v = t * SPREAD
        my_cells = &cells[t, 0]
        my_local = &local[t, 0]
        my_present = &present[t, 0]
        memset(my_cells, 0, used * sizeof(int64_t))
        out[v].reserve(reserve_items)
        for g in prange(G, schedule="dynamic", chunksize=16):
            n = p.node_offsets[g + 1] - p.node_offsets[g]
            base = p.node_offsets[g]
            owner[g] = v
            begin[g] = out[v].size()
            L = 0
            if hops:  # the graph's distinct labels, in order, and each vertex's rank among them
                memcpy(my_present, &lab[base], n * sizeof(int64_t))
                sort(my_present, my_present + n)
                L = unique(my_present, my_present + n) - my_present
                for i in range(n):
                    my_local[i] = lower_bound(my_present, my_present + L, lab[base + i]) - my_present
            # the table's scan costs about a sort when it has a few cells per vertex pair
            if hops and L * L * n <= min(<int64_t>TABLE_CELLS, 4 * n * n + 256):
                top = 0
                # each path once, in the cell of its labels' ranks in increasing order
                for a in range(n - 1):
                    ra = my_local[a]
                    if n <= 64:  # level by level as bit sets, each level's vertices above a counted
                        adjacent = s.rows(&p, g, t)
                        seen = (<uint64_t>1) << a
                        level = seen
                        d = 0
                        while level:
                            d = d + 1
                            level = next_level(adjacent, level, seen)
                            seen = seen | level  # (not |=: inside prange that would be a reduction)
                            rest = level & ~(((<uint64_t>2) << a) - 1)
                            while rest:
                                b = count_trailing_zeros(rest)
                                rest = rest & (rest - 1)
                                rb = my_local[b]
                                my_cells[(min(ra, rb) * L + max(ra, rb)) * n + d] += 1
                        top = max(top, d - 1)
                    else:
                        s.run(&p, g, a, t)
                        for b in range(a + 1, n):
                            if s.dist[t, b] < INFINITY:
                                d = <int64_t>s.dist[t, b]
                                top = max(top, d)
                                rb = my_local[b]
                                my_cells[(min(ra, rb) * L + max(ra, rb)) * n + d] += 1
                # read in (la, lb, length) order, both directions of a path: a cell of two ranks
                # twice (emptied the second time), a cell of one rank once, doubled
                for x in range(L):
                    for y in range(L):
                        code = (min(x, y) * L + max(x, y)) * n
                        for d in range(top + 1):
                            c = my_cells[code + d]
                            if c:
                                if x >= y:
                                    my_cells[code + d] = 0
                                out[v].push_back(Item(Key((my_present[x] << LABEL_BITS) | my_present[y],
                                                          length_bits(<double>d)), 2 * c if x == y else c))
            else:
                keys[v].clear()
                runs[v].clear()  # each (unordered label pair, length) of the graph and its number of paths
                for a in range(n - 1):
                    s.run(&p, g, a, t)
                    la = lab[base + a]
                    for b in range(a + 1, n):
                        if s.dist[t, b] < INFINITY:
                            lb = lab[base + b]
                            keys[v].push_back(Key((min(la, lb) << LABEL_BITS) | max(la, lb),
                                                  length_bits(s.dist[t, b])))
                sort(keys[v].begin(), keys[v].end())
                i = 0
                while i < <int64_t>keys[v].size():
                    j = i + 1
                    while j < <int64_t>keys[v].size() and keys[v][j] == keys[v][i]:
                        j = j + 1
                    runs[v].push_back(Item(keys[v][i], j - i))
                    i = j
                for i in range(<int64_t>runs[v].size()):
                    run = runs[v][i].second
                    x = runs[v][i].first.first >> LABEL_BITS
                    y = runs[v][i].first.first & LABEL_MASK
                    if x == y:
                        out[v].push_back(Item(runs[v][i].first, 2 * run))
                    else:
                        out[v].push_back(runs[v][i])
                        out[v].push_back(Item(Key((y << LABEL_BITS) | x, runs[v][i].first.second), run))
                # in (la, lb, length) order: the columns of a feature matrix come out sorted in each row
                sort(out[v].begin() + begin[g], out[v].end())
            found[g] = <int64_t>out[v].size() - begin[g]
    row_offsets = np.zeros(G + 1, np.int64)
    np.cumsum(np.asarray(found), out=row_offsets[1:])
    cdef int64_t[::1] ro = row_offsets
    cdef int64_t F = ro[G]
    la_out = np.empty(F, np.int64)
    lb_out = np.empty(F, np.int64)
    bits_out = np.empty(F, np.int64)
    counts_out = np.empty(F, np.int64)
    self_dot = np.zeros(G, np.float64)
    cdef int64_t[::1] ao = la_out
    cdef int64_t[::1] bo = lb_out
    cdef int64_t[::1] lo = bits_out
    cdef int64_t[::1] co = counts_out
    cdef double[::1] sd = self_dot
    cdef const Item* item
    # the team of the counting pass is still awake: a thread per COPY_PER_THREAD triplets
    cdef int out_threads = <int>max(1, min(<int64_t>n_threads, F // COPY_PER_THREAD))
    for g in prange(G, nogil=True, schedule="static", num_threads=out_threads, use_threads_if=out_threads > 1):
        for i in range(found[g]):
            item = &out[owner[g]][begin[g] + i]
            ao[ro[g] + i] = item.first.first >> LABEL_BITS
            bo[ro[g] + i] = item.first.first & LABEL_MASK
            lo[ro[g] + i] = item.first.second
            co[ro[g] + i] = item.second
            sd[g] += <double>item.second * <double>item.second
    return row_offsets, la_out, lb_out, bits_out.view(np.float64), counts_out, self_dot


cdef int64_t number_marked(int64_t[::1] table) noexcept nogil:
    """Number the marked (non-zero) cells of ``table`` 0, 1, ... in order, the others -1; returns
    how many were marked."""
    cdef int64_t v, found = 0
    for v in range(table.shape[0]):
        if table[v]:
            table[v] = found
            found = found + 1
        else:
            table[v] = -1
    return found


def number_lengths(const double[::1] lengths, int64_t span):
    """``(distinct, ids)``: the sorted distinct values of ``lengths`` (float64) and each one's index
    in them (int64), through a table, when every length is a whole number in ``[0, span)``; else
    None."""
    cdef int64_t F = lengths.shape[0], i, v, top = 0, found = 0
    cdef double x
    cdef bint whole = True
    with nogil:
        for i in range(F):
            x = lengths[i]
            if not (x >= 0.0 and x < span and x == <double>(<int64_t>x)):
                whole = False
                break
            top = max(top, <int64_t>x)
    if not whole:
        return None
    table_out = np.zeros(top + 1, np.int64)
    cdef int64_t[::1] table = table_out
    with nogil:
        for i in range(F):
            table[<int64_t>lengths[i]] = 1
        found = number_marked(table)
    distinct_out = np.empty(found, np.float64)
    ids_out = np.empty(F, np.int64)
    cdef double[::1] distinct = distinct_out
    cdef int64_t[::1] ids = ids_out
    with nogil:
        for v in range(top + 1):
            if table[v] >= 0:
                distinct[table[v]] = <double>v
        for i in range(F):
            ids[i] = table[<int64_t>lengths[i]]
    return distinct_out, ids_out


def number_labels(const int64_t[::1] labels, int64_t span):
    """``(distinct, ids)``: the sorted distinct values of ``labels`` (int64, ``(L, 1)``) and each
    one's index in them (int64), through a table, when they span fewer than ``span`` values; else
    None."""
    cdef int64_t N = labels.shape[0], i, lo = 0, hi = -1, found
    with nogil:
        if N:
            lo = hi = labels[0]
        for i in range(N):
            lo = min(lo, labels[i])
            hi = max(hi, labels[i])
    if N == 0 or <uint64_t>hi - <uint64_t>lo >= <uint64_t>span:  # unsigned: no overflow at the int64 extremes
        return None
    table_out = np.zeros(hi - lo + 1, np.int64)
    cdef int64_t[::1] table = table_out
    with nogil:
        for i in range(N):
            table[labels[i] - lo] = 1
        found = number_marked(table)
    distinct_out = np.empty((found, 1), np.int64)
    ids_out = np.empty(N, np.int64)
    cdef int64_t[:, ::1] distinct = distinct_out
    cdef int64_t[::1] ids = ids_out
    with nogil:
        for i in range(hi - lo + 1):
            if table[i] >= 0:
                distinct[table[i], 0] = lo + i
        for i in range(N):
            ids[i] = table[labels[i] - lo]
    return distinct_out, ids_out


ctypedef fused length_t:
    double
    int64_t


def number_columns(const int64_t[::1] la, const int64_t[::1] lb, const length_t[::1] lengths, int64_t n_labels,
                   int64_t span, int id_bits):
    """``(distinct, keys, col)``: the sorted distinct ``lengths`` (float64), the distinct triplets
    ``(la, lb, length)`` (label ids below ``n_labels``) as sorted keys ``la << 2 id_bits | lb <<
    id_bits | the length's index in distinct``, and each triplet's index among them (int32),
    through a table over ``(la, lb, length)``: one pass to check the lengths, one to mark, one to
    look up.  None unless every length is a whole number and the table has at most ``span``
    cells.  ``lengths``: float64 path lengths, or int64 ids of lengths numbered elsewhere."""
    cdef int64_t F = la.shape[0], i, x, y, d, code, width, n_lengths, found
    cdef double top = 0.0, v
    cdef bint whole = True
    with nogil:
        for i in range(F):
            v = <double>lengths[i]
            if not (v >= 0.0 and v < <double>span and (length_t is int64_t or v == <double>(<int64_t>v))):
                whole = False
                break
            top = max(top, v)
    if not whole:
        return None
    width = <int64_t>top + 1
    if n_labels * n_labels > span // width:
        return None
    table_out = np.zeros(n_labels * n_labels * width, np.int64)
    lid_out = np.zeros(width, np.int64)
    col_out = np.empty(F, np.int32)  # the index dtype scipy keeps for fewer than 2**31 columns
    cdef int64_t[::1] table = table_out
    cdef int64_t[::1] lid = lid_out
    cdef int32_t[::1] col = col_out
    with nogil:
        for i in range(F):
            code = (la[i] * n_labels + lb[i]) * width + <int64_t>lengths[i]
            table[code] = 1
            col[i] = <int32_t>code
        for code in range(n_labels * n_labels):
            for d in range(width):
                lid[d] |= table[code * width + d]
        n_lengths = number_marked(lid)
        found = number_marked(table)
    distinct_out = np.empty(n_lengths, np.float64)
    keys_out = np.empty(found, np.int64)
    cdef double[::1] distinct = distinct_out
    cdef int64_t[::1] keys = keys_out
    with nogil:
        for d in range(width):
            if lid[d] >= 0:
                distinct[lid[d]] = <double>d
        code = 0
        for x in range(n_labels):
            for y in range(n_labels):
                for d in range(width):
                    if table[code] >= 0:
                        keys[table[code]] = x << (2 * id_bits) | y << id_bits | lid[d]
                    code += 1
        for i in range(F):
            col[i] = <int32_t>table[col[i]]
    return distinct_out, keys_out, col_out
