"""The graph sets of the MGK suites (``mgk`` and ``mgk-techniques``): generated small-world and
scale-free graphs, with or without random categories, dense labeled graphs, and molecules."""

from __future__ import annotations

import os

import numpy as np

SETS = ("nws", "ba", "nws-labeled", "ba-labeled", "dense-labeled", "molecules")


def _label(G, rng, n_node=4, n_edge=3):
    """The same graph with random vertex categories and symmetric random edge categories."""
    from graphkern.graph import Graph

    edges, _ = G.edge_list()
    return Graph.from_edges(edges, G.n_nodes, node_labels={"label": rng.integers(0, n_node, G.n_nodes)},
                            edge_labels={"label": rng.integers(0, n_edge, len(edges))})


def _molecules(args, n_graphs, rng, hydrogens=True):
    """(graphs, description): the SD file given or the packaged molecules, hydrogens as in the file
    or dropped."""
    from graphkern.io import read_sdf

    from graphkern.bench.data import molecules_path

    path = args.sdf or molecules_path()
    graphs = [g for g in read_sdf(path, hydrogens=hydrogens) if g.n_nodes > 0][:n_graphs]
    how = "hydrogens as in the file" if hydrogens else "hydrogens dropped"
    return graphs, f"{len(graphs)} molecules from {os.path.basename(path)} ({how})"


def build_set(name, args, quick, seed=0):
    """(graphs, node_kernel, edge_kernel, description) of one data set."""
    from graphkern import generators as gen
    from graphkern.basekernels import Constant, KroneckerDelta, TensorProduct

    rng = np.random.default_rng(seed)
    n_graphs = args.graphs or (20 if quick else 160)
    n = args.vertices or (32 if quick else 96)
    labeled = (TensorProduct(label=KroneckerDelta(0.5)), TensorProduct(label=KroneckerDelta(0.5)))
    unlabeled = (Constant(1.0), Constant(1.0))
    if name in ("nws", "nws-labeled"):
        graphs = [gen.newman_watts_strogatz(n, 2, 0.1, seed=seed + s) for s in range(n_graphs)]
        desc = f"{n_graphs} Newman-Watts-Strogatz graphs, {n} vertices, k=3 (networkx), p=0.1"
    elif name in ("ba", "ba-labeled"):
        graphs = [gen.barabasi_albert(n, 6, seed=seed + s) for s in range(n_graphs)]
        desc = f"{n_graphs} Barabasi-Albert graphs, {n} vertices, m=6"
    elif name == "dense-labeled":
        count = max(4, n_graphs // 4)
        graphs = [gen.random_labeled(n, 0.9, n_node_labels=4, n_edge_labels=3, seed=seed + s) for s in range(count)]
        return graphs, *labeled, f"{count} G(n={n}, p=0.9) graphs, 4 vertex / 3 edge labels"
    elif name == "molecules":
        graphs, desc = _molecules(args, n_graphs, rng)
        return (graphs, TensorProduct(element=KroneckerDelta(0.5)), TensorProduct(bond_order=KroneckerDelta(0.5)),
                desc)
    else:
        raise ValueError(f"unknown set {name!r}; choose from {', '.join(SETS)}")
    if name.endswith("-labeled"):
        return [_label(g, rng) for g in graphs], *labeled, desc + ", 4 vertex / 3 edge labels"
    return graphs, *unlabeled, desc
