# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""CPU kernels of the shortest-path graph kernel (graphkern.spgk).

A batch of graphs is read through :class:`GraphBatch`: per graph, its vertices' label
features (``discrete`` int64 and ``continuous`` float64 rows) and its shortest-path
graph as unordered paths ``(a, b)``, ``a < b``, with their lengths.  One kernel value
``K(G, G')`` sums over ordered pairs; with unordered paths and a symmetric vertex
kernel matrix ``V`` it is

    K = 2 * sum_{a<b} sum_{c<d} k_e(l_ab, l_cd) * (V[a,c] V[b,d] + V[a,d] V[b,c]),

a quarter of the length-kernel evaluations of the ordered form.  ``naive`` follows
the ordered four-loop definition literally (it is the reference and the baseline).

Every loop over paths runs without branches: the length kernel is a compile-time
specialisation (a fused "tag" type), chosen once per call.

The dense walk (``walk_mode`` auto or dense; fcsp and openmp_out): when a graph's shortest-path
graph is dense, the batch may also hold its lengths as an ``n x ld`` matrix (``ld`` = n rounded up
to a multiple of 8, +inf where no path, on the diagonal and in the padding).  With that graph as
the inner one,

    K = 2 * sum_{a<b} sum_c V[a,c] sum_{d < ld} k_e(l_ab, L[c,d]) V[b,d]

(V padded with zeros to ld columns): twice the length-kernel evaluations of the path-pair form,
but over whole contiguous rows with no gather, which spgk_dense.h runs 8 doubles wide with AVX-512
and 4 with AVX2 (its baseline copy is correct but no faster than the edge walk).  Dirac and
Brownian bridge only (k_e(w, +inf) = 0 with no branch; a Gaussian would need a vector exp per
entry).  "auto" takes it, on an AVX2 or AVX-512 CPU, where its entries, weighted by DENSE_COST
(their cost relative to a path pair's), cost less than the path pairs.
"""

from cython.parallel cimport parallel, prange, threadid
from libc.math cimport exp, fabs, INFINITY
from libc.stdint cimport int32_t, int64_t

import numpy as np


cdef extern from "spgk_dense.h" nogil:
    ctypedef double (*gk_dense_walk_fn)(const int32_t*, const double*, int64_t, const double*, int64_t, int64_t,
                                        const void*, double, double*)
    gk_dense_walk_fn gk_dense_walk_for(int kind, int is_float)
    ctypedef void (*gk_vertex_rows_fn)(const int64_t*, const double*, int64_t, const int64_t*, const double*, int64_t,
                                       int32_t, int32_t, const double*, int64_t, void*)
    gk_vertex_rows_fn gk_vertex_rows_for(int is_float)
    const char* gk_dense_isa()
    int gk_dense_level()


# the dense walk's row stride (rows padded to whole 64-byte lines of doubles) and its largest graph
cdef enum:
    DENSE_ALIGN = 8
    DENSE_MAX_NODES = 256
# An entry of the dense walk costs about this many path pairs of the edge walk (auto's threshold,
# the AVX2 figure rounded up, so AVX-512 is on the safe side too); graphkern.spgk reads it from
# dense_layout().  The measurements are in the spgk benchmark (fcsp_dense against fcsp).
cdef double DENSE_COST = 0.25

# walk modes of kernel_pairs
cdef enum:
    WALK_EDGES = 0
    WALK_AUTO = 1
    WALK_DENSE = 2


def dense_layout():
    """``(align, max_nodes, cost)``: the dense length matrices' row stride multiple, their largest
    graph, and an entry's cost in path pairs of the edge walk (auto's DENSE_COST)."""
    return DENSE_ALIGN, DENSE_MAX_NODES, DENSE_COST


def dense_isa():
    """The instruction set the dense walk runs with on this CPU ("avx512", "avx2" or "baseline")."""
    return gk_dense_isa().decode()


def dense_auto():
    """Whether walk mode auto may take the dense walk here, on an AVX2 or AVX-512 CPU (module doc);
    "dense" runs any copy."""
    return gk_dense_level() >= 1


cdef inline int64_t dense_ld(int64_t n) noexcept nogil:
    return (n + DENSE_ALIGN - 1) // DENSE_ALIGN * DENSE_ALIGN

# the length kernels, one empty struct each: `if edge_tag is ...` is resolved at compile time
ctypedef struct DiracTag:
    char unused
ctypedef struct GaussianTag:
    char unused
ctypedef struct BrownianTag:
    char unused

ctypedef fused edge_tag:
    DiracTag
    GaussianTag
    BrownianTag

ctypedef fused floating:
    float
    double

# codes shared with graphkern/basekernels/shortest_path.py
cdef enum:
    EDGE_DIRAC = 0
    EDGE_GAUSSIAN = 1
    EDGE_BROWNIAN = 2


ctypedef struct BatchView:
    const int64_t* node_offsets
    const int64_t* discrete        # (N, n_discrete) row-major
    const double* continuous       # (N, n_continuous) row-major
    const int64_t* path_offsets
    const int32_t* path_ends       # (P, 2): local endpoints a < b, sorted by (a, b)
    const int64_t* path_rowptr     # n_i + 1 per graph at node_offsets[g] + g: each a's run of paths
    const double* path_lengths
    const int64_t* dist_offsets    # naive only: offsets of each graph's n_i x n_i distance matrix
    const double* distances        # naive only: +inf where unreachable
    const int64_t* dense_offsets   # per graph, where its n_i x ld_i length matrix starts (-1: none)
    const double* dense            # the dense walk's length matrices (+inf where no path)
    int n_discrete
    int n_continuous


ctypedef struct VertexKernel:
    const double* weights          # gamma of each continuous dimension
    int n_discrete
    int n_continuous


cdef const void* _data(arr):
    """Address of a contiguous array's first element (NULL for an empty one)."""
    if arr is None or arr.size == 0:
        return NULL
    return <const void*><size_t>arr.ctypes.data


cdef class GraphBatch:
    """Arrays of one packed batch of graphs, kept alive while kernels read them."""

    cdef BatchView view
    cdef readonly object arrays
    cdef readonly int64_t n_graphs

    def __init__(self, node_offsets, discrete, continuous, path_offsets, path_ends, path_lengths,
                 dist_offsets=None, distances=None, dense_offsets=None, dense=None):
        node_offsets = np.ascontiguousarray(node_offsets, dtype=np.int64)
        discrete = np.ascontiguousarray(discrete, dtype=np.int64)
        continuous = np.ascontiguousarray(continuous, dtype=np.float64)
        path_offsets = np.ascontiguousarray(path_offsets, dtype=np.int64)
        path_ends = np.ascontiguousarray(path_ends, dtype=np.int32)
        path_lengths = np.ascontiguousarray(path_lengths, dtype=np.float64)
        n = len(node_offsets) - 1
        if n < 0 or len(path_offsets) != n + 1:
            raise ValueError("node_offsets and path_offsets need one entry per graph plus one")
        n_nodes = int(node_offsets[n])
        if discrete.ndim != 2 or continuous.ndim != 2 \
                or discrete.shape[0] != n_nodes or continuous.shape[0] != n_nodes \
                or path_ends.shape != (int(path_offsets[n]), 2) or path_lengths.shape != (int(path_offsets[n]),):
            raise ValueError("inconsistent shortest-path batch arrays")
        if dist_offsets is not None:
            dist_offsets = np.ascontiguousarray(dist_offsets, dtype=np.int64)
            distances = np.ascontiguousarray(distances, dtype=np.float64)
            if len(dist_offsets) != n + 1 or len(distances) != int(dist_offsets[n]):
                raise ValueError("inconsistent distance-matrix arrays")
        if dense_offsets is not None:
            dense_offsets = np.ascontiguousarray(dense_offsets, dtype=np.int64)
            dense = np.ascontiguousarray(dense, dtype=np.float64)
            sizes = np.diff(node_offsets)
            need = sizes * ((sizes + <int>DENSE_ALIGN - 1) // <int>DENSE_ALIGN * <int>DENSE_ALIGN)
            has = dense_offsets >= 0
            if dense_offsets.shape != (n,) or np.any(has & (sizes > DENSE_MAX_NODES)) \
                    or np.any(dense_offsets[has] + need[has] > len(dense)):
                raise ValueError("inconsistent dense length-matrix arrays")
        path_rowptr = _path_rowptr(node_offsets, path_offsets, path_ends)
        self.arrays = (node_offsets, discrete, continuous, path_offsets, path_ends, path_lengths,
                       dist_offsets, distances, path_rowptr, dense_offsets, dense)
        self.n_graphs = n
        self.view.node_offsets = <const int64_t*>_data(node_offsets)
        self.view.discrete = <const int64_t*>_data(discrete)
        self.view.continuous = <const double*>_data(continuous)
        self.view.path_offsets = <const int64_t*>_data(path_offsets)
        self.view.path_ends = <const int32_t*>_data(path_ends)
        self.view.path_lengths = <const double*>_data(path_lengths)
        self.view.path_rowptr = <const int64_t*>_data(path_rowptr)
        self.view.dist_offsets = <const int64_t*>_data(dist_offsets)
        self.view.distances = <const double*>_data(distances)
        self.view.dense_offsets = <const int64_t*>_data(dense_offsets)
        self.view.dense = <const double*>_data(dense)
        self.view.n_discrete = discrete.shape[1]
        self.view.n_continuous = continuous.shape[1]


def _path_rowptr(node_offsets, path_offsets, path_ends):
    """Per graph, where each first vertex's run of paths starts (CSR over the sorted path list)."""
    n_graphs = len(node_offsets) - 1
    n_nodes = np.diff(node_offsets)
    graph_of_path = np.repeat(np.arange(n_graphs), np.diff(path_offsets))
    start = node_offsets[graph_of_path] + path_ends[:, 0]
    if len(start) > 1 and np.any(np.diff(start) < 0):
        raise ValueError("each graph's paths must be sorted by their first vertex")
    if len(start) and (np.any(path_ends[:, 0] >= path_ends[:, 1]) or np.any(path_ends[:, 0] < 0)
                       or np.any(path_ends[:, 1] >= n_nodes[graph_of_path])):
        raise ValueError("path endpoints must satisfy 0 <= a < b < n_nodes")
    cum = np.concatenate([[0], np.cumsum(np.bincount(start, minlength=int(node_offsets[n_graphs])))])
    gid = np.repeat(np.arange(n_graphs), n_nodes + 1)
    # graph g's pointer of local vertex a sits at node_offsets[g] + g + a
    vertex = np.arange(len(gid)) - gid
    return cum[vertex] - cum[node_offsets[gid]]


# --------------------------------------------------------------------------- base kernels

cdef inline double length_kernel(edge_tag* tag, double w1, double w2, double param) noexcept nogil:
    cdef double t = w1 - w2
    if edge_tag is DiracTag:
        return <double>(w1 == w2)
    elif edge_tag is GaussianTag:
        return exp(-param * t * t)
    else:
        # a select, not libm's fmax: without -ffast-math gcc emits a call for fmax
        t = param - fabs(t)
        return t if t > 0.0 else 0.0


cdef inline double vertex_kernel(const BatchView* A, int64_t u, const BatchView* B, int64_t v,
                                 const VertexKernel* vk) noexcept nogil:
    """k_v of global vertex u of batch A and global vertex v of batch B."""
    cdef int k
    cdef int nd = vk.n_discrete, nc = vk.n_continuous
    cdef double match = 1.0, d2 = 0.0, t
    for k in range(nd):
        match *= <double>(A.discrete[u * nd + k] == B.discrete[v * nd + k])
    for k in range(nc):
        t = A.continuous[u * nc + k] - B.continuous[v * nc + k]
        d2 += vk.weights[k] * t * t
    return match * exp(-d2)


cdef inline int64_t n_paths(const BatchView* A, int64_t g) noexcept nogil:
    return A.path_offsets[g + 1] - A.path_offsets[g]


cdef void vertex_rows(const BatchView* A, int64_t ga, const BatchView* B, int64_t gb, const VertexKernel* vk,
                      int64_t row_begin, int64_t row_end, floating* V) noexcept nogil:
    """Rows [row_begin, row_end) of V = k_v(vertices of A[ga], vertices of B[gb])."""
    cdef int64_t off1 = A.node_offsets[ga], off2 = B.node_offsets[gb]
    cdef int64_t n2 = B.node_offsets[gb + 1] - off2
    cdef int64_t a, c
    for a in range(row_begin, row_end):
        for c in range(n2):
            V[a * n2 + c] = <floating>vertex_kernel(A, off1 + a, B, off2 + c, vk)


cdef double walk(edge_tag* tag, const BatchView* A, int64_t ga, const BatchView* B, int64_t gb,
                 int64_t p_begin, int64_t p_end, const floating* V, double param) noexcept nogil:
    """Sum over the outer paths [p_begin, p_end) of A[ga] and every inner path (c, d) of B[gb] of
    k_e * (V_ac V_bd + V_ad V_bc).

    The inner paths are sorted by c and ``rowptr2`` delimits each c's run, so V_ac and
    V_bc stay in registers and a path pair costs four loads (d, its length, V_ad, V_bd).
    """
    cdef const int32_t* ends1 = A.path_ends + 2 * A.path_offsets[ga]
    cdef const double* len1 = A.path_lengths + A.path_offsets[ga]
    cdef const int64_t* rowptr2 = B.path_rowptr + B.node_offsets[gb] + gb
    cdef const int32_t* ends2 = B.path_ends + 2 * B.path_offsets[gb]
    cdef const double* len2 = B.path_lengths + B.path_offsets[gb]
    cdef int64_t n2 = B.node_offsets[gb + 1] - B.node_offsets[gb]
    cdef int64_t p, c, q, q_end
    cdef int32_t d
    cdef const floating* Va
    cdef const floating* Vb
    cdef floating vac, vbc
    cdef double w, s0, s1, total = 0.0
    for p in range(p_begin, p_end):
        Va = V + ends1[2 * p] * n2
        Vb = V + ends1[2 * p + 1] * n2
        w = len1[p]
        # two independent sums: one running sum would serialise on the add latency
        s0 = s1 = 0.0
        for c in range(n2):
            vac = Va[c]
            vbc = Vb[c]
            q = rowptr2[c]
            q_end = rowptr2[c + 1]
            while q + 2 <= q_end:
                d = ends2[2 * q + 1]
                s0 = s0 + length_kernel(tag, w, len2[q], param) * (vac * Vb[d] + Va[d] * vbc)
                d = ends2[2 * q + 3]
                s1 = s1 + length_kernel(tag, w, len2[q + 1], param) * (vac * Vb[d] + Va[d] * vbc)
                q = q + 2
            if q < q_end:
                d = ends2[2 * q + 1]
                s0 = s0 + length_kernel(tag, w, len2[q], param) * (vac * Vb[d] + Va[d] * vbc)
        total += s0 + s1
    return total


cdef inline void order_pair(const BatchView** A, int64_t* ga, const BatchView** B, int64_t* gb) noexcept nogil:
    """Make A[ga] the graph with more paths: it is the outer (parallel) loop of the walk."""
    if n_paths(B[0], gb[0]) > n_paths(A[0], ga[0]):
        A[0], B[0] = B[0], A[0]
        ga[0], gb[0] = gb[0], ga[0]


cdef double pair_value(edge_tag* tag, const BatchView* A, int64_t ga, const BatchView* B, int64_t gb,
                       const VertexKernel* vk, double param, floating* V) noexcept nogil:
    """K(A[ga], B[gb]) by FCSP on one thread, V a scratch of n1 * n2 values."""
    order_pair(&A, &ga, &B, &gb)
    cdef int64_t P1 = n_paths(A, ga)
    if P1 == 0 or n_paths(B, gb) == 0:
        return 0.0
    vertex_rows(A, ga, B, gb, vk, 0, A.node_offsets[ga + 1] - A.node_offsets[ga], V)
    return 2.0 * walk(tag, A, ga, B, gb, 0, P1, V, param)


cdef inline bint has_dense(const BatchView* A, int64_t g) noexcept nogil:
    return A.dense_offsets != NULL and A.dense_offsets[g] >= 0


cdef double pair_value_walk(edge_tag* tag, const BatchView* A, int64_t ga, const BatchView* B, int64_t gb,
                            const VertexKernel* vk, double param, floating* V, gk_dense_walk_fn dense_fn,
                            gk_vertex_rows_fn rows_fn, int walk_mode) noexcept nogil:
    """K(A[ga], B[gb]) on one thread by the edge walk or the dense walk (``walk_mode``, module doc):
    the dense one with the graph whose rows cost least as the inner graph."""
    cdef int64_t n1 = A.node_offsets[ga + 1] - A.node_offsets[ga]
    cdef int64_t n2 = B.node_offsets[gb + 1] - B.node_offsets[gb]
    cdef int64_t P1 = n_paths(A, ga), P2 = n_paths(B, gb)
    cdef double cost_b = -1.0, cost_a = -1.0, best
    cdef const BatchView* X
    cdef const BatchView* Y
    cdef int64_t gx, gy, nx, ny, ld
    cdef double acc[DENSE_MAX_NODES]
    if dense_fn == NULL or walk_mode == WALK_EDGES or P1 == 0 or P2 == 0:
        return pair_value(tag, A, ga, B, gb, vk, param, V)
    if has_dense(B, gb):
        cost_b = <double>P1 * n2 * dense_ld(n2)
    if has_dense(A, ga):
        cost_a = <double>P2 * n1 * dense_ld(n1)
    if cost_a < 0 and cost_b < 0:
        return pair_value(tag, A, ga, B, gb, vk, param, V)
    if cost_b >= 0 and (cost_a < 0 or cost_b <= cost_a):
        X, gx, Y, gy, best = A, ga, B, gb, cost_b
    else:
        X, gx, Y, gy, best = B, gb, A, ga, cost_a
    if walk_mode == WALK_AUTO and DENSE_COST * best > <double>P1 * P2:
        return pair_value(tag, A, ga, B, gb, vk, param, V)
    nx = X.node_offsets[gx + 1] - X.node_offsets[gx]
    ny = Y.node_offsets[gy + 1] - Y.node_offsets[gy]
    ld = dense_ld(ny)
    cdef int64_t ox = X.node_offsets[gx], oy = Y.node_offsets[gy]
    cdef int nd = vk.n_discrete, nc = vk.n_continuous
    rows_fn(X.discrete + ox * nd, X.continuous + ox * nc, nx, Y.discrete + oy * nd, Y.continuous + oy * nc, ny,
            nd, nc, vk.weights, ld, <void*>V)
    return 2.0 * dense_fn(X.path_ends + 2 * X.path_offsets[gx], X.path_lengths + X.path_offsets[gx], n_paths(X, gx),
                          Y.dense + Y.dense_offsets[gy], ny, ld, <const void*>V, param, acc)


cdef double pair_value_parallel(edge_tag* tag, const BatchView* A, int64_t ga, const BatchView* B, int64_t gb,
                                const VertexKernel* vk, double param, floating* V, int n_threads) noexcept nogil:
    """K(A[ga], B[gb]) with the rows of V and the outer paths shared among threads (openmp_in)."""
    order_pair(&A, &ga, &B, &gb)
    cdef int64_t P1 = n_paths(A, ga)
    cdef int64_t a, p
    cdef double total = 0.0
    if P1 == 0 or n_paths(B, gb) == 0:
        return 0.0
    # rows and paths cost the same each, so static schedules balance
    for a in prange(A.node_offsets[ga + 1] - A.node_offsets[ga], schedule="static", num_threads=n_threads):
        vertex_rows(A, ga, B, gb, vk, a, a + 1, V)
    for p in prange(P1, schedule="static", num_threads=n_threads):
        total += walk(tag, A, ga, B, gb, p, p + 1, V, param)
    return 2.0 * total


cdef double pair_value_naive(edge_tag* tag, const BatchView* A, int64_t ga, const BatchView* B, int64_t gb,
                             const VertexKernel* vk, double param) noexcept nogil:
    """Algorithm 1: four loops over vertices a, b of A[ga] and c, d of B[gb], k_v evaluated inside."""
    cdef int64_t off1 = A.node_offsets[ga], off2 = B.node_offsets[gb]
    cdef int64_t n1 = A.node_offsets[ga + 1] - off1, n2 = B.node_offsets[gb + 1] - off2
    cdef const double* D1 = A.distances + A.dist_offsets[ga]
    cdef const double* D2 = B.distances + B.dist_offsets[gb]
    cdef int64_t a, b, c, d
    cdef double l1, l2, total = 0.0
    for a in range(n1):
        for b in range(n1):
            l1 = D1[a * n1 + b]
            if a == b or l1 == INFINITY:
                continue
            for c in range(n2):
                for d in range(n2):
                    l2 = D2[c * n2 + d]
                    if c == d or l2 == INFINITY:
                        continue
                    total += (vertex_kernel(A, off1 + a, B, off2 + c, vk)
                              * vertex_kernel(A, off1 + b, B, off2 + d, vk)
                              * length_kernel(tag, l1, l2, param))
    return total


# --------------------------------------------------------------------------- schedules

cdef enum Schedule:
    SEQUENTIAL = 0
    OPENMP_IN = 1
    OPENMP_OUT = 2
    NAIVE = 3


cdef void run_pairs(edge_tag* tag, Schedule schedule, const BatchView* A, const BatchView* B,
                    const int64_t* pair_a, const int64_t* pair_b, int64_t n_pairs, double* out,
                    const VertexKernel* vk, double param, floating* scratch, int64_t scratch_stride,
                    int n_threads, gk_dense_walk_fn dense_fn, gk_vertex_rows_fn rows_fn, int walk_mode) noexcept nogil:
    cdef int64_t k
    cdef floating* V
    if schedule == NAIVE:
        for k in range(n_pairs):
            out[k] = pair_value_naive(tag, A, pair_a[k], B, pair_b[k], vk, param)
    elif schedule == SEQUENTIAL:
        for k in range(n_pairs):
            out[k] = pair_value_walk(tag, A, pair_a[k], B, pair_b[k], vk, param, scratch, dense_fn, rows_fn, walk_mode)
    elif schedule == OPENMP_IN:
        for k in range(n_pairs):
            out[k] = pair_value_parallel(tag, A, pair_a[k], B, pair_b[k], vk, param, scratch, n_threads)
    else:
        # pair costs differ by orders of magnitude in mixed sets: dynamic schedule, one pair per chunk
        with parallel(num_threads=n_threads):
            V = scratch + threadid() * scratch_stride
            for k in prange(n_pairs, schedule="dynamic", chunksize=1):
                out[k] = pair_value_walk(tag, A, pair_a[k], B, pair_b[k], vk, param, V, dense_fn, rows_fn, walk_mode)


_SCHEDULES = {"naive": NAIVE, "fcsp": SEQUENTIAL, "openmp_in": OPENMP_IN, "openmp_out": OPENMP_OUT}


def kernel_pairs(str method, GraphBatch A, GraphBatch B, const int64_t[::1] pair_a, const int64_t[::1] pair_b,
                 double[::1] out, const double[::1] weights, int edge_kind, double edge_param,
                 floating[::1] scratch, int64_t scratch_stride, int n_threads, int walk_mode=WALK_EDGES):
    """``out[k] = K(A[pair_a[k]], B[pair_b[k]])`` by ``method`` (naive, fcsp, openmp_in, openmp_out).

    ``scratch`` holds the vertex-kernel matrices (its dtype is theirs): ``scratch_stride``
    values per thread for openmp_out, one matrix otherwise; each holds the largest ``n1 * n2`` of
    the pairs (more with the dense walk: :func:`_largest_vertex_matrix`).  ``walk_mode``: 0 the
    edge walk, 1 the dense walk where it costs less (auto), 2 wherever a dense matrix is there
    (fcsp and openmp_out; see the module doc).  Runs without the GIL.
    """
    cdef Schedule schedule
    cdef VertexKernel vk
    cdef DiracTag dirac
    cdef GaussianTag gaussian
    cdef BrownianTag brownian
    cdef int64_t n_pairs = pair_a.shape[0]
    cdef const BatchView* va = &A.view
    cdef const BatchView* vb = &B.view
    cdef gk_dense_walk_fn dense_fn = NULL
    cdef gk_vertex_rows_fn rows_fn = gk_vertex_rows_for(floating is float)
    try:
        schedule = _SCHEDULES[method]
    except KeyError:
        raise ValueError(f"unknown CPU method {method!r}; expected one of {', '.join(_SCHEDULES)}") from None
    if pair_b.shape[0] != n_pairs or out.shape[0] != n_pairs:
        raise ValueError("pair_a, pair_b and out must have one entry per pair")
    if A.view.n_discrete != B.view.n_discrete or A.view.n_continuous != B.view.n_continuous \
            or weights.shape[0] != A.view.n_continuous:
        raise ValueError("the two batches' label features do not match the vertex kernel")
    if edge_kind not in (EDGE_DIRAC, EDGE_GAUSSIAN, EDGE_BROWNIAN):
        raise ValueError(f"unknown length-kernel code {edge_kind}")
    if walk_mode not in (WALK_EDGES, WALK_AUTO, WALK_DENSE):
        raise ValueError(f"unknown walk mode {walk_mode}")
    if walk_mode != WALK_EDGES and edge_kind != EDGE_GAUSSIAN and schedule in (SEQUENTIAL, OPENMP_OUT) \
            and (walk_mode == WALK_DENSE or gk_dense_level() >= 1):
        dense_fn = gk_dense_walk_for(edge_kind, floating is float)
    if schedule == NAIVE and (A.arrays[6] is None or B.arrays[6] is None):
        raise ValueError("the naive method needs the batches' distance matrices")
    if n_pairs and n_threads < 1:
        raise ValueError("n_threads must be >= 1")
    for k in range(n_pairs):
        if not (0 <= pair_a[k] < A.n_graphs and 0 <= pair_b[k] < B.n_graphs):
            raise IndexError(f"pair {k} ({pair_a[k]}, {pair_b[k]}) is outside the batches")
    if n_pairs and schedule != NAIVE:
        need = scratch_stride * (n_threads if schedule == OPENMP_OUT else 1)
        if scratch.shape[0] < need or scratch_stride < _largest_vertex_matrix(A, B, pair_a, pair_b, dense_fn != NULL):
            raise ValueError("vertex-kernel scratch is too small for these pairs")
    if n_pairs == 0:
        return
    vk.weights = &weights[0] if weights.shape[0] else NULL
    vk.n_discrete = A.view.n_discrete
    vk.n_continuous = A.view.n_continuous
    cdef floating* V = &scratch[0] if scratch.shape[0] else NULL
    with nogil:
        if edge_kind == EDGE_DIRAC:
            run_pairs(&dirac, schedule, va, vb, &pair_a[0], &pair_b[0], n_pairs, &out[0], &vk, edge_param,
                      V, scratch_stride, n_threads, dense_fn, rows_fn, walk_mode)
        elif edge_kind == EDGE_GAUSSIAN:
            run_pairs(&gaussian, schedule, va, vb, &pair_a[0], &pair_b[0], n_pairs, &out[0], &vk, edge_param,
                      V, scratch_stride, n_threads, dense_fn, rows_fn, walk_mode)
        else:
            run_pairs(&brownian, schedule, va, vb, &pair_a[0], &pair_b[0], n_pairs, &out[0], &vk, edge_param,
                      V, scratch_stride, n_threads, dense_fn, rows_fn, walk_mode)


cdef int64_t _largest_vertex_matrix(GraphBatch A, GraphBatch B, const int64_t[::1] pair_a,
                                    const int64_t[::1] pair_b, bint dense) except -1:
    """The vertex-kernel values the largest of the pairs needs (either walk's V)."""
    cdef int64_t k, n1, n2, best = 0
    for k in range(pair_a.shape[0]):
        n1 = A.view.node_offsets[pair_a[k] + 1] - A.view.node_offsets[pair_a[k]]
        n2 = B.view.node_offsets[pair_b[k] + 1] - B.view.node_offsets[pair_b[k]]
        best = max(best, n1 * n2)
        if dense:
            best = max(best, n1 * dense_ld(n2), n2 * dense_ld(n1))
    return best
