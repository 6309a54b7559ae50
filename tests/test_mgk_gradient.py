"""Marginalized graph kernel gradients: dK/dlog(theta) against central finite differences of the kernel itself."""

import numpy as np
import pytest

from graphkern import NotConvergedError
from graphkern.basekernels import Additive, Constant, KroneckerDelta, SquareExponential, TensorProduct
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk.results import solver_arguments

from conftest import run_python
from test_mgk import random_graph

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
FORMS = ["constant", "kronecker", "sqexp", "general"]
LOG_STEP = 1e-4


def kernels(form, rng):
    """(node kernel, edge kernel) whose edge kernel takes the solvers' ``form`` path, random hyperparameters
    (``"general-one-group"``: the general path with one product group)."""
    h = lambda: float(rng.uniform(0.2, 0.9))  # noqa: E731
    ell = lambda: float(rng.uniform(0.6, 2.0))  # noqa: E731
    if form == "constant":
        return (TensorProduct(element=KroneckerDelta(h()), charge=SquareExponential(ell())),
                Additive(a=Constant(h()), b=Constant(h())))
    if form == "kronecker":
        return (Additive(element=KroneckerDelta(h()), coords=SquareExponential(ell())),
                TensorProduct(order=KroneckerDelta(h()), k=Constant(h())))
    if form == "sqexp":
        return (TensorProduct(element=KroneckerDelta(h()), k=Constant(h())),
                TensorProduct(length=SquareExponential(ell()), k=Constant(h())))
    if form == "general-one-group":  # a general edge kernel of one product: its Constant's contraction is free
        return (TensorProduct(element=KroneckerDelta(h()), coords=SquareExponential(ell())),
                TensorProduct(order=KroneckerDelta(h()), length=SquareExponential(ell()), k=Constant(h())))
    return (TensorProduct(element=KroneckerDelta(h()), coords=SquareExponential(ell())),
            Additive(order=KroneckerDelta(h()), length=SquareExponential(ell()), k=Constant(h())))


def make_kernel(form, rng, backend, **kw):
    nk, ek = kernels(form, rng)
    opts = dict(q=float(rng.uniform(0.03, 0.3)), p=float(rng.uniform(0.5, 2.0)), p_bounds=(1e-2, 1e2), tol=1e-13,
                dtype=np.float64, backend=backend)
    opts.update(kw)
    return MarginalizedGraphKernel(nk, ek, **opts)


def graph_list(rng, sizes=(1, 5, 8, 12)):
    return [random_graph(rng, n, 0.35) for n in sizes]


def finite_differences(kern, *args, **kw):
    """Central differences of the kernel's own values in each log-hyperparameter: (..., n_dims)."""
    theta = kern.theta
    out = []
    for k in range(len(theta)):
        up, down = theta.copy(), theta.copy()
        up[k] += LOG_STEP
        down[k] -= LOG_STEP
        out.append((kern.clone_with_theta(up)(*args, **kw) - kern.clone_with_theta(down)(*args, **kw)) / (2 * LOG_STEP))
    return np.stack(out, axis=-1)


