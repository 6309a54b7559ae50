"""What the molecule readers (SDF, SMILES) share: element numbers, bond codes, the graph they build."""

from ..graph import ATOMIC_NUMBER, Graph

__all__ = ["ATOMIC_NUMBER", "molecule_graph"]

# bond order labels, the MDL bond-type codes (1, 2, 3, 4 = aromatic) used by every reader
SINGLE, DOUBLE, TRIPLE, AROMATIC = 1, 2, 3, 4


def molecule_graph(bonds, orders, node_labels, *, name=None):
    """The graph of a molecule: ``bonds`` (b, 2) atom pairs, their ``orders``, per-atom label columns."""
    return Graph.from_edges(bonds, len(node_labels["element"]), node_labels=node_labels,
                            edge_labels={"bond_order": orders}, name=name)
