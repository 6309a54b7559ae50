"""The GEMM GPU solver of the marginalized graph kernel (techniques="gemm", and "auto" for the pairs it
wins) against the dense float64 solve, the CPU solver and an independent factorized float64 CG; its
gradients against the CPU gradient and finite differences; its host-side layout, term rules,
sizing, routing and the gradients' switch (on the CPU)."""

import numpy as np
import pytest
from scipy.sparse.linalg import LinearOperator, cg

from graphkern import NotConvergedError
from graphkern.mgk.dense import dense_edge_labels, dense_mgk, dense_mgk_pair, product_system
from graphkern.mgk.gemm import (MAX_CATEGORIES, MAX_GRADIENT_TILE, MAX_TILE, GEMMGPUEngine, _common_categories,
                                 contraction_terms, gemm_data, gemm_wins, gradient_shared_bytes, pair_terms, route_pairs,
                                 shared_bytes, term_counts, tile_of, xmv_flops)
from graphkern.mgk.gradient import EDGE_FORMS
from graphkern.basekernels import Constant, KroneckerDelta, SquareExponential, TensorProduct
from graphkern.graph import Graph
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk.results import solver_arguments

from conftest import sanitized
from test_mgk_gradient import assert_gradient_close, finite_differences

gpu = pytest.mark.gpu
H100_SHARED = 227 * 1024

# edge kernels the solver factorizes (and the node kernel of every test)
EDGE_KERNELS = {
    "constant": lambda: Constant(0.7),
    "kronecker": lambda: TensorProduct(order=KroneckerDelta(0.3)),
    "kronecker-scaled": lambda: TensorProduct(order=KroneckerDelta(0.6), k=Constant(0.8)),
    "kronecker-h0": lambda: TensorProduct(order=KroneckerDelta(0.0)),
    "kronecker-h1": lambda: TensorProduct(order=KroneckerDelta(1.0)),
}
NODE_H = 0.4


def node_kernel():
    return TensorProduct(element=KroneckerDelta(NODE_H))


def labeled_graph(rng, n, density, labels, *, weighted=True, self_loops=True, isolated=0):
    """Edge label "order" drawn from ``labels``; the last ``isolated`` vertices have no edges."""
    core = n - isolated
    edges = [(i, j) for i in range(core) for j in range(i if self_loops else i + 1, core) if rng.random() < density]
    m = len(edges)
    edge_labels = {"order": rng.choice(np.asarray(labels), m) if m else np.zeros(0, dtype=np.int64)}
    G = Graph.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), n,
                         weights=rng.uniform(0.5, 2.0, m) if weighted and m else None,
                         node_labels={"element": rng.integers(0, 3, n)}, edge_labels=edge_labels if m else None)
    if not m:  # Graph's symmetry check cannot reshape empty label columns: attach them afterwards
        G.edge_labels.update(edge_labels)
    return G


def small_set(rng):
    """n = 1, no edges, isolated vertices, 1 / 2 / 5 categories, a category only one graph has,
    unweighted, sizes that are multiples of nothing."""
    return [labeled_graph(rng, 1, 1.0, [1]), labeled_graph(rng, 5, 0.0, [1]),
            labeled_graph(rng, 13, 0.7, [1, 2], isolated=3), labeled_graph(rng, 7, 0.9, [2], weighted=False),
            labeled_graph(rng, 23, 0.5, [1, 2, 3, 4, 5]), labeled_graph(rng, 19, 0.95, [9, 2]),
            labeled_graph(rng, 29, 0.3, [3, 4], weighted=False)]


def rel_err(a, b):
    return np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b)) / np.abs(b))


def kernel(edge, **kw):
    return MarginalizedGraphKernel(node_kernel(), EDGE_KERNELS[edge](), **kw)


def dataset(kern, graphs):
    s = kern._settings()
    return kern._dataset(graphs, s), s


def dense_operator(G1, G2, edge, q):
    """(A1 (x) A2 (.) E) of the dense reference (rows i n2 + j)."""
    M, b, V = product_system(G1, G2, node_kernel().compile(), EDGE_KERNELS[edge]().compile(), q=q)
    D = b / (q * q)
    return np.diag(D / V) - M


def emulated_xmv(d1, d2, g1, g2, X, shape, terms_of=None):
    """The kernel's XMV in NumPy: its terms over the host layout (wt, cat) of both graphs
    (``terms_of(cats1, cats2)``: other terms than the solve's, e.g. a contraction's)."""
    form, scale, h = shape
    n1, n2 = X.shape

    def dense(d, g, n):
        n4, off = int(d.n4[g]), int(d.dense_off[g])
        wt = d.wt[off:off + n4 * n4].reshape(n4, n4).astype(np.float64)
        cat = d.cat[off:off + n4 * n4].reshape(n4, n4).astype(np.int64)
        np.testing.assert_array_equal(wt[n:], 0)  # padding
        np.testing.assert_array_equal(wt[:, n:], 0)
        return wt[:n, :n].T, cat[:n, :n].T  # W[a][k] = wt[k][a]

    W1, C1 = dense(d1, g1, n1)
    W2, C2 = dense(d2, g2, n2)
    cats1 = d1.codes[g1, :d1.n_cats[g1]] if d1.slot is not None else []
    cats2 = d2.codes[g2, :d2.n_cats[g2]] if d2.slot is not None else []
    Y = np.zeros((n1, n2))
    terms = pair_terms(cats1, cats2, form, scale, h) if terms_of is None else terms_of(list(cats1), list(cats2))
    for c1, c2, lam1, lam2, alpha in terms:
        L = W1 * np.where(C1 == c1, 1.0, lam1)
        R = W2 * np.where(C2 == c2, 1.0, lam2)
        Y += alpha * (L @ X @ R.T)
    return Y, len(terms)


