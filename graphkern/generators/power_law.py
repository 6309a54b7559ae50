"""Heavy-tailed random graphs: R-MAT (Graph500 parameters) and Chung–Lu expected-degree graphs."""

from __future__ import annotations

import numpy as np

from ._build import check_count, finish, index_dtype, symmetric_csr

__all__ = ["rmat", "chung_lu"]

# edges drawn per batch, to bound the temporary arrays of large R-MAT graphs
_RMAT_BATCH = 1 << 22


def rmat(scale, edge_factor=16, a=0.57, b=0.19, c=0.19, *, permute=True, seed=None, as_csr=False):
    """An R-MAT (recursive matrix) graph on ``2**scale`` nodes, Graph500's generator.

    ``edge_factor * 2**scale`` edges are drawn; each picks, at every one of ``scale``
    levels, a quadrant of the adjacency matrix with probabilities ``a, b, c`` and
    ``d = 1 - a - b - c``.  The defaults are Graph500's.  Edges are made undirected;
    self-loops and repeats are removed, so the graph has fewer edges than drawn.
    ``permute`` relabels the nodes at random, as Graph500 does, so that degree does
    not follow the node number.
    """
    scale = check_count(scale, "scale", 1)
    edge_factor = check_count(edge_factor, "edge_factor", 1)
    d = 1.0 - a - b - c
    if min(a, b, c, d) < 0:
        raise ValueError(f"R-MAT probabilities must be non-negative and sum to at most 1, got a={a}, b={b}, c={c}")
    rng = np.random.default_rng(seed)
    n = 1 << scale
    n_draws = edge_factor * n
    dtype = index_dtype(n)
    row, col = np.zeros(n_draws, dtype=dtype), np.zeros(n_draws, dtype=dtype)
    for start in range(0, n_draws, _RMAT_BATCH):
        size = min(_RMAT_BATCH, n_draws - start)
        batch_row, batch_col = row[start:start + size], col[start:start + size]  # views, set in place
        for level in range(scale):
            x = rng.random(size, dtype=np.float32)
            # quadrants a | b over c | d: the lower half sets the row bit, the right half the column bit
            batch_row |= (x >= a + b).astype(dtype) << level
            batch_col |= (((x >= a) & (x < a + b)) | (x >= a + b + c)).astype(dtype) << level
    if permute:
        relabel = rng.permutation(n).astype(dtype)
        row, col = relabel[row], relabel[col]
    A = symmetric_csr(row, col, n)
    return finish(A, as_csr=as_csr, name=f"rmat(scale={scale}, edge_factor={edge_factor})")


def chung_lu(n, gamma, avg_degree, *, max_degree=None, permute=True, seed=None, as_csr=False):
    """A Chung–Lu graph whose expected degrees follow a power law with exponent ``gamma``.

    Node ``i`` gets weight ``w_i`` proportional to ``(i + 1) ** (-1 / (gamma - 1))``,
    capped at ``max_degree`` (default ``sqrt(n * avg_degree)``, the cutoff below which
    no edge probability exceeds 1) and scaled so that the weights average
    ``avg_degree``.  ``n * avg_degree / 2`` edges are then drawn with both ends chosen
    in proportion to the weights, which gives node ``i`` expected degree ``w_i``; self-loops and
    repeated edges are removed, which lowers the degrees of the heaviest nodes
    slightly.  ``permute`` shuffles the node numbers so that degree does not follow them.
    """
    n = check_count(n, "n", 2)
    gamma = float(gamma)
    avg_degree = float(avg_degree)
    if gamma <= 2:
        raise ValueError(f"gamma must exceed 2 (a finite mean degree), got {gamma}")
    if not 0 < avg_degree < n - 1:
        raise ValueError(f"avg_degree must lie in (0, n - 1), got {avg_degree}")
    cap = float(max_degree) if max_degree is not None else np.sqrt(n * avg_degree)
    if cap < avg_degree:
        raise ValueError(f"max_degree ({cap}) is below avg_degree ({avg_degree})")
    rng = np.random.default_rng(seed)
    weights = (np.arange(n) + 1.0) ** (-1.0 / (gamma - 1.0))
    for _ in range(50):  # capping lowers the mean, rescaling raises it again; a few rounds settle it
        weights = np.minimum(weights * (avg_degree / weights.mean()), cap)
    cumulative = np.cumsum(weights)
    n_draws = int(round(n * avg_degree / 2))
    ends = np.searchsorted(cumulative, rng.random(2 * n_draws) * cumulative[-1], side="right")
    ends = np.minimum(ends, n - 1).astype(index_dtype(n))  # a draw equal to the total lands past the end
    if permute:
        ends = rng.permutation(n).astype(ends.dtype)[ends]
    A = symmetric_csr(ends[:n_draws], ends[n_draws:], n)
    return finish(A, as_csr=as_csr, name=f"chung_lu(n={n}, gamma={gamma}, avg_degree={avg_degree})")
