"""The shortest-path graph kernel on multicore CPUs and NVIDIA GPUs (FCSP).

Definition
----------
For a graph ``G`` let ``P(G)`` be its shortest-path graph: every *ordered* pair
``(a, b)`` of *distinct* vertices with ``b`` reachable from ``a``, carrying the
shortest-path length ``l_ab`` (hop count for an unweighted graph, the sum of edge
weights otherwise).  Then

    K(G, G') = sum_{(a,b) in P(G)} sum_{(c,d) in P(G')} k_v(a, c) * k_v(b, d) * k_e(l_ab, l_cd)

with a vertex kernel ``k_v`` (:class:`DiracNode`, :class:`GaussianNode`, products of
them) and a path-length kernel ``k_e`` (:class:`DiracEdge`, :class:`GaussianEdge`,
:class:`BrownianBridgeEdge`).  This is the counting of Algorithm 1 of the FCSP paper
and of Borgwardt and Kriegel's kernel on the shortest-path graph with both directions
of every path.  Unreachable pairs and ``a == b`` never count, so a graph with one
vertex or no edges has ``K(G, .) = 0``.

Relation to GraKeL (checked against grakel 0.1.11's source and by the tests):

* ``grakel.ShortestPath(with_labels=True)`` builds, for each graph, the histogram of
  ``(label_a, label_b, l_ab)`` over the same ordered pairs ``a != b`` with ``l_ab``
  finite, and takes the dot product of histograms.  That is exactly ``K`` above with
  ``node_kernel=DiracNode(label)`` and ``edge_kernel=DiracEdge()``: no factor of 2
  and no other correction.  ``with_labels=False`` is ``node_kernel=None``.
* ``grakel.ShortestPathAttr(metric=f)`` sums ``f(x_a, x_c) f(x_b, x_d) [l_ab == l_cd]``
  over the same ordered pairs: ``K`` with ``edge_kernel=DiracEdge()`` and
  ``k_v = f``; with ``f`` the Gaussian ``exp(-||x - y||^2 / (2 sigma^2))`` it equals
  ``GaussianNode(col, sigma=sigma)`` (its default ``f`` is the dot product, which is
  not one of our vertex kernels).
* GraKeL reads weights from an adjacency matrix in which 0 means "no edge"; a
  graphkern edge of weight 0 is an edge of length 0.
* A definition over *unordered* paths ``{a, b}`` with an orientation-symmetrised
  walk kernel ``k(a,c)k(b,d) + k(a,d)k(b,c)`` gives exactly ``K / 2``.

How it is computed
------------------
Shortest paths of a whole list of graphs come from one compiled pass, parallel over the graphs
(graphkern/_cpu/spgk_paths.pyx): breadth-first search for unweighted graphs, Dijkstra
otherwise, each pair's length taken from the search of its smaller endpoint.  Negative weights
are an error.  They are stored as unordered paths ``a < b`` in the packed batch of the last few
lists of graphs (vertex features and path arrays, with their GPU copies), kept on the kernel
object and keyed on the graphs' identity, a fingerprint of their arrays and a hash of the label
columns the vertex kernel reads: a repeated call on unchanged graphs packs and uploads nothing.

With Dirac kernels only (``DiracNode`` factors or none, ``DiracEdge``), ``method="auto"`` uses
the explicit feature map instead (:mod:`graphkern.spgk.features`): ``K`` is a product of
triplet-count matrices, the same numbers exactly, at a cost growing with N P + N^2 F rather
than N^2 P^2.

``K`` is evaluated from the unordered paths as
``2 * sum_{a<b} sum_{c<d} k_e * (V[a,c] V[b,d] + V[a,d] V[b,c])`` with the vertex-kernel
matrix ``V`` computed once per pair of graphs (the FCSP scheme), which is the
definition above regrouped.  ``method`` picks the algorithm:

=================== ===== ========================================================
``"naive"``         CPU   Algorithm 1: four loops over vertices, ``k_v`` inside
``"fcsp"``          CPU   ``V`` once per pair, then the walk over both path arrays;
                          one thread (the sequential reference for speed-ups)
``"openmp_in"``     CPU   FCSP, the threads share one pair (outer paths split)
``"openmp_out"``    CPU   FCSP, the threads share the pairs (dynamic schedule)
``"gpu_1d"``        GPU   per pair: vertex kernel, walk with a thread per path of
                          the larger graph, reduction, copy back
``"gpu_2d"``        GPU   as gpu_1d with a thread per pair of paths
``"gpu_1d_overlap"``GPU   gpu_1d on several streams: one pair's reduction and
``"gpu_2d_overlap"``      copy overlap the next pairs' kernels
``"gpu_batched"``   GPU   many pairs per launch, a block per pair, ``V`` in shared
                          memory; the fastest for many small graphs
``"auto"``                openmp_out on the CPU (fcsp with one thread),
                          gpu_batched on the GPU, the hybrid split for "hybrid"
=================== ===== ========================================================

``cpu_walk`` picks how fcsp and openmp_out walk a pair: over both path arrays (``"edges"``, the
paper's loop, two gathers of ``V`` per path pair), or with one graph's lengths as a dense matrix
(``"dense"``: ``sum_c V[a,c] sum_d k_e(l_ab, L[c,d]) V[b,d]`` over whole rows, +inf where there is
no path, run 8 doubles wide with AVX-512 and 4 with AVX2, with the rows of ``V`` exponentiated in
vector registers too; Dirac and Brownian bridge length kernels, graphs of up to 256 vertices);
``"auto"`` (the default) takes the dense walk, on a CPU with AVX2 or AVX-512, where its entries
cost less than the path pairs (without AVX2 the dense walk runs, correctly, but no faster than the
edge walk, so auto keeps the edges).  On the mixed set's 50-vertex complete graphs it is about
3.7x the edge walk per core with AVX-512 and 2.2x with AVX2, and it is what lets the hybrid's CPU
side take a useful share.

``backend="hybrid"`` launches gpu_batched on every pair, heaviest first, and while it runs the
calling thread takes pairs from the light end with all cores but one (openmp_out, ``cpu_walk``), in steps of
up to ~1 ms, each first lowering a limit in device memory (copied on a side stream) that the
kernel's blocks read before each pair; the blocks report their progress to mapped host memory,
and the two sides meet where that progress reaches the CPU's claim
(:func:`share_from_both_ends`).  The meeting point is thus measured in every call, on the
pairs being computed, with no threshold or rate carried between calls: light pairs are where a
GPU is least efficient per unit of work (each block pays a fixed cost per pair), so the CPU's
share saves the GPU more time than its share of the work, and where the CPU is too slow to help
it simply takes little.  The GPU needs no host thread while it runs, so the calling thread is
one of the CPU's workers.

Precision: sums are accumulated in float64 everywhere.  With ``dtype=float32`` the
vertex-kernel matrix, the continuous labels and the products are float32 (path lengths
stay float64, so ``DiracEdge`` compares exact lengths).  Backends and methods agree to
rounding (a relative 1e-12 or so in float64), not bit for bit: they sum in different
orders.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern.spgk.kernels import (BrownianBridgeEdge, DiracEdge, DiracNode, EdgeKernel, GaussianEdge,
                                     GaussianNode, NodeKernel, ProductNode, node_features)
from graphkern._progress import Progress
from graphkern.graph import Graph, as_graph_list
from graphkern.spgk import features

__all__ = ["ShortestPathKernel", "DiracNode", "GaussianNode", "ProductNode", "DiracEdge", "GaussianEdge",
           "BrownianBridgeEdge", "shortest_path_graph", "CPU_METHODS", "GPU_METHODS"]

CPU_METHODS = ("naive", "fcsp", "openmp_in", "openmp_out")
# the CPU methods the dense walk applies to (cpu_walk=), and its length kernels (Dirac, Brownian)
DENSE_METHODS = ("fcsp", "openmp_out")
_DENSE_EDGES = (0, 2)
CPU_WALKS = ("auto", "edges", "dense")
_WALK_MODES = {"edges": 0, "auto": 1, "dense": 2}
GPU_METHODS = ("gpu_1d", "gpu_2d", "gpu_1d_overlap", "gpu_2d_overlap", "gpu_batched")
# the explicit feature map of Dirac kernels (graphkern.spgk.features), on the CPU or the GPU
FEATURES = "features"
METHODS = ("auto", FEATURES) + CPU_METHODS + GPU_METHODS
BACKENDS = ("auto", "cpu", "gpu", "hybrid")

# packed batches a kernel object keeps: a Gram matrix needs one, transform two (the fitted graphs'
# and the new ones), normalize's diagonals no more
_BATCH_CACHE_SIZE = 4
# a batch keeps its pair lists up to this many pairs (16 MiB; a Gram matrix of 1,448 graphs)
_PAIRS_KEPT = 1 << 20


# --------------------------------------------------------------------------- shortest paths

def shortest_path_graph(graph, *, where="graph"):
    """The shortest-path graph of ``graph`` as unordered paths: ``(ends, lengths)``.

    ``ends`` is int32 ``(P, 2)`` with ``a < b`` in each row (sorted), ``lengths`` float64 ``(P,)``;
    unreachable pairs are left out.  ``where`` names the graph in error messages.
    """
    _, ends, lengths = _all_shortest_paths([graph], lambda k: where, 1)
    return ends, lengths


def _all_shortest_paths(graphs, names, n_threads):
    """``(path_offsets, ends, lengths)`` of every graph, from one compiled pass parallel over the
    graphs (breadth-first search for hop counts, Dijkstra for weights)."""
    from graphkern._cpu import spgk_paths

    return spgk_paths.shortest_paths(*features.pack_structure(graphs, names), n_threads)


def _fingerprint(graph):
    """Changes when the graph's structure or weights are modified in place."""
    w = None if graph.weights is None else hash(graph.weights.tobytes())
    return (graph.n_nodes, graph.nnz, hash(graph.indptr.tobytes()), hash(graph.indices.tobytes()), w)