def factorized_reference(G1, G2, edge, q, p=1.0):
    """K by float64 CG (SciPy, to 1e-13) with the XMV written as the issue's factorization over every
    label, scale [h W1 X W2^T + (1 - h) sum_c W1^c X W2^cT] (not the solver's regrouped terms)."""
    form = EDGE_KERNELS[edge]().compile().edge_form()
    scale, h = (form[1], 1.0) if form[0] == "constant" else (form[1], form[2])
    W1, W2 = G1.to_scipy().toarray(), G2.to_scipy().toarray()
    L1, L2 = dense_edge_labels(G1, "order"), dense_edge_labels(G2, "order")
    labels = np.union1d(G1.edge_labels["order"], G2.edge_labels["order"])
    n1, n2 = len(W1), len(W2)
    d1, d2 = W1.sum(axis=1) + q, W2.sum(axis=1) + q
    e1, e2 = G1.node_labels["element"], G2.node_labels["element"]
    V = np.where(e1[:, None] == e2[None, :], 1.0, NODE_H)
    D = np.outer(d1, d2)
    masked = [(W1 * (L1 == c), W2 * (L2 == c)) for c in labels]

    def matvec(v):
        X = v.reshape(n1, n2)
        Y = h * (W1 @ X @ W2.T) + (1 - h) * sum((A @ X @ B.T for A, B in masked), np.zeros((n1, n2)))
        return (D / V * X - scale * Y).ravel()

    N = n1 * n2
    A = LinearOperator((N, N), matvec=matvec, dtype=np.float64)
    Minv = LinearOperator((N, N), matvec=lambda v: v / (D / V).ravel(), dtype=np.float64)
    x, info = cg(A, (D * q * q).ravel(), rtol=1e-13, atol=0.0, maxiter=20000, M=Minv)
    assert info == 0
    return p * p * x.sum()


# ---------------------------------------------------------------------------- host side (no GPU)


def test_layout_holds_the_graphs_and_their_categories(rng):
    X = small_set(rng)
    kern = kernel("kronecker", dtype=np.float32, backend="cpu")
    ds, s = dataset(kern, X)
    slot = 0
    d = gemm_data(ds, slot)
    assert gemm_data(ds, slot) is d  # kept on the dataset
    assert gemm_data(ds, None) is not d
    np.testing.assert_array_equal(d.dense_off[:ds.n_graphs], -1)  # nothing laid out before a pair needs it
    d.require([2, 4])
    d.require([4, 0])  # grows
    assert d.included.tolist() == [True, False, True, False, True, False, False]
    assert np.all(d.dense_off[[1, 3, 5, 6]] == -1)
    assert np.all(d.dense_off[[0, 2, 4]] % 16 == 0)  # 16-byte vector loads
    codes_of = {}  # category code -> label, from the kernel's table
    for label, code in kern._tables["edge"]["order"].items():
        codes_of[code] = label
    for g, G in enumerate(X):
        n = G.n_nodes
        labels = np.unique(G.edge_labels["order"])
        assert d.n_cats[g] == len(labels)
        assert sorted(codes_of[c] for c in d.codes[g, :d.n_cats[g]]) == sorted(labels.tolist())
        assert np.all(np.diff(d.codes[g, :d.n_cats[g]]) > 0) and np.all(d.codes[g, d.n_cats[g]:] == -1)
        if not d.included[g]:
            continue
        n4, off = int(d.n4[g]), int(d.dense_off[g])
        assert n4 % 4 == 0 and n4 - 4 < n <= n4
        wt = d.wt[off:off + n4 * n4].reshape(n4, n4)
        np.testing.assert_array_equal(wt[:n, :n].T, G.to_scipy().toarray().astype(np.float32))
        cat = d.cat[off:off + n4 * n4].reshape(n4, n4)[:n, :n].T
        L = dense_edge_labels(G, "order")
        A = G.to_scipy().toarray() != 0
        local_label = np.array([codes_of[c] for c in d.codes[g, :max(d.n_cats[g], 1)]] or [0])
        np.testing.assert_array_equal(local_label[cat[A]], L[A])


@pytest.mark.parametrize("edge", list(EDGE_KERNELS))
def test_factorized_xmv_equals_the_product_system(rng, edge):
    """The kernel's terms over the host layout reproduce (A1 (x) A2 (.) E) of the dense reference."""
    X = small_set(rng) + [labeled_graph(rng, 11, 0.8, [1, 2, 3, 4, 5, 6, 7])]
    q = 0.1
    kern = kernel(edge, dtype=np.float64, backend="cpu", q=q)
    ds, s = dataset(kern, X)
    i, j = np.triu_indices(len(X))
    pairs = np.stack([i, j], axis=1)
    plan = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False)
    assert plan.take.all()
    d1, d2 = plan.data
    d1.require(np.arange(len(X)))
    for k, (a, b) in enumerate(pairs.tolist()):
        G1, G2 = X[a], X[b]
        P = rng.standard_normal((G1.n_nodes, G2.n_nodes))
        Y, n_terms = emulated_xmv(d1, d2, a, b, P, plan.shape)
        expect = dense_operator(G1, G2, edge, q) @ P.ravel()
        np.testing.assert_allclose(Y.ravel(), expect, rtol=1e-12, atol=1e-12 * np.abs(expect).max(initial=1.0))
        assert n_terms == plan.terms[k] <= MAX_CATEGORIES


