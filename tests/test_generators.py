"""Generators: simple undirected graphs, seeded, with the sizes and degree statistics of their models."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial import ConvexHull

from graphkern.generators import (barabasi_albert, chung_lu, complete, contact_graph_3d, delaunay, grid_2d,
                                  newman_watts_strogatz, random_labeled, rmat, watts_strogatz)
from graphkern.generators.labeled import _pair_from_index
from graphkern.graph import Graph

RANDOM = {
    "barabasi_albert": lambda seed, **kw: barabasi_albert(3000, 4, seed=seed, **kw),
    "watts_strogatz": lambda seed, **kw: watts_strogatz(3000, 6, 0.3, seed=seed, **kw),
    "newman_watts_strogatz": lambda seed, **kw: newman_watts_strogatz(3000, 6, 0.3, seed=seed, **kw),
    "rmat": lambda seed, **kw: rmat(11, seed=seed, **kw),
    "chung_lu": lambda seed, **kw: chung_lu(3000, 2.5, 8, seed=seed, **kw),
    "delaunay": lambda seed, **kw: delaunay(3000, seed=seed, **kw),
    "contact_graph_3d": lambda seed, **kw: contact_graph_3d(2000, seed=seed, **kw),
    "random_labeled": lambda seed, **kw: random_labeled(500, 0.02, n_edge_labels=3, continuous=2, seed=seed, **kw),
}
DETERMINISTIC = {
    "grid_2d": lambda **kw: grid_2d(30, 40, **kw),
    "grid_2d_periodic": lambda **kw: grid_2d(30, 40, periodic=True, **kw),
    "complete": lambda **kw: complete(50, **kw),
}


def assert_simple_undirected(graph):
    """Symmetric, sorted, no repeated entry, no self-loop: re-validate with Graph's own checks."""
    again = Graph(graph.indptr, graph.indices, graph.weights, node_labels=graph.node_labels,
                  edge_labels=graph.edge_labels)
    assert again == graph  # validation neither reordered nor changed anything
    assert graph.n_self_loops == 0
    assert graph.indices.dtype == np.int32


@pytest.mark.parametrize("make", RANDOM.values(), ids=RANDOM.keys())
def test_random_generators_are_simple_and_seeded(make):
    graph = make(7)
    assert_simple_undirected(graph)
    assert make(7) == graph
    assert make(np.random.default_rng(7)) == graph  # a Generator is used as is
    assert make(8) != graph
    A = make(7, as_csr=True)
    assert isinstance(A, sp.csr_matrix)
    assert (A != graph.to_scipy()).nnz == 0


@pytest.mark.parametrize("make", DETERMINISTIC.values(), ids=DETERMINISTIC.keys())
def test_deterministic_generators_are_simple(make):
    graph = make()
    assert_simple_undirected(graph)
    assert (make(as_csr=True) != graph.to_scipy()).nnz == 0


def same_graph(graph, reference, order=None):
    """Adjacency equal to a networkx graph's, nodes in ``order`` (default: sorted)."""
    expected = nx.to_scipy_sparse_array(reference, nodelist=order or sorted(reference.nodes), format="csr")
    return (graph.to_scipy() != expected).nnz == 0


def test_complete_and_grids_match_networkx():
    assert same_graph(complete(7), nx.complete_graph(7))
    assert complete(1).nnz == 0 and complete(0).n_nodes == 0
    assert same_graph(grid_2d(4, 5), nx.grid_2d_graph(4, 5))  # sorted (i, j) is node i * 5 + j
    assert same_graph(grid_2d(4, 5, periodic=True), nx.grid_2d_graph(4, 5, periodic=True))
    assert grid_2d(1, 6).n_edges == 5


