"""Barabási–Albert preferential attachment in linear time, without a loop over nodes or edges."""

from __future__ import annotations

import numpy as np

from ._build import check_count, finish, symmetric_csr

__all__ = ["barabasi_albert"]


def barabasi_albert(n, m, *, seed=None, as_csr=False):
    """A Barabási–Albert graph: each new node joins ``m`` distinct earlier nodes, chosen by degree.

    The model is networkx's ``barabasi_albert_graph`` (``n > m >= 1``): a star on nodes ``0..m``
    (centre 0), then nodes ``m+1, ..., n-1`` each attach to ``m`` distinct earlier nodes, a node being
    drawn with probability proportional to its current degree.  The graph has
    ``m * (n - m)`` edges, no self-loops and no repeated edges.

    Generation follows Batagelj and Brandes (2005): all edges sit in one array in which
    an entry's endpoints occupy two slots, so a draw proportional to degree is a draw
    of a uniform earlier slot.  All draws are made at once and each slot reference is
    resolved by following pointers backwards, vectorized.  A node that drew the same
    target twice redraws the later draw, and the pointers are resolved again, until
    no node has a repeat.  The one departure from the sequential process: a redraw
    that changes an earlier edge's target can create a repeat further on, which is
    itself redrawn, so repeats are settled in rounds rather than in node order.  The
    degree distribution is that of the sequential model.
    """
    n = check_count(n, "n", 1)
    m = check_count(m, "m", 1)
    if m >= n:
        raise ValueError(f"barabasi_albert needs m < n, got m={m}, n={n}")
    rng = np.random.default_rng(seed)
    n_edges = m * (n - m)
    # edges 0..m-1 are the star (k+1, 0); node v > m owns edges m*(v-m) .. m*(v-m+1)-1
    source = np.concatenate([np.arange(1, m + 1), np.repeat(np.arange(m + 1, n), m)])
    target = np.zeros(n_edges, dtype=np.int64)
    # slot 2e holds source(e), slot 2e+1 holds target(e); a node's draws pick among the
    # slots of the edges before its own, i.e. proportionally to the degrees so far
    slots_before = 2 * m * (source[m:] - m)
    slot = np.zeros(n_edges, dtype=np.int64)
    # nodes go in blocks that double in size, so that the rounds of redraws which early,
    # crowded nodes need are paid on small blocks only; a block's draws depend only on
    # itself and on settled earlier blocks
    start = m + 1
    while start < n:
        stop = min(n, 2 * start)
        first, last = m * (start - m), m * (stop - m)
        drawn = np.arange(first, last)
        while drawn.size:
            slot[drawn] = (rng.random(drawn.size) * slots_before[drawn - m]).astype(np.int64)
            _resolve_targets(slot, source, target, first=int(drawn[0]), last=last)
            drawn = first + _repeated_draws(target[first:last], m)
        start = stop
    return finish(symmetric_csr(source, target, n), as_csr=as_csr, name=f"barabasi_albert(n={n}, m={m})")


def _resolve_targets(slot, source, target, first, last):
    """Set ``target[e]`` for ``first <= e < last`` to the node its slot holds, chasing target slots back."""
    pending = np.arange(first, last)
    ref = slot[pending]
    while pending.size:
        edge = ref >> 1
        is_source = (ref & 1) == 0
        # a source slot holds a known node; a target slot of an edge before ``first`` is settled
        settled = is_source | (edge < first)
        target[pending[settled]] = np.where(is_source[settled], source[edge[settled]], target[edge[settled]])
        pending = pending[~settled]
        ref = slot[edge[~settled]]


def _repeated_draws(target, m):
    """Positions in ``target`` (whole nodes of ``m`` edges) that repeat an earlier target of their node."""
    per_node = target.reshape(-1, m)
    order = np.argsort(per_node, axis=1, kind="stable")
    ordered = np.take_along_axis(per_node, order, axis=1)
    repeat = ordered[:, 1:] == ordered[:, :-1]
    rows, cols = np.nonzero(repeat)
    # stable order puts the earlier draw first, so the later one of a pair is redrawn
    return np.sort(rows * m + order[rows, cols + 1])
