"""Graphs of random points: Delaunay triangulations in the plane and 3D contact graphs of a chain."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.signal import lfilter
from scipy.spatial import Delaunay, cKDTree

from ._build import check_count, finish, symmetric_csr

__all__ = ["delaunay", "contact_graph_3d"]


def _entry_lengths(A, coords):
    """The Euclidean length of every stored entry's edge."""
    rows = np.repeat(np.arange(A.shape[0], dtype=A.indices.dtype), np.diff(A.indptr))
    return np.linalg.norm(coords[rows] - coords[A.indices], axis=1)


def delaunay(n, *, weighted=False, coords=False, seed=None, as_csr=False):
    """The Delaunay triangulation of ``n`` uniform random points in the unit square.

    A planar, road-like graph: mean degree just under 6, every node of degree at least 2.
    ``weighted`` weighs edges by their length; ``coords`` adds the points as the float
    node label ``coords`` of shape ``(n, 2)``.
    """
    n = check_count(n, "n", 3)
    points = np.random.default_rng(seed).random((n, 2))
    indptr, indices = Delaunay(points).vertex_neighbor_vertices
    A = sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(n, n))
    A.sort_indices()
    return finish(A, as_csr=as_csr, weights=_entry_lengths(A, points) if weighted else None,
                  node_labels={"coords": points} if coords else None, name=f"delaunay(n={n})")


def contact_graph_3d(n, *, cutoff=8.0, bond_length=3.8, persistence=0.5, volume_per_node=135.0, weighted=False,
                     seed=None, as_csr=False):
    """A protein-like contact graph: a random chain folded into a box, residues joined within ``cutoff``.

    The chain is a random walk of ``n`` beads ``bond_length`` apart (3.8 Å, the distance
    of consecutive C-alpha atoms) whose step directions are correlated: each is drawn
    from an AR(1) process with coefficient ``persistence`` (0.5 puts beads ``i, i+2``
    about 6.3 Å apart, as in a protein backbone, and gives a mean degree near 25 at the
    defaults).  The walk is reflected at the walls of a cube of volume
    ``n * volume_per_node`` (135 Å^3, a residue's share of a folded protein), so it
    fills the cube like a globule.  Beads closer than ``cutoff`` (8 Å, a common contact
    threshold) are joined; consecutive beads always are, so the graph is connected.

    The graph carries the node label ``coords`` (float, ``(n, 3)``) and the edge label
    ``distance``; ``weighted`` also uses the distances as weights.
    """
    n = check_count(n, "n", 1)
    cutoff, bond_length = float(cutoff), float(bond_length)
    if not 0 < bond_length <= cutoff:
        raise ValueError(f"need 0 < bond_length <= cutoff to keep the chain connected, "
                         f"got bond_length={bond_length}, cutoff={cutoff}")
    rng = np.random.default_rng(seed)
    side = (n * float(volume_per_node)) ** (1.0 / 3.0)
    if not 0 <= persistence < 1:
        raise ValueError(f"persistence must lie in [0, 1), got {persistence}")
    steps = lfilter([1.0], [1.0, -float(persistence)], rng.standard_normal((n - 1, 3)), axis=0)
    steps *= bond_length / np.linalg.norm(steps, axis=1, keepdims=True)
    walk = np.concatenate([rng.random((1, 3)) * side, steps]).cumsum(axis=0)
    # fold the walk into [0, side]^3 by reflection at the walls, which never lengthens a step
    coords = side - np.abs(np.mod(walk, 2 * side) - side)
    pairs = cKDTree(coords).query_pairs(cutoff, output_type="ndarray")
    A = symmetric_csr(pairs[:, 0], pairs[:, 1], n)
    distance = _entry_lengths(A, coords)
    return finish(A, as_csr=as_csr, weights=distance if weighted else None, node_labels={"coords": coords},
                  edge_labels={"distance": distance}, name=f"contact_graph_3d(n={n})")
