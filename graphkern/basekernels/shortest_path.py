"""Base kernels of the shortest-path graph kernel: on vertices and on path lengths.

Vertex kernels compare two vertices through their label columns:

* :class:`DiracNode` -- 1 if an integer (category) column is equal, else 0;
* :class:`GaussianNode` -- ``exp(-gamma * ||x - y||^2)`` on a float column (scalar or
  vector), with ``gamma = 1 / (2 sigma^2)``; give ``sigma`` or ``gamma``;
* :class:`ProductNode` -- the product of several of these (also written ``k1 * k2``),
  for mixed discrete and continuous labels.

Every product therefore reduces to one form, which the CPU and GPU backends evaluate:
``[all Dirac columns equal] * exp(-sum_d w_d (x_d - y_d)^2)`` where the Gaussian
columns are laid side by side and ``w_d`` is the ``gamma`` of the factor owning
dimension ``d``.

Path-length kernels compare two shortest-path lengths ``w, w'``:

* :class:`DiracEdge` -- ``[w == w']`` (exact equality of the float64 lengths);
* :class:`GaussianEdge` -- ``exp(-gamma (w - w')^2)``, ``gamma = 1 / (2 sigma^2)``;
* :class:`BrownianBridgeEdge` -- ``max(0, c - |w - w'|)``.

All of them are positive semidefinite, so the graph kernel built on them is too.
"""

from __future__ import annotations

import numbers

import numpy as np

from graphkern.graph import Graph

__all__ = ["NodeKernel", "DiracNode", "GaussianNode", "ProductNode",
           "EdgeKernel", "DiracEdge", "GaussianEdge", "BrownianBridgeEdge"]

# codes shared with graphkern/_cpu/spgk.pyx and cuda_src/spgk.cu
EDGE_DIRAC, EDGE_GAUSSIAN, EDGE_BROWNIAN = 0, 1, 2


def _positive(value, name, owner):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a positive number, got {value!r}")
    value = float(value)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: {name} must be positive and finite, got {value}")
    return value


def _gamma_from(sigma, gamma, owner):
    if (sigma is None) == (gamma is None):
        raise ValueError(f"{owner}: give exactly one of sigma and gamma (gamma = 1 / (2 sigma^2))")
    if gamma is not None:
        return _positive(gamma, "gamma", owner)
    sigma = _positive(sigma, "sigma", owner)
    denominator = 2.0 * sigma * sigma
    gamma = 1.0 / denominator if denominator > 0 else np.inf
    if not np.isfinite(gamma):
        raise ValueError(f"{owner}: sigma={sigma} is so small that gamma = 1/(2 sigma^2) overflows")
    return gamma


def _column_name(column, owner):
    if not isinstance(column, str) or not column:
        raise TypeError(f"{owner}: the label column must be a non-empty string, got {column!r}")
    return column


class NodeKernel:
    """A kernel on pairs of vertices, read from the graphs' node label columns."""

    def factors(self):
        """The Dirac and Gaussian factors whose product this kernel is (a Dirac or Gaussian kernel: itself)."""
        return (self,)

    def __mul__(self, other):
        if not isinstance(other, NodeKernel):
            return NotImplemented
        return ProductNode(self, other)

    def __eq__(self, other):
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self).__name__, self._key()))


class DiracNode(NodeKernel):
    """``k(u, v) = 1`` if the integer label ``column`` of ``u`` and ``v`` is equal, else 0.

    String labels are integer categories already (see :func:`graphkern.graph.category_code`).
    """

    def __init__(self, column):
        self.column = _column_name(column, "DiracNode")

    def _key(self):
        return (self.column,)

    def __repr__(self):
        return f"DiracNode({self.column!r})"


class GaussianNode(NodeKernel):
    """``k(u, v) = exp(-gamma * ||x_u - x_v||^2)`` on the float column ``column``.

    Give ``sigma`` (then ``gamma = 1 / (2 sigma^2)``) or ``gamma``.  The column may be a
    scalar per vertex or a fixed-length vector; integer columns are read as floats.
    """

    def __init__(self, column, *, sigma=None, gamma=None):
        self.column = _column_name(column, "GaussianNode")
        self.sigma = sigma
        self.gamma = _gamma_from(sigma, gamma, "GaussianNode")

    def _key(self):
        return (self.column, self.gamma)

    def __repr__(self):
        arg = f"sigma={self.sigma!r}" if self.sigma is not None else f"gamma={self.gamma!r}"
        return f"GaussianNode({self.column!r}, {arg})"


class ProductNode(NodeKernel):
    """The product of node kernels, e.g. ``DiracNode('element') * GaussianNode('charge', sigma=1)``."""

    def __init__(self, *kernels):
        if not kernels:
            raise ValueError("ProductNode needs at least one node kernel")
        for k in kernels:
            if not isinstance(k, NodeKernel):
                raise TypeError(f"ProductNode: {k!r} is not a node kernel (DiracNode, GaussianNode, ProductNode)")
        self.kernels = tuple(kernels)

    def factors(self):
        return tuple(f for k in self.kernels for f in k.factors())

    def _key(self):
        return tuple((type(f).__name__, f._key()) for f in self.factors())

    def __repr__(self):
        return " * ".join(map(repr, self.factors()))


