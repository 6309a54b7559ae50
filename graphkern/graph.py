"""The graph model: an undirected graph as CSR with named node and edge label columns.

A :class:`Graph` stores each undirected edge twice (``(i, j)`` and ``(j, i)``), as a
symmetric CSR matrix with sorted column indices; a self-loop is stored once on the
diagonal.  Edge label columns are aligned with the CSR entries, so ``edge_labels[c][k]``
belongs to the entry ``indices[k]`` of its row.  Weights are ``None`` for an unweighted
graph (every edge weighs 1) so that kernels which do not need them read no value array.

A Graph's arrays are read-only and its own (a caller's writeable array is copied), so a
Graph cannot change behind the back of a cache: what was validated stays valid, and its
derived values (degrees, :attr:`Graph.fingerprint`) are computed once and kept.  A label
column set after construction is validated like one given to the constructor.
Validation runs in one compiled O(nnz) pass (``graphkern._cpu.validate``); a Graph built
with ``validate=False`` still has its row pointers and index range checked once, in the
same pass, before a kernel reads it (:meth:`Graph.require_valid`).

Label columns are one of:

* integer categories: shape ``(n,)``, an integer dtype (stored as int64); strings are
  turned into integer categories by :func:`category_code`, a stable hash, so that the
  same string gets the same code in every graph -- except the node label ``element``,
  whose element symbols ("C", "Cl") become atomic numbers, as every molecule reader writes;
* floats: shape ``(n,)``, float64;
* fixed-length float vectors: shape ``(n, d)``, float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from graphkern._arrays import (_INT32_MAX, _INT64_MAX, ATOMIC_NUMBER, DIFFERS, DUPLICATE, MISSING,
                               NEGATIVE, NONFINITE, NOT_ONE, RANGE, UNSORTED, LabelColumns,
                               category_code, frozen, content_fingerprint, index_dtype, indptr_problem, label_column, numeric,
                               require_memory, scan, scan_threads)
from graphkern._cpu import validate as _compiled

__all__ = ["Graph", "PackedGraphs", "pack_graphs", "label_arrays", "content_digest", "content_tokens",
           "as_csr_matrix", "category_code", "require_memory", "ATOMIC_NUMBER"]

class Graph:
    """An undirected graph with optional edge weights and named label columns.

    Build one with :meth:`from_edges`, :meth:`from_scipy` or :meth:`from_networkx`;
    the constructor takes an already symmetric CSR triple.  The arrays are read-only.

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
    validate : bool
        ``False`` skips the sort, duplicate, value and symmetry checks for trusted input;
        row pointers and the index range are still checked, once, before a kernel reads them.
    """

    __slots__ = ("_n", "_indptr", "_indices", "_weights", "_node_labels", "_edge_labels", "name",
                 "__weakref__", "_cache")

    def __init__(self, indptr, indices, weights=None, *, node_labels=None, edge_labels=None,
                 symmetrize=False, name=None, validate=True):
        indptr, indices = numeric(indptr, "indptr"), numeric(indices, "indices")
        if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
            raise TypeError("indptr and indices must be integer arrays")
        if indptr.ndim != 1 or len(indptr) < 1:
            raise ValueError("indptr must be a 1-D array of n_nodes + 1 row pointers")
        n = len(indptr) - 1
        nnz = int(indptr[-1])
        if indices.ndim != 1 or len(indices) != nnz:
            raise ValueError(f"indices has {indices.size} entries but indptr[-1] = {nnz}")
        if weights is not None:
            weights = numeric(weights, "weights")
            if weights.shape != (nnz,):
                raise ValueError(f"weights has shape {weights.shape}, expected ({nnz},): one per stored entry")
        self._store(indptr, indices, weights)
        self.name = name
        self._cache = {}
        self._node_labels = LabelColumns("node", n, self._cache, node_labels or {})
        self._edge_labels = LabelColumns("edge", nnz, self._cache, edge_labels or {})
        if validate:
            self._check(symmetrize)

    @classmethod
    def _trusted(cls, indptr, indices, weights, node_labels, edge_labels, *, views=False):
        """A Graph of arrays that a reader built valid (rows sorted, symmetric, indices in range,
        labels aligned): stored read-only in the constructor's dtypes, without its checks.
        ``views``: every array is already a read-only view of a read-only array in those dtypes
        (what :func:`frozen` would keep as it is), so they are stored without a look."""
        G = cls.__new__(cls)
        G.name, G._cache = None, {"valid": True}
        if views:
            G._n, G._indptr, G._indices, G._weights = len(indptr) - 1, indptr, indices, weights
            G._node_labels = LabelColumns._views("node", G._n, G._cache, node_labels)
            G._edge_labels = LabelColumns._views("edge", len(indices), G._cache, edge_labels)
            return G
        G._store(indptr, indices, weights)
        G._node_labels = LabelColumns("node", G._n, G._cache, validated=node_labels)
        G._edge_labels = LabelColumns("edge", G.nnz, G._cache, validated=edge_labels)
        return G

    def _store(self, indptr, indices, weights):
        """Keep the CSR arrays read-only, with indices as narrow as the sizes allow."""
        self._n = len(indptr) - 1
        self._indptr = frozen(indptr, index_dtype(len(indices)))
        self._indices = frozen(indices, index_dtype(self._n))
        self._weights = None if weights is None else frozen(weights, np.float64)

    n_nodes = property(lambda self: self._n, doc="Number of nodes.")
    indptr = property(lambda self: self._indptr, doc="Row pointers (read-only).")
    indices = property(lambda self: self._indices, doc="Sorted column indices of each row (read-only).")
    weights = property(lambda self: self._weights, doc="One weight per stored entry, or None (read-only).")
    node_labels = property(lambda self: self._node_labels, doc="Node label columns by name.")
    edge_labels = property(lambda self: self._edge_labels, doc="Edge label columns by name, one row per entry.")

    # ------------------------------------------------------------------ validation
    def _check(self, symmetrize):
        """Sort rows, then refuse duplicates, bad weights and asymmetry (or symmetrize)."""
        n, nnz = self._n, self.nnz
        problem = indptr_problem(self._indptr, nnz)
        if problem:
            raise ValueError(problem)
        first = scan(self._indptr, self._indices, self._weights, symmetric=True, signed=True)
        if first[RANGE] < nnz:
            raise ValueError(f"edge index {int(self._indices[first[RANGE]])} out of range for a graph of {n} nodes")
        if first[UNSORTED] < nnz:
            self._permute_entries(np.lexsort((self._indices, self._rows())))
            first = scan(self._indptr, self._indices, self._weights, symmetric=True, signed=True)
        for code, problem in ((DUPLICATE, "duplicate entry ({i}, {j}) in the adjacency; use Graph.from_scipy, "
                                          "which sums duplicates"),
                              (NONFINITE, "edge weight of ({i}, {j}) is not finite ({w})"),
                              (NEGATIVE, "negative edge weight {w} on edge ({i}, {j})")):
            k = int(first[code])
            if k < nnz:
                raise ValueError(problem.format(i=self._row_of(k), j=int(self._indices[k]),
                                                w=None if self._weights is None else self._weights[k]))
        k = int(first[MISSING])
        if k < nnz:
            if not symmetrize:
                i, j = self._row_of(k), int(self._indices[k])
                raise ValueError(f"adjacency is not symmetric: entry ({i}, {j}) is stored but ({j}, {i}) is not; "
                                 "pass symmetrize=True to add the missing directions")
            self._symmetrize()
            return
        if first[DIFFERS] < nnz or self._edge_labels:
            self._check_mirror_values(symmetrize, _compiled.mirror_positions(
                np.ascontiguousarray(self._indptr, dtype=np.int64), self._indices, scan_threads(nnz)))
        self._cache["valid"] = True

    def _check_mirror_values(self, symmetrize, mirror):
        """Weights and edge labels must equal their mirror entry's (or, symmetrizing, take the upper one's)."""
        nnz = self.nnz
        columns = [(None, "weight", self._weights)] + [(k, f"edge label {k!r}", v) for k, v in self._edge_labels.items()]
        for key, what, arr in columns:
            if arr is None or nnz == 0:
                continue
            mirrored = arr[mirror]
            differs = ~np.all((arr == mirrored).reshape(nnz, -1), axis=1)
            if not differs.any():
                continue
            if not symmetrize:
                k = int(np.flatnonzero(differs)[0])
                raise ValueError(f"adjacency is not symmetric: {what} of ({self._row_of(k)}, {int(self._indices[k])}) "
                                 f"differs from its mirror entry; pass symmetrize=True to keep the upper triangle's value")
            upper = self._rows() <= self._indices
            fixed = np.where(upper.reshape((nnz,) + (1,) * (arr.ndim - 1)), arr, mirrored)
            if key is None:
                self._weights = frozen(fixed, np.float64)
            else:
                self._edge_labels._put(key, fixed)

    def require_valid(self):
        """Check, once, that kernels can read this graph: row pointers and column index range.

        A validated graph passes at once; one built with ``validate=False`` is scanned in
        compiled code the first time (its arrays are read-only, so the answer stays true).
        """
        if not self._cache.get("valid") and not self._cache.get("indices_valid"):
            problem = indptr_problem(self._indptr, self.nnz)
            if problem is None:
                k = int(scan(self._indptr, self._indices, symmetric=False)[RANGE])
                if k < self.nnz:
                    problem = f"edge index {int(self._indices[k])} out of range for a graph of {self._n} nodes"
            if problem:
                raise ValueError(f"graph {self._label()}: {problem}")
            self._cache["indices_valid"] = True
        return self

    def _rows(self):
        return np.repeat(np.arange(self._n, dtype=np.int64), np.diff(self._indptr))

    def _row_of(self, k):
        return int(np.searchsorted(self._indptr, k, side="right") - 1)

    def _permute_entries(self, order):
        self._indices = frozen(self._indices[order], None)
        self._indptr = frozen(_indptr_of(self._rows()[order], self._n), self._indptr.dtype)
        if self._weights is not None:
            self._weights = frozen(self._weights[order], None)
        for key in list(self._edge_labels):
            self._edge_labels._put(key, self._edge_labels[key][order])

    def _symmetrize(self):
        n, nnz = self._n, self.nnz
        rows, cols = self._rows(), self._indices.astype(np.int64)
        both_r, both_c = np.concatenate([rows, cols]), np.concatenate([cols, rows])
        key = both_r * max(n, 1) + both_c
        # the first occurrence of each key wins: the originally stored entry beats its mirror
        _, first = np.unique(key, return_index=True)
        src = first % nnz if nnz else first
        r, c = both_r[first], both_c[first]
        self._indptr = frozen(_indptr_of(r, n), index_dtype(len(first)))
        self._indices = frozen(c, self._indices.dtype)
        if self._weights is not None:
            self._weights = frozen(self._weights[src], None)
        self._edge_labels = LabelColumns("edge", len(first), self._cache,
                                         validated={k: v[src] for k, v in self._edge_labels.items()})
        self._check(True)  # pattern is symmetric now; values settle on the upper triangle

    @property
    def fingerprint(self):
        """A hex digest of the graph's content (structure, weights, labels), computed once.

        Caches elsewhere key on it: two graphs with equal content have equal fingerprints,
        and a label column set later changes it.
        """
        fp = self._cache.get("fingerprint")
        if fp is None:
            fp = self._cache["fingerprint"] = content_fingerprint(f"graph {self._n}", self._named_arrays())
        return fp

    def _named_arrays(self):
        """Every array of the graph's content by name: structure, weights (None if unweighted), labels."""
        arrays = [("indptr", self._indptr), ("indices", self._indices), ("weights", self._weights)]
        arrays += [(f"node:{k}", v) for k, v in sorted(self._node_labels.items())]
        return arrays + [(f"edge:{k}", v) for k, v in sorted(self._edge_labels.items())]

    def __reduce__(self):
        state = (self._indptr, self._indices, self._weights, dict(self._node_labels), dict(self._edge_labels),
                 self.name, bool(self._cache.get("valid")))
        return _restore_graph, state

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_edges(cls, edges, n_nodes=None, *, weights=None, node_labels=None, edge_labels=None, name=None):
        """Build from a list of undirected edges ``(i, j)``, each given once.

        ``weights`` and every ``edge_labels`` column have one row per edge.  An edge
        given twice (as ``(i, j)`` and ``(j, i)`` or repeated) is an error.
        """
        e = numeric(edges, "edges (pairs of node numbers)", integral=True)
        if e.size == 0:
            e = e.reshape(0, 2)
        if e.ndim != 2 or e.shape[1] != 2:
            raise ValueError(f"edges must have shape (m, 2), got {e.shape}")
        if e.dtype == np.uint64 and e.size and e.max() > _INT64_MAX:
            raise ValueError(f"edge endpoint {int(e.max())} out of range")
        e = e.astype(np.int64)
        if n_nodes is None:
            n_nodes = int(e.max()) + 1 if len(e) else 0
        if isinstance(n_nodes, bool) or not isinstance(n_nodes, (int, np.integer)):
            raise TypeError(f"n_nodes must be an int, got {n_nodes!r}")
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
            raise ValueError(f"edge ({i}, {j}) is listed more than once (graphkern.io.read_edgelist merges an edge "
                             "list's repeats and both directions)")
        loop = lo == hi
        src = np.concatenate([np.arange(m), np.flatnonzero(~loop)])
        r, c = np.concatenate([e, e[~loop, ::-1]]).T  # each edge, then the mirror of each non-loop
        order = np.lexsort((c, r))
        r, c, src = r[order], c[order], src[order]
        indptr = _indptr_of(r, n_nodes)
        w = None
        if weights is not None:
            w = numeric(weights, "weights")
            if w.shape != (m,):
                raise ValueError(f"weights has shape {w.shape}, expected ({m},): one per edge")
            w = w[src]
        el = {}
        for key_, col in (edge_labels or {}).items():
            if hasattr(col, "__len__") and len(col) != m:
                raise ValueError(f"edge label {key_!r} has {len(col)} rows but {m} edges were given")
            el[key_] = label_column(col, m, what="edge", name=key_)[src]
        return cls(*_owned(indptr, c, w), node_labels=node_labels, edge_labels=el, name=name)

    @classmethod
    def from_scipy(cls, A, *, weighted=None, node_labels=None, symmetrize=False, name=None):
        """Build from a square scipy.sparse matrix (or array); duplicate entries are summed.

        ``weighted=None`` keeps the values as weights unless every stored value is 1.
        """
        if not sp.issparse(A):
            raise TypeError(f"expected a scipy.sparse matrix, got {type(A).__name__}")
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"adjacency matrix must be square, got shape {A.shape}")
        A, _ = _canonical_csr(A, "the adjacency matrix", copy=True)
        data = numeric(A.data, "the adjacency matrix's values").astype(np.float64, copy=False)
        if weighted is None:
            weighted = not np.all(data == 1.0)
        return cls(*_owned(A.indptr, A.indices, data if weighted else None), node_labels=node_labels,
                   symmetrize=symmetrize, name=name)

    @classmethod
    def from_networkx(cls, G, *, weight="weight", node_attrs=None, edge_attrs=None, name=None):
        """Build from an undirected networkx graph; attributes become label columns.

        ``node_attrs``/``edge_attrs`` name the attributes to keep (default: every
        attribute present on all nodes / all edges).  Nodes are numbered in
        ``G.nodes`` order; ``weight`` names the edge attribute used as weight
        (``None``: unweighted; an edge without it, where others have it, is an error).
        String values of the node attribute ``element`` are element symbols and become
        atomic numbers, as in every molecule reader; other strings become
        :func:`category_code` categories.
        """
        if not (hasattr(G, "is_directed") and hasattr(G, "nodes") and hasattr(G, "edges")):
            raise TypeError(f"G must be a networkx graph, got {type(G).__name__}")
        if G.is_directed():
            raise ValueError("networkx graph is directed; graphkern graphs are undirected (use G.to_undirected())")
        if G.is_multigraph():
            raise ValueError("networkx multigraphs are not supported; collapse parallel edges first")
        nodes = list(G.nodes)
        pos = {v: i for i, v in enumerate(nodes)}
        edges = [(pos[u], pos[v]) for u, v in G.edges]
        ndata = [G.nodes[v] for v in nodes]
        edata = [d for _, _, d in G.edges(data=True)]

        def table(dicts):  # the attributes any item has; one attribute's values, None where missing
            return (lambda: set().union(*dicts)), (lambda a: [d.get(a) for d in dicts])

        return _attributed(cls, len(nodes), edges, *table(ndata), *table(edata), weight, node_attrs, edge_attrs,
                           lambda k: "({!r}, {!r})".format(*list(G.edges)[k]), name)

    @classmethod
    def from_igraph(cls, G, *, weight="weight", node_attrs=None, edge_attrs=None, name=None):
        """Build from an undirected python-igraph graph, as :meth:`from_networkx` does: vertices in
        igraph's order, attributes as label columns (default: every vertex / edge attribute set on
        all of them, but the vertex ids ``name`` and ``_nx_name``), ``weight`` the edge attribute used
        as weight."""
        if not (hasattr(G, "vs") and hasattr(G, "es") and hasattr(G, "get_edgelist")):
            raise TypeError(f"G must be an igraph graph, got {type(G).__name__}")
        if G.is_directed():
            raise ValueError("igraph graph is directed; graphkern graphs are undirected (use G.as_undirected())")
        if G.has_multiple():
            raise ValueError("igraph multigraphs are not supported; collapse parallel edges first (G.simplify())")

        def table(seq, ids=()):  # igraph gives None where an item lacks the attribute
            def values(a):
                return seq[a] if a in seq.attributes() else [None] * len(seq)

            return (lambda: set(seq.attributes()) - set(ids)), values

        return _attributed(cls, G.vcount(), G.get_edgelist(), *table(G.vs, ("name", "_nx_name")), *table(G.es),
                           weight, node_attrs, edge_attrs, lambda k: str(G.es[k].tuple), name)

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
        loops = self._cache.get("n_self_loops")
        if loops is None:
            loops = self._cache["n_self_loops"] = int(np.count_nonzero(self._rows() == self._indices))
        return loops

    @property
    def is_weighted(self):
        return self.weights is not None

    @property
    def degrees(self):
        """Number of stored entries per row (a self-loop counts once), read-only, computed once."""
        deg = self._cache.get("degrees")
        if deg is None:
            deg = self._cache["degrees"] = frozen(np.diff(self._indptr), None)
        return deg

    def weight_array(self, dtype=np.float64):
        """Weights as an array, ones for an unweighted graph."""
        if self.weights is None:
            return np.ones(self.nnz, dtype=dtype)
        return self.weights.astype(dtype, copy=False)

    def to_scipy(self, dtype=np.float64):
        """The symmetric adjacency as a scipy.sparse.csr_matrix (ones if unweighted), sharing the
        graph's read-only index arrays."""
        A = sp.csr_matrix((self.weight_array(dtype), self.indices, self.indptr), shape=(self.n_nodes,) * 2)
        if self._cache.get("valid"):  # sorted rows without duplicates: SciPy need not check again
            A.has_canonical_format = True
        return A

    def edge_list(self):
        """Undirected edges ``(i, j)`` with ``i <= j``, in CSR order, and their entry positions."""
        rows = self._rows()
        upper = rows <= self.indices
        return np.stack([rows[upper], self.indices[upper].astype(np.int64)], axis=1), np.flatnonzero(upper)

    def to_networkx(self):
        import networkx as nx
        G = nx.Graph()
        G.add_nodes_from((i, {k: v[i].tolist() for k, v in self.node_labels.items()}) for i in range(self.n_nodes))
        edges, pos = self.edge_list()
        for (i, j), k in zip(edges.tolist(), pos.tolist()):
            attrs = {k_: v[k].tolist() for k_, v in self.edge_labels.items()}
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
        new_r, new_c = inv[self._rows()], inv[self.indices]
        order = np.lexsort((new_c, new_r))
        return Graph(_indptr_of(new_r, self.n_nodes), new_c[order], None if self.weights is None else self.weights[order],
                     node_labels={k: v[perm] for k, v in self.node_labels.items()},
                     edge_labels={k: v[order] for k, v in self.edge_labels.items()}, name=self.name)

    def require_node_label(self, name):
        return self._require_label(self.node_labels, "node", name)

    def require_edge_label(self, name):
        return self._require_label(self.edge_labels, "edge", name)

    def _require_label(self, columns, what, name):
        if name not in columns:
            have = ", ".join(map(repr, columns)) or "none"
            raise KeyError(f"graph {self._label()} has no {what} label {name!r} (it has: {have})")
        return columns[name]

    def _label(self):
        return repr(self.name) if self.name is not None else f"<{self.n_nodes} nodes>"

    def __repr__(self):
        parts = [f"{self.n_nodes} nodes", f"{self.n_edges} edges", "weighted" if self.is_weighted else "unweighted"]
        parts += [f"{what}_labels=" + ",".join(columns)
                  for what, columns in (("node", self.node_labels), ("edge", self.edge_labels)) if columns]
        return f"Graph({', '.join(parts)})"

    def __eq__(self, other):
        if not isinstance(other, Graph):
            return NotImplemented
        mine, theirs = self._named_arrays(), other._named_arrays()
        return [k for k, _ in mine] == [k for k, _ in theirs] and all(
            (a is None) == (b is None) and np.array_equal(a, b) for (_, a), (_, b) in zip(mine, theirs))

    __hash__ = object.__hash__


