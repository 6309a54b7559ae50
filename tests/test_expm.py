"""exp(beta A) x, f(beta A) x and total communicability: every backend against dense SciPy references,
eigen-expansions and scipy.sparse.linalg.expm_multiply; breakdown, overflow, basis modes, the matrix
cache, the answer's scale and bad input (the GPU's SpMV paths and several GPUs: test_expm_spmv.py; the
vertex order: test_expm_reorder.py; extreme scales: test_expm_reliability.py, test_expm_scales.py)."""

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
    # to the solver's tolerance (1e-10): a run that goes past the breakdown on rounding noise ends
    # there, not at the breakdown's rounding level
    assert rel(y, ref) <= 1e-10 and info.converged
    # beta_3 is rounding noise: a breakdown there, or (where the noise rounds above the threshold, or
    # the replay takes it for a coupling and goes on) a run that converges a few steps later
    assert (info.breakdown and info.krylov_dim == 3) or info.krylov_dim <= 10


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_eigenvector_returns_at_once(backend, dtype, rng):
    """An eigenvector the dtype holds exactly: on a circulant graph (vertex i joined to i +- each
    offset, n even), the vector of ones (eigenvalue 2 * offsets) or of alternating signs (eigenvalue
    2 * sum cos(pi * offset)).  A rounded eigenvector of a random graph keeps components of the others
    at the rounding level, which a rare draw lifts above the breakdown threshold (the run then goes on
    and converges, as it should)."""
    n = 2 * int(rng.integers(10, 40))
    offsets = rng.choice(np.arange(1, n // 2), 3, replace=False)
    rows = np.repeat(np.arange(n), 2 * len(offsets))
    cols = (rows + np.tile(np.concatenate([offsets, -offsets]), n)) % n
    A = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    if rng.random() < 0.5:
        x, lam = np.ones(n), 2.0 * len(offsets)
    else:
        x, lam = (-1.0) ** np.arange(n), float(sum(2 * (-1) ** int(o) for o in offsets))
    y, info = expm_multiply(A, x, beta=0.5, backend=backend, dtype=dtype)
    assert info.breakdown and info.krylov_dim <= 2
    assert rel(y, math.exp(0.5 * lam) * x) <= 10 * TOL[dtype]


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
def test_gpu_share_structs_kept_until_the_workspace_changes(rng, monkeypatch):
    """The SpMV's struct is packed once per matrix and workspace: a repeated solve (another beta
    too) packs nothing, another Krylov limit (a longer one with new coefficient arrays) packs again,
    and every answer is right."""
    from graphkern._cuda import runtime as rt

    packed = []
    pack = rt.Layout.pack

    def counting(self, **values):
        if ":spmv_share_" in self.name:
            packed.append(self.name)
        return pack(self, **values)

    monkeypatch.setattr(rt.Layout, "pack", counting)
    clear_cache()
    A = skewed_graph(rng, 5000, [2000, 300], weighted=True)
    x = rng.standard_normal(5000)
    counts = []
    for beta, max_krylov in ((0.05, 40), (0.05, 40), (0.02, 40), (0.05, 80), (0.05, 40)):
        y, _ = expm_multiply(A, x, beta=beta, max_krylov=max_krylov, backend="gpu", spmv="rowblock")
        assert rel(y, scipy.sparse.linalg.expm_multiply(beta * A, x)) <= 1e-10
        counts.append(len(packed))
    # the struct holds the Krylov limit: back to 40 packs once more
    assert counts == [1, 1, 1, 2, 3]


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
