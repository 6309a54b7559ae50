"""The shortest-path kernel against a plain NumPy implementation of its definition.

The reference computes all-pairs shortest paths by its own Floyd-Warshall, lists the
ordered pairs of distinct reachable vertices, and sums
k_v(a, c) k_v(b, d) k_e(l_ab, l_cd) over all pairs of them: nothing is shared with
graphkern.spgk but the Graph container.
"""

import gc
import math
import pickle
import threading
import time

import numpy as np
import pytest

from conftest import SANITIZER, rebuilt, sanitized
from graphkern.spgk import batch as spgk_batch, cpu as spgk_cpu, gpu as spgk_gpu, hybrid as spgk_hybrid
from graphkern import Graph
from graphkern._cuda import runtime
from graphkern.errors import GPUUnavailableError
from graphkern.spgk import (CPU_METHODS, GPU_METHODS, BrownianBridgeEdge, DiracEdge, DiracNode, GaussianEdge,
                            GaussianNode, ProductNode, ShortestPathKernel, shortest_path_graph)

GPU_PARAMS = [pytest.param(m, marks=pytest.mark.gpu) for m in GPU_METHODS]
ALL_METHODS = list(CPU_METHODS) + GPU_PARAMS


# --------------------------------------------------------------------------- reference

def reference_distances(g):
    n = g.n_nodes
    D = np.full((n, n), np.inf)
    rows = np.repeat(np.arange(n), np.diff(g.indptr))
    w = np.ones(g.nnz) if g.weights is None else g.weights
    D[rows, g.indices] = w
    np.fill_diagonal(D, 0.0)
    for k in range(n):
        D = np.minimum(D, D[:, [k]] + D[[k], :])
    return D


def reference_paths(g):
    D = reference_distances(g)
    a, b = np.nonzero(np.isfinite(D) & ~np.eye(g.n_nodes, dtype=bool))
    return a, b, D[a, b]


def ref_dirac(col):
    return lambda g1, g2: (g1.node_labels[col][:, None] == g2.node_labels[col][None, :]).astype(float)


def ref_gaussian(col, sigma):
    def rows(g):
        x = g.node_labels[col]
        return x[:, None] if x.ndim == 1 else x

    def k(g1, g2):
        x, y = rows(g1), rows(g2)
        return np.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / (2 * sigma ** 2))
    return k


def ref_product(*factors):
    return lambda g1, g2: np.prod([f(g1, g2) for f in factors], axis=0)


REF_EDGE = {
    "dirac": lambda l1, l2: (l1 == l2).astype(float),
    "gaussian": lambda l1, l2: np.exp(-(l1 - l2) ** 2 / (2 * 0.8 ** 2)),
    "brownian": lambda l1, l2: np.maximum(0.0, 1.5 - np.abs(l1 - l2)),
}
EDGE = {"dirac": DiracEdge(), "gaussian": GaussianEdge(sigma=0.8), "brownian": BrownianBridgeEdge(c=1.5)}

NODE = {
    "none": (None, lambda g1, g2: np.ones((g1.n_nodes, g2.n_nodes))),
    "discrete": (DiracNode("c"), ref_dirac("c")),
    "continuous": (GaussianNode("x", sigma=1.3), ref_gaussian("x", 1.3)),
    "vector": (GaussianNode("v", gamma=0.4), ref_gaussian("v", np.sqrt(1 / 0.8))),
    "mixed": (DiracNode("c") * GaussianNode("x", sigma=0.9) * GaussianNode("v", sigma=2.0),
              ref_product(ref_dirac("c"), ref_gaussian("x", 0.9), ref_gaussian("v", 2.0))),
}


def reference_kernel(g1, g2, vertex, edge):
    a, b, l1 = reference_paths(g1)
    c, d, l2 = reference_paths(g2)
    KV = vertex(g1, g2)
    return float(np.sum(KV[np.ix_(a, c)] * KV[np.ix_(b, d)] * REF_EDGE[edge](l1[:, None], l2[None, :])))


def reference_gram(X, Y, vertex, edge):
    return np.array([[reference_kernel(x, y, vertex, edge) for y in Y] for x in X])


# --------------------------------------------------------------------------- random graphs

def random_graph(rng, n, p=0.35, *, weighted=False, components=1, n_labels=3):
    """G(n, p) made of ``components`` parts with no edge between them, with labels c, x, v."""
    part = np.sort(rng.integers(0, components, n))
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if part[i] == part[j] and rng.random() < p]
    edges = np.array(edges, dtype=np.int64).reshape(-1, 2)
    # integer weights make equal path lengths likely, so DiracEdge sees matches
    weights = rng.integers(1, 4, len(edges)).astype(float) if weighted and len(edges) else None
    labels = {"c": rng.integers(0, n_labels, n), "x": rng.normal(size=n), "v": rng.normal(size=(n, 2))}
    return Graph.from_edges(edges, n, weights=weights, node_labels=labels)


