"""What every generator shares: the seed, turning an edge list into a clean symmetric CSR, the result.

The CSR is built by scipy's compiled COO -> CSR conversion (linear time, duplicates
summed), not by sorting edge keys in NumPy, which is ten times slower at 10^7 edges.
The result is then handed to :class:`~graphkern.Graph` without its O(nnz log nnz)
validation: the construction here guarantees symmetry, sorted rows, no duplicates
and no self-loops.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._arrays import index_dtype
from ..graph import Graph


def symmetric_csr(u, v, n):
    """The simple undirected graph on ``n`` nodes with edges ``(u[k], v[k])``, as a csr_matrix of ones.

    Self-loops are dropped and repeated edges (in either orientation) kept once; rows
    come out sorted.
    """
    u, v = np.asarray(u), np.asarray(v)
    keep = u != v
    dtype = index_dtype(n)
    lo = np.minimum(u[keep], v[keep]).astype(dtype, copy=False)
    hi = np.maximum(u[keep], v[keep]).astype(dtype, copy=False)
    upper = sp.csr_matrix((np.ones(len(lo), dtype=np.float64), (lo, hi)), shape=(n, n))
    upper.sum_duplicates()
    upper.data[:] = 1.0
    # strictly upper plus strictly lower: no entry meets its mirror, so nothing is summed
    A = upper + upper.T.tocsr()
    A.sort_indices()
    return A


def finish(A, *, as_csr, weights=None, node_labels=None, edge_labels=None, name=None):
    """Return the csr_matrix ``A`` (values ``weights`` if given) or the Graph built on it without re-validation."""
    if as_csr:
        if weights is not None:
            A = sp.csr_matrix((np.asarray(weights, dtype=np.float64), A.indices, A.indptr), shape=A.shape)
        return A
    return Graph(A.indptr, A.indices, weights, node_labels=node_labels, edge_labels=edge_labels,
                 name=name, validate=False)


def check_count(value, name, minimum=0):
    """An int ``value >= minimum`` or a ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_probability(value, name):
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return value
