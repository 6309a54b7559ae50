"""The compiled packing of the feature map's input (graphkern/_cpu/spgk_paths.pyx ``pack``) against
a plain NumPy packing, its checks against the graph model's own, and the triplet rows it feeds
against a sort in NumPy."""

import re

import numpy as np
import pytest

from conftest import rebuilt
from graphkern import Graph
from graphkern.spgk import DiracEdge, DiracNode, GaussianNode, ShortestPathKernel
from graphkern.spgk import features

from test_spgk_features import random_graphs


def numpy_pack(graphs, columns):
    """The packing the compiled pass must reproduce, by concatenation."""
    n = np.array([g.n_nodes for g in graphs], np.int64)
    m = np.array([len(g.indices) for g in graphs], np.int64)
    node_offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    edge_offsets = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    indptr = np.concatenate([np.asarray(g.indptr, np.int64) for g in graphs] or [np.zeros(0, np.int64)])
    indices = np.concatenate([np.asarray(g.indices, np.int32) for g in graphs] or [np.zeros(0, np.int32)])
    weights = None
    if any(g.weights is not None for g in graphs):
        weights = np.concatenate([np.ones(len(g.indices)) if g.weights is None else g.weights for g in graphs])
    labels = np.zeros((int(n.sum()), len(columns)), np.int64)
    for j, c in enumerate(columns):
        if graphs:
            labels[:, j] = np.concatenate([g.node_labels[c] for g in graphs])
    return (node_offsets, edge_offsets, indptr, indices, weights), labels


def assert_packed_equal(got, want):
    (gs, gl), (ws, wl) = got, want
    for a, b in zip(gs, ws):
        if b is None:
            assert a is None
        else:
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    assert gl.dtype == np.int64 and gl.shape == wl.shape
    np.testing.assert_array_equal(gl, wl)


NODE = {(): None, ("a",): DiracNode("a"), ("b", "a"): DiracNode("b") * DiracNode("a") * DiracNode("b")}


@pytest.mark.parametrize("columns", list(NODE))
@pytest.mark.parametrize("weighted", [False, True, None])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_compiled_pack_equals_numpy(rng, monkeypatch, columns, weighted, n_threads):
    """Random graphs (isolated vertices, self-loops, empty graphs, mixed weighted and unweighted,
    row pointers int32 and int64, labels of several integer widths), several threads on few
    entries."""
    from graphkern._cpu import spgk_paths

    graphs = random_graphs(rng, 60, weighted=weighted)
    graphs.insert(int(rng.integers(len(graphs))), Graph(np.zeros(1, np.int64), np.zeros(0, np.int32),
                                                        node_labels={"a": np.zeros(0, np.int64),
                                                                     "b": np.zeros(0, np.int64)}))
    g = graphs[3]
    graphs[3] = Graph(g.indptr.astype(np.int64), g.indices, g.weights,
                      node_labels={"a": g.node_labels["a"].astype(np.uint8), "b": g.node_labels["b"].astype(np.int16)},
                      validate=False)  # checked by the compiled pass instead
    assert graphs[3].indptr.dtype == np.int32  # the graph model narrows row pointers: force int64 ones
    object.__setattr__(graphs[3], "_indptr", g.indptr.astype(np.int64))
    got = features.pack(graphs, str, NODE[columns], n_threads)
    assert_packed_equal(got, numpy_pack(graphs, columns))
    raw = spgk_paths.pack(graphs, Graph, columns, n_threads)
    assert raw[-1].tolist() == [-1, -1, -1, -1]
    assert_packed_equal(features.pack([], str, NODE[columns], n_threads), numpy_pack([], columns))
    assert_packed_equal(features.pack(tuple(graphs), str, NODE[columns], n_threads), numpy_pack(graphs, columns))


