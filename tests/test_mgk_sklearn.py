"""The marginalized graph kernel as a scikit-learn kernel: attributes, cloning, Gaussian processes, SVMs."""

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.gaussian_process import GaussianProcessRegressor  # noqa: E402
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, WhiteKernel  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from graphkern.basekernels import Constant, KroneckerDelta, SquareExponential, TensorProduct  # noqa: E402
from graphkern.mgk import MarginalizedGraphKernel  # noqa: E402

from test_mgk import random_graph  # noqa: E402

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
# the target ignores the 'charge' label, so its length scale runs to the upper bound: expected
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def labeled_kernel(backend="cpu", **kw):
    opts = dict(q=0.1, dtype=np.float64, tol=1e-12, backend=backend, normalize=True)
    opts.update(kw)
    return MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5), charge=SquareExponential(1.0)),
                                   TensorProduct(order=KroneckerDelta(0.5)), **opts)


def regression_set(rng, n):
    """Small labeled graphs and a target that depends on how their labels sit on the edges:
    the share of edges joining two vertices of element 0 (a smooth function of the graph)."""
    graphs, y = [], []
    for _ in range(n):
        G = random_graph(rng, int(rng.integers(3, 10)), 0.4, self_loops=False)
        el = G.node_labels["element"]
        rows = np.repeat(np.arange(G.n_nodes), np.diff(G.indptr))
        same = (el[rows] == 0) & (el[G.indices] == 0)
        graphs.append(G)
        y.append(same.mean() if G.nnz else 0.0)
    return graphs, np.array(y)


def test_kernel_attributes():
    kern = labeled_kernel(p_bounds=(0.1, 10.0))
    assert isinstance(kern, Kernel)
    assert not kern.requires_vector_input and not kern.is_stationary()
    names = [h.name for h in kern.hyperparameters]
    assert names == ["node_kernel__element__h", "node_kernel__charge__length_scale", "edge_kernel__order__h", "p",
                     "q"]
    np.testing.assert_allclose(kern.theta, np.log([0.5, 1.0, 0.5, 1.0, 0.1]))
    np.testing.assert_allclose(kern.bounds, np.log([[1e-3, 1], [1e-2, 1e2], [1e-3, 1], [0.1, 10], [1e-3, 1 - 1e-3]]))
    assert kern.n_dims == 5
    params = kern.get_params()
    for name in names:
        assert name in params
    assert params["node_kernel__element__h_bounds"] == (1e-3, 1.0)

    theta = np.log([0.3, 2.0, 0.7, 1.5, 0.2])
    other = kern.clone_with_theta(theta)
    np.testing.assert_allclose(other.theta, theta)
    np.testing.assert_allclose(kern.theta, np.log([0.5, 1.0, 0.5, 1.0, 0.1]))  # the original is untouched
    assert other.node_kernel.kernels["element"].h == pytest.approx(0.3) and other.q == pytest.approx(0.2)
    assert other._datasets is kern._datasets  # the optimizer's trials share the packed graphs

    kern.set_params(edge_kernel__order__h_bounds="fixed", q_bounds="fixed", p_bounds="fixed")
    assert kern.n_dims == 2 and [h.fixed for h in kern.hyperparameters] == [False, False, True, True, True]
    kern.theta = np.log([0.25, 3.0])
    assert kern.node_kernel.kernels["element"].h == pytest.approx(0.25)
    with pytest.raises(ValueError, match="theta has 3 values but the kernel has 2 free"):
        kern.theta = np.zeros(3)
    with pytest.raises(ValueError, match="no parameter 'r'"):
        kern.set_params(r=1.0)
    with pytest.raises(ValueError, match="KroneckerDelta: h must lie in"):
        kern.set_params(node_kernel__element__h=1.5)

    copy = clone(kern)
    assert copy is not kern and copy == kern and copy.node_kernel is not kern.node_kernel
    assert repr(copy).startswith("MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.25)")


