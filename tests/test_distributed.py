"""graphkern.distributed.gram on real Dask clusters: values, Zarr output, resume, a killed worker."""

import os
import signal
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

from graphkern.basekernels import KroneckerDelta, TensorProduct  # noqa: E402
from graphkern.distributed import _tasks, gram  # noqa: E402
from graphkern.distributed._cluster import environ_kept  # noqa: E402
from graphkern.distributed._plan import Plan, graph_weights, runs  # noqa: E402
from graphkern.distributed.api import _Run  # noqa: E402
from graphkern.generators import random_labeled  # noqa: E402
from graphkern.mgk import MarginalizedGraphKernel  # noqa: E402
from graphkern.spgk import DiracNode, ShortestPathKernel  # noqa: E402

TILE = 6


@pytest.fixture(scope="module")
def client():
    with environ_kept():  # a nanny would leave OMP_NUM_THREADS=1 behind for the tests that follow
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GiB",
                                           dashboard_address=None)
        with distributed.Client(cluster) as c:
            yield c
        cluster.close()


def _graphs(n, seed):
    rng = np.random.default_rng(seed)
    return [random_labeled(int(rng.integers(3, 16)), 0.3, n_node_labels=3, n_edge_labels=2,
                           seed=int(rng.integers(1 << 30))) for _ in range(n)]


def _mgk(h=0.5, **kw):
    kw.setdefault("q", 0.1)
    return MarginalizedGraphKernel(TensorProduct(label=KroneckerDelta(h)), TensorProduct(label=KroneckerDelta(0.5)),
                                   n_threads=1, **kw)


def _spgk(**kw):
    return ShortestPathKernel(node_kernel=DiracNode("label"), n_threads=1, **kw)


KERNELS = {"mgk": _mgk, "spgk": _spgk}


def _reference_by_tiles(kernel, X, Y, plan):
    """The matrix assembled from the in-process kernel run on each tile of ``plan``."""
    K = np.full(plan.shape, np.nan)
    for t in plan.tiles():
        if Y is None and t.ti == t.tj:
            K[t.i0:t.i1, t.j0:t.j1] = kernel(X[t.i0:t.i1])
        else:
            K[t.i0:t.i1, t.j0:t.j1] = kernel(X[t.i0:t.i1], (X if Y is None else Y)[t.j0:t.j1])
        if t.mirror:
            K[t.j0:t.j1, t.i0:t.i1] = K[t.i0:t.i1, t.j0:t.j1].T
    return K


@pytest.mark.parametrize("output", ["numpy", "zarr"])
@pytest.mark.parametrize("with_y", [False, True], ids=["XX", "XY"])
@pytest.mark.parametrize("name", ["mgk", "spgk"])
def test_gram_equals_in_process(client, tmp_path, name, with_y, output):
    X = _graphs(23, seed=1)
    Y = _graphs(11, seed=2) if with_y else None
    kernel = KERNELS[name]()
    expect = kernel(X) if Y is None else kernel(X, Y)
    out = None if output == "numpy" else tmp_path / "K.zarr"
    got = gram(kernel, X, Y, client=client, tile=TILE, out=out)
    if output == "zarr":
        assert isinstance(got, zarr.Array) and got.chunks == (TILE, TILE)
        assert np.all(zarr.open_group(out)["tiles"][:] > 0) or Y is None
        got = got[:]
    assert got.dtype == expect.dtype and got.shape == expect.shape
    np.testing.assert_array_equal(got, expect)  # bit for bit: every pair is computed on its own
    # the workers keep no kernel (packed graphs, device memory) of a finished call
    assert not any(client.run(lambda: len(_tasks._KERNELS)).values())


