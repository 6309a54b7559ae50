"""The SD file reader against a hand-made file of known content, its errors, and RDKit as a reference."""

import gzip
import io
import pickle
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from graphkern.io import FileFormatError, iter_sdf, read_sdf

DATA = Path(__file__).parent / "data"
MOLECULES = DATA / "molecules.sdf"
NCI = resources.files("graphkern.bench.data") / "nci1000.sdf.gz"


def bonds_of(graph):
    """{(i, j): bond order} over the undirected edges."""
    edges, positions = graph.edge_list()
    return {tuple(e): int(o) for e, o in zip(edges.tolist(), graph.edge_labels["bond_order"][positions])}


def test_reads_the_known_molecules():
    acetate, ammonium, benzene = read_sdf(MOLECULES)
    assert [g.name for g in (acetate, ammonium, benzene)] == ["acetate", "ammonium", "benzene"]
    assert acetate.node_labels["element"].tolist() == [6, 6, 8, 8, 1, 1, 1]
    # the atom block gives C1 a +1 that the 'M  CHG' line supersedes: only O4 is charged
    assert acetate.node_labels["charge"].tolist() == [0, 0, 0, -1, 0, 0, 0]
    assert bonds_of(acetate) == {(0, 1): 1, (1, 2): 2, (1, 3): 1, (0, 4): 1, (0, 5): 1, (0, 6): 1}
    np.testing.assert_array_equal(acetate.node_labels["coords"][3], [2.2, -1.2, 0.0])
    assert acetate.node_labels["coords"].shape == (7, 3)
    assert acetate.weights is None
    # without an 'M  CHG' line the atom block's code 3 means +1; D is hydrogen
    assert ammonium.node_labels["element"].tolist() == [7, 1, 1, 1, 1]
    assert ammonium.node_labels["charge"].tolist() == [1, 0, 0, 0, 0]
    assert bonds_of(benzene) == {(0, 1): 4, (1, 2): 4, (2, 3): 4, (3, 4): 4, (4, 5): 4, (0, 5): 4}


def test_data_items_come_with_properties():
    items = [data for _, data in iter_sdf(MOLECULES, properties=True)]
    assert items == [{"kind": "carboxylate"}, {}, {"activity": "7.25", "note": "flat\nring"}]


def test_hydrogens_dropped():
    acetate, ammonium, _ = read_sdf(MOLECULES, hydrogens=False)
    assert acetate.node_labels["element"].tolist() == [6, 6, 8, 8]
    assert acetate.node_labels["charge"].tolist() == [0, 0, 0, -1]
    assert bonds_of(acetate) == {(0, 1): 1, (1, 2): 2, (1, 3): 1}
    assert ammonium.n_nodes == 1 and ammonium.n_edges == 0
    assert ammonium.edge_labels["bond_order"].shape == (0,)


def molfile(atoms, bonds, name="m"):
    """A V2000 molfile from (symbol, x) atoms and (a, b, order) bonds, 1-based."""
    lines = [name, "", "", f"{len(atoms):3d}{len(bonds):3d}  0  0  0  0  0  0  0  0999 V2000"]
    lines += [f"{x:10.4f}{0:10.4f}{0:10.4f} {symbol:<3} 0  0  0  0  0  0  0  0  0  0  0  0" for symbol, x in atoms]
    lines += [f"{a:3d}{b:3d}{order:3d}  0" for a, b, order in bonds]
    return "\n".join(lines + ["M  END", "$$$$", ""])


def test_hydrogens_between_heavy_atoms_are_dropped_and_atoms_renumbered():
    # methanol written C, H, H, H, O, H: the oxygen is atom 5 and becomes node 1
    text = molfile([("C", 0), ("H", 1), ("H", 2), ("H", 3), ("O", 1.4), ("H", 2.4)],
                   [(1, 2, 1), (1, 3, 1), (1, 4, 1), (1, 5, 1), (5, 6, 1)])
    (methanol,) = read_sdf(io.StringIO(text), hydrogens=False)
    assert methanol.node_labels["element"].tolist() == [6, 8]
    assert bonds_of(methanol) == {(0, 1): 1}
    np.testing.assert_array_equal(methanol.node_labels["coords"][:, 0], [0, 1.4])


def test_distance_weights():
    acetate = read_sdf(MOLECULES, hydrogens=False, distance_weights=True)[0]
    weight = dict(zip(map(tuple, acetate.edge_list()[0].tolist()), acetate.weights[acetate.edge_list()[1]]))
    assert weight[(0, 1)] == pytest.approx(1.5)
    assert weight[(1, 2)] == pytest.approx(np.hypot(0.7, 1.2))


