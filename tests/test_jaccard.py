"""Jaccard / Sorensen / overlap similarity against a plain Python set reference, CPU and GPU:
conventions, extreme weights, bad input, the info record and progress."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph
from graphkern.similarity import VARIANTS, jaccard, overlap, sorensen
from graphkern.similarity.api import symmetric_pattern
from jaccard_graphs import (BACKENDS, CONVENTIONS, METRICS, assert_same_pattern, bounded_degree_graph, random_graph,
                            reference, skewed_graph, tolerance)

@pytest.mark.parametrize("backend", BACKENDS)
@CONVENTIONS
def test_matches_set_reference(rng, backend, metric, weighted, self_loops, dtype):
    A = random_graph(rng, int(rng.integers(40, 90)), 0.08)
    R = METRICS[metric](A, weighted=weighted, self_loops=self_loops, backend=backend, dtype=dtype)
    assert_same_pattern(R, A)
    assert R.dtype == dtype
    np.testing.assert_allclose(R.data, reference(A, metric, weighted=weighted, self_loops=self_loops),
                               rtol=0, atol=tolerance(dtype, weighted))


def test_cpu_skewed_graph_matches_reference(rng):
    A = skewed_graph(rng)
    assert np.diff(A.indptr).max() > 1500
    R = jaccard(A, backend="cpu", dtype=np.float64)
    np.testing.assert_allclose(R.data, reference(A, "jaccard"), rtol=0, atol=1e-12)


def test_hash_min_degree_is_checked_and_recorded():
    A = sp.csr_matrix(np.ones((3, 3)) - np.eye(3))
    for value in (-1, 2.5, "4", True):
        with pytest.raises(ValueError, match="hash_min_degree must be an integer >= 0"):
            jaccard(A, backend="cpu", hash_min_degree=value)
    _, info = jaccard(A, backend="cpu", hash_min_degree=7, return_info=True)
    assert info.options["hash_min_degree"] == 7 and info.variant == "cpu"


def test_bounded_degree_graph_reaches_its_bound(rng):
    A = bounded_degree_graph(rng, 400, 32)
    d = np.diff(A.indptr)
    assert d.max() == 32 and (d == 0).any()
    assert (abs(A - A.T) > 0).nnz == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_self_loop_conventions_by_hand(backend):
    # triangle 0-1-2 with a self-loop on 0, and a pendant 3 on 2
    A = sp.csr_matrix(np.array([[1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 1], [0, 0, 1, 0]], dtype=float))
    R = jaccard(A, backend=backend, dtype=np.float64).toarray()
    # N(0)={1,2}, N(1)={0,2}, N(2)={0,1,3}, N(3)={2}
    assert R[0, 0] == 1.0  # a stored diagonal entry gets 1
    assert R[0, 1] == pytest.approx(1 / 3)  # {2} / {0,1,2}
    assert R[0, 2] == pytest.approx(1 / 4)  # {1} / {0,1,2,3}
    assert R[2, 3] == 0.0  # {} / {0,1,2}: stored, so kept as an explicit zero
    R = jaccard(A, backend=backend, dtype=np.float64, self_loops=True).toarray()
    # N[0]={0,1,2}, N[1]={0,1,2}, N[2]={0,1,2,3}, N[3]={2,3}
    assert R[0, 1] == 1.0
    assert R[0, 2] == pytest.approx(3 / 4)
    assert R[2, 3] == pytest.approx(2 / 4)
    assert R[1, 1] == 0.0 and R[0, 0] == 1.0  # (1, 1) is not stored


@pytest.mark.parametrize("backend", BACKENDS)
def test_weighted_self_loop_weight(backend):
    # with self_loops=True a vertex's own weight is its stored w_ii, or 1 without a loop
    A = sp.csr_matrix(np.array([[0.5, 2.0], [2.0, 0.0]]))
    R = jaccard(A, weighted=True, self_loops=True, backend=backend, dtype=np.float64)
    # N[0] = {0: 0.5, 1: 2}, N[1] = {0: 2, 1: 1}: min sum 0.5 + 1, max sum 2 + 2
    assert R[0, 1] == pytest.approx(1.5 / 4.0)
    R = jaccard(A, weighted=True, backend=backend, dtype=np.float64)
    assert R[0, 1] == 0.0 and R[0, 0] == 1.0  # N(0) = {1}, N(1) = {0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_isolated_vertices_and_empty_rows(rng, backend):
    A = random_graph(rng, 60, 0.1, isolated=0.4)
    assert (np.diff(A.indptr) == 0).any()
    R = jaccard(A, backend=backend, dtype=np.float64)
    assert_same_pattern(R, A)
    np.testing.assert_allclose(R.data, reference(A, "jaccard"), atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_in_coo_are_summed(rng, backend):
    base = random_graph(rng, 50, 0.1, loops=0.0)
    coo = base.tocoo()
    # every entry given twice, each with half its weight (halving is exact, so the sums stay symmetric)
    rows = np.concatenate([coo.row, coo.row])
    cols = np.concatenate([coo.col, coo.col])
    half = np.concatenate([coo.data / 2, coo.data / 2])
    order = rng.permutation(rows.size)
    dup = sp.coo_matrix((half[order], (rows[order], cols[order])), shape=base.shape)
    for weighted in (False, True):
        R = jaccard(dup, weighted=weighted, backend=backend, dtype=np.float64)
        assert_same_pattern(R, base)
        np.testing.assert_allclose(R.data, reference(base, "jaccard", weighted=weighted), atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("self_loops", [False, True])
def test_star_hub(rng, backend, self_loops):
    m = int(rng.integers(50, 400))
    edges = np.stack([np.zeros(m, dtype=np.int64), np.arange(1, m + 1)], axis=1)
    G = Graph.from_edges(edges, m + 1)
    J = jaccard(G, backend=backend, self_loops=self_loops, dtype=np.float64)
    S = sorensen(G, backend=backend, self_loops=self_loops, dtype=np.float64)
    O = overlap(G, backend=backend, self_loops=self_loops, dtype=np.float64)
    if self_loops:  # N[hub] = all, N[leaf] = {leaf, hub}
        np.testing.assert_allclose(J.data, 2 / (m + 1))
        np.testing.assert_allclose(S.data, 4 / (m + 3))
        np.testing.assert_allclose(O.data, 1.0)
    else:  # N(hub) = leaves, N(leaf) = {hub}: nothing in common
        assert J.nnz == 2 * m and np.all(J.data == 0) and np.all(S.data == 0) and np.all(O.data == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complete_graph(rng, backend):
    n = int(rng.integers(5, 60))
    A = sp.csr_matrix(np.ones((n, n)) - np.eye(n))
    np.testing.assert_allclose(jaccard(A, backend=backend, dtype=np.float64).data, (n - 2) / n)
    np.testing.assert_allclose(sorensen(A, backend=backend, dtype=np.float64).data, (n - 2) / (n - 1))
    np.testing.assert_allclose(overlap(A, backend=backend, dtype=np.float64).data, (n - 2) / (n - 1))
    np.testing.assert_array_equal(jaccard(A, backend=backend, self_loops=True).data, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_explicit_zeros_are_edges_and_kept(backend):
    A = sp.csr_matrix((np.array([0.0, 1.0, 0.0, 1.0, 1.0, 1.0]),
                       np.array([1, 2, 0, 2, 0, 1]), np.array([0, 2, 4, 6])), shape=(3, 3))
    assert A.nnz == 6
    R = jaccard(A, backend=backend, dtype=np.float64)
    assert R.nnz == 6  # the explicit zeros (0, 1) and (1, 0) keep their place
    np.testing.assert_allclose(R.data, reference(A, "jaccard"))
    np.testing.assert_allclose(R.data, 1 / 3)  # a triangle
    W = jaccard(A, weighted=True, backend=backend, dtype=np.float64)
    np.testing.assert_allclose(W.data, reference(A, "jaccard", weighted=True), atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_and_matrix_inputs_agree(rng, backend):
    A = random_graph(rng, 70, 0.08)
    G = Graph.from_scipy(A, weighted=True)
    for weighted in (False, True):
        np.testing.assert_array_equal(jaccard(G, weighted=weighted, backend=backend).data,
                                      jaccard(A, weighted=weighted, backend=backend).data)
    # an unweighted Graph with weighted=True has unit weights: the same as unweighted
    U = Graph.from_scipy(A, weighted=False)
    np.testing.assert_allclose(jaccard(U, weighted=True, backend=backend, dtype=np.float64).data,
                               jaccard(U, backend=backend, dtype=np.float64).data, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs(backend):
    for A in (sp.csr_matrix((0, 0)), sp.csr_matrix((5, 5))):
        R = jaccard(A, backend=backend, dtype=np.float64)
        assert R.shape == A.shape and R.nnz == 0 and R.dtype == np.float64


def test_cpu_thread_counts_agree(rng):
    A = random_graph(rng, 300, 0.03)
    one = jaccard(A, backend="cpu", n_threads=1, weighted=True, dtype=np.float64)
    many = jaccard(A, backend="cpu", n_threads=3, weighted=True, dtype=np.float64)
    np.testing.assert_array_equal(one.data, many.data)


def test_input_is_not_modified(rng):
    A = random_graph(rng, 40, 0.1)
    before = (A.data.copy(), A.indices.copy(), A.indptr.copy())
    R = jaccard(A, backend="cpu")
    R.indices[:] = 0
    for a, b in zip(before, (A.data, A.indices, A.indptr)):
        np.testing.assert_array_equal(a, b)


def test_public_names_are_the_functions():
    import graphkern
    import graphkern.similarity  # importing the module must not shadow the function

    A = sp.csr_matrix(np.ones((3, 3)) - np.eye(3))
    np.testing.assert_allclose(graphkern.jaccard(A, backend="cpu").data, 1 / 3, rtol=1e-6)
    assert graphkern.jaccard is jaccard and graphkern.sorensen is sorensen


def huge_weight_graph(rng, top, n=60):
    """A random weighted graph whose weights reach ``top`` (a few near it, the rest spread below)."""
    A = random_graph(rng, n, 0.15, loops=0.3, isolated=0.0)
    A = sp.triu(A, format="csr")
    A.data = top * rng.uniform(0.01, 1.0, A.nnz)
    A.data[rng.random(A.nnz) < 0.2] = top
    return sp.csr_matrix(A + sp.triu(A, 1).T)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("metric", list(METRICS))
@pytest.mark.parametrize("dtype,top", [(np.float32, 3e38), (np.float32, 1e300), (np.float64, 1e308)])
def test_weight_sums_past_the_dtype_range(rng, backend, metric, dtype, top):
    # the sums overflow dtype: the ratios must still be right (the reference divides out `top`)
    A = huge_weight_graph(rng, top)
    scaled = A.copy()
    scaled.data = scaled.data / top
    expected = reference(scaled, metric, weighted=True)
    R, info = METRICS[metric](A, weighted=True, backend=backend, dtype=dtype, return_info=True)
    assert R.dtype == dtype and np.isfinite(R.data).all()
    np.testing.assert_allclose(R.data, expected, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-7)
    assert info.compute_dtype == "float64"
    assert (info.weight_scale < 1.0) == (top > 1e300)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scaled_weights_with_self_loops(rng, backend):
    A = huge_weight_graph(rng, 1e308).tolil()
    A.setdiag(1e307)  # every vertex stores its own weight: scaling keeps every ratio
    A = sp.csr_matrix(A)
    scaled = A.copy()
    scaled.data = scaled.data / 1e308
    R = jaccard(A, weighted=True, self_loops=True, backend=backend, dtype=np.float64)
    np.testing.assert_allclose(R.data, reference(scaled, "jaccard", weighted=True, self_loops=True), rtol=1e-12,
                               atol=1e-14)


def implicit_loop_graphs(rng):
    """Two components without stored self-loops: weights near 1e308 and weights near 1, where a
    vertex's own weight of 1 weighs as much as an edge's."""
    huge = huge_weight_graph(rng, 1e308)
    small = random_graph(rng, 50, 0.15, loops=0.0)
    small.data = rng.uniform(0.5, 2.0, small.nnz)
    small = sp.csr_matrix(small + small.T)
    A = sp.csr_matrix(sp.block_diag([huge - sp.diags(huge.diagonal()), small]))
    A.eliminate_zeros()
    return A, huge.shape[0], small


def test_scaled_weights_with_implicit_self_loops(rng):
    # the CPU scales a vertex's own weight with the others, so the small component keeps its ratios
    A, offset, small = implicit_loop_graphs(rng)
    R = jaccard(A, weighted=True, self_loops=True, backend="cpu", dtype=np.float64)
    tail = R[offset:, offset:].tocsr()
    np.testing.assert_allclose(tail.data, reference(small, "jaccard", weighted=True, self_loops=True), rtol=1e-12)
    head = R[:offset, :offset].tocsr()
    scaled = A[:offset, :offset].tocsr() / 1e308
    # a vertex's own weight, 1 against sums near 1e308, only shows as ~1e-309 where no neighbour is shared
    np.testing.assert_allclose(head.data, reference(scaled, "jaccard", weighted=True), rtol=1e-10, atol=1e-300)


@pytest.mark.gpu
def test_gpu_refuses_scaled_weights_with_implicit_self_loops(rng):
    A, _, _ = implicit_loop_graphs(rng)
    with pytest.raises(ValueError, match="overflow float64.*self_loops=True"):
        jaccard(A, weighted=True, self_loops=True, backend="gpu", dtype=np.float64)
    R = jaccard(A, weighted=True, self_loops=False, backend="gpu", dtype=np.float64)
    np.testing.assert_allclose(R.data, jaccard(A, weighted=True, backend="cpu", dtype=np.float64).data,
                               rtol=1e-12)


def test_ordinary_weights_keep_their_type(rng):
    A = random_graph(rng, 80, 0.1)
    A.data = rng.uniform(0.5, 2.0, A.nnz)
    A = sp.csr_matrix(A + A.T)
    _, info = jaccard(A, weighted=True, backend="cpu", dtype=np.float32, return_info=True)
    assert info.compute_dtype == "float32" and info.weight_scale == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [10**6, -1, 40])
def test_out_of_range_index_of_an_unchecked_graph(rng, backend, bad):
    A = random_graph(rng, 40, 0.1)
    indices = A.indices.astype(np.int64)
    indices[3] = bad
    G = Graph(A.indptr, indices, validate=False)
    with pytest.raises(ValueError, match=rf"index {bad}.*out of range|out of range.*{bad}"):
        jaccard(G, backend=backend)


def test_broken_row_pointers_of_an_unchecked_graph(rng):
    A = random_graph(rng, 40, 0.1)
    indptr = A.indptr.copy()
    indptr[5], indptr[6] = indptr[6], indptr[5] - 1  # decreasing
    G = Graph(indptr, A.indices.copy(), validate=False)
    with pytest.raises(ValueError, match="row pointers are not a valid CSR"):
        jaccard(G, backend="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_progress_and_info(rng, backend):
    A = random_graph(rng, 3000, 0.004)
    seen = []
    R, info = jaccard(A, backend=backend, verbose=lambda done, total: seen.append((done, total)),
                      return_info=True)
    np.testing.assert_array_equal(R.data, jaccard(A, backend=backend).data)
    assert seen and seen[-1][0] == seen[-1][1]
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    assert info.backend == backend and info.metric == "jaccard" and info.dtype == "float32"
    assert set(info.times) >= {"validate", "compute", "total"}
    if backend == "cpu":
        assert seen[-1][1] == A.shape[0] and info.options["n_threads"] >= 1
    else:
        assert seen[-1][1] == 3 and info.variant in VARIANTS and info.plan["device_bytes"] > 0
        assert set(info.times) >= {"plan", "upload", "download"}


@pytest.mark.parametrize("weighted", [False, True])
def test_cpu_kernel_in_blocks_matches_one_pass(rng, weighted):
    from graphkern._cpu.jaccard import similarity as kernel

    pattern = symmetric_pattern(skewed_graph(rng), weighted=weighted)
    weights = pattern.weights if weighted else np.zeros(0)
    whole = np.empty(pattern.nnz)
    kernel(pattern.indptr, pattern.indices, weights, whole, 0, weighted, False, 2)
    blocks, calls = np.full(pattern.nnz, np.nan), []
    kernel(pattern.indptr, pattern.indices, weights, blocks, 0, weighted, False, 2, progress=calls.append,
           progress_rows=97)
    assert calls == [97] * (pattern.n // 97) + ([pattern.n % 97] if pattern.n % 97 else [])
    np.testing.assert_array_equal(blocks, whole)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_parallel_copy_is_an_independent_equal_array(n_threads, rng):
    """The result's column indices are copied block-parallel: equal, same dtype and shape, writable,
    sharing no memory with the source, across block edges and for empty and tiny arrays."""
    from graphkern._cpu.jaccard import parallel_copy
    for a in (np.zeros(0, np.int32), np.arange(5, dtype=np.int32),
              rng.integers(0, 2**40, (1 << 18) + 7).astype(np.int64), rng.standard_normal((301, 4099))):
        b = parallel_copy(a, n_threads)
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)
        assert b.flags.writeable and not np.shares_memory(a, b)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_row_figures_match_numpy(n_threads, rng):
    """One pass over the row pointers: int64 pointers (the input itself when int64), the longest
    row and the non-empty rows, as NumPy finds them, for every index type and tiny inputs."""
    from graphkern._cpu.jaccard import row_figures

    for n in (0, 1, 5, (1 << 17) + 3):
        degrees = rng.integers(0, 40, n) * (rng.random(n) < 0.7)
        indptr = np.concatenate([[0], np.cumsum(degrees)])
        for dtype in (np.int32, np.int64, np.int16 if n < 100 else np.int32):
            p = indptr.astype(dtype)
            p.flags.writeable = False  # a Graph's arrays are read-only
            wide, top, nonempty = row_figures(p, n_threads)
            assert wide.dtype == np.int64 and np.array_equal(wide, indptr) and (wide is p) == (dtype == np.int64)
            assert top == (degrees.max() if n else 0) and nonempty == np.count_nonzero(degrees)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_uniform_values_compare_bits(n_threads, rng):
    from graphkern._cpu.jaccard import uniform_values

    size = 3 * (1 << 18) + 11  # several parallel blocks and a partial one
    for dtype in (np.bool_, np.int8, np.float16, np.int32, np.float32, np.float64, np.int64):
        a = np.ones(size, dtype=dtype)
        assert uniform_values(a, n_threads) and uniform_values(a[:1], n_threads)
        for k in (0, 1, (1 << 18) - 1, 1 << 18, size - 1, int(rng.integers(size))):
            b = a.copy()
            b[k] = 0
            assert not uniform_values(b, n_threads), (dtype, k)
    z = np.zeros(10)
    z[3] = -0.0  # equal values, other bits
    assert not uniform_values(z, n_threads)
