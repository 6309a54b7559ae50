"""exp(beta A) x, f(beta A) x and total communicability: every backend against dense SciPy references,
eigen-expansions and scipy.sparse.linalg.expm_multiply; breakdown, overflow, basis modes, SpMV
variants, several GPUs, and bad input."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg

from graphkern import Graph
from graphkern.expm import ExpmInfo, expm_multiply, funm_multiply, total_communicability

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
TOL = {np.float64: 1e-12, np.float32: 1e-5}


# ----------------------------------------------------------------------------- graphs

def random_graph(rng, n, p, weighted=False):
    """Symmetric G(n, p) adjacency without self-loops (uniform weights in [0.5, 2) when weighted)."""
    upper = sp.triu(sp.random(n, n, density=p, random_state=rng, format="csr"), k=1)
    upper.data[:] = rng.uniform(0.5, 2.0, upper.nnz) if weighted else 1.0
    return (upper + upper.T).tocsr()


def skewed_graph(rng, n, hub_degrees, weighted=False):
    """A sparse random graph plus hubs of the given degrees and a few isolated vertices: rows from
    empty to longer than several GPU thread blocks."""
    base = sp.triu(sp.random(n, n, density=3.0 / n, random_state=rng, format="coo"), k=1)
    rows, cols = [base.row], [base.col]
    for hub, deg in zip(rng.choice(n - 10, len(hub_degrees), replace=False), hub_degrees):
        rows.append(np.full(deg, hub))
        cols.append(rng.choice(n - 10, deg, replace=False))
    r, c = np.concatenate(rows), np.concatenate(cols)
    keep = r != c
    A = sp.csr_matrix((np.ones(keep.sum()), (r[keep], c[keep])), shape=(n, n))
    A = ((A + A.T) > 0).astype(np.float64).tocsr()  # the last ten vertices stay isolated
    if weighted:
        A = sp.triu(A, k=1).tocsr()
        A.data = rng.uniform(0.5, 2.0, A.nnz)
        A = (A + A.T).tocsr()
    return A


def grid_graph(rows, cols):
    path = lambda k: sp.diags([np.ones(k - 1), np.ones(k - 1)], [-1, 1])
    return (sp.kron(path(rows), sp.eye(cols)) + sp.kron(sp.eye(rows), path(cols))).tocsr()


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - b) / np.linalg.norm(b))


def dense_funm(A, x, f):
    """f(A) x from the symmetric eigendecomposition (accurate to a few ulps of the largest term,
    unlike scipy.linalg.expm, whose squaring phase loses digits once ||A|| passes ~10)."""
    lam, V = np.linalg.eigh(A.toarray())
    return V @ (f(lam) * (V.T @ x))


# ----------------------------------------------------------------------------- accuracy

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_dense_expm(backend, dtype, weighted, rng):
    n = int(rng.integers(30, 70))
    A = random_graph(rng, n, 0.12, weighted)
    x = rng.standard_normal(n)
    beta = float(rng.uniform(0.1, 0.8))  # ||beta A|| small enough for scipy.linalg.expm to be exact to 1e-12
    y, info = expm_multiply(A, x, beta=beta, dtype=dtype, backend=backend, tol=1e-12)
    ref = scipy.linalg.expm(beta * A.toarray()) @ x
    assert y.dtype == dtype and y.shape == (n,)
    assert rel(y, ref) <= TOL[dtype]
    assert rel(y, dense_funm(beta * A, x, np.exp)) <= TOL[dtype]
    assert isinstance(info, ExpmInfo) and info.converged and info.log_scale == 0.0
    assert info.backend == backend and 1 <= info.krylov_dim <= n
    assert info.error_estimate <= 1e-12
    assert set(info.times) >= {"spmv", "vector", "host", "total"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_input_and_default_x(backend, rng):
    A = random_graph(rng, 40, 0.15, weighted=True)
    G = Graph.from_scipy(A)
    y_graph, _ = expm_multiply(G, beta=0.7, backend=backend)
    y_csr, _ = expm_multiply(A, np.ones(40), beta=0.7, backend=backend)
    ref = scipy.linalg.expm(0.7 * A.toarray()) @ np.ones(40)
    assert rel(y_graph, ref) <= 1e-11 and rel(y_csr, ref) <= 1e-11


@pytest.mark.parametrize("backend", BACKENDS)
def test_eigen_expansion_breaks_down_after_its_dimension(backend, rng):
    A = random_graph(rng, 60, 0.1, weighted=True)
    lam, V = np.linalg.eigh(A.toarray())
    # well-separated eigenvalues: a cluster leaves rounding noise of 1e4 ulps in beta_3
    while True:
        picks = np.sort(rng.choice(60, 3, replace=False))
        if np.diff(lam[picks]).min() >= 0.5:
            break
    coeff = rng.uniform(0.5, 2.0, 3)
    x = V[:, picks] @ coeff
    beta = 0.8
    y, info = expm_multiply(A, x, beta=beta, backend=backend)
    ref = V[:, picks] @ (coeff * np.exp(beta * lam[picks]))
    assert info.breakdown and info.converged and info.krylov_dim == 3
    assert rel(y, ref) <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eigenvector_returns_at_once(backend, dtype, rng):
    A = random_graph(rng, 50, 0.2)
    lam, V = np.linalg.eigh(A.toarray())
    k = int(rng.integers(0, 50))
    y, info = expm_multiply(A, V[:, k], beta=0.5, backend=backend, dtype=dtype)
    assert info.breakdown and info.krylov_dim <= 2
    assert rel(y, math.exp(0.5 * lam[k]) * V[:, k]) <= 10 * TOL[dtype]


@pytest.mark.parametrize("backend", BACKENDS)
def test_disconnected_graph(backend, rng):
    A1, A2 = random_graph(rng, 30, 0.2), random_graph(rng, 25, 0.25, weighted=True)
    triangle = sp.csr_matrix(np.ones((3, 3)) - np.eye(3))
    A = sp.block_diag([A1, A2, triangle]).tocsr()
    x = rng.standard_normal(58)
    y, info = expm_multiply(A, x, beta=1.0, backend=backend, tol=1e-12)
    assert rel(y, dense_funm(A, x, np.exp)) <= 1e-12
    # x on one component only: the others stay exactly zero
    x_first = np.concatenate([x[:30], np.zeros(28)])
    y, info = expm_multiply(A, x_first, beta=1.0, backend=backend, tol=1e-12)
    assert np.all(y[30:] == 0.0)
    assert rel(y[:30], dense_funm(A1, x[:30], np.exp)) <= 1e-12
    # on the triangle (eigenvalues 2, -1, -1) the Krylov space has dimension 2: exact breakdown
    x_triangle = np.concatenate([np.zeros(55), [1.0, 2.0, 4.0]])
    y, info = expm_multiply(A, x_triangle, beta=1.0, backend=backend)
    assert info.breakdown and info.krylov_dim == 2 and np.all(y[:55] == 0.0)
    assert rel(y[55:], scipy.linalg.expm(triangle.toarray()) @ x_triangle[55:]) <= 1e-14


@pytest.mark.parametrize("backend", BACKENDS)
def test_medium_graph_against_scipy_expm_multiply(backend, rng):
    import networkx as nx
    G = nx.barabasi_albert_graph(3000, 3, seed=int(rng.integers(1 << 30)))
    A = nx.to_scipy_sparse_array(G, format="csr", dtype=np.float64)
    x = rng.standard_normal(3000)
    y, info = expm_multiply(A, x, beta=0.3, backend=backend)
    ref = scipy.sparse.linalg.expm_multiply(0.3 * sp.csr_matrix(A), x)
    assert rel(y, ref) <= 1e-10 and info.converged
    assert info.krylov_dim < 100


@pytest.mark.parametrize("backend", BACKENDS)
def test_total_communicability_and_normalisations(backend, rng):
    A = random_graph(rng, 45, 0.15)
    tc_ref = dense_funm(1.3 * A, np.ones(45), np.exp)
    tc, info = total_communicability(A, beta=1.3, backend=backend, tol=1e-12)
    assert rel(tc, tc_ref) <= 1e-12
    lam1 = np.linalg.eigvalsh(A.toarray())[-1]
    assert abs(info.lambda_max - lam1) <= 1e-9 * lam1
    tc_n, _ = total_communicability(A, beta=1.3, normalize="n", backend=backend, tol=1e-12)
    assert rel(tc_n, tc_ref / 45) <= 1e-12
    tc_l, info_l = total_communicability(A, beta=1.3, normalize="lambda_max", backend=backend, tol=1e-12)
    assert rel(tc_l, tc_ref * math.exp(-1.3 * info_l.lambda_max)) <= 1e-12
    assert np.all(tc_l <= math.sqrt(45) + 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_beta_and_weighted(backend, rng):
    A = random_graph(rng, 40, 0.2, weighted=True)
    x = rng.standard_normal(40)
    y, _ = expm_multiply(A, x, beta=-0.9, backend=backend, tol=1e-12)
    assert rel(y, dense_funm(-0.9 * A, x, np.exp)) <= 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_funm_named_and_callable(backend, rng):
    A = random_graph(rng, 50, 0.12, weighted=True)
    lam, V = np.linalg.eigh(A.toarray())
    x = rng.standard_normal(50)
    beta = 0.6

    def dense(f):
        return V @ (f(beta * lam) * (V.T @ x))

    for name, f in (("cosh", np.cosh), ("sinh", np.sinh), ("exp", np.exp)):
        y, info = funm_multiply(A, x, name, beta=beta, backend=backend, tol=1e-12)
        assert rel(y, dense(f)) <= 1e-12, name
    gauss = lambda z: np.exp(-z ** 2 / 4)
    y, info = funm_multiply(A, x, gauss, beta=beta, backend=backend, tol=1e-12)
    assert rel(y, dense(gauss)) <= 1e-10 and info.log_scale == 0.0
    # the callable sees beta * theta: f = exp with beta is expm_multiply with beta
    y_callable, _ = funm_multiply(A, x, np.exp, beta=beta, backend=backend)
    y_exp, _ = expm_multiply(A, x, beta=beta, backend=backend)
    assert rel(y_callable, y_exp) <= 1e-13


# ----------------------------------------------------------------------------- overflow

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,beta_lambda", [(np.float64, 900.0), (np.float32, 120.0)])
def test_overflow_returns_a_scaled_finite_result(backend, dtype, beta_lambda, rng):
    A = random_graph(rng, 80, 0.3)
    lam, V = np.linalg.eigh(A.toarray())
    beta = beta_lambda / lam[-1]
    x = rng.uniform(0.5, 1.5, 80)
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite((V * np.exp(beta * lam).astype(dtype)) @ (V.T @ x)))  # the plain answer overflows
    y, info = expm_multiply(A, x, beta=beta, dtype=dtype, backend=backend)
    assert y.dtype == dtype and np.all(np.isfinite(y))
    assert info.log_scale > math.log(np.finfo(dtype).max)
    assert abs(info.log_scale - beta * lam[-1]) <= 1e-6 * beta * lam[-1]
    # in log space: y * exp(log_scale) = V exp(beta lam) V^T x
    ref_scaled = V @ (np.exp(beta * (lam - lam[-1])) * (V.T @ x))
    y_scaled = y.astype(np.float64) * np.exp(info.log_scale - beta * lam[-1])
    assert rel(y_scaled, ref_scaled) <= (1e-9 if dtype == np.float64 else 1e-3)
    assert np.max(np.abs(np.log(y_scaled) - np.log(ref_scaled))) <= (1e-9 if dtype == np.float64 else 1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_overflow_means_plain_answer(backend, rng):
    A = random_graph(rng, 40, 0.2)
    y, info = expm_multiply(A, np.ones(40), beta=5.0, dtype=np.float32, backend=backend)
    assert info.log_scale == 0.0 and np.all(np.isfinite(y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_never_returns_nan_silently(backend, rng):
    A = random_graph(rng, 40, 0.3, weighted=True)
    x = rng.standard_normal(40)
    ref = dense_funm(0.5 * A, x, np.exp)
    A.data *= 1e37  # A q overflows float32 unless A is scaled
    y, info = expm_multiply(A, x, beta=0.5e-37, dtype=np.float32, backend=backend)
    assert info.log_scale == 0.0 and rel(y, ref) <= 1e-5
    y, info = expm_multiply(A, x, beta=1.0, dtype=np.float32, backend=backend)  # e^(1e37): log-scaled
    assert np.all(np.isfinite(y)) and info.log_scale > 1e37
    B = random_graph(rng, 40, 0.3)
    with pytest.raises(FloatingPointError, match="overflows float32"):
        funm_multiply(B, np.ones(40), np.exp, beta=20.0, dtype=np.float32, backend=backend)


# ----------------------------------------------------------------------------- modes, threads, limits

@pytest.mark.parametrize("backend", BACKENDS)
def test_basis_modes_agree(backend, rng):
    A = skewed_graph(rng, 2500, [1500, 300])
    x = rng.standard_normal(2500)
    ref = scipy.sparse.linalg.expm_multiply(0.15 * A, x)
    results = {}
    for basis in ("auto", "device", "host", "none"):
        y, info = expm_multiply(A, x, beta=0.15, backend=backend, basis=basis)
        assert rel(y, ref) <= 1e-11, basis
        results[basis] = (y, info)
    for basis in ("host", "none", "auto"):
        assert rel(results[basis][0], results["device"][0]) <= 1e-13
    # the basis-free mode reruns the recurrence: twice the SpMVs, same Krylov dimension
    assert results["none"][1].krylov_dim == results["device"][1].krylov_dim
    assert results["none"][1].n_spmv > results["device"][1].krylov_dim


def test_thread_counts_agree(rng):
    A = skewed_graph(rng, 3000, [2000])
    x = rng.standard_normal(3000)
    y1, _ = expm_multiply(A, x, beta=0.2, backend="cpu", n_threads=1)
    y3, _ = expm_multiply(A, x, beta=0.2, backend="cpu", n_threads=3)
    # other chunkings add the dot products in another order: a few ulps, seen up to 1.2e-14
    assert rel(y3, y1) <= 5e-14


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_vector_and_one_vertex(backend):
    A = sp.csr_matrix(np.array([[0, 1], [1, 0]], dtype=float))
    y, info = expm_multiply(A, np.zeros(2), backend=backend)
    assert np.all(y == 0) and info.krylov_dim == 0
    one = sp.csr_matrix(np.array([[2.0]]))
    y, info = expm_multiply(one, np.array([3.0]), beta=0.5, backend=backend)
    assert abs(y[0] - 3 * math.e) <= 1e-14 * 3 * math.e and info.converged


@pytest.mark.parametrize("backend", BACKENDS)
def test_not_converging_warns(backend, rng):
    A = random_graph(rng, 200, 0.05)
    with pytest.warns(RuntimeWarning, match="not converged"):
        y, info = expm_multiply(A, np.ones(200), beta=2.0, max_krylov=3, backend=backend)
    assert not info.converged and info.krylov_dim == 3


# ----------------------------------------------------------------------------- bad input

def _sym(n=6):
    return random_graph(np.random.default_rng(0), n, 0.5)


@pytest.mark.parametrize("call,error,match", [
    (lambda: expm_multiply(sp.csr_matrix(np.triu(np.ones((4, 4)), 1))), ValueError, "not symmetric"),
    (lambda: expm_multiply(sp.csr_matrix(np.array([[0, np.nan], [np.nan, 0]]))), ValueError, "NaN or infinite"),
    (lambda: expm_multiply(sp.csr_matrix(np.array([[0, np.inf], [np.inf, 0]]))), ValueError, "NaN or infinite"),
    (lambda: expm_multiply(sp.csr_matrix((3, 4))), ValueError, "square"),
    (lambda: expm_multiply(np.eye(3)), TypeError, "scipy.sparse"),
    (lambda: expm_multiply(sp.csr_matrix((0, 0))), ValueError, "x is empty"),
    (lambda: expm_multiply(_sym(), np.zeros(0)), ValueError, "x is empty"),
    (lambda: expm_multiply(_sym(), np.ones(5)), ValueError, "x has length 5 but A has 6 rows"),
    (lambda: expm_multiply(_sym(), np.ones((6, 1))), ValueError, "1-D vector"),
    (lambda: expm_multiply(_sym(), np.array([1, 1, np.nan, 1, 1, 1.0])), ValueError, "non-finite value .* index 2"),
    (lambda: expm_multiply(_sym(), np.ones(6) * 1j), TypeError, "complex"),
    (lambda: expm_multiply(_sym(), beta=float("nan")), ValueError, "beta must be finite"),
    (lambda: expm_multiply(_sym(), beta=float("inf")), ValueError, "beta must be finite"),
    (lambda: expm_multiply(_sym(), beta="1"), TypeError, "beta must be a real number"),
    (lambda: expm_multiply(_sym(), tol=0.0), ValueError, r"tol must be in \(0, 1\)"),
    (lambda: expm_multiply(_sym(), tol=1.0), ValueError, r"tol must be in \(0, 1\)"),
    (lambda: expm_multiply(_sym(), tol=-1e-3), ValueError, r"tol must be in \(0, 1\)"),
    (lambda: expm_multiply(_sym(), max_krylov=0), ValueError, "max_krylov must be >= 1"),
    (lambda: expm_multiply(_sym(), max_krylov=2.5), TypeError, "max_krylov must be an int"),
    (lambda: expm_multiply(_sym(), check_every=0), ValueError, "check_every must be >= 1"),
    (lambda: expm_multiply(_sym(), spmv="csr5"), ValueError, "spmv must be 'auto' or one of"),
    (lambda: expm_multiply(_sym(), basis="disk"), ValueError, "basis must be one of"),
    (lambda: expm_multiply(_sym(), reorder="rcm"), ValueError, "reorder must be one of"),
    (lambda: total_communicability(_sym(), reorder=None), ValueError, "reorder must be one of"),
    (lambda: funm_multiply(_sym(), np.ones(6), "cosh", backend="cpu", reorder="degree"), ValueError,
     "GPU backend only"),
    (lambda: expm_multiply(_sym(), dtype=np.int32), ValueError, "dtype must be one of"),
    (lambda: expm_multiply(_sym(), backend="tpu"), ValueError, "backend must be one of"),
    (lambda: expm_multiply(_sym(), n_threads=0), ValueError, "n_threads must be >= 1"),
    (lambda: funm_multiply(_sym(), np.ones(6), "log"), ValueError, "f must be one of"),
    (lambda: funm_multiply(_sym(), np.ones(6), 3), TypeError, "f must be"),
    (lambda: funm_multiply(_sym(), np.ones(6), lambda z: z[:1]), ValueError, "one value per eigenvalue"),
    (lambda: funm_multiply(_sym(), np.ones(6), lambda z: np.log(z - 100)), ValueError, "f returned NaN"),
    (lambda: total_communicability(_sym(), normalize="max"), ValueError, "normalize must be"),
])
def test_bad_input_is_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------- GPU: SpMV variants, devices

def _spmv_graphs(rng, weighted):
    # 30,000 vertices: degree-ordered, the gathers meet columns on both sides of hot_cols (12,288 in
    # float64, 24,576 in float32)
    return {
        "skewed": skewed_graph(rng, 30000, [9000, 5000, 1100, 700, 40], weighted),
        "regular": grid_graph(60, 70) if not weighted else skewed_graph(rng, 4200, [], weighted),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_gpu_spmv_variants_match_scipy(variant, dtype, weighted, reorder, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.plans import hot_columns
    from graphkern.expm.api import _matrix
    for kind, A in _spmv_graphs(rng, weighted).items():
        mat = _matrix(A)
        x = rng.standard_normal(A.shape[0])
        solver = GpuLanczos(mat, dtype, devices=[0], variant=variant, basis="device", max_krylov=4,
                            breakdown=0.0, n_threads=2, reorder=reorder)
        assert solver.shares[0].hot_cols == hot_columns(reorder, dtype)
        y = solver.spmv(x)
        ref = A @ x.astype(dtype).astype(np.float64)
        assert np.max(np.abs(y - ref)) <= TOL[dtype] * np.max(np.abs(ref)) * 10, (kind, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("devices, exchange", [([0], "store"),
                                               pytest.param([0, 1], "store", marks=pytest.mark.multigpu),
                                               pytest.param([0, 1], "copy", marks=pytest.mark.multigpu)])
def test_split_alpha_sum_gives_the_same_bits(devices, exchange, rng, monkeypatch):
    """alpha's block partials added by lanczos_sum_partials (grids of more than
    SPLIT_SUM_BLOCKS_PER_SM blocks per SM) or by the SpMV's last block: the same sum in the same
    order, so the same bits, with long rows (their shares are added last), in both orders and, on
    two devices, with both exchanges."""
    import graphkern.expm.gpu as eg
    from graphkern.expm import clear_cache
    A = skewed_graph(rng, 12000, [9000, 5000, 1100, 40], weighted=True)
    x = rng.standard_normal(12000)
    for reorder in ("none", "degree"):
        out = {}
        for split in (False, True):
            monkeypatch.setattr(eg, "SPLIT_SUM_BLOCKS_PER_SM", 0 if split else 10**9)
            clear_cache()
            y, info = expm_multiply(A, x, beta=0.1, backend="gpu", device=devices, spmv="rowblock", reorder=reorder,
                                    exchange=exchange)
            out[split] = (y, info.krylov_dim)
        assert out[True][1] == out[False][1] and np.array_equal(out[True][0], out[False][0]), reorder
        assert rel(out[True][0], scipy.sparse.linalg.expm_multiply(0.1 * A, x)) <= 1e-10
    clear_cache()


def test_hot_columns_cover_96_kib_of_x_only_in_degree_order():
    from graphkern.expm.plans import hot_columns
    empty = 1 << 31  # no second range
    assert hot_columns("degree", np.float64) == (12288, empty)
    assert hot_columns("degree", np.float32) == (24576, empty)
    assert hot_columns("degree", np.float64, [0, 70000]) == (12288, empty)
    all_columns = (np.iinfo(np.int32).max, empty)
    assert hot_columns("none", np.float64) == hot_columns("none", np.float32) == all_columns
    assert hot_columns("none", np.float64, [0, 500, 1000]) == all_columns


def test_hot_columns_start_every_devices_block_in_degree_order():
    """Dealt round robin by degree, each device's block of rows begins with its share of the hubs:
    the hot columns are half the budget at the start of each of the first two blocks."""
    from graphkern.expm.plans import hot_columns
    assert hot_columns("degree", np.float64, [0, 35000, 70000]) == (6144, 35000)
    assert hot_columns("degree", np.float32, [0, 35000, 70000]) == (12288, 35000)
    assert hot_columns("degree", np.float64, [0, 25, 50, 75]) == (6144, 25)


def test_degree_order_deals_the_hubs_to_the_start_of_every_block(rng):
    from graphkern.expm.lanczos import DegreeOrder
    A = skewed_graph(rng, 3000, [900, 500, 110, 70], weighted=False)
    indptr = A.indptr.astype(np.int64)
    order = DegreeOrder(indptr, 2)
    deg = np.diff(indptr)[order.order]
    b = order.bounds
    top = np.sort(np.diff(indptr))[::-1]
    # the four largest degrees: the first two columns of each block
    assert sorted([deg[b[0]], deg[b[0] + 1], deg[b[1]], deg[b[1] + 1]], reverse=True) == list(top[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_equals_cpu(variant, dtype, rng):
    A = skewed_graph(rng, 6000, [5000, 1200, 60], weighted=True)
    x = rng.standard_normal(6000)
    y_gpu, info = expm_multiply(A, x, beta=0.1, backend="gpu", spmv=variant, dtype=dtype)
    y_cpu, _ = expm_multiply(A, x, beta=0.1, backend="cpu", dtype=dtype)
    ref = scipy.sparse.linalg.expm_multiply(0.1 * A, x)
    # float32 (unit roundoff 6e-8): the hub rows sum up to 5000 products per SpMV, so each backend
    # lands within a few 1e-5 of the answer, in its own direction (H100 runs measured
    # 2.5e-5 against SciPy for the GPU, and 4.06e-5 between GPU and CPU, on fresh random graphs):
    # each within 5e-5, hence within 1e-4 of each other.  The 1e-5 of small dense graphs is
    # checked by test_matches_dense_expm (both backends).
    assert rel(y_gpu, ref) <= (1e-10 if dtype == np.float64 else 5e-5)
    assert rel(y_cpu, ref) <= (1e-10 if dtype == np.float64 else 5e-5)
    assert rel(y_gpu, y_cpu) <= (1e-12 if dtype == np.float64 else 1e-4)
    assert info.backend == "gpu" and info.devices == (0,) and info.spmv in ("scalar", "vector", "rowblock", "hybrid")
    assert info.times["spmv"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("devices", [[0], pytest.param([0, 1], marks=pytest.mark.multigpu)])
@pytest.mark.parametrize("basis", ["device", "auto", "host", "none"])
def test_gates_skip_the_lookahead_and_leave_the_answer_bit_for_bit(devices, basis, rng, monkeypatch):
    """Steps queued past the check point that fixes the Krylov dimension are skipped at their gates:
    a stream held at the start of every queued interval makes each interval's gates read the host's
    decision, so exactly m first-pass SpMVs run, and the answer is the same bits as with no gates
    (and stays so in the solves after a skipped one, which reuse the workspace and its counters)."""
    import graphkern.expm.gpu as eg
    from graphkern._cuda import runtime as rt
    from graphkern.expm import clear_cache
    clear_cache()
    A = skewed_graph(rng, 9000, [7000, 2000, 300], weighted=True)
    x = rng.standard_normal(9000)
    kw = dict(beta=0.1, backend="gpu", device=devices, spmv="rowblock", basis=basis, reorder="degree", check_every=4)
    enqueue = eg.GpuLanczos.enqueue

    def held(self, k0, k1):
        if k0 > 0:
            for s in self.shares:
                rt.hold_stream(s.stream, 0.03)
        enqueue(self, k0, k1)

    monkeypatch.setattr(eg, "CANCEL_LOOKAHEAD", False)
    y_ref, info_ref = expm_multiply(A, x, **kw)
    monkeypatch.setattr(eg, "CANCEL_LOOKAHEAD", True)
    monkeypatch.setattr(eg.GpuLanczos, "enqueue", held)
    second = info_ref.n_spmv - (info_ref.krylov_dim + 4)  # basis "none": the second pass
    for _ in range(2):
        y, info = expm_multiply(A, x, **kw)
        assert info.krylov_dim == info_ref.krylov_dim
        assert np.array_equal(y, y_ref)
        assert info.n_spmv == info.krylov_dim + second < info_ref.n_spmv
    monkeypatch.setattr(eg.GpuLanczos, "enqueue", enqueue)
    y, info = expm_multiply(A, x, **kw)
    assert np.array_equal(y, y_ref) and info.krylov_dim <= info.n_spmv - second <= info.krylov_dim + 4
    assert rel(y_ref, scipy.sparse.linalg.expm_multiply(0.1 * A, x)) <= 1e-10
    clear_cache()


@pytest.mark.gpu
def test_gpu_bad_device_is_refused():
    with pytest.raises(ValueError, match="does not exist"):
        expm_multiply(_sym(), backend="gpu", device=999)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("basis", ["device", "host", "none"])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_two_gpus_equal_one(variant, basis, reorder, rng):
    A = skewed_graph(rng, 9000, [7000, 2000, 300], weighted=True)
    x = rng.standard_normal(9000)
    y1, info1 = expm_multiply(A, x, beta=0.1, backend="gpu", device=0, spmv=variant, basis=basis, reorder="none")
    y2, info2 = expm_multiply(A, x, beta=0.1, backend="gpu", device=[0, 1], spmv=variant, basis=basis,
                              reorder=reorder)
    y21, _ = expm_multiply(A, x, beta=0.1, backend="gpu", device=[1, 0], spmv=variant, basis=basis, reorder=reorder)
    # alpha and beta are summed in another order on two devices (and rows in another order when
    # degree-ordered): rounding-level differences only
    assert info2.devices == (0, 1) and info2.reorder == reorder and abs(info2.krylov_dim - info1.krylov_dim) <= 4
    assert rel(y2, y1) <= 1e-11 and rel(y21, y1) <= 1e-11


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_two_gpu_spmv_matches_scipy(variant, reorder, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.api import _matrix
    A = skewed_graph(rng, 12000, [9000, 5000, 40], weighted=True)
    x = rng.standard_normal(12000)
    solver = GpuLanczos(_matrix(A), np.float64, devices=[0, 1], variant=variant, basis="none", max_krylov=4,
                        breakdown=0.0, n_threads=2, reorder=reorder)
    if reorder == "degree":  # the vertices dealt round robin by degree: equal rows, nonzeros within a hub
        assert abs(solver.shares[0].nrows - solver.shares[1].nrows) <= 1
        assert abs(solver.shares[0].rows.nnz - solver.shares[1].rows.nnz) <= 9000
    ref = A @ x
    assert np.max(np.abs(solver.spmv(x) - ref)) <= 1e-12 * np.max(np.abs(ref))


def mirrored_halves_graph(rng, half, weighted=False):
    """A graph whose two halves mirror each other (vertex v and v + half have the same neighbourhood
    up to the shift), so that two devices in A's order split it exactly at ``half``: a random graph
    on the first fifth of each half (rows whose columns are all local), a random bipartite graph
    between the second fifths of the two halves (all remote), a few vertices joined to both (mixed),
    and the rest isolated (empty rows)."""
    q = half // 5
    a = sp.triu(sp.random(q, q, density=6.0 / q, random_state=rng, format="coo"), k=1)
    local_r, local_c = a.row, a.col
    b = sp.random(q, q, density=5.0 / q, random_state=rng, format="coo")  # (u, v): u in half 0, v in half 1
    cross_r, cross_c = q + b.row, q + b.col
    mixed = rng.choice(q, 3, replace=False)  # local vertices that also reach the other half
    rows, cols = [local_r, local_r + half], [local_c, local_c + half]
    rows += [cross_r, cross_c]
    cols += [cross_c + half, cross_r + half]  # (u, v + half) and its mirror (v, u + half)
    for m in mixed:
        far = rng.choice(q, 40, replace=False)
        rows += [np.full(40, m), np.full(40, m + half)]
        cols += [far + half, far]
    r, c = np.concatenate(rows), np.concatenate(cols)
    values = rng.uniform(0.5, 2.0, len(r)) if weighted else np.ones(len(r))
    upper = sp.csr_matrix((values, (r, c)), shape=(2 * half, 2 * half))
    upper.sum_duplicates()
    upper.data[:] = np.minimum(upper.data, 2.0) if weighted else 1.0
    return (upper + upper.T).tocsr()


def test_mirrored_halves_graph_has_local_remote_and_empty_rows(rng):
    from graphkern.expm.lanczos import row_chunks
    half = 1500
    A = mirrored_halves_graph(rng, half)
    assert abs(A - A.T).max() == 0
    assert row_chunks(A.indptr, 2)[1] == half  # two devices split it between the halves
    owner = (np.arange(2 * half) >= half)
    deg = np.diff(A.indptr)
    row_of = np.repeat(np.arange(2 * half), deg)
    remote = owner[A.indices] != owner[row_of]
    remote_per_row = np.bincount(row_of, weights=remote, minlength=2 * half)
    assert np.any((deg > 0) & (remote_per_row == 0))      # all columns local
    assert np.any((deg > 0) & (remote_per_row == deg))    # all columns remote
    assert np.any((remote_per_row > 0) & (remote_per_row < deg))  # both
    assert np.any(deg == 0)                                # empty rows


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_degree_order_is_dealt_round_robin_across_devices(parts, rng):
    from graphkern.expm.lanczos import CsrMatrix, DegreeOrder
    A = skewed_graph(rng, 3001, [900, 400, 400, 60])
    deg = np.diff(A.indptr)
    by_degree = DegreeOrder(A.indptr).order
    assert np.all(np.diff(deg[by_degree]) <= 0)
    o = DegreeOrder(A.indptr, parts)
    assert np.array_equal(np.sort(o.order), np.arange(3001))
    assert np.array_equal(o.inverse[o.order], np.arange(3001))
    assert np.array_equal(o.indptr, np.concatenate([[0], np.cumsum(deg[o.order])]))
    assert o.bounds[0] == 0 and o.bounds[-1] == 3001 and len(o.bounds) == parts + 1
    assert np.all(np.abs(np.diff(o.bounds) - 3001 / parts) < 1)
    block_nnz = np.diff(o.indptr[o.bounds])
    assert block_nnz.max() - block_nnz.min() <= deg.max()  # each block gets every parts-th row by degree
    for p in range(parts):
        block = o.order[o.bounds[p]:o.bounds[p + 1]]
        assert np.array_equal(block, by_degree[p::parts])  # its hubs first, degrees decreasing
    # the device reorder of each block is that block of P A P^T, and exp is invariant
    B = _reference_reordered(A, o.order)
    for p in range(parts):
        part = _emulated_device_reorder(A, o, int(o.bounds[p]), int(o.bounds[p + 1]))
        assert (part != B[o.bounds[p]:o.bounds[p + 1]]).nnz == 0
    mat = CsrMatrix(A.indptr, A.indices.astype(np.int32), None)
    assert mat.degree_order(parts) is mat.degree_order(parts)  # computed once per device count
    if parts == 1:
        assert np.array_equal(mat.degree_order(1).order, by_degree)


def _devices_available():
    from graphkern._cuda import runtime
    return runtime.device_count() if runtime.unavailable_reason() is None else 0


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("exchange", ["store", "copy"])
@pytest.mark.parametrize("basis", ["device", "none", "host"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["mirrored halves", "skewed degree-ordered"])
def test_multi_gpu_exchanges_agree_with_one_gpu_and_scipy(exchange, basis, dtype, kind, rng):
    from graphkern.expm.api import _matrix
    from graphkern.expm.gpu import GpuLanczos
    if kind == "mirrored halves":
        A, reorder, beta = mirrored_halves_graph(rng, 1500, weighted=True), "none", 0.2
    else:
        A, reorder, beta = skewed_graph(rng, 9001, [7000, 2000, 300, 300], weighted=True), "degree", 0.1
    n = A.shape[0]
    x = rng.standard_normal(n)
    ref = scipy.sparse.linalg.expm_multiply(beta * A, x)
    y1, info1 = expm_multiply(A, x, beta=beta, backend="gpu", device=0, basis=basis, dtype=dtype, reorder=reorder)
    # float32: sums of up to 7000 terms in a different order on each device count; each answer is
    # held to the float64 one first (so a failure says which is off), two answers to twice that
    near = 1e-10 if dtype == np.float64 else 1e-4
    assert rel(y1, ref) <= near
    tol = 1e-11 if dtype == np.float64 else 2 * near
    counts = [2, 3] if _devices_available() >= 3 else [2]
    for count in counts:
        devices = list(range(count))
        solver = GpuLanczos(_matrix(A), dtype, devices=devices, variant="rowblock", basis=basis, max_krylov=8,
                            breakdown=0.0, n_threads=2, reorder=reorder, exchange=exchange)
        assert solver.exchange == ("copy" if exchange == "copy" or not solver.res.peer_access else "store")
        solver_exchange = solver.exchange
        if kind == "mirrored halves" and count == 2:
            assert solver.shares[0].row1 == 1500  # rows with all columns local, all remote, none
        del solver
        for variant in ("scalar", "rowblock", "hybrid"):
            y, info = expm_multiply(A, x, beta=beta, backend="gpu", device=devices, basis=basis, dtype=dtype,
                                    spmv=variant, reorder=reorder, exchange=exchange)
            assert info.devices == tuple(devices) and info.reorder == reorder
            assert info.exchange == solver_exchange
            assert abs(info.krylov_dim - info1.krylov_dim) <= 4
            assert rel(y, ref) <= near, (count, variant)
            assert rel(y, y1) <= tol, (count, variant)
        # the device list in another order: another lead device, the same answer
        y_rev, _ = expm_multiply(A, x, beta=beta, backend="gpu", device=devices[::-1], basis=basis, dtype=dtype,
                                 reorder=reorder, exchange=exchange)
        assert rel(y_rev, y1) <= tol


@pytest.mark.gpu
@pytest.mark.multigpu
def test_multi_gpu_exchanges_give_the_same_bits(rng):
    """Stores and copies move the same numbers: the two exchanges give bit-identical answers (and
    repeated runs too), with the default x, overflow scaling, and a device left without rows."""
    A = skewed_graph(rng, 6000, [4000, 900], weighted=True)
    x = rng.standard_normal(6000)
    out = {}
    _, probe = expm_multiply(A, x, beta=0.1, backend="cpu")
    beta_big = 800.0 / probe.lambda_max  # e^800 overflows float64: a scaled answer
    for exchange in ("store", "copy", "store"):
        kw = dict(backend="gpu", device=[0, 1], exchange=exchange)
        for reorder in ("none", "degree"):
            y, info = expm_multiply(A, x, beta=0.1, reorder=reorder, **kw)
            tc, _ = total_communicability(A, beta=0.1, reorder=reorder, **kw)
            big, big_info = expm_multiply(A, x, beta=beta_big, reorder=reorder, **kw)
            assert big_info.log_scale > 0 and np.all(np.isfinite(big))
            key = (exchange, reorder)
            if key in out:
                assert all(np.array_equal(a, b) for a, b in zip(out[key], (y, tc, big)))
            out[key] = (y, tc, big)
    for reorder in ("none", "degree"):
        assert all(np.array_equal(a, b) for a, b in zip(out[("store", reorder)], out[("copy", reorder)]))
    y_one, _ = expm_multiply(A, x, beta=0.1, backend="gpu", device=0, reorder="none")
    assert rel(out[("store", "none")][0], y_one) <= 1e-11
    # fewer rows than devices leave one device with none
    tiny = sp.csr_matrix(np.array([[0.0]]))
    y_tiny, _ = expm_multiply(tiny, np.array([2.0]), beta=1.0, backend="gpu", device=[0, 1])
    assert np.allclose(y_tiny, [2.0], rtol=1e-15)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("kind", ["mirrored halves", "grid"])
def test_peer_masks_mark_the_rows_other_devices_read(kind, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.api import _matrix
    A = mirrored_halves_graph(rng, 1500) if kind == "mirrored halves" else grid_graph(80, 75)
    n = A.shape[0]
    solver = GpuLanczos(_matrix(A), np.float64, devices=[0, 1], variant="scalar", basis="none", max_krylov=4,
                        breakdown=0.0, n_threads=2, reorder="none")
    if not solver.res.peer_access:
        pytest.skip("no peer access between devices 0 and 1: the copy exchange sends every row")
    for r, other in ((solver.res.rows[0], solver.res.rows[1]), (solver.res.rows[1], solver.res.rows[0])):
        read = np.zeros(n, dtype=bool)
        read[A[other.row0:other.row1].indices] = True
        assert np.array_equal(r.peer_mask.to_host()[:r.nrows] != 0, read[r.row0:r.row1])
    if kind == "grid":  # only the rows along the cut cross: one grid row of 75 (and a neighbour when cut mid-row)
        assert int(np.count_nonzero(solver.res.rows[0].peer_mask.to_host()[:solver.res.rows[0].nrows])) <= 76
    x = rng.standard_normal(n)
    y, _ = expm_multiply(A, x, beta=0.3, backend="gpu", device=[0, 1], spmv="scalar", reorder="none")
    assert rel(y, scipy.sparse.linalg.expm_multiply(0.3 * A, x)) <= 1e-10


@pytest.mark.gpu
@pytest.mark.multigpu
def test_bad_exchange_is_refused():
    with pytest.raises(ValueError, match="exchange"):
        expm_multiply(_sym(), backend="gpu", device=[0, 1], exchange="teleport")


# ----------------------------------------------------------------------------- the matrix cache

import gc

import graphkern.expm.api as expm_module
from graphkern.expm import cache_info, clear_cache


def _count_validations(monkeypatch):
    calls = []
    real = expm_module.as_csr_matrix
    monkeypatch.setattr(expm_module, "as_csr_matrix", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_reuses_a_matrix_until_it_changes(backend, rng, monkeypatch):
    validations = _count_validations(monkeypatch)
    A = random_graph(rng, 60, 0.1, weighted=True)
    x = rng.standard_normal(60)
    y1, info1 = expm_multiply(A, x, beta=0.5, backend=backend, tol=1e-12)
    y2, info2 = expm_multiply(A, x, beta=0.5, backend=backend, tol=1e-12)
    assert not info1.cached and info2.cached and len(validations) == 1
    assert np.array_equal(y1, y2)  # the same operator: bit for bit
    assert rel(y2, dense_funm(0.5 * A, x, np.exp)) <= 1e-12
    # an in-place edit of the values is seen, and the answer follows it
    A.data *= 2.0
    y3, info3 = expm_multiply(A, x, beta=0.5, backend=backend, tol=1e-12)
    assert not info3.cached and len(validations) == 2
    assert rel(y3, dense_funm(0.5 * A, x, np.exp)) <= 1e-12
    # replaced arrays (same contents) and an equal new matrix are new operators
    A.data = A.data.copy()
    _, info4 = expm_multiply(A, x, beta=0.5, backend=backend)
    assert not info4.cached
    _, info5 = expm_multiply(A.copy(), x, beta=0.5, backend=backend)
    assert not info5.cached
    # clear_cache(A) forgets it; the next call validates again
    _, info6 = expm_multiply(A, x, beta=0.5, backend=backend)
    assert info6.cached
    clear_cache(A)
    _, info7 = expm_multiply(A, x, beta=0.5, backend=backend)
    assert not info7.cached


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_sees_an_edit_of_a_graph_and_of_its_structure(backend, rng):
    A = random_graph(rng, 50, 0.15, weighted=True)
    G = Graph.from_scipy(A)
    y1, _ = expm_multiply(G, beta=0.4, backend=backend, tol=1e-12)
    if G.weights.flags.writeable:
        G.weights[:] = rng.uniform(0.5, 2.0, G.nnz)
        G.weights[:] = G.to_scipy().maximum(G.to_scipy().T).data  # keep it symmetric
        y2, info = expm_multiply(G, beta=0.4, backend=backend, tol=1e-12)
        assert not info.cached
        assert rel(y2, dense_funm(0.4 * G.to_scipy(), np.ones(50), np.exp)) <= 1e-12
    else:  # a Graph whose arrays are read-only cannot change behind the cache
        with pytest.raises(ValueError, match="read-only"):
            G.weights[:] = 1.0
        _, info = expm_multiply(G, beta=0.4, backend=backend, tol=1e-12)
        assert info.cached
    # the same pattern with other column indices (a permutation of the vertices)
    B = random_graph(rng, 50, 0.15)
    y_b, _ = expm_multiply(B, beta=0.4, backend=backend, tol=1e-12)
    perm = rng.permutation(50)
    B_perm = B[perm][:, perm].tocsr()
    B.indptr[:], B.indices[:] = B_perm.indptr, B_perm.indices
    y_perm, info = expm_multiply(B, beta=0.4, backend=backend, tol=1e-12)
    assert not info.cached and rel(y_perm, y_b[perm]) <= 1e-12


def test_cache_entries_go_with_their_matrices(rng):
    clear_cache()
    A = random_graph(rng, 30, 0.2)
    expm_multiply(A, backend="cpu")
    assert cache_info()["matrices"] == 1
    del A
    gc.collect()
    assert cache_info()["matrices"] == 0
    kept = [random_graph(rng, 20, 0.3) for _ in range(expm_module._matrices.max_entries + 5)]
    for M in kept:
        expm_multiply(M, backend="cpu")
    assert cache_info()["matrices"] == expm_module._matrices.max_entries
    _, info = expm_multiply(kept[-1], backend="cpu")
    assert info.cached
    _, info = expm_multiply(kept[0], backend="cpu")  # the least recently used went first
    assert not info.cached


def test_formats_without_flat_arrays_are_validated_every_time(rng):
    A = random_graph(rng, 40, 0.2).tolil()
    y1, info1 = expm_multiply(A, beta=0.3, backend="cpu")
    y2, info2 = expm_multiply(A, beta=0.3, backend="cpu")
    assert not info1.cached and not info2.cached and np.array_equal(y1, y2)
    A[0, 1] = A[1, 0] = 5.0
    y3, _ = expm_multiply(A, beta=0.3, backend="cpu", tol=1e-12)
    assert rel(y3, dense_funm(0.3 * A.tocsr(), np.ones(40), np.exp)) <= 1e-12


@pytest.mark.parametrize("fmt", ["csc", "coo", "bsr", "dia"])
def test_cached_formats(fmt, rng):
    A = random_graph(rng, 40, 0.2, weighted=True).asformat(fmt)
    y1, info1 = expm_multiply(A, beta=0.3, backend="cpu", tol=1e-12)
    y2, info2 = expm_multiply(A, beta=0.3, backend="cpu", tol=1e-12)
    assert not info1.cached and info2.cached and np.array_equal(y1, y2)
    A.data *= 0.5
    y3, info3 = expm_multiply(A, beta=0.3, backend="cpu", tol=1e-12)
    assert not info3.cached
    assert rel(y3, dense_funm(0.3 * A.tocsr(), np.ones(40), np.exp)) <= 1e-12


def test_setup_time_is_reported(rng):
    A = random_graph(rng, 40, 0.2)
    _, info = expm_multiply(A, backend="cpu")
    assert set(info.times) >= {"setup", "spmv", "vector", "host", "output", "total"}
    assert 0.0 <= info.times["setup"] <= info.times["total"]


@pytest.mark.gpu
def test_gpu_second_call_reuses_the_device_operator(rng):
    from graphkern._cuda import runtime as rt
    clear_cache()
    A = skewed_graph(rng, 20000, [9000, 3000, 200], weighted=True)
    x = rng.standard_normal(20000)
    before = cache_info()
    y1, info1 = expm_multiply(A, x, beta=0.05, backend="gpu", spmv="rowblock")
    after_first = cache_info()
    y2, info2 = expm_multiply(A, x, beta=0.05, backend="gpu", spmv="rowblock")
    after_second = cache_info()
    assert after_first["uploads"] == before["uploads"] + 1 and after_first["plans"] == before["plans"] + 1
    assert after_second["uploads"] == after_first["uploads"] and after_second["plans"] == after_first["plans"]
    assert not info1.cached and info2.cached and after_second["resident"] >= 1
    assert np.array_equal(y1, y2)
    assert rel(y2, scipy.sparse.linalg.expm_multiply(0.05 * A, x)) <= 1e-10
    # another variant and dtype on the same matrix reuse the upload; each builds only its own part
    y3, info3 = expm_multiply(A, x, beta=0.05, backend="gpu", spmv="hybrid", dtype=np.float32)
    assert cache_info()["uploads"] == after_second["uploads"] and info3.cached
    assert rel(y3, y2) <= 3e-5
    # an in-place edit uploads again and the answer follows it
    A.data[::7] *= 1.5
    A = (A + A.T).tocsr()  # a new, symmetric matrix object
    y4, info4 = expm_multiply(A, x, beta=0.05, backend="gpu", spmv="rowblock")
    assert not info4.cached and cache_info()["uploads"] == after_second["uploads"] + 1
    assert rel(y4, scipy.sparse.linalg.expm_multiply(0.05 * A, x)) <= 1e-10
    B = skewed_graph(rng, 20000, [5000], weighted=True)
    _, info = expm_multiply(B, x, beta=0.05, backend="gpu")
    B.data *= 2.0  # in place, same arrays
    y5, info5 = expm_multiply(B, x, beta=0.05, backend="gpu")
    assert not info5.cached
    assert rel(y5, scipy.sparse.linalg.expm_multiply(0.05 * B, x)) <= 1e-10
    # a dropped matrix frees its device memory
    resident = cache_info()["device_bytes"]
    held_before = rt.get_device(0).allocated_bytes()  # other processes on the GPU do not move it
    del A, B
    gc.collect()
    assert cache_info()["device_bytes"] < resident
    assert rt.get_device(0).allocated_bytes() < held_before


@pytest.mark.gpu
def test_gpu_graph_with_other_weights_is_seen(rng):
    A = random_graph(rng, 3000, 0.002, weighted=True)
    G = Graph.from_scipy(A)
    y1, _ = expm_multiply(G, beta=0.3, backend="gpu")
    G = Graph(G.indptr, G.indices, G.weights * 0.5)  # same structure, other content: a new cache key
    y2, info = expm_multiply(G, beta=0.3, backend="gpu")
    assert not info.cached
    assert rel(y2, scipy.sparse.linalg.expm_multiply(0.15 * A, np.ones(3000))) <= 1e-10
    y3, info = expm_multiply(G, beta=0.3, backend="gpu")
    assert info.cached and np.array_equal(y2, y3)


@pytest.mark.gpu
def test_gpu_least_recently_used_operators_are_evicted(rng):
    from graphkern.expm.device import MAX_RESIDENT
    clear_cache()
    mats = [random_graph(rng, 4000, 0.002, weighted=True) for _ in range(MAX_RESIDENT + 2)]
    refs = [expm_multiply(M, beta=0.5, backend="gpu")[0] for M in mats]
    assert cache_info()["resident"] == MAX_RESIDENT
    # the evicted first matrix is uploaded again and gives the same answer
    uploads = cache_info()["uploads"]
    y, info = expm_multiply(mats[0], beta=0.5, backend="gpu")
    assert cache_info()["uploads"] == uploads + 1 and not info.cached
    assert np.array_equal(y, refs[0])
    clear_cache()
    assert cache_info()["resident"] == 0 and cache_info()["device_bytes"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_default_x_is_ones(dtype, rng):
    A = skewed_graph(rng, 5000, [3000, 100], weighted=True)
    y_default, _ = expm_multiply(A, beta=0.1, backend="gpu", dtype=dtype)
    y_ones, _ = expm_multiply(A, np.ones(5000), beta=0.1, backend="gpu", dtype=dtype)
    assert np.array_equal(y_default, y_ones)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_two_gpus_keep_their_own_operator(rng):
    A = skewed_graph(rng, 9000, [7000, 300], weighted=True)
    x = rng.standard_normal(9000)
    y1, _ = expm_multiply(A, x, beta=0.1, backend="gpu", device=[0, 1])
    y2, info = expm_multiply(A, x, beta=0.1, backend="gpu", device=[0, 1])
    assert info.cached and np.array_equal(y1, y2)
    y_one, info_one = expm_multiply(A, x, beta=0.1, backend="gpu", device=1)
    assert not info_one.cached  # a different device tuple is a different operator
    assert rel(y_one, y2) <= 1e-11


# ----------------------------------------------------------------------------- SpMV plans (host side)

def _plan_graphs(rng):
    return {
        "skewed": skewed_graph(rng, 30000, [25000, 9000, 4097, 4096, 1025, 1024, 600, 17, 16]),
        "empty rows": sp.block_diag([sp.csr_matrix((5000, 5000)), skewed_graph(rng, 3000, [2000])]).tocsr(),
        "grid": grid_graph(80, 90),
    }


@pytest.mark.parametrize("kind", ["skewed", "empty rows", "grid"])
def test_rowblock_plan_covers_every_row_once_within_the_kernel_limits(kind, rng):
    from graphkern.expm import plans as g
    A = _plan_graphs(rng)[kind]
    indptr = A.indptr.astype(np.int64)
    n = A.shape[0]
    plan = g.SpmvPlan("rowblock", indptr, 1.0)
    tasks = plan.tasks
    covered = np.zeros(n, dtype=np.int64)
    segments = {}
    last_row = -1
    for t in tasks:
        if t[0] == g.TASK_STREAM:
            r0, r1, e0, e1 = t[1:5]
            assert r0 > last_row and r0 < r1 <= n
            assert r1 - r0 <= g.STREAM_ROWS and e1 - e0 <= g.STREAM_CAPACITY
            assert e0 == indptr[r0] and e1 == indptr[r1]
            assert np.all(np.diff(indptr[r0:r1 + 1]) <= g.LONG_ROW)
            covered[r0:r1] += 1
            last_row = r1 - 1
        else:
            assert t[0] == g.TASK_LONG
            row, e0, e1, seg_base, seg_index, n_seg, long_index = t[1:]
            assert indptr[row + 1] - indptr[row] > g.LONG_ROW and 0 < e1 - e0 <= g.LONG_SEGMENT
            segments.setdefault(row, []).append((seg_index, e0, e1, seg_base, n_seg, long_index))
            last_row = row
    for row, segs in segments.items():
        segs.sort()
        assert [s[0] for s in segs] == list(range(segs[0][4]))
        assert segs[0][1] == indptr[row] and segs[-1][2] == indptr[row + 1]
        assert all(a[2] == b[1] for a, b in zip(segs, segs[1:]))
        assert len({s[3] for s in segs}) == 1 and len({s[5] for s in segs}) == 1
        covered[row] += 1
    assert np.all(covered == 1)
    bases = sorted({s[0][3] for s in segments.values()})
    assert plan.n_long == len(segments) and plan.n_segments == sum(len(s) for s in segments.values())
    assert sorted({s[0][5] for s in segments.values()}) == list(range(plan.n_long))
    assert bases == sorted(set(bases)) and (not bases or bases[0] == 0)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_rowblock_cuts_are_the_searchsorted_definition(dtype, rng):
    """The compiled pass gives the cuts of their NumPy definition: 0 and n, the first row reaching
    each multiple of the block cost (searchsorted), and both sides of every long row."""
    from graphkern._cpu.expm import rowblock_cuts
    from graphkern.expm import plans as g

    def reference(indptr):
        n = len(indptr) - 1
        cost = indptr[:-1].astype(np.int64) + np.arange(n)
        targets = np.arange(g.ROWBLOCK_COST, int(indptr[-1]) + n, g.ROWBLOCK_COST)
        long_rows = np.flatnonzero(np.diff(indptr) > g.LONG_ROW)
        return np.unique(np.concatenate([[0, n], np.searchsorted(cost, targets), long_rows, long_rows + 1]))

    draws = [lambda n: rng.integers(0, 5, n), lambda n: rng.zipf(1.5, n).clip(0, 50_000),
             lambda n: rng.integers(0, 3000, n), lambda n: np.eye(1, n, int(rng.integers(n)), dtype=int)[0] * 10**5]
    for draw in draws:
        for n in (1, 2, int(rng.integers(3, 4000))):
            indptr = np.concatenate([[0], np.cumsum(draw(n))]).astype(dtype)
            np.testing.assert_array_equal(rowblock_cuts(indptr, g.ROWBLOCK_COST, g.LONG_ROW), reference(indptr))


@pytest.mark.gpu
def test_gpu_timeline_has_each_devices_kernel_seconds():
    """info.timeline: per device its rows, SpMV, update and waiting seconds over the counted steps;
    the lead device's SpMV seconds are info.times["spmv"]."""
    A = skewed_graph(np.random.default_rng(3), 20000, [3000, 500])
    _, info = expm_multiply(A, beta=0.1, backend="gpu", device=0)
    (lead,) = info.timeline
    assert lead["device"] == 0 and lead["rows"] == A.shape[0] and 0 < lead["steps"] <= info.n_spmv
    assert lead["spmv"] == info.times["spmv"] and lead["vector"] > 0 and lead["wait"] >= 0
    _, cpu = expm_multiply(A, beta=0.1, backend="cpu")
    assert cpu.timeline == ()