def test_small_world_lattices_and_edge_counts():
    assert same_graph(watts_strogatz(20, 4, 0.0, seed=1), nx.watts_strogatz_graph(20, 4, 0.0))
    assert same_graph(newman_watts_strogatz(20, 4, 0.0, seed=1), nx.watts_strogatz_graph(20, 4, 0.0))
    for p in (0.1, 0.5, 1.0):
        graph = watts_strogatz(2000, 8, p, seed=2)
        assert graph.n_edges == 2000 * 4  # rewiring keeps every edge
        lattice = watts_strogatz(2000, 8, 0.0).to_scipy()
        kept = graph.to_scipy().multiply(lattice).nnz / lattice.nnz
        assert abs(kept - (1 - p)) < 0.05 + p * 0.05  # a rewired edge rarely lands back on the lattice
    nws = newman_watts_strogatz(2000, 8, 0.25, seed=3)
    assert nws.to_scipy().multiply(lattice).nnz == lattice.nnz  # the lattice stays whole
    assert abs(nws.n_edges - 8000 * 1.25) < 200
    # a complete lattice cannot be rewired
    assert same_graph(watts_strogatz(5, 4, 1.0, seed=0), nx.complete_graph(5))
    # a nearly complete one mostly cannot: the rounds give up and the graph stays simple
    crowded = watts_strogatz(7, 4, 1.0, seed=0)
    assert_simple_undirected(crowded)
    assert 12 <= crowded.n_edges <= 14


@pytest.mark.parametrize("k", [3, 10])
def test_small_world_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k must be even and smaller than n"):
        watts_strogatz(10, k, 0.1)


def degree_histogram(degrees, upto):
    return np.bincount(np.minimum(degrees, upto), minlength=upto + 1) / len(degrees)


def test_barabasi_albert_follows_the_networkx_model():
    n, m = 20000, 3
    graph = barabasi_albert(n, m, seed=11)
    assert graph.n_edges == m * (n - m)
    assert graph.degrees.min() == m
    edges = {tuple(e) for e in graph.edge_list()[0].tolist()}
    assert {(0, k) for k in range(1, m + 1)} <= edges  # the initial star
    # every node after the star attaches to m earlier nodes
    later = graph.edge_list()[0]
    assert np.all(np.bincount(later[:, 1], minlength=n)[m + 1:] == m)
    reference = nx.barabasi_albert_graph(n, m, seed=11)
    ours = degree_histogram(graph.degrees, 30)
    theirs = degree_histogram(np.array([d for _, d in reference.degree()]), 30)
    np.testing.assert_allclose(ours, theirs, atol=0.012)
    assert ours[m] == pytest.approx(2 / (m + 2), abs=0.03)  # the model's P(k = m)


def test_barabasi_albert_small_and_invalid():
    assert same_graph(barabasi_albert(2, 1, seed=0), nx.path_graph(2))
    assert same_graph(barabasi_albert(4, 3, seed=0), nx.star_graph(3))  # the star alone
    with pytest.raises(ValueError, match="m < n"):
        barabasi_albert(3, 3)
    with pytest.raises(TypeError, match="n must be an integer"):
        barabasi_albert(10.5, 2)


def test_rmat_sizes_and_skew():
    graph = rmat(12, edge_factor=8, permute=False, seed=5)
    assert graph.n_nodes == 4096
    assert 0.7 * 8 * 4096 < graph.n_edges <= 8 * 4096
    degrees = graph.degrees
    assert degrees.argmax() == 0  # quadrant a (0.57) favours low row and column bits
    assert degrees.max() > 20 * degrees.mean()
    uniform = rmat(12, edge_factor=8, a=0.25, b=0.25, c=0.25, seed=5)
    assert uniform.degrees.max() < 3 * uniform.degrees.mean()
    with pytest.raises(ValueError, match="sum to at most 1"):
        rmat(4, a=0.6, b=0.3, c=0.3)


def test_chung_lu_degrees():
    n, avg = 20000, 10.0
    graph = chung_lu(n, 2.5, avg, permute=False, seed=4)
    degrees = graph.degrees
    assert abs(degrees.mean() - avg) < 0.05 * avg
    assert degrees.max() <= 1.2 * np.sqrt(n * avg)
    # expected degrees fall with the node number: the first hundred far above the last thousand
    assert degrees[:100].mean() > 10 * degrees[-1000:].mean()
    # power-law tail: P(deg >= k) ~ k^(1 - gamma), so halving k multiplies the tail by about 2^1.5
    tail = lambda k: np.mean(degrees >= k)
    assert 2.0 < tail(40) / tail(80) < 4.5
    assert chung_lu(n, 2.5, avg, seed=4).degrees.max() == degrees.max()  # permuting only renames
    with pytest.raises(ValueError, match="gamma must exceed 2"):
        chung_lu(100, 2.0, 3)


