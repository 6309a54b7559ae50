"""Inputs as users hold them: networkx and igraph graphs, RDKit molecules and SMILES strings become
:class:`graphkern.Graph` objects at the door of every graph kernel."""

from __future__ import annotations

from itertools import repeat

from graphkern.graph import Graph, require_valid_all
from graphkern.io.smiles import from_rdkit, from_smiles

__all__ = ["as_graphs"]


_ACCEPTED = "a graphkern.Graph, a networkx or igraph graph, an RDKit molecule or a SMILES string"


def _convert(item, label):
    """One input as a Graph, errors naming ``label`` and the converter."""
    if isinstance(item, Graph):
        return item
    module = type(item).__module__ or ""
    if module.startswith("networkx"):
        convert, converter = Graph.from_networkx, "Graph.from_networkx"
    elif module.startswith("igraph"):
        convert, converter = Graph.from_igraph, "Graph.from_igraph"
    elif module.startswith("rdkit") and hasattr(item, "GetAtoms"):
        convert, converter = from_rdkit, "graphkern.io.from_rdkit"
    elif isinstance(item, str):
        convert, converter = from_smiles, "graphkern.io.from_smiles"
    else:
        raise TypeError(f"{label} is a {type(item).__name__}, expected {_ACCEPTED}")
    try:
        return convert(item)
    except (ValueError, TypeError, KeyError) as err:
        raise type(err)(f"{label} could not be converted by {converter}: {err}") from err


def as_graphs(X, name="X", validate=True):
    """``X`` as a list of :class:`Graph`, converting the inputs users hold on the way in.

    Each item may be a :class:`Graph`, a networkx or igraph graph (:meth:`Graph.from_networkx`,
    :meth:`Graph.from_igraph`: vertex and edge attributes become label columns, ``weight`` the
    weights, element symbols in the ``element`` attribute atomic numbers), an RDKit molecule
    (:func:`graphkern.io.from_rdkit`) or a SMILES string (:func:`graphkern.io.from_smiles`, heavy
    atoms); kinds may be mixed.
    Molecules get the labels of every molecule reader: ``element`` (atomic number), ``charge``
    and ``bond_order`` (1, 2, 3, 4 = aromatic), so the same molecule from an SD file, RDKit, a
    SMILES string or networkx has the same label codes, bond orders as the source writes them
    (most SD files write aromatic rings in a Kekulé form, 1 and 2, where RDKit perceives 4).  A single graph is refused (it is almost
    always a forgotten ``[G]``); errors name ``name``, the item and the converter.  ``validate``:
    check every graph's row pointers and column indices (:func:`require_valid_all`); a caller
    whose own compiled pass checks them before anything reads them passes False.
    """
    if isinstance(X, (Graph, str)) or type(X).__module__.startswith(("networkx", "igraph", "rdkit")):
        raise TypeError(f"{name} must be a sequence of graphs, got a single {type(X).__name__} "
                        f"(wrap it in a list: [{name}])")
    try:
        items = list(X)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of graphkern.Graph (or networkx or igraph graphs, RDKit molecules, "
                        f"SMILES strings), got {type(X).__name__}") from None
    if all(map(isinstance, items, repeat(Graph))):  # the common case, without a Python frame per item
        graphs = items
    else:
        graphs = [_convert(g, f"{name}[{k}]") for k, g in enumerate(items)]
    if validate:
        require_valid_all(graphs)
    return graphs
