"""Vertex orders that make the 8x8 adjacency tiles ("octiles") few and dense.

The marginalized graph kernel streams a graph's adjacency as 8x8 tiles and skips the
empty ones, so its cost follows the number of non-empty octiles.  The count depends
on the vertex order only; every kernel result is invariant to it (the permuted
adjacency is ``P A P^T``).  Methods:

``"pbr"``
    Partitioning-based reordering (:mod:`graphkern._cpu.pbr`): parts of 8 vertices, numbered
    consecutively, that join as few pairs of parts as possible; never more off-diagonal
    tiles than the natural order.
``"rcm"``
    Reverse Cuthill-McKee (SciPy): a bandwidth-reducing order.
``"morton"``, ``"hilbert"``
    Z-order and Hilbert space-filling-curve orders of a vertex coordinate label
    (a float vector column, ``coords="coords"`` by default).
``None``
    The natural (identity) order.

A permutation ``perm`` lists old vertex ids in their new order (new vertex ``k`` is old
vertex ``perm[k]``), as :meth:`graphkern.Graph.permute` takes it.  Stored entries count
as tile entries whatever their value.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from graphkern._arrays import _INT32_MAX
from graphkern._backend import resolve_threads
from graphkern.graph import Graph, as_csr_matrix, pack_graphs

__all__ = ["reorder", "reorder_many", "octile_count", "METHODS", "OCTILE"]

OCTILE = 8
METHODS = ("pbr", "rcm", "morton", "hilbert", None)
_DEFAULT_SEED = 0


def _check_method(method):
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")


def _check_seed(seed):
    if seed is None:
        return _DEFAULT_SEED
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TypeError(f"seed must be a non-negative int or None, got {seed!r}")
    return int(seed)


def _as_graph(G, name):
    """A Graph for a Graph or a symmetric scipy.sparse matrix (the stored pattern is kept)."""
    if isinstance(G, Graph):
        return G
    A, _ = as_csr_matrix(G, name=name)
    if A.shape[0] > _INT32_MAX:
        raise ValueError(f"{name} has {A.shape[0]} vertices; reordering supports at most {_INT32_MAX}")
    return Graph(A.indptr, A.indices, validate=False)


def _pbr_batch(graphs, seed, n_threads, *, return_pairs=False):
    """PBR orders of ``graphs`` (and the joined part pairs each reached)."""
    from graphkern._cpu import pbr

    packed = pack_graphs(graphs)
    offsets = packed.node_offsets.astype(np.int64)
    perms = np.empty(int(offsets[-1]), dtype=np.int64)
    pairs = np.empty(len(graphs), dtype=np.int64)
    # one independent 64-bit stream per graph, so results do not depend on the thread count
    seeds = np.random.SeedSequence(seed).generate_state(max(len(graphs), 1), dtype=np.uint64)[:len(graphs)]
    pbr.pbr_many(offsets, packed.indptr.astype(np.int64, copy=False), packed.entry_offsets.astype(np.int64),
                 packed.indices.astype(np.int32, copy=False), seeds, perms, pairs, n_threads=n_threads)
    out = [perms[offsets[g]:offsets[g + 1]] for g in range(len(graphs))]
    return (out, pairs) if return_pairs else out


def _rcm(G):
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    A = sp.csr_matrix((np.ones(G.nnz, dtype=np.int8), G.indices, G.indptr), shape=(G.n_nodes,) * 2)
    return np.asarray(reverse_cuthill_mckee(A, symmetric_mode=True), dtype=np.int64)


def _grid_coordinates(G, coords, bits_per_dim_max):
    """Coordinates on an integer grid of ``bits`` bits per axis, one scale for every axis
    (so the curve sees the true shape): returns (ints (n, d), bits)."""
    X = np.asarray(G.require_node_label(coords))
    if X.ndim == 1:
        X = X[:, None]
    if X.dtype.kind != "f":
        raise ValueError(f"node label {coords!r} holds integer categories, not coordinates: "
                         "expected a float vector column of shape (n, d)")
    d = X.shape[1]
    if d > 63:
        raise ValueError(f"node label {coords!r} has {d} dimensions; space-filling curves here take at most 63")
    bits = min(bits_per_dim_max, 63 // d)
    lo = X.min(axis=0)
    span = float((X.max(axis=0) - lo).max()) or 1.0
    cells = (1 << bits) - 1
    Q = np.clip(np.round((X - lo) / span * cells), 0, cells).astype(np.uint64)
    return Q, bits


def _morton_key(Q, bits):
    """Bit-interleaved key of integer coordinates ``Q`` (n, d): dimension 0 is the most significant."""
    n, d = Q.shape
    key = np.zeros(n, dtype=np.uint64)
    for b in range(bits - 1, -1, -1):
        for j in range(d):
            key = (key << np.uint64(1)) | ((Q[:, j] >> np.uint64(b)) & np.uint64(1))
    return key


def _hilbert_key(Q, bits):
    """Hilbert index of integer coordinates ``Q`` (n, d), any d, ``bits`` bits per dimension.

    Skilling's AxesToTranspose (AIP Conf. Proc. 707, 381 (2004)), vectorized over points;
    the transposed form, bit-interleaved, is the index.
    """
    X = Q.astype(np.uint64, copy=True)
    n, d = X.shape
    one = np.uint64(1)
    q = one << np.uint64(bits - 1)
    while q > one:  # undo excess work
        p = q - one
        for i in range(d):
            hit = (X[:, i] & q) != 0
            X[hit, 0] ^= p
            miss = ~hit
            t = (X[miss, 0] ^ X[miss, i]) & p
            X[miss, 0] ^= t
            X[miss, i] ^= t
        q >>= one
    for i in range(1, d):  # Gray encode
        X[:, i] ^= X[:, i - 1]
    t = np.zeros(n, dtype=np.uint64)
    q = one << np.uint64(bits - 1)
    while q > one:
        t[(X[:, d - 1] & q) != 0] ^= q - one
        q >>= one
    X ^= t[:, None]
    return _morton_key(X, bits)


def _curve_order(G, coords, curve):
    Q, bits = _grid_coordinates(G, coords, 21)
    key = _hilbert_key(Q, bits) if curve == "hilbert" else _morton_key(Q, bits)
    return np.argsort(key, kind="stable").astype(np.int64)


def reorder(G, method="pbr", *, seed=None, coords="coords"):
    """A vertex order of ``G`` that makes its non-empty octiles few.

    Parameters
    ----------
    G : Graph, scipy.sparse matrix or networkx graph
        An undirected graph (a matrix must be square and symmetric; a networkx graph's vertices are
        numbered in ``G.nodes`` order).
    method : {"pbr", "rcm", "morton", "hilbert", None}
        See the module documentation; ``None`` is the identity.
    seed : int or None
        PBR's random stream.  ``None`` is a fixed default, so the result is
        reproducible; the order depends on the seed only, never on threads.
    coords : str
        Node label holding vertex coordinates (float vectors) for "morton"/"hilbert".

    Returns
    -------
    perm : ndarray of int64, shape (n,)
        Old vertex ids in their new order; apply with ``G.permute(perm)``.
    """
    _check_method(method)
    seed = _check_seed(seed)
    G = _as_graph(G, "G")
    return _order_one(G, method, seed, coords)


def _order_one(G, method, seed, coords):
    if method is None or G.n_nodes == 0:  # nothing to order: an empty graph needs no coordinate label
        return np.arange(G.n_nodes, dtype=np.int64)
    if method == "rcm":
        return _rcm(G)
    if method in ("morton", "hilbert"):
        return _curve_order(G, coords, method)
    return _pbr_batch([G], seed, 1)[0]


def reorder_many(graphs, method="pbr", *, n_threads=None, seed=None, coords="coords"):
    """:func:`reorder` for a list of graphs; PBR runs the graphs in parallel (OpenMP).

    Graph ``g`` gets the seed stream ``g`` of ``seed``, so each order depends only on the
    seed and the graph's position, not on ``n_threads``.  Returns a list of int64
    permutations.
    """
    _check_method(method)
    seed = _check_seed(seed)
    n_threads = resolve_threads(n_threads)
    if isinstance(graphs, Graph) or sp.issparse(graphs):
        raise TypeError("graphs must be a sequence of graphs; use reorder() for one graph")
    graphs = [_as_graph(g, f"graphs[{k}]") for k, g in enumerate(graphs)]
    if method != "pbr":
        return [_order_one(g, method, seed, coords) for g in graphs]
    return _pbr_batch(graphs, seed, n_threads)


def octile_count(G, perm=None):
    """Statistics of the non-empty 8x8 tiles of ``G``'s adjacency in the order ``perm``.

    Returns a dict: ``n_nodes``, ``nnz`` (stored entries), ``tiles_per_side``
    (``ceil(n/8)``), ``nonempty_tiles``, ``offdiag_nonempty_tiles``,
    ``diag_nonempty_tiles``, and the stored entries per non-empty tile
    ``nnz_per_tile_mean``, ``_median``, ``_min``, ``_max`` (0 for a graph without edges).
    """
    G = _as_graph(G, "G")
    n = G.n_nodes
    rows, cols = G._rows(), G.indices.astype(np.int64)
    if perm is not None:
        perm = np.asarray(perm)
        if perm.shape != (n,) or perm.dtype.kind not in "iu" \
                or not np.array_equal(np.sort(perm), np.arange(n)):
            raise ValueError(f"perm must be a permutation of range({n}) (one int per vertex)")
        new_id = np.empty(n, dtype=np.int64)
        new_id[perm] = np.arange(n)
        rows, cols = new_id[rows], new_id[cols]
    per_side = -(-n // OCTILE)
    tile_r, tile_c = rows // OCTILE, cols // OCTILE
    tiles, per_tile = np.unique(tile_r * max(per_side, 1) + tile_c, return_counts=True)
    diag = int(np.count_nonzero(tiles // max(per_side, 1) == tiles % max(per_side, 1)))
    have = len(per_tile) > 0
    return {
        "n_nodes": n,
        "nnz": int(G.nnz),
        "tiles_per_side": per_side,
        "nonempty_tiles": int(len(tiles)),
        "offdiag_nonempty_tiles": int(len(tiles)) - diag,
        "diag_nonempty_tiles": diag,
        "nnz_per_tile_mean": float(per_tile.mean()) if have else 0.0,
        "nnz_per_tile_median": float(np.median(per_tile)) if have else 0.0,
        "nnz_per_tile_min": int(per_tile.min()) if have else 0,
        "nnz_per_tile_max": int(per_tile.max()) if have else 0,
    }
