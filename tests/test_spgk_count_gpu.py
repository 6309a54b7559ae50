"""The triplet counting of the feature map on the GPU (graphkern.spgk.features_gpu.triplet_counts):
the host's counts bit for bit, the vocabulary it numbers on the way, and the cases it leaves to the
host (weighted graphs, more than 64 vertices, a graph's table beyond the kernel's)."""

import pickle

import numpy as np
import pytest

from graphkern import Graph
from graphkern._cpu import spgk_paths
from graphkern.spgk import DiracNode, ShortestPathKernel, features, features_gpu

from test_spgk_features import NODE_KERNELS, random_graphs, reference_gram


def larger_graph(rng, n, n_labels):
    """A tree of ``n`` vertices with a few more edges (one component, many path lengths)."""
    edges = {(int(rng.integers(0, i)), i) for i in range(1, n)}
    edges |= {tuple(sorted(map(int, rng.integers(0, n, 2)))) for _ in range(4)}
    return Graph.from_edges(sorted(edges), n, node_labels={"a": rng.integers(0, n_labels, n),
                                                           "b": rng.integers(0, 2, n)})


def unweighted_set(rng, n_labels=3):
    graphs = random_graphs(rng, 60, weighted=False, n_labels=n_labels)
    graphs += [larger_graph(rng, n, min(n_labels, 5)) for n in (2, 33, 64)]  # tables within a warp's
    graphs.append(Graph.from_edges([], 0, node_labels={"a": np.zeros(0, np.int64), "b": np.zeros(0, np.int64)}))
    rng.shuffle(graphs)
    return graphs


def host_counts(graphs, node_kernel):
    structure, labels = features.pack(graphs, str, node_kernel, 2)
    distinct, ids = features._label_ids(labels)
    return structure, ids, max(1, len(distinct)), spgk_paths.triplet_counts(*structure, ids, max(1, len(distinct)), 2)


class HostRows:
    """The device's rows of counts, emulated on the host."""

    def __init__(self, col, counts):
        self.col, self.counts, self.device = col, counts, None

    def to_host(self):
        return self.col.copy(), self.counts.copy()


def emulated_device_counts(device, structure, ids, n_labels, id_bits):
    """What the device's counting returns, made from the host's counts."""
    row_offsets, la, lb, lengths, counts, self_dot = spgk_paths.triplet_counts(*structure, ids, n_labels, 1)
    distinct, lid = np.unique(lengths, return_inverse=True)
    keys, col = np.unique(la << (2 * id_bits) | lb << id_bits | lid.reshape(-1), return_inverse=True)
    return row_offsets, self_dot, keys, distinct, HostRows(col.reshape(-1).astype(np.int32), counts)


