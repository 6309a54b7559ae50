"""Gaussian-process regression of a molecular property with the marginalized graph kernel.

The packaged set of 1000 NCI molecules (graphkern.bench.data.molecules_path(), RDKit's
TPSA, MolLogP and MolWt attached to each) is read as labeled graphs, a random ``--n`` of
them are split into training and held-out molecules, and scikit-learn's
GaussianProcessRegressor fits

    MarginalizedGraphKernel(vertex: element and hydrogen count, edge: bond order) + WhiteKernel

by maximizing the log marginal likelihood over every hyperparameter (the two vertex-label
Kronecker deltas, the bond-order Kronecker delta, the stopping probability q, the starting
probability p that sets the kernel's scale, and the noise level), with the exact gradients
of the kernel.  It prints the hyperparameters before and after, the held-out error, and
the error of predicting the training mean for every molecule (the baseline).

Hydrogens are folded into their heavy atom as a vertex label ``hydrogens`` (how many
hydrogens it carries): the graphs get about half as many vertices, so each kernel
evaluation costs about a quarter; ``--hydrogens`` keeps them as vertices instead.

    python bench/gp_molecules.py                       # 200 molecules, TPSA, GPU if there is one
    python bench/gp_molecules.py --n 400 --property MolLogP --backend cpu

With 200 molecules a fit takes about half a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def fold_hydrogens(G):
    """The heavy-atom graph of a molecule, each atom labeled with the number of hydrogens bonded to it."""
    from graphkern.graph import Graph

    element = G.node_labels["element"]
    rows = np.repeat(np.arange(G.n_nodes), np.diff(G.indptr))
    cols = G.indices
    hydrogen = element == 1
    keep = np.flatnonzero(~hydrogen)
    renumber = np.full(G.n_nodes, -1, dtype=np.int64)
    renumber[keep] = np.arange(len(keep))
    bond = (rows < cols) & ~hydrogen[rows] & ~hydrogen[cols]  # each heavy-atom bond once
    labels = {name: values[keep] for name, values in G.node_labels.items()}
    labels["hydrogens"] = np.bincount(rows[hydrogen[cols]], minlength=G.n_nodes)[keep]
    return Graph.from_edges(np.stack([renumber[rows[bond]], renumber[cols[bond]]], axis=1), len(keep),
                            node_labels=labels, edge_labels={name: values[bond] for name, values in G.edge_labels.items()},
                            name=G.name)


def load(args):
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    graphs, targets = [], []
    for G, props in read_sdf(args.sdf or molecules_path(), properties=True):
        value = props.get(args.property)
        if G.n_nodes == 0 or value is None:
            continue
        G = G if args.hydrogens else fold_hydrogens(G)
        if G.n_nodes == 0:  # H2
            continue
        graphs.append(G)
        targets.append(float(value))
    if not graphs:
        raise SystemExit(f"no molecule in the set carries the property {args.property!r}")
    rng = np.random.default_rng(args.seed)
    pick = rng.permutation(len(graphs))[:args.n]
    X = np.empty(len(pick), dtype=object)  # scikit-learn passes an object array of graphs to the kernel
    X[:] = [graphs[i] for i in pick]
    return X, np.array(targets)[pick]


def describe(kernel):
    return ", ".join(f"{h.name.replace('k1__', '').replace('k2__', '')}={np.exp(t):.4g}"
                     for h, t in zip([h for h in kernel.hyperparameters if not h.fixed], kernel.theta))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="molecules used (default 200)")
    parser.add_argument("--property", default="TPSA", help="TPSA (default), MolLogP or MolWt")
    parser.add_argument("--test-fraction", type=float, default=0.25, help="share held out (default 0.25)")
    parser.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--hydrogens", action="store_true", help="keep hydrogens as vertices")
    parser.add_argument("--restarts", type=int, default=0, help="extra optimizer starts (n_restarts_optimizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sdf", default=None, help="another SD file with the property as a data field")
    args = parser.parse_args(argv)

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import WhiteKernel

    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel

    X, y = load(args)
    n_test = max(1, int(round(args.test_fraction * len(X))))
    X_train, y_train, X_test, y_test = X[n_test:], y[n_test:], X[:n_test], y[:n_test]
    sizes = np.array([g.n_nodes for g in X])
    print(f"{args.property} of {len(X)} molecules ({len(X_train)} to train, {n_test} held out); "
          f"{sizes.mean():.1f} vertices per graph on average ({'with' if args.hydrogens else 'without'} hydrogens)")

    node_labels = dict(element=KroneckerDelta(0.5))
    if not args.hydrogens:
        node_labels["hydrogens"] = KroneckerDelta(0.5)
    graph_kernel = MarginalizedGraphKernel(TensorProduct(**node_labels), TensorProduct(bond_order=KroneckerDelta(0.5)),
                                           q=0.05, p_bounds=(1e-3, 1e3), dtype=np.dtype(args.dtype),
                                           backend=args.backend)
    kernel = graph_kernel + WhiteKernel(1.0)
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, n_restarts_optimizer=args.restarts,
                                  random_state=args.seed)
    print(f"start: {describe(kernel)}")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a hyperparameter at its bound is a result here
        gp.fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    print(f"fit:   {describe(gp.kernel_)}")
    print(f"       log marginal likelihood {gp.log_marginal_likelihood(kernel.theta):.2f} -> "
          f"{gp.log_marginal_likelihood_value_:.2f} in {seconds:.1f} s on the {gp.kernel_.k1.info_.backend.upper()}")

    pred, std = gp.predict(X_test, return_std=True)
    baseline = np.full_like(y_test, y_train.mean())
    rows = [("GP + marginalized graph kernel", pred), ("baseline: training mean", baseline)]
    print(f"\nheld-out {args.property} ({n_test} molecules, values {y_test.min():.3g} to {y_test.max():.3g}):")
    print(f"  {'model':32s} {'MAE':>9s} {'RMSE':>9s} {'R^2':>7s}")
    for name, p in rows:
        err = p - y_test
        r2 = 1 - np.sum(err ** 2) / np.sum((y_test - y_test.mean()) ** 2)
        print(f"  {name:32s} {np.abs(err).mean():9.4g} {np.sqrt(np.mean(err ** 2)):9.4g} {r2:7.3f}")
    inside = np.mean(np.abs(pred - y_test) <= 2 * std)
    print(f"  {inside:.0%} of held-out values lie within 2 predicted standard deviations")


if __name__ == "__main__":
    main()