# lists of at least this many unchecked graphs are checked in one vectorised pass
_CHECK_TOGETHER = 16


def require_valid_all(graphs):
    """:meth:`Graph.require_valid` on every graph of ``graphs``, those not checked yet in one
    vectorised pass over their arrays laid end to end: on molecule-sized graphs a call per graph
    costs many times its compiled scan.  The first graph at fault raises its own error."""
    todo = [g for g in graphs if not (g._cache.get("valid") or g._cache.get("indices_valid"))]
    if len(todo) < _CHECK_TOGETHER:
        for g in todo:
            g.require_valid()
        return
    n = np.fromiter((g._n for g in todo), np.int64, len(todo))
    nnz = np.fromiter((len(g._indices) for g in todo), np.int64, len(todo))
    ptr = np.concatenate([g._indptr for g in todo]).astype(np.int64, copy=False)
    idx = np.concatenate([g._indices for g in todo])
    heads = np.zeros(len(todo) + 1, np.int64)
    np.cumsum(n + 1, out=heads[1:])
    bad = (ptr[heads[:-1]] != 0) | (ptr[heads[1:] - 1] != nnz)
    drops = np.diff(ptr) < 0
    drops[heads[1:-1] - 1] = False  # from one graph's last pointer to the next graph's first
    bad[np.searchsorted(heads, np.flatnonzero(drops), side="right") - 1] = True
    starts = np.zeros(len(todo) + 1, np.int64)
    np.cumsum(nnz, out=starts[1:])
    outside = np.flatnonzero((idx < 0) | (idx >= np.repeat(n, nnz)))
    bad[np.searchsorted(starts, outside, side="right") - 1] = True
    for k in np.flatnonzero(bad):
        todo[k].require_valid()  # raises, naming the graph and the problem
    for g in todo:
        g._cache["indices_valid"] = True