@pytest.mark.parametrize("kind", ["skewed", "empty rows", "grid"])
def test_hybrid_plan_covers_every_row_once(kind, rng):
    from graphkern.expm import plans as g
    A = _plan_graphs(rng)[kind]
    indptr = A.indptr.astype(np.int64)
    n = A.shape[0]
    deg = np.diff(indptr)
    plan = g.SpmvPlan("hybrid", indptr, 1.0)
    covered = np.zeros(n, dtype=np.int64)
    for t in plan.tasks:
        if t[0] == g.TASK_LONG:
            if t[5] == 0:
                covered[t[1]] += 1
            continue
        rows = plan.rowlist[t[1]:t[2]]
        if t[0] == g.TASK_THREAD_LIST:
            assert t[2] - t[1] <= g.BLOCK and np.all(deg[rows] <= g.HYBRID_SHORT)
        else:
            assert t[0] == g.TASK_WARP_LIST and t[2] - t[1] <= g.HYBRID_ROWS_PER_WARP_BLOCK
            assert np.all((deg[rows] > g.HYBRID_SHORT) & (deg[rows] <= g.LONG_ROW))
        covered[rows] += 1
    assert np.all(covered == 1)


def test_auto_variant_from_degree_statistics(rng):
    from graphkern.expm.plans import choose_variant
    assert choose_variant(expm_module._matrix(grid_graph(30, 40))) == "scalar"
    assert choose_variant(expm_module._matrix(skewed_graph(rng, 3000, [1500]))) == "rowblock"
    assert choose_variant(expm_module._matrix(random_graph(rng, 400, 0.1))) == "rowblock"


