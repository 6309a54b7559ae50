"""Matrix Market files: hand-made content, scipy.io as the reference writer and reader, every error."""

import io
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from graphkern.generators import random_labeled
from graphkern.io import FileFormatError, read_matrix_market, write_matrix_market

DATA = Path(__file__).parent / "data"


def test_weighted_symmetric_file():
    graph = read_matrix_market(DATA / "weighted_symmetric.mtx")
    expected = np.array([[0, 0.5, 3.0, 0, 0],
                         [0.5, 1.0, 2.0, 0, 0],
                         [3.0, 2.0, 0, 1.25, 0],
                         [0, 0, 1.25, 0, 0],
                         [0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(graph.to_scipy().toarray(), expected)
    assert graph.is_weighted and graph.n_self_loops == 1 and graph.n_edges == 5


def test_pattern_general_file_is_a_four_cycle():
    graph = read_matrix_market(DATA / "pattern_general.mtx")
    assert not graph.is_weighted
    np.testing.assert_array_equal(graph.to_scipy().toarray(), nx.to_numpy_array(nx.cycle_graph(4)))


def test_integer_values_of_one_are_unweighted_unless_asked():
    assert not read_matrix_market(DATA / "integer_symmetric.mtx").is_weighted
    graph = read_matrix_market(DATA / "integer_symmetric.mtx", weighted=True)
    assert graph.weights.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert graph.edge_list()[0].tolist() == [[0, 1], [1, 2]]


def test_as_csr_and_streams():
    graph = read_matrix_market(DATA / "weighted_symmetric.mtx")
    A = read_matrix_market(DATA / "weighted_symmetric.mtx", as_csr=True)
    assert isinstance(A, sp.csr_matrix) and A.has_sorted_indices
    assert (A != graph.to_scipy()).nnz == 0
    text = (DATA / "weighted_symmetric.mtx").read_text()
    assert read_matrix_market(io.StringIO(text)) == graph


@pytest.mark.parametrize("weighted", [False, True])
def test_round_trip_and_scipy_agree(tmp_path, weighted):
    graph = random_labeled(40, p=0.2, n_node_labels=0, weighted=weighted, seed=3)
    path = tmp_path / "g.mtx"
    write_matrix_market(path, graph, comment="written by a test\nsecond line")
    assert read_matrix_market(path) == graph
    reference = scipy.io.mmread(path)
    np.testing.assert_array_equal(reference.toarray(), graph.to_scipy().toarray())
    assert path.read_text().split("\n", 1)[0].split()[3] == ("real" if weighted else "pattern")


def test_reads_what_scipy_writes(tmp_path):
    rng = np.random.default_rng(7)
    A = sp.random(30, 30, density=0.2, random_state=rng, format="csr")
    A = A + A.T
    path = tmp_path / "scipy.mtx"
    scipy.io.mmwrite(path, A, symmetry="symmetric")
    np.testing.assert_allclose(read_matrix_market(path, as_csr=True).toarray(), A.toarray(), rtol=1e-15)
    scipy.io.mmwrite(tmp_path / "general.mtx", A, symmetry="general")
    np.testing.assert_allclose(read_matrix_market(tmp_path / "general.mtx", as_csr=True).toarray(), A.toarray())


@pytest.mark.parametrize("symmetry", ["symmetric", "general"])
def test_public_reader_gives_the_same_matrix(tmp_path, monkeypatch, symmetry):
    """Where SciPy's fast_matrix_market module lacks the cursor the reader uses, scipy.io.mmread
    (which mirrors a symmetric file itself) gives the same CSR matrix, and the same errors."""
    from graphkern.io import matrix_market

    rng = np.random.default_rng(11)
    A = sp.random(300, 300, density=0.05, random_state=rng, format="csr")
    A = A + A.T + sp.eye(300)
    path = tmp_path / "m.mtx"
    scipy.io.mmwrite(path, A, symmetry=symmetry)
    repeat = tmp_path / "repeat.mtx"
    lines = path.read_text().splitlines()
    head = 1 + next(i for i, line in enumerate(lines[1:]) if not line.startswith("%"))
    n, _, nnz = lines[head].split()
    repeat.write_text("\n".join(lines[:head] + [f"{n} {n} {int(nnz) + 1}"] + lines[head + 1:] + [lines[-1]]) + "\n")
    fast = read_matrix_market(path, as_csr=True)
    with pytest.raises(FileFormatError, match="given twice") as fast_error:
        read_matrix_market(repeat)
    monkeypatch.setattr(matrix_market, "_library_reader", lambda: None)
    public = read_matrix_market(path, as_csr=True)
    for x, y in ((fast, public), (fast, A.tocsr())):
        y.sort_indices()
        assert np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices)
        assert np.array_equal(x.data, y.data)
    with pytest.raises(FileFormatError, match="given twice") as public_error:
        read_matrix_market(repeat)
    assert str(public_error.value) == str(fast_error.value)


def test_asymmetric_general_matrix(tmp_path):
    path = tmp_path / "directed.mtx"
    path.write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 3\n")
    with pytest.raises(FileFormatError, match=r"not a symmetric adjacency: .*pass symmetrize=True"):
        read_matrix_market(path)
    graph = read_matrix_market(path, symmetrize=True)
    assert graph.edge_list()[0].tolist() == [[0, 1], [1, 2]]


def test_write_a_scipy_matrix(tmp_path):
    A = nx.to_scipy_sparse_array(nx.petersen_graph(), format="csr")
    write_matrix_market(tmp_path / "p.mtx", A)
    back = read_matrix_market(tmp_path / "p.mtx", as_csr=True)
    np.testing.assert_array_equal(back.toarray(), A.toarray())


HEADER = "%%MatrixMarket matrix coordinate real symmetric\n% comment\n"
ERRORS = {
    "not-matrix-market": ("3 3 1\n1 1 1\n", 1, "not a Matrix Market file"),
    "dense": ("%%MatrixMarket matrix array real general\n2 2\n1\n0\n0\n1\n", 1,
              "'array' (dense) files are not supported"),
    "complex": ("%%MatrixMarket matrix coordinate complex general\n", 1, "field 'complex' is not supported"),
    "skew": ("%%MatrixMarket matrix coordinate real skew-symmetric\n", 1, "symmetry 'skew-symmetric' is not supported"),
    "no-size-line": (HEADER, 2, "file ends before the size line"),
    "size-line": (HEADER + "3 3\n", 3, "expected the size line 'rows columns entries' (three integers), found '3 3'"),
    "not-square": (HEADER + "3 4 1\n1 1 1\n", 3, "the matrix is 3 x 4; an adjacency matrix is square"),
    "non-numeric-value": (HEADER + "3 3 2\n2 1 1.0\n3 2 x\n", 5, "field 3 ('x') is not a number"),
    "non-integer-index": (HEADER + "3 3 2\n2 1 1.0\n3 1.5 1\n", 5, "field 2 ('1.5') is not an integer index"),
    "index-range": (HEADER + "3 3 2\n2 1 1.0\n4 2 1\n", 5, "index 4 is out of range 1..3"),
    "index-zero": (HEADER + "3 3 2\n2 0 1.0\n3 2 1\n", 4, "index 0 is out of range 1..3"),
    "field-count": (HEADER + "3 3 2\n2 1 1.0\n3 2\n", 5, "expected 3 fields for a real matrix, found 2"),
    "too-few": (HEADER + "3 3 3\n2 1 1.0\n\n3 2 1\n", 6,
                "the file ends after 2 entries, but the size line, line 3, says 3 entries"),
    "too-many": (HEADER + "3 3 1\n2 1 1.0\n% between\n3 2 1\n", 6,
                 "more entries than the size line, line 3, says 1 entries"),
    "mirror-repeat": (HEADER + "3 3 3\n2 1 1.0\n3 2 1\n1 2 1.0\n", 6,
                      "entry (1, 2) is given twice (counting its mirror, as the matrix is symmetric)"),
    "negative": (HEADER + "3 3 2\n2 1 1.0\n3 2 -2\n", 5, "negative value -2: edge weights must be non-negative"),
    "nan": (HEADER + "3 3 2\n2 1 nan\n3 2 1\n", 4, "value 'nan' is not finite"),
}


@pytest.mark.parametrize("text, line, message", ERRORS.values(), ids=ERRORS.keys())
def test_errors_name_file_line_and_reason(tmp_path, text, line, message):
    path = tmp_path / "bad.mtx"
    path.write_text(text)
    with pytest.raises(FileFormatError) as info:
        read_matrix_market(path)
    assert str(info.value).startswith(f"{path}, line {line}: {message}")
    # an open (seekable) file gets the same diagnosis
    with pytest.raises(FileFormatError) as info:
        read_matrix_market(io.StringIO(text))
    assert str(info.value).startswith(f"<stream>, line {line}: {message}")


def test_general_repeat(tmp_path):
    path = tmp_path / "g.mtx"
    path.write_text("%%MatrixMarket matrix coordinate pattern general\n2 2 3\n1 2\n2 1\n1 2\n")
    with pytest.raises(FileFormatError, match=r"line 5: entry \(1, 2\) is given twice$"):
        read_matrix_market(path)


def test_negative_values_can_be_ignored(tmp_path):
    path = tmp_path / "neg.mtx"
    path.write_text(HEADER + "2 2 1\n2 1 -3.5\n")
    graph = read_matrix_market(path, weighted=False)
    assert not graph.is_weighted and graph.n_edges == 1


@pytest.mark.parametrize("end", ["", "\n"])
def test_a_value_that_is_not_a_number_is_named_before_the_parser_sees_it(tmp_path, end):
    """fast_matrix_market reads "1V" as 1 before a newline and crashes on it at the end of a file
    (found by the fuzz suite): the line check refuses it first."""
    from graphkern.io import read_matrix_market

    path = tmp_path / "bad.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real symmetric\n4 4 3\n2 1 1.0\n3 2 2.5\n4 4 1V" + end)
    with pytest.raises(ValueError, match=r"line 5: field 3 \('1V'\) is not a number"):
        read_matrix_market(path)


@pytest.mark.parametrize("last", ["4 4 1 ", "4 4 1", "4 4 1\t"])
def test_a_last_line_without_its_newline_is_read(tmp_path, last):
    """SciPy's parser crashed on some files whose last line has no newline (found by the fuzz suite)."""
    path = tmp_path / "last.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real symmetric\n4 4 3\n2 1 1.0\n3 2 2.5\n" + last)
    A = read_matrix_market(path, as_csr=True)
    assert A.nnz == 5 and A[3, 3] == 1.0 and A[0, 1] == 1.0 and A[2, 1] == 2.5