def test_term_rule_takes_the_fewest_terms():
    # 3 shared categories: G1's own grouping (3 terms) beats h W1 X W2^T + 3 shared terms
    assert len(pair_terms([0, 1, 2], [0, 1, 2], "kronecker", 1.0, 0.5)) == 3
    # one category in G1: one term W1 X (h W2 + (1 - h) W2^c)^T
    assert pair_terms([4], [0, 1, 4, 7], "kronecker", 0.8, 0.5) == [(0, 2, 0.0, 0.5, 0.8)]
    # ... and symmetrically over G2's one category: (h W1 + (1 - h) W1^c) X W2^T
    assert pair_terms([0, 1, 4], [4], "kronecker", 1.0, 0.25) == [(2, 0, 0.25, 0.0, 1.0)]
    # disjoint labels: only h W1 X W2^T
    assert pair_terms([0, 1], [2, 3], "kronecker", 1.0, 0.3) == [(-1, -1, 1.0, 1.0, 0.3)]
    # h = 0: equal labels only; nothing in common, nothing to multiply
    assert pair_terms([0, 1], [2, 3], "kronecker", 1.0, 0.0) == []
    assert pair_terms([0, 1, 5], [5, 1], "kronecker", 1.0, 0.0) == [(1, 1, 0.0, 0.0, 1.0), (2, 0, 0.0, 0.0, 1.0)]
    assert pair_terms([], [0, 1], "kronecker", 1.0, 0.5) == []  # G1 has no edges
    assert pair_terms([], [], "constant", 0.7, 1.0) == [(-1, -1, 1.0, 1.0, 0.7)]
    assert pair_terms([0], [0], "kronecker", 0.0, 0.5) == [] and pair_terms([], [], "constant", 0.0, 1.0) == []
    rng = np.random.default_rng(5)
    for _ in range(200):
        c1 = sorted(rng.choice(10, rng.integers(0, 8), replace=False).tolist())
        c2 = sorted(rng.choice(10, rng.integers(0, 8), replace=False).tolist())
        h = float(rng.choice([0.0, 0.5]))
        common = len(set(c1) & set(c2))
        n = len(pair_terms(c1, c2, "kronecker", 1.0, h))
        assert n == term_counts("kronecker", 1.0, h, len(c1), len(c2), common)
        assert n == (common if h == 0 else min(1 + common, len(c1), len(c2)))


def test_tiles_and_shared_memory():
    assert tile_of(1, 1) == 1 and tile_of(16, 3) == 1 and tile_of(17, 3) == 2 and tile_of(96, 95) == 6
    assert tile_of(np.array([128, 129]), np.array([1, 1])).tolist() == [8, 9]
    header = 128 + 320 + 16 + 16 + 16
    assert shared_bytes(4, 6, 3, 2) == header + 3 * 96 * 96 * 4
    # every entry point fits a 227 KB block with a node program of the largest size
    assert shared_bytes(4, MAX_TILE[4], 150, 150) <= H100_SHARED
    assert shared_bytes(8, MAX_TILE[8], 150, 150) <= H100_SHARED
    assert shared_bytes(8, MAX_TILE[8] + 1, 0, 0) > H100_SHARED


def test_routing_by_cost_form_size_and_categories(rng):
    dense = [labeled_graph(rng, 96, 0.9, [0, 1, 2]) for _ in range(2)]
    medium = [labeled_graph(rng, 60, 0.3, [0, 1, 2])]
    sparse = [labeled_graph(rng, 96, 0.05, [0, 1, 2]) for _ in range(2)]
    big = [labeled_graph(rng, 129, 0.9, [0, 1])]
    many = [labeled_graph(rng, 40, 0.9, list(range(MAX_CATEGORIES + 1)))]
    X = dense + medium + sparse + big + many
    i, j = np.triu_indices(len(X))
    pairs = np.stack([i, j], axis=1)
    kern = kernel("kronecker", dtype=np.float32, backend="cpu")
    ds, s = dataset(kern, X)
    everything = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False)
    by_cost = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=True)
    kind = ["dense", "dense", "medium", "sparse", "sparse", "big", "many"]
    for k, (a, b) in enumerate(pairs.tolist()):
        fits = "big" not in (kind[a], kind[b]) and "many" not in (kind[a], kind[b])
        assert everything.take[k] == fits, (kind[a], kind[b])
        nnz = ds.n_entries
        wins = gemm_wins(everything.terms[k], X[a].n_nodes, X[b].n_nodes, nnz[a], nnz[b])
        assert by_cost.take[k] == (fits and wins)
    # shared categories by bit masks and by comparing codes agree
    d = everything.data[0]
    by_masks = _common_categories(d, d, pairs[:, 0], pairs[:, 1])
    masks, d.masks = d.masks, None
    assert masks is not None
    np.testing.assert_array_equal(by_masks, _common_categories(d, d, pairs[:, 0], pairs[:, 1]))
    d.masks = masks
    # dense and medium pairs win, pairs of the sparse graphs (Barabasi-Albert-like density) do not
    taken = {(kind[a], kind[b]) for (a, b), t in zip(pairs.tolist(), by_cost.take) if t}
    assert {("dense", "dense"), ("dense", "medium"), ("medium", "medium")} <= taken
    assert ("sparse", "sparse") not in taken
    assert np.all(by_cost.terms[~by_cost.take] == 0)
    # the 96-vertex dense pair: 3 terms of 2 x 2 x 96^3 flops
    k = int(np.flatnonzero((pairs[:, 0] == 0) & (pairs[:, 1] == 1))[0])
    assert by_cost.terms[k] == 3 and xmv_flops(3, 96, 96) == 2 * 3 * 2 * 96 ** 3
    # float64 stops at tile 6 (96 vertices), a small shared memory at smaller tiles
    kern64 = kernel("kronecker", dtype=np.float64, backend="cpu")
    ds64, s64 = dataset(kern64, [dense[0], labeled_graph(rng, 97, 0.9, [0]), medium[0]])
    p64 = np.array([[0, 0], [0, 1], [2, 2]])
    assert route_pairs(ds64, ds64, p64, s64, solver_arguments(ds64, ds64, s64), shared_limit=H100_SHARED, by_cost=False).take.tolist() == [True, False,
                                                                                                        True]
    small_shared = int(shared_bytes(8, 4, 64, 64))
    assert route_pairs(ds64, ds64, p64, s64, solver_arguments(ds64, ds64, s64), shared_limit=small_shared, by_cost=False).take.tolist() == [False, False,
                                                                                                        True]


