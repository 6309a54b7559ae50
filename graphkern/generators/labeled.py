"""Erdős–Rényi graphs with random labels from chosen alphabets, for tests."""

from __future__ import annotations

import numpy as np

from ..graph import Graph
from ._build import check_count, check_probability

__all__ = ["random_labeled"]


def _pair_from_index(k, n):
    """Node pairs ``(i, j)``, ``i < j``, of the row-major upper-triangle positions ``k``."""
    k = np.asarray(k, dtype=np.int64)
    start = lambda i: i * (2 * n - i - 1) // 2  # position of (i, i + 1)
    i = np.floor(((2 * n - 1) - np.sqrt((2.0 * n - 1) ** 2 - 8.0 * k)) / 2).astype(np.int64)
    i = np.clip(i, 0, max(n - 2, 0))
    # the square root can land one row off for large n; step to the right row
    i -= start(i) > k
    i += start(i + 1) <= k
    return i, k - start(i) + i + 1


def random_labeled(n, p=None, *, m=None, n_node_labels=4, n_edge_labels=0, continuous=0, weighted=False,
                   seed=None, as_csr=False):
    """A G(n, p) or G(n, m) random graph with random labels.

    Give exactly one of ``p`` (each pair joined independently) or ``m`` (exactly ``m``
    edges, uniform among such graphs).  Labels:

    * ``n_node_labels > 0``: integer node label ``label`` uniform in ``0..n_node_labels-1``;
    * ``n_edge_labels > 0``: integer edge label ``label`` uniform in ``0..n_edge_labels-1``;
    * ``continuous = d > 0``: float node label ``attributes`` of shape ``(n, d)``, standard normal;
    * ``weighted``: edge weights uniform in ``(0, 1]``.
    """
    n = check_count(n, "n", 0)
    if (p is None) == (m is None):
        raise ValueError("give exactly one of p (edge probability) or m (edge count)")
    n_node_labels = check_count(n_node_labels, "n_node_labels")
    n_edge_labels = check_count(n_edge_labels, "n_edge_labels")
    continuous = check_count(continuous, "continuous")
    rng = np.random.default_rng(seed)
    n_pairs = n * (n - 1) // 2
    if m is None:
        m = int(rng.binomial(n_pairs, check_probability(p, "p")))
    m = check_count(m, "m")
    if m > n_pairs:
        raise ValueError(f"m={m} exceeds the {n_pairs} node pairs of a graph with {n} nodes")
    i, j = _pair_from_index(np.sort(rng.choice(n_pairs, size=m, replace=False)), n)
    node_labels, edge_labels = {}, {}
    if n_node_labels:
        node_labels["label"] = rng.integers(0, n_node_labels, n)
    if continuous:
        node_labels["attributes"] = rng.standard_normal((n, continuous))
    if n_edge_labels:
        edge_labels["label"] = rng.integers(0, n_edge_labels, m)
    weights = 1.0 - rng.random(m) if weighted else None
    graph = Graph.from_edges(np.stack([i, j], axis=1), n, weights=weights, node_labels=node_labels,
                             edge_labels=edge_labels, name=f"random_labeled(n={n}, m={m})")
    return graph.to_scipy() if as_csr else graph