class EdgeKernel:
    """A kernel on pairs of shortest-path lengths."""

    code = None

    @property
    def parameter(self):
        """The one float parameter the compiled kernels receive."""
        return 0.0

    def __eq__(self, other):
        return type(self) is type(other) and self.parameter == other.parameter

    def __hash__(self):
        return hash((type(self).__name__, self.parameter))


class DiracEdge(EdgeKernel):
    """``k(w, w') = 1`` if the two path lengths are equal (as float64), else 0."""

    code = EDGE_DIRAC

    def __repr__(self):
        return "DiracEdge()"


class GaussianEdge(EdgeKernel):
    """``k(w, w') = exp(-gamma (w - w')^2)``; give ``sigma`` (``gamma = 1/(2 sigma^2)``) or ``gamma``."""

    code = EDGE_GAUSSIAN

    def __init__(self, *, sigma=None, gamma=None):
        self.sigma = sigma
        self.gamma = _gamma_from(sigma, gamma, "GaussianEdge")

    @property
    def parameter(self):
        return self.gamma

    def __repr__(self):
        return f"GaussianEdge(sigma={self.sigma!r})" if self.sigma is not None else f"GaussianEdge(gamma={self.gamma!r})"


class BrownianBridgeEdge(EdgeKernel):
    """``k(w, w') = max(0, c - |w - w'|)``, the Brownian bridge kernel of Borgwardt and Kriegel."""

    code = EDGE_BROWNIAN

    def __init__(self, c):
        self.c = _positive(c, "c", "BrownianBridgeEdge")

    @property
    def parameter(self):
        return self.c

    def __repr__(self):
        return f"BrownianBridgeEdge(c={self.c!r})"


def node_features(node_kernel, graphs):
    """The arrays the compiled kernels read for ``node_kernel`` over ``graphs``, packed.

    Returns ``(node_offsets, discrete, continuous, weights)``: ``node_offsets`` int64
    ``(n_graphs + 1,)`` (where each graph's vertices begin, as in
    :func:`graphkern.graph.pack_graphs`), ``discrete`` int64 ``(N, n_dirac)``, ``continuous``
    float64 ``(N, D)`` and ``weights`` float64 ``(D,)`` (each dimension's gamma), where ``N``
    is the total vertex count.  A missing column raises KeyError naming the graph and the
    column.
    """
    factors = () if node_kernel is None else node_kernel.factors()
    for k, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise TypeError(f"item {k} is a {type(g).__name__}, expected graphkern.Graph")
    columns = {col: [g.require_node_label(col) for g in graphs]
               for col in dict.fromkeys(f.column for f in factors)}
    for f in factors:
        _check_column(f, graphs, columns[f.column])
    # only the vertex offsets and the label columns: pack_graphs would also pack the adjacency,
    # which the shortest-path kernel reads through its path arrays instead
    node_offsets = np.zeros(len(graphs) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((g.n_nodes for g in graphs), np.int64, len(graphs)), out=node_offsets[1:])
    n_total = int(node_offsets[-1])
    labels = {col: np.concatenate(arrays) if graphs else np.zeros(0) for col, arrays in columns.items()}
    discrete, continuous, weights = [], [], []
    for f in factors:
        col = labels[f.column]
        if isinstance(f, DiracNode):
            discrete.append(col.astype(np.int64, copy=False))
        else:
            # the width from the column's shape: reshape(0, -1) cannot infer it (no vertices at all)
            col = col.reshape(n_total, col.shape[1] if col.ndim == 2 else 1).astype(np.float64, copy=False)
            continuous.append(col)
            weights.append(np.full(col.shape[1], f.gamma))
    disc = np.ascontiguousarray(np.stack(discrete, axis=1) if discrete else np.zeros((n_total, 0), np.int64))
    cont = np.ascontiguousarray(np.concatenate(continuous, axis=1) if continuous else np.zeros((n_total, 0)))
    w = np.concatenate(weights) if weights else np.zeros(0)
    return node_offsets, disc, cont, w


def _check_column(factor, graphs, columns):
    """Kind and width of ``factor``'s column (``columns``: its array in each graph), before packing."""
    if isinstance(factor, DiracNode) and all(c.ndim == 1 and c.dtype.kind in "iu" for c in columns):
        return
    width = None
    for k, (g, col) in enumerate(zip(graphs, columns)):
        if isinstance(factor, DiracNode):
            if col.ndim != 1 or col.dtype.kind not in "iu":
                raise TypeError(f"DiracNode({factor.column!r}) needs an integer (category) node label, but graph {k} "
                                f"({g._label()}) holds {col.dtype} values of shape {col.shape[1:] or 'scalar'} in "
                                f"{factor.column!r}; use GaussianNode for continuous labels")
            continue
        d = 1 if col.ndim == 1 else col.shape[1]
        if width is None:
            width, first = d, k
        elif d != width:
            raise ValueError(f"GaussianNode({factor.column!r}): node label {factor.column!r} has {d} values per "
                             f"vertex in graph {k} ({g._label()}) but {width} in graph {first}; "
                             "vectors must have one length")
