"""Deterministic graphs: 2D grids and complete graphs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._build import check_count, finish, index_dtype, symmetric_csr

__all__ = ["grid_2d", "complete"]


def grid_2d(rows, cols, *, periodic=False, as_csr=False):
    """The ``rows x cols`` grid (a road-like planar graph), node ``i * cols + j`` at row ``i``, column ``j``.

    Each node joins its left, right, upper and lower neighbours; ``periodic`` wraps
    both directions into a torus.
    """
    rows = check_count(rows, "rows", 1)
    cols = check_count(cols, "cols", 1)
    n = rows * cols
    node = np.arange(n, dtype=np.int64).reshape(rows, cols)
    if periodic:
        right, down = np.roll(node, -1, axis=1), np.roll(node, -1, axis=0)
        u = np.concatenate([node.ravel(), node.ravel()])
        v = np.concatenate([right.ravel(), down.ravel()])
    else:
        u = np.concatenate([node[:, :-1].ravel(), node[:-1, :].ravel()])
        v = np.concatenate([node[:, 1:].ravel(), node[1:, :].ravel()])
    return finish(symmetric_csr(u, v, n), as_csr=as_csr, name=f"grid_2d({rows}, {cols})")


def complete(n, *, as_csr=False):
    """The complete graph on ``n`` nodes (every pair joined, no self-loops)."""
    n = check_count(n, "n", 0)
    dtype = index_dtype(n)
    indptr = np.arange(n + 1, dtype=np.int64) * max(n - 1, 0)
    others = np.tile(np.arange(max(n - 1, 0), dtype=dtype), n)
    row = np.repeat(np.arange(n, dtype=dtype), max(n - 1, 0))
    indices = others + (others >= row)  # row i lists 0..n-1 without i
    A = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))
    return finish(A, as_csr=as_csr, name=f"complete({n})")
