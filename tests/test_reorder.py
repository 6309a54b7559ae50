"""Vertex reorderings for octile sparsity: permutations, balance, invariance, tile counts."""

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial import cKDTree

from graphkern.graph import Graph
from graphkern.reorder import (METHODS, _hilbert_key, _morton_key, _pbr_batch, octile_count, reorder,
                               reorder_many)

# ---------------------------------------------------------------- small graphs built here


def geometric_graph(rng, n, mean_degree=10.0, dim=3):
    """Random geometric graph in the unit cube, with its points as the ``coords`` label."""
    X = rng.random((n, dim))
    ball = np.pi ** (dim / 2) / math.gamma(dim / 2 + 1)
    radius = (mean_degree / (ball * n)) ** (1 / dim)
    pairs = cKDTree(X).query_pairs(radius, output_type="ndarray")
    return Graph.from_edges(pairs.reshape(-1, 2), n, node_labels={"coords": X})


def protein_like(rng, n, cutoff=8.0):
    """A persistent random walk of 3.8 Å steps folded into a box, beads joined within ``cutoff``."""
    side = (n * 135.0) ** (1 / 3)
    steps = np.empty((n - 1, 3))
    d = rng.standard_normal(3)
    for k in range(n - 1):
        d = 0.5 * d + rng.standard_normal(3)
        steps[k] = d
    steps *= 3.8 / np.linalg.norm(steps, axis=1, keepdims=True)
    walk = np.concatenate([rng.random((1, 3)) * side, steps]).cumsum(axis=0)
    X = side - np.abs(np.mod(walk, 2 * side) - side)
    pairs = cKDTree(X).query_pairs(cutoff, output_type="ndarray")
    return Graph.from_edges(pairs.reshape(-1, 2), n, node_labels={"coords": X})