def assert_gradient_close(dK, fd, K, names, rtol=1e-5):
    """Entrywise relative error <= rtol, above a floor far below any real derivative (FD noise ~1e-9 K)."""
    floor = 1e-7 * np.abs(K).max()
    for k, name in enumerate(names):
        err = np.abs(dK[..., k] - fd[..., k])
        bad = err > rtol * np.abs(fd[..., k]) + floor
        assert not bad.any(), (f"{name}: {int(bad.sum())} entries off, worst relative error "
                               f"{np.max(err / (np.abs(fd[..., k]) + floor)):.2e}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("form", FORMS)
def test_gradient_matches_finite_differences(rng, backend, form, normalize):
    X = graph_list(rng)
    kern = make_kernel(form, rng, backend, normalize=normalize)
    K, dK = kern(X, eval_gradient=True)
    assert kern.info_.edge_form == form
    names = [h.name for h in kern.hyperparameters if not h.fixed]
    assert dK.shape == K.shape + (len(names),) == (4, 4, kern.n_dims)
    assert {"p", "q"} <= set(names) and len(names) >= 5
    np.testing.assert_allclose(K, kern(X), rtol=1e-12)  # the gradient call returns the same K
    np.testing.assert_array_equal(dK, dK.transpose(1, 0, 2))
    assert_gradient_close(dK, finite_differences(kern, X), K, names)
    if normalize:
        # p scales K by p^2, which normalization cancels
        np.testing.assert_allclose(dK[..., names.index("p")], 0.0, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rectangular_and_pairs_gradient(rng, backend):
    """X against Y (the diagonal gradients of both sets enter the normalized one) and ``pairs=``."""
    X = graph_list(rng, (3, 7, 10))
    Y = graph_list(rng, (1, 6))
    for form, normalize in (("general", True), ("kronecker", False)):
        kern = make_kernel(form, rng, backend, normalize=normalize)
        K, dK = kern(X, Y, eval_gradient=True)
        assert dK.shape == (3, 2, kern.n_dims)
        names = [h.name for h in kern.hyperparameters if not h.fixed]
        assert_gradient_close(dK, finite_differences(kern, X, Y), K, names)
        pairs = np.array([[2, 1], [0, 0], [2, 1]])
        Kp, dKp = kern(X, Y, eval_gradient=True, pairs=pairs)
        np.testing.assert_allclose(Kp, K[pairs[:, 0], pairs[:, 1]], rtol=1e-12)
        np.testing.assert_allclose(dKp, dK[pairs[:, 0], pairs[:, 1]], rtol=1e-10, atol=1e-14)
        Ks, dKs = kern(X, eval_gradient=True, pairs=[[1, 2]])
        np.testing.assert_allclose(dKs[0], kern(X, eval_gradient=True)[1][1, 2], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_gradient_near_float64(rng, backend):
    X = graph_list(rng)
    for form in FORMS:
        seed = int(rng.integers(1 << 30))
        k64 = make_kernel(form, np.random.default_rng(seed), backend, normalize=True)
        k32 = make_kernel(form, np.random.default_rng(seed), backend, normalize=True, dtype=np.float32, tol=None,
                          gradient_dtype=None)
        _, d64 = k64(X, eval_gradient=True)
        K32, d32 = k32(X, eval_gradient=True)
        assert K32.dtype == d32.dtype == np.float32 and not k32.info_.dtype_promoted
        assert np.max(np.abs(d32 - d64)) <= 1e-4 * np.max(np.abs(d64)), form


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_kernel_computes_gradients_in_float64(rng, backend):
    """dtype=float32 with the default gradient_dtype: (K, dK) in float64, equal to a float64 kernel's."""
    X = graph_list(rng)
    seed = int(rng.integers(1 << 30))
    k64 = make_kernel("kronecker", np.random.default_rng(seed), backend, normalize=True)
    k32 = make_kernel("kronecker", np.random.default_rng(seed), backend, normalize=True, dtype=np.float32, tol=None)
    K64, d64 = k64(X, eval_gradient=True)
    K32, d32 = k32(X, eval_gradient=True)
    assert K32.dtype == d32.dtype == np.float64 and k32.info_.dtype_promoted
    assert np.max(np.abs(d32 - d64)) <= 1e-6 * np.max(np.abs(d64))
    assert k32(X).dtype == np.float32


def test_float32_gradient_warns_when_not_finite(rng, monkeypatch):
    """gradient_dtype=None keeps float32: a K that overflows raises; a gradient that is not finite
    (K itself checked out) gives a warning."""
    import graphkern.mgk.kernel as kernel_module

    X = graph_list(rng, (4, 6))
    kern = make_kernel("kronecker", rng, "cpu", dtype=np.float32, tol=None, gradient_dtype=None)
    K, dK = kern(X, eval_gradient=True)
    assert np.all(np.isfinite(dK))
    kern.p = 1e30  # K ~ p^2 overflows float32
    with pytest.raises(FloatingPointError, match="K overflowed"):
        kern(X, eval_gradient=True)
    monkeypatch.setattr(kernel_module, "_check_range", lambda *a, **k: None)
    with pytest.warns(RuntimeWarning, match="not finite in float32"):
        kern(X, eval_gradient=True)


def test_fixed_hyperparameters_are_left_out(rng):
    X = graph_list(rng, (4, 6, 9))
    kern = make_kernel("kronecker", rng, "cpu")
    _, dK = kern(X, eval_gradient=True)
    names = [h.name for h in kern.hyperparameters]
    kern.edge_kernel.kernels["order"].h_bounds = "fixed"
    kern.q_bounds = "fixed"
    assert kern.n_dims == len(names) - 2
    assert [h.name for h in kern.hyperparameters if h.fixed] == ["edge_kernel__order__h", "q"]
    _, dK_fixed = kern(X, eval_gradient=True)
    keep = [k for k, n in enumerate(names) if n not in ("edge_kernel__order__h", "q")]
    np.testing.assert_allclose(dK_fixed, dK[..., keep], rtol=1e-12)
    kern.set_params(node_kernel__element__h_bounds="fixed", node_kernel__coords__length_scale_bounds="fixed",
                    edge_kernel__k__c_bounds="fixed", p_bounds="fixed")
    K, dK_none = kern(X, eval_gradient=True)
    assert kern.n_dims == 0 and dK_none.shape == K.shape + (0,)


def test_free_zero_hyperparameter_is_refused(rng):
    X = graph_list(rng, (3, 5))
    kern = MarginalizedGraphKernel(Constant(1.0), TensorProduct(order=KroneckerDelta(0.0)), backend="cpu")
    kern(X)  # K itself is fine
    with pytest.raises(ValueError, match=r"edge_kernel__order__h = 0 is free.*h_bounds='fixed'"):
        kern(X, eval_gradient=True)
    kern.edge_kernel.kernels["order"].h_bounds = "fixed"
    assert kern(X, eval_gradient=True)[1].shape == (2, 2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nodal_gradient_sums_to_graph_gradient(rng, backend):
    """Finite-difference nodal derivatives against the exact graph-level ones (K = sum of the nodal block),
    including a hyperparameter at its upper limit (KroneckerDelta h = 1: one-sided difference)."""
    X = graph_list(rng, (1, 5, 9))
    Y = graph_list(rng, (4, 7))
    kern = make_kernel("general", rng, backend, tol=1e-12)
    kern.node_kernel.kernels["element"].h = 1.0
    R, dR = kern(X, Y, nodal=True, eval_gradient=True)
    K, dK = kern(X, Y, eval_gradient=True)
    offx = np.cumsum([0] + [g.n_nodes for g in X])
    offy = np.cumsum([0] + [g.n_nodes for g in Y])
    assert dR.shape == R.shape + (kern.n_dims,)
    for a in range(len(X)):
        for b in range(len(Y)):
            block = dR[offx[a]:offx[a + 1], offy[b]:offy[b + 1]].sum(axis=(0, 1))
            np.testing.assert_allclose(block, dK[a, b], rtol=1e-5, atol=1e-7 * np.abs(K).max())
    blocks, dblocks = kern(X, Y, nodal=True, eval_gradient=True, pairs=[[2, 1]])
    np.testing.assert_allclose(dblocks[0], dR[offx[2]:offx[3], offy[1]:offy[2]], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_convergence_is_reported(rng, backend):
    X = [random_graph(rng, n, 0.4) for n in (10, 12)]
    kern = MarginalizedGraphKernel(Constant(1.0), Constant(1.0), q=0.01, max_iter=3, backend=backend)
    with pytest.raises(NotConvergedError, match="did not converge"):
        kern(X, eval_gradient=True)
    kern.max_iter = 2000
    K, _ = kern(X, eval_gradient=True)
    info = kern.info_
    assert np.all(info.adjoint_iterations > 0) and np.all(info.iterations > info.adjoint_iterations)
    assert np.all(info.residuals <= 1e-6)


def test_derivative_programs_match_finite_differences(rng):
    """KernelProgram.derivative, evaluated on labels, against differences of the kernel's value."""
    a = {"el": rng.integers(0, 3, 40), "x": rng.normal(size=40), "c": rng.normal(size=(40, 2))}
    b = {"el": rng.integers(0, 3, 40), "x": rng.normal(size=40), "c": rng.normal(size=(40, 2))}
    for kernel in (TensorProduct(el=KroneckerDelta(0.3), x=SquareExponential(0.8), k=Constant(0.6)),
                   Additive(el=KroneckerDelta(0.7), c=SquareExponential(1.3), k=Constant(0.4))):
        program = kernel.compile()
        for g, t, base, col in program.terms():
            step = 1e-6
            value = base.theta
            setattr(base, base.hyperparameter, value + step)
            up = kernel.compile().evaluate(a, b, {"c"})
            setattr(base, base.hyperparameter, value - step)
            down = kernel.compile().evaluate(a, b, {"c"})
            setattr(base, base.hyperparameter, value)
            got = program.derivative(g, t).evaluate(a, b, {"c"})
            np.testing.assert_allclose(got, (up - down) / (2 * step), rtol=1e-7, atol=1e-9, err_msg=repr(base))


@pytest.mark.parametrize("form,free", [("constant", {"base"}), ("kronecker", {"base"}), ("sqexp", {"base"}),
                                       ("general", set()), ("general-one-group", {"k"})])
def test_free_contractions_equal_the_xmv_ones(rng, form, free):
    """Contractions the plan marks free: the CPU solver's factor * y^T (D V^-1 x - b) equals the
    contraction y^T (A (.) E) x formed with the explicit off-diagonal part of the dense product
    system (so the identity M x = b it rests on is checked, not assumed), and exactly the
    constant factors are marked."""
    from graphkern.mgk.dense import product_system
    from graphkern.mgk.gradient import EDGE_FORMS

    X = graph_list(rng, (1, 5, 8))
    kern = make_kernel(form, rng, "cpu", tol=1e-14)
    s = kern._settings()
    ds = kern._dataset(X, s)
    args = solver_arguments(ds, ds, s)
    plan = kern._gradient_plan(s, ds, args)
    if form == "general-one-group":
        # one contraction per free edge term (order, length, k); only the Constant's is free
        assert plan.contraction_free.tolist()[:2] == [0.0, 0.0] and plan.contraction_free[2] == pytest.approx(
            1.0 / kern.edge_kernel.kernels["k"].c)
    elif free:
        base = plan.contraction_form == EDGE_FORMS[form]
        assert np.all((plan.contraction_free != 0) == base) and base.sum() == 1
    else:
        assert not np.any(plan.contraction_free)
    pairs = np.array([[0, 1], [1, 2], [2, 2]], dtype=np.int64)
    sol = kern._router(s).solve(ds, ds, pairs, args, plan=plan)
    nk, ek = s["node_program"], s["edge_program"]
    for row, (a, b) in enumerate(pairs.tolist()):
        M, rhs, V = product_system(X[a], X[b], nk, ek, q=s["q"])
        x = np.linalg.solve(M, rhs)
        y = np.linalg.solve(M, np.ones(len(rhs)))
        D = rhs / s["q"] ** 2
        edge_part = np.diag(D / V) - M  # A (.) E, formed explicitly
        contraction = y @ (edge_part @ x)
        for c in np.flatnonzero(plan.contraction_free):
            raw = sol.gradient[row, plan.n_raw - plan.n_contractions + c]
            np.testing.assert_allclose(s["p"] ** 2 * plan.contraction_free[c] * contraction, raw, rtol=1e-9,
                                       atol=1e-12 * sol.K[row])


@pytest.mark.gpu
def test_gpu_gradient_matches_cpu(rng):
    X = graph_list(rng, (1, 6, 9, 17, 30))
    for form in FORMS:
        seed = int(rng.integers(1 << 30))
        for dtype, tol, rtol in ((np.float64, 1e-13, 1e-9), (np.float32, None, 1e-4)):
            cpu = make_kernel(form, np.random.default_rng(seed), "cpu", dtype=dtype, tol=tol)
            gpu = make_kernel(form, np.random.default_rng(seed), "gpu", dtype=dtype, tol=tol)
            Kc, dc = cpu(X, eval_gradient=True)
            Kg, dg = gpu(X, eval_gradient=True)
            assert np.max(np.abs(Kg - Kc) / Kc) < rtol, (form, dtype)
            assert np.max(np.abs(dg - dc)) <= rtol * np.max(np.abs(dc)), (form, dtype)


def test_works_without_scikit_learn():
    """scikit-learn is optional: with it hidden, the kernel keeps its theta/bounds/gradient manners."""
    code = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError("hidden")
sys.meta_path.insert(0, Hide())
import numpy as np
from graphkern.basekernels import Constant, KroneckerDelta, TensorProduct
from graphkern.graph import Graph
from graphkern.mgk import MarginalizedGraphKernel
G = Graph.from_edges([(0, 1), (1, 2)], 3, node_labels={"el": [0, 1, 0]})
k = MarginalizedGraphKernel(TensorProduct(el=KroneckerDelta(0.5)), Constant(0.8), backend="cpu", dtype=np.float64)
K, dK = k([G, G], eval_gradient=True)
assert type(k).__mro__[1] is object and "sklearn" not in sys.modules
assert dK.shape == (2, 2, 3) and k.bounds.shape == (3, 2) and not k.hyperparameters[0].fixed
k.clone_with_theta(k.theta + 0.1)
print("ok")
"""
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
