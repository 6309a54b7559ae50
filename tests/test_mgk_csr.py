"""The CSR GPU solver of the marginalized graph kernel (techniques="csr") against the dense float64
solve, the CPU solver and the core GPU solver; its host-side data and shared-memory sizing."""

import math

import numpy as np
import pytest

from graphkern import NotConvergedError
from graphkern.mgk import csr as _mgk_csr
from graphkern.mgk.csr import csr_data, header_bytes, pair_shared_bytes
from graphkern.mgk.dense import dense_mgk, dense_mgk_pair
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk.results import solver_arguments

from conftest import SANITIZER, sanitized
from test_mgk import KERNELS, programs, random_graph, rel_err
from test_mgk_tiled import labeled_graph

gpu = pytest.mark.gpu


def sparse_set(rng):
    """A single vertex, no edges, self-loops, disconnected parts, an unweighted graph, a hub, very different sizes."""
    hub = random_graph(rng, 30, 0.05)
    return [random_graph(rng, 1), random_graph(rng, 6, 0.0), random_graph(rng, 2, 0.9),
            random_graph(rng, 9, components=3), random_graph(rng, 12, weighted=False), random_graph(rng, 17, 0.25),
            hub, random_graph(rng, 41, 0.08)]


def csr_kernel(name, **kw):
    nk, ek = KERNELS[name]
    return MarginalizedGraphKernel(nk, ek, backend="gpu", techniques="csr", **kw)


# ---------------------------------------------------------------------------- host side (no GPU)


def test_renumbered_csr_holds_the_same_graphs(rng):
    X = [random_graph(rng, n, d) for n, d in ((1, 0.5), (7, 0.0), (13, 0.3), (25, 0.15))]
    kern = MarginalizedGraphKernel(*KERNELS["general"], dtype=np.float64, backend="cpu")
    ds = kern._dataset(X, kern._settings())
    cd = csr_data(ds)
    assert csr_data(ds) is cd  # kept on the dataset
    for g, G in enumerate(X):
        v0, v1 = int(ds.node_offsets[g]), int(ds.node_offsets[g + 1])
        n = v1 - v0
        rows = cd.rowptr[v0:v1 + 1]
        lengths = np.diff(rows)
        assert np.all(lengths[:-1] >= lengths[1:])  # longest row first
        orig = cd.orig[v0:v1]
        assert sorted(orig.tolist()) == list(range(n))
        # the renumbered adjacency, weights and edge features, mapped back, are the graph's own
        A = np.zeros((n, n))
        F = np.zeros((n, n, ds.edge_features.shape[1]))
        for a in range(n):
            for k in range(rows[a], rows[a + 1]):
                i, j = orig[a], orig[cd.indices[k]]
                A[i, j] = cd.weights[k]
                F[i, j] = cd.edge_features[k]
        np.testing.assert_array_equal(A, G.to_scipy().toarray())
        e0 = int(ds.entry_offsets[g])
        r = np.repeat(np.arange(n), np.diff(G.indptr))
        F_given = np.zeros_like(F)
        F_given[r, G.indices] = ds.edge_features[e0:e0 + G.nnz]
        np.testing.assert_array_equal(F, F_given)
        np.testing.assert_array_equal(cd.degree[orig.argsort() + v0], ds.degree[v0:v1])
        np.testing.assert_array_equal(cd.node_features[v0:v1], ds.node_features[v0 + orig])


def test_shared_memory_sizing():
    # float: 16-byte records, p, row pointers; the general form adds the edge features
    assert pair_shared_bytes(4, "kronecker", 96, 96, 1080, 1080, 2) == 2160 * 16 + 9216 * 4 + 194 * 4
    assert pair_shared_bytes(8, "general", 3, 5, 4, 6, 2) == 10 * 32 + 15 * 8 + 10 * 2 * 8 + 10 * 4
    sizes = pair_shared_bytes(4, "constant", np.array([1, 260]), np.array([1, 260]), np.array([0, 1000]),
                              np.array([0, 3000]), 1)
    assert sizes[0] == 4 * 4 + 4 and sizes[1] > 227 * 1024  # the second must go to the core solver
    assert header_bytes(4, 5, 9) == _mgk_csr.REDUCE_BYTES + 32 + 48
    # gradients keep both search directions in shared memory
    assert (pair_shared_bytes(4, "kronecker", 96, 96, 1080, 1080, 2, directions=2)
            == pair_shared_bytes(4, "kronecker", 96, 96, 1080, 1080, 2) + 9216 * 4)


