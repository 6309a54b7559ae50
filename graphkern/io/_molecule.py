"""What the molecule readers (SDF, SMILES) share: element numbers, bond codes, the graph they build."""

import numpy as np

from ..graph import Graph

_SYMBOLS = (
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se "
    "Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy "
    "Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf "
    "Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()

# deuterium and tritium are hydrogen isotopes; MDL files may write them as D and T
ATOMIC_NUMBER = {sym: z for z, sym in enumerate(_SYMBOLS, 1)} | {"D": 1, "T": 1}

HYDROGEN = 1

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