@pytest.mark.parametrize("output", ["numpy", "zarr"])
@pytest.mark.parametrize("with_y", [False, True], ids=["XX", "XY"])
@pytest.mark.parametrize("kind", ["mgk64", "mgk32", "spgk"])
def test_normalize_second_pass(client, tmp_path, kind, with_y, output):
    X = _graphs(17, seed=3)
    Y = _graphs(8, seed=4) if with_y else None
    make = {"mgk64": lambda **kw: _mgk(dtype=np.float64, **kw), "mgk32": lambda **kw: _mgk(dtype=np.float32, **kw),
            "spgk": _spgk}[kind]
    kernel = make(normalize=True)
    out = None if output == "numpy" else tmp_path / "Kn.zarr"
    got = np.asarray(gram(kernel, X, Y, client=client, tile=TILE, out=out)[:])
    expect = kernel(X) if Y is None else kernel(X, Y)
    # the second pass: the raw matrix divided by its diagonal, in float64, cast to the kernel's dtype
    raw = make()
    R = (raw(X) if Y is None else raw(X, Y)).astype(np.float64)
    dx = np.diag(R) if Y is None else raw.diag(X).astype(np.float64)
    dy = dx if Y is None else raw.diag(Y).astype(np.float64)
    scale = np.sqrt(np.outer(dx, dy))  # 0 where a graph has no shortest paths: then K is 0
    second_pass = np.where(scale > 0, R / np.where(scale > 0, scale, 1.0), 0.0).astype(expect.dtype)
    np.testing.assert_array_equal(got, second_pass)
    if kind == "mgk32":  # in-process normalize divides the unrounded values: one float32 rounding apart
        np.testing.assert_allclose(got, expect, rtol=2.5e-7, atol=0)
    else:
        np.testing.assert_array_equal(got, expect)


def test_resume_recomputes_only_missing_tiles(client, tmp_path):
    X = _graphs(26, seed=5)
    kernel = _mgk()
    out = tmp_path / "K.zarr"
    expect = np.asarray(gram(kernel, X, client=client, tile=TILE, out=out)[:])
    np.testing.assert_array_equal(expect, kernel(X))
    g = zarr.open_group(out, mode="r+")
    states = g["tiles"][:]
    plan = Plan.make(graph_weights("mgk", X), None, TILE, True)
    tiles = plan.tiles()
    assert int((states == 1).sum()) == len(tiles)
    lost = [tiles[k] for k in (0, 3, len(tiles) - 1)]
    torn = tiles[5]  # its marker cut short by a killed process: an empty chunk file
    (out / "tiles" / "c" / str(torn.ti) / str(torn.tj)).write_bytes(b"")
    lost.append(torn)
    for t in lost:  # as if the run had stopped before these tiles: no data, no marker
        g["K"][t.i0:t.i1, t.j0:t.j1] = np.nan
        g["K"][t.j0:t.j1, t.i0:t.i1] = np.nan
        g["tiles"][t.ti, t.tj] = 0
    seen = []
    got = gram(kernel, X, client=client, tile=TILE, out=out, verbose=lambda done, total: seen.append(total))
    assert seen and set(seen) == {len(lost)}
    np.testing.assert_array_equal(got[:], expect)
    # nothing left to do: a third run computes no tile
    seen.clear()
    gram(kernel, X, client=client, tile=TILE, out=out, verbose=lambda done, total: seen.append(total))
    assert set(seen) <= {0}


class _Stop(Exception):
    pass


def _settle(client, timeout=30):
    """Wait until no worker runs a task (tiles cancelled mid-flight still finish on their worker)."""
    t0 = time.time()
    while sum(client.run(lambda dask_worker: len(dask_worker.state.executing)).values()):
        assert time.time() - t0 < timeout
        time.sleep(0.05)


def test_interrupted_run_resumes(client, tmp_path):
    X = _graphs(30, seed=6)
    Y = _graphs(20, seed=7)
    kernel = _spgk(normalize=True)
    out = tmp_path / "K.zarr"

    def stop(done, total):
        if done >= 3:
            raise _Stop

    with pytest.raises(_Stop):
        gram(kernel, X, Y, client=client, tile=4, out=out, verbose=stop)
    _settle(client)
    states = zarr.open_group(out)["tiles"][:]
    n_tiles = states.size
    written = int((states > 0).sum())
    assert 3 <= written < n_tiles
    seen = []
    got = gram(kernel, X, Y, client=client, tile=4, out=out, verbose=lambda done, total: seen.append(total))
    assert seen[0] == n_tiles - written  # the first bar counts the raw tiles still to do
    np.testing.assert_array_equal(got[:], kernel(X, Y))
    assert np.all(zarr.open_group(out)["tiles"][:] == 2)