def test_csr_technique_is_accepted_and_leaves_the_cpu_alone(rng):
    X = [random_graph(rng, n) for n in (1, 5, 9)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.1, tol=1e-13, dtype=np.float64, backend="cpu", techniques="csr")
    assert kern.get_params()["techniques"] == "csr"
    assert rel_err(kern(X), dense_mgk(X, None, *programs("kronecker"), q=0.1)) < 1e-10
    with pytest.raises(ValueError, match="unknown preset"):
        MarginalizedGraphKernel(nk, ek, techniques="csv")


# ---------------------------------------------------------------------------- the GPU solver


@gpu
@pytest.mark.parametrize("name", list(KERNELS))
def test_gram_matrix_every_form_against_dense_cpu_and_core(rng, name):
    # under a sanitizer without the 41-vertex graph, under racecheck without the 30-vertex one too
    X = sparse_set(rng)[:sanitized(8, 7, race=6)]
    nk, ek = KERNELS[name]
    ref = dense_mgk(X, None, *programs(name), q=0.05)
    kern = csr_kernel(name, q=0.05, tol=1e-13, dtype=np.float64)
    K64 = kern(X)
    assert K64.dtype == np.float64 and kern.info_.backend == "gpu"
    assert kern.info_.solvers == {"csr": len(X) * (len(X) + 1) // 2}
    assert rel_err(K64, ref) < 1e-10
    np.testing.assert_array_equal(K64, K64.T)
    cpu = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="cpu")(X)
    assert rel_err(K64, cpu) < 1e-10
    core64 = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu",
                                     techniques="core")(X)
    assert rel_err(K64, core64) < 1e-10
    K32 = csr_kernel(name, q=0.05)(X)
    assert K32.dtype == np.float32
    assert rel_err(K32, ref) < 2e-5


@gpu
@pytest.mark.parametrize("dtype,tol,bound", [(np.float32, None, 2e-5), (np.float64, 1e-13, 1e-10)])
def test_rectangular_pairs_and_nodal(rng, dtype, tol, bound):
    X = [random_graph(rng, n) for n in (3, 10, 33)]
    Y = [random_graph(rng, n) for n in (1, 8, 21, 5, 6)]
    Y[4] = random_graph(rng, 6, 0.0)
    kern = csr_kernel("sqexp", q=0.1, p=0.5, tol=tol, dtype=dtype)
    ref = dense_mgk(X, Y, *programs("sqexp"), p=0.5, q=0.1)
    K = kern(X, Y)
    assert K.shape == (3, 5) and K.dtype == dtype
    assert rel_err(K, ref) < bound
    pairs = np.array([[2, 1], [0, 3], [2, 1], [1, 0], [2, 4]])
    np.testing.assert_allclose(kern(X, Y, pairs=pairs), ref[pairs[:, 0], pairs[:, 1]], rtol=bound)
    blocks = kern(X, Y, nodal=True, pairs=pairs)
    for (a, b), R in zip(pairs.tolist(), blocks):
        want = dense_mgk_pair(X[a], Y[b], *programs("sqexp"), p=0.5, q=0.1, nodal=True)
        assert R.shape == want.shape and R.dtype == dtype
        np.testing.assert_allclose(R, want, rtol=50 * bound, atol=bound * np.abs(want).max())
    full = kern(X, nodal=True)  # X vs X: the lower blocks are the transposed upper ones
    nx = [g.n_nodes for g in X]
    off = np.concatenate([[0], np.cumsum(nx)])
    for a in range(3):
        for b in range(3):
            want = dense_mgk_pair(X[a], X[b], *programs("sqexp"), p=0.5, q=0.1, nodal=True)
            got = full[off[a]:off[a + 1], off[b]:off[b + 1]]
            np.testing.assert_allclose(got, want, rtol=50 * bound, atol=bound * np.abs(want).max())
    kn = csr_kernel("sqexp", q=0.1, p=0.5, tol=tol, dtype=dtype, normalize=True)
    Kn = kn(X, Y)
    assert rel_err(Kn, ref / np.sqrt(np.outer(np.diag(dense_mgk(X, None, *programs("sqexp"), p=0.5, q=0.1)),
                                              np.diag(dense_mgk(Y, None, *programs("sqexp"), p=0.5, q=0.1))))) \
        < 5 * bound