def test_vector_lanes_round_the_mean_degree_on_a_log_scale():
    from graphkern.expm.plans import sub_warp_size
    assert [sub_warp_size(m) for m in (1.0, 3.9, 5.9, 10.0, 12.0, 40.0, 300.0)] == [2, 4, 8, 8, 16, 32, 32]


# ----------------------------------------------------------------------------- the answer's scale

def test_output_scaling_factors_are_finite_and_exact_in_log_space():
    from graphkern.expm.lanczos import OutputScaling
    for log_factor in (-1465.0, -1300.5, -700.0, -3.0, 0.0, 0.7, 599.0, 600.5, 1250.25, 1454.0):
        factors = OutputScaling.factors(log_factor)
        assert len(factors) == 3 and all(math.isfinite(f) and f > 0 for f in factors)
        assert abs(sum(math.log(f) for f in factors) - log_factor) <= 1e-12 * max(1.0, abs(log_factor))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_output_scaling_decisions(dtype):
    from graphkern.expm.lanczos import OutputScaling
    log_max = math.log(float(np.finfo(dtype).max))
    plain = OutputScaling(5.0, 1.0, dtype, True, "t")
    assert plain.decide(2.0) == (6.0, 0.0, True)
    assert plain.decide(0.0) == (0.0, 0.0, True)
    assert plain.decide(float("nan"))[2] is False and plain.decide(float("inf"))[2] is False
    big = OutputScaling(log_max + 50.0, 2.0, dtype, True, "t")
    assert big.decide(1.0) == (2.0, log_max + 50.0, True)
    huge = OutputScaling(log_max + 50.0, log_max + 10.0, dtype, True, "t")
    assert huge.decide(1.0) == (0.0, pytest.approx(2 * log_max + 60.0, rel=1e-15), True)
    with pytest.raises(FloatingPointError, match=f"overflows {np.dtype(dtype).name}"):
        OutputScaling(log_max + 50.0, 0.0, dtype, False, "t").decide(1.0)
    err = plain.error(np.array([1.0, np.nan, 2.0]), 0.0)
    assert isinstance(err, FloatingPointError) and "first at index 1" in str(err)


