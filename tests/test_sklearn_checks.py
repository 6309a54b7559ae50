"""scikit-learn's estimator checks on both graph kernels, where they apply to lists of graphs."""

import pickle

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.utils import estimator_checks as ec  # noqa: E402

from graphkern.basekernels import KroneckerDelta, TensorProduct  # noqa: E402
from graphkern.mgk import MarginalizedGraphKernel  # noqa: E402
from graphkern.spgk import DiracNode, ShortestPathKernel  # noqa: E402

from test_mgk import random_graph  # noqa: E402


def kernels():
    mgk = MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)), TensorProduct(order=KroneckerDelta(0.5)),
                                  q=0.1, dtype=np.float64, backend="cpu")
    return [mgk, ShortestPathKernel(node_kernel=DiracNode("element"), backend="cpu")]


KERNELS = pytest.mark.parametrize("kernel", kernels(), ids=["mgk", "spgk"])
# Checks that need no data. Every other scikit-learn check feeds 2-D arrays (a graph kernel takes a list
# of graphs), checks y handling (fit ignores y) or n_features_in_ (a graph has no fixed feature count);
# their intent on graphs is covered by the tests below.
PARAM_CHECKS = ["check_get_params_invariance", "check_set_params", "check_no_attributes_set_in_init",
                "check_estimator_cloneable", "check_estimator_repr", "check_valid_tag_types",
                "check_estimator_tags_renamed", "check_mixin_order", "check_parameters_default_constructible"]


@KERNELS
@pytest.mark.parametrize("check", PARAM_CHECKS)
def test_parameter_checks(kernel, check):
    getattr(ec, check)(type(kernel).__name__, kernel)


def graphs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [random_graph(rng, int(rng.integers(2, 8)), 0.4, self_loops=False) for _ in range(n)]


@KERNELS
def test_fit_transform_conventions(kernel):
    X, Y = graphs(6), graphs(3, seed=1)
    params = kernel.get_params()
    assert not hasattr(kernel, "X_fit_")
    with pytest.raises(AttributeError, match="not fitted"):
        kernel.transform(Y)
    assert kernel.fit(X, np.arange(6)) is kernel  # fit returns self and ignores y
    first = kernel.transform(Y)
    assert first.shape == (3, 6) and kernel.fit_transform(X).shape == (6, 6)
    np.testing.assert_array_equal(kernel.fit(X).transform(Y), first)  # idempotent
    assert kernel.get_params() == params  # fit leaves the parameters alone
    again = pickle.loads(pickle.dumps(kernel))
    np.testing.assert_array_equal(again.transform(Y), first)
    fresh = clone(kernel)
    assert not hasattr(fresh, "X_fit_") and fresh.get_params().keys() == params.keys()
    np.testing.assert_array_equal(fresh.fit(X).transform(Y), first)
    np.testing.assert_array_equal(kernel.fit(X[:4]).transform(Y), first[:, :4])  # refit forgets the old X
    tags = kernel.__sklearn_tags__()
    assert tags.transformer_tags is not None and tags.requires_fit


@KERNELS
def test_pipeline_cross_validation_and_grid_search(kernel):
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.pipeline import Pipeline
    from sklearn.svm import SVC

    X = graphs(24, seed=2)
    y = np.array([g.n_nodes > 4 for g in X], dtype=int)
    pipe = Pipeline([("kern", clone(kernel)), ("svc", SVC(kernel="precomputed"))])
    assert np.all(np.isfinite(cross_val_score(pipe, X, y, cv=3)))
    search = GridSearchCV(pipe, {"kern__normalize": [False, True], "svc__C": [0.5, 2.0]}, cv=3).fit(X, y)
    again = pickle.loads(pickle.dumps(search))
    np.testing.assert_array_equal(again.decision_function(X[:5]), search.decision_function(X[:5]))


@KERNELS
def test_same_molecules_from_every_source_give_the_same_gram_matrix(kernel):
    io = pytest.importorskip("test_io_inputs")
    from graphkern.convert import as_graphs

    pairs = io.packaged_molecules(8)
    sdf = [g for g, _ in pairs]
    mols = [m for _, m in pairs]
    if isinstance(kernel, MarginalizedGraphKernel):
        kernel = clone(kernel).set_params(edge_kernel=TensorProduct(bond_order=KroneckerDelta(0.5)))
    ref = kernel(sdf)
    for source in (mols, [io.Chem.MolToSmiles(m) for m in mols], [io.as_networkx(m) for m in mols]):
        np.testing.assert_allclose(kernel(as_graphs(source)), ref, rtol=1e-12)