@gpu
@pytest.mark.parametrize("name", ["kronecker", "general"])
def test_pairs_beyond_shared_memory_go_to_the_core_solver(rng, monkeypatch, name):
    X = sparse_set(rng)[:sanitized(8, 7)]  # under a sanitizer without the 41-vertex graph (the hub's 30 x 30
    # float64 search direction alone, 7,200 bytes, passes the limit below)
    nk, ek = KERNELS[name]
    q = sanitized(0.05, 0.05, race=0.5)  # under racecheck fewer CG iterations (every reference uses it too)
    ref = dense_mgk(X, None, *programs(name), q=q)
    kern = csr_kernel(name, q=q, tol=1e-13, dtype=np.float64)
    # a limit between the small and the large pairs' needs: both solvers run in one call (under racecheck
    # the pairs of the first three graphs and, just past the limit, the 9-vertex one's with itself: one
    # pair on the core solver, whose octile products are the costliest there)
    limit = csr_shared_need(kern, X, 3, 3, gradient=False) - 1 if SANITIZER == "racecheck" else 6000
    monkeypatch.setattr(_mgk_csr, "shared_memory_limit", lambda dev: limit)
    i, j = np.triu_indices(len(X))
    keep = sanitized(slice(None), slice(None), race=(j < 3) | ((i == 3) & (j == 3)))
    i, j = i[keep], j[keep]
    pair_arr = np.stack([i, j], axis=1).astype(np.int64)
    nodal = kern(X, nodal=True, pairs=pair_arr)
    assert kern.info_.solvers["csr"] > 0 and kern.info_.solvers["core"] > 0
    assert rel_err(kern(X, pairs=pair_arr), ref[i, j]) < 1e-10
    for (a, b), R in zip(pair_arr.tolist(), nodal):
        want = dense_mgk_pair(X[a], X[b], *programs(name), q=q, nodal=True)
        np.testing.assert_allclose(R, want, rtol=1e-8, atol=1e-12 * np.abs(want).max())


@gpu
def test_auto_runs_csr_and_tiled_in_one_call(rng, monkeypatch):
    from graphkern.mgk.tiled import TiledGPUEngine

    X = sparse_set(rng)
    nk, ek = KERNELS["kronecker"]
    ref = dense_mgk(X, None, *programs("kronecker"), q=0.05)
    kern = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu")  # auto
    monkeypatch.setattr(_mgk_csr, "shared_memory_limit", lambda dev: 6000)
    # auto: the GEMM solver takes the pairs where it wins, the CSR solver the rest that fit, the tiled solver the others
    chain = kern._router(kern._settings()).chain
    assert [name for name, _ in chain] == ["gemm", "csr", "tiled"]
    assert isinstance(chain[1][1], _mgk_csr.CSRGPUEngine) and isinstance(chain[2][1], TiledGPUEngine)
    assert rel_err(kern(X), ref) < 1e-10
    assert kern.info_.solvers["csr"] > 0 and kern.info_.solvers["tiled"] > 0
    # nothing fits: the tiled solver's own result, octile statistics included
    monkeypatch.setattr(_mgk_csr, "shared_memory_limit", lambda dev: 0)
    assert rel_err(kern(X), ref) < 1e-10
    assert kern.info_.octile_pairs is not None
    tiled = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu", techniques="tiled")
    assert [type(e) for _, e in tiled._router(tiled._settings()).chain] == [TiledGPUEngine]


