"""Packed batches of graphs for the pairwise methods, and the cache that keeps them between calls."""

from __future__ import annotations

import itertools
import operator
import weakref

import numpy as np

from graphkern.spgk import features
from graphkern.spgk.cpu import dense_lengths
from graphkern.basekernels.shortest_path import node_features

# packed batches a kernel object keeps: a Gram matrix needs one, transform two (the fitted graphs'
# and the new ones), normalize's diagonals no more
BATCH_CACHE_SIZE = 4
_NODE_LABELS = operator.attrgetter("_node_labels")  # the slot: no Python frame per graph
_CALL = operator.methodcaller("__call__")  # a weak reference's referent
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

    n_threads = features.threads_for(len(graphs), features.GRAPHS_PER_THREAD, n_threads)
    return spgk_paths.shortest_paths(*features.pack(graphs, names, None, n_threads)[0], n_threads)


# --------------------------------------------------------------------------- batches

class Batch:
    """One list of graphs, packed: vertex features for the vertex kernel and path arrays.

    It holds no reference to the graphs (a cached batch must not keep them alive).
    ``device_copies`` holds its copies on the GPU, per (device, dtype), made by
    :meth:`graphkern.spgk.gpu.GpuRunner.upload`.
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
        them once (and gpu_batched's launch plan of them, :meth:`graphkern.spgk.gpu.GpuRunner._plan`, is kept too)."""
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
            dense_offsets, dense = dense_lengths(self, walk) if walk != "edges" else (None, None)
            view = cpu.GraphBatch(self.node_offsets, self.discrete, self.continuous, self.path_offsets,
                                  self.ends, self.lengths, dist_offsets, distances, dense_offsets, dense)
            self._cpu[key] = view
        return view


def _node_kernel_key(node_kernel):
    """What a batch's vertex features depend on in ``node_kernel``: its factors' kinds, columns
    and gammas, read now (a factor changed in place gives another key)."""
    if node_kernel is None:
        return None
    return tuple((type(f).__name__, f._key()) for f in node_kernel.factors())


class BatchCache:
    """The packed batches of the last few lists of graphs, keyed on the identity of their graphs.

    A hit needs the very same Graph objects, in the same order, the same vertex-kernel factors and
    the same label column objects for the columns the vertex kernel reads.  A Graph's arrays are
    read-only and its own, so its structure and weights never change and a column changes only by
    replacement (a new array); a column it does not read changes nothing.  A batch keeps its CPU
    view and its device copies, so a hit packs and uploads nothing.  The cache holds weak
    references to the graphs only: an entry goes as soon as one of its graphs is collected, which
    also frees the batch's device memory.  Beyond ``capacity`` the least recently used batch goes.
    """

    def __init__(self, capacity):
        self.capacity = capacity
        self._entries = {}  # key -> (token, weak references, label columns, batch), oldest first
        self.packed = 0  # batches built: a miss

    def get(self, graphs, node_kernel, build):
        """The batch of ``graphs`` for ``node_kernel``; ``build()`` makes one on a miss."""
        columns = features.label_columns(node_kernel)
        # the column objects themselves (held by the entry, so no id is reused while it lives), one
        # list per column; map over C callables, no Python frame per graph
        node_labels = list(map(_NODE_LABELS, graphs)) if columns else ()
        labels = [list(map(dict.get, node_labels, itertools.repeat(c))) for c in columns]
        key = (tuple(map(id, graphs)), _node_kernel_key(node_kernel))
        entries = self._entries
        entry = entries.pop(key, None)
        if (entry is not None and all(map(operator.is_, map(_CALL, entry[1]), graphs))
                and all(all(map(operator.is_, old, new)) for old, new in zip(entry[2], labels))):
            entries[key] = entry  # now the most recently used
            return entry[3]
        batch = build()
        self.packed += 1
        token = object()

        def forget(ref, key=key, token=token, cache=weakref.ref(self)):
            # weak and token-only references: no cycle holds an evicted batch or a dropped cache,
            # whose device memory is then freed at once, not whenever the collector runs
            self = cache()
            if self is not None and self._entries.get(key, (None,))[0] is token:
                del self._entries[key]

        entries[key] = (token, list(map(weakref.ref, graphs, itertools.repeat(forget))), labels, batch)
        for old in list(entries)[:-self.capacity]:
            entries.pop(old, None)
        return batch

    def clear(self):
        self._entries.clear()

    def __len__(self):
        return len(self._entries)


def pair_work(A, B, pa, pb):
    """Path pairs visited by the walk of each graph pair (the cost model's variable)."""
    return A.n_paths[pa].astype(np.float64) * B.n_paths[pb]
