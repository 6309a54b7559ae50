"""The feature map of the Dirac shortest-path kernel against an independent reference, the pairwise
methods, GraKeL, and across CPU and GPU.

The reference computes shortest paths by its own Floyd-Warshall and counts the (labels, labels,
length) triplets of ordered pairs of distinct reachable vertices with a Counter; weights are
multiples of 1/2, so every path length is exact and no summation order can change one.
"""

import collections
import types
import copy
import pickle

import numpy as np
import pytest

from conftest import rebuilt
from graphkern import Graph
from graphkern.spgk import BrownianBridgeEdge, DiracEdge, DiracNode, GaussianNode, ShortestPathKernel
from graphkern.spgk import features, features_gpu

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def random_graph(rng, *, weighted, n_labels=3, columns=("a", "b")):
    """Up to 14 vertices in up to 3 components, isolated vertices and self-loops included."""
    n = int(rng.integers(1, 15))
    edges = set()
    parts = np.sort(rng.choice(np.arange(1, n + 1), size=min(n, int(rng.integers(1, 4))), replace=False))
    lo = 0
    for hi in parts:
        for i in range(lo, hi):
            for j in range(i, hi):
                if (i == j and rng.random() < 0.1) or (i != j and rng.random() < 0.3):
                    edges.add((i, j))
        lo = hi
    edges = sorted(edges)
    weights = rng.integers(0, 5, len(edges)) / 2.0 if weighted else None
    labels = {c: rng.integers(0, n_labels, n) for c in columns}
    return Graph.from_edges(edges, n, weights=weights, node_labels=labels)


def random_graphs(rng, count, *, weighted=None, **kw):
    return [random_graph(rng, weighted=bool(rng.integers(2)) if weighted is None else weighted, **kw)
            for _ in range(count)]


def reference_triplets(g, columns):
    n = g.n_nodes
    D = np.full((n, n), np.inf)
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    D[rows, g.indices] = g.weight_array()
    np.fill_diagonal(D, 0.0)
    for k in range(n):
        D = np.minimum(D, D[:, [k]] + D[[k], :])
    labels = list(zip(*(g.node_labels[c].tolist() for c in columns))) if columns else [()] * n
    return collections.Counter((labels[a], labels[b], D[a, b]) for a in range(n) for b in range(n)
                               if a != b and np.isfinite(D[a, b]))


def reference_gram(X, Y, columns, normalize=False):
    cx = [reference_triplets(g, columns) for g in X]
    cy = [reference_triplets(g, columns) for g in Y]
    K = np.array([[float(sum(c[t] * d[t] for t in c)) for d in cy] for c in cx])
    if normalize:
        dx = np.array([float(sum(v * v for v in c.values())) for c in cx])
        dy = np.array([float(sum(v * v for v in c.values())) for c in cy])
        scale = np.sqrt(np.outer(dx, dy))
        K = np.where(scale > 0, K / np.where(scale > 0, scale, 1.0), 0.0)
    return K


NODE_KERNELS = {(): None, ("a",): DiracNode("a"), ("a", "b"): DiracNode("a") * DiracNode("b")}


@pytest.mark.parametrize("columns", [("a",), ("a", "b")])
@pytest.mark.parametrize("span", ["table", "sort"])
def test_label_and_column_numbering_by_table_and_by_sort(rng, monkeypatch, columns, span):
    """Labels far apart and negative, numbered through a table or a sort, give the reference Gram
    matrices, fitted and across sets with labels the other set lacks."""
    if span == "sort":
        monkeypatch.setattr(features, "_TABLE_SPAN", 0)

    def spread(graphs):
        for g in graphs:
            for c in columns:
                g.node_labels[c] = np.array([-(1 << 40), -3, 7, 1 << 33])[g.node_labels[c]]
        return graphs

    X, Y = spread(random_graphs(rng, 12, n_labels=4)), spread(random_graphs(rng, 6, n_labels=4))
    node = NODE_KERNELS[columns]
    kernel = ShortestPathKernel(node_kernel=node, backend="cpu")
    np.testing.assert_array_equal(kernel(X), reference_gram(X, X, columns))
    np.testing.assert_array_equal(kernel(X, Y), reference_gram(X, Y, columns))
    np.testing.assert_array_equal(kernel.fit(Y).transform(X), reference_gram(X, Y, columns))
    names = kernel.fit(X).feature_names_
    assert names == sorted(names) and len(set(names)) == len(names)
    phi = kernel.features(X).toarray()
    np.testing.assert_array_equal(phi @ phi.T, reference_gram(X, X, columns))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("columns", list(NODE_KERNELS))