def _indptr_of(rows, n):
    """Row pointers of entries sorted by ``rows``."""
    return np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])


def _owned(*arrays):
    """Mark arrays a constructor has just made as read-only, so Graph takes them without a copy."""
    for a in arrays:
        if a is not None:
            a.flags.writeable = False
    return arrays


def _restore_graph(indptr, indices, weights, node_labels, edge_labels, name, valid):
    """Unpickle a Graph: its content was validated (or not) before it was pickled."""
    G = Graph(indptr, indices, weights, node_labels=node_labels, edge_labels=edge_labels, name=name,
              validate=False)
    G._cache["valid"] = valid
    return G


def _attributed(cls, n, edges, node_names, node_values, edge_names, edge_values, weight, node_attrs, edge_attrs,
                edge_name, name):
    """A Graph of ``n`` vertices and ``edges`` with label columns and weights from attribute tables:
    ``*_names()`` the attributes any vertex (edge) has, ``*_values(a)`` one value per vertex (edge),
    None where it lacks ``a``; ``edge_name(k)`` names edge ``k`` in errors.  By default the columns
    are the attributes every vertex (edge) has, the weight aside."""
    def columns(names, values, attrs, what, skip=None):
        if attrs is None:
            attrs = [a for a in sorted(names()) if a != skip and not _any_none(values(a))]
        out = {}
        for a in attrs:
            out[a] = values(a)
            if _any_none(out[a]):
                raise ValueError(f"{what} attribute {a!r} is missing on some {what}s")
        return out

    weights = None
    if weight is not None and weight in edge_names():
        weights = edge_values(weight)
        missing = next((k for k, w in enumerate(weights) if w is None), None)
        if missing is not None:
            raise ValueError(f"edge {edge_name(missing)} has no {weight!r} attribute but other edges have one; "
                             f"give every edge a weight, or pass weight=None for an unweighted graph")
        weights = numeric(weights, f"edge attribute {weight!r}")
    return cls.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), n, weights=weights,
                          node_labels=columns(node_names, node_values, node_attrs, "node"),
                          edge_labels=columns(edge_names, edge_values, edge_attrs, "edge", weight), name=name)


