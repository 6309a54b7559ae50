"""What the molecule readers (SDF, SMILES) share: element numbers, bond codes, the graph they build."""

import numpy as np

from ..graph import ATOMIC_NUMBER, Graph

__all__ = ["ATOMIC_NUMBER", "molecule_graph"]

# bond order labels, the MDL bond-type codes (1, 2, 3, 4 = aromatic) used by every reader
SINGLE, DOUBLE, TRIPLE, AROMATIC = 1, 2, 3, 4


def molecule_graph(bonds, orders, node_labels, *, weights=None, name=None):
    """The graph of a molecule: ``bonds`` (b, 2) atom pairs, their ``orders``, per-atom label columns."""
    n_atoms = len(node_labels["element"])
    edge_labels = {"bond_order": orders}
    if len(bonds) == 0:
        # a single atom or a salt of lone ions: nothing to validate, and Graph's mirror
        # check cannot reshape empty edge columns
        return Graph(np.zeros(n_atoms + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), weights,
                     node_labels=node_labels, edge_labels=edge_labels, name=name, validate=False)
    return Graph.from_edges(bonds, n_atoms, weights=weights, node_labels=node_labels,
                            edge_labels=edge_labels, name=name)
