"""SMILES through RDKit: the message without RDKit, and known molecules with it."""

import io
import re
import sys

import numpy as np
import pytest

from graphkern.io import FileFormatError, from_smiles, iter_smiles, read_smiles


@pytest.fixture
def no_rdkit(monkeypatch):
    """Make ``import rdkit`` fail as it does where RDKit is not installed."""
    for name in [m for m in sys.modules if m == "rdkit" or m.startswith("rdkit.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rdkit", None)


@pytest.mark.parametrize("call", [
    lambda: from_smiles("CCO"),
    lambda: iter_smiles(io.StringIO("CCO\n")),  # at the call, not at the first molecule
    lambda: read_smiles(io.StringIO("CCO\n")),
])
def test_missing_rdkit_says_how_to_install(no_rdkit, call):
    with pytest.raises(ImportError, match=r"needs RDKit.*pip install graphkern\[rdkit\]"):
        call()


def bonds_of(graph):
    edges, positions = graph.edge_list()
    return {tuple(e): int(o) for e, o in zip(edges.tolist(), graph.edge_labels["bond_order"][positions])}


def test_known_molecules():
    pytest.importorskip("rdkit")
    acetate = from_smiles("CC(=O)[O-]", name="acetate")
    assert acetate.name == "acetate"
    assert acetate.node_labels["element"].tolist() == [6, 6, 8, 8]
    assert acetate.node_labels["charge"].tolist() == [0, 0, 0, -1]
    assert bonds_of(acetate) == {(0, 1): 1, (1, 2): 2, (1, 3): 1}
    assert "coords" not in acetate.node_labels
    benzene = from_smiles("c1ccccc1")
    assert set(bonds_of(benzene).values()) == {4}
    assert benzene.n_edges == 6
    salt = from_smiles("[Na+].[Cl-]")
    assert salt.node_labels["charge"].tolist() == [1, -1] and salt.n_edges == 0


def test_hydrogens_added():
    pytest.importorskip("rdkit")
    ethanol = from_smiles("CCO", hydrogens=True)
    assert sorted(ethanol.node_labels["element"].tolist()) == [1] * 6 + [6, 6, 8]
    assert ethanol.n_edges == 8
    # explicit hydrogens in the SMILES go unless asked for
    assert from_smiles("[H]OC([H])([H])[H]").node_labels["element"].tolist() == [8, 6]


def test_matches_the_sdf_reader():
    pytest.importorskip("rdkit")
    from pathlib import Path

    from graphkern.io import read_sdf
    acetate = read_sdf(Path(__file__).parent / "data" / "molecules.sdf", hydrogens=False)[0]
    mine = from_smiles("CC(=O)[O-]")
    for column in ("element", "charge"):
        np.testing.assert_array_equal(mine.node_labels[column], acetate.node_labels[column])
    assert bonds_of(mine) == bonds_of(acetate)


def test_smiles_file():
    pytest.importorskip("rdkit")
    text = "# a comment\nCCO ethanol\n\nc1ccccc1 benzene ring\nC\n"
    graphs = read_smiles(io.StringIO(text))
    assert [g.name for g in graphs] == ["ethanol", "benzene ring", None]
    assert [g.n_nodes for g in graphs] == [3, 6, 1]


def test_bad_smiles_names_file_and_line(tmp_path):
    pytest.importorskip("rdkit")
    path = tmp_path / "bad.smi"
    path.write_text("CCO ok\nC1CC broken ring\n")
    expected = f"{path}, line 2: RDKit cannot parse the SMILES 'C1CC'"
    with pytest.raises(FileFormatError, match="^" + re.escape(expected) + "$"):
        read_smiles(path)
    with pytest.raises(ValueError, match="RDKit cannot parse the SMILES 'C\\(C'"):
        from_smiles("C(C")