def _any_none(values):
    return any(v is None for v in values)


def _canonical_csr(A, name, *, copy=False, with_values=False):
    """``(csr, scanned)``: a square scipy.sparse ``A`` as CSR with sorted rows and summed duplicates.

    The size is checked before SciPy allocates; a BSR matrix's zero padding inside its blocks is
    no edge and is dropped (explicit zeros stored by other formats are kept as edges).
    ``with_values``: the scan also reads the values, and ``scanned`` is its result (see
    :func:`scan`) when the arrays come back as they were, so the caller need not scan them again;
    None otherwise.
    """
    if A.dtype.kind == "c":
        raise TypeError(f"{name} is complex; graphkern takes real matrices only")
    if A.dtype.kind not in "fiub":
        raise TypeError(f"{name} has unsupported dtype {A.dtype}")
    n = A.shape[0]
    if n > _INT32_MAX:
        raise ValueError(f"{name} has {n} rows; at most 2**31 - 1 are supported")
    require_memory((n + 1) * 8 + A.nnz * (4 + A.dtype.itemsize), f"{name} of shape {A.shape} as CSR")
    if A.format == "bsr":
        A = A.tocsr()
        A.eliminate_zeros()
    else:
        A = sp.csr_matrix(A, copy=copy)
    if not sp.isspmatrix_csr(A) or A.indptr.shape != (n + 1,):
        raise ValueError(f"{name} has a malformed index structure")
    problem = indptr_problem(A.indptr, len(A.indices))
    if problem:
        raise ValueError(f"{name}: {problem}")
    first = scan(A.indptr, A.indices, A.data if with_values else None, symmetric=False)
    if first[RANGE] < A.nnz:
        raise ValueError(f"{name} has a column index {int(A.indices[first[RANGE]])} out of range for {n} columns")
    if min(first[UNSORTED], first[DUPLICATE]) < A.nnz:
        A = A.copy() if not copy else A
        A.sum_duplicates()
        first = None  # the values changed
    else:  # a new matrix object sharing the arrays, so the caller's own flags are left alone
        A = sp.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape, copy=False)
    A.has_canonical_format = True
    return A, (first if with_values else None)


