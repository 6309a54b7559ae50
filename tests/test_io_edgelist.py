"""Edge lists (SNAP, KONECT, networkx): random files against a reference built from their lines,
the weights, renumbering, every error naming its line."""

import gzip
import io

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from graphkern.io import FileFormatError, read_edgelist


def reference(lines, n=None, weighted=False):
    """The adjacency of the edge lines ``[(u, v[, w])]`` as the reader should build it: undirected,
    repeats one edge."""
    edges = {}
    for line in lines:
        u, v = int(line[0]), int(line[1])
        edges[(min(u, v), max(u, v))] = float(line[2]) if weighted else 1.0
    n = n if n is not None else 1 + max((max(e) for e in edges), default=-1)
    rows = [i for (i, j) in edges] + [j for (i, j) in edges if i != j]
    cols = [j for (i, j) in edges] + [i for (i, j) in edges if i != j]
    vals = list(edges.values()) + [w for (i, j), w in edges.items() if i != j]
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    A.sort_indices()
    return A


def same(graph, A, weighted):
    assert graph.n_nodes == A.shape[0]
    np.testing.assert_array_equal(graph.indptr, A.indptr)
    np.testing.assert_array_equal(graph.indices, A.indices)
    assert graph.is_weighted == weighted
    if weighted:
        np.testing.assert_array_equal(graph.weights, A.data)


def test_random_edge_lists_against_the_reference(rng, tmp_path):
    """Ids with gaps, edges in both directions and repeated, self-loops, comment and blank lines,
    tabs and spaces; with and without weights; renumbered or not; a path, a .gz and a file object."""
    for trial in range(20):
        n = int(rng.integers(1, 60))
        m = int(rng.integers(1, 4 * n))
        ids = np.sort(rng.choice(10 * n, size=n, replace=False))
        pairs = rng.integers(0, n, size=(m, 2))
        weighted = bool(trial % 2)
        weight_of = {}
        lines, text = [], ["# a SNAP-like header", "% and a KONECT one" if trial % 3 == 0 else "#"]
        for a, b in pairs:
            key = (min(a, b), max(a, b))
            w = weight_of.setdefault(key, float(rng.integers(1, 5)) / 2)
            u, v = (ids[a], ids[b]) if rng.random() < 0.5 else (ids[b], ids[a])
            lines.append((u, v, w))
            sep = "\t" if rng.random() < 0.5 else "  "
            text.append(f"{u}{sep}{v}" + (f"{sep}{w:g}" if weighted else ""))
            if rng.random() < 0.1:
                text.append("")
        path = tmp_path / f"e{trial}.txt"
        path.write_text("\n".join(text) + "\n")
        want = reference(lines, weighted=weighted)
        same(read_edgelist(path), want, weighted and not np.all(want.data == 1))
        same(read_edgelist(path, weighted=weighted, n_threads=1), want, weighted)
        used = np.unique([[u, v] for u, v, _ in lines])
        renumbered = read_edgelist(path, weighted=weighted, renumber=True)
        local = {u: k for k, u in enumerate(used)}
        same(renumbered, reference([(local[u], local[v], w) for u, v, w in lines], weighted=weighted), weighted)
        np.testing.assert_array_equal(renumbered.node_labels["id"], used)
    with gzip.open(tmp_path / "e.txt.gz", "wt") as f:
        f.write(path.read_text())
    same(read_edgelist(tmp_path / "e.txt.gz", weighted=True), want, True)
    same(read_edgelist(io.StringIO(path.read_text()), weighted=True), want, True)


def test_networkx_edge_list_round_trip(tmp_path):
    g = nx.gnm_random_graph(200, 600, seed=3)
    for u, v in g.edges:
        g.edges[u, v]["weight"] = 1.0 + (u + v) % 5
    path = tmp_path / "g.edgelist"
    nx.write_weighted_edgelist(g, path)
    A = sp.csr_matrix(nx.to_scipy_sparse_array(g, nodelist=range(200), weight="weight"))
    A.sort_indices()
    same(read_edgelist(path, n_threads=2), A, True)