def test_pack_gives_back_every_reference_it_takes(rng):
    """The pack holds a reference to each array while it reads them: all are given back, also when
    it stops at an item that is not a graph, when a label column is missing, and when an array is
    converted (int64 labels of another width, int64 row pointers)."""
    import sys

    from graphkern._cpu import spgk_paths

    graphs = random_graphs(rng, 20, weighted=True)
    g = graphs[2]
    object.__setattr__(g, "_indptr", g.indptr.astype(np.int64))
    graphs[5] = Graph(graphs[5].indptr, graphs[5].indices, node_labels={"a": graphs[5].node_labels["a"]})
    arrays = [a for h in graphs for a in (h._indptr, h._indices, h._weights, *h._node_labels.values())]
    before = [sys.getrefcount(a) for a in arrays]
    for items, columns in ((graphs, ("a", "b")), (graphs[:7] + ["not a graph"] + graphs[7:], ("a",)),
                           (graphs, ())):
        for _ in range(50):
            spgk_paths.pack(items, Graph, columns, 2)
    assert [sys.getrefcount(a) for a in arrays] == before


@pytest.mark.parametrize("method", ["features", "openmp_out", "fcsp"])
def test_kernel_refuses_broken_structure_at_every_entry(rng, method):
    """The kernel checks structure only in the compiled pack (as_graphs leaves it out): every entry
    point still refuses a graph whose column ids leave its vertices, with the graph model's words,
    before any compiled pass reads them."""
    graphs = random_graphs(rng, 6, weighted=False)
    g = Graph.from_edges([(0, 1), (1, 2)], 3, node_labels={"a": [0, 1, 2], "b": [0, 0, 1]})
    bad = rebuilt(g, indices=np.array([1, 0, 7, 1], np.int32))
    with pytest.raises(ValueError) as want:
        bad.require_valid()
    message = re.escape(str(want.value))
    kern = ShortestPathKernel(node_kernel=DiracNode("a"), method=method, backend="cpu")
    for call in (lambda: kern(graphs + [bad]), lambda: kern.fit(graphs + [bad]), lambda: kern.diag([bad]),
                 lambda: kern.fit(graphs).transform([bad]), lambda: kern(graphs, [bad])):
        with pytest.raises(ValueError, match=message):
            call()


def test_pack_refuses_what_the_graph_model_refuses(rng):
    """The same errors, naming the same graph, as the model's own checks (require_valid,
    node_features)."""
    graphs = random_graphs(rng, 20, weighted=True)
    g = Graph.from_edges([(0, 1), (1, 2)], 3, weights=[1.0, 2.0], node_labels={"a": [0, 1, 2], "b": [0, 0, 1]})
    names = lambda k: f"X[{k}]"
    for k, bad in enumerate([rebuilt(g, indices=np.array([1, 0, 5, 1], np.int32)),
                             rebuilt(g, indices=np.array([1, 0, -1, 1], np.int32))]):
        with pytest.raises(ValueError) as want:
            bad.require_valid()
        with pytest.raises(ValueError, match=re.escape(str(want.value))):
            features.pack(graphs + [bad], names, DiracNode("a"), 2)
    for w, problem in ((-1.0, "negative"), (np.nan, "non-finite"), (np.inf, "non-finite")):
        bad = rebuilt(g, weights=np.array([1.0, 1.0, w, w]))
        with pytest.raises(ValueError, match=rf"X\[20\] has a {problem} edge weight {w} on edge \(1, 2\)"):
            features.pack(graphs + [bad], names, None, 1)
    with pytest.raises(KeyError, match="has no node label 'c'"):
        features.pack(graphs, names, DiracNode("a") * DiracNode("c"), 1)
    floats = rebuilt(g, node_labels={"a": [0.5, 1.0, 2.0]})
    with pytest.raises(TypeError, match=r"DiracNode\('a'\) needs an integer"):
        features.pack(graphs + [floats], names, DiracNode("a"), 1)
    with pytest.raises(TypeError, match="item 1 is a dict"):
        features.pack([g, {}], names, None, 1)
    # a structure error comes before a label error, as in the model's own order of checks
    with pytest.raises(ValueError, match="out of range"):
        features.pack([floats, rebuilt(g, indices=np.array([1, 0, 5, 1], np.int32))], names, DiracNode("a"), 1)