@gpu
def test_pair_too_large_for_any_shared_memory(rng):
    # 260 x 260 vertex pairs: p alone (270 KB in float32) exceeds every GPU's shared memory per block.
    # Under a sanitizer the fewest vertices whose pair with itself passes this device's (float32 p
    # alone), their edges a path through the first 24: the core solver's octile products (one warp
    # per pair) are few, the rest of its CG over the 58,000-odd vertex pairs is the same
    if SANITIZER:
        from graphkern._cuda import runtime as rt

        n = math.isqrt(_mgk_csr.shared_memory_limit(rt.get_device(0)) // 4) + 1
        big = labeled_graph(rng, n, edges=[(k, k + 1) for k in range(23)] + [(k, k) for k in range(0, 24, 5)])
    else:
        big = random_graph(rng, 260, 0.01, self_loops=False)
    X = [big, random_graph(rng, 20, 0.2)]
    nk, ek = KERNELS["kronecker"]
    kern = csr_kernel("kronecker", q=0.05)
    K = kern(X)
    cpu = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-12, dtype=np.float64, backend="cpu")(X)
    assert rel_err(K, cpu) < 2e-5
    kern(X, pairs=np.array([[0, 0], [0, 1], [1, 1]]))
    assert kern.info_.solvers == {"csr": 2, "core": 1}


@gpu
def test_many_pairs_grid_stride_and_equal_to_core(rng):
    # more pairs than resident blocks: every block takes several pairs, largest first
    # (under a sanitizer graphs of up to 19 vertices: the same pairs, each a quarter of the work;
    # under racecheck up to 8, one octile each on the core solver)
    X = [random_graph(rng, int(n), float(d))
         for n, d in zip(rng.integers(1, sanitized(40, 20, race=9), 70), rng.uniform(0.02, 0.4, 70))]
    nk, ek = KERNELS["kronecker"]
    core = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu", techniques="core")(X)
    kern = csr_kernel("kronecker", q=0.05, tol=1e-13, dtype=np.float64)
    K = kern(X)
    assert rel_err(K, core) < 1e-10
    np.testing.assert_array_equal(K, K.T)
    assert np.linalg.eigvalsh(K).min() > -1e-10 * np.abs(K).max()
    perm = rng.permutation(len(X))
    np.testing.assert_allclose(kern([X[k] for k in perm]), K[np.ix_(perm, perm)], rtol=1e-10)


@gpu
def test_small_stopping_probability_non_convergence_and_gradient(rng):
    X = [random_graph(rng, n) for n in (4, 11, 16)]
    nk, ek = KERNELS["general"]
    ref = dense_mgk(X, None, *programs("general"), q=5e-4)
    kern = csr_kernel("general", q=5e-4, tol=1e-13, dtype=np.float64, max_iter=5000)
    assert rel_err(kern(X), ref) < 1e-9
    with pytest.raises(NotConvergedError) as info:
        csr_kernel("general", q=0.01, max_iter=2)(X)
    assert len(info.value.pairs) > 0 and np.all(info.value.iterations == 2)
    # gradients: the CSR solver's own, equal to the core solver's up to the tolerance
    core = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu", techniques="core")
    K_core, dK_core = core(X, eval_gradient=True)
    K, dK = csr_kernel("general", q=0.05, tol=1e-13, dtype=np.float64)(X, eval_gradient=True)
    np.testing.assert_allclose(K, K_core, rtol=1e-10)
    np.testing.assert_allclose(dK, dK_core, rtol=1e-9, atol=1e-12 * np.abs(dK_core).max())


# ---------------------------------------------------------------------------- gradients on the CSR solver


def csr_shared_need(kern, X, a, b, *, gradient=True):
    """The shared bytes the CSR solver (its own sizing) needs for the pair (X[a], X[b]) in a
    gradient solve, or (``gradient=False``) in a solve of K."""
    s = kern._settings(gradient=gradient)
    ds = kern._dataset(X, s)
    args = solver_arguments(ds, ds, s)
    router = kern._router(s)
    engine = dict(router.gradient_chain() if gradient else router.chain)["csr"]
    plan = kern._gradient_plan(s, ds, args) if gradient else None
    c1, c2, _, _, fixed, f1, f2, cross = engine._parts(ds, ds, args, plan)
    return int(fixed + f1[a] + f2[b] + cross * c1.n_nodes[a] * c2.n_nodes[b])