def test_open_files_and_gzip(tmp_path):
    text = MOLECULES.read_text()
    zipped = tmp_path / "molecules.sdf.gz"
    with gzip.open(zipped, "wt") as f:
        f.write(text)
    expected = read_sdf(MOLECULES)
    assert read_sdf(zipped) == expected
    assert read_sdf(io.StringIO(text)) == expected
    with open(MOLECULES, "rb") as f:
        assert read_sdf(f) == expected
        assert not f.closed  # the caller's file stays the caller's


def test_streams_one_molecule_at_a_time():
    # the second molecule is broken; the first must come out before the reader gets there
    text = MOLECULES.read_text().split("$$$$")[0] + "$$$$\nbroken\n\n\n  x  y\n"
    molecules = iter_sdf(io.StringIO(text))
    assert next(molecules).name == "acetate"
    with pytest.raises(FileFormatError, match="line 27: the atom count"):
        next(molecules)


def test_blank_lines_after_the_last_molecule_are_fine():
    assert len(read_sdf(io.StringIO(MOLECULES.read_text() + "\n\n\n\n\n"))) == 3


def test_a_lone_molfile_without_terminator():
    text = MOLECULES.read_text().split("> <kind>")[0]
    (acetate,) = read_sdf(io.StringIO(text))
    assert acetate.n_nodes == 7


ACETATE = MOLECULES.read_text().split("$$$$\n")[0] + "$$$$\n"


def edited(old, new, count=1):
    assert old in ACETATE
    return ACETATE.replace(old, new, count)


ERRORS = {
    # the counts line says 8 atoms: the first bond line is read as atom 8
    "too-few-atoms": (edited("  7  6  0", "  8  6  0"), 12,
                      "expected atom 8 of molecule 1 (the counts line, line 4, says 8 atoms"),
    # 6 atoms announced, 7 present: the seventh atom is read as bond 1
    "too-many-atoms": (edited("  7  6  0", "  6  6  0"), 11, "expected bond 1 of molecule 1"),
    # 7 bonds announced, 6 present: 'M  CHG' is read as bond 7
    "too-few-bonds": (edited("  7  6  0", "  7  7  0"), 18, "expected bond 7 of molecule 1"),
    # 5 bonds announced, 6 present: the sixth turns up in the properties block
    "too-many-bonds": (edited("  7  6  0", "  7  5  0"), 17,
                       "found a bond line after the bond block: the counts line, line 4, says 5 bonds"),
    "unknown-element": (edited(" O   0", " Xx  0"), 7, "atom 3: unknown element 'Xx'"),
    "lower-case-element": (edited(" O   0", " o   0"), 7, "atom 3: unknown element 'o'"),
    "three-letter-element": (edited(" O   0", " Uuo 0"), 7, "atom 3: unknown element 'Uuo'"),
    "non-numeric-coordinate": (edited("    1.5000    0.0000", "    1.5z00    0.0000"), 6,
                               "atom 2: the x coordinate is not a number: '1.5z00'"),
    "non-numeric-count": (edited("  7  6  0", "  a  6  0"), 4,
                          "the atom count (columns 1-3 of the counts line) is not a number: 'a'"),
    "missing-atom": (edited("  1  5  1  0", "  1  9  1  0"), 15, "bond 4 names atom 9, but molecule 1 has 7 atoms"),
    "bond-to-itself": (edited("  1  5  1  0", "  1  1  1  0"), 15, "bond 4 joins atom 1 to itself"),
    "repeated-bond": (edited("  1  5  1  0", "  2  1  1  0"), 15,
                      "bond 4 repeats the bond between atoms 2 and 1 of line 12"),
    # atom 1 has three bonds before: the one repeated is the last of them
    "repeated-later-bond": (edited("  1  7  1  0", "  6  1  1  0"), 17,
                            "bond 6 repeats the bond between atoms 6 and 1 of line 16"),
    "bond-type": (edited("  1  5  1  0", "  1  5  9  0"), 15, "bond 4: unknown bond type 9"),
    "charge-code": (edited(" C   0  3", " C   0  9"), 5, "atom 1: unknown charge code 9"),
    "charge-count": (edited("M  CHG  1   4  -1", "M  CHG  2   4  -1"), 18,
                     "'M  CHG' announces 2 atom-charge pairs but holds 1"),
    "charge-atom": (edited("M  CHG  1   4  -1", "M  CHG  1   8  -1"), 18,
                    "'M  CHG' names atom 8, but molecule 1 has 7 atoms"),
    "no-m-end": (edited("M  END\n", ""), 22, "molecule 1 ends before its 'M  END' line"),
    "v3000": (edited("999 V2000", "999 V3000"), 4, "V3000 molfiles are not supported"),
    "cut-in-atoms": (ACETATE[:ACETATE.index("    2.2000    1.2000")], 6,
                     "file ends inside the atom block of molecule 1 (2 atoms read"),
    "cut-in-bonds": (ACETATE[:ACETATE.index("  1  5  1")], 14,
                     "file ends inside the bond block of molecule 1 (3 bonds read"),
    "cut-in-properties": (ACETATE[:ACETATE.index("M  END")], 18,
                          "file ends inside the properties block of molecule 1 (no 'M  END' line)"),
    "cut-in-header": ("acetate\nonly a header\n", 2, "file ends inside the header block of molecule 1"),
}