def test_empty_and_comment_only_files(tmp_path):
    for text in ("", "# nothing\n", "\n\n"):
        path = tmp_path / "empty.txt"
        path.write_text(text)
        graph = read_edgelist(path)
        assert graph.n_nodes == 0 and graph.nnz == 0


@pytest.mark.parametrize("text, kwargs, line, match", [
    ("0 1\n1 x\n", {}, 2, r"field 2 \('x'\) is not a number"),
    ("# h\n0 1\n2\n", {}, 3, "expected 2 fields as on the lines before, found 1"),
    ("0 1\n-1 2\n", {}, 2, "vertex ids must be non-negative whole numbers"),
    ("0 1\n1.5 2\n", {}, 2, "vertex ids must be non-negative whole numbers"),
    ("0 1 2\n2 3 inf\n", {}, 2, "not finite"),
    ("0 1 2.0\n3 2 1\n1 0 3.0\n", {}, 3, r"the edge \(0, 1\) of line 1 again, with another weight"),
    ("0 1\n1 2\n", {"weighted": True}, None, "no third field"),
    ("0 1 -2\n", {}, None, "negative"),
    ("0 4294967296\n", {}, None, "renumber=True"),
])
def test_errors_name_the_file_and_line(tmp_path, text, kwargs, line, match):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=match) as err:
        read_edgelist(path, **kwargs)
    assert err.value.line == line and err.value.path == str(path)


def test_large_ids_renumbered(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("4294967296 7\n7 10000000000\n")
    graph = read_edgelist(path, renumber=True)
    assert graph.node_labels["id"].tolist() == [7, 4294967296, 10000000000]
    assert graph.to_scipy().toarray().tolist() == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]


def test_compiled_parse_agrees_with_numpy_or_declines():
    """The compiled parse of edge lines gives numpy's int64 table, chunked on any thread count, or
    declines (None) where a line is not two or three unsigned integers; never another table."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    from graphkern._cpu import validate as compiled

    field = st.one_of(st.integers(0, 10**6).map(str), st.sampled_from(["-1", "+2", "1.5", "1e3", "x", "0007",
                                                                       "1234567890123456789"]))
    line = st.one_of(st.lists(st.integers(0, 10**6).map(str), min_size=2, max_size=3),
                     st.lists(field, min_size=0, max_size=4), st.just(["#", "comment"]), st.just(["%"]))
    blank = st.sampled_from([" ", "\t", "  \t"])
    end = st.sampled_from(["\n", "\r\n", " \n"])

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(st.tuples(line, blank, end), max_size=30), st.booleans(), st.integers(1, 4),
           st.integers(1, 64))
    def check(lines, final_newline, threads, chunk):
        text = "".join(sep.join(fields) + eol for fields, sep, eol in lines)
        if not final_newline:
            text = text.rstrip("\r\n")
        got = compiled.parse_edge_lines(np.frombuffer(text.encode(), np.uint8), np.frombuffer(b"#%", np.uint8),
                                        threads, chunk)
        if got is None:
            return
        data = [ln.split("#")[0].split("%")[0].split() for ln in text.splitlines()]
        want = [list(map(int, f)) for f in data if f]
        assert got.tolist() == want and got.dtype == np.int64
        assert got.shape[1] == (len(want[0]) if want else 2)

    check()


def test_compiled_and_numpy_paths_give_one_graph(rng, tmp_path, monkeypatch):
    """The compiled parse and numpy's give the same Graph (an integer third field not read)."""
    from graphkern._cpu import validate as compiled

    e = rng.integers(0, 500, size=(3000, 2))
    w = rng.integers(1, 4, size=3000)
    path = tmp_path / "g.txt"
    path.write_text("# header\n" + "\n".join(f"{a}\t{b}\t{w[k]}" for k, (a, b) in enumerate(e)) + "\n")
    fast = read_edgelist(path, weighted=False)  # repeats of an edge carry other weights: not read
    monkeypatch.setattr(compiled, "parse_edge_lines", lambda *a: None)
    general = read_edgelist(path, weighted=False)
    assert fast == general and fast.n_nodes == e.max() + 1
