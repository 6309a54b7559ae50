"""Run the same GPU workloads against two source trees and compare their speed and their bits.

A restructuring must not change results or lose speed.  This script runs a fixed set of warm
calls of every capability (public API only, so it works across layouts) from one tree, saves the
outputs and the medians, and compares two such runs::

    python3 tools/ab_compare.py run TREE OUT.npz [TEXT]   # once per tree (each built in place)
    python3 tools/ab_compare.py compare BEFORE.npz AFTER.npz

``compare`` prints, per workload, the median seconds of both trees, their ratio, the run-to-run
spread (max/min of the repeats of the slower tree, the noise to judge the ratio by) and whether
the outputs are bit-identical (otherwise the largest relative difference).  ``TEXT`` runs only the
workloads whose names contain it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

REPEAT = 7


def _timed(fn):
    out = fn()  # warm-up: context, modules, device copies
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def workloads():
    import graphkern as gk
    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.bench.data import molecules_path
    from graphkern.generators import chung_lu, rmat
    from graphkern.io import read_sdf
    from graphkern.spgk import DiracEdge, DiracNode, GaussianNode

    mols = read_sdf(molecules_path(), hydrogens=False)
    with_h = read_sdf(molecules_path())  # as the MGK benchmark suite reads them
    nk = TensorProduct(element=KroneckerDelta(0.5))
    ek = TensorProduct(bond_order=KroneckerDelta(0.5))

    def mgk(graphs, node=nk, edge=ek, **kw):
        kern = gk.MarginalizedGraphKernel(node, edge, q=0.05, backend="gpu", **kw)
        return lambda: kern(graphs)

    def mgk_gradient(graphs):
        kern = gk.MarginalizedGraphKernel(nk, ek, q=0.05, backend="gpu", dtype=np.float64)
        return lambda: np.concatenate([a.ravel() for a in kern(graphs, eval_gradient=True)])

    A = chung_lu(200_000, 2.3, 16, seed=3, as_csr=True)
    R = rmat(20, seed=1, as_csr=True)
    yield "mgk K float32, 1000 molecules (auto)", mgk(mols)
    yield "mgk K float32, 1000 molecules with H (auto)", mgk(with_h)
    yield "mgk K float32, 300 molecules (tiled)", mgk(mols[:300], techniques="tiled")
    yield "mgk K float32, 300 molecules (csr)", mgk(mols[:300], techniques="csr")
    yield "mgk K float64, 300 molecules (gemm)", mgk(mols[:300], techniques="gemm", dtype=np.float64)
    yield "mgk K + dK float64, 100 molecules", mgk_gradient(mols[:100])
    yield "expm float64, R-MAT 20", lambda: gk.expm_multiply(R, beta=0.01, backend="gpu")[0]
    yield "total communicability float32, R-MAT 20", lambda: gk.total_communicability(
        R, beta=0.01, dtype=np.float32, backend="gpu")[0]
    for variant in ("auto", "warp", "pair", "longrow", "balanced"):
        yield f"jaccard {variant}, Chung-Lu 200k", lambda v=variant: gk.jaccard(A, backend="gpu", variant=v).data
    for set_name in ("nws-labeled", "dense-labeled", "molecules"):  # the quick benchmark's small sets
        small, snk, sek, _ = _quick_set(set_name)
        for tech in ("tiled", "csr", "gemm"):
            yield f"mgk K float32, quick {set_name} ({tech})", mgk(small, techniques=tech, node=snk, edge=sek)
    spk = gk.ShortestPathKernel(node_kernel=DiracNode("element"), edge_kernel=DiracEdge(), backend="gpu",
                                method="gpu_batched")
    yield "spgk gpu_batched Dirac, 257 molecules", lambda: spk(mols[:257])
    spg = gk.ShortestPathKernel(node_kernel=GaussianNode("element", sigma=1.0), edge_kernel=DiracEdge(),
                                backend="gpu", method="gpu_batched")
    yield "spgk gpu_batched Gaussian, 257 molecules", lambda: spg(mols[:257])


def _quick_set(name):
    """A set of the MGK suite's quick run (graphs, node kernel, edge kernel, description), from either
    layout of the benchmark package."""
    import types
    try:
        from graphkern.bench.suites._mgk_sets import build_set
    except ImportError:
        from graphkern.bench.suites.mgk import build_set
    return build_set(name, types.SimpleNamespace(graphs=None, vertices=None, sdf=None), True)


def run(tree, out, only=""):
    sys.path.insert(0, tree)
    import graphkern
    assert graphkern.__file__.startswith(tree), graphkern.__file__
    arrays, times = {}, {}
    for name, fn in workloads():
        if only not in name:
            continue
        k = len(times)  # the workload's place in the saved list
        try:
            value, t = _timed(fn)
        except Exception as exc:  # one workload's failure is reported, the others still run
            times[name] = f"failed: {type(exc).__name__}: {exc}"
            continue
        arrays[f"a{k}"] = np.asarray(value)
        times[name] = t
        print(f"{name}: {statistics.median(t) * 1e3:.3f} ms", flush=True)
    np.savez(out, times=json.dumps(times), names=json.dumps(list(times)), **arrays)


def compare(before, after):
    a, b = np.load(before), np.load(after)
    ta, tb = json.loads(str(a["times"])), json.loads(str(b["times"]))
    names = json.loads(str(a["names"]))
    print(f"{'workload':44} {'before ms':>10} {'after ms':>10} {'after/before':>12} {'noise':>6}  result")
    for k, name in enumerate(names):
        x, y = ta.get(name), tb.get(name)
        if isinstance(x, str) or isinstance(y, str) or y is None:
            print(f"{name:44} {x if isinstance(x, str) else ''} {y if isinstance(y, str) else ''}")
            continue
        mx, my = statistics.median(x), statistics.median(y)
        noise = max(max(x) / min(x), max(y) / min(y))
        va, vb = a[f"a{k}"], b[f"a{k}"]
        if va.shape == vb.shape and np.array_equal(va, vb):
            same = "identical bits"
        elif va.shape != vb.shape:
            same = f"shapes differ {va.shape} {vb.shape}"
        else:
            scale = np.max(np.abs(va.astype(np.float64))) or 1.0
            same = f"max rel diff {np.max(np.abs(va.astype(np.float64) - vb)) / scale:.1e}"
        print(f"{name:44} {mx * 1e3:10.3f} {my * 1e3:10.3f} {my / mx:12.3f} {noise:6.2f}  {same}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(*sys.argv[2:5])
    else:
        compare(sys.argv[2], sys.argv[3])
