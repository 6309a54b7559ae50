"""Small-world graphs: ring lattices with rewired (Watts–Strogatz) or added (Newman–Watts–Strogatz) shortcuts."""

from __future__ import annotations

import numpy as np

from ._build import check_count, check_probability, finish, symmetric_csr

__all__ = ["watts_strogatz", "newman_watts_strogatz"]

# rounds of redraws after which Watts–Strogatz gives up on the shortcuts still colliding
_MAX_REDRAW_ROUNDS = 100


def _ring_lattice(n, k):
    """Each node joined to its ``k // 2`` successors on a ring: edge arrays ``(u, v)``."""
    n = check_count(n, "n", 1)
    k = check_count(k, "k", 0)
    if k % 2 or k >= n:
        raise ValueError(f"k must be even and smaller than n (each node gets k/2 neighbours per side), "
                         f"got k={k}, n={n}")
    u = np.repeat(np.arange(n, dtype=np.int64), k // 2)
    v = (u + np.tile(np.arange(1, k // 2 + 1), n)) % n
    return u, v


def newman_watts_strogatz(n, k, p, *, seed=None, as_csr=False):
    """A ring lattice plus shortcuts.

    For each lattice edge ``(u, v)``, with probability ``p``, an edge joins ``u`` to a
    random node.  As in networkx, a shortcut that would be a self-loop or repeat an existing edge is
    not added (no redraw), so the graph has the lattice's ``n * k / 2`` edges plus about
    ``p * n * k / 2`` shortcuts, and stays connected.
    """
    u, v = _ring_lattice(n, k)
    p = check_probability(p, "p")
    rng = np.random.default_rng(seed)
    chosen = rng.random(len(u)) < p
    shortcut_to = rng.integers(0, n, int(chosen.sum()))
    A = symmetric_csr(np.concatenate([u, u[chosen]]), np.concatenate([v, shortcut_to]), n)
    return finish(A, as_csr=as_csr, name=f"newman_watts_strogatz(n={n}, k={k}, p={p})")


def watts_strogatz(n, k, p, *, seed=None, as_csr=False):
    """A ring lattice whose edges ``(u, v)`` are each rewired with probability ``p`` to ``(u, w)``, ``w`` random.

    A rewired edge that would be a self-loop or repeat another edge is drawn again, so
    the graph keeps exactly ``n * k / 2`` edges (networkx's rule, applied to all edges
    at once in rounds instead of one edge after another; an edge still colliding after
    100 rounds, possible only in nearly complete graphs, keeps its lattice end, or
    is dropped if that end was taken meanwhile).
    """
    u, v = _ring_lattice(n, k)
    p = check_probability(p, "p")
    rng = np.random.default_rng(seed)
    # in a complete lattice (k = n - 1) there is nowhere to rewire to
    rewired = rng.random(len(u)) < (p if k < n - 1 else 0.0)
    w = v.copy()
    redraw = np.flatnonzero(rewired)
    for _ in range(_MAX_REDRAW_ROUNDS):
        if not redraw.size:
            break
        w[redraw] = rng.integers(0, n, redraw.size)
        redraw = _colliding(u, w, rewired, n)
    else:
        # a node that already touches every other node cannot be rewired anywhere
        w[redraw] = v[redraw]
    return finish(symmetric_csr(u, w, n), as_csr=as_csr, name=f"watts_strogatz(n={n}, k={k}, p={p})")


def _colliding(u, w, rewired, n):
    """Rewired edges that are self-loops or repeat another edge (a lattice edge, or an earlier rewired one)."""
    key = np.minimum(u, w) * n + np.maximum(u, w)
    # sorting on (key, rewired) puts a kept lattice edge first among equal keys
    order = np.argsort(2 * key + rewired, kind="stable")
    sorted_key = key[order]
    repeat = np.zeros(len(key), dtype=bool)
    repeat[order[1:]] = sorted_key[1:] == sorted_key[:-1]
    return np.flatnonzero(rewired & (repeat | (u == w)))