def as_csr_matrix(G, *, name="G"):
    """Return ``(csr_matrix, is_weighted)`` for a Graph, a square scipy.sparse matrix or an
    undirected networkx or igraph graph (:meth:`Graph.from_networkx`, :meth:`Graph.from_igraph`:
    rows in the library's vertex order, the ``weight`` attribute as weights).

    Duplicates are summed and indices sorted; asymmetric matrices and non-finite values raise, in
    one compiled O(nnz) pass (a Graph was checked when it was built).  A BSR matrix's zero padding
    is no edge.
    """
    library = (type(G).__module__ or "").split(".")[0]
    if library in ("networkx", "igraph"):
        convert = Graph.from_networkx if library == "networkx" else Graph.from_igraph
        try:
            G = convert(G, node_attrs=(), edge_attrs=())
        except (ValueError, TypeError) as err:
            raise type(err)(f"{name}: {err} ({name} was converted by graphkern.Graph.{convert.__name__}, which "
                            "takes other options when called directly)") from err
    if isinstance(G, Graph):
        G.require_valid()
        return G.to_scipy(), G.is_weighted
    if not sp.issparse(G):
        raise TypeError(f"{name} must be a graphkern.Graph, a scipy.sparse matrix or a networkx or igraph graph, "
                        f"got {type(G).__name__}")
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"{name} must be square, got shape {G.shape}")
    A, scanned = _canonical_csr(G, name, with_values=True)
    first = scan(A.indptr, A.indices, A.data, symmetric=True, first=scanned)
    if first[NONFINITE] < A.nnz:
        raise ValueError(f"{name} contains NaN or infinite values")
    if min(first[MISSING], first[DIFFERS]) < A.nnz:
        raise ValueError(f"{name} is not symmetric: graphkern treats graphs as undirected "
                         "(symmetrize it, e.g. A.maximum(A.T), or use Graph.from_scipy(A, symmetrize=True))")
    return A, bool(first[NOT_ONE] < A.nnz)


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


