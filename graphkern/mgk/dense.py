"""The marginalized graph kernel by a dense direct solve: the reference for the CG solvers.

For one pair of graphs it builds the product system explicitly (``(n1 n2)^2`` entries) and
solves it with LAPACK in float64, exactly as the formula in :mod:`graphkern.mgk` reads.  It
is far too slow and large for real work; tests use it as ground truth and the benchmark
shows it as the "dense NumPy" peer.
"""

from __future__ import annotations

import numpy as np


def dense_edge_labels(G, column):
    """The edge label column as a dense ``(n, n)`` or ``(n, n, d)`` array (0 where no edge)."""
    vals = G.require_edge_label(column)
    n = G.n_nodes
    out = np.zeros((n, n) + vals.shape[1:], dtype=np.float64 if vals.dtype.kind == "f" else vals.dtype)
    rows = np.repeat(np.arange(n), np.diff(G.indptr))
    out[rows, G.indices] = vals
    return out


def product_system(G1, G2, node_program, edge_program, *, q):
    """``(M, b, V)``: the product system ``M x = b`` with ``M = D V^-1 - A (.) E``, ``b = D q``.

    Rows are vertex pairs ``(i, i')`` in row-major order ``i * n2 + i'``.
    """
    n1, n2 = G1.n_nodes, G2.n_nodes
    A1 = G1.to_scipy().toarray()
    A2 = G2.to_scipy().toarray()
    d1 = A1.sum(axis=1) + q
    d2 = A2.sum(axis=1) + q

    vec_n = {c for c in node_program.columns if G1.require_node_label(c).ndim == 2}
    lx = {c: _lift(G1.require_node_label(c), c in vec_n, first=True, order=1) for c in node_program.columns}
    ly = {c: _lift(G2.require_node_label(c), c in vec_n, first=False, order=1) for c in node_program.columns}
    V = np.broadcast_to(node_program.evaluate(lx, ly, vec_n), (n1, n2)).reshape(-1)

    vec_e = {c: G1.require_edge_label(c).ndim == 2 for c in edge_program.columns}
    ex = {c: _lift(dense_edge_labels(G1, c), vec_e[c], first=True, order=2) for c in edge_program.columns}
    ey = {c: _lift(dense_edge_labels(G2, c), vec_e[c], first=False, order=2) for c in edge_program.columns}
    E = np.broadcast_to(edge_program.evaluate(ex, ey, {c for c, v in vec_e.items() if v}), (n1, n2, n1, n2))
    A = A1[:, None, :, None] * A2[None, :, None, :]
    D = np.outer(d1, d2).reshape(-1)
    M = np.diag(D / V) - (A * E).reshape(n1 * n2, n1 * n2)
    b = D * q * q
    return M, b, V


def _lift(arr, vector, *, first, order):
    """Insert broadcast axes so that the first graph's labels run over (i[, j]) and the second's over (i'[, j'])."""
    arr = np.asarray(arr)
    if order == 1:
        idx = (slice(None), None) if first else (None, slice(None))
    else:
        idx = (slice(None), None, slice(None), None) if first else (None, slice(None), None, slice(None))
    if vector:
        idx = idx + (slice(None),)
    return arr[idx]


def dense_mgk_pair(G1, G2, node_program, edge_program, *, p=1.0, q=0.05, nodal=False):
    """K(G1, G2) (or the nodal matrix ``p^2 x`` of shape ``(n1, n2)``) by a dense float64 solve."""
    M, b, _ = product_system(G1, G2, node_program, edge_program, q=q)
    x = np.linalg.solve(M, b)  # LU: several times faster here than scipy's assume_a="pos" path
    R = (p * p) * x.reshape(G1.n_nodes, G2.n_nodes)
    return R if nodal else float(R.sum())


def dense_mgk(X, Y, node_program, edge_program, *, p=1.0, q=0.05):
    """The Gram matrix between lists of graphs ``X`` and ``Y`` (``Y=None``: X against itself)."""
    sym = Y is None
    Y = X if sym else Y
    K = np.empty((len(X), len(Y)))
    for i, G1 in enumerate(X):
        for j, G2 in enumerate(Y):
            if sym and j < i:
                K[i, j] = K[j, i]
                continue
            K[i, j] = dense_mgk_pair(G1, G2, node_program, edge_program, p=p, q=q)
    return K
