"""exp(beta A) x in another vertex order (``reorder=``): the degree order against its definition,
when "auto" picks it, the CPU and every GPU SpMV variant run in it, and what its first call builds,
uploads and reports."""

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg

from graphkern.expm import cache_info, clear_cache, expm_multiply, total_communicability
from test_expm import TOL, _sym, dense_funm, random_graph, rel, skewed_graph
from test_expm_reliability import _degree_order_reference


def _reference_reordered(A, order):
    """P A P^T by SciPy fancy indexing: new vertex i is old vertex order[i]."""
    return A[order][:, order].tocsr()


def _emulated_device_reorder(A, order, inverse, new_indptr, row0=0, row1=None):
    """What lanczos_permute_rows does, in NumPy: new row i (of [row0, row1)) takes old row order[i]
    with its columns mapped through inverse, entries kept in their old order (``new_indptr``: the
    row pointers of P A P^T)."""
    row1 = A.shape[0] if row1 is None else row1
    indptr = new_indptr[row0:row1 + 1] - new_indptr[row0]
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    data = np.empty(int(indptr[-1]))
    for i in range(row1 - row0):
        old = order[row0 + i]
        s0, s1 = A.indptr[old], A.indptr[old + 1]
        indices[indptr[i]:indptr[i + 1]] = inverse[A.indices[s0:s1]]
        data[indptr[i]:indptr[i + 1]] = A.data[s0:s1]
    return sp.csr_matrix((data, indices, indptr), shape=(row1 - row0, A.shape[0]))


@pytest.mark.parametrize("weighted", [False, True])
def test_degree_order_relabels_by_decreasing_degree_and_gives_p_a_pt(weighted, rng):
    A = skewed_graph(rng, 3000, [900, 400, 400, 60], weighted)
    deg = np.diff(A.indptr)
    order, inverse, indptr = _degree_order_reference(A.indptr, 1)
    assert order.dtype == np.int32 and inverse.dtype == np.int32
    assert np.array_equal(np.sort(order), np.arange(3000))
    assert np.array_equal(inverse[order], np.arange(3000))
    new_deg = deg[order]
    assert np.all(np.diff(new_deg) <= 0)
    ties = np.flatnonzero(np.diff(new_deg) == 0)
    assert np.all(order[ties] < order[ties + 1])  # stable: equal degrees keep their order
    assert np.array_equal(indptr, np.concatenate([[0], np.cumsum(new_deg)]))
    B = _reference_reordered(A, order)
    for row0, row1 in ((0, 3000), (0, 7), (7, 3000), (1200, 2990)):
        part = _emulated_device_reorder(A, order, inverse, indptr, row0, row1)
        assert (part != B[row0:row1]).nnz == 0
    # exp is invariant: exp(P A P^T) P x = P exp(A) x, so y = y'[inverse]
    x = rng.standard_normal(3000)
    y, _ = expm_multiply(A, x, beta=0.05, backend="cpu")
    y_new, _ = expm_multiply(B, x[order], beta=0.05, backend="cpu")
    assert rel(y_new[inverse], y) <= 1e-12


