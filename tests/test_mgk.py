"""Marginalized graph kernel: CPU and GPU solvers against a dense float64 solve of the product system."""

import numpy as np
import pytest

from graphkern import NotConvergedError
from graphkern.mgk.data import OCTILE, build_octiles
from graphkern.mgk.dense import dense_mgk, dense_mgk_pair, product_system
from graphkern.basekernels import Additive, Constant, KroneckerDelta, SquareExponential, TensorProduct
from graphkern.graph import Graph
from graphkern.mgk import MarginalizedGraphKernel

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]

# One kernel pair per solver path: the constant (factorized) edge kernel, the Kronecker and
# square-exponential shortcuts, and the general interpreter (vector labels, sums of products).
KERNELS = {
    "unlabeled": (Constant(1.0), Constant(1.0)),
    "kronecker": (TensorProduct(element=KroneckerDelta(0.4)), TensorProduct(order=KroneckerDelta(0.3))),
    "sqexp": (TensorProduct(element=KroneckerDelta(0.5), charge=SquareExponential(1.2)),
              TensorProduct(length=SquareExponential(0.6), k=Constant(0.8))),
    "general": (Additive(element=KroneckerDelta(0.3), coords=SquareExponential(1.5)),
                TensorProduct(order=KroneckerDelta(0.5), length=SquareExponential(0.9))),
}


def random_graph(rng, n, density=0.3, *, self_loops=True, weighted=True, components=1):
    """A labeled, weighted graph; ``components`` > 1 splits the vertices into unconnected blocks."""
    block = rng.integers(0, components, n) if components > 1 else np.zeros(n, dtype=int)
    edges = [(i, j) for i in range(n) for j in range(i if self_loops else i + 1, n)
             if block[i] == block[j] and rng.random() < density]
    m = len(edges)
    edge_labels = {"order": rng.integers(1, 4, m), "length": rng.uniform(1.0, 2.0, m)}
    G = Graph.from_edges(
        np.array(edges, dtype=np.int64).reshape(-1, 2), n,
        weights=rng.uniform(0.5, 2.0, m) if weighted and m else None,
        node_labels={"element": rng.integers(0, 3, n), "charge": rng.normal(size=n),
                     "coords": rng.normal(size=(n, 3))},
        edge_labels=edge_labels if m else None)
    if not m:  # Graph's symmetry check cannot reshape empty label columns yet: attach them afterwards
        G.edge_labels.update(edge_labels)
    return G


def graph_set(rng):
    """Self-loops, a disconnected graph, a single vertex, an unweighted graph and very different sizes."""
    return [random_graph(rng, 1), random_graph(rng, 2, 0.9), random_graph(rng, 9, components=3),
            random_graph(rng, 12, weighted=False), random_graph(rng, 17, 0.25), random_graph(rng, 40, 0.08)]


def programs(name):
    nk, ek = KERNELS[name]
    return nk.compile(), ek.compile()


def rel_err(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.abs(b))


# ---------------------------------------------------------------------------- the reference itself


def test_dense_reference_equals_walk_sum(rng):
    """The dense solve against the series sum over walks, built by explicit loops over the edges."""
    G1, G2 = random_graph(rng, 5, 0.6), random_graph(rng, 4, 0.7)
    nk, ek = KERNELS["general"]
    q, p = 0.3, 0.7
    n1, n2 = G1.n_nodes, G2.n_nodes
    A1, A2 = G1.to_scipy().toarray(), G2.to_scipy().toarray()
    W = np.zeros((n1 * n2, n1 * n2))
    for i in range(n1):
        for k1 in range(G1.indptr[i], G1.indptr[i + 1]):
            j = G1.indices[k1]
            for i2 in range(n2):
                for k2 in range(G2.indptr[i2], G2.indptr[i2 + 1]):
                    j2 = G2.indices[k2]
                    e = ek({c: G1.edge_labels[c][k1] for c in ("order", "length")},
                           {c: G2.edge_labels[c][k2] for c in ("order", "length")})
                    W[i * n2 + i2, j * n2 + j2] = G1.weights[k1] * G2.weights[k2] * e
    v = np.array([[nk({"element": G1.node_labels["element"][i], "coords": G1.node_labels["coords"][i]},
                      {"element": G2.node_labels["element"][i2], "coords": G2.node_labels["coords"][i2]},
                      vector_columns={"coords"}) for i2 in range(n2)] for i in range(n1)]).ravel()
    d = np.outer(A1.sum(1) + q, A2.sum(1) + q).ravel()
    step = (v / d)[:, None] * W         # one step of the walk with vertex kernels: V D^-1 (A (.) E)
    term = v * q * q                    # walks of length 0: V q_x (q_x = q (x) q)
    x = np.zeros_like(term)
    while np.abs(term).sum() > 1e-18:
        x += term
        term = step @ term
    want = p * p * x.sum()
    got = dense_mgk_pair(G1, G2, nk.compile(), ek.compile(), p=p, q=q)
    assert abs(got - want) <= 1e-12 * want