def _packed_weights(graphs, entry_offsets):
    """Every graph's weights in one array, ones for the unweighted (filled at once, not per graph)."""
    out = np.ones(int(entry_offsets[-1]))
    for k, g in enumerate(graphs):
        if g.weights is not None:
            out[entry_offsets[k]:entry_offsets[k + 1]] = g.weights
    return out


def _valid_graphs(graphs):
    """``graphs`` as a list, every item a validated Graph (another type raises TypeError naming it)."""
    graphs = list(graphs)
    for k, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"item {k} is a {type(g).__name__}, expected graphkern.Graph")
    require_valid_all(graphs)
    return graphs


def content_tokens(graphs):
    """One token per graph of ``graphs`` (validated first), the same object for as long as the
    graph's content stays as it is (a label column set, replaced or removed drops it): two equal
    tuples of tokens are graphs of the same content, at a few dictionary reads per graph."""
    graphs = _valid_graphs(graphs)
    return tuple([g._cache.get("content_token") or g._cache.setdefault("content_token", object()) for g in graphs])


def content_digest(graphs, node_label_columns=(), edge_label_columns=()):
    """A digest of what :func:`pack_graphs` reads from ``graphs`` with these label columns (every
    graph's structure, weights and those columns; a missing column counts as absent), in one
    compiled pass over all their arrays: a cache key, not cryptographic.  Graphs are validated
    first, so the digest is of the arrays packing sees."""
    graphs = _valid_graphs(graphs)
    node_cols, edge_cols = tuple(map(str, node_label_columns)), tuple(map(str, edge_label_columns))
    parts = []
    for g in graphs:
        node, edge = g._node_labels, g._edge_labels
        parts += [g._indptr, g._indices, g._weights]
        parts += [node.get(col) for col in node_cols]
        parts += [edge.get(col) for col in edge_cols]
    return _compiled.fingerprint(repr((len(graphs), node_cols, edge_cols)).encode(), parts)


