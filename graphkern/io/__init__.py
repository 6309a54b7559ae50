"""Graph readers (and the writers their round trips need).

=====================  ===================================================
SD files (V2000)       :func:`iter_sdf`, :func:`read_sdf`
SMILES (RDKit extra)   :func:`from_smiles`, :func:`iter_smiles`, :func:`read_smiles`, :func:`from_rdkit`
TU Dortmund folders    :func:`read_tudataset`, :func:`write_tudataset`
Matrix Market          :func:`read_matrix_market`, :func:`write_matrix_market`
Edge lists (SNAP)      :func:`read_edgelist`
=====================  ===================================================

Malformed input raises :class:`FileFormatError` (a ``ValueError``) naming the file and line.
"""

from ._text import FileFormatError
from .edgelist import read_edgelist
from .matrix_market import read_matrix_market, write_matrix_market
from .sdf import iter_sdf, read_sdf
from .smiles import from_rdkit, from_smiles, iter_smiles, read_smiles
from .tudataset import TUDataset, read_tudataset, write_tudataset

__all__ = [
    "FileFormatError",
    "iter_sdf", "read_sdf",
    "from_smiles", "from_rdkit", "iter_smiles", "read_smiles",
    "TUDataset", "read_tudataset", "write_tudataset",
    "read_matrix_market", "write_matrix_market",
    "read_edgelist",
]