@pytest.mark.parametrize("normalize", [False, True])
def test_features_equal_reference_and_pairwise(rng, backend, columns, normalize):
    X = random_graphs(rng, 14)
    kernel = ShortestPathKernel(node_kernel=NODE_KERNELS[columns], normalize=normalize, backend=backend)
    K = kernel(X)
    assert kernel.method_ == "features" and kernel.backend_ == backend
    np.testing.assert_array_equal(K, reference_gram(X, X, columns, normalize))
    pairwise = ShortestPathKernel(node_kernel=NODE_KERNELS[columns], normalize=normalize, method="openmp_out")
    np.testing.assert_array_equal(K, pairwise(X))
    Y = random_graphs(rng, 5)
    np.testing.assert_array_equal(kernel(X, Y), pairwise(X, Y))
    np.testing.assert_array_equal(kernel.diag(Y), pairwise.diag(Y))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalize", [False, True])
def test_fit_transform_with_unseen_labels_and_lengths(rng, backend, normalize):
    X = random_graphs(rng, 12, n_labels=2)
    Y = random_graphs(rng, 7, n_labels=4)  # labels 2 and 3 never occur in X
    Y.append(Graph.from_edges([(0, 1), (1, 2)], 3, weights=[0.25, 7.75], node_labels={"a": [0, 1, 5], "b": [0, 0, 1]}))
    columns = ("a", "b")
    kernel = ShortestPathKernel(node_kernel=NODE_KERNELS[columns], normalize=normalize, backend=backend).fit(X)
    K = kernel.transform(Y)
    np.testing.assert_array_equal(K, reference_gram(Y, X, columns, normalize))
    pairwise = ShortestPathKernel(node_kernel=NODE_KERNELS[columns], normalize=normalize, method="openmp_out")
    np.testing.assert_array_equal(K, pairwise.fit(X).transform(Y))
    if not normalize:
        np.testing.assert_array_equal((kernel.features(Y) @ kernel.features(X).T).toarray(), K)


def test_feature_columns_are_the_triplets(rng):
    X = random_graphs(rng, 10)
    kernel = ShortestPathKernel(node_kernel=DiracNode("a") * DiracNode("b")).fit(X)
    phi = kernel.features(X)
    names = kernel.feature_names_
    assert kernel.feature_label_columns_ == ("a", "b")
    assert phi.shape == (len(X), len(names)) and phi.dtype == np.int64
    for g, row in zip(X, phi.toarray()):
        got = {names[j]: int(v) for j, v in enumerate(row) if v}
        assert got == dict(reference_triplets(g, ("a", "b")))


