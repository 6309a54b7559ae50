"""Calls from several threads at once on one GPU, as a thread pool or a Dask worker's threads make
them: each gives the answer it gives alone.  The threads share the process's loaded kernels, their
attributes, the staging lanes and the device memory cache; each call has its own objects, and some
threads read the same graphs."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import graphkern
from graphkern import generators
from graphkern.basekernels import KroneckerDelta, SquareExponential, TensorProduct

pytestmark = pytest.mark.gpu

THREADS = 4
ROUNDS = 3


def at_once(calls):
    """Each zero-argument call of ``calls`` on a thread of its own, started together, ROUNDS times:
    the results by round, in the order of ``calls``."""
    start = threading.Barrier(len(calls))

    def run(call):
        start.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [list(pool.map(run, calls)) for _ in range(ROUNDS)]


def agree(calls, same=np.testing.assert_array_equal):
    """The calls, alone one after another, then at once: the same results."""
    alone = [call() for call in calls]
    for results in at_once(calls):
        for got, want in zip(results, alone):
            same(got, want)


@pytest.fixture(scope="module")
def molecules():
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf
    return read_sdf(molecules_path())


def test_marginalized_kernel_calls_at_once(molecules):
    """Sets of different graph sizes (other kernels, other shared memory per launch), float32 and
    float64, one set read by two threads."""
    nk = TensorProduct(element=KroneckerDelta(0.5), charge=SquareExponential(1.0))
    ek = TensorProduct(bond_order=KroneckerDelta(0.3))
    sets = [molecules[:40], molecules[200:230], molecules[500:560:2], molecules[:40]]

    def call(graphs, dtype):
        return lambda: graphkern.MarginalizedGraphKernel(nk, ek, q=0.05, dtype=dtype, backend="gpu")(graphs)

    agree([call(s, dt) for s, dt in zip(sets, (np.float32, np.float64, np.float32, np.float64))])


def test_marginalized_kernel_calls_of_graph_sizes_at_once():
    """Sets from 5 to 360 vertices, float64: the CSR, GEMM and tiled solvers take part, one kernel
    launched by several threads with different shared memory (above the default limit)."""
    from test_mgk import KERNELS, random_graph

    rng = np.random.default_rng(5)
    small = [random_graph(rng, int(n), 0.15) for n in rng.integers(5, 40, 24)]
    sets = [small[:16] + [random_graph(rng, 300, 0.03)], small[8:] + [random_graph(rng, 360, 0.03)],
            [random_graph(rng, int(n), 0.05) for n in (60, 90, 120, 150)], small]
    nk, ek = KERNELS["sqexp"]

    def call(graphs):
        return lambda: graphkern.MarginalizedGraphKernel(nk, ek, q=0.05, dtype=np.float64, backend="gpu")(graphs)

    agree([call(s) for s in sets])


def test_shortest_path_kernel_calls_at_once(molecules):
    """The feature map (Dirac kernels) and the batched pairwise kernel (Gaussian), side by side."""
    from graphkern.spgk import DiracNode, GaussianNode, ShortestPathKernel

    def features(graphs):
        return lambda: ShortestPathKernel(node_kernel=DiracNode("element"), backend="gpu")(graphs)

    def pairwise(graphs):
        return lambda: ShortestPathKernel(node_kernel=GaussianNode("charge", sigma=1.0), method="gpu_batched")(graphs)

    agree([features(molecules[:300]), pairwise(molecules[100:140]), features(molecules[300:900]),
           pairwise(molecules[100:140])])


def test_jaccard_calls_at_once():
    """Heavy-tailed graphs of different sizes (other variants and tables), one read by two threads."""
    graphs = [generators.chung_lu(n, 2.3, 12, seed=s, as_csr=True) for n, s in ((20_000, 1), (3000, 2), (60_000, 3))]

    def call(A, weighted):
        return lambda: graphkern.jaccard(A, weighted=weighted, backend="gpu", dtype=np.float64)

    def same(got, want):
        assert (got != want).nnz == 0

    agree([call(graphs[0], False), call(graphs[1], False), call(graphs[2], False), call(graphs[0], False)], same)


def test_exp_calls_at_once():
    """Different matrices and one matrix from two threads: the solves take turns on the device."""
    graphs = [generators.barabasi_albert(n, 4, seed=s, as_csr=True) for n, s in ((20_000, 1), (5000, 2), (40_000, 3))]

    def call(A):
        return lambda: graphkern.total_communicability(A, beta=0.5, backend="gpu")[0]

    agree([call(graphs[0]), call(graphs[1]), call(graphs[2]), call(graphs[0])])