@pytest.mark.parametrize("text, line, message", ERRORS.values(), ids=ERRORS.keys())
def test_errors_name_file_line_and_reason(tmp_path, text, line, message):
    path = tmp_path / "bad.sdf"
    path.write_text(text)
    with pytest.raises(FileFormatError) as info:
        read_sdf(path)
    assert str(info.value).startswith(f"{path}, line {line}: ")
    assert message in str(info.value)
    assert (info.value.path, info.value.line) == (str(path), line)


def test_error_in_a_later_molecule_names_it():
    text = MOLECULES.read_text().replace(" N   0", " Q   0")
    with pytest.raises(FileFormatError, match=r"line 28: atom 1: unknown element 'Q'"):
        read_sdf(io.StringIO(text))


def test_file_format_error_pickles():
    err = FileFormatError("a.sdf", 3, "bad")
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.path, again.line, again.reason) == (str(err), "a.sdf", 3, "bad")
    assert isinstance(again, ValueError)


# ---------------------------------------------------------------- RDKit as the reference reader

def _rdkit_graphs(path):
    Chem = pytest.importorskip("rdkit.Chem")
    from graphkern.io import from_rdkit
    supplier = Chem.SDMolSupplier(str(path), sanitize=False, removeHs=False)
    return [from_rdkit(mol, name=mol.GetProp("_Name")) for mol in supplier]


def _same_molecule(ours, theirs):
    assert ours.name == theirs.name
    for column in ("element", "charge"):
        np.testing.assert_array_equal(ours.node_labels[column], theirs.node_labels[column])
    assert bonds_of(ours) == bonds_of(theirs)


def test_hand_made_file_agrees_with_rdkit():
    for ours, theirs in zip(read_sdf(MOLECULES), _rdkit_graphs(MOLECULES), strict=True):
        _same_molecule(ours, theirs)


def test_rdkit_written_molecules_read_back(tmp_path):
    Chem = pytest.importorskip("rdkit.Chem")
    from rdkit.Chem import AllChem
    smiles = ["CC(=O)[O-]", "C[NH3+]", "c1ccc2ccccc2c1", "O=S(=O)([O-])c1ccc(cc1)N", "[Na+].[Cl-]",
              "C#CC(=C)Br", "C1CC1[N+](C)(C)C"]
    path = tmp_path / "written.sdf"
    with Chem.SDWriter(str(path)) as writer:
        for k, s in enumerate(smiles):
            mol = Chem.AddHs(Chem.MolFromSmiles(s))
            AllChem.EmbedMolecule(mol, randomSeed=k)
            mol.SetProp("_Name", s)
            writer.write(mol)
    ours = read_sdf(path)
    for mine, theirs in zip(ours, _rdkit_graphs(path), strict=True):
        _same_molecule(mine, theirs)
        np.testing.assert_allclose(mine.node_labels["coords"], theirs.node_labels["coords"], atol=1e-4)


def test_packaged_set_agrees_with_rdkit(tmp_path):
    # every molecule of the packaged set: elements, charges, bonds with their orders, coordinates
    path = tmp_path / "nci1000.sdf"
    with gzip.open(str(NCI), "rb") as f:
        path.write_bytes(f.read())
    ours = read_sdf(path)
    assert len(ours) == 1000
    for mine, theirs in zip(ours, _rdkit_graphs(path), strict=True):
        _same_molecule(mine, theirs)
        np.testing.assert_allclose(mine.node_labels["coords"], theirs.node_labels["coords"], atol=1e-4)