@pytest.mark.parametrize("edge_kernel", [TensorProduct(order=SquareExponential(1.0)),
                                         TensorProduct(order=KroneckerDelta(0.5), length=SquareExponential(1.0))])
def test_other_edge_forms_are_not_taken(rng, edge_kernel):
    X = [labeled_graph(rng, 30, 0.9, [1, 2]) for _ in range(2)]
    for G in X:
        G.edge_labels["length"] = rng.uniform(1, 2, G.nnz)
    kern = MarginalizedGraphKernel(node_kernel(), edge_kernel, backend="cpu")
    ds, s = dataset(kern, X)
    plan = route_pairs(ds, ds, np.array([[0, 1]]), s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED,
                       by_cost=False)
    assert not plan.take.any() and plan.shape is None


def test_gemm_technique_is_accepted_and_leaves_the_cpu_alone(rng):
    X = small_set(rng)[:4]
    kern = kernel("kronecker", q=0.1, tol=1e-13, dtype=np.float64, backend="cpu", techniques="gemm")
    assert kern.get_params()["techniques"] == "gemm"
    ref = dense_mgk(X, None, node_kernel().compile(), EDGE_KERNELS["kronecker"]().compile(), q=0.1)
    assert rel_err(kern(X), ref) < 1e-10
    with pytest.raises(ValueError, match="unknown preset"):
        kernel("kronecker", techniques="gem")


def test_gradient_tiles_and_shared_memory():
    header = 256 + 352 + 16 + 16 + 16
    assert gradient_shared_bytes(4, 6, 3, 2) == header + 5 * 96 * 96 * 4
    assert gradient_shared_bytes(4, 6, 3, 2, directions=1) == header + 3 * 96 * 96 * 4  # sequential solves
    # every gradient entry point fits a 227 KB block with a node program of the largest size; one tile more does not
    for itemsize in (4, 8):
        assert gradient_shared_bytes(itemsize, MAX_GRADIENT_TILE[itemsize], 150, 150) <= H100_SHARED
        assert gradient_shared_bytes(itemsize, MAX_GRADIENT_TILE[itemsize] + 1, 0, 0) > H100_SHARED
        assert MAX_GRADIENT_TILE[itemsize] <= MAX_TILE[itemsize]


@pytest.mark.parametrize("mode", ["sequential", "lockstep"])
def test_gradient_routing(rng, monkeypatch, mode):
    from graphkern.mgk import csr as _mgk_csr

    directions = _mgk_csr.gradient_entry(mode)[1]
    X = [labeled_graph(rng, 96, 0.9, [0, 1, 2]), labeled_graph(rng, 97, 0.9, [0]), labeled_graph(rng, 64, 0.5, [1]),
         labeled_graph(rng, 65, 0.5, [1, 2]), labeled_graph(rng, 30, 0.9, list(range(MAX_CATEGORIES + 1)))]
    pairs = np.array([[0, 0], [0, 1], [2, 2], [2, 3], [4, 4], [0, 2]])
    for dtype, expect in ((np.float32, [True, False, True, True, False, True]),
                          (np.float64, [False, False, True, False, False, False])):
        kern = kernel("kronecker", dtype=dtype, backend="cpu", gradient_solves=mode, gradient_dtype=None)
        ds, s = dataset(kern, X)
        route = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False, gradient=True)
        assert route.take.tolist() == expect, dtype
        k_route = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False)
        assert np.all(k_route.take >= route.take)  # gradients take a subset of what K takes
        np.testing.assert_array_equal(route.terms[route.take], k_route.terms[route.take])
        small = int(gradient_shared_bytes(np.dtype(dtype).itemsize, 4, 64, 64, directions))
        limited = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=small, by_cost=False, gradient=True)
        assert limited.take.tolist() == [False, False, True, False, False, False]  # only tiles <= 4
    # h = 1: the solve's terms are a constant kernel's, but the layout keeps the categories that the
    # contraction of the derivative by h needs
    kern = kernel("kronecker-h1", dtype=np.float32, backend="cpu")
    ds, s = dataset(kern, X)
    route = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False, gradient=True)
    assert route.shape[0] == "constant" and route.data[0].slot is not None
    assert route.take.tolist() == [True, False, True, True, False, True]
    assert route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False).data[0].slot is None