def graph_zoo(rng, weighted):
    """Connected, disconnected, one-vertex and edgeless graphs (and one with no vertex)."""
    graphs = [random_graph(rng, int(rng.integers(3, 10)), weighted=weighted) for _ in range(4)]
    graphs.append(random_graph(rng, 9, p=0.6, weighted=weighted, components=3))
    graphs.append(random_graph(rng, 1, weighted=weighted))
    graphs.append(random_graph(rng, 4, p=0.0))
    graphs.append(random_graph(rng, 0))
    return graphs


def backend_of(method):
    return "gpu" if method in GPU_METHODS else "cpu"


def assert_close(K, R, rtol):
    scale = max(np.abs(R).max(), 1e-300)
    err = np.abs(K - R).max() / scale
    assert err <= rtol, f"relative error {err:.3g} > {rtol}"


# --------------------------------------------------------------------------- values

@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("node", list(NODE))
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_gram_matches_definition(rng, method, node, weighted):
    graphs = graph_zoo(rng, weighted)
    spec, vertex = NODE[node]
    edge = ["dirac", "gaussian", "brownian"][int(rng.integers(3))]
    kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE[edge], method=method, backend=backend_of(method))
    R = reference_gram(graphs, graphs, vertex, edge)
    K = kernel(graphs)
    assert K.shape == (len(graphs), len(graphs))
    assert_close(K, R, 1e-12)
    assert np.array_equal(K, K.T)
    assert kernel.method_ == method


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("edge", list(EDGE))
def test_cross_matrix_matches_definition(rng, method, edge):
    X = graph_zoo(rng, weighted=bool(rng.integers(2)))[:5]
    Y = [random_graph(rng, int(rng.integers(2, 11)), weighted=True) for _ in range(3)]
    spec, vertex = NODE["mixed"]
    kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE[edge], method=method, backend=backend_of(method))
    K = kernel(X, Y)
    assert K.shape == (5, 3)
    assert_close(K, reference_gram(X, Y, vertex, edge), 1e-12)


@pytest.mark.parametrize("method", ["fcsp", "openmp_in", "openmp_out"] + GPU_PARAMS)
def test_float32_vertex_matrix_close_to_float64(rng, method):
    graphs = [random_graph(rng, int(rng.integers(4, 12)), weighted=True) for _ in range(5)]
    spec, vertex = NODE["mixed"]
    kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE["brownian"], method=method,
                                backend=backend_of(method), dtype=np.float32)
    assert_close(kernel(graphs), reference_gram(graphs, graphs, vertex, "brownian"), 1e-5)


@pytest.mark.parametrize("node,edge", [("discrete", "dirac"), ("discrete", "gaussian"), ("continuous", "dirac"),
                                       ("continuous", "gaussian"), ("mixed", "brownian")])
def test_gram_symmetric_positive_semidefinite(rng, node, edge):
    graphs = [random_graph(rng, int(rng.integers(2, 12)), p=float(rng.uniform(0.2, 0.7)),
                           weighted=bool(rng.integers(2))) for _ in range(14)]
    for normalize in (False, True):
        K = ShortestPathKernel(node_kernel=NODE[node][0], edge_kernel=EDGE[edge], normalize=normalize,
                               backend="cpu")(graphs)
        assert np.array_equal(K, K.T)
        eig = np.linalg.eigvalsh(K)
        assert eig.min() >= -1e-9 * max(eig.max(), 1.0), eig.min()


def test_normalize(rng):
    X = graph_zoo(rng, weighted=False)
    Y = [random_graph(rng, 6) for _ in range(3)]
    spec, vertex = NODE["continuous"]
    kernel = ShortestPathKernel(node_kernel=spec, normalize=True, backend="cpu")
    K = kernel(X)
    R = reference_gram(X, X, vertex, "dirac")
    d = np.diag(R)
    has_paths = d > 0
    expected = np.zeros_like(R)
    expected[np.ix_(has_paths, has_paths)] = R[np.ix_(has_paths, has_paths)] / np.sqrt(
        np.outer(d[has_paths], d[has_paths]))
    assert_close(K, expected, 1e-12)
    assert np.allclose(np.diag(K)[has_paths], 1.0)
    assert not has_paths.all()  # the zoo has graphs without paths: their rows are 0
    Ryy = np.array([reference_kernel(y, y, vertex, "dirac") for y in Y])
    Rxy = reference_gram(X, Y, vertex, "dirac")
    with np.errstate(invalid="ignore", divide="ignore"):
        expected_xy = np.nan_to_num(Rxy / np.sqrt(np.outer(d, Ryy)))
    assert_close(kernel(X, Y), expected_xy, 1e-12)