def test_delaunay_is_a_triangulation():
    graph = delaunay(2000, coords=True, weighted=True, seed=9)
    points = graph.node_labels["coords"]
    hull = ConvexHull(points)
    # Euler's formula for a triangulation of points in general position
    assert graph.n_edges == 3 * 2000 - 3 - len(hull.vertices)
    assert graph.degrees.min() >= 2 and abs(graph.degrees.mean() - 6) < 0.1
    edges, positions = graph.edge_list()
    lengths = np.linalg.norm(points[edges[:, 0]] - points[edges[:, 1]], axis=1)
    np.testing.assert_allclose(graph.weights[positions], lengths)


def test_contact_graph_against_brute_force():
    graph = contact_graph_3d(400, cutoff=7.0, seed=2)
    coords = graph.node_labels["coords"]
    distances = np.linalg.norm(coords[:, None] - coords[None, :], axis=2)
    expected = (distances <= 7.0) & ~np.eye(400, dtype=bool)
    np.testing.assert_array_equal(graph.to_scipy().toarray() > 0, expected)
    rows = np.repeat(np.arange(400), graph.degrees)
    np.testing.assert_allclose(graph.edge_labels["distance"], distances[rows, graph.indices])
    # the chain itself: consecutive beads at most a bond apart, so the graph is connected
    assert all(graph.to_scipy()[i, i + 1] for i in range(399))
    assert np.all(np.linalg.norm(np.diff(coords, axis=0), axis=1) <= 3.8 + 1e-9)
    side = (400 * 135.0) ** (1 / 3)
    assert coords.min() >= 0 and coords.max() <= side
    weighted = contact_graph_3d(400, cutoff=7.0, weighted=True, seed=2)
    np.testing.assert_array_equal(weighted.weights, graph.edge_labels["distance"])


def test_contact_graph_is_protein_like():
    degrees = contact_graph_3d(20000, seed=1).degrees
    assert 15 < degrees.mean() < 35


def test_random_labeled_counts_and_alphabets():
    graph = random_labeled(300, m=900, n_node_labels=5, n_edge_labels=3, continuous=4, weighted=True, seed=1)
    assert graph.n_edges == 900
    assert set(graph.node_labels["label"].tolist()) == set(range(5))
    assert set(graph.edge_labels["label"].tolist()) == set(range(3))
    assert graph.node_labels["attributes"].shape == (300, 4)
    assert graph.weights.min() > 0 and graph.weights.max() <= 1
    dense = random_labeled(400, 0.1, seed=2)
    assert abs(dense.n_edges - 0.1 * 400 * 399 / 2) < 4 * np.sqrt(0.1 * 0.9 * 400 * 399 / 2)
    assert random_labeled(4, m=6, seed=0).n_edges == 6  # every pair
    empty = random_labeled(3, m=0, n_edge_labels=2, seed=0)
    assert empty.n_edges == 0 and empty.edge_labels["label"].shape == (0,)
    with pytest.raises(ValueError, match="exactly one of p"):
        random_labeled(10, 0.1, m=3)
    with pytest.raises(ValueError, match="exceeds the 6 node pairs"):
        random_labeled(4, m=7)


@pytest.mark.parametrize("n", [2, 3, 7, 50])
def test_pair_from_index_covers_every_pair_in_order(n):
    i, j = _pair_from_index(np.arange(n * (n - 1) // 2), n)
    assert list(zip(i.tolist(), j.tolist())) == [(a, b) for a in range(n) for b in range(a + 1, n)]


def test_pair_from_index_at_large_n():
    n = 3_000_000
    i = np.array([0, 1, 1234567, n - 3, n - 2])
    start = i * (2 * n - i - 1) // 2
    k = np.concatenate([start, start + (n - 1 - i) - 1])  # first and last position of each row
    got_i, got_j = _pair_from_index(k, n)
    np.testing.assert_array_equal(got_i, np.concatenate([i, i]))
    np.testing.assert_array_equal(got_j, np.concatenate([i + 1, np.full(len(i), n - 1)]))


@pytest.mark.slow
def test_a_million_nodes():
    graph = barabasi_albert(1_000_000, 5, seed=0)
    assert graph.n_edges == 5 * (1_000_000 - 5)
    assert_simple_undirected(graph)
