"""exp(beta A) x on extreme and malformed input: huge and tiny entries, edits the cache must see,
indices out of range, and errors that say which problem occurred (CPU, and GPU where marked)."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

from graphkern import Graph
from graphkern.expm import clear_cache, expm_multiply, funm_multiply, total_communicability

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def random_graph(rng, n, p, weighted=True):
    upper = sp.triu(sp.random(n, n, density=p, random_state=rng, format="csr"), k=1)
    upper.data[:] = rng.uniform(0.5, 2.0, upper.nnz) if weighted else 1.0
    return (upper + upper.T).tocsr()


def reference(A, x, beta):
    lam, V = np.linalg.eigh(A.toarray())
    return V @ (np.exp(beta * lam) * (V.T @ x))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_entries_near_the_overflow_threshold_give_the_right_answer(backend, dtype):
    A = sp.csr_matrix(np.array([[0.0, 1e300], [1e300, 0.0]]))
    y, info = expm_multiply(A, np.array([1.0, 2.0]), beta=1e-300, backend=backend, dtype=dtype)
    expected = scipy.linalg.expm(np.array([[0.0, 1.0], [1.0, 0.0]])) @ [1.0, 2.0]  # [3.89, 4.26]
    assert info.converged and info.log_scale == 0.0
    assert rel(y, expected) <= (1e-13 if dtype == np.float64 else 1e-6)
    assert info.lambda_max == pytest.approx(1e300, rel=1e-12 if dtype == np.float64 else 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("exponent", [200, 155, -200, -300])
def test_scaled_matrices_give_the_scaled_answer(backend, exponent, rng):
    """A * 10^e with beta * 10^-e is the same exp: huge and tiny entries alike, total
    communicability included (it must not turn into a constant vector)."""
    A = random_graph(rng, 80, 0.1)
    x = rng.standard_normal(80)
    ref = reference(A, x, 0.3)
    B = A * 10.0 ** exponent
    y, info = expm_multiply(B, x, beta=0.3 * 10.0 ** -exponent, backend=backend, tol=1e-12)
    assert rel(y, ref) <= 1e-11 and info.log_scale == 0.0
    tc, _ = total_communicability(B, beta=0.3 * 10.0 ** -exponent, backend=backend, tol=1e-12)
    assert rel(tc, reference(A, np.ones(80), 0.3)) <= 1e-11
    assert np.ptp(tc) > 0.1 * np.max(tc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_beta_times_a_beyond_float64_is_an_overflow_error(backend):
    A = sp.csr_matrix(np.array([[0.0, 1e300], [1e300, 0.0]]))
    with pytest.raises(FloatingPointError, match="beta \\* A overflows float64"):
        expm_multiply(A, np.ones(2), beta=1e100, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_tell_overflow_and_non_convergence_apart(backend, rng):
    A = random_graph(rng, 300, 0.05, weighted=False)
    with pytest.raises(FloatingPointError, match="f overflows float64"):
        funm_multiply(A, np.ones(300), np.exp, beta=200.0, backend=backend)
    with pytest.raises(ValueError, match="f returned NaN"):
        funm_multiply(A, np.ones(300), lambda z: np.sqrt(z - 1e9), backend=backend)
    with pytest.warns(RuntimeWarning, match="not converged after 3 Lanczos steps.*raise max_krylov"):
        _, info = expm_multiply(A, np.ones(300), beta=2.0, max_krylov=3, backend=backend)
    assert not info.converged


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_an_answer_that_underflows_is_returned_scaled(backend, dtype):
    A = sp.csr_matrix(np.array([[5.0, 1.0], [1.0, 5.0]]))  # eigenvalues 4 and 6
    x = np.array([1.0, 3.0])
    beta = -200.0  # e^-800 and e^-1200: below float64's smallest normal number
    y, info = expm_multiply(A, x, beta=beta, backend=backend, dtype=dtype)
    assert info.log_scale < -700 and np.max(np.abs(y)) == pytest.approx(1.0)
    lam, V = np.linalg.eigh(A.toarray())
    log_ref = V @ (np.exp(beta * lam - info.log_scale) * (V.T @ x))  # y_true / exp(log_scale)
    assert rel(y, log_ref) <= (1e-12 if dtype == np.float64 else 1e-3)  # float32: eps * |beta| ||A||
    if dtype == np.float32:  # a callable's answer, e^-100: representable in float64 only
        with pytest.warns(RuntimeWarning, match="underflows float32"):
            funm_multiply(A, x, np.exp, beta=-25.0, backend=backend, dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_in_place_edit_is_seen_by_the_cache(backend, rng):
    """The cache key is the whole content: an edit of any one stored value (none of them sampled
    more than another) makes the next call rebuild and follow it."""
    A = random_graph(rng, 500, 0.02)
    x = rng.standard_normal(500)
    expm_multiply(A, x, beta=0.2, backend=backend)
    for k in rng.choice(A.nnz, 3, replace=False):
        A.data[k] *= 3.0
        i = int(np.searchsorted(A.indptr, k, side="right")) - 1
        j = A.indices[k]
        mirror = A.indptr[j] + int(np.flatnonzero(A.indices[A.indptr[j]:A.indptr[j + 1]] == i)[0])
        A.data[mirror] = A.data[k]
        y, info = expm_multiply(A, x, beta=0.2, backend=backend, tol=1e-12)
        assert not info.cached
        assert rel(y, reference(A, x, 0.2)) <= 1e-11
        _, again = expm_multiply(A, x, beta=0.2, backend=backend)
        assert again.cached
    clear_cache()


def test_a_speculative_lookup_confirms_or_drops_its_entry(rng):
    """The GPU path uses a cached matrix while its content is hashed beside the solve: the check
    must still see an edit of one value, drop the stale entry and leave a fresh build to the retry."""
    from graphkern.expm.cache import MatrixCache
    cache, builds = MatrixCache(), []

    def build(M):
        builds.append(1)
        return float(M.to_scipy().sum() if isinstance(M, Graph) else M.sum())
    A = random_graph(rng, 40, 0.2, weighted=True)
    # a matrix below the size worth a thread is hashed in place: the edit is seen at the lookup
    assert A.data.nbytes + A.indices.nbytes + A.indptr.nbytes < cache.speculate_bytes
    cache.get_speculative(A, build, 2)
    A.data[0] += 1.0
    value, hit, unchanged = cache.get_speculative(A, build, 2)
    assert not hit and unchanged() and value == float(A.sum()) and len(builds) == 2
    cache, builds = MatrixCache(), []
    cache.speculate_bytes = 0
    value, hit, unchanged = cache.get_speculative(A, build, 2)
    assert not hit and unchanged() and len(builds) == 1
    again, hit, unchanged = cache.get_speculative(A, build, 2)
    assert hit and again == value and unchanged() and len(builds) == 1 and cache.hits == 1
    A.data[3] += 1.0
    stale, hit, unchanged = cache.get_speculative(A, build, 2)
    assert hit and stale == value and not unchanged() and not unchanged()
    fresh, hit, unchanged = cache.get_speculative(A, build, 2)
    assert not hit and unchanged() and fresh == float(A.sum()) and len(builds) == 2
    assert (cache.hits, cache.misses) == (1, 3)
    G = Graph.from_scipy(random_graph(rng, 30, 0.2))  # keyed by identity: nothing to hash
    cache.get_speculative(G, build, 2)
    _, hit, unchanged = cache.get_speculative(G, build, 2)
    assert hit and unchanged() and len(builds) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_edit_that_breaks_a_cached_matrix_is_refused(backend, rng):
    A = random_graph(rng, 60, 0.1, weighted=True)
    expm_multiply(A, beta=0.3, backend=backend)
    A.data[0] = -A.data[0] + 1.0  # its mirror entry keeps the old value: A is no longer symmetric
    with pytest.raises(ValueError, match="symmetric"):
        expm_multiply(A, beta=0.3, backend=backend)
    A.data[0] = np.nan
    with pytest.raises(ValueError):
        expm_multiply(A, beta=0.3, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_indices_out_of_range_never_reach_the_kernels(backend, rng):
    A = random_graph(rng, 40, 0.2)
    expm_multiply(Graph(A.indptr, A.indices, A.data, validate=False), beta=0.1, backend=backend)
    for bad in (10**6, -1, 40, -(2**31)):
        indices = A.indices.copy()
        indices[3] = bad
        G = Graph(A.indptr, indices, A.data, validate=False)
        with pytest.raises(ValueError, match="out of range"):
            expm_multiply(G, beta=0.1, backend=backend)
    B = Graph(np.array([0, 1, 2]), np.array([1, 7]), validate=False)
    with pytest.raises(ValueError, match="7 .*out of range|out of range: 7 in row 1"):
        total_communicability(B, backend=backend)


def test_an_index_check_left_to_the_device_runs_on_the_host_before_host_code_reads_the_indices(rng):
    """The GPU path leaves an unchecked Graph's index check to the device (CsrMatrix.pending_check);
    the host check still runs, with its message, wherever host code reads the indices first."""
    from graphkern.expm.api import _validate
    A = random_graph(rng, 50, 0.2)
    indices = A.indices.copy()
    indices[5] = 50
    bad = Graph(A.indptr, indices, A.data, validate=False)
    mat = _validate(bad, 1, device_check=True)
    for _ in range(2):  # a failed check stays pending
        with pytest.raises(ValueError, match="edge index 50 out of range"):
            mat.require_checked()
    good = _validate(Graph(A.indptr, A.indices, A.data, validate=False), 1, device_check=True)
    assert good.pending_check is not None
    good.require_checked()
    assert good.pending_check is None
    with pytest.raises(ValueError, match="out of range"):  # sinh of a tiny beta A: beta A x on the host
        funm_multiply(bad, np.ones(50), "sinh", beta=1e-300, backend="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_gpu_checks_an_unchecked_graph_on_the_device(reorder, rng):
    """A Graph built with validate=False has its indices checked on the device after the upload: where
    they are valid, the validated Graph's answer bit for bit; where not, the host check's message, on
    every call and on the CPU after the GPU."""
    A = random_graph(rng, 300, 0.05)
    y, _ = expm_multiply(Graph(A.indptr, A.indices, A.data), beta=0.1, backend="gpu", reorder=reorder)
    y_unchecked, info = expm_multiply(Graph(A.indptr, A.indices, A.data, validate=False), beta=0.1, backend="gpu",
                                      reorder=reorder)
    assert info.reorder == reorder and np.array_equal(y, y_unchecked)
    indices = A.indices.copy()
    indices[A.nnz // 2] = 300
    with pytest.raises(ValueError, match="out of range") as host:
        expm_multiply(Graph(A.indptr, indices, A.data, validate=False), beta=0.1, backend="cpu")
    G = Graph(A.indptr, indices, A.data, validate=False)
    for backend, options in (("gpu", {"reorder": reorder}), ("gpu", {"reorder": reorder}), ("cpu", {})):
        with pytest.raises(ValueError) as err:
            total_communicability(G, beta=0.1, backend=backend, **options)
        assert str(err.value) == str(host.value)
    with pytest.raises(ValueError, match="row pointer|indptr"):
        expm_multiply(Graph(np.array([0, 2, 1]), np.array([1, 0]), validate=False), backend="gpu")


def test_malformed_row_pointers_and_values_are_refused():
    """Refused when the Graph is built (if it checks then) or at the latest when expm reads it."""
    with pytest.raises(ValueError, match="row pointer|indptr"):
        expm_multiply(Graph(np.array([0, 2, 1]), np.array([1, 0]), validate=False), backend="cpu")
    with pytest.raises(ValueError, match="non-finite|NaN"):
        expm_multiply(Graph(np.array([0, 1, 2]), np.array([1, 0]), np.array([1.0, np.nan]), validate=False),
                      backend="cpu")


def test_progress_counts_the_lanczos_steps(rng):
    A = random_graph(rng, 400, 0.02)
    seen = []
    _, info = expm_multiply(A, beta=0.5, backend="cpu", verbose=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] >= info.krylov_dim and all(t == seen[0][1] for _, t in seen)  # out of max_krylov
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [0, 1, 7, 70_000])
def test_degree_moments_match_numpy(dtype, n, rng):
    from graphkern._cpu import expm as cpu
    from graphkern.expm.lanczos import CsrMatrix
    deg = rng.integers(0, 40, n) if n != 1 else np.zeros(1, np.int64)  # one empty row: mean 0, spread 0
    if n > 3:
        deg[rng.integers(n)] = 5000  # a hub
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(dtype)
    for threads in (1, 2, 3):
        total, squares, top = cpu.degree_moments(indptr, threads)
        assert total == deg.sum() and top == (deg.max() if n else 0)
        assert squares == float((deg.astype(np.int64) ** 2).sum())
    if n:
        mat = CsrMatrix(indptr.astype(np.int64), np.zeros(int(deg.sum()), np.int32), None)
        mean, top, cv = mat.degree_stats()
        assert mean == pytest.approx(deg.mean(), rel=1e-14) and top == deg.max()
        assert cv == pytest.approx(deg.std() / deg.mean() if deg.mean() > 0 else 0.0, rel=1e-9)


def _degree_order_reference(indptr, parts):
    """The vertex order by NumPy: a stable sort by decreasing degree, dealt round robin to ``parts``."""
    deg = np.diff(indptr).astype(np.int64)
    by_degree = np.argsort(-deg, kind="stable")
    order = np.concatenate([by_degree[p::parts] for p in range(parts)]).astype(np.int32)
    inverse = np.empty(len(deg), dtype=np.int32)
    inverse[order] = np.arange(len(deg), dtype=np.int32)
    return order, inverse, np.concatenate([[0], np.cumsum(deg[order])]).astype(np.int64)


def _degree_draws(rng, counted):
    """Degree sequences with ties, empty rows, a single row and hubs about and beyond ``counted``
    (the degrees the device's sort counts; longer rows are ranked apart)."""
    many = int(rng.integers(40_000, 90_000))
    hubs = rng.integers(0, many, 7)
    spread = rng.zipf(1.6, many).clip(0, 3 * counted)
    spread[hubs] = [counted - 1, counted, counted, counted + 1, 5 * counted, 0, 2]
    return [np.zeros(0, np.int64), np.zeros(1, np.int64), np.array([3]), np.zeros(5000, np.int64),
            np.concatenate([rng.integers(0, 6, 5000), [0, 900, 900, 3]]), rng.integers(0, 3, many), spread]


@pytest.mark.gpu
@pytest.mark.parametrize("buckets", [4096, 64])
def test_device_degree_order_matches_the_reference(buckets, rng, monkeypatch):
    """The device's counting sort (graphkern.expm.order.DeviceOrder) gives the reference's
    permutation and inverse, and each block of one to three devices its row pointers and the host's
    rowblock plan; with 64 counted degrees many rows are ranked apart as long ones, and small tiles
    make many tiles."""
    import graphkern.expm.device as device
    import graphkern.expm.order as device_order
    from graphkern._cpu import expm as cpu
    from graphkern._cuda import runtime as rt
    from graphkern.expm.lanczos import CsrMatrix
    from graphkern.expm.plans import LONG_ROW, LONG_SEGMENT, ROWBLOCK_COST, TASK_LONG, TASK_STREAM
    draws = _degree_draws(rng, device_order.ORDER_BUCKETS)
    monkeypatch.setattr(device_order, "ORDER_BUCKETS", buckets)
    monkeypatch.setattr(device_order, "ORDER_TILE_ROWS", 512)
    dev = rt.get_device(0)
    reserve = device.reserver(dev, None)
    for deg in draws:
        indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
        mat = CsrMatrix(indptr, np.zeros(int(indptr[-1]), np.int32), None)
        for parts in (1, 2, 3):
            order, inverse, new_indptr = _degree_order_reference(indptr, parts)
            upload = device._SourceUpload(dev, None, mat, mat.indices, False)
            for index in range(parts):
                got = device_order.DeviceOrder(upload, mat, parts, index, reserve)
                np.testing.assert_array_equal(got.order, order)
                np.testing.assert_array_equal(got.inverse, inverse)
                r0, r1 = got.bounds[index], got.bounds[index + 1]
                local = new_indptr[r0:r1 + 1] - new_indptr[r0]
                assert got.nnz == local[-1]
                np.testing.assert_array_equal(got.local_indptr(), local)
                tasks, segments, longs = cpu.rowblock_tasks(local, ROWBLOCK_COST, LONG_ROW, LONG_SEGMENT, TASK_STREAM,
                                                            TASK_LONG, 2)
                plan = got.rowblock_plan(reserve)
                assert (plan.n_segments, plan.n_long) == (segments, longs)
                np.testing.assert_array_equal(plan.tasks.to_host(), tasks)


@pytest.mark.parametrize("n", [0, 1, 7, 200_000])
def test_magnitude_range_matches_numpy(n, rng):
    """The smallest nonzero and the largest |value| in one compiled pass, zeros and signs included."""
    from graphkern._cpu import expm as cpu
    values = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-300, 300, n)
    values[rng.random(n) < 0.1] = 0.0
    nonzero = np.abs(values[values != 0])
    want = (float(nonzero.min()) if nonzero.size else math.inf, float(np.abs(values).max()) if n else 0.0)
    for threads in (1, 2, 3):
        assert cpu.magnitude_range(values, threads) == want
    if n:  # a NaN or an inf anywhere makes the largest inf (the finiteness check of validation)
        for bad in (np.nan, -np.inf):
            spoiled = values.copy()
            spoiled[rng.integers(n)] = bad
            assert cpu.magnitude_range(spoiled, 2)[1] == math.inf


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_krylov_space_is_not_taken_as_exact(backend):
    """Eigenvalues 1000 apart: at m = n the Lanczos vectors are no longer orthogonal in floating
    point, so the steps go on until the estimate converges (found by the fuzz suite)."""
    rows, cols = [5, 0, 5, 2, 5, 1, 5, 5, 1], [5, 5, 5, 2, 4, 4, 3, 0, 0]
    A = sp.csr_matrix(([1000.0, 0.5, 1.0, 2.0, 2.0, 1e-300, 1e-300, 1.0, 2.0], (rows, cols)), shape=(6, 6))
    A = (A + A.T).tocsr()
    y, info = total_communicability(A, beta=-1.0, backend=backend)
    want = scipy.linalg.expm(-A.toarray()) @ np.ones(6)
    np.testing.assert_allclose(y, want, rtol=1e-9, atol=1e-12)
    assert info.converged