# --------------------------------------------------------------------------- batches

class _Batch:
    """One list of graphs, packed: vertex features for the vertex kernel and path arrays.

    It holds no reference to the graphs (a cached batch must not keep them alive).
    ``device_copies`` holds its copies on the GPU, per (device, dtype), made by
    :meth:`_GpuRunner.upload`.
    """

    def __init__(self, graphs, node_kernel, names, n_threads):
        self.n_graphs = len(graphs)
        self.node_offsets, self.discrete, self.continuous, self.weights = node_features(node_kernel, graphs)
        self.n_nodes = np.diff(self.node_offsets)
        self.path_offsets, self.ends, self.lengths = _all_shortest_paths(graphs, names, n_threads)
        self.n_paths = np.diff(self.path_offsets)
        self._cpu = {}
        self._pairs = {}
        self.device_copies = {}

    def __len__(self):
        return self.n_graphs

    def pairs(self, other=None):
        """``(pa, pb)``, int64: the upper triangle of this batch with itself (``other`` None, row
        by row), else every graph of this batch with every graph of ``other``.  Up to
        ``_PAIRS_KEPT`` pairs they are kept on the batch, read-only, so that a repeated call makes
        them once (and gpu_batched's launch plan of them, :meth:`_GpuRunner._plan`, is kept too)."""
        key = None if other is None else other.n_graphs  # the pairs depend on other's length only
        got = self._pairs.get(key)
        if got is not None:
            return got
        n = self.n_graphs
        if other is None:
            pa, pb = np.triu_indices(n)
        else:
            pa, pb = np.divmod(np.arange(n * other.n_graphs, dtype=np.int64), other.n_graphs)
        pa, pb = pa.astype(np.int64, copy=False), pb.astype(np.int64, copy=False)
        if len(pa) <= _PAIRS_KEPT:
            pa.flags.writeable = pb.flags.writeable = False  # shared by later calls and their launch plans
            if len(self._pairs) >= 2:
                self._pairs.clear()
            self._pairs[key] = (pa, pb)
        return pa, pb

    def cpu(self, with_distances=False, walk="edges"):
        """The Cython view of this batch (with dense distance matrices for ``naive``, and with
        the dense walk's length matrices for ``walk`` "auto" or "dense": see :func:`_dense_lengths`)."""
        key = (with_distances, walk != "edges" and walk)
        view = self._cpu.get(key)
        if view is None:
            from graphkern._cpu import spgk as cpu
            dist_offsets = distances = None
            if with_distances:
                dist_offsets = np.concatenate([[0], np.cumsum(self.n_nodes ** 2)]).astype(np.int64)
                distances = np.full(int(dist_offsets[-1]), np.inf)
                for g, n in enumerate(self.n_nodes):
                    lo, hi = self.path_offsets[g], self.path_offsets[g + 1]
                    a, b = self.ends[lo:hi, 0].astype(np.int64), self.ends[lo:hi, 1].astype(np.int64)
                    base = dist_offsets[g]
                    distances[base + a * n + b] = self.lengths[lo:hi]
                    distances[base + b * n + a] = self.lengths[lo:hi]
            dense_offsets, dense = _dense_lengths(self, walk) if walk != "edges" else (None, None)
            view = cpu.GraphBatch(self.node_offsets, self.discrete, self.continuous, self.path_offsets,
                                  self.ends, self.lengths, dist_offsets, distances, dense_offsets, dense)
            self._cpu[key] = view
        return view


def _dense_auto():
    from graphkern._cpu import spgk as cpu

    return cpu.dense_auto()


# the dense walk's length matrices of one batch take at most this much memory (beyond, the
# remaining graphs keep the edge walk)
_DENSE_BUDGET = 256 << 20