# ---------------------------------------------------------------------------- solvers vs reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_gram_matrix_against_dense_reference(rng, backend, name):
    X = graph_set(rng)
    nk, ek = KERNELS[name]
    ref = dense_mgk(X, None, *programs(name), q=0.05)
    K64 = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend=backend)(X)
    assert K64.dtype == np.float64
    assert rel_err(K64, ref) < 1e-10
    K32 = MarginalizedGraphKernel(nk, ek, q=0.05, backend=backend)(X)
    assert K32.dtype == np.float32
    assert rel_err(K32, ref) < 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["kronecker", "general"])
def test_graphs_without_edges_need_no_edge_columns(rng, backend, name):
    """A graph without edges has every edge label, empty (a one-atom molecule from networkx carries
    none): the kernel equals the one of the same graphs with the empty columns attached, in any
    position of X and Y, also when no graph of a list has an edge."""
    X = [random_graph(rng, 1, 0.0)] + graph_set(rng) + [random_graph(rng, 4, 0.0)]
    bare = [Graph(g.indptr, g.indices, g.weights, node_labels=dict(g.node_labels)) if g.nnz == 0 else g for g in X]
    assert not bare[0].edge_labels and not bare[-1].edge_labels and X[0].edge_labels
    nk, ek = KERNELS[name]
    kern = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend=backend)
    want = kern(X)
    np.testing.assert_array_equal(kern(bare), want)
    np.testing.assert_array_equal(kern(bare[-1:], bare), kern(X[-1:], X))
    np.testing.assert_array_equal(kern(bare[:1]), kern(X[:1]))
    np.testing.assert_allclose(kern(bare[::-1]), want[::-1, ::-1], rtol=1e-12)
    with pytest.raises(KeyError, match="has no edge label 'order'"):
        kern([Graph(g.indptr, g.indices, g.weights, node_labels=dict(g.node_labels)) for g in X])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rectangular_and_pairs(rng, backend):
    X = [random_graph(rng, n) for n in (3, 10, 14)]
    Y = [random_graph(rng, n) for n in (1, 8, 21, 5)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.1, p=0.5, tol=1e-13, dtype=np.float64, backend=backend)
    ref = dense_mgk(X, Y, *programs("kronecker"), p=0.5, q=0.1)
    K = kern(X, Y)
    assert K.shape == (3, 4)
    assert rel_err(K, ref) < 1e-10
    pairs = np.array([[2, 1], [0, 3], [2, 1], [1, 0]])
    np.testing.assert_allclose(kern(X, Y, pairs=pairs), ref[pairs[:, 0], pairs[:, 1]], rtol=1e-10)
    sym_pairs = np.array([[1, 2], [0, 0]])
    ref_xx = dense_mgk(X, None, *programs("kronecker"), p=0.5, q=0.1)
    np.testing.assert_allclose(kern(X, pairs=sym_pairs), ref_xx[sym_pairs[:, 0], sym_pairs[:, 1]], rtol=1e-10)
    assert kern(X, Y, pairs=np.zeros((0, 2), dtype=int)).shape == (0,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_symmetric_positive_semidefinite(rng, backend):
    X = [random_graph(rng, int(n)) for n in rng.integers(1, 16, 10)]
    nk, ek = KERNELS["general"]
    K = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-12, dtype=np.float64, backend=backend)(X)
    np.testing.assert_array_equal(K, K.T)
    assert np.all(K > 0)
    assert np.linalg.eigvalsh(K).min() > -1e-10 * np.abs(K).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vertex_permutation_invariance(rng, backend):
    X = [random_graph(rng, n) for n in (7, 13, 20)]
    Xp = [g.permute(rng.permutation(g.n_nodes)) for g in X]
    nk, ek = KERNELS["general"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend=backend)
    np.testing.assert_allclose(kern(Xp, X), kern(X), rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_stopping_probability_converges(rng, backend):
    """q = 5e-4: the system is ill-conditioned (condition ~ deg / q), still solved."""
    X = [random_graph(rng, n, 0.2, weighted=False) for n in (6, 15, 24)]
    nk, ek = KERNELS["unlabeled"]
    ref = dense_mgk(X, None, *programs("unlabeled"), q=5e-4)
    kern = MarginalizedGraphKernel(nk, ek, q=5e-4, tol=1e-13, dtype=np.float64, backend=backend)
    assert rel_err(kern(X), ref) < 1e-9
    # float32 converges too; its accuracy is bounded by rounding the system (~1e-7 deg / q)
    K32 = MarginalizedGraphKernel(nk, ek, q=5e-4, backend=backend)(X)
    assert rel_err(K32, ref) < 5e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_nodal_matches_reference_and_sums_to_graph_value(rng, backend):
    X = [random_graph(rng, n) for n in (1, 6, 11)]
    Y = [random_graph(rng, n) for n in (4, 9)]
    nk, ek = KERNELS["sqexp"]
    node_p, edge_p = programs("sqexp")
    kern = MarginalizedGraphKernel(nk, ek, q=0.05, p=0.8, tol=1e-13, dtype=np.float64, backend=backend)
    R = kern(X, Y, nodal=True)
    K = kern(X, Y)
    offx = np.cumsum([0] + [g.n_nodes for g in X])
    offy = np.cumsum([0] + [g.n_nodes for g in Y])
    assert R.shape == (offx[-1], offy[-1])
    for a, G1 in enumerate(X):
        for b, G2 in enumerate(Y):
            block = R[offx[a]:offx[a + 1], offy[b]:offy[b + 1]]
            ref = dense_mgk_pair(G1, G2, node_p, edge_p, p=0.8, q=0.05, nodal=True)
            np.testing.assert_allclose(block, ref, rtol=1e-9)
            # K = p^T X p' with X the per-start-pair similarity: the nodal block sums to K
            assert abs(block.sum() - K[a, b]) <= 1e-12 * K[a, b]
    # symmetric nodal: the lower blocks are the transposes of the solved upper ones
    Rs = kern(X, nodal=True)
    np.testing.assert_allclose(Rs, Rs.T, rtol=1e-12)
    blocks = kern(X, Y, nodal=True, pairs=[[2, 1], [0, 0]])
    np.testing.assert_allclose(blocks[0], R[offx[2]:offx[3], offy[1]:offy[2]], rtol=1e-12)
    assert blocks[1].shape == (1, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalize_and_diag(rng, backend):
    X = [random_graph(rng, n) for n in (3, 8, 12)]
    Y = [random_graph(rng, n) for n in (5, 1)]
    nk, ek = KERNELS["kronecker"]
    raw = MarginalizedGraphKernel(nk, ek, tol=1e-13, dtype=np.float64, backend=backend)
    kern = MarginalizedGraphKernel(nk, ek, tol=1e-13, dtype=np.float64, backend=backend, normalize=True)
    dx, dy = raw.diag(X), raw.diag(Y)
    np.testing.assert_allclose(dx, np.diag(raw(X)), rtol=1e-12)
    np.testing.assert_allclose(kern(X), raw(X) / np.sqrt(np.outer(dx, dx)), rtol=1e-10)
    np.testing.assert_allclose(np.diag(kern(X)), 1.0, rtol=1e-12)
    np.testing.assert_allclose(kern(X, Y), raw(X, Y) / np.sqrt(np.outer(dx, dy)), rtol=1e-10)
    np.testing.assert_allclose(kern(X, Y, pairs=[[1, 0]]), raw(X, Y)[1, 0] / np.sqrt(dx[1] * dy[0]), rtol=1e-10)
    np.testing.assert_array_equal(kern.diag(X), np.ones(3))
    R = kern(X, Y, nodal=True)
    np.testing.assert_allclose(R[:3, :5].sum(), kern(X, Y)[0, 0], rtol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_convergence_is_reported(rng, backend):
    X = [random_graph(rng, n, 0.4) for n in (10, 12)]
    nk, ek = KERNELS["unlabeled"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.01, max_iter=2, backend=backend)
    with pytest.raises(NotConvergedError, match=r"did not converge within max_iter=2") as info:
        kern(X)
    err = info.value
    assert len(err.pairs) == 3 and err.pairs.shape == (3, 2)
    assert np.all(err.residuals > 1e-6) and np.all(err.iterations == 2)
    assert err.result.shape == (2, 2) and np.all(np.isfinite(err.result))
    np.testing.assert_array_equal(kern.info_.iterations, 2)


def test_info_record(rng):
    X = [random_graph(rng, n) for n in (4, 9)]
    kern = MarginalizedGraphKernel(*KERNELS["kronecker"], backend="cpu")
    kern(X)
    info = kern.info_
    assert info.backend == "cpu" and info.edge_form == "kronecker"
    np.testing.assert_array_equal(info.pairs, [[0, 0], [0, 1], [1, 1]])
    np.testing.assert_array_equal(info.product_sizes, [16, 36, 81])
    assert np.all(info.residuals <= 1e-6) and info.total_iterations == info.iterations.sum() > 0


def test_threads_do_not_change_the_result(rng):
    X = [random_graph(rng, int(n)) for n in rng.integers(1, 20, 9)]
    nk, ek = KERNELS["general"]
    one = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu", n_threads=1)(X)
    two = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu", n_threads=2)(X)
    np.testing.assert_array_equal(one, two)


# ---------------------------------------------------------------------------- datasets and caching


def test_dataset_is_packed_once_and_reused(rng):
    X = [random_graph(rng, n) for n in (5, 9)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="cpu")
    kern(X)
    (ds,) = kern._datasets._entries.values()
    kern.q = 0.2  # a new hyperparameter reuses the packed dataset and gives the new kernel
    K = kern(X)
    (entry,) = kern._datasets._entries.values()
    assert entry is ds
    assert rel_err(K, dense_mgk(X, None, *programs("kronecker"), q=0.2)) < 1e-10
    X[0].edge_labels["order"] = X[0].edge_labels["order"] + 1  # new content: re-packed
    K = kern(X)
    assert kern._datasets._entries[next(reversed(kern._datasets._entries))] is not ds
    assert rel_err(K, dense_mgk(X, None, *programs("kronecker"), q=0.2)) < 1e-10
    copies = [Graph(g.indptr.copy(), g.indices.copy(), g.weights, node_labels=dict(g.node_labels),
                    edge_labels=dict(g.edge_labels)) for g in X]
    n_entries = len(kern._datasets._entries)
    np.testing.assert_array_equal(kern(copies), K)  # equal content: the same dataset
    assert len(kern._datasets._entries) == n_entries


def test_an_unchanged_graph_list_is_not_hashed_again(rng, monkeypatch):
    from graphkern.graph import content_digest
    from graphkern.mgk import data

    X = [random_graph(rng, n) for n in (5, 9)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="cpu")
    digests = []
    monkeypatch.setattr(data, "content_digest", lambda *a: digests.append(a) or content_digest(*a))
    kern(X)
    kern(X)
    kern(list(X))  # another list of the same graphs
    assert len(digests) == 1
    X[1].node_labels["element"] = X[1].node_labels["element"] + 100  # new content: hashed and re-packed
    changed = kern(X)
    assert len(digests) == 2 and len(kern._datasets._entries) == 2
    assert rel_err(changed, dense_mgk(X, None, *programs("kronecker"), q=kern.q)) < 1e-10


def test_changed_labels_and_weights_are_seen(rng):
    """The dataset cache keys on content: new label columns or a rebuilt graph give fresh values."""
    X = [random_graph(rng, n) for n in (5, 9, 7)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="cpu")
    kern(X)
    X[1].edge_labels["order"] = (X[1].edge_labels["order"] + 1) % 3
    element = X[2].node_labels["element"].copy()
    element[0] += 1
    X[2].node_labels["element"] = element
    if X[0].weights is not None:
        G = X[0]
        X[0] = Graph(G.indptr, G.indices, G.weights * 0.5, node_labels=dict(G.node_labels),
                     edge_labels=dict(G.edge_labels))
    np.testing.assert_allclose(kern(X), dense_mgk(X, None, *programs("kronecker"), q=0.05), rtol=1e-10)


def test_bad_structure_and_short_labels_are_refused(rng):
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, backend="cpu")
    X = [random_graph(rng, 6), random_graph(rng, 8)]
    with pytest.raises(ValueError, match=r"node label 'element' has 5 rows but the graph has 8 nodes"):
        X[1].node_labels["element"] = X[1].node_labels["element"][:5]
    G = X[1]
    indices = G.indices.astype(np.int64)
    indices[0] = 10**6
    X[1] = Graph(G.indptr, indices, validate=False, node_labels=dict(G.node_labels), edge_labels=dict(G.edge_labels))
    with pytest.raises(ValueError, match=r"1000000.*out of range|out of range.*1000000"):
        kern(X)


def test_categories_agree_between_x_and_y(rng):
    """A label seen only in Y must not collide with X's codes."""
    G1 = Graph.from_edges([(0, 1)], 2, node_labels={"element": [1, 2]}, edge_labels={"order": [1]})
    G2 = Graph.from_edges([(0, 1)], 2, node_labels={"element": [3, 2]}, edge_labels={"order": [7]})
    nk, ek = TensorProduct(element=KroneckerDelta(0.2)), TensorProduct(order=KroneckerDelta(0.3))
    kern = MarginalizedGraphKernel(nk, ek, tol=1e-13, dtype=np.float64, backend="cpu")
    kern([G1])
    K = kern([G1], [G2])
    ref = dense_mgk_pair(G1, G2, nk.compile(), ek.compile(), q=0.05)
    assert rel_err(K[0, 0], ref) < 1e-10


def test_octiles_reconstruct_the_graphs(rng):
    X = [random_graph(rng, n) for n in (1, 8, 9, 23)]
    ek = KERNELS["general"][1]
    kern = MarginalizedGraphKernel(KERNELS["general"][0], ek, dtype=np.float64, backend="cpu")
    s = kern._settings()
    ds = kern._dataset(X, s)
    oc = build_octiles(ds)
    assert oc.channels == 1 + ds.edge_features.shape[1]
    for g, G in enumerate(X):
        n = G.n_nodes
        nb = -(-n // OCTILE)
        dense = np.zeros((nb * OCTILE, nb * OCTILE, oc.channels))
        seen = np.zeros((nb * OCTILE, nb * OCTILE), dtype=bool)
        rp = oc.tile_rowptr[oc.rowptr_offset[g]: oc.rowptr_offset[g] + nb + 1]
        assert rp[0] == oc.tile_offsets[g] and rp[-1] == oc.tile_offsets[g + 1]
        for R in range(nb):
            cols = oc.tile_col[rp[R]:rp[R + 1]]
            assert np.all(np.diff(cols) > 0)
            for t in range(rp[R], rp[R + 1]):
                assert oc.tile_row[t] == R
                C = oc.tile_col[t]
                block = oc.values[t].reshape(oc.channels, OCTILE, OCTILE).transpose(1, 2, 0)
                dense[R * 8:R * 8 + 8, C * 8:C * 8 + 8] = block
                bits = np.array([(int(oc.bitmap[t]) >> e) & 1 for e in range(64)], dtype=bool).reshape(8, 8)
                seen[R * 8:R * 8 + 8, C * 8:C * 8 + 8] = bits
        A = G.to_scipy().toarray()
        np.testing.assert_array_equal(dense[:n, :n, 0], A)
        np.testing.assert_array_equal(seen[:n, :n], A != 0)
        assert not dense[n:].any() and not dense[:, n:].any()
        rows = np.repeat(np.arange(n), np.diff(G.indptr))
        lo, hi = ds.entry_offsets[g], ds.entry_offsets[g + 1]
        np.testing.assert_array_equal(dense[rows, G.indices, 1:], ds.edge_features[lo:hi])


def octile_xmv(oc, g1, n1, oc2, g2, n2, kappa, x):
    """A host twin of the GPU XMV loop: output blocks (R1, R2), tile pairs streamed, 64x64 products."""
    y = np.zeros((n1, n2))
    nb1, nb2 = -(-n1 // 8), -(-n2 // 8)
    rp1 = oc.tile_rowptr[oc.rowptr_offset[g1]:][:nb1 + 1]
    rp2 = oc2.tile_rowptr[oc2.rowptr_offset[g2]:][:nb2 + 1]
    xp = np.zeros((nb1 * 8, nb2 * 8))
    xp[:n1, :n2] = x
    for R1 in range(nb1):
        for R2 in range(nb2):
            acc = np.zeros((8, 8))
            for t1 in range(rp1[R1], rp1[R1 + 1]):
                J1 = oc.tile_col[t1]
                W1, E1 = oc.values[t1, 0].reshape(8, 8), oc.values[t1, 1:].reshape(-1, 8, 8)
                for t2 in range(rp2[R2], rp2[R2 + 1]):
                    J2 = oc2.tile_col[t2]
                    W2, E2 = oc2.values[t2, 0].reshape(8, 8), oc2.values[t2, 1:].reshape(-1, 8, 8)
                    xs = xp[J1 * 8:J1 * 8 + 8, J2 * 8:J2 * 8 + 8]
                    k = kappa(E1[:, :, None, :, None], E2[:, None, :, None, :])  # [a, b, c, d]
                    acc += np.einsum("ac,bd,abcd,cd->ab", W1, W2, k, xs)
            y[R1 * 8:R1 * 8 + 8, R2 * 8:R2 * 8 + 8][: min(8, n1 - R1 * 8), : min(8, n2 - R2 * 8)] = \
                acc[: min(8, n1 - R1 * 8), : min(8, n2 - R2 * 8)]
    return y


def test_octile_product_loop_matches_dense_product(rng):
    """The tiling the GPU kernel streams (coordinates, padding, x slices) reproduces (A1 (x) A2 (.) E) x."""
    X = [random_graph(rng, n, 0.3) for n in (3, 8, 13, 20)]
    nk, ek = Constant(1.0), TensorProduct(order=KroneckerDelta(0.3))
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu")
    ds = kern._dataset(X, kern._settings())
    oc = build_octiles(ds)

    def kappa(e1, e2):
        return np.where(e1[0] == e2[0], 1.0, 0.3)

    for g1, g2 in [(0, 3), (2, 1), (3, 3)]:
        G1, G2 = X[g1], X[g2]
        x = rng.normal(size=(G1.n_nodes, G2.n_nodes))
        A = np.kron(G1.to_scipy().toarray(), G2.to_scipy().toarray())
        E1, E2 = _dense_labels(G1, "order"), _dense_labels(G2, "order")
        E = np.where(E1[:, None, :, None] == E2[None, :, None, :], 1.0, 0.3).reshape(A.shape)
        want = ((A * E) @ x.ravel()).reshape(x.shape)
        # the same product as the off-diagonal part of the reference system
        M, _, _ = product_system(G1, G2, nk.compile(), ek.compile(), q=0.05)
        off = ~np.eye(len(M), dtype=bool)
        np.testing.assert_allclose(-M[off], (A * E)[off], rtol=1e-14)
        np.testing.assert_allclose(octile_xmv(oc, g1, G1.n_nodes, oc, g2, G2.n_nodes, kappa, x), want, atol=1e-12)


def _dense_labels(G, col):
    out = np.zeros((G.n_nodes, G.n_nodes))
    out[np.repeat(np.arange(G.n_nodes), np.diff(G.indptr)), G.indices] = G.edge_labels[col]
    return out


# ---------------------------------------------------------------------------- input validation


def test_missing_label_column_names_it(rng):
    X = [random_graph(rng, 4, 1.0), random_graph(rng, 5)]  # the first has edges: it lacks a column it needs
    del X[1].node_labels["element"]
    kern = MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)), Constant(1.0), backend="cpu")
    with pytest.raises(KeyError, match="no node label 'element'"):
        kern(X)
    kern = MarginalizedGraphKernel(Constant(1.0), TensorProduct(bond=KroneckerDelta(0.5)), backend="cpu")
    with pytest.raises(KeyError, match="no edge label 'bond'"):
        kern(X[:1])


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(q=0.0), ValueError, "q must be a finite number > 0"),
    (dict(q=1.0), ValueError, r"must lie in \(0, 1\)"),
    (dict(q="0.1"), TypeError, "q must be a number"),
    (dict(p=-1.0), ValueError, "p must be a finite number > 0"),
    (dict(p="random"), ValueError, "p must be 'uniform'"),
    (dict(tol=-1e-3), ValueError, "tol must be"),
    (dict(max_iter=0), ValueError, "max_iter must be a positive int"),
    (dict(dtype=np.int32), ValueError, "dtype must be one of"),
    (dict(backend="tpu"), ValueError, "backend must be one of"),
    (dict(n_threads=0), ValueError, "n_threads must be >= 1"),
])
def test_argument_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MarginalizedGraphKernel(Constant(1.0), Constant(1.0), **kwargs)