def assert_same_counts(got, expected):
    for name in ("row_offsets", "la", "lb", "lengths", "counts", "self_dot", "labels"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def assert_same_vocabulary(got, expected, counts_got, counts_expected):
    for name in ("keys", "lengths", "labels"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)
    assert got.columns == expected.columns
    assert got.names() == expected.names()
    a, b = got.matrix(counts_got), expected.matrix(counts_expected)
    assert a.shape == b.shape and a.has_sorted_indices
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("columns", list(NODE_KERNELS))
def test_counts_numbered_as_the_device_does_equal_the_host(rng, monkeypatch, columns):
    """The host's side of the device's counting (its vocabulary from the table's cells, the
    triplets' labels and lengths read back from it), on an emulation of the device's output."""
    monkeypatch.setattr(features_gpu, "triplet_counts", emulated_device_counts)
    node = NODE_KERNELS[columns]
    graphs = unweighted_set(rng)
    device = features.TripletCounts(graphs, node, 2, str, device=0)
    host = features.TripletCounts(graphs, node, 2, str)
    assert device._triplets is None and device._counts is None  # the device's numbering was taken
    assert_same_vocabulary(device.cache["vocabulary"], features.Vocabulary(host, columns), device, host)
    assert_same_counts(device, host)
    # pickled before its triplets were read back: the copy reads them from its own vocabulary
    fresh = features.TripletCounts(graphs, node, 2, str, device=0)
    assert_same_counts(pickle.loads(pickle.dumps(fresh)), host)


def test_kernel_with_device_numbering_fits_transforms_and_pickles(rng, monkeypatch):
    monkeypatch.setattr(features_gpu, "triplet_counts", emulated_device_counts)
    node = DiracNode("a") * DiracNode("b")
    X, Y = unweighted_set(rng), random_graphs(rng, 12, weighted=False, n_labels=5)  # unseen labels
    kernel = ShortestPathKernel(node_kernel=node, backend="cpu", normalize=True)
    counts = features.TripletCounts(X, node, 2, str, device=0)
    kernel.fit(X)
    kernel._fitted = (counts, counts.cache["vocabulary"])
    expected = reference_gram(Y, X, ("a", "b"), normalize=True)
    np.testing.assert_allclose(kernel.transform(Y), expected, rtol=1e-12, atol=0)
    copy = pickle.loads(pickle.dumps(kernel))
    np.testing.assert_allclose(copy.transform(Y), expected, rtol=1e-12, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("n_labels", [1, 3, 12])
@pytest.mark.parametrize("columns", list(NODE_KERNELS))
def test_device_counts_equal_host_counts(rng, n_labels, columns):
    node = NODE_KERNELS[columns]
    graphs = unweighted_set(rng, n_labels)
    structure, ids, L, expected = host_counts(graphs, node)
    got = features_gpu.triplet_counts(0, structure, ids, L, features.ID_BITS)
    assert got is not None
    device = features.TripletCounts(graphs, node, 2, str, device=0)
    host = features.TripletCounts(graphs, node, 2, str)
    assert device._triplets is None
    assert_same_counts(device, host)
    assert_same_vocabulary(device.cache["vocabulary"], features.Vocabulary(host, columns), device, host)
    rows = got[4]
    np.testing.assert_array_equal(rows.indptr.to_host(np.int64), expected[0])
    assert rows.shape == (len(graphs), len(got[2])) and rows.nnz == len(expected[4])
    phi = device.cache["vocabulary"].matrix(device)
    np.testing.assert_array_equal(rows.holding, np.bincount(phi.indices, minlength=phi.shape[1]))
    for a, b in zip(got[:2], (expected[0], expected[5])):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_device_leaves_to_the_host_what_its_kernel_cannot_count(rng):
    node = DiracNode("a")
    weighted = random_graphs(rng, 20, weighted=True)
    large = unweighted_set(rng) + [larger_graph(rng, 65, 3)]
    # 20 distinct labels on 64 vertices: a table of 20 * 20 * 64 cells, beyond a warp's
    many = unweighted_set(rng) + [Graph.from_edges([(i, i + 1) for i in range(63)], 64,
                                                   node_labels={"a": np.arange(64) % 20, "b": np.zeros(64, int)})]
    for graphs in (weighted, large, many):
        structure, ids, L, _ = host_counts(graphs, node)
        assert features_gpu.triplet_counts(0, structure, ids, L, features.ID_BITS) is None
        device = features.TripletCounts(graphs, node, 2, str, device=0)
        assert device._triplets is not None  # counted on the host
        assert_same_counts(device, features.TripletCounts(graphs, node, 2, str))


@pytest.mark.gpu
@pytest.mark.parametrize("normalize", [False, True])
def test_gpu_kernel_with_device_counts_equals_reference(rng, normalize):
    node = DiracNode("a") * DiracNode("b")
    X, Y = unweighted_set(rng), random_graphs(rng, 15, weighted=False, n_labels=5)
    gpu = ShortestPathKernel(node_kernel=node, backend="gpu", normalize=normalize)
    np.testing.assert_allclose(gpu(X), reference_gram(X, X, ("a", "b"), normalize), rtol=1e-12, atol=0)
    np.testing.assert_allclose(gpu(X, Y), reference_gram(X, Y, ("a", "b"), normalize), rtol=1e-12, atol=0)
    fitted = ShortestPathKernel(node_kernel=node, backend="gpu", normalize=normalize).fit(X)
    expected = reference_gram(Y, X, ("a", "b"), normalize)
    np.testing.assert_allclose(fitted.transform(Y), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(pickle.loads(pickle.dumps(fitted)).transform(Y), expected, rtol=1e-12, atol=0)
    cpu = ShortestPathKernel(node_kernel=node, backend="cpu", normalize=normalize).fit(X)
    np.testing.assert_array_equal(fitted.features(Y).toarray(), cpu.features(Y).toarray())
    assert fitted.feature_names_ == cpu.feature_names_


@pytest.mark.gpu
def test_device_counts_equal_host_counts_on_drawn_batches():
    """Hypothesis draws batches of graphs up to the kernel's 64 vertices (dense and sparse, one or
    two label columns, few or many labels): the device gives the host's counts, or declines only
    where a graph's table exceeds a warp's."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @st.composite
    def graph(draw):
        n = draw(st.integers(0, 64))
        pairs = [(i, j) for i in range(n) for j in range(i, n)]
        density = draw(st.sampled_from([0.0, 0.05, 0.2, 0.6]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        edges = [p for p in pairs if rng.random() < density]
        spread = draw(st.sampled_from([1, 3, 7, 64]))
        labels = {"a": rng.integers(-spread, spread, n), "b": rng.integers(0, 2, n)}
        return Graph.from_edges(edges, n, node_labels=labels)

    @settings(max_examples=40, deadline=None, database=None)
    @given(st.lists(graph(), min_size=1, max_size=6), st.sampled_from(list(NODE_KERNELS)))
    def check(graphs, columns):
        node = NODE_KERNELS[columns]
        device = features.TripletCounts(graphs, node, 2, str, device=0)
        host = features.TripletCounts(graphs, node, 2, str)
        assert_same_counts(device, host)
        if device.device_rows is not None:
            assert_same_vocabulary(device.cache["vocabulary"], features.Vocabulary(host, columns), device, host)
        else:  # declined: some graph's table (its labels ranked, squared, times its vertices) is too large
            ids = [list(zip(*(g.node_labels[c].tolist() for c in columns))) if columns else [()] * g.n_nodes
                   for g in graphs]
            assert max(len(set(i)) ** 2 * g.n_nodes for i, g in zip(ids, graphs)) > 8192

    check()