def test_resume_finishes_a_partial_normalization(client, tmp_path):
    X = _graphs(19, seed=8)
    kernel = _mgk(dtype=np.float64, normalize=True)
    out = tmp_path / "K.zarr"
    expect = np.asarray(gram(kernel, X, client=client, tile=TILE, out=out)[:])
    g = zarr.open_group(out, mode="r+")
    raw = _mgk(dtype=np.float64)(X)
    plan = Plan.make(graph_weights("mgk", X), None, TILE, True)
    for t in plan.tiles()[1::2]:  # stopped halfway through the second pass: these tiles still raw
        g["K"][t.i0:t.i1, t.j0:t.j1] = raw[t.i0:t.i1, t.j0:t.j1]
        g["K"][t.j0:t.j1, t.i0:t.i1] = raw[t.j0:t.j1, t.i0:t.i1]
        g["tiles"][t.ti, t.tj] = 1
    got = gram(kernel, X, client=client, tile=TILE, out=out)
    np.testing.assert_array_equal(got[:], expect)
    np.testing.assert_array_equal(expect, kernel(X))


def test_resume_refuses_another_computation(client, tmp_path):
    X = _graphs(10, seed=9)
    out = tmp_path / "K.zarr"
    gram(_mgk(), X, client=client, tile=TILE, out=out)
    with pytest.raises(ValueError, match="another computation.*kernel"):
        gram(_mgk(h=0.7), X, client=client, tile=TILE, out=out)
    with pytest.raises(ValueError, match="another computation.*plan"):
        gram(_mgk(), X, client=client, tile=TILE + 1, out=out)
    fresh = gram(_mgk(q=0.2), X, client=client, tile=TILE + 1, out=out, resume=False)
    np.testing.assert_array_equal(fresh[:], _mgk(q=0.2)(X))
    other = tmp_path / "other.zarr"
    zarr.open_group(other, mode="w").create_array("data", shape=(2,), dtype="f8")
    with pytest.raises(ValueError, match="not a graphkern Gram matrix"):
        gram(_mgk(), X, client=client, out=other)


def test_bad_arguments(client):
    X = _graphs(4, seed=10)
    with pytest.raises(TypeError, match="kernel must be"):
        gram(lambda a, b=None: 0, X, client=client)
    with pytest.raises(ValueError, match="tile must be"):
        gram(_mgk(), X, client=client, tile=0)
    with pytest.raises(TypeError, match="resume must be"):
        gram(_mgk(), X, client=client, resume="yes")
    with pytest.raises(TypeError, match=r"X\[1\]"):
        gram(_mgk(), [X[0], 3.5], client=client)  # ("C" would be methane: a SMILES string is a graph)


def test_tiles_report_their_solvers_seconds(client):
    """Each tile's span and the part of it the kernel's solvers ran (MGK's info_.solve_seconds): the rest
    is the tile's host work; NaN for a kernel that does not record it."""
    from graphkern.distributed.api import _gram

    X = _graphs(14, seed=12)
    K, stats = _gram(_mgk(), X, client=client, tile=TILE)
    np.testing.assert_array_equal(K, _mgk()(X))
    assert len(stats["solve_seconds"]) == len(stats["tile_seconds"]) == stats["tiles"] > 1
    assert all(0 < solve <= own for solve, own in zip(stats["solve_seconds"], stats["tile_seconds"]))
    assert np.isnan(_gram(_spgk(), X, client=client, tile=TILE)[1]["solve_seconds"]).all()


def test_back_to_back_calls_on_the_same_graphs(client):
    # each call ships its graphs under its own key: a key shared with the previous call (same
    # content) could be released by that call after this one scattered it, losing its tiles' input
    X, Y = _graphs(8, seed=19), _graphs(4, seed=20)
    kernel = _mgk()
    expect = {False: kernel(X), True: kernel(X, Y)}
    keys = set()
    for k in range(30):
        with_y = bool(k % 2)
        np.testing.assert_array_equal(gram(kernel, X, Y if with_y else None, client=client, tile=4), expect[with_y])
    for _ in range(2):
        keys.add(_Run(client, 1, ("job", type(kernel), {}), 0, False).graphs("X", X).key)
    assert len(keys) == 2