def test_kernel_validation(rng):
    with pytest.raises(ValueError, match=r"KroneckerDelta\(0.0\) on column 'element'.*\(0, 1\]"):
        MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.0)), Constant(1.0))
    # an edge kernel may be 0
    MarginalizedGraphKernel(Constant(1.0), TensorProduct(order=KroneckerDelta(0.0)))
    with pytest.raises(TypeError, match="node_kernel must be"):
        MarginalizedGraphKernel(lambda a, b: 1.0, Constant(1.0))
    with pytest.raises(ValueError, match="needs a label column"):
        MarginalizedGraphKernel(KroneckerDelta(0.5), Constant(1.0))


def test_graph_list_validation(rng):
    kern = MarginalizedGraphKernel(Constant(1.0), Constant(1.0), backend="cpu")
    G = random_graph(rng, 3)
    with pytest.raises(TypeError, match="single Graph"):
        kern(G)
    with pytest.raises(TypeError, match=r"X\[1\] is a int"):
        kern([G, 3])
    with pytest.raises(ValueError, match=r"Y\[0\] has no vertices"):
        kern([G], [Graph.from_edges(np.zeros((0, 2)), 0)])
    with pytest.raises(ValueError, match=r"pairs\[1\] = \(0, 5\): index 5 is out of range for Y"):
        kern([G], [G, G], pairs=[[0, 1], [0, 5]])
    with pytest.raises(ValueError, match="shape"):
        kern([G], pairs=[0, 0])
    with pytest.raises(ValueError, match="label 'coords' has shape"):
        H = random_graph(rng, 3)
        H.node_labels["coords"] = np.zeros((3, 2))
        MarginalizedGraphKernel(*KERNELS["general"], backend="cpu")([G, H])