@pytest.mark.parametrize("columns", list(NODE))
def test_triplet_rows_sorted_and_counted_as_numpy_does(rng, columns):
    """Each graph's triplets come in (la, lb, length) order, so feature rows need no sort; the
    counts and K(G, G) equal a NumPy histogram of the ordered pairs."""
    graphs = random_graphs(rng, 40)
    counts = features.TripletCounts(graphs, NODE[columns], 2, str)
    for g in range(len(graphs)):
        lo, hi = counts.row_offsets[g], counts.row_offsets[g + 1]
        key = np.stack([counts.la[lo:hi], counts.lb[lo:hi], counts.lengths[lo:hi]], axis=1)
        assert all(tuple(a) < tuple(b) for a, b in zip(key[:-1], key[1:]))
        assert counts.self_dot[g] == float(np.sum(counts.counts[lo:hi] ** 2))
    kernel = ShortestPathKernel(node_kernel=NODE[columns], backend="cpu").fit(graphs)
    for X in (graphs, random_graphs(rng, 15, n_labels=5)):
        phi = kernel.features(X)
        assert phi.has_sorted_indices
        for i in range(phi.shape[0]):
            row = phi.indices[phi.indptr[i]:phi.indptr[i + 1]]
            assert np.all(np.diff(row) > 0)


@pytest.mark.parametrize("n_labels", [1, 3, 40])
def test_hop_counts_by_table_equal_the_sort(rng, n_labels):
    """Unweighted graphs counted through the per-thread table (graphs with few distinct labels) and,
    given unit weights, through the sort of their paths: the same triplets, counts and order."""
    from graphkern._cpu import spgk_paths

    graphs = random_graphs(rng, 50, weighted=False, n_labels=n_labels)
    for n in (65, 90):  # beyond the 64 vertices of a bit-set search: trees with a few more edges
        edges = {(int(rng.integers(0, i)), i) for i in range(1, n)}
        edges |= {tuple(sorted(rng.integers(0, n, 2))) for _ in range(5)}
        graphs.append(Graph.from_edges(sorted(edges), n, node_labels={"a": rng.integers(0, n_labels, n)}))
    structure, labels = features.pack(graphs, str, DiracNode("a"), 2)
    distinct, ids = features._label_ids(labels)
    weighted = structure[:4] + (np.ones(len(structure[3])),)
    for threads in (1, 3):
        table = spgk_paths.triplet_counts(*structure, ids, len(distinct), threads)
        sort = spgk_paths.triplet_counts(*weighted, ids, len(distinct), threads)
        for a, b in zip(table, sort):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    # the graphs the table took (its rule): all of them with few labels, some with many
    table = [len(np.unique(g.node_labels["a"])) ** 2 * g.n_nodes <= min(1 << 18, 4 * g.n_nodes ** 2 + 256)
             for g in graphs]
    assert all(table) if n_labels <= 3 else any(table) and not all(table)


def test_length_numbering_by_table_and_by_sort(rng):
    lengths = rng.integers(0, 40, 500).astype(np.float64)
    for values in (lengths, lengths / 4.0, lengths + 2.0 ** 21, np.zeros(0)):
        distinct, ids = features._length_ids(values)
        want, inverse = np.unique(values, return_inverse=True)
        np.testing.assert_array_equal(distinct, want)
        np.testing.assert_array_equal(ids, inverse.reshape(-1))


def test_column_numbering_through_the_table_equals_unique(rng):
    """Triplets numbered through the compiled table, from hop counts (float64) and from length ids
    (int64): the sorted distinct lengths and keys and each triplet's column, as numpy.unique gives
    them; None for lengths that are not whole or a table wider than the span."""
    from graphkern._cpu import spgk_paths

    la, lb = rng.integers(0, 5, 800), rng.integers(0, 5, 800)
    hops = rng.choice([0.0, 1.0, 3.0, 4.0, 9.0], 800)
    for lengths in (hops, np.unique(hops, return_inverse=True)[1].reshape(-1).astype(np.int64), hops[:0]):
        n = len(lengths)
        distinct, keys, col = spgk_paths.number_columns(la[:n], lb[:n], lengths, 5, 1 << 20, 21)
        want, lid = np.unique(lengths, return_inverse=True)
        want_keys, want_col = np.unique((la[:n] << 42) | (lb[:n] << 21) | lid.reshape(-1), return_inverse=True)
        np.testing.assert_array_equal(distinct, want.astype(np.float64))
        np.testing.assert_array_equal(keys, want_keys)
        np.testing.assert_array_equal(col, want_col.reshape(-1))
        assert distinct.dtype == np.float64 and keys.dtype == np.int64 and col.dtype == np.int32
    assert spgk_paths.number_columns(la, lb, hops + 0.5, 5, 1 << 20, 21) is None
    assert spgk_paths.number_columns(la, lb, np.where(hops > 4, np.nan, hops), 5, 1 << 20, 21) is None
    assert spgk_paths.number_columns(la, lb, hops, 5, 5 * 5 * 10 - 1, 21) is None
    assert spgk_paths.number_columns(la, lb, hops, 5, 5 * 5 * 10, 21) is not None