def test_plan_tiles_have_equal_predicted_cost():
    rng = np.random.default_rng(11)
    w = np.concatenate([rng.uniform(1, 2, 300), rng.uniform(8, 10, 100)])  # light graphs, then heavy ones
    bounds = runs(w, 20)
    assert bounds[0] == 0 and bounds[-1] == len(w) and all(b % 20 == 0 for b in bounds[1:-1])
    weights = np.add.reduceat(w, bounds[:-1])
    target = w.mean() * 20
    starts, sizes = np.array(bounds[:-1]), np.diff(bounds)
    light, heavy = starts + sizes < 300, starts >= 300
    # runs of light graphs are joined, several chunks each, to about the weight of 20 average graphs;
    # a chunk of heavier graphs stays one run (no tile is cut below a chunk)
    assert np.all(sizes[light] >= 40) and np.all(np.abs(weights[light] / target - 1) < 0.25)
    assert np.all(sizes[heavy] == 20)
    plan = Plan.make(w, None, 20, True)
    tiles = plan.tiles()
    assert len(tiles) == plan.grid[0] * (plan.grid[0] + 1) // 2 and all(t.ti <= t.tj for t in tiles)
    assert sum(plan.pairs(t) for t in tiles) == len(w) * (len(w) + 1) // 2


@pytest.mark.parametrize("symmetric", [True, False])
def test_tiles_are_handed_out_longest_first(symmetric):
    """The order tiles are submitted in: predicted cost (brute-force sums of w_i w_j over each tile's
    pairs) never increases, and every tile is there once."""
    rng = np.random.default_rng(5)
    wx = np.concatenate([rng.uniform(1, 2, 130), rng.uniform(8, 10, 37)])
    wy = wx if symmetric else rng.uniform(1, 9, 90)
    plan = Plan.make(wx, wy, 16, symmetric)
    ordered = plan.by_cost(plan.tiles(), wx, wy)
    assert sorted(ordered, key=lambda t: (t.ti, t.tj)) == plan.tiles()

    def brute(t):
        block = np.outer(wx[t.i0:t.i1], wy[t.j0:t.j1])
        if symmetric and t.ti == t.tj:
            return block[np.triu_indices(t.i1 - t.i0)].sum() - 0.5 * np.diag(block).sum()
        return block.sum()
    costs = np.array([brute(t) for t in ordered])
    assert np.all(np.diff(costs) <= 1e-9 * costs.max())
    if symmetric:  # a diagonal tile holds half the pairs of an off-diagonal one of the same runs
        assert not ordered[0].ti == ordered[0].tj


def test_local_cluster_without_client():
    X = _graphs(12, seed=12)
    kernel = _spgk(backend="cpu")
    np.testing.assert_array_equal(gram(kernel, X, tile=5), kernel(X))


def test_killed_worker_loses_only_its_tiles(client):
    X = _graphs(60, seed=13)
    kernel = _mgk(q=0.02, dtype=np.float64)
    expect = kernel(X)
    pids = client.run(os.getpid)
    killed = []

    def kill_a_busy_worker(done, total):
        if killed:
            return
        busy = [addr for addr, keys in client.processing().items() if keys and addr in pids]
        if busy:
            os.kill(pids[busy[0]], signal.SIGKILL)
            killed.append(pids[busy[0]])

    got = gram(kernel, X, client=client, tile=4, verbose=kill_a_busy_worker)
    assert killed, "no worker was busy when the first tiles finished"
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)
    np.testing.assert_array_equal(got, expect)
    client.wait_for_workers(2, timeout=60)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_one_worker_per_gpu():
    import graphkern
    from graphkern.distributed._cluster import local_cluster, visible_gpus

    if len(graphkern.devices()) < 2:
        pytest.skip("needs two GPUs")
    X = _graphs(300, seed=14)
    cluster = local_cluster(visible_gpus(), 4)
    with distributed.Client(cluster) as c:
        visible = c.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        assert len(visible) == len(graphkern.devices())
        assert len({v.split(",")[0] for v in visible.values()}) == len(visible)  # each its own GPU first
        backends = c.run(lambda: graphkern.gpu_available())
        assert all(backends.values())
        for make in (lambda: _mgk(backend="gpu"), lambda: _spgk(backend="gpu")):
            kernel = make()
            got = gram(kernel, X, client=c, tile=64)
            plan = Plan.make(graph_weights("spgk" if isinstance(kernel, ShortestPathKernel) else "mgk", X), None,
                             64, True)
            np.testing.assert_array_equal(got, _reference_by_tiles(kernel, X, None, plan))
            np.testing.assert_array_equal(got, kernel(X))
    cluster.close()