@pytest.mark.parametrize("edge", list(EDGE_KERNELS))
def test_contraction_terms_equal_the_derivative_operators(rng, edge):
    """Each edge contraction's terms over the host layout reproduce (A1 (x) A2 (.) dE) of the dense
    reference: the base kernel (scale 1) and the Kronecker delta's derivative by h, 1 - delta."""
    X = small_set(rng) + [labeled_graph(rng, 11, 0.8, list(range(MAX_CATEGORIES)))]
    kern = kernel(edge, dtype=np.float64, backend="cpu")
    ds, s = dataset(kern, X)
    i, j = np.triu_indices(len(X))
    pairs = np.stack([i, j], axis=1)
    route = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=False, gradient=True)
    assert route.take.all()
    d1, _ = route.data
    d1.require(np.arange(len(X)))
    form = EDGE_KERNELS[edge]().compile().edge_form()
    h = form[2] if form[0] == "kronecker" else 1.0
    contractions = [(EDGE_FORMS["constant"], 1.0, lambda e1, e2: np.ones_like(e1, dtype=np.float64))]
    if form[0] == "kronecker":
        contractions = [(EDGE_FORMS["kronecker"], h, lambda e1, e2: np.where(e1 == e2, 1.0, h)),
                        (EDGE_FORMS["kronecker_derivative"], 0.0, lambda e1, e2: np.where(e1 == e2, 0.0, 1.0))]
    for a, b in pairs.tolist():
        G1, G2 = X[a], X[b]
        W1, W2 = G1.to_scipy().toarray(), G2.to_scipy().toarray()
        L1, L2 = dense_edge_labels(G1, "order"), dense_edge_labels(G2, "order")
        P = rng.standard_normal((G1.n_nodes, G2.n_nodes))
        for cform, theta, edge_kernel in contractions:
            Y, n_terms = emulated_xmv(d1, d1, a, b, P, route.shape,
                                      terms_of=lambda c1, c2: contraction_terms(c1, c2, cform, theta))
            E = edge_kernel(L1[:, None, :, None], L2[None, :, None, :])  # [a][b][i][j]
            expect = np.einsum("ai,bj,abij,ij->ab", W1, W2, E, P)
            np.testing.assert_allclose(Y, expect, rtol=1e-12, atol=1e-12 * np.abs(expect).max(initial=1.0))
            assert n_terms <= MAX_CATEGORIES + 1
    with pytest.raises(ValueError, match="no contraction of form"):
        contraction_terms([0], [0], EDGE_FORMS["sqexp"], 1.0)


@gpu
def test_gradient_chain_follows_the_switch():
    """techniques="gemm" runs gradients on the GEMM solver; "auto" too unless gemm_gradients=False
    (then the CSR and core solvers take them)."""
    for techniques, switch, expect in (("gemm", False, ["gemm", "csr", "core"]), ("auto", True, ["gemm", "csr", "core"]),
                                       ("auto", False, ["csr", "core"])):
        kern = kernel("kronecker", backend="gpu", techniques=techniques, gemm_gradients=switch)
        assert [name for name, _ in kern._router(kern._settings()).gradient_chain()] == expect


def test_gradient_switch_is_checked():
    with pytest.raises(TypeError, match="gemm_gradients must be True or False"):
        kernel("kronecker", gemm_gradients="no")


# ---------------------------------------------------------------------------- the GPU solver


def gemm_engine_of(kern):
    engine = kern._router(kern._settings()).chain[0][1]
    assert type(engine).__name__ == "GEMMGPUEngine"
    return engine


@gpu
@pytest.mark.parametrize("edge", list(EDGE_KERNELS))
def test_gram_matrix_against_dense_and_cpu(rng, edge):
    X = small_set(rng)
    q = 0.05
    ref = dense_mgk(X, None, node_kernel().compile(), EDGE_KERNELS[edge]().compile(), q=q)
    kern = kernel(edge, q=q, tol=1e-13, dtype=np.float64, backend="gpu", techniques="gemm")
    K64 = kern(X)
    assert K64.dtype == np.float64 and kern.info_.backend == "gpu"
    assert rel_err(K64, ref) < 1e-10
    np.testing.assert_array_equal(K64, K64.T)
    cpu = kernel(edge, q=q, tol=1e-13, dtype=np.float64, backend="cpu")(X)
    assert rel_err(K64, cpu) < 1e-10
    # every pair ran on the GEMM solver
    i, j = np.triu_indices(len(X))
    assert kern.info_.solvers == {"gemm": len(i)}
    K32 = kernel(edge, q=q, backend="gpu", techniques="gemm")(X)
    assert K32.dtype == np.float32
    assert rel_err(K32, ref) < 2e-5


@gpu
@pytest.mark.parametrize("dtype,tol,bound", [(np.float32, None, 2e-5), (np.float64, 1e-13, 1e-10)])
def test_rectangular_pairs_and_nodal(rng, dtype, tol, bound):
    X = [labeled_graph(rng, n, 0.8, labels) for n, labels in ((3, [1]), (10, [1, 2]), (33, [1, 2, 3, 4, 5]))]
    Y = [labeled_graph(rng, n, 0.6, labels) for n, labels in ((1, [2]), (8, [2, 7]), (21, [5]), (6, [1, 3]))]
    Y.append(labeled_graph(rng, 6, 0.0, [1]))
    q, p = 0.1, 0.5
    kern = kernel("kronecker-scaled", q=q, p=p, tol=tol, dtype=dtype, backend="gpu", techniques="gemm")
    nk, ek = node_kernel().compile(), EDGE_KERNELS["kronecker-scaled"]().compile()
    K = kern(X, Y)
    ref = np.array([[dense_mgk_pair(a, b, nk, ek, p=p, q=q) for b in Y] for a in X])
    assert K.shape == (3, 5) and rel_err(K, ref) < bound
    R = kern(X, Y, nodal=True)
    assert R.dtype == dtype and R.shape == (sum(g.n_nodes for g in X), sum(g.n_nodes for g in Y))
    ox = np.concatenate([[0], np.cumsum([g.n_nodes for g in X])])
    oy = np.concatenate([[0], np.cumsum([g.n_nodes for g in Y])])
    for a, G1 in enumerate(X):
        for b, G2 in enumerate(Y):
            block = R[ox[a]:ox[a + 1], oy[b]:oy[b + 1]]
            expect = dense_mgk_pair(G1, G2, nk, ek, p=p, q=q, nodal=True)
            assert np.all(np.isfinite(block))
            assert np.max(np.abs(block - expect)) / np.max(np.abs(expect)) < bound
            assert abs(block.sum(dtype=np.float64) - ref[a, b]) / ref[a, b] < bound
    listed = kern(X, Y, pairs=[(2, 0), (0, 3), (2, 2)], nodal=True)
    assert [r.shape for r in listed] == [(33, 1), (3, 6), (33, 21)]
    np.testing.assert_allclose(listed[2], R[ox[2]:ox[3], oy[2]:oy[3]], rtol=1e-6 if dtype == np.float32 else 1e-12)