def random_molfile(rng, name):
    """A V2000 molfile of random atoms (H among them), charges by atom block or 'M  CHG', bonds 1-4."""
    elements = ["C", "N", "O", "S", "Cl", "H", "P", "Br", "Na", "Fe"]
    n = int(rng.integers(1, 40))
    symbols = rng.choice(elements, n)
    codes = rng.integers(0, 8, n)
    draws = int(rng.integers(0, 2 * n)) if n > 1 else 0
    pairs = {tuple(sorted(rng.choice(n, 2, replace=False))) for _ in range(draws)}
    bonds = [(a + 1, b + 1, int(rng.integers(1, 5))) if rng.random() < 0.5 else (b + 1, a + 1, int(rng.integers(1, 5)))
             for a, b in sorted(pairs)]
    lines = [name, "  random", "", f"{n:3d}{len(bonds):3d}  0  0  0  0  0  0  0  0999 V2000"]
    for s, code in zip(symbols, codes):
        x, y, z = rng.uniform(-50, 50, 3)
        lines.append(f"{x:10.4f}{y:10.4f}{z:10.4f} {s:<3} 0{int(code):3d}  0  0  0  0  0  0  0  0  0  0")
    lines += [f"{a:3d}{b:3d}{o:3d}  0" for a, b, o in bonds]
    if rng.random() < 0.5:
        atoms = rng.choice(n, min(n, 8), replace=False) + 1
        charges = rng.integers(-3, 4, 8)
        lines.append(f"M  CHG{len(atoms):3d}" + "".join(f"{a:4d}{int(c):4d}" for a, c in zip(atoms, charges)))
    return "\n".join(lines + ["M  END", "> <index>", name, "", "$$$$"])