def test_in_memory_zarr_store_is_written_by_the_caller(client):
    from zarr.storage import MemoryStore

    X = _graphs(14, seed=15)
    Y = _graphs(9, seed=16)
    kernel = _spgk(normalize=True)
    store = MemoryStore()
    got = gram(kernel, X, Y, client=client, tile=4, out=store)
    np.testing.assert_array_equal(got[:], kernel(X, Y))
    assert np.all(zarr.open_group(store)["tiles"][:] == 2)


@pytest.mark.gpu
def test_gpu_worker_equals_in_process(tmp_path):
    import graphkern
    from graphkern.distributed._cluster import local_cluster, visible_gpus

    if not graphkern.gpu_available():
        pytest.skip("needs a GPU")
    X = _graphs(120, seed=17)
    Y = _graphs(50, seed=18)
    cluster = local_cluster(visible_gpus()[:1], 4)
    with distributed.Client(cluster) as c:
        for kernel in (_mgk(backend="gpu"), _mgk(backend="gpu", dtype=np.float64, normalize=True),
                       _spgk(backend="gpu"), _spgk(backend="gpu", normalize=True)):
            np.testing.assert_array_equal(gram(kernel, X, client=c, tile=32), kernel(X))
            got = gram(kernel, X, Y, client=c, tile=32, out=tmp_path / f"{id(kernel)}.zarr")
            np.testing.assert_array_equal(got[:], kernel(X, Y))
    cluster.close()


def test_graphs_ship_as_flat_arrays_and_come_back_the_same(rng):
    """What workers receive: the same graphs (content, names, label columns held by some graphs
    only, weighted and unweighted), read-only; lists that cannot lie flat travel as pickles."""
    import pickle

    from graphkern import Graph
    from graphkern.distributed._ship import pack, unpack

    graphs = _graphs(12, int(rng.integers(1 << 30)))
    graphs[3] = random_labeled(7, 0.5, n_node_labels=3, n_edge_labels=2, weighted=True, seed=int(rng.integers(99)))
    graphs[3].name = "weighted"
    graphs[5] = Graph(np.zeros(1, np.int64), np.zeros(0, np.int32), name="empty")  # no vertices, no labels
    graphs[7].node_labels["charge"] = rng.normal(size=(graphs[7].n_nodes, 2))
    kind, _ = pickle.loads(pack(graphs))
    assert kind == "flat"
    back = unpack(pack(graphs))
    assert [g.fingerprint for g in back] == [g.fingerprint for g in graphs]  # as shipped
    for g in back:
        g._cache.pop("fingerprint")
    assert [g.fingerprint for g in back] == [g.fingerprint for g in graphs]  # as recomputed from the arrays
    assert [g.name for g in back] == [g.name for g in graphs]
    for a, b in zip(graphs, back):
        assert sorted(a.node_labels) == sorted(b.node_labels) and sorted(a.edge_labels) == sorted(b.edge_labels)
        assert (a.weights is None) == (b.weights is None) and a.indices.dtype == b.indices.dtype
        assert a.indptr.dtype == b.indptr.dtype
        assert not b.indices.flags.writeable and not b.indptr.flags.writeable
        assert b._cache.get("valid") == a._cache.get("valid")
    node_key, edge_key = sorted(graphs[0].node_labels)[0], sorted(graphs[0].edge_labels)[0]
    some = unpack(pack(graphs, ([node_key], [edge_key])))  # the columns a kernel reads, no others
    for a, b in zip(graphs, some):
        assert list(b.node_labels) == [k for k in a.node_labels if k == node_key]
        assert list(b.edge_labels) == [k for k in a.edge_labels if k == edge_key]
        assert "fingerprint" not in b._cache  # that of the whole graph does not hold for the copy
        whole = Graph(a.indptr, a.indices, a.weights, node_labels={k: v for k, v in a.node_labels.items()
                                                                    if k == node_key},
                      edge_labels={k: v for k, v in a.edge_labels.items() if k == edge_key})
        assert b.fingerprint == whole.fingerprint
    unchecked = Graph(np.array([0, 1, 2]), np.array([1, 0]), validate=False)
    assert not unpack(pack([unchecked]))[0]._cache.get("valid")
    graphs[2].node_labels["charge"] = rng.integers(0, 3, graphs[2].n_nodes)  # int here, float in graph 7
    assert pickle.loads(pack(graphs))[0] == "graphs"
    assert [g.fingerprint for g in unpack(pack(graphs))] == [g.fingerprint for g in graphs]
    assert unpack(pack([])) == []
