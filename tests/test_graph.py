"""The graph model: constructors agree with SciPy/networkx, validation names the problem."""

import pickle

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph, pack_graphs
from graphkern.graph import as_csr_matrix, category_code


def random_edges(rng, n, m):
    e = rng.integers(0, n, size=(m, 2))
    e = e[e[:, 0] != e[:, 1]]
    e = np.unique(np.sort(e, axis=1), axis=0)
    return e


def test_from_edges_matches_scipy(rng):
    n = 60
    e = random_edges(rng, n, 300)
    w = rng.uniform(0.1, 2.0, len(e))
    G = Graph.from_edges(e, n, weights=w)
    ref = sp.coo_matrix((np.r_[w, w], (np.r_[e[:, 0], e[:, 1]], np.r_[e[:, 1], e[:, 0]])), shape=(n, n)).tocsr()
    ref.sort_indices()
    assert G.n_nodes == n and G.n_edges == len(e) and G.nnz == 2 * len(e)
    np.testing.assert_array_equal(G.indptr, ref.indptr)
    np.testing.assert_array_equal(G.indices, ref.indices)
    np.testing.assert_allclose(G.weights, ref.data)
    assert G.indices.dtype == np.int32


def test_edge_labels_follow_their_edge(rng):
    n = 30
    e = random_edges(rng, n, 80)
    lab = rng.integers(0, 5, len(e))
    vec = rng.normal(size=(len(e), 3))
    G = Graph.from_edges(e, n, edge_labels={"order": lab, "v": vec})
    A = G.to_scipy()
    rows = np.repeat(np.arange(n), np.diff(G.indptr))
    lookup = {(min(a, b), max(a, b)): k for k, (a, b) in enumerate(e)}
    for k, (r, c) in enumerate(zip(rows, G.indices)):
        src = lookup[(min(r, c), max(r, c))]
        assert G.edge_labels["order"][k] == lab[src]
        np.testing.assert_array_equal(G.edge_labels["v"][k], vec[src])
    assert A.nnz == G.nnz


def test_self_loops_stored_once():
    G = Graph.from_edges([(0, 0), (0, 1), (2, 2)], 3)
    assert G.nnz == 4 and G.n_edges == 3 and G.n_self_loops == 2
    np.testing.assert_array_equal(G.to_scipy().toarray(), [[1, 1, 0], [1, 0, 0], [0, 0, 1]])


def test_from_scipy_sums_duplicates_and_detects_unweighted(rng):
    A = sp.coo_matrix((np.ones(4), ([0, 1, 0, 1], [1, 0, 1, 0])), shape=(3, 3))
    G = Graph.from_scipy(A)
    assert G.is_weighted  # duplicates summed to 2
    np.testing.assert_allclose(G.weights, [2.0, 2.0])
    B = sp.csr_matrix(np.array([[0, 1], [1, 0]]))
    assert not Graph.from_scipy(B).is_weighted


def test_from_networkx_roundtrip(rng):
    g = nx.gnm_random_graph(40, 90, seed=int(rng.integers(1 << 30)))
    for v in g.nodes:
        g.nodes[v]["element"] = ["C", "N", "O"][v % 3]
        g.nodes[v]["charge"] = float(v % 2)
    for u, v in g.edges:
        g.edges[u, v]["order"] = (u + v) % 3
        g.edges[u, v]["weight"] = 0.5 + (u * v) % 4
    G = Graph.from_networkx(g)
    assert G.n_nodes == 40 and G.n_edges == 90 and G.is_weighted
    assert G.node_labels["element"].dtype == np.int64
    assert G.node_labels["element"][0] == 6  # element symbols become atomic numbers, as in SD files
    np.testing.assert_allclose(G.to_scipy().toarray(), nx.to_numpy_array(g, weight="weight"))
    back = Graph.from_networkx(G.to_networkx())
    np.testing.assert_array_equal(back.edge_labels["order"], G.edge_labels["order"])


def test_permute_is_an_isomorphism(rng):
    n = 25
    G = Graph.from_edges(random_edges(rng, n, 60), n, node_labels={"x": rng.normal(size=n)})
    perm = rng.permutation(n)
    H = G.permute(perm)
    P = sp.csr_matrix((np.ones(n), (np.arange(n), perm)), shape=(n, n))
    np.testing.assert_array_equal(H.to_scipy().toarray(), (P @ G.to_scipy() @ P.T).toarray())
    np.testing.assert_array_equal(H.node_labels["x"], G.node_labels["x"][perm])


def test_pickle_roundtrip(rng):
    G = Graph.from_edges(random_edges(rng, 10, 20), 10, node_labels={"a": np.arange(10)})
    # __slots__ classes pickle through copyreg; graphs must travel to worker processes
    assert pickle.loads(pickle.dumps(G)) == G