def test_label_numbering_by_table_and_by_sort(rng):
    """One label column, numbered through a table (a narrow span) or a sort (a wide one, up to the
    int64 extremes): the distinct values in order and each vertex's index in them."""
    info = np.iinfo(np.int64)
    labels = rng.integers(0, 40, 500)
    for values in (labels, labels - 7, labels * (1 << 30), np.append(labels, [info.min, info.max]), labels[:1]):
        distinct, ids = features._label_ids(values.reshape(-1, 1))
        want, inverse = np.unique(values, return_inverse=True)
        np.testing.assert_array_equal(distinct, want.reshape(-1, 1))
        np.testing.assert_array_equal(ids, inverse.reshape(-1))
        assert ids.dtype == np.int64


def test_gram_on_molecules_equals_the_pairwise_walk():
    """Molecules as read from the packaged SD file, raw and normalised, the Gram matrix and a
    transform: the feature map's numbers bit for bit."""
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    graphs = [g for g in read_sdf(molecules_path()) if g.n_nodes > 0][:160]
    for normalize in (False, True):
        kw = dict(node_kernel=DiracNode("element"), edge_kernel=DiracEdge(), normalize=normalize)
        fast = ShortestPathKernel(backend="cpu", **kw)
        walk = ShortestPathKernel(method="openmp_out", **kw)
        np.testing.assert_array_equal(fast(graphs), walk(graphs))
        np.testing.assert_array_equal(fast.fit(graphs[:100]).transform(graphs[100:]),
                                      walk.fit(graphs[:100]).transform(graphs[100:]))


def test_cache_hit_needs_the_same_label_columns(rng):
    """A column replaced on one graph is a miss; a column the kernel does not read changes nothing."""
    graphs = random_graphs(rng, 30)
    kernel = ShortestPathKernel(node_kernel=DiracNode("a"), backend="cpu")
    K = kernel(graphs)
    packed = kernel._counts.packed
    graphs[7].node_labels["b"] = np.zeros(graphs[7].n_nodes, np.int64)
    np.testing.assert_array_equal(kernel(graphs), K)
    assert kernel._counts.packed == packed
    graphs[7].node_labels["a"] = np.zeros(graphs[7].n_nodes, np.int64)
    kernel(graphs)
    assert kernel._counts.packed == packed + 1
    for g in graphs:
        g.node_labels["x"] = rng.random(g.n_nodes)
    kw = dict(node_kernel=GaussianNode("x", sigma=1.0), backend="cpu")
    pairwise = ShortestPathKernel(**kw)
    first = pairwise(graphs)
    assert pairwise._batches.packed == 1
    np.testing.assert_array_equal(pairwise(graphs), first)  # from the kept batch
    assert pairwise._batches.packed == 1
    graphs[3].node_labels["x"] = rng.random(graphs[3].n_nodes)
    np.testing.assert_array_equal(pairwise(graphs), ShortestPathKernel(**kw)(graphs))
    assert pairwise._batches.packed == 2


@pytest.mark.parametrize("n_threads", [1, 3])
def test_bit_set_search_equals_dijkstra_on_unit_weights(rng, n_threads):
    """Unweighted graphs of up to 64 vertices are searched as bit sets, larger ones by a queue:
    both give the shortest paths that Dijkstra finds with unit weights (sizes around 64, sparse and
    dense, disconnected, self-loops)."""
    from graphkern._cpu import spgk_paths

    graphs = []
    for n in (1, 2, 63, 64, 65, 80, *rng.integers(3, 70, 20)):
        p = float(rng.choice([0.03, 0.1, 0.6]))
        upper = np.triu(rng.random((n, n)) < p, 0)
        graphs.append(Graph.from_edges(np.argwhere(upper), int(n)))
    structure, _ = features.pack(graphs, str, None, 1)
    unit = structure[:4] + (np.ones(len(structure[3])),)
    for a, b in zip(spgk_paths.shortest_paths(*structure, n_threads), spgk_paths.shortest_paths(*unit, n_threads)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