def test_bounds_validation():
    with pytest.raises(ValueError, match="q_bounds must lie below 1"):
        labeled_kernel(q_bounds=(0.1, 1.0))
    with pytest.raises(ValueError, match=r"p_bounds must satisfy 0 < low <= high"):
        labeled_kernel(p_bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"h_bounds must satisfy 0 < low <= high <= 1"):
        KroneckerDelta(0.5, h_bounds=(0.1, 2.0))
    with pytest.raises(ValueError, match="'fixed' or a"):
        SquareExponential(1.0, length_scale_bounds="free")
    assert Constant(0.5, c_bounds="fixed").get_params() == {"c": 0.5, "c_bounds": "fixed"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_gaussian_process_fit_raises_likelihood(rng, backend):
    X, y = regression_set(rng, 24)
    kern = labeled_kernel(backend)
    gp = GaussianProcessRegressor(kernel=kern, alpha=1e-2, normalize_y=True, random_state=0).fit(X, y)
    start = gp.log_marginal_likelihood(kern.theta)
    assert gp.log_marginal_likelihood_value_ > start + 1e-3
    assert not np.allclose(gp.kernel_.theta, kern.theta)
    assert np.all(gp.kernel_.theta >= gp.kernel_.bounds[:, 0] - 1e-9)
    assert np.all(gp.kernel_.theta <= gp.kernel_.bounds[:, 1] + 1e-9)
    X_new, y_new = regression_set(rng, 6)
    mean, std = gp.predict(np.array(X_new, dtype=object), return_std=True)
    assert mean.shape == std.shape == (6,) and np.all(np.isfinite(mean)) and np.all(std > 0)


def test_log_marginal_likelihood_gradient(rng):
    """scikit-learn's LML gradient, assembled from our dK, against differences of the LML."""
    X, y = regression_set(rng, 12)
    kern = labeled_kernel(p_bounds=(0.1, 10.0), normalize=False)
    gp = GaussianProcessRegressor(kernel=kern, alpha=1e-2, optimizer=None).fit(X, y)
    theta = kern.theta + rng.uniform(-0.3, 0.3, kern.n_dims)
    theta[0] = min(theta[0], np.log(0.9))
    lml, grad = gp.log_marginal_likelihood(theta, eval_gradient=True)
    step = 1e-5
    for k in range(len(theta)):
        up, down = theta.copy(), theta.copy()
        up[k] += step
        down[k] -= step
        fd = (gp.log_marginal_likelihood(up) - gp.log_marginal_likelihood(down)) / (2 * step)
        assert grad[k] == pytest.approx(fd, rel=1e-5, abs=1e-7)


def test_kernel_algebra_in_a_gaussian_process(rng):
    X, y = regression_set(rng, 14)
    kern = ConstantKernel(1.0) * labeled_kernel() + WhiteKernel(1e-2)
    K, dK = kern(np.array(X, dtype=object), eval_gradient=True)
    assert K.shape == (14, 14) and dK.shape == (14, 14, 2 + 4)
    gp = GaussianProcessRegressor(kernel=kern, random_state=0).fit(X, y)
    assert gp.log_marginal_likelihood_value_ >= gp.log_marginal_likelihood(kern.theta)
    assert gp.predict(X[:3]).shape == (3,)


def test_precomputed_svm(rng):
    """SVC(kernel='precomputed') on the Gram matrix; predictions from kernel(X_test, X_train)."""
    X, y = regression_set(rng, 30)
    labels = (y > np.median(y)).astype(int)
    kern = labeled_kernel()
    svc = SVC(kernel="precomputed", C=10.0).fit(kern(X[:20]), labels[:20])
    K_test = kern(X[20:], X[:20])
    decision = K_test[:, svc.support_] @ svc.dual_coef_[0] + svc.intercept_[0]
    np.testing.assert_allclose(svc.decision_function(K_test), decision, rtol=1e-10, atol=1e-12)
    assert svc.predict(K_test).shape == (10,)


# ---------------------------------------------------------------------------- workflows


def _roundtrips(obj):
    """``obj`` through pickle, joblib and deepcopy."""
    import copy
    import io
    import pickle

    import joblib

    buf = io.BytesIO()
    joblib.dump(obj, buf)
    buf.seek(0)
    return [pickle.loads(pickle.dumps(obj)), joblib.load(buf), copy.deepcopy(obj)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_pickles_and_copies_before_and_after_use(rng, backend):
    X, _ = regression_set(rng, 8)
    kern = labeled_kernel(backend)
    for other in _roundtrips(kern):
        np.testing.assert_array_equal(other(X), kern(X))
    K = kern(X)
    kern(X, eval_gradient=True)
    kern.fit(X)
    pairs = kern.info_.pairs
    for other in _roundtrips(kern):
        np.testing.assert_array_equal(other.info_.pairs, pairs)
        assert len(other.X_fit_) == len(X)
        np.testing.assert_array_equal(other(X), K)
        np.testing.assert_array_equal(other.transform(X[:3]), kern.transform(X[:3]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fitted_models_round_trip_and_predict_the_same(rng, backend):
    X, y = regression_set(rng, 24)
    gpr = GaussianProcessRegressor(kernel=labeled_kernel(backend) + WhiteKernel(1e-2), random_state=0).fit(X[:18], y[:18])
    svc = SVC(kernel=labeled_kernel(backend)).fit(X[:18], y[:18] > np.median(y))
    for model in (gpr, svc):
        want = model.predict(X[18:])
        for other in _roundtrips(model):
            np.testing.assert_array_equal(other.predict(X[18:]), want)


def test_transformer_in_a_pipeline_with_cross_validation_and_grid_search(rng):
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.pipeline import Pipeline

    X, y = regression_set(rng, 30)
    labels = (y > np.median(y)).astype(int)
    kern = labeled_kernel(dtype=np.float32, tol=None)
    K = kern.fit_transform(X)
    np.testing.assert_array_equal(K, kern(X))
    np.testing.assert_array_equal(kern.transform(X[:4]), kern(X[:4], X))
    with pytest.raises(AttributeError, match="not fitted"):
        labeled_kernel().transform(X)
    pipe = Pipeline([("mgk", labeled_kernel()), ("svc", SVC(kernel="precomputed"))])
    scores = cross_val_score(pipe, X, labels, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores))
    search = GridSearchCV(pipe, {"mgk__q": [0.05, 0.2], "svc__C": [0.5, 2.0]}, cv=3).fit(X, labels)
    assert search.best_params_["mgk__q"] in (0.05, 0.2)
    model = search.best_estimator_
    for other in _roundtrips(search):
        np.testing.assert_array_equal(other.predict(X[:5]), model.predict(X[:5]))
    fitted = clone(pipe).fit(X[:20], labels[:20])
    gram = labeled_kernel()(X[20:], X[:20])
    np.testing.assert_array_equal(fitted.decision_function(X[20:]), fitted.named_steps["svc"].decision_function(gram))


def test_gaussian_process_with_defaults_learns_on_molecules():
    """float32 kernel, default settings: the fit moves the hyperparameters and raises the
    log-marginal likelihood (gradients are evaluated in float64)."""
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    graphs = list(read_sdf(molecules_path()))[:25]
    y = np.array([np.sum(g.node_labels["element"] == 8) - 0.5 * np.sum(g.node_labels["element"] == 7)
                  for g in graphs], dtype=float)
    kern = MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)), TensorProduct(bond_order=KroneckerDelta(0.5)),
                                   normalize=True)
    gpr = GaussianProcessRegressor(kernel=kern + WhiteKernel(), normalize_y=True, random_state=0).fit(graphs, y)
    start = gpr.log_marginal_likelihood(gpr.kernel.theta)
    assert np.isfinite(gpr.log_marginal_likelihood_value_)
    assert gpr.log_marginal_likelihood_value_ > start + 1.0
    assert not np.allclose(gpr.kernel_.theta, gpr.kernel.theta)


def test_progress_reports_every_pair(rng):
    X, _ = regression_set(rng, 70)  # 2485 pairs: two chunks on the CPU
    seen = []
    kern = labeled_kernel(normalize=False, verbose=lambda done, total: seen.append((done, total)))
    K = kern(X)
    total = len(X) * (len(X) + 1) // 2
    assert seen and seen[-1] == (total, total) and all(d <= t for d, t in seen)
    np.testing.assert_array_equal(K, labeled_kernel(normalize=False)(X))
    with pytest.raises(TypeError, match="verbose must be"):
        labeled_kernel(verbose="yes")