def _dense_ld(n):
    """The dense walk's row length for graphs of ``n`` vertices (an array): n rounded up to the row
    alignment."""
    from graphkern._cpu import spgk as cpu

    align = cpu.dense_layout()[0]
    return -(-n // align) * align


def _dense_lengths(batch, walk):
    """``(offsets, lengths)`` of the dense walk (graphkern/_cpu/spgk.pyx): for each graph of at
    most DENSE_MAX_NODES vertices -- with ``walk`` "auto" only those whose rows can cost less
    than their paths (cost n ld <= P, cost from graphkern._cpu.spgk.dense_layout(); otherwise
    "auto" never takes them as the inner graph) -- an n x ld matrix of path lengths, +inf where
    there is none, offset -1 for the others."""
    from graphkern._cpu import spgk as cpu

    _, max_nodes, cost = cpu.dense_layout()
    n = batch.n_nodes.astype(np.int64)
    ld = _dense_ld(n)
    size = n * ld
    want = (n <= max_nodes) & (n > 0) & (batch.n_paths > 0)
    if walk == "auto":
        want &= cost * size <= batch.n_paths
    size = np.where(want, size, 0)
    keep = want & (np.cumsum(size) <= _DENSE_BUDGET)
    size = np.where(keep, size, 0)
    starts = np.cumsum(size) - size
    offsets = np.where(keep, starts, -1).astype(np.int64)
    dense = np.full(int(size.sum()), np.inf)
    graph_of_path = np.repeat(np.arange(len(n)), batch.n_paths)
    on = keep[graph_of_path]
    g = graph_of_path[on]
    a = batch.ends[on, 0].astype(np.int64)
    b = batch.ends[on, 1].astype(np.int64)
    dense[starts[g] + a * ld[g] + b] = batch.lengths[on]
    dense[starts[g] + b * ld[g] + a] = batch.lengths[on]
    return offsets, dense


def _label_fingerprint(graph, columns):
    """Changes when one of the node label ``columns`` is modified in place, replaced or removed."""
    labels = graph.node_labels
    out = []
    for c in columns:  # a plain loop: this runs for every graph in every call
        col = labels.get(c)
        out.append(None if col is None else (col.dtype, col.shape, hash(col.tobytes())))
    return out


def _node_kernel_key(node_kernel):
    """What a batch's vertex features depend on in ``node_kernel``: its factors' kinds, columns
    and gammas, read now (a factor changed in place gives another key)."""
    if node_kernel is None:
        return None
    return tuple((type(f).__name__, f._key()) for f in node_kernel.factors())


class _BatchCache:
    """The packed batches of the last few lists of graphs, keyed on the identity of their graphs.

    A hit needs the very same Graph objects, in the same order, the same vertex-kernel factors and
    unchanged contents: each graph's structure and weights (:func:`_fingerprint`) and the label
    columns the vertex kernel reads (hashed, so an array edited in place is seen).  A batch keeps
    its CPU view and its device copies, so a hit packs and uploads nothing.  The cache holds weak
    references only: an entry goes as soon as one of its graphs is collected, which also frees
    the batch's device memory.  Beyond ``capacity`` the least recently used batch goes.
    """

    def __init__(self, capacity):
        self.capacity = capacity
        self._entries = {}  # key -> (token, weak references, fingerprints, batch), oldest first
        self.packed = 0  # batches built: a miss

    def get(self, graphs, node_kernel, build):
        """The batch of ``graphs`` for ``node_kernel``; ``build(structure)`` makes one on a miss,
        from the graphs' :func:`_fingerprint` values."""
        factors = () if node_kernel is None else node_kernel.factors()
        columns = tuple(dict.fromkeys(f.column for f in factors))
        structure = [_fingerprint(g) for g in graphs]
        labels = [_label_fingerprint(g, columns) for g in graphs] if columns else None
        key = (tuple(map(id, graphs)), _node_kernel_key(node_kernel))
        entries = self._entries
        entry = entries.pop(key, None)
        if entry is not None and entry[2] == (structure, labels) and all(r() is g for r, g in zip(entry[1], graphs)):
            entries[key] = entry  # now the most recently used
            return entry[3]
        batch = build(structure)
        self.packed += 1
        token = object()

        def forget(ref, key=key, token=token, cache=weakref.ref(self)):
            # weak and token-only references: no cycle holds an evicted batch or a dropped cache,
            # whose device memory is then freed at once, not whenever the collector runs
            self = cache()
            if self is not None and self._entries.get(key, (None,))[0] is token:
                del self._entries[key]

        entries[key] = (token, [weakref.ref(g, forget) for g in graphs], (structure, labels), batch)
        for old in list(entries)[:-self.capacity]:
            entries.pop(old, None)
        return batch

    def clear(self):
        self._entries.clear()

    def __len__(self):
        return len(self._entries)


def _pair_work(A, B, pa, pb):
    """Path pairs visited by the walk of each graph pair (the cost model's variable)."""
    return A.n_paths[pa].astype(np.float64) * B.n_paths[pb]


def _run_cpu(method, A, B, pa, pb, edge_kernel, n_threads, dtype, walk="edges"):
    from graphkern._cpu import spgk as cpu

    out = np.empty(len(pa))
    if len(pa) == 0:
        return out
    if method not in DENSE_METHODS or edge_kernel.code not in _DENSE_EDGES or (walk == "auto" and not cpu.dense_auto()):
        walk = "edges"
    if method == "naive":
        stride, copies = 0, 0
    else:
        n1, n2 = A.n_nodes[pa].astype(np.int64), B.n_nodes[pb].astype(np.int64)
        stride = int((n1 * n2).max())
        if walk != "edges":
            stride = max(stride, int((n1 * _dense_ld(n2)).max()), int((n2 * _dense_ld(n1)).max()))
        copies = n_threads if method == "openmp_out" else 1
    scratch = np.empty(max(stride * copies, 1), dtype=dtype)
    cpu.kernel_pairs(method, A.cpu(method == "naive", walk), B.cpu(method == "naive", walk),
                     np.ascontiguousarray(pa, np.int64), np.ascontiguousarray(pb, np.int64), out,
                     np.ascontiguousarray(A.weights, np.float64), edge_kernel.code, edge_kernel.parameter,
                     scratch, stride, n_threads, _WALK_MODES[walk])
    return out


# --------------------------------------------------------------------------- GPU

_BLOCK = 256
_BLOCK_1D = 128
_BLOCK_2D = (32, 8)
_OVERLAP_STREAMS = 4
_DEFAULT_SHARED = 48 * 1024
_MAX_SHARED_V = 96 * 1024
# gpu_batched launch plans a runner keeps (a Gram matrix needs one, transform one)
_PLANS_KEPT = 2


class _DeviceBatch:
    """A batch's arrays on one device in one precision, uploaded once and kept by the batch."""

    def __init__(self, rt, dev, batch, dtype):
        # flat copies: the kernels index raw rows, and an empty (n, 0) array cannot be copied as bytes
        upload = lambda a, dt=None: rt.to_device(dev, np.ravel(np.ascontiguousarray(a, dtype=dt)))
        self.node_offsets = upload(batch.node_offsets)
        self.discrete = upload(batch.discrete)
        self.continuous = upload(batch.continuous, dtype)
        self.path_offsets = upload(batch.path_offsets)
        self.ends = upload(batch.ends)
        self.lengths = upload(batch.lengths)
        self.weights = upload(batch.weights, dtype)  # the vertex kernel's gamma per continuous dimension

    @staticmethod
    def nbytes(batch, dtype):
        return (batch.node_offsets.nbytes + batch.discrete.nbytes + batch.continuous.size * dtype.itemsize
                + batch.path_offsets.nbytes + batch.ends.nbytes + batch.lengths.nbytes
                + batch.weights.size * dtype.itemsize)

    def arrays(self):
        return (self.node_offsets, self.discrete, self.continuous, self.path_offsets, self.ends, self.lengths)


class _GpuRunner:
    """Runs the GPU methods on one device in one precision for one edge kernel; kept by the kernel
    object across calls (its functions and streams), while each batch keeps its own device copies."""

    def __init__(self, device, dtype, edge_kernel):
        from graphkern._cuda import runtime as rt

        self.rt = rt
        self.dev = rt.get_device(device)
        self.dtype = dtype
        self.scalar = dtype.type
        self.edge = edge_kernel
        suffix = "f32" if dtype == np.float32 else "f64"
        self.fn = {name: rt.kernel(self.dev, "spgk", f"spgk_{name}_{suffix}")
                   for name in ("vertex_matrix", "walk_1d", "walk_2d", "batched")}
        self.fn["reduce"] = rt.kernel(self.dev, "spgk", "spgk_reduce_partials")
        props = self.dev.properties
        self.n_sm = props["multiprocessor_count"]
        self.max_shared = props["max_shared_memory_per_block_optin"]
        self._copy_key = (self.dev.ordinal, dtype.str)  # the key of this runner's copies in _Batch.device_copies
        self._plans = {}  # the last gpu_batched launch plans, oldest first
        self.stream = None  # gpu_batched's (created on first use)
        self.side_stream = None  # the hybrid's limit updates, beside a running launch

    def upload(self, *batches):
        """Copy the batches to the device unless they hold copies for this device and dtype already."""
        todo = [b for b in dict.fromkeys(batches) if self._copy_key not in b.device_copies]
        if not todo:
            return
        need = sum(_DeviceBatch.nbytes(b, self.dtype) for b in todo)
        self.rt.check_fits(self.dev, need, f"the shortest-path graphs and labels of {sum(map(len, todo))} graphs")
        for b in todo:
            b.device_copies[self._copy_key] = _DeviceBatch(self.rt, self.dev, b, self.dtype)

    def device_batch(self, batch):
        self.upload(batch)
        return batch.device_copies[self._copy_key]

    def run(self, method, A, B, pa, pb):
        out = np.zeros(len(pa))
        if len(pa) == 0:
            return out
        self.upload(A, B)
        if method == "gpu_batched":
            return self.batched(A, B, pa, pb)
        walk = "walk_1d" if method.startswith("gpu_1d") else "walk_2d"
        return self.per_pair(walk, method.endswith("_overlap"), A, B, pa, pb)

    # ---- one pair at a time (the paper's schedule), optionally on several streams
    def _walk_grid(self, walk, P1, P2):
        if walk == "walk_1d":
            return max(1, min(-(-P1 // _BLOCK_1D), 8 * self.n_sm)), _BLOCK_1D
        gx = max(1, min(-(-P2 // _BLOCK_2D[0]), 64))
        gy = max(1, min(-(-P1 // _BLOCK_2D[1]), 65535))
        return (gx, gy), _BLOCK_2D

    def per_pair(self, walk, overlap, A, B, pa, pb):
        rt, dev = self.rt, self.dev
        n_pairs = len(pa)
        swap = B.n_paths[pb] > A.n_paths[pa]
        max_v = int((A.n_nodes[pa] * B.n_nodes[pb]).max())
        grids = {}
        max_partials = 1
        for k in range(n_pairs):
            P1, P2 = int(A.n_paths[pa[k]]), int(B.n_paths[pb[k]])
            if swap[k]:
                P1, P2 = P2, P1
            grid, block = grids[k] = self._walk_grid(walk, P1, P2)
            max_partials = max(max_partials, int(np.prod(grid)))
        n_streams = _OVERLAP_STREAMS if overlap else 1
        itemsize = self.dtype.itemsize
        rt.check_fits(dev, n_streams * (max(max_v, 1) * itemsize + max_partials * 8) + n_pairs * 8,
                      "shortest-path kernel work buffers")
        streams = [rt.Stream(dev) for _ in range(n_streams)]
        V = [rt.alloc(dev, max(max_v, 1), self.dtype) for _ in range(n_streams)]
        partials = [rt.alloc(dev, max_partials, np.float64) for _ in range(n_streams)]
        d_out = rt.alloc(dev, n_pairs, np.float64)
        pinned = rt.PinnedBuffer(8 * n_pairs)
        host = pinned.array(np.float64, (n_pairs,))
        host[:] = 0.0
        dA, dB = self.device_batch(A), self.device_batch(B)
        param = self.scalar(self.edge.parameter)
        kind = np.int32(self.edge.code)
        n_disc, n_cont = np.int32(A.discrete.shape[1]), np.int32(A.continuous.shape[1])
        for k in range(n_pairs):
            (G1, D1, g1), (G2, D2, g2) = (A, dA, pa[k]), (B, dB, pb[k])
            if swap[k]:
                (G1, D1, g1), (G2, D2, g2) = (G2, D2, g2), (G1, D1, g1)
            P1, P2 = int(G1.n_paths[g1]), int(G2.n_paths[g2])
            if P1 == 0 or P2 == 0:
                continue
            s = k % n_streams
            n1, n2 = int(G1.n_nodes[g1]), int(G2.n_nodes[g2])
            rt.launch(self.fn["vertex_matrix"], max(1, min(-(-(n1 * n2) // _BLOCK), 4 * self.n_sm)), _BLOCK,
                      (D1.discrete, D1.continuous, np.int64(G1.node_offsets[g1]), np.int64(n1),
                       D2.discrete, D2.continuous, np.int64(G2.node_offsets[g2]), np.int64(n2),
                       n_disc, n_cont, dA.weights, V[s]), stream=streams[s])
            grid, block = grids[k]
            rt.launch(self.fn[walk], grid, block,
                      (D1.ends, D1.lengths, np.int64(G1.path_offsets[g1]), np.int64(P1),
                       D2.ends, D2.lengths, np.int64(G2.path_offsets[g2]), np.int64(P2),
                       V[s], np.int64(n2), kind, param, partials[s]), stream=streams[s])
            rt.launch(self.fn["reduce"], 1, _BLOCK, (partials[s], np.int64(np.prod(grid)), d_out, np.int64(k),
                                                     np.float64(2.0)), stream=streams[s])
            d_out.copy_to_host(host[k:k + 1], stream=streams[s], offset=8 * k)
            if not overlap:
                streams[s].synchronize()
        for s in streams:
            s.synchronize()
        return host.copy()

    # ---- many pairs per launch
    def _plan(self, A, B, pa, pb):
        """The :class:`_LaunchPlan` of these pairs: the last calls' when they are the same read-only
        arrays (those a batch keeps, :meth:`_Batch.pairs`) of the same batches, else a new one."""
        if pa.flags.writeable or pb.flags.writeable:
            return _LaunchPlan(A, B, pa, pb)
        for old, entry in list(self._plans.items()):  # plans of collected batches go
            if entry[0]() is None or entry[1]() is None:
                self._plans.pop(old, None)
        key = (id(A), id(B), id(pa), id(pb))
        entry = self._plans.pop(key, None)
        if entry is None or entry[0]() is not A or entry[1]() is not B or entry[2] is not pa or entry[3] is not pb:
            # the batches held weakly (their device memory goes with the batch cache's entry),
            # the read-only pair arrays strongly (their ids stay theirs)
            entry = (weakref.ref(A), weakref.ref(B), pa, pb, _LaunchPlan(A, B, pa, pb))
        self._plans[key] = entry
        for old in list(self._plans)[:-_PLANS_KEPT]:
            self._plans.pop(old, None)
        return entry[4]

    def batched(self, A, B, pa, pb):
        return self.start_batched(A, B, pa, pb).finish()

    def start_batched(self, A, B, pa, pb, shared_with_cpu=False):
        """Queue gpu_batched on the pairs and return at once: a :class:`_BatchedLaunch`.

        The pairs go heaviest first (the kernel's atomic pair counter then balances the tail).
        ``shared_with_cpu``: the launch reads a limit the CPU lowers and reports its progress
        (see :meth:`_BatchedLaunch.share`), so that the CPU can take pairs from the light end
        while it runs (:func:`share_from_both_ends`).
        """
        rt, dev = self.rt, self.dev
        fn = self.fn["batched"]
        itemsize = self.dtype.itemsize
        plan = self._plan(A, B, pa, pb)
        n_pairs = len(pa)
        reduction_bytes = 32 * 8
        # V in shared memory up to two blocks' worth per SM; larger V go to a global scratch (L2)
        budget = min(self.max_shared, _MAX_SHARED_V) - reduction_bytes - 64
        capacity = int(min(plan.max_vsize, budget // itemsize))
        shared = reduction_bytes + capacity * itemsize
        if shared > _DEFAULT_SHARED:
            fn.set_max_dynamic_shared_memory(shared)
        per_sm = max(1, fn.max_active_blocks_per_sm(_BLOCK, shared))
        grid = int(max(1, min(n_pairs, per_sm * self.n_sm)))
        stride = plan.max_vsize if plan.max_vsize > capacity else 0  # the largest V beyond shared memory
        if self.stream is None:
            self.stream = rt.Stream(dev)
        st = self.stream
        idle = st.query()  # nothing queued before this launch
        rt.check_fits(dev, grid * stride * itemsize + n_pairs * (8 if plan.d_pa is not None else 24) + 8,
                      "shortest-path kernel pair list and vertex-kernel scratch")
        if plan.d_pa is None:
            # on the stream of every launch that reads them (a runner has one), so they land first
            plan.d_pa = rt.to_device(dev, plan.pa, stream=st)
            plan.d_pb = rt.to_device(dev, plan.pb, stream=st)
        launch = _BatchedLaunch(self, plan.order)
        launch.blocks, launch.idle = grid, idle  # resident blocks: on an idle GPU each takes a pair at once
        launch.works = plan.works  # in the launch's order, heaviest first
        launch.plan = plan  # its host pair arrays stay alive while copied
        launch.d_pa, launch.d_pb = plan.d_pa, plan.d_pb
        launch.scratch = rt.alloc(dev, max(grid * stride, 1), self.dtype)
        launch.counter = rt.alloc(dev, 1, np.uint64)
        launch.counter.zero(stream=st)
        launch.d_out = rt.alloc(dev, n_pairs, np.float64)
        launch.d_out.memset32(0x7FC00000, stream=st)  # NaN: a pair the kernel missed cannot pass as a value
        limit = progress = None
        if shared_with_cpu:
            if self.side_stream is None:
                self.side_stream = rt.Stream(dev)
            launch.share(st)
            limit, progress = launch.limit_dev, np.uint64(launch.flags.device_pointer(dev) + _PROGRESS_OFFSET)
        dA, dB = self.device_batch(A), self.device_batch(B)
        launch.started.record(st)
        rt.launch(fn, grid, _BLOCK,
                  (*dA.arrays(), *dB.arrays(), np.int32(A.discrete.shape[1]), np.int32(A.continuous.shape[1]),
                   dA.weights, launch.d_pa, launch.d_pb, np.int64(n_pairs), np.int32(self.edge.code),
                   self.scalar(self.edge.parameter), np.int64(capacity), launch.scratch, np.int64(stride),
                   launch.counter, limit, progress, launch.d_out),
                  shared_mem=shared, stream=st)
        launch.ended.record(st)
        return launch


class _LaunchPlan:
    """gpu_batched's pair list, heaviest first (the kernel's atomic pair counter then balances the
    tail): ``order`` (the caller's positions in launch order), the pairs ``pa``, ``pb`` (int64) and
    their ``works`` in that order, the largest vertex-kernel matrix ``max_vsize``, and the pairs'
    device copies ``d_pa``, ``d_pb`` once a launch has made them."""

    def __init__(self, A, B, pa, pb):
        works = _pair_work(A, B, pa, pb)
        self.order = np.argsort(-works, kind="stable")
        self.works = works[self.order]
        self.pa = np.ascontiguousarray(pa[self.order], dtype=np.int64)
        self.pb = np.ascontiguousarray(pb[self.order], dtype=np.int64)
        self.max_vsize = int((A.n_nodes[pa] * B.n_nodes[pb]).max()) if len(pa) else 0
        self.d_pa = self.d_pb = None
        self._tail = None
        for a in (self.order, self.works, self.pa, self.pb):
            a.flags.writeable = False  # a kept plan serves later launches

    @property
    def tail(self):
        """:func:`_suffix_sums` of ``works`` (the hybrid's), made on first use."""
        if self._tail is None:
            self._tail = _suffix_sums(self.works)
        return self._tail


class _BatchedLaunch:
    """A queued gpu_batched launch: ``order`` (the pairs' positions, heaviest first, as the
    kernel takes them), ``done()``, ``finish()`` (the values in the caller's pair order, after
    the copy back), and for a launch shared with the CPU (:meth:`share`): ``set_limit(b)``
    (positions >= b are the CPU's; at most ``capacity`` calls) and ``progress()`` (a position
    the blocks have reached, to within 32: a hint, -1 before the first)."""

    capacity = 0

    def __init__(self, runner, order):
        rt = runner.rt
        self.runner = runner
        self.order = order
        self.started = rt.Event(runner.dev)
        self.ended = rt.Event(runner.dev)
        self.flags = self.ring = None

    def share(self, stream):
        """The limit (device memory, set to "no limit" on ``stream`` before the launch), the ring
        of page-locked values its updates are copied from, and the mapped progress flag."""
        rt = self.runner.rt
        self.flags, self.ring = _pinned_pair()
        self._progress = self.flags.array(np.int64)[_PROGRESS_OFFSET // 8:][:1]
        self._progress[0] = -1
        self._ring = self.ring.array(np.int64)
        self.capacity = len(self._ring) - 1
        self._next = 1
        self._ring[0] = len(self.order)
        self.limit_dev = rt.alloc(self.runner.dev, 1, np.int64)
        self.limit_dev.copy_from_host(self._ring[:1], stream=stream)
        # the updates (on the side stream) must land after this first value, not overtake it
        self._limit_set = rt.Event(self.runner.dev, timing=False)
        self._limit_set.record(stream)
        self.runner.side_stream.wait_event(self._limit_set)

    def set_limit(self, b):
        i = self._next
        if i > self.capacity:
            raise RuntimeError("the hybrid's limit was set more often than its ring holds")
        self._ring[i] = b
        self.limit_dev.copy_from_host(self._ring[i:i + 1], stream=self.runner.side_stream)
        self._next = i + 1

    def progress(self):
        return int(self._progress[0])

    def done(self):
        return self.ended.query()

    def gpu_seconds(self):
        self.ended.synchronize()
        return self.started.elapsed_ms(self.ended) / 1e3

    def finish(self):
        """The values in the caller's pair order (NaN where the kernel stopped at the limit)."""
        self.runner.stream.synchronize()
        out = np.empty(len(self.order))
        out[self.order] = self.d_out.to_host()
        if self.flags is not None:
            self.runner.side_stream.synchronize()  # the ring's copies are done: it can be reused
            _release_pinned_pair((self.flags, self.ring))
            self.flags = self.ring = None
        return out


# share_from_both_ends steps at most this many times per call (the launch's ring of limits)
_HYBRID_MAX_STEPS = 2047
# the mapped progress flag sits on a cache line of its own, which the host only reads
_PROGRESS_OFFSET = 128
_PINNED_PAIRS = []
_PINNED_LOCK = threading.Lock()


def _pinned_pair():
    """(mapped flags, ring of limits): page-locked memory, pooled (pinning costs more than a launch)."""
    with _PINNED_LOCK:
        if _PINNED_PAIRS:
            return _PINNED_PAIRS.pop()
    from graphkern._cuda import runtime as rt

    return rt.PinnedBuffer(2 * _PROGRESS_OFFSET, mapped=True), rt.PinnedBuffer(8 * (_HYBRID_MAX_STEPS + 1))


def _release_pinned_pair(pair):
    with _PINNED_LOCK:
        _PINNED_PAIRS.append(pair)


# --------------------------------------------------------------------------- hybrid

# share_from_both_ends: the CPU claims pairs in steps of about this long at its measured speed
# (its last step can end after the GPU's, so this bounds the imbalance), and at most this share
# of the GPU's predicted time to the claim
_HYBRID_STEP_SECONDS = 1e-3
_HYBRID_STEP_SHARE = 0.5
# cores the CPU share leaves free, for the system and the driver: a team thread preempted
# holds its step's barrier for a time slice (H100 machine, 16 cores, first version with every
# core in the team: steps of 2 pairs took up to 1.4 ms)
_HYBRID_FREE_CORES = 1
# the launch publishes its progress every this many pairs
_PROGRESS_STRIDE = 32


def _suffix_sums(works):
    """``tail[b] = works[b:].sum()`` for b in 0..n (summed from the end), read-only."""
    n = len(works)
    tail = np.zeros(n + 1)
    if n:
        np.cumsum(works[::-1], out=tail[n - 1::-1])
    tail.flags.writeable = False
    return tail


def share_from_both_ends(works, run_cpu, gpu, *, n_threads, step_seconds=None, clock=time.perf_counter,
                         tail=None):
    """Run the pairs of a running GPU launch from its light end on the CPU until the two meet.

    ``works``: each pair's work in the launch's order (heaviest first; the GPU takes positions
    0, 1, 2, ... as its blocks free up).  ``gpu``: the launch (:class:`_BatchedLaunch` or a test
    double) with ``progress()``, ``set_limit(b)`` and ``done()``.  ``run_cpu(lo, hi)`` computes
    positions [lo, hi) on the CPU threads.  The CPU claims a step below the current limit
    (lowering the limit first, so a block past it stops), computes it, and claims again until
    the GPU's progress reaches the limit or the launch is done: the meeting point is measured
    in every call, on these pairs, with no rate model carried between calls.

    A step is the work the CPU did in ``step_seconds`` at its last step's speed (its first step:
    two pairs per thread; a step that took under half its time doubles the next, since a short
    step's speed is mostly its fixed cost), and at most half the time the GPU needs to reach the
    limit at its pace during the last step, so that the steps shrink as the two meet and the CPU
    rarely finishes after the GPU.  A block may take a pair just before the CPU's claim reaches
    it; both then compute it (the CPU's value is used).  ``tail``: :func:`_suffix_sums` of ``works``
    when known.  Returns the final limit (positions >= it are the CPU's) and the split's record.
    """
    step_seconds = _HYBRID_STEP_SECONDS if step_seconds is None else step_seconds
    works = np.asarray(works, dtype=np.float64)
    seen = None  # (time, progress) at the previous step: the GPU's recent pace
    n = len(works)
    # work of positions [b, n) is tail[b]
    tail = _suffix_sums(works) if tail is None else tail
    b = n
    cpu_work = cpu_seconds = last_work = last_seconds = 0.0
    steps = 0
    t_start = clock()
    capacity = getattr(gpu, "capacity", n)
    while steps < capacity and not gpu.done():
        p = gpu.progress()
        free = b - (p + 1) - (_PROGRESS_STRIDE if p >= 0 else 0)  # p lags the blocks by < the stride
        if free <= 0:
            break
        if steps == 0:
            c = min(free, 2 * n_threads)
        else:
            budget = step_seconds
            now = clock()
            # the GPU's pace in positions per second over the last step (it quickens as the
            # pairs get lighter), else since the start
            if seen is not None and p > seen[1] and now > seen[0]:
                budget = min(budget, _HYBRID_STEP_SHARE * free * (now - seen[0]) / (p - seen[1]))
            elif p >= 0 and now > t_start:
                budget = min(budget, _HYBRID_STEP_SHARE * free * (now - t_start) / (p + 1))
            seen = (now, p)
            want = budget * last_work / last_seconds
            if last_seconds < 0.5 * budget:
                want = max(want, 2 * last_work)
            lo = int(np.searchsorted(-tail, -(tail[b] + want), side="left"))  # tail is non-increasing
            c = min(free, max(1, b - lo))
        gpu.set_limit(b - c)
        t0 = clock()
        run_cpu(b - c, b)
        last_seconds = max(clock() - t0, 1e-9)
        last_work = tail[b - c] - tail[b]
        cpu_seconds += last_seconds
        cpu_work += last_work
        b -= c
        steps += 1
    return b, dict(cpu_pairs=n - b, gpu_pairs=b, cpu_steps=steps, cpu_seconds=cpu_seconds,
                   cpu_work=float(tail[b]), gpu_work=float(tail[0] - tail[b]),
                   threshold_work=float(works[b - 1]) if 0 < b else np.inf)


# --------------------------------------------------------------------------- the kernel

class ShortestPathKernel:
    """The shortest-path graph kernel ``K(G, G')`` (see the module docstring for the definition).

    Parameters (keyword-only, stored as given, checked when the kernel is used)
    ----------
    node_kernel : NodeKernel or None
        Vertex kernel: :class:`DiracNode`, :class:`GaussianNode` or a product of them
        (``DiracNode('element') * GaussianNode('charge', sigma=1)``).  ``None``: every
        vertex pair scores 1 (unlabeled graphs).
    edge_kernel : EdgeKernel or None
        Kernel on path lengths: :class:`DiracEdge` (``None`` means this),
        :class:`GaussianEdge`, :class:`BrownianBridgeEdge`.
    normalize : bool
        Return ``K_ij / sqrt(K_ii K_jj)`` (0 where a graph has no paths).
    backend : "auto", "cpu", "gpu" or "hybrid"
        ``"auto"``: the GPU when one is usable (or when ``method`` is a GPU method), else the CPU.
    device : int or None
        The GPU to use (one device).
    n_threads : int or None
        CPU threads (None: all cores, honouring OMP_NUM_THREADS).
    method : str
        The algorithm (module docstring table); ``"auto"`` picks openmp_out / gpu_batched.
    dtype : float64 or float32
        Precision of the vertex-kernel matrix and its products; sums are float64.
    cpu_walk : "auto", "edges" or "dense"
        How ``fcsp`` and ``openmp_out`` (and the hybrid's CPU side) walk a pair: ``"edges"``, the
        paper's loop over both graphs' path arrays; ``"dense"``, one graph's lengths as a dense
        matrix whose rows run 8 doubles wide with AVX-512, 4 with AVX2 (twice the length-kernel
        evaluations but no gathers; Dirac and Brownian bridge length kernels, graphs of up to 256
        vertices); ``"auto"``, the dense walk for the pairs where it costs less, on AVX2 and
        AVX-512 CPUs.  Same values to rounding.

    Attributes
    ----------
    X_fit_ : list of Graph
        The graphs given to :meth:`fit`.
    method_, backend_ : str
        What the last call ran.
    hybrid_split_ : dict
        The last hybrid call's split: pairs and work on each side, the CPU's steps and busy
        seconds, the GPU kernel's seconds (CUDA events), the whole call's, and the lightest
        pair's work left to the GPU.

    Between calls the object keeps the packed batches (shortest paths, labels, or triplet counts)
    of the last few lists of graphs, with their GPU copies (device memory); they go with their
    graphs, and ``set_params`` drops them.

    Examples
    --------
    >>> k = ShortestPathKernel(node_kernel=DiracNode("element"), edge_kernel=BrownianBridgeEdge(c=3))
    >>> K = k(graphs)                     # Gram matrix, only the upper triangle computed
    >>> K_test = k.fit(train).transform(test)
    """

    _PARAMS = ("node_kernel", "edge_kernel", "normalize", "backend", "device", "n_threads", "method", "dtype",
               "cpu_walk", "verbose")

    def __init__(self, *, node_kernel=None, edge_kernel=None, normalize=False, backend="auto", device=None,
                 n_threads=None, method="auto", dtype=np.float64, cpu_walk="auto", verbose=False):
        self.node_kernel = node_kernel
        self.edge_kernel = edge_kernel
        self.normalize = normalize
        self.backend = backend
        self.device = device
        self.n_threads = n_threads
        self.method = method
        self.dtype = dtype
        self.cpu_walk = cpu_walk
        self.verbose = verbose
        self.__setstate__({})

    # ---- scikit-learn manners
    def get_params(self, deep=True):
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params):
        for name, value in params.items():
            if name not in self._PARAMS:
                raise ValueError(f"invalid parameter {name!r} for ShortestPathKernel; "
                                 f"valid parameters: {', '.join(self._PARAMS)}")
            setattr(self, name, value)
        self._drop_batches()
        return self

    def __repr__(self):
        changed = [f"{k}={getattr(self, k)!r}" for k in self._PARAMS
                   if getattr(self, k) is not _DEFAULTS[k] and getattr(self, k) != _DEFAULTS[k]]
        return f"ShortestPathKernel({', '.join(changed)})"

    def __getstate__(self):
        state = self.__dict__.copy()
        # weakrefs and device memory do not pickle; the caches are rebuilt on use
        for cache in ("_batches", "_gpu", "_counts"):
            state.pop(cache, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._batches = _BatchCache(_BATCH_CACHE_SIZE)
        self._counts = _BatchCache(_BATCH_CACHE_SIZE)  # TripletCounts of the last lists of graphs
        self._gpu = None  # (key, _GpuRunner) of the last GPU call

    def _drop_batches(self):
        """Forget the packed batches (and their device copies) and the GPU runner."""
        self._batches.clear()
        self._counts.clear()
        self._gpu = None
        self.__dict__.pop("_fitted", None)

    def fit(self, X, y=None):
        """Remember the graphs ``X`` (validated); ``transform`` compares new graphs with them.

        With the feature map (Dirac kernels, ``method`` "auto" or "features") their features and
        the vocabulary of triplets are made here, once."""
        self.X_fit_ = as_graph_list(X, "X")
        self.__dict__.pop("_fitted", None)
        cfg = self._config()
        if cfg["method"] == FEATURES:
            counts = self._triplets(self.X_fit_, "X", cfg)
            self._fitted = (counts, features.Vocabulary(counts, features.label_columns(cfg["node_kernel"])))
        return self

    def transform(self, Y, *, out=None):
        """``K(Y, X_fit_)``, shape ``(len(Y), len(X_fit_))`` (written into ``out`` when given)."""
        if not hasattr(self, "X_fit_"):
            raise AttributeError("this ShortestPathKernel is not fitted yet: call fit(X) first")
        return self._gram(as_graph_list(Y, "Y"), self.X_fit_, out, fitted=True)

    def fit_transform(self, X, y=None):
        return self.fit(X)(self.X_fit_)

    def __call__(self, X, Y=None, *, out=None):
        """The kernel matrix ``K(X, Y)``, ``(len(X), len(Y))``; ``Y=None`` computes only the upper
        triangle of ``K(X, X)``.  ``out``: a float64 array (or memory-mapped file) of that shape to
        write ``K`` into, returned."""
        X = as_graph_list(X, "X")
        return self._gram(X, None if Y is None else as_graph_list(Y, "Y"), out)

    def diag(self, X):
        """``K(x, x)`` for each graph of ``X`` (never normalised)."""
        X = as_graph_list(X, "X")
        cfg = self._config()
        if cfg["method"] == FEATURES:
            return self._triplets(X, "X", cfg).self_dot.copy()
        A = self._batch(X, "X", cfg)
        idx = np.arange(len(X), dtype=np.int64)
        return self._execute(cfg, A, A, idx, idx)

    def features(self, X):
        """The explicit features of ``X``: a scipy.sparse CSR matrix (int64 counts), one row per
        graph, one column per triplet of the fitted graphs (:attr:`feature_names_`); ``K(X, Y) =
        features(X) @ features(Y).T`` over the fitted vocabulary.  Triplets the fitted graphs lack
        are not columns.  An unfitted kernel is fitted on ``X`` first.  Needs Dirac kernels."""
        X = as_graph_list(X, "X")
        cfg = self._config()
        if cfg["method"] != FEATURES:
            raise ValueError(f"features() needs DiracNode factors (or no node kernel), DiracEdge and method 'auto' or "
                             f"'features'; this kernel has node_kernel={self.node_kernel!r}, "
                             f"edge_kernel={self.edge_kernel!r}, method={self.method!r}")
        if getattr(self, "_fitted", None) is None:
            self.fit(X)
        return self._fitted[1].matrix(self._triplets(X, "X", cfg)).copy()

    @property
    def feature_names_(self):
        """The columns of :meth:`features`: one ``(labels of a, labels of b, length)`` each, where a
        label tuple holds the vertex's values of the DiracNode columns (``feature_label_columns_``)."""
        if getattr(self, "_fitted", None) is None:
            raise AttributeError("feature_names_ exists after fit() with Dirac kernels")
        return self._fitted[1].names()

    @property
    def feature_label_columns_(self):
        if getattr(self, "_fitted", None) is None:
            raise AttributeError("feature_label_columns_ exists after fit() with Dirac kernels")
        return self._fitted[1].columns

    # ---- configuration
    def _config(self):
        node_kernel, edge_kernel = self.node_kernel, self.edge_kernel
        if node_kernel is not None and not isinstance(node_kernel, NodeKernel):
            raise TypeError(f"node_kernel must be DiracNode, GaussianNode, ProductNode or None, got {node_kernel!r}")
        if edge_kernel is None:
            edge_kernel = DiracEdge()
        if not isinstance(edge_kernel, EdgeKernel):
            raise TypeError(f"edge_kernel must be DiracEdge, GaussianEdge, BrownianBridgeEdge or None, "
                            f"got {edge_kernel!r}")
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {self.normalize!r}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {self.backend!r}")
        if not isinstance(self.cpu_walk, str) or self.cpu_walk not in CPU_WALKS:
            raise ValueError(f"cpu_walk must be one of {', '.join(map(repr, CPU_WALKS))}; got {self.cpu_walk!r}")
        dtype = resolve_dtype(self.dtype)
        n_threads = resolve_threads(self.n_threads)
        method, backend = self.method, self.backend
        if method == FEATURES or (method == "auto" and features.applies(node_kernel, edge_kernel)):
            if not features.applies(node_kernel, edge_kernel):
                raise ValueError(f"method 'features' needs DiracNode factors (or no node kernel) and DiracEdge; got "
                                 f"node_kernel={node_kernel!r}, edge_kernel={edge_kernel!r}")
            # the feature map on the GPU also serves "hybrid": the CPU has no share worth taking
            backend = resolve_backend("gpu" if backend == "hybrid" else backend, allowed=BACKENDS)
            device = resolve_devices(self.device)[0] if backend == "gpu" else None
            return dict(node_kernel=node_kernel, edge_kernel=edge_kernel, dtype=dtype, n_threads=n_threads,
                        method=FEATURES, backend=backend, device=device, cpu_walk=self.cpu_walk)
        if backend == "auto":
            if method in GPU_METHODS:
                backend = "gpu"
            elif method in CPU_METHODS:
                backend = "cpu"
        backend = resolve_backend(backend, allowed=BACKENDS)
        if backend == "cpu":
            if method in GPU_METHODS:
                raise ValueError(f"method {method!r} runs on the GPU but backend='cpu'; CPU methods: "
                                 f"{', '.join(CPU_METHODS)}")
            if method == "auto":
                method = "fcsp" if n_threads == 1 else "openmp_out"
        elif backend == "gpu":
            if method in CPU_METHODS:
                raise ValueError(f"method {method!r} runs on the CPU but backend='gpu'; GPU methods: "
                                 f"{', '.join(GPU_METHODS)}")
            if method == "auto":
                method = "gpu_batched"
        else:
            if method not in ("auto", "gpu_batched"):
                raise ValueError(f"backend='hybrid' splits pairs between openmp_out and gpu_batched; "
                                 f"method must be 'auto', got {method!r}")
            method = "hybrid"
        device = None
        if backend in ("gpu", "hybrid"):
            devices = resolve_devices(self.device)
            if len(devices) != 1:
                raise ValueError(f"ShortestPathKernel uses one GPU; got device={self.device!r}")
            device = devices[0]
        return dict(node_kernel=node_kernel, edge_kernel=edge_kernel, dtype=dtype, n_threads=n_threads,
                    method=method, backend=backend, device=device, cpu_walk=self.cpu_walk)

    def _batch(self, graphs, name, cfg):
        """The packed batch of ``graphs``: the last calls' one when nothing it depends on changed."""
        node_kernel = cfg["node_kernel"]

        def build(structure):
            return _Batch(graphs, node_kernel, lambda k: _graph_name(graphs, name, k), cfg["n_threads"])

        return self._batches.get(graphs, node_kernel, build)

    def _triplets(self, graphs, name, cfg):
        """The :class:`features.TripletCounts` of ``graphs``: the last calls' when unchanged."""
        def build(structure):
            return features.TripletCounts(graphs, cfg["node_kernel"], cfg["n_threads"],
                                          lambda k: _graph_name(graphs, name, k))

        return self._counts.get(graphs, cfg["node_kernel"], build)

    # ---- evaluation
    def _gram(self, X, Y, out=None, fitted=False):
        cfg = self._config()
        out = _check_out(out, len(X), len(X) if Y is None else len(Y))
        if cfg["method"] == FEATURES:
            return self._gram_features(cfg, X, Y, out, fitted)
        if out is not None:
            out[...] = self._gram(X, Y)
            return out
        A = self._batch(X, "X", cfg)
        B = A if Y is None else self._batch(Y, "Y", cfg)
        pa, pb = A.pairs(None if Y is None else B)
        values = self._execute(cfg, A, B, pa, pb)
        K = np.zeros((len(X), len(B)))
        K[pa, pb] = values
        if Y is None:
            K[pb, pa] = values
        self.method_, self.backend_ = cfg["method"], cfg["backend"]
        if not self.normalize:
            return K
        if Y is None:
            dx = dy = np.diag(K).copy()
        else:
            ix, iy = np.arange(len(X), dtype=np.int64), np.arange(len(Y), dtype=np.int64)
            dx = self._execute(cfg, A, A, ix, ix)
            dy = self._execute(cfg, B, B, iy, iy)
        scale = np.sqrt(np.outer(dx, dy))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(scale > 0, K / np.where(scale > 0, scale, 1.0), 0.0)

    def _gram_features(self, cfg, X, Y, out, fitted):
        """``K(X, Y)`` (``Y`` None: ``K(X, X)``) as a product of feature matrices; ``fitted``: ``Y``
        is ``X_fit_``, whose vocabulary and features :meth:`fit` made."""
        if fitted and getattr(self, "_fitted", None) is not None:
            cy, vocab = self._fitted
        else:
            cy = self._triplets(X if Y is None else Y, "X" if Y is None else "Y", cfg)
            vocab = cy.cache.get("vocabulary")
            if vocab is None:
                vocab = cy.cache["vocabulary"] = features.Vocabulary(cy, features.label_columns(cfg["node_kernel"]))
        if fitted:  # transform: the rows are the new graphs, the columns the fitted ones
            cx = self._triplets(X, "Y", cfg)
        else:
            cx, cy = (cy, cy) if Y is None else (self._triplets(X, "X", cfg), cy)
        A, B = vocab.matrix(cx), vocab.matrix(cy)
        shape = (A.shape[0], B.shape[0])
        out = np.empty(shape) if out is None else out
        scale = (cx.self_dot, cy.self_dot) if self.normalize else None
        symmetric = Y is None and not fitted
        self.method_, self.backend_ = FEATURES, cfg["backend"]
        with Progress(shape[0] * shape[1], self.verbose, "entries", "ShortestPathKernel") as bar:
            if cfg["backend"] == "gpu":
                from graphkern.spgk.features_gpu import features_gram

                return features_gram(cfg["device"], A, B, out, symmetric=symmetric, scale=scale, progress=bar)
            return features.gram_cpu(A, B, out, symmetric=symmetric, n_threads=cfg["n_threads"], scale=scale,
                                     progress=bar)

    def _runner(self, cfg):
        """The GPU runner for this call's device, dtype and edge kernel: the last call's if they match."""
        edge = cfg["edge_kernel"]
        key = (cfg["device"], cfg["dtype"].str, edge.code, edge.parameter)
        if self._gpu is None or self._gpu[0] != key:
            self._gpu = (key, _GpuRunner(cfg["device"], cfg["dtype"], edge))
        return self._gpu[1]

    def _execute(self, cfg, A, B, pa, pb):
        method = cfg["method"]
        if method in CPU_METHODS:
            return _run_cpu(method, A, B, pa, pb, cfg["edge_kernel"], cfg["n_threads"], cfg["dtype"], cfg["cpu_walk"])
        if method in GPU_METHODS:
            return self._runner(cfg).run(method, A, B, pa, pb)
        return self._execute_hybrid(cfg, A, B, pa, pb)

    def _execute_hybrid(self, cfg, A, B, pa, pb):
        if len(pa) == 0:
            return np.empty(0)
        runner = self._runner(cfg)
        runner.upload(A, B)
        edge, dtype, walk = cfg["edge_kernel"], cfg["dtype"], cfg["cpu_walk"]
        n_threads = max(1, cfg["n_threads"] - _HYBRID_FREE_CORES)
        t0 = time.perf_counter()
        launch = runner.start_batched(A, B, pa, pb, shared_with_cpu=True)
        order = launch.order
        cpu_values = np.empty(len(pa))
        if launch.idle and len(pa) <= launch.blocks + _PROGRESS_STRIDE:
            # an idle GPU gives every pair a block at once: the CPU could only compute pairs twice
            out = launch.finish()
            self.hybrid_split_ = dict(cpu_pairs=0, gpu_pairs=len(pa), cpu_steps=0, cpu_seconds=0.0, cpu_work=0.0,
                                      gpu_work=float(launch.plan.tail[0]), threshold_work=float(launch.works[-1]),
                                      gpu_alone=True, gpu_seconds=launch.gpu_seconds(),
                                      seconds=time.perf_counter() - t0)
            return out
        if edge.code in _DENSE_EDGES and (walk == "dense" or (walk == "auto" and _dense_auto())):
            A.cpu(False, walk), B.cpu(False, walk)  # made (once per batch) while the GPU runs, not in a CPU step

        def run_cpu(lo, hi):
            idx = order[lo:hi]
            cpu_values[lo:hi] = _run_cpu("openmp_out", A, B, pa[idx], pb[idx], edge, n_threads, dtype, walk)

        try:
            b, split = share_from_both_ends(launch.works, run_cpu, launch, n_threads=n_threads, tail=launch.plan.tail)
        finally:
            out = launch.finish()  # waits for the GPU even when the CPU side raised
        out[order[b:]] = cpu_values[b:]
        split.update(gpu_alone=False, gpu_seconds=launch.gpu_seconds(), seconds=time.perf_counter() - t0)
        self.hybrid_split_ = split
        return out


_DEFAULTS = {"node_kernel": None, "edge_kernel": None, "normalize": False, "backend": "auto", "device": None,
             "n_threads": None, "method": "auto", "dtype": np.float64, "cpu_walk": "auto", "verbose": False}


def _graph_name(graphs, name, k):
    g = graphs[k]
    return f"{name}[{k}]" + (f" ({g.name!r})" if g.name is not None else "")


def _check_out(out, rows, cols):
    """``out`` when it can hold the ``(rows, cols)`` float64 kernel matrix (None stays None)."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy array or memory map, got {type(out).__name__}")
    if out.shape != (rows, cols) or out.dtype != np.float64 or not out.flags.writeable:
        raise ValueError(f"out must be a writeable float64 array of shape {(rows, cols)}; got {out.dtype} "
                         f"{out.shape}{'' if out.flags.writeable else ', read-only'}")
    return out