@gpu
@pytest.mark.parametrize("edge", ["kronecker", "constant", "kronecker-h0"])
def test_every_tile_on_dense_and_medium_graphs(rng, edge):
    """Sizes at and past the tile edges (16 R), up to 128 vertices in float32 and 96 in float64,
    against a factorized float64 CG over every label (the issue's formula, not the solver's terms)."""
    sizes = (16, 17, 48, 64, 95, 96, 113, 128)
    densities = (0.9, 0.3, 0.9, 0.5, 0.9, 0.95, 0.4, 0.9)
    label_sets = ([0], [0, 1], [0, 1, 2, 3, 4], [1, 2], [0, 1, 2], [2, 5], [0, 1, 2], [1, 2, 3])
    # under racecheck tiles 2, 3, 6 (float64's largest) and 8 (float32's largest) once each, the 96- and
    # 113-vertex graphs sparse enough that float64's fallback pairs fit the CSR solver (the core
    # solver's octile products on dense pairs, one warp a pair, are the costliest there)
    sizes = sanitized(sizes, sizes, race=(17, 48, 96, 113))
    densities = sanitized(densities, densities, race=(0.3, 0.9, 0.2, 0.05))
    label_sets = sanitized(label_sets, label_sets, race=([0, 1], [0, 1, 2, 3, 4], [2, 5], [0, 1, 2]))
    X = [labeled_graph(rng, n, density, labels, weighted=bool(k % 2))
         for k, (n, density, labels) in enumerate(zip(sizes, densities, label_sets))]
    q = 0.2
    kern = kernel(edge, q=q, backend="gpu", techniques="gemm")
    K32 = kern(X)
    i, j = np.triu_indices(len(X))
    ref = np.zeros((len(X), len(X)))
    for a, b in zip(i.tolist(), j.tolist()):
        ref[a, b] = ref[b, a] = factorized_reference(X[a], X[b], edge, q)
    # a NumPy model of the kernel's float32 arithmetic gave 2e-8..2e-7 on such pairs
    assert rel_err(K32, ref) < 5e-5
    assert kern.info_.solvers == {"gemm": len(i)}
    # float64: tiles up to 6; pairs with a 113- or 128-vertex graph run on the fallback solver
    kern64 = kernel(edge, q=q, tol=1e-12, dtype=np.float64, backend="gpu", techniques="gemm")
    K64 = kern64(X)
    assert rel_err(K64, ref) < 1e-9
    small = (np.array(sizes)[i] <= 96) & (np.array(sizes)[j] <= 96)
    assert kern64.info_.solvers["gemm"] == int(small.sum())
    assert kern64.info_.solvers.get("csr", 0) + kern64.info_.solvers.get("core", 0) == int((~small).sum())


# dense and sparse graphs of the routing tests, and their q; under racecheck the dense ones small (few entry
# pairs on the CSR solver's float64 gradient, which takes their pairs: the core solver's octile products,
# costliest there, run none) but dense enough that the GEMM solver wins every pair of them, and q = 0.5
ROUTED_DENSE = sanitized((40, 57, 64), (40, 57, 64), race=(14, 18))
ROUTED_SPARSE, ROUTED_Q = sanitized(((50, 60), 0.1), ((50, 60), 0.1), race=((30, 36), 0.5))


@gpu
def test_auto_routes_dense_pairs_here_and_sparse_pairs_to_csr(rng, monkeypatch):
    dense = [labeled_graph(rng, n, 0.9, [0, 1, 2]) for n in ROUTED_DENSE]
    sparse = [labeled_graph(rng, n, 0.04, [0, 1, 2]) for n in ROUTED_SPARSE]
    X = dense + sparse
    q = ROUTED_Q
    auto = kernel("kronecker", q=q, tol=1e-12, dtype=np.float64, backend="gpu")
    K = auto(X)
    cpu = kernel("kronecker", q=q, tol=1e-12, dtype=np.float64, backend="cpu")(X)
    assert rel_err(K, cpu) < 1e-9
    engine = gemm_engine_of(auto)
    assert engine.by_cost and [name for name, _ in auto.last_engine_.chain] == ["gemm", "csr", "tiled"]
    ds, s = dataset(auto, X)
    i, j = np.triu_indices(len(X))
    pairs = np.stack([i, j], axis=1)
    plan = engine.route(ds, ds, pairs, solver_arguments(ds, ds, s))
    assert auto.info_.solvers["gemm"] == int(plan.take.sum()) > 0
    assert auto.info_.solvers["csr"] + auto.info_.solvers.get("tiled", 0) == int((~plan.take).sum()) > 0
    assert all(plan.take[k] for k, (a, b) in enumerate(pairs.tolist()) if max(a, b) < len(dense))
    assert not any(plan.take[k] for k, (a, b) in enumerate(pairs.tolist()) if min(a, b) >= len(dense))
    # with the switch off, gradients are the CSR solver's
    auto.gemm_gradients = False
    assert [name for name, _ in auto._router(auto._settings()).gradient_chain()] == ["csr", "core"]
    csr = kernel("kronecker", q=q, tol=1e-12, dtype=np.float64, backend="gpu", techniques="csr")
    _, dK = auto(X, eval_gradient=True)
    _, dK_csr = csr(X, eval_gradient=True)
    np.testing.assert_allclose(dK, dK_csr, rtol=1e-8, atol=1e-12 * np.abs(dK_csr).max())