def test_empty_list(rng):
    kern = MarginalizedGraphKernel(Constant(1.0), Constant(1.0), backend="cpu")
    assert kern([]).shape == (0, 0)
    assert kern([], [random_graph(rng, 3)]).shape == (0, 1)


def test_smiles_strings_are_converted_like_graphs_from_the_reader():
    """SMILES strings (and networkx graphs, RDKit molecules) go through graphkern.convert.as_graphs."""
    pytest.importorskip("rdkit", reason="RDKit is not installed")
    from graphkern.io.smiles import from_smiles
    smiles = ["CCO", "c1ccccc1", "CC(=O)[O-]"]
    nk, ek = TensorProduct(element=KroneckerDelta(0.4)), TensorProduct(bond_order=KroneckerDelta(0.3))
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="cpu")
    graphs = [from_smiles(s) for s in smiles]
    K = kern(smiles)
    np.testing.assert_array_equal(K, kern(graphs))
    np.testing.assert_allclose(K, dense_mgk(graphs, None, nk.compile(), ek.compile(), q=0.05), rtol=1e-10)
    np.testing.assert_array_equal(kern(smiles[:1], [graphs[1], smiles[2]]), K[:1, 1:])
    with pytest.raises(ValueError, match="cannot parse the SMILES 'C1CC'"):
        kern(["CCO", "C1CC"])