def molecule_like(rng, n):
    """A random tree of maximum degree 4 (atoms in growth order) plus a few 5- and 6-ring closures."""
    g = nx.Graph()
    g.add_node(0)
    for v in range(1, n):
        free = [u for u in g if g.degree(u) < 3]
        g.add_edge(int(rng.choice(free)), v)
    for _ in range(max(1, n // 12)):
        u = int(rng.integers(n))
        ring = [w for w, dist in nx.single_source_shortest_path_length(g, u, cutoff=5).items()
                if dist in (4, 5) and g.degree(w) < 4 and g.degree(u) < 4]
        if ring:
            g.add_edge(u, int(rng.choice(ring)))
    return Graph.from_networkx(g)


def shuffled(G, rng):
    return G.permute(rng.permutation(G.n_nodes))


def grid(rows, cols):
    return Graph.from_networkx(nx.convert_node_labels_to_integers(nx.grid_2d_graph(rows, cols)))


def family(name, rng):
    """One test graph of the named family (seeded by ``rng``)."""
    if name == "geometric":
        return geometric_graph(rng, int(rng.integers(60, 300)))
    if name == "grid":
        return grid(int(rng.integers(3, 15)), int(rng.integers(3, 15)))
    if name == "molecule":
        return molecule_like(rng, int(rng.integers(9, 60)))
    if name == "random_shuffled":
        n = int(rng.integers(20, 200))
        return Graph.from_networkx(nx.gnp_random_graph(n, 4.0 / n, seed=int(rng.integers(2**31))))
    if name == "barabasi_albert":
        return Graph.from_networkx(nx.barabasi_albert_graph(int(rng.integers(20, 120)), int(rng.integers(1, 7)),
                                                            seed=int(rng.integers(2**31))))
    raise AssertionError(name)


FAMILIES = ["geometric", "grid", "molecule", "random_shuffled", "barabasi_albert"]


def octiles_reference(G, perm):
    """Non-empty 8x8 tiles of the permuted dense adjacency (padded to a multiple of 8)."""
    n = G.n_nodes
    A = G.to_scipy().toarray()[np.ix_(perm, perm)] != 0
    k = -(-n // 8)
    padded = np.zeros((8 * k, 8 * k), dtype=bool)
    padded[:n, :n] = A
    tiles = padded.reshape(k, 8, k, 8).any(axis=(1, 3))
    return int(tiles.sum()), int(tiles.sum() - np.trace(tiles))


def assert_permutation(perm, n):
    assert isinstance(perm, np.ndarray) and perm.dtype == np.int64 and perm.shape == (n,)
    np.testing.assert_array_equal(np.sort(perm), np.arange(n))


# ---------------------------------------------------------------- permutations and invariance


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("method", ["pbr", "rcm", None])
def test_returns_a_permutation_and_keeps_the_graph(name, method, rng):
    G = family(name, rng)
    perm = reorder(G, method, seed=int(rng.integers(1000)))
    assert_permutation(perm, G.n_nodes)
    H = G.permute(perm)
    # the permuted adjacency is P A P^T with P[k, perm[k]] = 1
    P = sp.csr_matrix((np.ones(G.n_nodes), (np.arange(G.n_nodes), perm)), shape=(G.n_nodes,) * 2)
    expected = (P @ G.to_scipy() @ P.T).toarray()
    np.testing.assert_array_equal(H.to_scipy().toarray(), expected)
    # a proxy for every kernel's invariance: the spectrum does not move
    np.testing.assert_allclose(np.linalg.eigvalsh(H.to_scipy().toarray()),
                               np.linalg.eigvalsh(G.to_scipy().toarray()), atol=1e-9)


@pytest.mark.parametrize("method", ["morton", "hilbert"])
def test_curve_orders_are_permutations_and_keep_labels(method, rng):
    G = geometric_graph(rng, int(rng.integers(30, 200)), dim=int(rng.integers(2, 4)))
    perm = reorder(G, method)
    assert_permutation(perm, G.n_nodes)
    np.testing.assert_array_equal(G.permute(perm).node_labels["coords"], G.node_labels["coords"][perm])


def test_octile_count_matches_dense_tiles(rng):
    for name in FAMILIES:
        G = family(name, rng)
        perm = rng.permutation(G.n_nodes)
        stats = octile_count(G, perm)
        total, offdiag = octiles_reference(G, perm)
        assert stats["nonempty_tiles"] == total and stats["offdiag_nonempty_tiles"] == offdiag
        assert stats["diag_nonempty_tiles"] == total - offdiag
        assert stats["tiles_per_side"] == -(-G.n_nodes // 8)
        assert stats["nnz_per_tile_mean"] * total == pytest.approx(G.nnz)
        assert 1 <= stats["nnz_per_tile_min"] <= stats["nnz_per_tile_median"] <= stats["nnz_per_tile_max"] <= 64
        # the permuted graph in natural order has the same tiles
        assert octile_count(G.permute(perm))["nonempty_tiles"] == total


def test_octile_count_accepts_scipy_and_rejects_bad_perms(rng):
    G = family("geometric", rng)
    assert octile_count(G.to_scipy()) == octile_count(G)
    with pytest.raises(ValueError, match="permutation"):
        octile_count(G, np.zeros(G.n_nodes, dtype=np.int64))
    with pytest.raises(ValueError, match="permutation"):
        octile_count(G, np.arange(G.n_nodes - 1))
    with pytest.raises(ValueError, match="permutation"):
        octile_count(G, np.arange(G.n_nodes, dtype=float))


# ---------------------------------------------------------------- PBR: balance and quality


@pytest.mark.parametrize("name", FAMILIES)
def test_pbr_blocks_of_eight_are_the_partition_it_optimised(name, rng):
    graphs = [family(name, rng) for _ in range(4)]
    perms, pairs = _pbr_batch(graphs, int(rng.integers(1000)), 2, return_pairs=True)
    for G, perm, joined in zip(graphs, perms, pairs):
        assert_permutation(perm, G.n_nodes)
        # parts are consecutive blocks: 8 vertices each, the remainder last; inside a block
        # PBR lists vertices in ascending order, so any other grouping would show here
        for start in range(0, G.n_nodes, 8):
            block = perm[start:start + 8]
            assert len(block) == min(8, G.n_nodes - start)
            assert np.all(np.diff(block) > 0)
        # the tile count measured on those blocks is the objective the partitioner reached
        assert octiles_reference(G, perm)[1] == 2 * joined


@pytest.mark.parametrize("name", FAMILIES)
def test_pbr_never_more_tiles_than_natural(name, rng):
    for _ in range(3):
        G = family(name, rng)
        natural = octile_count(G)
        pbr = octile_count(G, reorder(G, "pbr", seed=int(rng.integers(1000))))
        assert pbr["offdiag_nonempty_tiles"] <= natural["offdiag_nonempty_tiles"]


@pytest.mark.parametrize("builder", ["geometric", "protein"])
def test_pbr_beats_rcm_on_shuffled_spatial_graphs(builder, rng):
    """PBR/RCM off-diagonal tiles average about 0.5 on shuffled 3D geometric graphs of degree ~10
    and on shuffled protein-like graphs (n 300-500); the bound leaves room for unlucky draws."""
    for _ in range(2):
        n = int(rng.integers(300, 500))
        G = shuffled(geometric_graph(rng, n) if builder == "geometric" else protein_like(rng, n), rng)
        pbr = octile_count(G, reorder(G, "pbr"))["offdiag_nonempty_tiles"]
        rcm = octile_count(G, reorder(G, "rcm"))["offdiag_nonempty_tiles"]
        assert pbr < 0.8 * rcm, (pbr, rcm)


def test_pbr_is_deterministic_and_thread_independent(rng):
    graphs = [family(FAMILIES[k % len(FAMILIES)], rng) for k in range(12)]
    one = reorder_many(graphs, "pbr", n_threads=1, seed=7)
    two = reorder_many(graphs, "pbr", n_threads=2, seed=7)
    again = reorder_many(graphs, "pbr", n_threads=2, seed=7)
    for a, b, c in zip(one, two, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    # a lone graph gets stream 0 of the seed, as the first of a batch does
    np.testing.assert_array_equal(reorder(graphs[0], "pbr", seed=7), one[0])


def test_reorder_many_matches_reorder_for_other_methods(rng):
    graphs = [geometric_graph(rng, int(rng.integers(10, 80))) for _ in range(3)]
    for method in ("rcm", "morton", "hilbert", None):
        for G, perm in zip(graphs, reorder_many(graphs, method)):
            np.testing.assert_array_equal(perm, reorder(G, method))


# ---------------------------------------------------------------- edge cases


def edge_case_graphs():
    yield "empty", Graph.from_edges(np.zeros((0, 2)), 0)
    yield "one vertex", Graph.from_edges(np.zeros((0, 2)), 1)
    yield "one self-loop", Graph.from_edges([(0, 0)], 1)
    yield "n=5", Graph.from_edges([(0, 1), (1, 2), (3, 4)], 5)
    yield "n=8 path", Graph.from_networkx(nx.path_graph(8))
    yield "n=9 path", Graph.from_networkx(nx.path_graph(9))
    yield "no edges, n=37", Graph.from_edges(np.zeros((0, 2)), 37)
    yield "disconnected", Graph.from_networkx(nx.disjoint_union_all([nx.cycle_graph(k) for k in (3, 5, 7, 11, 13)]))
    yield "isolated plus clique", Graph.from_networkx(nx.disjoint_union(nx.complete_graph(12), nx.empty_graph(21)))
    yield "self-loops", Graph.from_edges([(i, i) for i in range(0, 30, 2)] + [(i, i + 1) for i in range(29)], 30)
    yield "star", Graph.from_networkx(nx.star_graph(40))
    yield "complete", Graph.from_networkx(nx.complete_graph(19))


@pytest.mark.parametrize("label,G", list(edge_case_graphs()), ids=[c[0] for c in edge_case_graphs()])
@pytest.mark.parametrize("method", ["pbr", "rcm", None])
def test_edge_cases(label, G, method):
    perm = reorder(G, method)
    assert_permutation(perm, G.n_nodes)
    stats = octile_count(G, perm)
    if G.n_nodes:
        assert (stats["nonempty_tiles"], stats["offdiag_nonempty_tiles"]) == octiles_reference(G, perm)
    if method == "pbr":
        assert stats["offdiag_nonempty_tiles"] <= octile_count(G)["offdiag_nonempty_tiles"]
        if G.nnz == 0 or G.n_nodes <= 8:
            assert stats["offdiag_nonempty_tiles"] == 0


def test_pbr_packs_small_components_into_whole_tiles():
    """Components of 8 vertices can be tiled with no off-diagonal tile at all; PBR finds that."""
    rng = np.random.default_rng(5)
    parts = [nx.relabel_nodes(nx.cycle_graph(8), {i: 8 * c + i for i in range(8)}) for c in range(6)]
    G = shuffled(Graph.from_networkx(nx.compose_all(parts)), rng)
    assert octile_count(G, reorder(G, "pbr"))["offdiag_nonempty_tiles"] == 0


def test_empty_batch_and_edge_cases_in_a_batch(rng):
    assert reorder_many([], "pbr") == []
    graphs = [G for _, G in edge_case_graphs()] + [family("geometric", rng)]
    for G, perm in zip(graphs, reorder_many(graphs, "pbr", n_threads=2)):
        assert_permutation(perm, G.n_nodes)


# ---------------------------------------------------------------- space-filling curves


def test_hilbert_steps_to_a_grid_neighbour():
    """On a full 2^b grid consecutive Hilbert indices are unit steps, in 2, 3 and 4 dimensions."""
    for d, bits in [(2, 4), (3, 3), (4, 2)]:
        pts = np.stack(np.meshgrid(*[np.arange(2**bits)] * d, indexing="ij"), -1).reshape(-1, d).astype(np.uint64)
        key = _hilbert_key(pts, bits)
        np.testing.assert_array_equal(np.sort(key), np.arange(2 ** (d * bits)))
        walk = pts[np.argsort(key)].astype(np.int64)
        assert np.all(np.abs(np.diff(walk, axis=0)).sum(axis=1) == 1)


def test_morton_key_against_bitwise_reference(rng):
    pts = rng.integers(0, 2**10, size=(50, 3)).astype(np.uint64)
    key = _morton_key(pts, 10)
    for p, k in zip(pts.tolist(), key.tolist()):
        expected = 0
        for b in range(9, -1, -1):
            for j in range(3):
                expected = (expected << 1) | ((p[j] >> b) & 1)
        assert k == expected


def test_curve_orders_follow_the_coordinates(rng):
    # points on a line: both curves sort them by position
    x = rng.permutation(40).astype(float)
    G = Graph.from_edges(np.zeros((0, 2)), 40, node_labels={"coords": np.stack([x, np.zeros(40)], 1)})
    for method in ("morton", "hilbert"):
        np.testing.assert_array_equal(reorder(G, method), np.argsort(x))


def test_hilbert_makes_fewer_tiles_than_a_shuffle(rng):
    G = shuffled(geometric_graph(rng, 400), rng)
    shuffled_tiles = octile_count(G)["offdiag_nonempty_tiles"]
    assert octile_count(G, reorder(G, "hilbert"))["offdiag_nonempty_tiles"] < 0.5 * shuffled_tiles


# ---------------------------------------------------------------- bad input


def test_bad_input_is_named():
    G = Graph.from_networkx(nx.path_graph(12), name="chain")
    with pytest.raises(ValueError, match="method must be one of"):
        reorder(G, "metis")
    with pytest.raises(KeyError, match="'coords'.*chain|chain.*'coords'"):
        reorder(G, "hilbert")
    with pytest.raises(KeyError, match="'xyz'"):
        reorder(G, "morton", coords="xyz")
    labelled = Graph.from_networkx(nx.path_graph(12), name="chain")
    labelled.node_labels["element"] = np.arange(12, dtype=np.int64)
    with pytest.raises(ValueError, match="integer categories"):
        reorder(labelled, "morton", coords="element")
    with pytest.raises(TypeError, match="seed"):
        reorder(G, "pbr", seed=-1)
    with pytest.raises(TypeError, match="seed"):
        reorder(G, "pbr", seed=1.5)
    with pytest.raises(ValueError, match="not symmetric"):
        reorder(sp.csr_matrix(np.triu(np.ones((10, 10)), 1)), "pbr")
    with pytest.raises(TypeError, match="sequence of graphs"):
        reorder_many(G, "pbr")
    with pytest.raises(ValueError, match="n_threads"):
        reorder_many([G], "pbr", n_threads=0)
    with pytest.raises(TypeError, match=r"graphs\[1\]"):
        reorder_many([G, np.eye(3)], "pbr")


def test_scipy_input_equals_graph_input(rng):
    G = family("geometric", rng)
    for method in METHODS:
        if method in ("morton", "hilbert"):
            continue
        np.testing.assert_array_equal(reorder(G.to_scipy(), method), reorder(G, method))


def test_benchmark_suite_reports_counts_and_target(capsys):
    from graphkern.bench import cli

    rows = cli.discover_suites()["reorder"].run(
        cli.build_parser(cli.discover_suites()).parse_args(["reorder", "--sets", "molecule", "protein_shuffled",
                                                            "--n-graphs", "2", "--threads", "2"]),
        cli.Context(quick=True, progress=cli.Progress(False), system={}, repeat=1))
    sets = [r for r in rows if "set" in r]
    assert [r["set"] for r in sets] == ["molecule", "protein_shuffled"]
    for r in sets:
        assert r["pbr_offdiag"] <= r["natural_offdiag"] and r["pbr_set_s_threads"] > 0
    assert "hilbert_offdiag" in sets[1] and "hilbert_offdiag" not in sets[0]
    target = next(r for r in rows if r.get("kind") == "target")
    assert target["verdict"] == "info" and target["why"] == "set for the full sizes"  # two graphs per set
    assert "PBR leaves fewer non-empty off-diagonal octiles than RCM" in capsys.readouterr().out