def test_diag(rng):
    graphs = graph_zoo(rng, weighted=True)
    spec, vertex = NODE["mixed"]
    kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE["gaussian"], backend="cpu")
    expected = [reference_kernel(g, g, vertex, "gaussian") for g in graphs]
    assert np.allclose(kernel.diag(graphs), expected, rtol=1e-12, atol=0)


def test_permutation_invariance(rng):
    graphs = [random_graph(rng, 9, weighted=True) for _ in range(3)]
    permuted = [g.permute(rng.permutation(g.n_nodes)) for g in graphs]
    kernel = ShortestPathKernel(node_kernel=NODE["mixed"][0], edge_kernel=EDGE["brownian"], backend="cpu")
    assert_close(kernel(permuted, graphs), kernel(graphs), 1e-12)


def test_string_labels_are_categories(rng):
    elements = np.array(["C", "N", "O"])
    g1 = Graph.from_edges([(0, 1), (1, 2), (2, 3)], node_labels={"element": elements[[0, 0, 1, 2]]})
    g2 = Graph.from_edges([(0, 1), (1, 2)], node_labels={"element": elements[[2, 1, 0]]})
    K = ShortestPathKernel(node_kernel=DiracNode("element"), backend="cpu")([g1, g2])
    # ordered paths as (label_a, label_b, length); g1 (C-C-N-O): CC1 twice, CN2 NC2 CO3 OC3 CN1 NC1 CO2 OC2 NO1 ON1;
    # g2 (O-N-C): ON1 NO1 OC2 CO2 NC1 CN1, each of which g1 has once
    assert K.tolist() == [[2 * 2 + 10, 6], [6, 6]]


# --------------------------------------------------------------------------- GraKeL

def _grakel_graph(grakel, g, labels):
    return grakel.Graph(g.to_scipy().toarray(), labels)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_equals_grakel_shortest_path(rng, weighted):
    grakel = pytest.importorskip("grakel", reason="GraKeL is not installed (pip install grakel)")
    # GraKeL takes a dense adjacency in which 0 means "no edge": keep weights positive, graphs non-empty
    graphs = [random_graph(rng, int(rng.integers(2, 11)), p=0.4, weighted=weighted, components=2)
              for _ in range(8)]
    ours = ShortestPathKernel(node_kernel=DiracNode("c"), edge_kernel=DiracEdge(), backend="cpu")(graphs)
    theirs = grakel.ShortestPath(with_labels=True).fit_transform(
        [_grakel_graph(grakel, g, {i: int(c) for i, c in enumerate(g.node_labels["c"])}) for g in graphs])
    assert np.array_equal(ours, theirs)  # integer counts: equal, no factor of 2


def test_equals_grakel_shortest_path_attr(rng):
    grakel = pytest.importorskip("grakel", reason="GraKeL is not installed (pip install grakel)")
    graphs = [random_graph(rng, int(rng.integers(2, 8)), p=0.5, weighted=True) for _ in range(5)]
    sigma = 0.7
    metric = lambda x, y: float(np.exp(-np.sum((x - y) ** 2) / (2 * sigma ** 2)))
    theirs = grakel.ShortestPathAttr(metric=metric).fit_transform(
        [_grakel_graph(grakel, g, {i: x for i, x in enumerate(g.node_labels["v"])}) for g in graphs])
    ours = ShortestPathKernel(node_kernel=GaussianNode("v", sigma=sigma), edge_kernel=DiracEdge(),
                              backend="cpu")(graphs)
    assert_close(ours, theirs, 1e-12)


# --------------------------------------------------------------------------- shortest paths and the cache

@pytest.mark.parametrize("n,p,weighted", [(40, 0.1, False), (30, 0.6, True), (300, 0.01, True)],
                         ids=["bfs", "floyd-warshall", "dijkstra"])
def test_shortest_path_graph_matches_networkx(rng, n, p, weighted):
    nx = pytest.importorskip("networkx")
    g = random_graph(rng, n, p=p, weighted=weighted, components=2)
    G = g.to_networkx()
    ends, lengths = shortest_path_graph(g)
    expected = {}
    for a, dist in nx.all_pairs_dijkstra_path_length(G, weight="weight" if weighted else None):
        for b, l in dist.items():
            if a < b:
                expected[(a, b)] = l
    assert np.all(ends[:, 0] < ends[:, 1])
    assert dict(zip(map(tuple, ends.tolist()), lengths.tolist())) == pytest.approx(expected, rel=1e-12)
    assert len(ends) == len(expected)


