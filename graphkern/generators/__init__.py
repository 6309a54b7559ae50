"""Seeded, vectorized graph generators: a million nodes in seconds, no loop over edges in Python.

Every random generator takes ``seed`` (an int, a ``numpy.random.Generator`` or None)
and gives the same graph for the same seed.  Each returns a :class:`~graphkern.Graph`,
or with ``as_csr=True`` its symmetric ``scipy.sparse.csr_matrix`` (ones, or the
weights); graphs are undirected, with no repeated edges and no self-loops.

=================================  ===========================================
:func:`barabasi_albert`            preferential attachment (scale-free)
:func:`watts_strogatz`             ring lattice, edges rewired (small world)
:func:`newman_watts_strogatz`      ring lattice plus shortcuts
:func:`rmat`                       R-MAT / Graph500 Kronecker-like graphs
:func:`chung_lu`                   power-law expected degrees
:func:`delaunay`                   planar triangulation of random points
:func:`grid_2d`                    2D grid or torus (road-like)
:func:`complete`                   complete graph
:func:`contact_graph_3d`           protein-like 3D contact graph, distances as edge labels
:func:`random_labeled`             G(n, p) / G(n, m) with random label alphabets, for tests
=================================  ===========================================
"""

from .geometric import contact_graph_3d, delaunay
from .labeled import random_labeled
from .lattice import complete, grid_2d
from .power_law import chung_lu, rmat
from .preferential import barabasi_albert
from .small_world import newman_watts_strogatz, watts_strogatz

__all__ = [
    "barabasi_albert", "watts_strogatz", "newman_watts_strogatz", "rmat", "chung_lu",
    "delaunay", "grid_2d", "complete", "contact_graph_3d", "random_labeled",
]