def test_random_molecules_agree_with_rdkit(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "random.sdf"
    path.write_text("\n".join(random_molfile(rng, f"m{k}") for k in range(300)) + "\n")
    ours = read_sdf(path)
    for mine, theirs in zip(ours, _rdkit_graphs(path), strict=True):
        _same_molecule(mine, theirs)
        np.testing.assert_allclose(mine.node_labels["coords"], theirs.node_labels["coords"], atol=1e-4)
    # without hydrogens: the heavy-atom subgraph of the full graph, renumbered in order
    for full, heavy in zip(ours, read_sdf(path, hydrogens=False, distance_weights=True), strict=True):
        keep = np.flatnonzero(full.node_labels["element"] != 1)
        new = {int(old): k for k, old in enumerate(keep)}
        expected = {(new[a], new[b]): o for (a, b), o in bonds_of(full).items() if a in new and b in new}
        assert bonds_of(heavy) == expected
        np.testing.assert_array_equal(heavy.node_labels["coords"], full.node_labels["coords"][keep])
        edges, positions = heavy.edge_list()
        xyz = heavy.node_labels["coords"]
        lengths = np.linalg.norm(xyz[edges[:, 0]] - xyz[edges[:, 1]], axis=1)
        np.testing.assert_allclose(heavy.weights[positions], lengths)
    assert [data for _, data in iter_sdf(path, properties=True)] == [{"index": f"m{k}"} for k in range(300)]


def test_pieces_on_threads_give_the_same_molecules_and_errors(tmp_path, monkeypatch):
    from graphkern.io import sdf
    with gzip.open(str(NCI), "rb") as f:
        data = f.read()[:200_000]
    data = data[:data.rindex(b"$$$$\n") + 5]
    path = tmp_path / "part.sdf"
    path.write_bytes(data)
    whole = read_sdf(path, properties=True, n_threads=1)
    monkeypatch.setattr(sdf, "_PIECE_BYTES", 1000)
    assert read_sdf(path, properties=True, n_threads=4) == whole
    # a problem in the third quarter: the molecules before it come out, the error names its line
    bad = data.index(b"M  END", len(data) // 2)
    path.write_bytes(data[:bad] + b"M  CHG  1 999   1\n" + data[bad:])
    lineno = data[:bad].count(b"\n") + 1
    for threads in (1, 4):
        read = []
        with pytest.raises(FileFormatError, match=f"line {lineno}: 'M  CHG' names atom 999") as info:
            read.extend(iter_sdf(path, n_threads=threads))
        assert len(read) == data[:bad].count(b"$$$$")
        assert f"but molecule {len(read) + 1} has" in str(info.value)


def test_read_sdf_restores_the_collector(tmp_path):
    """read_sdf pauses the garbage collector while it makes the graphs, and leaves it as it found it
    (also when the file is refused)."""
    import gc

    from graphkern.bench.data import molecules_path

    assert gc.isenabled()
    assert len(read_sdf(molecules_path())) == 1000 and gc.isenabled()
    bad = tmp_path / "bad.sdf"
    bad.write_text("not a molecule\n")
    with pytest.raises(FileFormatError):
        read_sdf(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        read_sdf(molecules_path())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_read_sdf_graphs_equal_those_of_the_checked_constructor():
    """The reader stores its read-only views as they are: the same arrays, dtypes, flags and label
    columns as Graph(...) makes of them, with and without distance weights."""
    from graphkern import Graph
    from graphkern.bench.data import molecules_path

    for options in ({}, {"hydrogens": False, "distance_weights": True}):
        for g in read_sdf(molecules_path(), **options)[:200]:
            h = Graph(g.indptr, g.indices, g.weights, node_labels=dict(g.node_labels),
                      edge_labels=dict(g.edge_labels))
            for a, b in [(g.indptr, h.indptr), (g.indices, h.indices), (g.weights, h.weights),
                         *[(g.node_labels[k], h.node_labels[k]) for k in h.node_labels],
                         *[(g.edge_labels[k], h.edge_labels[k]) for k in h.edge_labels]]:
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
                    assert not a.flags.writeable and a.flags.c_contiguous
            assert list(g.node_labels) == list(h.node_labels) and list(g.edge_labels) == list(h.edge_labels)


def test_read_sdf_graphs_hold_the_fields_of_the_trusted_constructor():
    """The compiled maker sets what Graph._trusted(views=True) sets: the same arrays, cache and
    label columns (their class, owner and length), on every graph."""
    from graphkern.bench.data import molecules_path
    from graphkern.graph import Graph

    for options in ({}, {"hydrogens": False, "distance_weights": True}):
        for g in read_sdf(molecules_path(), **options):
            h = Graph._trusted(g.indptr, g.indices, g.weights, list(g.node_labels.items()),
                               list(g.edge_labels.items()), views=True)
            assert (g._n, g._indptr, g._indices, g._weights) == (h._n, h._indptr, h._indices, h._weights)
            assert g._cache == h._cache == {"valid": True}
            for mine, theirs in ((g._node_labels, h._node_labels), (g._edge_labels, h._edge_labels)):
                assert type(mine) is type(theirs) and list(mine.items()) == list(theirs.items())
                assert (mine._what, mine._length) == (theirs._what, theirs._length)
                assert mine._owner_cache is g._cache
            assert g.name and g.name == g.name.strip()


def test_a_coordinate_that_is_not_finite_is_refused_after_the_molecules_before_it(monkeypatch):
    from graphkern.io import sdf

    monkeypatch.setattr(sdf, "_BATCH", 2)  # acetate and ammonium are made together
    for spelled, kind in (("nan", "NaN"), ("-inf", "infinite")):
        text = MOLECULES.read_text().replace("   -0.6000   -0.6000    0.6000 H", f"   -0.6000{spelled:>10}    0.6000 H")
        read = []
        with pytest.raises(ValueError, match=f"node label 'coords' has a {kind} value at node 2"):
            read.extend(iter_sdf(io.StringIO(text)))
        assert [g.name for g in read] == ["acetate"]
        # the hydrogen goes, and its coordinates with it
        assert [g.name for g in read_sdf(io.StringIO(text), hydrogens=False)] == ["acetate", "ammonium", "benzene"]


def test_names_are_stripped_header_lines():
    names = ["  caf\u00e9\u00a0", "\x1c\x1d x y \x0b", "\u2003name\u2003", " \t ", "plain"]
    text = "".join(molfile([("C", 0.0)], [], name=name) for name in names)
    assert [g.name for g in read_sdf(io.StringIO(text))] == ["caf\u00e9", "x y", "name", None, "plain"]


@pytest.mark.parametrize("ending", [b"\r\n", b"\r"])
def test_line_endings_give_the_same_molecules(ending):
    with gzip.open(str(NCI), "rb") as f:
        data = f.read()[:300_000]
    data = data[:data.rindex(b"$$$$\n") + 5]
    expected = [(g.name, g, items) for g, items in read_sdf(io.BytesIO(data), properties=True)]
    got = [(g.name, g, items) for g, items in read_sdf(io.BytesIO(data.replace(b"\n", ending)), properties=True)]
    assert got == expected and len(got) > 50