def _mm_text(n, entries, field, symmetry):
    lines = [f"%%MatrixMarket matrix coordinate {field} {symmetry}", "% made by the property test",
             f"{n} {n} {len(entries)}"]
    for i, j, v in entries:
        value = "" if field == "pattern" else f" {v:.17g}" if field == "real" else f" {int(v)}"
        lines.append(f"{i + 1} {j + 1}{value}")
    return "\n".join(lines) + "\n"


def test_read_matrix_market_matches_a_reference_on_random_files(tmp_path):
    """Random coordinate files (every field, symmetric and general, entries in any order, explicit
    zeros and self-loops, one or more threads) read as the CSR built from their entries with NumPy;
    a repeated or out-of-range entry is refused, naming its line."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=60, deadline=None, database=None)
    @given(st.data())
    def check(data):
        n = data.draw(st.integers(1, 12))
        field = data.draw(st.sampled_from(["real", "integer", "pattern"]))
        symmetry = data.draw(st.sampled_from(["symmetric", "general"]))
        cells = [(i, j) for i in range(n) for j in range(n) if symmetry == "general" or i >= j]
        chosen = data.draw(st.lists(st.sampled_from(cells), unique=True, max_size=len(cells)))
        if symmetry == "general":  # a general file of a graph stores both triangles alike
            chosen = sorted({c for i, j in chosen for c in ((i, j), (j, i))})
        values = {}
        for i, j in chosen:
            v = values.get((j, i))
            if v is None:
                v = data.draw(st.sampled_from([0.0, 1.0, 2.0, 3.5])) if field == "real" else \
                    float(data.draw(st.integers(0, 3))) if field == "integer" else 1.0
            values[(i, j)] = v
        order = data.draw(st.permutations(range(len(chosen))))
        entries = [(*chosen[k], values[chosen[k]]) for k in order]
        path = tmp_path / "m.mtx"
        path.write_text(_mm_text(n, entries, field, symmetry))
        dense = np.zeros((n, n))
        stored = np.zeros((n, n), dtype=bool)
        for i, j, v in entries:
            dense[i, j] = dense[j, i] = v
            stored[i, j] = stored[j, i] = True
        weighted = field != "pattern" and not all(v == 1 for _, _, v in entries)
        rows, cols = np.nonzero(stored)
        want = sp.csr_matrix((dense[rows, cols] if weighted else np.ones(len(rows)), (rows, cols)), shape=(n, n))
        for threads in (1, 3):
            got = read_matrix_market(path, as_csr=True, n_threads=threads)
            assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
            assert np.array_equal(got.data, want.data)
        if entries:  # the first entry again at the end: a repeat, named on its line
            path.write_text(_mm_text(n, entries + [entries[0]], field, symmetry).replace(
                f"{n} {n} {len(entries)}\n", f"{n} {n} {len(entries) + 1}\n"))
            with pytest.raises(FileFormatError, match="given twice"):
                read_matrix_market(path)
            bad = [(n, 0, 1.0)] + entries[1:]
            path.write_text(_mm_text(n, bad, field, symmetry))
            with pytest.raises(FileFormatError, match="line 4"):
                read_matrix_market(path)

    check()