def test_pack_graphs_offsets(rng):
    gs = [Graph.from_edges(random_edges(rng, n, 3 * n), n, node_labels={"t": rng.integers(0, 3, n)})
          for n in (5, 1, 12)]
    p = pack_graphs(gs, node_label_columns=["t"])
    assert p.n_graphs == 3
    np.testing.assert_array_equal(p.node_offsets, [0, 5, 6, 18])
    for k, g in enumerate(gs):
        np.testing.assert_array_equal(p.indptr_of(k), g.indptr)
        s, e = p.entry_offsets[k], p.entry_offsets[k + 1]
        np.testing.assert_array_equal(p.indices[s:e], g.indices)
        np.testing.assert_array_equal(p.node_labels["t"][p.node_offsets[k]:p.node_offsets[k + 1]], g.node_labels["t"])


def test_symmetrize_adds_missing_direction():
    A = sp.csr_matrix(([1.0, 2.0], ([0, 1], [1, 2])), shape=(3, 3))
    G = Graph.from_scipy(A, symmetrize=True)
    np.testing.assert_array_equal(G.to_scipy().toarray(), [[0, 1, 0], [1, 0, 2], [0, 2, 0]])


@pytest.mark.parametrize("make, message", [
    (lambda: Graph.from_scipy(sp.csr_matrix(([1.0], ([0], [1])), shape=(2, 2))), "not symmetric"),
    (lambda: Graph.from_scipy(sp.csr_matrix(([1.0, 2.0], ([0, 1], [1, 0])), shape=(2, 2))), "differs from its mirror"),
    (lambda: Graph.from_edges([(0, 1)], weights=[-1.0]), "negative edge weight"),
    (lambda: Graph.from_edges([(0, 1)], weights=[np.inf]), "not finite"),
    (lambda: Graph.from_edges([(0, 1)], weights=[np.nan]), "not finite"),
    (lambda: Graph.from_edges([(0, 3)], 2), "out of range"),
    (lambda: Graph.from_edges([(0, 1), (1, 0)]), "more than once"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"x": [1.0, np.nan]}), "NaN"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"x": [1.0]}), "has 1 rows but the graph has 2 nodes"),
    (lambda: Graph.from_edges([(0, 1)], edge_labels={"x": [1, 2]}), "2 rows but 1 edges"),
    (lambda: Graph([0, 1], [5]), "out of range"),
    (lambda: Graph.from_scipy(sp.csr_matrix((2, 3))), "square"),
    (lambda: Graph.from_networkx(nx.DiGraph([(0, 1)])), "directed"),
])
def test_bad_input_messages(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_missing_label_column_is_named():
    G = Graph.from_edges([(0, 1)], node_labels={"element": [1, 2]}, name="water")
    with pytest.raises(KeyError, match="'water' has no node label 'charge'.*'element'"):
        G.require_node_label("charge")


def test_as_csr_matrix_checks(rng):
    A = sp.random(20, 20, density=0.2, random_state=int(rng.integers(1 << 30)), format="csr")
    with pytest.raises(ValueError, match="A is not symmetric"):
        as_csr_matrix(A, name="A")
    S = A + A.T
    M, weighted = as_csr_matrix(S)
    assert weighted and M.has_sorted_indices
    S = S.tolil()
    S[0, 1] = S[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        as_csr_matrix(S.tocsr())
    with pytest.raises(TypeError, match="scipy.sparse"):
        as_csr_matrix(np.eye(3))


def test_edgeless_graph_with_weights_and_edge_labels():
    G = Graph.from_edges(np.zeros((0, 2), dtype=int), 3, weights=[], edge_labels={"order": []},
                         node_labels={"x": [1, 2, 3]})
    assert G.nnz == 0 and G.n_edges == 0 and G.is_weighted


def test_as_graph_list_names_the_bad_item():
    from graphkern.graph import as_graph_list
    G = Graph.from_edges([(0, 1)])
    assert as_graph_list((G, G)) == [G, G]
    with pytest.raises(TypeError, match=r"wrap it in a list: \[X\]"):
        as_graph_list(G)
    with pytest.raises(TypeError, match=r"Y\[1\] is a int"):
        as_graph_list([G, 3], "Y")
    with pytest.raises(TypeError, match="must be a sequence of graphs .*, got int"):
        as_graph_list(5)


def test_as_csr_matrix_sees_an_unmirrored_explicit_zero():
    A = sp.csr_matrix((np.array([1.0, 1.0, 0.0]), np.array([1, 0, 2]), np.array([0, 1, 3, 3])), shape=(3, 3))
    assert A.nnz == 3  # (1, 2) stored as an explicit zero, (2, 1) absent
    with pytest.raises(ValueError, match="not symmetric"):
        as_csr_matrix(A)


@pytest.mark.parametrize("asked", [100_000, 10_000, 2**31, np.int64(2**40)])
def test_thread_counts_are_clamped_with_a_warning(asked):
    from graphkern._backend import MAX_THREADS_PER_CORE, available_cores, resolve_threads
    limit = MAX_THREADS_PER_CORE * available_cores()
    with pytest.warns(RuntimeWarning, match=f"lowered to {limit}"):
        assert resolve_threads(asked) == limit
    assert resolve_threads(1) == 1 and resolve_threads(None) == available_cores()
    with pytest.raises(ValueError, match="n_threads must be >= 1"):
        resolve_threads(0)
    with pytest.raises(TypeError, match="n_threads must be a positive int"):
        resolve_threads(2.0)
