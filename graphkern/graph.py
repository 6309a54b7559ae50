"""The graph model: an undirected graph as CSR with named node and edge label columns.

A :class:`Graph` stores each undirected edge twice (``(i, j)`` and ``(j, i)``), as a
symmetric CSR matrix with sorted column indices; a self-loop is stored once on the
diagonal.  Edge label columns are aligned with the CSR entries, so ``edge_labels[c][k]``
belongs to the entry ``indices[k]`` of its row.  Weights are ``None`` for an unweighted
graph (every edge weighs 1) so that kernels which do not need them read no value array.

Label columns are one of:

* integer categories: shape ``(n,)``, an integer dtype (stored as int64); strings are
  turned into integer categories by :func:`category_code`, a stable hash, so that the
  same string gets the same code in every graph;
* floats: shape ``(n,)``, float64;
* fixed-length float vectors: shape ``(n, d)``, float64.

Many graphs are packed into one contiguous batch by :func:`pack_graphs`; every
capability that ships graphs to a device uses that routine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

__all__ = ["Graph", "PackedGraphs", "pack_graphs", "as_csr_matrix", "as_graph_list", "category_code"]

_INT32_MAX = np.iinfo(np.int32).max


def _index_dtype(nnz):
    return np.int32 if nnz <= _INT32_MAX else np.int64


def category_code(value):
    """A stable int64 code for a string category ('C', 'aromatic', ...), equal across graphs and runs."""
    digest = hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) & 0x7FFFFFFFFFFFFFFF


def _label_column(values, length, *, what, name):
    """Validate and normalise one label column of ``length`` rows."""
    arr = np.asarray(values)
    if arr.dtype.kind in "US" or (arr.dtype == object and arr.size and all(isinstance(v, str) for v in arr.ravel())):
        if arr.ndim != 1:
            raise ValueError(f"{what} label {name!r}: string labels must be one column, got shape {arr.shape}")
        return np.array([category_code(v) for v in arr.tolist()], dtype=np.int64)
    if arr.dtype == object:
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{what} label {name!r}: values must be numbers, got objects") from None
    if arr.ndim == 0 or arr.ndim > 2:
        raise ValueError(f"{what} label {name!r}: expected shape ({length},) or ({length}, d), got {arr.shape}")
    if arr.shape[0] != length:
        raise ValueError(f"{what} label {name!r} has {arr.shape[0]} rows but the graph has {length} "
                         f"{'nodes' if what == 'node' else 'stored edge entries'}")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.integer):
        if arr.ndim != 1:
            raise ValueError(f"{what} label {name!r}: integer labels must be one column, got shape {arr.shape}")
        return np.ascontiguousarray(arr, dtype=np.int64)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{what} label {name!r}: unsupported dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        pos = int(np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1))[0]) if arr.size else 0
        kind = "NaN" if np.isnan(arr).any() else "infinite"
        raise ValueError(f"{what} label {name!r} has a {kind} value at {what} {pos}")
    return arr


class Graph:
    """An undirected graph with optional edge weights and named label columns.

    Build one with :meth:`from_edges`, :meth:`from_scipy` or :meth:`from_networkx`;
    the constructor takes an already symmetric CSR triple.

    Parameters
    ----------
    indptr, indices : array_like
        CSR structure of the symmetric adjacency matrix (``n_nodes + 1`` row pointers).
    weights : array_like or None
        One non-negative finite weight per stored entry, or ``None`` for unweighted.
    node_labels, edge_labels : dict of str -> array_like
        Named label columns; edge columns are aligned with the stored entries.
    symmetrize : bool
        If the matrix is not symmetric, add its transpose (``A + A.T`` pattern, values
        of the existing entry where only one direction exists) instead of raising.
    """

    __slots__ = ("n_nodes", "indptr", "indices", "weights", "node_labels", "edge_labels", "name",
                 "__weakref__", "_cache")

    def __init__(self, indptr, indices, weights=None, *, node_labels=None, edge_labels=None,
                 symmetrize=False, name=None, validate=True):
        indptr = np.asarray(indptr)
        indices = np.asarray(indices)
        if indptr.ndim != 1 or len(indptr) < 1:
            raise ValueError("indptr must be a 1-D array of n_nodes + 1 row pointers")
        n = len(indptr) - 1
        nnz = int(indptr[-1]) if n >= 0 else 0
        if validate:
            if not (np.issubdtype(indptr.dtype, np.integer) and np.issubdtype(indices.dtype, np.integer)):
                raise TypeError("indptr and indices must be integer arrays")
            if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
                raise ValueError("indptr must start at 0 and never decrease")
            if indices.ndim != 1 or len(indices) != nnz:
                raise ValueError(f"indices has {indices.size} entries but indptr[-1] = {nnz}")
            if nnz and (indices.min() < 0 or indices.max() >= n):
                bad = int(indices[(indices < 0) | (indices >= n)][0])
                raise ValueError(f"edge index {bad} out of range for a graph of {n} nodes")
        if weights is not None:
            weights = np.asarray(weights, dtype=np.float64)
            if weights.shape != (nnz,):
                raise ValueError(f"weights has shape {weights.shape}, expected ({nnz},): one per stored entry")
        idx_t = _index_dtype(nnz)
        self.n_nodes = n
        self.indptr = np.ascontiguousarray(indptr, dtype=idx_t)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32 if n <= _INT32_MAX else np.int64)
        self.weights = None if weights is None else np.ascontiguousarray(weights)
        self.name = name
        self._cache = {}
        self.node_labels = {}
        self.edge_labels = {}
        for key, col in (node_labels or {}).items():
            self.node_labels[str(key)] = _label_column(col, n, what="node", name=key)
        for key, col in (edge_labels or {}).items():
            self.edge_labels[str(key)] = _label_column(col, nnz, what="edge", name=key)
        if validate:
            self._sort_and_check(symmetrize)

    # ------------------------------------------------------------------ validation
    def _sort_and_check(self, symmetrize):
        n, nnz = self.n_nodes, len(self.indices)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))
        cols = self.indices.astype(np.int64, copy=False)
        key = rows * max(n, 1) + cols
        order = np.argsort(key, kind="stable")
        if not np.all(order == np.arange(nnz)):
            self._permute_entries(order)
            key = key[order]
        if nnz > 1 and np.any(key[1:] == key[:-1]):
            k = int(np.flatnonzero(key[1:] == key[:-1])[0])
            i, j = divmod(int(key[k]), max(n, 1))
            raise ValueError(f"duplicate entry ({i}, {j}) in the adjacency; use Graph.from_scipy, which sums duplicates")
        if self.weights is not None:
            w = self.weights
            if not np.all(np.isfinite(w)):
                k = int(np.flatnonzero(~np.isfinite(w))[0])
                raise ValueError(f"edge weight of ({self._row_of(k)}, {int(self.indices[k])}) is not finite ({w[k]})")
            if np.any(w < 0):
                k = int(np.flatnonzero(w < 0)[0])
                raise ValueError(f"negative edge weight {w[k]} on edge ({self._row_of(k)}, {int(self.indices[k])})")
        # symmetry: the transpose's sorted keys must equal ours, entry for entry
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))
        cols = self.indices.astype(np.int64, copy=False)
        tkey = cols * max(n, 1) + rows
        torder = np.argsort(tkey, kind="stable")
        pattern_ok = np.array_equal(tkey[torder], rows * max(n, 1) + cols)
        if not pattern_ok:
            if not symmetrize:
                missing = np.setdiff1d(tkey, rows * max(n, 1) + cols)
                j, i = divmod(int(missing[0]), max(n, 1))
                raise ValueError(f"adjacency is not symmetric: entry ({j}, {i}) is stored but ({i}, {j}) is not; "
                                 "pass symmetrize=True to add the missing directions")
            self._symmetrize()
            return
        # values and edge labels must match their mirror entry
        for what, arr in [("weight", self.weights)] + [(f"edge label {k!r}", v) for k, v in self.edge_labels.items()]:
            if arr is None:
                continue
            mirror = arr[torder]
            if nnz == 0:
                continue
            differs = ~np.all((arr == mirror).reshape(nnz, -1), axis=1)
            if differs.any():
                if not symmetrize:
                    k = int(np.flatnonzero(differs)[0])
                    raise ValueError(f"adjacency is not symmetric: {what} of ({self._row_of(k)}, {int(self.indices[k])}) "
                                     f"differs from its mirror entry; pass symmetrize=True to keep the upper triangle's value")
                # keep the value stored on the upper triangle (row <= col)
                upper = rows <= cols
                fixed = np.where(upper.reshape((nnz,) + (1,) * (arr.ndim - 1)), arr, mirror)
                if what == "weight":
                    self.weights = np.ascontiguousarray(fixed)
                else:
                    self.edge_labels[what[12:-1]] = np.ascontiguousarray(fixed)

    def _row_of(self, k):
        return int(np.searchsorted(self.indptr, k, side="right") - 1)

    def _permute_entries(self, order):
        n = self.n_nodes
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))[order]
        self.indices = np.ascontiguousarray(self.indices[order])
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(self.indptr.dtype)
        if self.weights is not None:
            self.weights = np.ascontiguousarray(self.weights[order])
        for key in self.edge_labels:
            self.edge_labels[key] = np.ascontiguousarray(self.edge_labels[key][order])

    def _symmetrize(self):
        n, nnz = self.n_nodes, len(self.indices)
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))
        cols = self.indices.astype(np.int64)
        both_r = np.concatenate([rows, cols])
        both_c = np.concatenate([cols, rows])
        key = both_r * max(n, 1) + both_c
        # the first occurrence of each key wins: the originally stored entry beats its mirror
        _, first = np.unique(key, return_index=True)
        src = first % nnz if nnz else first
        r, c = both_r[first], both_c[first]
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))]).astype(_index_dtype(len(first)))
        self.indices = np.ascontiguousarray(c, dtype=self.indices.dtype)
        if self.weights is not None:
            self.weights = np.ascontiguousarray(self.weights[src])
        for key_ in self.edge_labels:
            self.edge_labels[key_] = np.ascontiguousarray(self.edge_labels[key_][src])
        self._sort_and_check(True)  # pattern is symmetric now; values settle on the upper triangle

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_edges(cls, edges, n_nodes=None, *, weights=None, node_labels=None, edge_labels=None, name=None):
        """Build from a list of undirected edges ``(i, j)``, each given once.

        ``weights`` and every ``edge_labels`` column have one row per edge.  An edge
        given twice (as ``(i, j)`` and ``(j, i)`` or repeated) is an error.
        """
        e = np.asarray(edges, dtype=np.int64)
        if e.size == 0:
            e = e.reshape(0, 2)
        if e.ndim != 2 or e.shape[1] != 2:
            raise ValueError(f"edges must have shape (m, 2), got {e.shape}")
        if n_nodes is None:
            n_nodes = int(e.max()) + 1 if len(e) else 0
        n_nodes = int(n_nodes)
        if n_nodes < 0:
            raise ValueError("n_nodes must be non-negative")
        if len(e) and (e.min() < 0 or e.max() >= n_nodes):
            bad = e[(e < 0) | (e >= n_nodes)][0]
            raise ValueError(f"edge endpoint {int(bad)} out of range for a graph of {n_nodes} nodes")
        m = len(e)
        lo, hi = np.minimum(e[:, 0], e[:, 1]), np.maximum(e[:, 0], e[:, 1])
        key = lo * max(n_nodes, 1) + hi
        uniq, counts = np.unique(key, return_counts=True)
        if np.any(counts > 1):
            i, j = divmod(int(uniq[counts > 1][0]), max(n_nodes, 1))
            raise ValueError(f"edge ({i}, {j}) is listed more than once")
        loop = lo == hi
        src = np.concatenate([np.arange(m), np.flatnonzero(~loop)])
        r = np.concatenate([e[:, 0], e[~loop, 1]])
        c = np.concatenate([e[:, 1], e[~loop, 0]])
        order = np.lexsort((c, r))
        r, c, src = r[order], c[order], src[order]
        indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n_nodes))])
        w = None
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (m,):
                raise ValueError(f"weights has shape {w.shape}, expected ({m},): one per edge")
            w = w[src]
        el = {}
        for key_, col in (edge_labels or {}).items():
            col = np.asarray(col)
            if len(col) != m:
                raise ValueError(f"edge label {key_!r} has {len(col)} rows but {m} edges were given")
            el[key_] = col[src]
        return cls(indptr, c, w, node_labels=node_labels, edge_labels=el, name=name)

    @classmethod
    def from_scipy(cls, A, *, weighted=None, node_labels=None, symmetrize=False, name=None):
        """Build from a square scipy.sparse matrix (or array); duplicate entries are summed.

        ``weighted=None`` keeps the values as weights unless every stored value is 1.
        """
        if not sp.issparse(A):
            raise TypeError(f"expected a scipy.sparse matrix, got {type(A).__name__}")
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"adjacency matrix must be square, got shape {A.shape}")
        A = sp.csr_matrix(A, copy=True)
        A.sum_duplicates()
        A.sort_indices()
        data = np.asarray(A.data, dtype=np.float64)
        if weighted is None:
            weighted = not np.all(data == 1.0)
        return cls(A.indptr, A.indices, data if weighted else None, node_labels=node_labels,
                   symmetrize=symmetrize, name=name)

    @classmethod
    def from_networkx(cls, G, *, weight="weight", node_attrs=None, edge_attrs=None, name=None):
        """Build from an undirected networkx graph; attributes become label columns.

        ``node_attrs``/``edge_attrs`` name the attributes to keep (default: every
        attribute present on all nodes / all edges).  Nodes are numbered in
        ``G.nodes`` order; ``weight`` names the edge attribute used as weight
        (``None``: unweighted).
        """
        if G.is_directed():
            raise ValueError("networkx graph is directed; graphkern graphs are undirected (use G.to_undirected())")
        if G.is_multigraph():
            raise ValueError("networkx multigraphs are not supported; collapse parallel edges first")
        nodes = list(G.nodes)
        pos = {v: i for i, v in enumerate(nodes)}
        edges = [(pos[u], pos[v]) for u, v in G.edges]
        edata = [d for _, _, d in G.edges(data=True)]
        ndata = [G.nodes[v] for v in nodes]

        def common(dicts):
            keys = None
            for d in dicts:
                keys = set(d) if keys is None else keys & set(d)
            return sorted(keys or ())

        if node_attrs is None:
            node_attrs = common(ndata)
        if edge_attrs is None:
            edge_attrs = [k for k in common(edata) if k != weight]
        node_labels = {}
        for a in node_attrs:
            try:
                node_labels[a] = [d[a] for d in ndata]
            except KeyError:
                raise ValueError(f"node attribute {a!r} is missing on some nodes") from None
        edge_labels = {}
        for a in edge_attrs:
            try:
                edge_labels[a] = [d[a] for d in edata]
            except KeyError:
                raise ValueError(f"edge attribute {a!r} is missing on some edges") from None
        weights = None
        if weight is not None and edata and all(weight in d for d in edata):
            weights = [d[weight] for d in edata]
        return cls.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), len(nodes), weights=weights,
                              node_labels=node_labels, edge_labels=edge_labels, name=name)

    # ------------------------------------------------------------------ views
    @property
    def nnz(self):
        """Number of stored entries (each undirected edge twice, each self-loop once)."""
        return len(self.indices)

    @property
    def n_edges(self):
        """Number of undirected edges (self-loops counted once)."""
        loops = self.n_self_loops
        return (self.nnz - loops) // 2 + loops

    @property
    def n_self_loops(self):
        rows = np.repeat(np.arange(self.n_nodes), np.diff(self.indptr))
        return int(np.count_nonzero(rows == self.indices))

    @property
    def is_weighted(self):
        return self.weights is not None

    @property
    def degrees(self):
        """Number of stored entries per row (a self-loop counts once)."""
        return np.diff(self.indptr)

    def weight_array(self, dtype=np.float64):
        """Weights as an array, ones for an unweighted graph."""
        if self.weights is None:
            return np.ones(self.nnz, dtype=dtype)
        return self.weights.astype(dtype, copy=False)

    def to_scipy(self, dtype=np.float64):
        """The symmetric adjacency as a scipy.sparse.csr_matrix (ones if unweighted)."""
        return sp.csr_matrix((self.weight_array(dtype), self.indices, self.indptr), shape=(self.n_nodes,) * 2)

    def edge_list(self):
        """Undirected edges ``(i, j)`` with ``i <= j``, in CSR order, and their entry positions."""
        rows = np.repeat(np.arange(self.n_nodes, dtype=np.int64), np.diff(self.indptr))
        upper = rows <= self.indices
        return np.stack([rows[upper], self.indices[upper].astype(np.int64)], axis=1), np.flatnonzero(upper)

    def to_networkx(self):
        import networkx as nx
        G = nx.Graph()
        for i in range(self.n_nodes):
            G.add_node(i, **{k: (v[i].tolist() if v.ndim == 2 else v[i].item()) for k, v in self.node_labels.items()})
        edges, pos = self.edge_list()
        for (i, j), k in zip(edges.tolist(), pos.tolist()):
            attrs = {k_: (v[k].tolist() if v.ndim == 2 else v[k].item()) for k_, v in self.edge_labels.items()}
            if self.weights is not None:
                attrs["weight"] = float(self.weights[k])
            G.add_edge(i, j, **attrs)
        return G

    def permute(self, perm):
        """The same graph with node ``perm[k]`` renumbered ``k`` (labels follow)."""
        perm = np.asarray(perm, dtype=np.int64)
        if perm.shape != (self.n_nodes,) or not np.array_equal(np.sort(perm), np.arange(self.n_nodes)):
            raise ValueError("perm must be a permutation of range(n_nodes)")
        inv = np.empty_like(perm)
        inv[perm] = np.arange(self.n_nodes)
        rows = np.repeat(np.arange(self.n_nodes), np.diff(self.indptr))
        new_r, new_c = inv[rows], inv[self.indices]
        order = np.lexsort((new_c, new_r))
        indptr = np.concatenate([[0], np.cumsum(np.bincount(new_r, minlength=self.n_nodes))])
        return Graph(indptr, new_c[order], None if self.weights is None else self.weights[order],
                     node_labels={k: v[perm] for k, v in self.node_labels.items()},
                     edge_labels={k: v[order] for k, v in self.edge_labels.items()}, name=self.name)

    def require_node_label(self, name):
        try:
            return self.node_labels[name]
        except KeyError:
            have = ", ".join(map(repr, self.node_labels)) or "none"
            raise KeyError(f"graph {self._label()} has no node label {name!r} (it has: {have})") from None

    def require_edge_label(self, name):
        try:
            return self.edge_labels[name]
        except KeyError:
            have = ", ".join(map(repr, self.edge_labels)) or "none"
            raise KeyError(f"graph {self._label()} has no edge label {name!r} (it has: {have})") from None

    def _label(self):
        return repr(self.name) if self.name is not None else f"<{self.n_nodes} nodes>"

    def __repr__(self):
        extra = []
        if self.node_labels:
            extra.append("node_labels=" + ",".join(self.node_labels))
        if self.edge_labels:
            extra.append("edge_labels=" + ",".join(self.edge_labels))
        w = "weighted" if self.is_weighted else "unweighted"
        return f"Graph({self.n_nodes} nodes, {self.n_edges} edges, {w}{', ' if extra else ''}{', '.join(extra)})"

    def __eq__(self, other):
        if not isinstance(other, Graph):
            return NotImplemented
        if self.n_nodes != other.n_nodes or not np.array_equal(self.indptr, other.indptr) \
                or not np.array_equal(self.indices, other.indices):
            return False
        if (self.weights is None) != (other.weights is None):
            return False
        if self.weights is not None and not np.array_equal(self.weights, other.weights):
            return False
        for a, b in ((self.node_labels, other.node_labels), (self.edge_labels, other.edge_labels)):
            if a.keys() != b.keys() or any(not np.array_equal(a[k], b[k]) for k in a):
                return False
        return True

    __hash__ = object.__hash__


def as_csr_matrix(G, *, name="G", allow_asymmetric=False):
    """Return ``(csr_matrix, is_weighted)`` for a Graph or a square scipy.sparse matrix.

    Duplicates are summed and indices sorted.  An asymmetric matrix raises unless
    ``allow_asymmetric``.  Negative or non-finite values raise.
    """
    if isinstance(G, Graph):
        return G.to_scipy(), G.is_weighted
    if not sp.issparse(G):
        raise TypeError(f"{name} must be a graphkern.Graph or a scipy.sparse matrix, got {type(G).__name__}")
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"{name} must be square, got shape {G.shape}")
    A = sp.csr_matrix(G)
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    if A.dtype.kind not in "fiub":
        raise TypeError(f"{name} has unsupported dtype {A.dtype}")
    data = A.data
    if data.dtype.kind == "f" and not np.all(np.isfinite(data)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if not allow_asymmetric:
        diff = A - A.T
        diff.eliminate_zeros()
        # the stored pattern, explicit zeros included: an unmirrored stored zero is an asymmetric edge
        P = sp.csr_matrix((np.ones(A.nnz, dtype=np.int8), A.indices, A.indptr), shape=A.shape)
        pattern_diff = P - P.T
        pattern_diff.eliminate_zeros()
        if diff.nnz or pattern_diff.nnz:
            raise ValueError(f"{name} is not symmetric: graphkern treats graphs as undirected "
                             "(symmetrize it, e.g. A.maximum(A.T), or use Graph.from_scipy(A, symmetrize=True))")
    weighted = not (data.size == 0 or np.all(data == 1))
    return A, weighted


def as_graph_list(X, name="X"):
    """``X`` as a list of :class:`Graph`, with errors naming ``name`` and the bad item.

    A single Graph is refused (it is almost always a forgotten ``[G]``).
    """
    if isinstance(X, Graph):
        raise TypeError(f"{name} must be a sequence of graphs, got a single Graph (wrap it in a list: [{name}])")
    try:
        graphs = list(X)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of graphkern.Graph, got {type(X).__name__}") from None
    for k, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"{name}[{k}] is a {type(g).__name__}, expected graphkern.Graph")
    return graphs


@dataclass
class PackedGraphs:
    """Many graphs in one contiguous batch: per-graph offsets into concatenated arrays.

    ``indptr`` holds each graph's local row pointers back to back (``n_i + 1`` each,
    starting at ``node_offsets[g] + g``), ``indices`` the local column indices, and
    ``entry_offsets[g]`` where graph ``g``'s entries begin.  Node and edge label
    columns are concatenated in the same way.
    """

    node_offsets: np.ndarray
    entry_offsets: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    node_labels: dict = field(default_factory=dict)
    edge_labels: dict = field(default_factory=dict)

    @property
    def n_graphs(self):
        return len(self.node_offsets) - 1

    def indptr_of(self, g):
        start = self.node_offsets[g] + g
        return self.indptr[start:self.node_offsets[g + 1] + g + 1]


def pack_graphs(graphs, *, node_label_columns=(), edge_label_columns=(), weight_dtype=np.float64):
    """Pack ``graphs`` into one :class:`PackedGraphs` batch (the one shared packing routine).

    Missing label columns raise a KeyError naming the graph and the column.
    """
    graphs = list(graphs)
    for k, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"item {k} is a {type(g).__name__}, expected graphkern.Graph")
    n = np.array([g.n_nodes for g in graphs], dtype=np.int64)
    m = np.array([g.nnz for g in graphs], dtype=np.int64)
    node_offsets = np.concatenate([[0], np.cumsum(n)])
    entry_offsets = np.concatenate([[0], np.cumsum(m)])
    total = int(entry_offsets[-1])
    idx_t = np.int32 if total <= _INT32_MAX else np.int64
    cat = (lambda arrs, dt: np.concatenate(arrs).astype(dt, copy=False) if arrs else np.zeros(0, dt))
    packed = PackedGraphs(
        node_offsets=node_offsets,
        entry_offsets=entry_offsets,
        indptr=cat([g.indptr for g in graphs], idx_t),
        indices=cat([g.indices for g in graphs], np.int32),
        weights=cat([g.weight_array(weight_dtype) for g in graphs], weight_dtype),
    )
    for col in node_label_columns:
        packed.node_labels[col] = np.concatenate([g.require_node_label(col) for g in graphs]) if graphs else np.zeros(0)
    for col in edge_label_columns:
        packed.edge_labels[col] = np.concatenate([g.require_edge_label(col) for g in graphs]) if graphs else np.zeros(0)
    return packed