@pytest.mark.parametrize("backend, sparse_cost", [("cpu", 0.0), ("cpu", 1e30), pytest.param("gpu", 1, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("normalize", [False, True])
def test_out_memory_map_in_tiles(rng, backend, sparse_cost, normalize, tmp_path, monkeypatch):
    """A Gram matrix written into a memory map, several tiles of rows (the CPU's sparse and dense
    products, and the GPU's)."""
    from graphkern.spgk import features

    monkeypatch.setattr(features, "_TILE_BYTES", 3 * 8 * 30)
    monkeypatch.setattr(features, "_SPARSE_COST", sparse_cost)
    monkeypatch.setattr(features_gpu, "_TILE_BYTES", 64 * 8 * 30)
    from graphkern._cuda import runtime

    monkeypatch.setattr(runtime, "STAGED_MIN_BYTES", 1000)  # each tile through the staged copy
    X = random_graphs(rng, 150, n_labels=2)
    kernel = ShortestPathKernel(node_kernel=DiracNode("a"), backend=backend, normalize=normalize)
    out = np.lib.format.open_memmap(tmp_path / "K.npy", mode="w+", dtype=np.float64, shape=(150, 150))
    assert kernel(X, out=out) is out
    out.flush()
    expected = ShortestPathKernel(node_kernel=DiracNode("a"), method="openmp_out", normalize=normalize)(X)
    np.testing.assert_array_equal(np.load(tmp_path / "K.npy"), expected)
    Y = X[:70]
    np.testing.assert_array_equal(kernel.fit(X).transform(Y), expected[:70])
    np.testing.assert_array_equal(kernel(Y, X), expected[:70])
    fortran = np.zeros((150, 150), order="F")  # not C-ordered: the lower triangle filled tile by tile
    np.testing.assert_array_equal(kernel(X, out=fortran), expected)


def test_auto_uses_features_only_for_dirac_kernels(rng):
    X = random_graphs(rng, 4, columns=("a",))
    for g in X:
        g.node_labels["x"] = rng.random(g.n_nodes)
    k = ShortestPathKernel(node_kernel=DiracNode("a"), backend="cpu")
    k(X)
    assert k.method_ == "features"
    for other in (dict(node_kernel=GaussianNode("x", sigma=1.0)), dict(edge_kernel=BrownianBridgeEdge(c=1.0))):
        # the pairwise choice depends on the thread count only, given here (not the machine's)
        for n_threads, method in ((1, "fcsp"), (2, "openmp_out")):
            k = ShortestPathKernel(backend="cpu", n_threads=n_threads, **other)
            k(X)
            assert k.method_ == method
        with pytest.raises(ValueError, match="features"):
            ShortestPathKernel(backend="cpu", method="features", **other)(X)
        with pytest.raises(ValueError, match="features"):
            k.features(X)


@pytest.mark.parametrize("backend", BACKENDS + [pytest.param("hybrid", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("edge", [DiracEdge(), BrownianBridgeEdge(c=1.0)])
def test_pickle_and_deepcopy_before_and_after_use(rng, backend, edge):
    X, Y = random_graphs(rng, 8), random_graphs(rng, 3)
    kernel = ShortestPathKernel(node_kernel=DiracNode("a"), edge_kernel=edge, normalize=True, backend=backend)
    fresh = pickle.loads(pickle.dumps(kernel))
    expected = fresh.fit(X).transform(Y)
    kernel.fit(X)
    kernel(X)  # caches, device copies and runners in use
    for clone in (pickle.loads(pickle.dumps(kernel)), copy.deepcopy(kernel)):
        np.testing.assert_allclose(clone.transform(Y), expected, rtol=1e-13)
        np.testing.assert_allclose(clone(X), kernel(X), rtol=1e-13)
        if isinstance(edge, DiracEdge):
            assert clone.feature_names_ == kernel.feature_names_


def test_bad_input_is_named(rng):
    X = random_graphs(rng, 3, weighted=True)
    bad = Graph.from_edges([(0, 1)], 2, weights=[1.0], node_labels={"a": [0, 1], "b": [0, 0]})
    bad = rebuilt(bad, weights=-bad.weights)  # unchecked at construction: refused where the kernel reads it
    with pytest.raises(ValueError, match=r"X\[3\] has a negative edge weight"):
        ShortestPathKernel(node_kernel=DiracNode("a"))(X + [bad])
    with pytest.raises(ValueError, match="out must be"):
        ShortestPathKernel(node_kernel=DiracNode("a"))(X, out=np.zeros((2, 3)))
    with pytest.raises(KeyError, match="nope"):
        ShortestPathKernel(node_kernel=DiracNode("nope"))(X)


def test_equals_grakel_on_molecules():
    grakel = pytest.importorskip("grakel")
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    graphs = read_sdf(molecules_path())[:120]

    def convert(g):
        return grakel.Graph(g.to_scipy().toarray(), {i: int(v) for i, v in enumerate(g.node_labels["element"])})

    train, test = [convert(g) for g in graphs[:80]], [convert(g) for g in graphs[80:]]
    for normalize in (False, True):
        peer = grakel.ShortestPath(with_labels=True, normalize=normalize)
        expected_train, expected_test = peer.fit_transform(train), peer.transform(test)
        kernel = ShortestPathKernel(node_kernel=DiracNode("element"), normalize=normalize, backend="cpu")
        np.testing.assert_allclose(kernel.fit_transform(graphs[:80]), expected_train, rtol=1e-15, atol=0)
        np.testing.assert_allclose(kernel.transform(graphs[80:]), expected_test, rtol=1e-15, atol=0)


# --------------------------------------------------------------------------- the GPU driver on a host emulation

class FakeBuffer:
    """Device memory as host bytes; views share them."""

    def __init__(self, nbytes, data=None, offset=0):
        self.data = np.zeros(max(nbytes, 1), np.uint8) if data is None else data
        self.offset, self.nbytes = offset, nbytes

    def bytes(self):
        return self.data[self.offset:self.offset + self.nbytes]

    def as_(self, dtype):
        return self.bytes().view(dtype)

    def view(self, offset, nbytes):
        assert offset + nbytes <= self.nbytes, "view outside the buffer"
        return FakeBuffer(nbytes, self.data, self.offset + offset)

    def zero(self, stream=None):
        self.bytes()[:] = 0

    def copy_from_host(self, host, stream=None):
        self.bytes()[:] = np.frombuffer(np.ascontiguousarray(host).tobytes(), np.uint8)

    def copy_to_host(self, out, stream=None, offset=0):
        flat = memoryview(out).cast("B")
        flat[:] = self.bytes()[offset:offset + len(flat)].tobytes()

    def to_host(self, dtype, shape):
        return self.as_(dtype)[:int(np.prod(shape))].reshape(shape).copy()


class FakeFeatureRuntime:
    """The two kernels of cuda_src/spgk_features.cu in NumPy, with their padding and flags."""

    def __init__(self, free=1 << 30):
        self.launches, self.mirrored, self.copied, self.free = [], [], [], free

    def get_device(self, ordinal):
        return types.SimpleNamespace(memory_info=lambda: (self.free, self.free), ordinal=ordinal)

    def kernel(self, dev, module, name):
        assert module == "spgk_features"
        return name

    def exports(self, dev, module, agree=None):
        assert module == "spgk_features"
        return types.SimpleNamespace(tile=64, depth=16, threads=256)  # the shapes emulated below

    def layout(self, dev, module, name):
        assert module == "spgk_features" and name in ("dense_rows", "gram_tile")
        return types.SimpleNamespace(pack=lambda **fields: types.SimpleNamespace(**fields))

    def alloc(self, dev, shape, dtype):
        return FakeBuffer(int(np.prod(shape)) * np.dtype(dtype).itemsize)

    def to_device(self, dev, array, stream=None):
        buf = self.alloc(dev, np.shape(array), np.asarray(array).dtype)
        buf.copy_from_host(array)
        return buf

    def check_fits(self, dev, nbytes, what):
        pass

    def Stream(self, dev):
        return types.SimpleNamespace(synchronize=lambda: None, wait_event=lambda event: None)

    def copy_to_pageable(self, buf, out, offset=0, threads=1):
        buf.copy_to_host(out.reshape(-1).view(np.uint8), offset=offset)
        self.copied.append(out.nbytes)
        return out

    def Event(self, dev, timing=True):
        return types.SimpleNamespace(record=lambda stream=None: None, synchronize=lambda: None)

    def launch(self, fn, grid, block, args, shared_mem=0, stream=None):
        self.launches.append(fn)
        if fn == "spgk_features_scatter":
            indptr, cols, counts, rank, n_rows, dense, ld, flags = args
            D = dense.as_(np.float64).reshape(-1, int(ld))
            ip = indptr.as_(np.int64)
            rows = np.repeat(np.arange(int(n_rows)), np.diff(ip))
            col = rank.as_(np.int32)[cols.as_(np.int32)[:len(rows)]]
            D[rows, col] = counts.as_(np.int64)[:len(rows)]
            flags.as_(np.uint8).reshape(-1, int(ld) // 16)[rows // 64, col // 16] = 1
            return
        tile_rows, all_rows, tile = args
        A, fa, dx, rows, depth = (tile_rows.values, tile_rows.steps, tile_rows.self_dot, int(tile_rows.count),
                                  int(tile_rows.ld))
        B, fb, dy, cols = all_rows.values, all_rows.steps, all_rows.self_dot, int(all_rows.count)
        assert int(all_rows.ld) == depth
        C, ldc, row0, mirror = tile.C, tile.ldc, int(tile.row0), bool(tile.mirror)
        self.mirrored.append(mirror)
        a = A.as_(np.float64).reshape(-1, depth)
        b = B.as_(np.float64).reshape(-1, depth)
        steps = depth // 16
        fa = fa.as_(np.uint8).reshape(-1, steps)
        fb = fb.as_(np.uint8).reshape(-1, steps)
        j_first = row0 if mirror else 0  # the columns the grid covers start here
        assert grid == (-(-(cols - j_first) // 64), -(-rows // 64)) and len(a) >= 64 * grid[1]
        assert len(b) >= 64 * grid[0] + j_first and row0 % 64 == 0
        out = C.as_(np.float64).reshape(-1, int(ldc))
        c_row = row0 if mirror else 0
        for bi in range(grid[1]):
            for bj in range(j_first // 64, j_first // 64 + grid[0]):
                if mirror and bj < row0 // 64 + bi:
                    continue
                acc = np.zeros((64, 64))
                for s in range(steps):
                    if fa[bi, s] and fb[bj, s]:
                        k = slice(16 * s, 16 * s + 16)
                        acc += a[64 * bi:64 * bi + 64, k] @ b[64 * bj:64 * bj + 64, k].T
                i1, j1 = min(64, rows - 64 * bi), min(64, cols - 64 * bj)
                value = acc[:i1, :j1]
                if dx is not None:
                    scale = np.sqrt(np.outer(dx.as_(np.float64)[64 * bi:64 * bi + i1],
                                             dy.as_(np.float64)[64 * bj:64 * bj + j1]))
                    value = np.where(scale > 0, value / np.where(scale > 0, scale, 1.0), 0.0)
                out[c_row + 64 * bi:c_row + 64 * bi + i1, 64 * bj:64 * bj + j1] = value
                if mirror:
                    out[64 * bj:64 * bj + j1, c_row + 64 * bi:c_row + 64 * bi + i1] = value.T


@pytest.mark.parametrize("free", [1 << 30, 400_000], ids=["resident", "two-tiles"])
@pytest.mark.parametrize("normalize", [False, True])
def test_gpu_tiles_on_a_host_emulation(rng, monkeypatch, normalize, free):
    """The GPU driver's tiling, padding, column order and skipped steps, its kernels emulated; a
    symmetric matrix kept whole on the device (its blocks mirrored) or made in full tiles."""
    from graphkern._cuda import runtime

    fake = FakeFeatureRuntime(free)
    for name in ("get_device", "kernel", "exports", "layout", "alloc", "to_device", "check_fits", "Stream",
                 "Event", "copy_to_pageable", "launch"):
        monkeypatch.setattr(runtime, name, getattr(fake, name))
    monkeypatch.setattr(runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(runtime, "resolve_devices", lambda d: [0], raising=False)
    monkeypatch.setattr(features_gpu, "_TILE_BYTES", 64 * 8 * 90)  # tiles of 64 rows
    X, Y = random_graphs(rng, 150, n_labels=3), random_graphs(rng, 70, n_labels=3)
    node = DiracNode("a") * DiracNode("b")
    cpu = ShortestPathKernel(node_kernel=node, normalize=normalize, backend="cpu")
    from graphkern.spgk import api

    cfg = {"node_kernel": node, "edge_kernel": DiracEdge(), "n_threads": 2, "backend": "gpu", "device": 0}
    kernel = ShortestPathKernel(node_kernel=node, normalize=normalize)
    monkeypatch.setattr(kernel, "_config", lambda: dict(cfg, dtype=np.dtype(np.float64), method="features",
                                                         cpu_walk="auto"))
    out = np.full((150, 150), np.nan)
    np.testing.assert_array_equal(kernel(X, out=out), cpu(X))
    assert fake.launches.count("spgk_features_gram") == 3 and fake.mirrored == [free > 1e6] * 3
    assert fake.copied == [8 * 64 * 150, 8 * 64 * 150, 8 * 22 * 150]  # each tile as soon as it is done
    np.testing.assert_array_equal(kernel(Y, X), cpu(Y, X))
    np.testing.assert_array_equal(kernel.fit(X).transform(Y), cpu.fit(X).transform(Y))
    assert api.FEATURES == kernel.method_ and kernel.backend_ == "gpu"


def test_progress_and_long_call_warning(rng, monkeypatch):
    from graphkern.spgk import api

    X = random_graphs(rng, 12, columns=("a",))
    for g in X:
        g.node_labels["x"] = rng.random(g.n_nodes)
    seen = []
    kernel = ShortestPathKernel(node_kernel=DiracNode("a"), verbose=lambda done, total: seen.append((done, total)))
    kernel(X)
    assert seen and seen[-1] == (144, 144)  # the feature map reports entries of K
    monkeypatch.setattr(api, "_PROGRESS_CHUNK", 10)
    seen.clear()
    pairwise = ShortestPathKernel(node_kernel=GaussianNode("x", sigma=1.0), backend="cpu",
                                  verbose=lambda done, total: seen.append((done, total)))
    expected = ShortestPathKernel(node_kernel=GaussianNode("x", sigma=1.0), backend="cpu")(X)
    np.testing.assert_array_equal(pairwise(X), expected)
    assert seen[-1] == (78, 78)  # reports are throttled in time; the last one is the total
    monkeypatch.setattr(api, "LONG_PAIR_WORK", 1.0)
    with pytest.warns(RuntimeWarning, match=r"O\(n\^4\)"):
        pairwise(X)


@pytest.mark.gpu
@pytest.mark.parametrize("resident", [0.5, 0.0], ids=["resident", "two-tiles"])
@pytest.mark.parametrize("normalize", [False, True])
def test_gpu_equals_cpu_on_molecules(normalize, resident, monkeypatch):
    """3,000 molecules (the packaged set, augmented as in the scaling benchmark), in several tiles,
    each through the download ring; the symmetric matrix whole on the device or not."""
    from graphkern.bench.data import molecules_path
    from graphkern.bench.suites._spgk_scaling import augmented_molecules
    from graphkern.io import read_sdf

    monkeypatch.setattr(features_gpu, "_TILE_BYTES", 8 * 3000 * 640)  # tiles of 640 rows
    monkeypatch.setattr(features_gpu, "_RESIDENT_SHARE", resident)
    graphs = augmented_molecules(read_sdf(molecules_path(), hydrogens=False), 3000)
    gpu = ShortestPathKernel(node_kernel=DiracNode("element"), normalize=normalize, backend="gpu")
    cpu = ShortestPathKernel(node_kernel=DiracNode("element"), normalize=normalize, backend="cpu")
    np.testing.assert_array_equal(gpu(graphs), cpu(graphs))
    np.testing.assert_array_equal(gpu.fit(graphs[:2000]).transform(graphs[2000:]),
                                  cpu.fit(graphs[:2000]).transform(graphs[2000:]))


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_compiled_mirror_copies_the_upper_triangle(rng, n_threads):
    from graphkern._cpu import spgk_gram

    for n in (0, 1, 63, 64, 65, 200):
        K = rng.normal(size=(n, n))
        want = np.triu(K) + np.triu(K, 1).T
        assert np.array_equal(spgk_gram.mirror_upper(K, n_threads), want)
    with pytest.raises(ValueError, match="square"):
        spgk_gram.mirror_upper(np.zeros((2, 3)), 1)