# ----------------------------------------------------------------------------- vertex order (reorder=)

def _reference_reordered(A, order):
    """P A P^T by SciPy fancy indexing: new vertex i is old vertex order[i]."""
    return A[order][:, order].tocsr()


def _emulated_device_reorder(A, deg_order, row0=0, row1=None):
    """What lanczos_permute_rows does, in NumPy: new row i (of [row0, row1)) takes old row order[i]
    with its columns mapped through inverse, entries kept in their old order."""
    row1 = A.shape[0] if row1 is None else row1
    indptr = deg_order.indptr[row0:row1 + 1] - deg_order.indptr[row0]
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    data = np.empty(int(indptr[-1]))
    for i in range(row1 - row0):
        old = deg_order.order[row0 + i]
        s0, s1 = A.indptr[old], A.indptr[old + 1]
        indices[indptr[i]:indptr[i + 1]] = deg_order.inverse[A.indices[s0:s1]]
        data[indptr[i]:indptr[i + 1]] = A.data[s0:s1]
    return sp.csr_matrix((data, indices, indptr), shape=(row1 - row0, A.shape[0]))


@pytest.mark.parametrize("weighted", [False, True])
def test_degree_order_relabels_by_decreasing_degree_and_gives_p_a_pt(weighted, rng):
    from graphkern.expm.lanczos import DegreeOrder
    A = skewed_graph(rng, 3000, [900, 400, 400, 60], weighted)
    deg = np.diff(A.indptr)
    o = DegreeOrder(A.indptr)
    assert o.order.dtype == np.int32 and o.inverse.dtype == np.int32
    assert np.array_equal(np.sort(o.order), np.arange(3000))
    assert np.array_equal(o.inverse[o.order], np.arange(3000))
    new_deg = deg[o.order]
    assert np.all(np.diff(new_deg) <= 0)
    ties = np.flatnonzero(np.diff(new_deg) == 0)
    assert np.all(o.order[ties] < o.order[ties + 1])  # stable: equal degrees keep their order
    assert np.array_equal(o.indptr, np.concatenate([[0], np.cumsum(new_deg)]))
    B = _reference_reordered(A, o.order)
    for row0, row1 in ((0, 3000), (0, 7), (7, 3000), (1200, 2990)):
        part = _emulated_device_reorder(A, o, row0, row1)
        assert (part != B[row0:row1]).nnz == 0
    # exp is invariant: exp(P A P^T) P x = P exp(A) x, so y = y'[inverse]
    x = rng.standard_normal(3000)
    y, _ = expm_multiply(A, x, beta=0.05, backend="cpu")
    y_new, _ = expm_multiply(B, x[o.order], beta=0.05, backend="cpu")
    assert rel(y_new[o.inverse], y) <= 1e-12


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