@gpu
@pytest.mark.parametrize("form", ["constant", "kronecker", "sqexp", "general", "general-one-group"])
def test_gradient_on_csr_and_fallback_against_cpu_and_finite_differences(rng, monkeypatch, form):
    """float64 and float32 gradients with some pairs on the CSR solver and the larger ones on the core
    solver's gradient in the same call: equal to the CPU's and to central differences of K."""
    from test_mgk_gradient import assert_gradient_close, finite_differences, make_kernel

    # under racecheck the first four graphs (up to 9 vertices) and q = 0.5 (every kernel here)
    X = sparse_set(rng)[:sanitized(7, 7, race=4)]
    seed = int(rng.integers(1 << 30))
    fast = sanitized({}, {}, race=dict(q=0.5))
    cpu = make_kernel(form, np.random.default_rng(seed), "cpu", **fast)
    gpu64 = make_kernel(form, np.random.default_rng(seed), "gpu", techniques="csr", **fast)
    # a limit between the small and the large pairs' gradient footprints: both solvers run (under
    # racecheck, where the core solver's octile products are the costliest part, just below the
    # 9-vertex graph's pair with itself: that pair on the core solver)
    limit = csr_shared_need(gpu64, X, 3, 3) - 1 if SANITIZER == "racecheck" else 9000
    monkeypatch.setattr(_mgk_csr, "shared_memory_limit", lambda dev: limit)
    Kc, dc = cpu(X, eval_gradient=True)
    Kg, dg = gpu64(X, eval_gradient=True)
    assert gpu64.info_.solvers["csr"] > 0 and gpu64.info_.solvers["core"] > 0
    assert rel_err(Kg, Kc) < 1e-10
    assert np.max(np.abs(dg - dc)) <= 1e-9 * np.max(np.abs(dc)), form
    names = [h.name for h in gpu64.hyperparameters if not h.fixed]
    # under a sanitizer the differences over a small, the 17-vertex and the hub graph (on the core
    # solver); under racecheck over the 2- and the 9-vertex graph (on the CSR solver)
    fd = sanitized(np.arange(len(X)), np.array([2, 5, 6]), race=np.array([2, 3]))
    assert_gradient_close(dg[np.ix_(fd, fd)], finite_differences(gpu64, [X[k] for k in fd]), Kg[np.ix_(fd, fd)], names)
    # both solves stop on their own residuals, as on the CPU (the lockstep runs a converged side no further)
    cpu(X, eval_gradient=True)
    info_c = cpu.info_
    gpu64(X, eval_gradient=True)
    info_g = gpu64.info_
    fwd_c = info_c.iterations - info_c.adjoint_iterations
    fwd_g = info_g.iterations - info_g.adjoint_iterations
    assert np.max(np.abs(fwd_g - fwd_c)) <= 2  # rounding may move the last iteration
    assert np.max(np.abs(info_g.adjoint_iterations - info_c.adjoint_iterations)) <= 2
    assert np.all(info_g.residuals <= 1e-13)

    gpu32 = make_kernel(form, np.random.default_rng(seed), "gpu", techniques="csr", dtype=np.float32, tol=None,
                        gradient_dtype=None, **fast)
    K32, d32 = gpu32(X, eval_gradient=True)
    assert K32.dtype == d32.dtype == np.float32
    assert rel_err(K32, Kc) < 2e-5
    assert np.max(np.abs(d32 - dc)) <= 1e-4 * np.max(np.abs(dc)), form


@gpu
@pytest.mark.parametrize("dtype,tol,bound", [(np.float32, None, 1e-4), (np.float64, 1e-13, 1e-9)])
def test_default_solver_gradient_runs_on_csr(rng, dtype, tol, bound):
    """techniques='auto' computes gradients on the GEMM solver where it takes the pair and on the CSR
    solver otherwise (no octile statistics: the core solver did not run), normalized and rectangular
    ones included, equal to the core solver's."""
    from graphkern.mgk.gemm import GEMMGPUEngine
    from test_mgk_gradient import make_kernel

    X = [random_graph(rng, n, 0.2) for n in (1, 7, 15, 24)]
    Y = [random_graph(rng, n, 0.3) for n in (3, 11)]
    for form in ("kronecker", "constant"):
        seed = int(rng.integers(1 << 30))
        auto = make_kernel(form, np.random.default_rng(seed), "gpu", dtype=dtype, tol=tol, normalize=True)
        core = make_kernel(form, np.random.default_rng(seed), "gpu", dtype=dtype, tol=tol, normalize=True,
                           techniques="core")
        chain = auto._router(auto._settings()).gradient_chain()
        assert [name for name, _ in chain] == ["gemm", "csr", "core"]
        assert isinstance(chain[0][1], GEMMGPUEngine) and isinstance(chain[1][1], _mgk_csr.CSRGPUEngine)
        for args in ((X,), (X, Y)):
            Ka, da = auto(*args, eval_gradient=True)
            assert auto.info_.adjoint_iterations is not None and "core" not in auto.info_.solvers
            Kc, dc = core(*args, eval_gradient=True)
            assert np.max(np.abs(Ka - Kc)) <= bound * np.max(np.abs(Kc))
            assert np.max(np.abs(da - dc)) <= bound * np.max(np.abs(dc)), (form, len(args))