@pytest.mark.gpu
def test_gpu_matches_cpu_float32(rng):
    """The two float32 solvers agree to 1e-5 on every edge-kernel path (different summation orders)."""
    X = graph_set(rng) + [random_graph(rng, 33, 0.15), random_graph(rng, 64, 0.05)]
    for name, (nk, ek) in KERNELS.items():
        cpu = MarginalizedGraphKernel(nk, ek, q=0.05, backend="cpu")(X)
        gpu = MarginalizedGraphKernel(nk, ek, q=0.05, backend="gpu")(X)
        assert rel_err(gpu, cpu) < 1e-5, name


@pytest.mark.gpu
def test_gpu_matches_cpu_float64_nodal(rng):
    X = graph_set(rng)
    Y = [random_graph(rng, 30, 0.1), random_graph(rng, 8)]
    for name, (nk, ek) in KERNELS.items():
        kw = dict(q=0.05, tol=1e-13, dtype=np.float64)
        cpu = MarginalizedGraphKernel(nk, ek, backend="cpu", **kw)
        gpu = MarginalizedGraphKernel(nk, ek, backend="gpu", **kw)
        assert rel_err(gpu(X, Y), cpu(X, Y)) < 1e-10, name
        np.testing.assert_allclose(gpu(X, Y, nodal=True), cpu(X, Y, nodal=True), rtol=1e-10, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("techniques", ["core", "auto"])
def test_gpu_reuses_device_dataset(rng, techniques):
    X = [random_graph(rng, n) for n in (5, 19)]
    nk, ek = KERNELS["sqexp"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="gpu", techniques=techniques)
    kern(X)
    ds = next(iter(kern._datasets._entries.values()))
    # the core solver keeps its octiles with the dataset; "auto" (the CSR solver here) its CSR
    copies = dict(ds.device_copies if techniques == "core" else ds._csr_solver_data.device_copies)
    assert copies
    kern.q = 0.3
    kern.edge_kernel = TensorProduct(length=SquareExponential(2.0), k=Constant(0.5))
    K = kern(X)
    now = ds.device_copies if techniques == "core" else ds._csr_solver_data.device_copies
    assert all(now[k] is v for k, v in copies.items())
    ref = dense_mgk(X, None, nk.compile(), kern.edge_kernel.compile(), q=0.3)
    assert rel_err(K, ref) < 1e-10


# ---------------------------------------------------------------------------- extreme inputs


@pytest.mark.parametrize("dtype,params,kind", [
    (np.float32, dict(q=1e-25), "underflowed"), (np.float64, dict(q=1e-170), "underflowed"),
    (np.float32, dict(p=1e-30), "underflowed"), (np.float64, dict(p=1e200), "overflowed"),
    (np.float32, dict(p=1e20), "overflowed")])
def test_extreme_p_and_q_raise_over_or_underflow_not_wrong_values(rng, dtype, params, kind):
    X = [random_graph(rng, n) for n in (4, 7)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=dtype, backend="cpu", **params)
    with pytest.raises(FloatingPointError, match=f"K {kind}"):
        kern(X)
    with pytest.raises(FloatingPointError, match=f"K {kind}"):
        kern.diag(X)


def test_small_q_and_p_that_fit_give_the_reference(rng):
    X = [random_graph(rng, n) for n in (4, 7)]
    nk, ek = KERNELS["kronecker"]
    for params in (dict(q=1e-4, p=1e-30), dict(q=1e-3, p=1e100)):
        K = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu", tol=1e-12, max_iter=20000, **params)(X)
        ref = dense_mgk(X, None, *programs("kronecker"), **params)
        assert rel_err(K, ref) < 1e-6, params
    # normalized: p cancels, so a p whose K would not fit float32 still gives the normalized matrix
    Kn = MarginalizedGraphKernel(nk, ek, dtype=np.float32, backend="cpu", normalize=True, p=1e-30)(X)
    ref = dense_mgk(X, None, *programs("kronecker"), q=0.05)
    np.testing.assert_allclose(Kn, ref / np.sqrt(np.outer(np.diag(ref), np.diag(ref))), rtol=1e-5)


def test_cpu_work_vector_allocation_failure_raises_instead_of_hanging():
    """Two path graphs of 13,400 vertices need 7 GiB of CG vectors per thread: under a 3 GiB
    address-space limit every thread's share fails to allocate and MemoryError is raised."""
    from conftest import run_python

    code = """
import resource, numpy as np
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from graphkern import Graph
from graphkern.basekernels import Constant
from graphkern.mgk import MarginalizedGraphKernel
n = 13400
G = Graph.from_edges(np.stack([np.arange(n - 1), np.arange(1, n)], axis=1), n)
for grad in (False, True):
    try:
        MarginalizedGraphKernel(Constant(1.0), Constant(1.0), dtype=np.float64, backend="cpu", n_threads=2)(
            [G], eval_gradient=grad)
    except MemoryError as e:
        print("MemoryError", "CG work vectors" in str(e))
"""
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["MemoryError", "True", "MemoryError", "True"]
