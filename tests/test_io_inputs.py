"""Inputs as users hold them: the same molecules from an SD file, RDKit, SMILES and networkx."""

import gzip
from importlib import resources

import networkx as nx
import numpy as np
import pytest

import graphkern
from graphkern import Graph
from graphkern.convert import as_graphs
from graphkern.io import read_sdf

Chem = pytest.importorskip("rdkit.Chem")

NCI = resources.files("graphkern.bench.data") / "nci1000.sdf.gz"
MOLECULE_LABELS = ("element", "charge")


def packaged_molecules(count):
    """``count`` non-aromatic molecules (their SD bond orders are RDKit's too): (Graph from the SD
    file, RDKit molecule), heavy atoms only."""
    graphs = read_sdf(str(NCI), hydrogens=False)
    with gzip.open(str(NCI), "rb") as f:
        mols = list(Chem.ForwardSDMolSupplier(f, removeHs=True))
    pairs = [(g, m) for g, m in zip(graphs, mols)
             if m is not None and m.GetNumAtoms() == g.n_nodes and m.GetNumAtoms() > 1
             and not any(b.GetIsAromatic() for b in m.GetBonds())]
    assert len(pairs) >= count
    return pairs[:count]


def as_networkx(mol):
    """A molecule as a user's networkx graph: element symbols, charges and bond orders as attributes."""
    g = nx.Graph()
    for a in mol.GetAtoms():
        g.add_node(a.GetIdx(), element=a.GetSymbol(), charge=a.GetFormalCharge())
    for b in mol.GetBonds():
        g.add_edge(b.GetBeginAtomIdx(), b.GetEndAtomIdx(), bond_order=int(b.GetBondTypeAsDouble()))
    return g


def same_molecule(a, b):
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    for col in MOLECULE_LABELS:
        assert np.array_equal(a.node_labels[col], b.node_labels[col]), col
    assert np.array_equal(a.edge_labels["bond_order"], b.edge_labels["bond_order"])


def test_the_same_molecules_from_every_source_get_the_same_labels():
    for sdf_graph, mol in packaged_molecules(25):
        smiles = Chem.MolToSmiles(mol)
        order = list(mol.GetPropsAsDict(includePrivate=True, includeComputed=True)["_smilesAtomOutputOrder"])
        from_rdkit, from_smiles, from_nx = as_graphs([mol, smiles, as_networkx(mol)])
        same_molecule(from_rdkit, sdf_graph)
        same_molecule(from_nx, sdf_graph)
        same_molecule(from_smiles, sdf_graph.permute(order))  # SMILES writes the atoms in its own order
        assert from_nx.node_labels["element"].dtype == np.int64 and 6 in from_nx.node_labels["element"]


def test_smiles_without_hydrogens_drops_every_hydrogen_as_the_sd_reader(tmp_path):
    """Heavy atoms only means no hydrogen of any isotope, from SMILES as from an SD file (RDKit's
    RemoveHs keeps deuterium and H2)."""
    smiles = ["[2H]C", "C([2H])([2H])[2H]", "[H][H]", "[2H]OC(=O)C", "[H+].[Cl-]", "CCO"]
    path = tmp_path / "h.sdf"
    with Chem.SDWriter(str(path)) as writer:
        for s in smiles:
            writer.write(Chem.MolFromSmiles(s))
    for s, sdf_graph in zip(smiles, read_sdf(str(path), hydrogens=False)):
        graph = graphkern.io.from_smiles(s)
        assert graph.n_nodes == sdf_graph.n_nodes and 1 not in graph.node_labels["element"], s
        same_molecule(graph, sdf_graph)
    assert graphkern.io.from_smiles("[2H]C", hydrogens=True).n_nodes == 5


def test_mixed_inputs_and_errors_name_the_item_and_converter():
    G = Graph.from_edges([(0, 1)])
    out = as_graphs([G, "CCO", nx.path_graph(3), Chem.MolFromSmiles("C=O")], name="X")
    assert out[0] is G and [g.n_nodes for g in out] == [2, 3, 3, 2]
    assert out[1].node_labels["element"].tolist() == [6, 6, 8]
    with pytest.raises(ValueError, match=r"X\[1\] could not be converted by graphkern.io.from_smiles: "
                                         r"RDKit cannot parse the SMILES 'C\(\('"):
        as_graphs([G, "C(("])
    bad = nx.Graph()
    bad.add_node(0, element="Xx")
    with pytest.raises(ValueError, match=r"Y\[0\] could not be converted by Graph.from_networkx: .*'Xx' at node 0"):
        as_graphs([bad], name="Y")
    with pytest.raises(TypeError, match=r"X\[0\] is a float, expected a graphkern.Graph, a networkx or igraph graph"):
        as_graphs([1.5])
    with pytest.raises(TypeError, match="single str"):
        as_graphs("CCO")


def test_dir_lists_the_public_api():
    names = dir(graphkern)
    for public in ("Graph", "jaccard", "expm_multiply", "ShortestPathKernel", "MarginalizedGraphKernel", "io"):
        assert public in names
    assert not any(n.startswith("_") and not n.startswith("__") for n in names)