@gpu
def test_gradient_non_convergence_on_csr(rng):
    X = [random_graph(rng, n, 0.4) for n in (10, 12)]
    nk, ek = KERNELS["unlabeled"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.01, max_iter=3, backend="gpu", techniques="csr")
    with pytest.raises(NotConvergedError, match="did not converge") as info:
        kern(X, eval_gradient=True)
    assert np.all(info.value.iterations <= 6)
    kern.max_iter = 2000
    kern(X, eval_gradient=True)
    assert np.all(kern.info_.adjoint_iterations > 0) and np.all(kern.info_.residuals <= 1e-6)


@gpu
@pytest.mark.parametrize("solves", ["lockstep", "sequential"])
@pytest.mark.parametrize("form", ["constant", "kronecker", "sqexp", "general"])
def test_gradient_solves_lockstep_and_sequential(rng, monkeypatch, form, solves):
    """Both ways of running the two solves (GRADIENT_SOLVES): K and every derivative equal to the
    CPU's (float64, float32 to rounding), the forward iterations the CPU's, and the entry point
    that ran the chosen one."""
    from graphkern._cuda import runtime as rt
    from test_mgk_gradient import make_kernel

    launched = []
    real_launch = rt.launch
    monkeypatch.setattr(rt, "launch", lambda fn, *a, **k: (launched.append(fn.name), real_launch(fn, *a, **k))[1])
    X = sparse_set(rng)[:sanitized(7, 6)]  # under a sanitizer without the hub
    seed = int(rng.integers(1 << 30))
    cpu = make_kernel(form, np.random.default_rng(seed), "cpu")
    Kc, dc = cpu(X, eval_gradient=True)
    info_c = cpu.info_
    gpu64 = make_kernel(form, np.random.default_rng(seed), "gpu", techniques="csr", gradient_solves=solves)
    Kg, dg = gpu64(X, eval_gradient=True)
    info_g = gpu64.info_
    assert info_g.options["gradient_solves"] == solves
    entries = {name for name in launched if name.startswith("mgk_csr_gradient_")}
    assert entries and all(name.startswith("mgk_csr_gradient_seq_") == (solves == "sequential") for name in entries)
    assert rel_err(Kg, Kc) < 1e-10
    assert np.max(np.abs(dg - dc)) <= 1e-9 * np.max(np.abs(dc)), form
    fwd_c = info_c.iterations - info_c.adjoint_iterations
    fwd_g = info_g.iterations - info_g.adjoint_iterations
    assert np.max(np.abs(fwd_g - fwd_c)) <= 2
    if solves == "sequential":  # the warm start never costs iterations
        assert np.all(info_g.adjoint_iterations <= info_c.adjoint_iterations + 2)
    K32, d32 = make_kernel(form, np.random.default_rng(seed), "gpu", techniques="csr", dtype=np.float32,
                           tol=None, gradient_solves=solves)(X, eval_gradient=True)
    assert rel_err(K32, Kc) < 2e-5
    assert np.max(np.abs(d32 - dc)) <= 1e-4 * np.max(np.abs(dc)), form


def test_gradient_solves_setting_is_checked():
    nk, ek = KERNELS["kronecker"]
    with pytest.raises(ValueError, match="gradient_solves must be 'sequential' or 'lockstep'"):
        MarginalizedGraphKernel(nk, ek, gradient_solves="both")
    with pytest.raises(ValueError, match="gradient_solves must be 'lockstep' or 'sequential'"):
        _mgk_csr.gradient_entry("both")