def test_shortest_paths_computed_once_per_list(rng, monkeypatch):
    calls = []
    original = spgk_batch._all_shortest_paths

    def counting(graphs, names, n_threads):
        calls.append(len(graphs))
        return original(graphs, names, n_threads)

    monkeypatch.setattr(spgk_batch, "_all_shortest_paths", counting)
    graphs = [random_graph(rng, 8, weighted=True) for _ in range(4)]
    kernel = ShortestPathKernel(node_kernel=DiracNode("c"), backend="cpu", method="openmp_out")
    first = kernel(graphs)
    kernel(graphs)
    assert calls == [4]  # one compiled pass for the list, then the kept batch
    # a graph with other weights is seen as new
    graphs[0] = rebuilt(graphs[0], weights=np.ones_like(graphs[0].weights))
    second = kernel(graphs)
    assert calls == [4, 4]
    expected = reference_gram(graphs, graphs, ref_dirac("c"), "dirac")
    assert_close(second, expected, 1e-12)
    assert not np.array_equal(first, second)
    # a collected graph takes its batch with it
    assert len(kernel._batches) == 1
    del graphs[3]
    gc.collect()
    assert len(kernel._batches) == 0


# --------------------------------------------------------------------------- errors

def test_negative_weight_is_an_error(rng):
    g = random_graph(rng, 6, p=0.9, weighted=True)
    w = g.weights.copy()
    w[:2] = -1.0
    g = rebuilt(g, weights=w)  # unchecked at construction: refused where the kernel reads it
    with pytest.raises(ValueError, match=r"X\[1\].*negative edge weight"):
        ShortestPathKernel(backend="cpu")([random_graph(rng, 4), g])


def test_missing_label_column_is_named(rng):
    graphs = [random_graph(rng, 5), Graph.from_edges([(0, 1)], node_labels={"c": [1, 2]})]
    with pytest.raises(KeyError, match="'x'"):
        ShortestPathKernel(node_kernel=DiracNode("c") * GaussianNode("x", sigma=1), backend="cpu")(graphs)