@gpu
def test_a_pair_that_does_not_converge_is_reported(rng):
    X = [labeled_graph(rng, n, 0.9, [0, 1]) for n in (30, 41)]
    kern = kernel("kronecker", q=0.01, max_iter=1, backend="gpu", techniques="gemm")
    with pytest.raises(NotConvergedError) as info:
        kern(X)
    err = info.value
    assert len(err.pairs) == 3 and np.all(err.iterations == 1) and np.all(err.residuals > kern._settings()["tol"])
    assert np.all(np.isfinite(err.result))


# ---------------------------------------------------------------------------- GPU gradients

# edge kernels of the gradient tests: h = 0 must be fixed (theta is log h)
GRADIENT_EDGES = {
    "constant": lambda: Constant(0.7),
    "kronecker": lambda: TensorProduct(order=KroneckerDelta(0.3)),
    "kronecker-scaled": lambda: TensorProduct(order=KroneckerDelta(0.6), k=Constant(0.8)),
    "kronecker-h0": lambda: TensorProduct(order=KroneckerDelta(0.0, h_bounds="fixed"), k=Constant(0.8)),
    "kronecker-h1": lambda: TensorProduct(order=KroneckerDelta(1.0)),
}


def gradient_kernel(edge, **kw):
    opts = dict(q=0.1, p=0.8, p_bounds=(1e-2, 1e2), tol=1e-13, dtype=np.float64)
    opts.update(kw)
    return MarginalizedGraphKernel(node_kernel(), GRADIENT_EDGES[edge](), **opts)


def gradient_set(rng):
    """Dense and medium-density graphs up to float64's largest gradient tile (64 vertices), and the
    small cases (one vertex, no edges); under a sanitizer the 33- and 47-vertex ones are left out."""
    X = [labeled_graph(rng, 1, 1.0, [1]), labeled_graph(rng, 5, 0.0, [1]), labeled_graph(rng, 20, 0.9, [0, 1, 2]),
         labeled_graph(rng, 33, 0.3, [1, 2]), labeled_graph(rng, 47, 0.9, [0, 2, 5]),
         labeled_graph(rng, 64, 0.3, [0, 1, 2, 3], weighted=False)]
    return sanitized(X, X[:3] + X[5:])


def solve_gradient_directly(kern, X):
    """The router's gradient solve over every pair of X: (pairs per solver, solution)."""
    s = kern._settings(gradient=True)
    ds = kern._dataset(X, s)
    args = solver_arguments(ds, ds, s)
    plan = kern._gradient_plan(s, ds, args)
    i, j = np.triu_indices(len(X))
    router = kern._router(s)
    sol = router.solve(ds, ds, np.stack([i, j], axis=1), args, plan=plan)
    return router.last_run, sol


@pytest.fixture(params=["lockstep", "sequential"])
def solves(request, monkeypatch):
    """Both ways of running the forward and adjoint solves (``gradient_solves``); returns the mode
    and the names of the kernels launched."""
    from graphkern._cuda import runtime as rt

    launched = []
    real_launch = rt.launch
    monkeypatch.setattr(rt, "launch", lambda fn, *a, **k: (launched.append(fn.name), real_launch(fn, *a, **k))[1])
    return request.param, launched


@gpu
@pytest.mark.parametrize("edge", list(GRADIENT_EDGES))
def test_gradient_against_cpu_and_finite_differences(rng, edge, solves):
    X = gradient_set(rng)
    X = sanitized(X, X, race=X[:2] + X[-1:])  # under racecheck without the 20-vertex graph
    kern = gradient_kernel(edge, backend="gpu", techniques="gemm", gradient_solves=solves[0])
    cpu = gradient_kernel(edge, backend="cpu")
    K, dK = kern(X, eval_gradient=True)
    Kc, dKc = cpu(X, eval_gradient=True)
    assert rel_err(K, Kc) < 1e-9
    np.testing.assert_allclose(dK, dKc, rtol=1e-9, atol=1e-12 * np.abs(dKc).max())
    names = [hp.name for hp in kern.hyperparameters if not hp.fixed]
    if edge != "kronecker-h1":  # h = 1 sits on its upper bound: no central difference there
        # under a sanitizer the differences over the one-vertex, 20- and 64-vertex (largest tile) graphs,
        # under racecheck over the one-vertex and the 64-vertex graph
        fd = sanitized(np.arange(len(X)), np.array([0, 2, len(X) - 1]), race=np.array([0, len(X) - 1]))
        assert_gradient_close(dK[np.ix_(fd, fd)], finite_differences(kern, [X[k] for k in fd]), K[np.ix_(fd, fd)],
                              names)
    # every pair ran on the GEMM solver, each solve within 2 iterations of the CPU's
    ran, sol = solve_gradient_directly(kern, X)
    assert ran == {"gemm": len(sol.K)}
    _, ref = solve_gradient_directly(cpu, X)
    forward, ref_forward = sol.iterations - sol.adjoint_iterations, ref.iterations - ref.adjoint_iterations
    assert np.all(np.abs(forward - ref_forward) <= 2), (forward, ref_forward)
    if solves[0] == "lockstep":
        assert np.all(np.abs(sol.adjoint_iterations - ref.adjoint_iterations) <= 2)
    else:  # the warm start never costs iterations
        assert np.all(sol.adjoint_iterations <= ref.adjoint_iterations + 2)
    np.testing.assert_allclose(sol.gradient, ref.gradient, rtol=1e-9, atol=1e-12 * np.abs(ref.gradient).max())
    entries = {name for name in solves[1] if name.startswith("mgk_gemm_gradient")}
    assert entries and all(name.startswith("mgk_gemm_gradient_seq_") == (solves[0] == "sequential")
                           for name in entries), entries