def label_arrays(graphs, what, column):
    """Each graph's ``what`` ("node" or "edge") label ``column``.  A graph without vertices (edges)
    has every label of that kind, empty: where it lacks the column it gets an empty one of the
    dtype and trailing shape of the first graph that has it (a one-atom molecule from networkx has
    no bond to carry a bond attribute).  A missing column elsewhere raises the KeyError of
    :meth:`Graph.require_node_label` (:meth:`Graph.require_edge_label`)."""
    node = what == "node"
    arrays = [g._node_labels.get(column) if node else g._edge_labels.get(column) for g in graphs]
    template = None
    for g, arr in zip(graphs, arrays):
        if arr is None and (g.n_nodes if node else g.nnz):
            (g.require_node_label if node else g.require_edge_label)(column)  # raises, naming the graph
        if template is None and arr is not None:
            template = arr
    if any(arr is None for arr in arrays):
        empty = np.zeros((0,) + template.shape[1:], template.dtype) if template is not None else np.zeros(0)
        arrays = [empty if arr is None else arr for arr in arrays]
    return arrays


def pack_graphs(graphs, *, node_label_columns=(), edge_label_columns=()):
    """Pack ``graphs`` into one :class:`PackedGraphs` batch (the one shared packing routine).

    Missing label columns raise a KeyError naming the graph and the column (graphs without
    vertices or edges have every such column, empty: :func:`label_arrays`).
    """
    graphs = _valid_graphs(graphs)
    n = np.array([g.n_nodes for g in graphs], dtype=np.int64)
    m = np.array([g.nnz for g in graphs], dtype=np.int64)
    node_offsets = np.concatenate([[0], np.cumsum(n)])
    entry_offsets = np.concatenate([[0], np.cumsum(m)])
    idx_t = index_dtype(int(entry_offsets[-1]))
    cat = (lambda arrs, dt: np.concatenate(arrs).astype(dt, copy=False) if arrs else np.zeros(0, dt))
    packed = PackedGraphs(node_offsets=node_offsets, entry_offsets=entry_offsets,
                          indptr=cat([g.indptr for g in graphs], idx_t), indices=cat([g.indices for g in graphs], np.int32),
                          weights=_packed_weights(graphs, entry_offsets))
    for out, what, columns in ((packed.node_labels, "node", node_label_columns),
                               (packed.edge_labels, "edge", edge_label_columns)):
        for col in columns:
            out[col] = np.concatenate(label_arrays(graphs, what, col)) if graphs else np.zeros(0)
    return packed