def test_label_kind_and_width_errors(rng):
    g = random_graph(rng, 5)
    with pytest.raises(TypeError, match="DiracNode\\('x'\\).*integer"):
        ShortestPathKernel(node_kernel=DiracNode("x"), backend="cpu")([g])
    other = Graph.from_edges([(0, 1)], node_labels={"v": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="'v' has 3 values per vertex"):
        ShortestPathKernel(node_kernel=GaussianNode("v", sigma=1), backend="cpu")([g, other])


@pytest.mark.parametrize("make,error,match", [
    (lambda: GaussianNode("x", sigma=0), ValueError, "sigma must be positive"),
    (lambda: GaussianNode("x", sigma=-1.0), ValueError, "sigma must be positive"),
    (lambda: GaussianNode("x", sigma=float("nan")), ValueError, "sigma must be positive"),
    (lambda: GaussianNode("x", sigma="1"), TypeError, "sigma must be a positive number"),
    (lambda: GaussianNode("x"), ValueError, "exactly one of sigma and gamma"),
    (lambda: GaussianNode("x", sigma=1, gamma=1), ValueError, "exactly one of sigma and gamma"),
    (lambda: GaussianNode("", sigma=1), TypeError, "non-empty string"),
    (lambda: DiracNode(3), TypeError, "non-empty string"),
    (lambda: ProductNode(), ValueError, "at least one"),
    (lambda: ProductNode(DiracNode("c"), 2.0), TypeError, "not a node kernel"),
    (lambda: BrownianBridgeEdge(c=0), ValueError, "c must be positive"),
    (lambda: BrownianBridgeEdge(c=True), TypeError, "c must be a positive number"),
    (lambda: GaussianEdge(gamma=-2), ValueError, "gamma must be positive"),
    (lambda: GaussianEdge(sigma=1e-200), ValueError, "overflows"),
])
def test_bad_base_kernel_parameters(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("params,error,match", [
    (dict(method="dijkstra"), ValueError, "unknown method 'dijkstra'"),
    (dict(backend="tpu"), ValueError, "backend must be one of"),
    (dict(backend="cpu", method="gpu_batched"), ValueError, "runs on the GPU but backend='cpu'"),
    (dict(node_kernel="c"), TypeError, "node_kernel must be"),
    (dict(edge_kernel=DiracNode("c")), TypeError, "edge_kernel must be"),
    (dict(normalize="yes"), TypeError, "normalize must be True or False"),
    (dict(n_threads=0), ValueError, "n_threads must be >= 1"),
    (dict(dtype=np.int32), ValueError, "dtype must be one of"),
])
def test_bad_kernel_parameters(rng, params, error, match):
    kernel = ShortestPathKernel(**params)  # stored as given, checked on use
    assert all(getattr(kernel, k) is v for k, v in params.items())
    with pytest.raises(error, match=match):
        kernel([random_graph(rng, 4)])


def test_bad_inputs(rng):
    kernel = ShortestPathKernel(backend="cpu")
    g = random_graph(rng, 4)
    with pytest.raises(TypeError, match="single Graph"):
        kernel(g)
    with pytest.raises(TypeError, match=r"X\[1\] is a ndarray"):
        kernel([g, np.eye(3)])
    with pytest.raises(TypeError, match="sequence of graphkern.Graph"):
        kernel(3)
    with pytest.raises(AttributeError, match="not fitted"):
        kernel.transform([g])


@pytest.mark.skipif(runtime.gpu_available(), reason="checks the error raised without a GPU")
@pytest.mark.parametrize("params", [dict(backend="gpu"), dict(backend="hybrid"), dict(method="gpu_2d")])
def test_gpu_request_without_gpu(rng, params):
    with pytest.raises(GPUUnavailableError):
        ShortestPathKernel(**params)([random_graph(rng, 4)])


# --------------------------------------------------------------------------- estimator manners

def test_scikit_learn_manners(rng):
    X = [random_graph(rng, int(rng.integers(2, 9)), weighted=True) for _ in range(5)]
    Y = [random_graph(rng, int(rng.integers(2, 9))) for _ in range(3)]
    node = DiracNode("c") * GaussianNode("x", sigma=1.0)
    kernel = ShortestPathKernel(node_kernel=node, edge_kernel=EDGE["brownian"], normalize=True, backend="cpu")
    params = kernel.get_params()
    assert params["node_kernel"] is node and params["normalize"] is True and params["method"] == "auto"
    assert kernel.fit(X) is kernel and kernel.X_fit_ == X
    assert_close(kernel.transform(Y), kernel(Y, X), 0)
    assert_close(kernel.fit_transform(X), kernel(X), 0)
    assert kernel.set_params(normalize=False) is kernel and kernel.normalize is False
    with pytest.raises(ValueError, match="invalid parameter 'sigma'"):
        kernel.set_params(sigma=1)
    copy = pickle.loads(pickle.dumps(kernel))
    assert_close(copy(X), kernel(X), 0)
    sklearn_base = pytest.importorskip("sklearn.base")
    clone = sklearn_base.clone(kernel)
    assert clone.get_params()["node_kernel"] == node and not hasattr(clone, "X_fit_")
    assert_close(clone(X), kernel(X), 0)


def test_auto_method_resolution(rng):
    graphs = [random_graph(rng, 5)]
    kernel = ShortestPathKernel(backend="cpu")
    kernel(graphs)
    assert kernel.method_ == "features"  # Dirac kernels: the explicit feature map
    kernel = ShortestPathKernel(backend="cpu", n_threads=1, edge_kernel=EDGE["gaussian"])
    kernel(graphs)
    assert kernel.method_ == "fcsp"
    kernel.set_params(n_threads=2)(graphs)
    assert kernel.method_ == "openmp_out"
    assert kernel.backend_ == "cpu"


def test_empty_input():
    kernel = ShortestPathKernel(backend="cpu")
    assert kernel([]).shape == (0, 0)


# --------------------------------------------------------------------------- hybrid split

class FakeLaunch:
    """gpu_batched's side of the hybrid protocol on host threads: ``blocks`` workers take
    positions 0, 1, 2, ... from one counter, publish each as progress, and stop at a position at
    or past the limit they read; a pair costs its work / ``rate`` seconds (``start`` seconds
    pass before the first)."""

    def __init__(self, works, rate, blocks=4, start=0.0):
        self.works, self.rate, self.start = works, rate, start
        self.limit = len(works)
        self._progress = -1
        self.next = 0
        self.lock = threading.Lock()
        self.runs = np.zeros(len(works), dtype=int)
        self.threads = [threading.Thread(target=self._block) for _ in range(blocks)]
        for t in self.threads:
            t.start()

    def _block(self):
        time.sleep(self.start)
        while True:
            with self.lock:
                k = self.next
                self.next += 1
            if k >= len(self.works):
                return
            self._progress = k
            if k >= self.limit:
                return
            if np.isfinite(self.rate):
                time.sleep(self.works[k] / self.rate)
            self.runs[k] += 1

    def progress(self):
        return self._progress

    def set_limit(self, b):
        assert b < self.limit  # the CPU only ever lowers it
        self.limit = b

    def done(self):
        return not any(t.is_alive() for t in self.threads)

    def join(self):
        for t in self.threads:
            t.join()


@pytest.mark.parametrize("gpu_speed,start", [(1.0, 0.0), (20.0, 0.0), (np.inf, 0.0), (1.0, 1.0)])
def test_sharing_from_both_ends_computes_every_pair(rng, gpu_speed, start):
    # the GPU (4 fake blocks) from the heavy end, the CPU from the light end: every position
    # below the final limit ran on the GPU, every one at or past it on the CPU exactly once;
    # the work divides roughly as the speeds do; a GPU that starts late (1 s) leaves it all
    # to the CPU, and one that is infinitely fast leaves it nothing
    works = np.sort(np.concatenate([rng.uniform(1, 10, 600), rng.uniform(200, 800, 60)]))[::-1]
    cpu_rate = 1e5  # work per second: the CPU alone needs ~0.3 s
    gpu = FakeLaunch(works, gpu_speed * cpu_rate / 4, start=start)  # 4 blocks: gpu_speed x the CPU in all
    cpu_runs = np.zeros(len(works), dtype=int)

    def run_cpu(lo, hi):
        cpu_runs[lo:hi] += 1
        time.sleep(works[lo:hi].sum() / cpu_rate)

    b, record = spgk_hybrid.share_from_both_ends(works, run_cpu, gpu, n_threads=4, step_seconds=0.01)
    gpu.join()
    assert (cpu_runs[b:] == 1).all() and (cpu_runs[:b] == 0).all()
    assert (gpu.runs[:b] >= 1).all()
    assert record["cpu_pairs"] == len(works) - b and record["gpu_pairs"] == b
    assert record["cpu_work"] == pytest.approx(works[b:].sum())
    cpu_share = record["cpu_work"] / works.sum()
    if start > 0:
        assert b == 0
    elif gpu_speed == 1.0:
        assert 0.2 < cpu_share < 0.8
    elif gpu_speed == 20.0:
        assert 0 < cpu_share < 0.2 and b > 0
    else:
        assert cpu_share < 0.05 and b > 0
    assert gpu.runs.sum() - b <= 8  # pairs both sides ran: only where they met


def test_sharing_from_both_ends_reraises_the_cpu_side_error(rng):
    works = np.ones(500)
    gpu = FakeLaunch(works, 1e4)

    def broken(lo, hi):
        raise RuntimeError("cpu side broke")

    with pytest.raises(RuntimeError, match="cpu side broke"):
        spgk_hybrid.share_from_both_ends(works, broken, gpu, n_threads=2)
    gpu.join()


# --------------------------------------------------------------------------- GPU specifics

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_gpu_batched_many_small_pairs_and_oversize_vertex_matrix(rng, dtype, rtol):
    # 150 small graphs (11k pairs through the atomic pair counter) plus two whose V (130 x 130
    # float64 = 135 KB) exceeds the shared-memory capacity and goes to the global scratch; under a
    # sanitizer 50 small ones (1,300 pairs, several per resident block) and one large one, the
    # smallest whose float64 V with itself passes the capacity's bound (_MAX_SHARED_V)
    graphs = [random_graph(rng, int(rng.integers(3, 14)), p=0.3, weighted=True) for _ in range(sanitized(150, 50))]
    n_large, count = sanitized((130, 2), (math.isqrt(spgk_gpu._MAX_SHARED_V // 8) + 1, 1))
    graphs += [random_graph(rng, n_large, p=0.05, weighted=True) for _ in range(count)]
    node = DiracNode("c") * GaussianNode("v", sigma=1.5)
    cpu = ShortestPathKernel(node_kernel=node, edge_kernel=EDGE["brownian"], backend="cpu")(graphs)
    gpu = ShortestPathKernel(node_kernel=node, edge_kernel=EDGE["brownian"], backend="gpu",
                             method="gpu_batched", dtype=dtype)(graphs)
    assert not np.isnan(gpu).any()
    assert_close(gpu, cpu, rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("method", GPU_METHODS)
def test_gpu_methods_agree_with_cpu_on_larger_graphs(rng, method):
    # large enough that the walks use many blocks and the 2-D grid is capped in x (more than 64 x 32
    # paths: connected graphs of 46 vertices or more); under a sanitizer two such graphs, not five
    low, count = sanitized((40, 5), (50, 2))
    graphs = [random_graph(rng, int(rng.integers(low, 70)), p=0.15, weighted=bool(k % 2)) for k in range(count)]
    node = GaussianNode("v", sigma=1.0)
    for edge in EDGE:
        cpu = ShortestPathKernel(node_kernel=node, edge_kernel=EDGE[edge], backend="cpu")(graphs)
        gpu = ShortestPathKernel(node_kernel=node, edge_kernel=EDGE[edge], backend="gpu", method=method)(graphs)
        assert_close(gpu, cpu, 1e-12)


@pytest.mark.gpu
def test_hybrid_matches_reference_with_both_sides_busy(rng, monkeypatch):
    small = [random_graph(rng, int(rng.integers(3, 8)), weighted=True) for _ in range(30)]
    large = [random_graph(rng, 40, p=0.2, weighted=True) for _ in range(6)]
    graphs = small + large
    n_pairs = len(graphs) * (len(graphs) + 1) // 2
    spec, vertex = NODE["mixed"]
    expected = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE["gaussian"], backend="cpu",
                                  method="naive")(graphs)
    kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE["gaussian"], backend="hybrid")
    assert_close(kernel(graphs), expected, 1e-12)
    split = kernel.hybrid_split_
    assert split["cpu_pairs"] + split["gpu_pairs"] == n_pairs
    assert split["gpu_seconds"] > 0  # the CPU may find the launch done before its first step
    assert_close(kernel(small, large), expected[:30, 30:], 1e-12)
    # a GPU held back 0.2 s before its launch: the CPU takes the light end, the GPU the rest (long
    # enough for a CPU slowed by a sanitizer or other processes to take its share)
    start = spgk_gpu.GpuRunner.start_batched
    hold = [0.2]

    def late(self, *args, **kw):
        if self.stream is None:
            self.stream = runtime.Stream(self.dev)
        runtime.hold_stream(self.stream, hold[0])
        return start(self, *args, **kw)

    monkeypatch.setattr(spgk_gpu.GpuRunner, "start_batched", late)
    assert_close(kernel(graphs), expected, 1e-12)
    split = kernel.hybrid_split_
    assert split["cpu_pairs"] + split["gpu_pairs"] == n_pairs
    assert split["cpu_pairs"] > 2 * kernel._config()["n_threads"] or SANITIZER
    # a GPU held back well past the CPU's time for the whole set (at least 2 s; measured here, as a
    # sanitizer or other processes may slow this CPU many times): the CPU takes every pair, the
    # kernel's blocks stop at the limit 0
    t0 = time.perf_counter()
    ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE["gaussian"], backend="cpu")(graphs)
    hold[0] = max(2.0, 4.0 * (time.perf_counter() - t0))
    assert_close(kernel(graphs), expected, 1e-12)
    assert kernel.hybrid_split_["cpu_pairs"] + kernel.hybrid_split_["gpu_pairs"] == n_pairs
    assert kernel.hybrid_split_["gpu_pairs"] == 0 or SANITIZER
    # a slow CPU (every step 50 ms longer): the GPU takes nearly everything
    monkeypatch.setattr(spgk_gpu.GpuRunner, "start_batched", start)
    run_cpu = spgk_hybrid.run_cpu
    monkeypatch.setattr(spgk_hybrid, "run_cpu", lambda *a: (time.sleep(0.05), run_cpu(*a))[1])
    assert_close(kernel(graphs), expected, 1e-12)
    split = kernel.hybrid_split_
    assert (split["cpu_steps"] <= 2 and split["gpu_pairs"] >= n_pairs - 4 * kernel._config()["n_threads"]) or SANITIZER


@pytest.mark.gpu
def test_gpu_normalized_cross_matrix(rng):
    X = graph_zoo(rng, weighted=True)
    Y = [random_graph(rng, 7) for _ in range(4)]
    node = NODE["mixed"][0]
    cpu = ShortestPathKernel(node_kernel=node, normalize=True, backend="cpu")(X, Y)
    for method in GPU_METHODS:
        gpu = ShortestPathKernel(node_kernel=node, normalize=True, backend="gpu", method=method)(X, Y)
        assert_close(gpu, cpu, 1e-12)


# --------------------------------------------------------------------------- the dense walk (cpu_walk)

@pytest.mark.parametrize("method", spgk_cpu.DENSE_METHODS)
@pytest.mark.parametrize("edge", list(EDGE))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dense_walk_matches_definition_and_the_edge_walk(rng, method, edge, dtype):
    """Every walk on connected, disconnected (+inf in the dense matrix), weighted, one-vertex and
    empty graphs, sizes 1..40 so that the rows span one to five blocks of 8, with either graph as
    the inner one (a cross matrix of unequal sizes)."""
    X = graph_zoo(rng, weighted=True) + [random_graph(rng, n, p=0.5, weighted=bool(n % 2)) for n in (8, 17, 33, 40)]
    Y = [random_graph(rng, n, p=0.4, weighted=True, components=1 + n % 3) for n in (2, 9, 16, 24, 31)]
    spec, vertex = NODE["mixed"]
    R = reference_gram(X, Y, vertex, edge)
    values = {}
    for walk in spgk_cpu.CPU_WALKS:
        kernel = ShortestPathKernel(node_kernel=spec, edge_kernel=EDGE[edge], method=method, backend="cpu",
                                    n_threads=2, dtype=dtype, cpu_walk=walk)
        values[walk] = kernel(X, Y)
        assert_close(values[walk], R, 1e-12 if dtype == np.float64 else 1e-5)
    if dtype == np.float64:
        assert_close(values["dense"], values["edges"], 1e-13)


def test_dense_walk_forced_runs_every_dense_pair(rng, monkeypatch):
    """cpu_walk="dense" takes the dense walk for every pair it can (checked through a cost that would
    make "auto" refuse it), and graphs beyond 256 vertices keep the edge walk."""
    from graphkern._cpu import spgk as cpu
    graphs = [random_graph(rng, n, p=0.3) for n in (5, 12, 20)] + [random_graph(rng, 260, p=0.02)]
    spec, vertex = NODE["discrete"]
    batch = spgk_batch.Batch(graphs, spec, str, 2)
    offsets, dense = spgk_cpu.dense_lengths(batch, "dense")
    # a fresh random graph may have no path at all, and then no dense block to walk
    assert offsets[-1] == -1 and np.all((offsets[:-1] >= 0) | (batch.n_paths[:-1] == 0))
    align, max_nodes, cost = cpu.dense_layout()
    assert max_nodes == 256 and align == 8
    for g in np.flatnonzero(offsets[:-1] >= 0):
        n = batch.n_nodes[g]
        ld = -(-n // align) * align
        L = dense[offsets[g]:offsets[g] + n * ld].reshape(n, ld)
        D = reference_distances(graphs[g])
        D[np.arange(n), np.arange(n)] = np.inf
        assert np.array_equal(L[:, :n], D) and np.all(np.isinf(L[:, n:]))
    auto_offsets, _ = spgk_cpu.dense_lengths(batch, "auto")
    sparse = batch.n_paths < cost * batch.n_nodes * (-(-batch.n_nodes // align) * align)
    assert np.all((auto_offsets == -1) >= sparse)
    K = ShortestPathKernel(node_kernel=spec, method="openmp_out", n_threads=2, cpu_walk="dense")(graphs)
    assert_close(K[:3, :3], reference_gram(graphs[:3], graphs[:3], vertex, "dirac"), 1e-12)
    assert_close(K, ShortestPathKernel(node_kernel=spec, method="fcsp", cpu_walk="edges")(graphs), 1e-13)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_dense_walk_every_instruction_set(rng, isa, monkeypatch):
    """The baseline and AVX2 copies (GRAPHKERN_DENSE_ISA lowers the CPU's choice) agree with the
    edge walk, for both length kernels and both precisions of V."""
    from graphkern._cpu import spgk as cpu
    monkeypatch.setenv("GRAPHKERN_DENSE_ISA", isa)
    graphs = [random_graph(rng, n, p=0.5, weighted=True) for n in (3, 9, 16, 23, 40)]
    spec, _ = NODE["mixed"]
    for edge in ("dirac", "brownian"):
        for dtype, tol in ((np.float64, 1e-13), (np.float32, 1e-5)):
            kw = dict(node_kernel=spec, edge_kernel=EDGE[edge], method="openmp_out", n_threads=2, dtype=dtype)
            K = ShortestPathKernel(**kw, cpu_walk="dense")(graphs)
            assert_close(K, ShortestPathKernel(**kw, cpu_walk="edges")(graphs), tol)
    assert cpu.dense_isa() == isa or (isa != "baseline" and cpu.dense_isa() in ("baseline", "avx2"))


def test_dense_walk_isa_and_bad_walk(rng):
    from graphkern._cpu import spgk as cpu
    assert cpu.dense_isa() in ("avx512", "avx2", "baseline")
    with pytest.raises(ValueError, match="cpu_walk must be one of"):
        ShortestPathKernel(cpu_walk="fast")([random_graph(rng, 4)])
    k = ShortestPathKernel(cpu_walk="edges")
    assert k.get_params()["cpu_walk"] == "edges" and "cpu_walk='edges'" in repr(k)