def test_auto_reorder_from_size_and_skew():
    from graphkern.expm.plans import REORDER_MIN_NNZ, REORDER_SKEW, choose_reorder
    from graphkern.expm.lanczos import CsrMatrix

    def degrees(deg):
        indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
        return CsrMatrix(indptr, np.zeros(int(indptr[-1]), dtype=np.int32), None)  # only degrees matter here

    n = REORDER_MIN_NNZ // 8
    regular = np.full(n, 8)
    skewed = regular.copy()
    skewed[:3] = REORDER_SKEW * 9
    assert choose_reorder(degrees(skewed)) == "degree"
    assert choose_reorder(degrees(regular)) == "none"
    assert choose_reorder(degrees(skewed[: n // 4])) == "none"  # too small to leave L2
    mild = regular.copy()
    mild[:3] = REORDER_SKEW * 8 - 20
    assert choose_reorder(degrees(mild)) == "none"


def test_cpu_runs_in_the_given_order(rng):
    A = skewed_graph(rng, 2000, [800, 300])
    x = rng.standard_normal(2000)
    y, info = expm_multiply(A, x, beta=0.1, backend="cpu", reorder="auto")
    y2, info2 = expm_multiply(A, x, beta=0.1, backend="cpu", reorder="none")
    assert info.reorder == "none" and info2.reorder == "none" and info.times["reorder"] == 0.0
    assert np.array_equal(y, y2)
    assert rel(y, scipy.sparse.linalg.expm_multiply(0.1 * A, x)) <= 1e-10


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_degree_ordered_spmv_variants_match_scipy(variant, dtype, weighted, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.api import _matrix
    A = skewed_graph(rng, 12000, [9000, 5000, 1100, 700, 40], weighted)
    mat = _matrix(A)
    x = rng.standard_normal(A.shape[0])
    solver = GpuLanczos(mat, dtype, devices=[0], variant=variant, basis="device", max_krylov=4,
                        breakdown=0.0, n_threads=2, reorder="degree")
    assert solver.order is not None
    y = solver.spmv(x)  # in A's order: x permuted on the device, y back on the host
    ref = A @ x.astype(dtype).astype(np.float64)
    assert np.max(np.abs(y - ref)) <= TOL[dtype] * np.max(np.abs(ref)) * 10
    # the operator the device built is P A P^T (row by row; columns need not be sorted)
    rows = solver.shares[0].rows
    B = _reference_reordered(A, solver.order.order)
    indptr = rows.indptr.to_host()
    assert np.array_equal(indptr, B.indptr)
    indices = rows.indices.to_host()[:B.nnz]
    for i in rng.choice(A.shape[0], 300, replace=False).tolist() + [0, 1, 2]:
        got = np.sort(indices[indptr[i]:indptr[i + 1]])
        assert np.array_equal(got, np.sort(B.indices[B.indptr[i]:B.indptr[i + 1]])), i
    if weighted:
        values = rows.values[np.dtype(dtype)].to_host()[:B.nnz]
        built = sp.csr_matrix((values.astype(np.float64), indices, indptr), shape=A.shape)
        assert abs(built - B).max() <= (0.0 if dtype == np.float64 else 1e-6 * B.data.max())


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["rowblock", "hybrid"])
@pytest.mark.parametrize("reorder", ["degree", "none"])
def test_gpu_task_grids_give_the_same_bits(variant, reorder, rng):
    """The task kernels with the resident grid and with a block per task: the same SpMV bits (a
    row's sum does not depend on which block takes its task), and an expm within rounding (alpha's
    block partials are grouped differently)."""
    from graphkern.expm import clear_cache
    from graphkern.expm.api import _matrix
    from graphkern.expm.gpu import GpuLanczos
    # ~2.3M nonzeros: more stream tasks (2048 nonzeros each) than an H100 holds blocks (6 x 132)
    A = skewed_graph(rng, 700_000, [90000, 5000, 1100, 700, 40], weighted=False)
    x = rng.standard_normal(A.shape[0])
    spmv, expm, grids = {}, {}, {}
    for grid in ("resident", "tasks"):
        clear_cache()
        solver = GpuLanczos(_matrix(A), np.float64, devices=[0], variant=variant, basis="device", max_krylov=4,
                            breakdown=0.0, n_threads=2, reorder=reorder, task_grid=grid)
        grids[grid] = solver.shares[0].spmv_grid
        spmv[grid] = solver.spmv(x)
        del solver
        clear_cache()
        expm[grid], info = expm_multiply(A, x, beta=0.05, backend="gpu", spmv=variant, reorder=reorder,
                                         task_grid=grid)
        assert info.task_grid == grid
    assert grids["tasks"] > grids["resident"]
    assert np.array_equal(spmv["tasks"], spmv["resident"])
    assert rel(expm["tasks"], expm["resident"]) <= 1e-13
    clear_cache()


@pytest.mark.parametrize("name, value", [("task_grid", "everything"), ("exchange", "teleport"), ("task_grid", None),
                                         ("exchange", 3)])
def test_bad_options_are_refused_before_any_work(name, value):
    with pytest.raises(ValueError, match=name):
        expm_multiply(_sym(), backend="cpu", **{name: value})


def test_options_are_read_at_call_time_and_recorded(rng, monkeypatch):
    """The exchange and grid options are arguments recorded with the result; the environment
    variables that once chose them are ignored."""
    monkeypatch.setenv("GRAPHKERN_EXPM_EXCHANGE", "teleport")
    monkeypatch.setenv("GRAPHKERN_EXPM_TASK_GRID", "everything")
    A = random_graph(rng, 40, 0.2, weighted=True)
    _, info = expm_multiply(A, beta=0.2, backend="cpu")
    assert info.exchange is None and info.task_grid is None  # CPU: neither applies


@pytest.mark.gpu
@pytest.mark.parametrize("basis", ["device", "host", "none"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_reordered_expm_matches_dense_and_unordered(basis, dtype, rng):
    A = skewed_graph(rng, 700, [500, 200, 90], weighted=True)
    x = rng.standard_normal(700)
    ref = scipy.linalg.expm(0.05 * A.toarray()) @ x  # ||0.05 A|| ~ 1.5: expm is exact to ~1e-14
    tol = 1e-12 if dtype == np.float64 else 2e-5
    y1, info1 = expm_multiply(A, x, beta=0.05, backend="gpu", basis=basis, dtype=dtype, reorder="degree", tol=1e-12)
    y0, info0 = expm_multiply(A, x, beta=0.05, backend="gpu", basis=basis, dtype=dtype, reorder="none", tol=1e-12)
    assert info1.reorder == "degree" and info0.reorder == "none"
    assert rel(y1, ref) <= tol and rel(y0, ref) <= tol and rel(y1, dense_funm(0.05 * A, x, np.exp)) <= tol
    assert rel(y1, y0) <= (1e-11 if dtype == np.float64 else 3e-5)
    assert abs(info1.krylov_dim - info0.krylov_dim) <= 4
    # default x (ones) and total communicability take the same path
    tc, info = total_communicability(A, beta=0.05, backend="gpu", dtype=dtype, basis=basis, reorder="degree")
    assert rel(tc, dense_funm(0.05 * A, np.ones(700), np.exp)) <= tol and info.reorder == "degree"


@pytest.mark.gpu
def test_gpu_reorder_is_built_once_and_reported(rng):
    clear_cache()
    A = skewed_graph(rng, 20000, [9000, 3000, 200], weighted=True)
    x = rng.standard_normal(20000)
    y1, info1 = expm_multiply(A, x, beta=0.05, backend="gpu", reorder="degree")
    uploads = cache_info()["uploads"]
    y2, info2 = expm_multiply(A, x, beta=0.05, backend="gpu", reorder="degree")
    assert info1.times["reorder"] > 0.0 and info2.times["reorder"] == 0.0 and info2.cached
    assert 0.0 < info1.times["reorder"] <= info1.times["setup"]
    assert cache_info()["uploads"] == uploads and np.array_equal(y1, y2)
    # the other order is its own resident operator, and both agree with SciPy
    y3, info3 = expm_multiply(A, x, beta=0.05, backend="gpu", reorder="none")
    assert info3.reorder == "none" and cache_info()["uploads"] == uploads + 1
    ref = scipy.sparse.linalg.expm_multiply(0.05 * A, x)
    assert rel(y1, ref) <= 1e-10 and rel(y3, ref) <= 1e-10
    # a new dtype builds its values in the new order on the device
    y4, info4 = expm_multiply(A, x, beta=0.05, backend="gpu", reorder="degree", dtype=np.float32)
    assert info4.times["reorder"] > 0.0 and rel(y4, ref) <= 3e-5


@pytest.mark.gpu
def test_gpu_auto_reorders_large_skewed_graphs(rng):
    n = 300_000
    A = skewed_graph(rng, n, [250_000, 150_000, 100_000])  # ~1.9e6 nonzeros, max degree >> 32 x mean
    assert A.nnz >= 1_000_000
    x = rng.standard_normal(n)
    y, info = expm_multiply(A, x, beta=0.02, backend="gpu")
    assert info.reorder == "degree"
    y_none, info_none = expm_multiply(A, x, beta=0.02, backend="gpu", reorder="none")
    assert info_none.reorder == "none"
    y_cpu, _ = expm_multiply(A, x, beta=0.02, backend="cpu")  # SciPy would need ~10^4 SpMVs here
    assert rel(y, y_none) <= 1e-11 and rel(y, y_cpu) <= 1e-11
    _, small = expm_multiply(skewed_graph(rng, 3000, [2000]), backend="gpu")
    assert small.reorder == "none"


@pytest.mark.gpu
def test_gpu_reordered_overflow_is_scaled(rng):
    A = skewed_graph(rng, 400, [300, 120], weighted=True)
    lam = np.linalg.eigvalsh(A.toarray())[-1]
    beta = 900.0 / lam
    x = rng.standard_normal(400)
    y, info = expm_multiply(A, x, beta=beta, backend="gpu", reorder="degree")
    y0, info0 = expm_multiply(A, x, beta=beta, backend="gpu", reorder="none")
    assert info.log_scale > 0 and np.all(np.isfinite(y))
    assert abs(info.log_scale - info0.log_scale) <= 1e-9 * info0.log_scale
    assert rel(y, y0) <= 1e-10


@pytest.mark.gpu
def test_gpu_first_call_counts_what_it_uploads_and_matches_the_cpu(rng):
    """A degree-ordered first call sends A's indices, values and row pointers as stored, but not the
    order (built on the device); the warm call sends nothing; the answer is the CPU's."""
    A = skewed_graph(rng, 30000, [25000, 9000, 4097], weighted=True)
    n = A.shape[0]
    clear_cache()
    before = cache_info()["upload_bytes"]
    y, info = expm_multiply(A, beta=0.01, backend="gpu", reorder="degree")
    assert info.reorder == "degree"
    sent = cache_info()["upload_bytes"] - before
    assert 4 * A.nnz + 8 * A.nnz + 2 * A.indptr.nbytes <= sent < 4 * A.nnz + 8 * A.nnz + 2 * A.indptr.nbytes + 8 * n
    before = cache_info()["upload_bytes"]
    y_warm, _ = expm_multiply(A, beta=0.01, backend="gpu", reorder="degree")
    assert cache_info()["upload_bytes"] == before
    ref, _ = expm_multiply(A, beta=0.01, backend="cpu")
    assert rel(y, ref) < 1e-10 and rel(y_warm, y) < 1e-12


@pytest.mark.gpu
def test_gpu_staged_copies_side_by_side_arrive_whole(rng):
    """A's background upload runs beside the order's: staged copies at once, more chunks than lanes,
    and back through the staged download."""
    from concurrent.futures import ThreadPoolExecutor

    from graphkern._cuda import runtime as rt

    dev = rt.get_device(0)
    n = rt.STAGING_CHUNK * (rt.STAGING_THREADS_MAX + 3) // 8 + 5
    data = [rng.standard_normal(n) for _ in range(3)]
    bufs = [rt.alloc(dev, n, np.float64) for _ in data]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(rt.copy_from_pageable, bufs, data))
    for buf, d in zip(bufs, data):
        np.testing.assert_array_equal(buf.to_host(), d)
        out = np.empty_like(d)
        rt.copy_to_pageable(buf, out)
        np.testing.assert_array_equal(out, d)