@gpu
def test_gradient_pairs_that_fall_back_mix_with_pairs_here(rng, solves):
    """float64: a 70-vertex graph (tile 5) and one of 17 edge categories go to the CSR solver's
    gradient in the same call; rectangular X, Y and normalize too."""
    # under racecheck q = 0.5, graphs of 16 vertices (the 17-category one drawn until its edges have every
    # category) and the tile-5 one of 65 at density 0.03 (its pairs fit the CSR solver's gradient)
    n0, n1, n2, n3 = sanitized((40, 70, 30, 50), (40, 70, 30, 50), race=(16, 65, 16, 16))
    X = [labeled_graph(rng, n0, 0.9, [0, 1, 2]), labeled_graph(rng, n1, sanitized(0.5, 0.5, race=0.03), [0, 1]),
         labeled_graph(rng, n2, 0.9, list(range(MAX_CATEGORIES + 1))), labeled_graph(rng, n3, 0.3, [1, 2])]
    while len(np.unique(X[2].edge_labels["order"])) <= MAX_CATEGORIES:
        X[2] = labeled_graph(rng, n2, 0.9, list(range(MAX_CATEGORIES + 1)))
    fast = sanitized({}, {}, race=dict(q=0.5))
    kern = gradient_kernel("kronecker-scaled", backend="gpu", techniques="gemm", gradient_solves=solves[0], **fast)
    cpu = gradient_kernel("kronecker-scaled", backend="cpu", **fast)
    K, dK = kern(X, eval_gradient=True)
    Kc, dKc = cpu(X, eval_gradient=True)
    assert rel_err(K, Kc) < 1e-9
    np.testing.assert_allclose(dK, dKc, rtol=1e-9, atol=1e-12 * np.abs(dKc).max())
    ran, _ = solve_gradient_directly(kern, X)
    assert ran["gemm"] == 3 and ran.get("csr", 0) + ran.get("core", 0) == 7  # (0, 0), (0, 3), (3, 3)
    Y = [labeled_graph(rng, 12, 0.8, [2]), labeled_graph(rng, sanitized(25, 25, race=12), 0.6, [0, 1])]
    for normalize in (False, True):
        g = gradient_kernel("kronecker", backend="gpu", techniques="gemm", normalize=normalize,
                            gradient_solves=solves[0], **fast)
        c = gradient_kernel("kronecker", backend="cpu", normalize=normalize, **fast)
        K, dK = g(X, Y, eval_gradient=True)
        Kc, dKc = c(X, Y, eval_gradient=True)
        assert rel_err(K, Kc) < 1e-9
        np.testing.assert_allclose(dK, dKc, rtol=1e-8, atol=1e-12 * np.abs(dKc).max())


@gpu
@pytest.mark.parametrize("edge", ["constant", "kronecker-scaled"])
def test_float32_gradient_near_cpu_float64(rng, edge, solves):
    """float32 takes tiles up to 6: 96-vertex dense graphs run here too."""
    X = gradient_set(rng)[2:] + [labeled_graph(rng, 96, 0.9, [0, 1, 2]), labeled_graph(rng, 81, 0.5, [1, 2])]
    # under a sanitizer without the 81-vertex graph, under racecheck without the 64-vertex one too
    X = sanitized(X, X[:-1], race=[X[0], X[2]])
    K32, d32 = gradient_kernel(edge, backend="gpu", techniques="gemm", dtype=np.float32, tol=None, gradient_dtype=None,
                               gradient_solves=solves[0])(X, eval_gradient=True)
    K64, d64 = gradient_kernel(edge, backend="cpu")(X, eval_gradient=True)
    assert K32.dtype == d32.dtype == np.float32
    assert rel_err(K32, K64) < 2e-5
    assert np.max(np.abs(d32 - d64)) <= 1e-4 * np.max(np.abs(d64))
    ran, _ = solve_gradient_directly(gradient_kernel(edge, backend="gpu", techniques="gemm", dtype=np.float32,
                                                     tol=None, gradient_dtype=None), X)
    assert list(ran) == ["gemm"]


@gpu
def test_gradient_pair_that_does_not_converge_is_reported(rng):
    X = [labeled_graph(rng, n, 0.9, [0, 1]) for n in (30, 41)]
    kern = gradient_kernel("kronecker", q=0.01, max_iter=1, tol=None, dtype=np.float32, backend="gpu",
                           techniques="gemm", gradient_dtype=None)
    with pytest.raises(NotConvergedError) as info:
        kern(X, eval_gradient=True)
    assert len(info.value.pairs) == 3


@gpu
def test_auto_runs_gradients_here_with_the_switch(rng):
    dense = [labeled_graph(rng, n, 0.9, [0, 1, 2]) for n in ROUTED_DENSE]
    sparse = [labeled_graph(rng, n, 0.04, [0, 1, 2]) for n in ROUTED_SPARSE]
    X = dense + sparse
    csr = gradient_kernel("kronecker", q=ROUTED_Q, backend="gpu", techniques="csr")
    _, dK_csr = csr(X, eval_gradient=True)
    auto = gradient_kernel("kronecker", q=ROUTED_Q, backend="gpu", gemm_gradients=True)
    _, dK = auto(X, eval_gradient=True)
    np.testing.assert_allclose(dK, dK_csr, rtol=1e-8, atol=1e-12 * np.abs(dK_csr).max())
    ran, _ = solve_gradient_directly(auto, X)
    assert ran["gemm"] > 0 and ran["csr"] + ran.get("core", 0) > 0
