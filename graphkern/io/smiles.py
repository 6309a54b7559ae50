"""SMILES strings and RDKit molecules as graphs (RDKit is an optional extra).

The graphs carry the labels of the SDF reader: node labels ``element`` and ``charge``
(``coords`` too when the molecule has a 3D conformer) and the edge label
``bond_order`` with the MDL codes (1, 2, 3, 4 = aromatic; 0 for RDKit's other bond
types such as dative bonds).
"""

from __future__ import annotations

import numpy as np

from ..graph import Graph
from ._text import FileFormatError, open_text, source_name

__all__ = ["from_smiles", "from_rdkit", "iter_smiles", "read_smiles"]

_INSTALL_HINT = "install the optional extra: pip install graphkern[rdkit]"


def _rdkit_chem():
    try:
        from rdkit import Chem
    except ImportError as err:
        raise ImportError(f"reading SMILES needs RDKit, which is not installed; {_INSTALL_HINT}") from err
    return Chem


def from_rdkit(mol, *, name=None):
    """An RDKit ``Mol`` as a graph, with the atoms and bonds it holds (hydrogens as it has them)."""
    Chem = _rdkit_chem()
    if not isinstance(mol, Chem.Mol):
        raise TypeError(f"mol must be an RDKit Mol, got {type(mol).__name__}")
    kinds = Chem.BondType  # as the MDL bond-type codes of the SDF reader
    order_of = {kinds.SINGLE: 1, kinds.DOUBLE: 2, kinds.TRIPLE: 3, kinds.AROMATIC: 4}
    atoms = mol.GetAtoms()
    node_labels = {
        "element": np.array([a.GetAtomicNum() for a in atoms], dtype=np.int64),
        "charge": np.array([a.GetFormalCharge() for a in atoms], dtype=np.int64),
    }
    if mol.GetNumConformers() and mol.GetConformer().Is3D():
        node_labels["coords"] = np.asarray(mol.GetConformer().GetPositions(), dtype=np.float64).reshape(-1, 3)
    bonds = mol.GetBonds()
    edges = np.array([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in bonds], dtype=np.int64).reshape(-1, 2)
    orders = np.array([order_of.get(b.GetBondType(), 0) for b in bonds], dtype=np.int64)
    return Graph.from_edges(edges, len(atoms), node_labels=node_labels, edge_labels={"bond_order": orders}, name=name)


def _parse(Chem, smiles, hydrogens):
    from rdkit import rdBase

    with rdBase.BlockLogs():  # the reason goes into our exception, not onto stderr
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    # without hydrogens: none at all, as the SD reader drops them (RemoveHs keeps isotopes and H2)
    return Chem.AddHs(mol) if hydrogens else Chem.RemoveAllHs(mol)


def from_smiles(smiles, *, hydrogens=False, name=None):
    """One SMILES string as a graph.

    ``hydrogens=True`` adds every hydrogen as an atom (RDKit ``AddHs``); by default
    the graph holds the heavy atoms only (no hydrogen of any isotope, as :func:`read_sdf`
    with ``hydrogens=False``).  Aromatic rings keep aromatic bonds (4), where most SD files
    write a Kekulé form (1 and 2).
    """
    if not isinstance(smiles, str):
        raise TypeError(f"smiles must be a string, got {type(smiles).__name__}")
    Chem = _rdkit_chem()
    mol = _parse(Chem, smiles, hydrogens)
    if mol is None:
        raise ValueError(f"RDKit cannot parse the SMILES {smiles!r}")
    return from_rdkit(mol, name=name)


def iter_smiles(source, *, hydrogens=False):
    """Yield the molecules of a SMILES file (one a line: the SMILES, then an optional name).

    Blank lines and lines starting with ``#`` are skipped.  A SMILES that RDKit cannot
    parse raises :class:`FileFormatError` naming the file and line.  RDKit's absence
    is reported at the call, before any line is read.
    """
    return _iter_smiles(_rdkit_chem(), source, hydrogens)


def read_smiles(source, *, hydrogens=False):
    """All molecules of a SMILES file as a list; see :func:`iter_smiles`."""
    return list(iter_smiles(source, hydrogens=hydrogens))


def _iter_smiles(Chem, source, hydrogens):
    path = source_name(source)
    with open_text(source) as f:
        for lineno, line in enumerate(f, 1):
            fields = line.split(None, 1)
            if not fields or fields[0].startswith("#"):
                continue
            mol = _parse(Chem, fields[0], hydrogens)
            if mol is None:
                raise FileFormatError(path, lineno, f"RDKit cannot parse the SMILES {fields[0]!r}")
            yield from_rdkit(mol, name=fields[1].strip() if len(fields) > 1 else None)
