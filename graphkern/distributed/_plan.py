"""Cutting a Gram matrix into tiles of predicted equal cost.

Both kernels' work on a pair is close to a product of one number per graph: the marginalized
kernel solves a system on the product graph, whose vertices and edges number about
``(n_i + e_i)(n_j + e_j)``; the shortest-path kernel walks every pair of shortest paths, about
``n_i^2 n_j^2 / 4``.  With a per-graph weight ``w`` the cost of a tile of rows I and columns J is
then ``W_I W_J``, so cutting rows and columns into runs of equal total weight gives tiles of
equal cost.  Runs are whole Zarr chunks (``tile`` graphs, the last one shorter) so that no two
tiles write the same chunk: a run is one chunk where the graphs are of average weight, several
where they are lighter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# tiles per worker the default tile edge aims at: enough for the last tiles to balance, few
# enough that each tile's fixed host work and GPU launch tail stay small beside its solves
_TILES_PER_WORKER = 4
_MIN_TILE, _MAX_TILE = 32, 2048


def graph_weights(kind, graphs):
    """Per-graph cost weight: a pair costs about ``w_i w_j`` (module docstring)."""
    n = np.array([g.n_nodes for g in graphs], dtype=np.float64)
    if kind == "spgk":
        return n * n + 1.0
    return n + np.array([g.nnz for g in graphs], dtype=np.float64) + 1.0


def default_tile(n_rows, n_cols, n_workers, symmetric):
    """A tile edge giving about ``_TILES_PER_WORKER`` tiles per worker, within [32, 2048] graphs."""
    want = _TILES_PER_WORKER * max(1, n_workers) * (2 if symmetric else 1)
    side = math.sqrt(n_rows * n_cols / want)
    return int(min(_MAX_TILE, max(_MIN_TILE, math.ceil(side))))


def runs(weights, chunk):
    """Boundaries ``[0, b_1, ..., n]`` on multiples of ``chunk``: consecutive chunks are joined while
    their total weight stays nearer to that of ``chunk`` average graphs."""
    n = len(weights)
    starts = np.arange(0, n, chunk)
    if n == 0:
        return [0]
    chunk_w = np.add.reduceat(np.asarray(weights, dtype=np.float64), starts)
    target = float(np.mean(weights)) * chunk
    bounds, acc = [0], 0.0
    for start, w in zip(starts.tolist(), chunk_w.tolist()):
        if acc > 0 and acc + w / 2 > target:
            bounds.append(start)
            acc = 0.0
        acc += w
    bounds.append(n)
    return bounds


@dataclass(frozen=True)
class Tile:
    """Rows ``i0:i1`` by columns ``j0:j1``; ``(ti, tj)`` its place in the grid of tiles; ``mirror``:
    a symmetric matrix's off-diagonal tile, also written transposed at ``j0:j1, i0:i1``."""

    ti: int
    tj: int
    i0: int
    i1: int
    j0: int
    j1: int
    mirror: bool


@dataclass(frozen=True)
class Plan:
    """The tiles of one Gram matrix and what they were cut from (recorded with a Zarr result)."""

    shape: tuple
    symmetric: bool
    chunk: int
    row_bounds: tuple
    col_bounds: tuple

    @classmethod
    def make(cls, wx, wy, chunk, symmetric):
        rows = runs(wx, chunk)
        cols = rows if symmetric else runs(wy, chunk)
        return cls((len(wx), len(wx) if symmetric else len(wy)), symmetric, chunk, tuple(rows), tuple(cols))

    @property
    def grid(self):
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    def tiles(self):
        """Every tile, row by row (a symmetric matrix: the upper triangle of the grid)."""
        r, c = self.row_bounds, self.col_bounds
        return [Tile(a, b, r[a], r[a + 1], c[b], c[b + 1], self.symmetric and a != b)
                for a in range(self.grid[0]) for b in range(a if self.symmetric else 0, self.grid[1])]

    def by_cost(self, tiles, wx, wy):
        """``tiles`` in decreasing predicted cost (``W_I W_J``, half that for a symmetric matrix's
        diagonal tile): the longest start first and the short ones fill the workers' ends, so the
        call does not wait on a long tile begun last (longest-processing-time-first order)."""
        cx = np.concatenate([[0.0], np.cumsum(wx, dtype=np.float64)])
        cy = cx if self.symmetric else np.concatenate([[0.0], np.cumsum(wy, dtype=np.float64)])

        def cost(t):
            c = (cx[t.i1] - cx[t.i0]) * (cy[t.j1] - cy[t.j0])
            return c / 2 if self.symmetric and t.ti == t.tj else c
        return sorted(tiles, key=cost, reverse=True)

    def pairs(self, t):
        """Graph pairs the kernel evaluates for tile ``t`` (the upper triangle of a diagonal one)."""
        rows = t.i1 - t.i0
        if self.symmetric and t.ti == t.tj:
            return rows * (rows + 1) // 2
        return rows * (t.j1 - t.j0)

    def record(self):
        return {"shape": list(self.shape), "symmetric": self.symmetric, "chunk": self.chunk,
                "row_bounds": list(self.row_bounds), "col_bounds": list(self.col_bounds)}
