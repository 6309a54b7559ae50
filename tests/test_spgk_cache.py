"""What a ShortestPathKernel keeps between calls: packed batches, pair lists, GPU runners.

A repeated call on the same graphs must reuse them (nothing packed or uploaded again), and
anything they depend on (a replaced label column, a graph with other weights or structure, the
vertex kernel, dtype, device, edge kernel) must give fresh values.  The GPU side runs here on a fake runtime
whose gpu_batched "kernel" is the CPU's FCSP on the uploaded copies, so what the launch reads
is checked too.
"""

import pickle
import types
import weakref

import numpy as np
import pytest

from conftest import SimulatedLayout, rebuilt
from graphkern.spgk import batch as spgk_batch, gpu as spgk_gpu
from graphkern import Graph
from graphkern._cpu import spgk as cpu_spgk
from graphkern._cuda import runtime
from graphkern.basekernels.shortest_path import node_features
from graphkern.graph import pack_graphs
from graphkern.spgk import DiracEdge, DiracNode, GaussianEdge, GaussianNode, ShortestPathKernel
from test_spgk import EDGE, NODE, assert_close, graph_zoo, random_graph, ref_dirac, ref_gaussian, reference_gram

MIXED, MIXED_REF = NODE["mixed"]


def zoo(rng):
    return graph_zoo(rng, weighted=True) + [random_graph(rng, 12, weighted=True) for _ in range(3)]


# --------------------------------------------------------------------------- packing

def packed_by_pack_graphs(node_kernel, graphs):
    """node_features as it was built on graphkern.graph.pack_graphs (adjacency packed too)."""
    factors = () if node_kernel is None else node_kernel.factors()
    packed = pack_graphs(graphs, node_label_columns=list(dict.fromkeys(f.column for f in factors)))
    n = int(packed.node_offsets[-1])
    disc = [packed.node_labels[f.column].astype(np.int64, copy=False) for f in factors if isinstance(f, DiracNode)]
    gaussians = [f for f in factors if isinstance(f, GaussianNode)]
    cont = [packed.node_labels[f.column].reshape(n, -1).astype(np.float64, copy=False) for f in gaussians]
    weights = [np.full(c.shape[1], f.gamma) for f, c in zip(gaussians, cont)]
    return (packed.node_offsets.astype(np.int64),
            np.ascontiguousarray(np.stack(disc, axis=1) if disc else np.zeros((n, 0), np.int64)),
            np.ascontiguousarray(np.concatenate(cont, axis=1) if cont else np.zeros((n, 0))),
            np.concatenate(weights) if weights else np.zeros(0))


@pytest.mark.parametrize("node", list(NODE))
def test_node_features_equal_the_pack_graphs_packing_bit_for_bit(rng, node):
    graphs = zoo(rng)
    for got, want in zip(node_features(NODE[node][0], graphs), packed_by_pack_graphs(NODE[node][0], graphs)):
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
        assert got.tobytes() == want.tobytes()


def test_node_features_of_no_vertices():
    # pack_graphs' reshape(0, -1) could not infer a Gaussian column's width without vertices
    offsets, disc, cont, weights = node_features(MIXED, [])
    assert offsets.tolist() == [0] and disc.shape == (0, 1) and cont.shape == (0, 2) and len(weights) == 2
    assert ShortestPathKernel(node_kernel=MIXED, backend="cpu")([]).shape == (0, 0)


# --------------------------------------------------------------------------- the batch cache

def path_graph(order):
    """The path visiting ``order``'s vertices in turn, with labels c = 0, 0, 1, 1, x and v."""
    edges = np.array([(a, b) for a, b in zip(order, order[1:])])
    return Graph.from_edges(edges, 4, node_labels={"c": np.array([0, 0, 1, 1]), "x": np.arange(4.0),
                                                   "v": np.arange(8.0).reshape(4, 2) / 2})


def test_repeated_call_reuses_the_packed_batch(rng):
    graphs = zoo(rng)
    kernel = ShortestPathKernel(node_kernel=MIXED, edge_kernel=EDGE["gaussian"], backend="cpu")
    first = kernel(graphs)
    assert_close(first, reference_gram(graphs, graphs, MIXED_REF, "gaussian"), 1e-12)
    assert kernel._batches.packed == 1
    cfg = kernel._config()
    batch = kernel._batch(graphs, "X", cfg)
    view, pairs = batch.cpu(), batch.pairs()
    again = kernel(list(graphs))  # another list of the same graphs
    assert kernel._batches.packed == 1 and np.array_equal(again, first)
    assert kernel._batch(graphs, "X", cfg) is batch and batch.cpu() is view and batch.pairs() is pairs
    # a Gram matrix and transform's two batches fit together
    kernel.fit(graphs[:4])
    cross = kernel.transform(graphs[4:])
    kernel.transform(graphs[4:])
    kernel(graphs)
    assert kernel._batches.packed == 3
    assert_close(cross, first[4:, :4], 1e-12)  # K(a, b) and K(b, a) sum in different orders


def test_cache_is_bounded(rng):
    graphs = zoo(rng)
    kernel = ShortestPathKernel(node_kernel=MIXED, backend="cpu")
    for k in range(2 * spgk_batch.BATCH_CACHE_SIZE):
        kernel(graphs[k:])
    assert len(kernel._batches) == spgk_batch.BATCH_CACHE_SIZE


@pytest.mark.parametrize("column", ["c", "x", "v"])
def test_changed_label_gives_fresh_values(rng, column):
    kernel = ShortestPathKernel(node_kernel=MIXED, backend="cpu")
    graphs = zoo(rng) + [path_graph([0, 1, 2, 3])]
    before = kernel(graphs)
    changed = graphs[-1].node_labels[column].copy()
    changed[0] += 1
    graphs[-1].node_labels[column] = changed
    after = kernel(graphs)
    assert kernel._batches.packed == 2
    assert_close(after, reference_gram(graphs, graphs, MIXED_REF, "dirac"), 1e-12)
    assert after[-1, -1] != before[-1, -1]
    # a column the vertex kernel does not read changes nothing
    only_x = ShortestPathKernel(node_kernel=GaussianNode("x", sigma=1.0), backend="cpu")
    only_x(graphs)
    graphs[1].node_labels["c"] = graphs[1].node_labels["c"] + 1
    only_x(graphs)
    assert only_x._batches.packed == 1


def test_replaced_or_removed_label_column_is_seen(rng):
    graphs = zoo(rng) + [path_graph([0, 1, 2, 3])]
    kernel = ShortestPathKernel(node_kernel=DiracNode("c"), backend="cpu")
    before = kernel(graphs)
    graphs[-1].node_labels["c"] = np.array([1, 0, 1, 1])
    after = kernel(graphs)
    assert_close(after, reference_gram(graphs, graphs, ref_dirac("c"), "dirac"), 1e-12)
    assert after[-1, -1] != before[-1, -1]
    del graphs[-1].node_labels["c"]
    with pytest.raises(KeyError, match="'c'"):
        kernel(graphs)


@pytest.mark.parametrize("method", ["openmp_out", "features"])
def test_changed_structure_or_weights_give_fresh_values(rng, method):
    graphs = zoo(rng) + [path_graph([0, 1, 2, 3])]
    kernel = ShortestPathKernel(node_kernel=DiracNode("c"), backend="cpu", method=method)
    before = kernel(graphs)
    cache = kernel._counts if method == "features" else kernel._batches
    # 0-1-2-3 becomes 0-2-1-3: same degrees, so the same indptr
    graphs[-1] = rebuilt(graphs[-1], indices=path_graph([0, 2, 1, 3]).indices, validate=True)
    after = kernel(graphs)
    assert_close(after, reference_gram(graphs, graphs, ref_dirac("c"), "dirac"), 1e-12)
    assert cache.packed == 2 and after[-1, -1] != before[-1, -1]
    k = next(k for k, g in enumerate(graphs) if g.weights is not None and g.nnz)
    graphs[k] = rebuilt(graphs[k], weights=graphs[k].weights + 1.0, validate=True)
    assert_close(kernel(graphs), reference_gram(graphs, graphs, ref_dirac("c"), "dirac"), 1e-12)
    assert cache.packed == 3


def test_node_kernel_changes_give_fresh_values(rng):
    graphs = zoo(rng)
    gaussian = GaussianNode("x", sigma=1.0)
    kernel = ShortestPathKernel(node_kernel=gaussian, backend="cpu")
    kernel(graphs)
    kernel.set_params(node_kernel=GaussianNode("x", sigma=0.5))
    assert len(kernel._batches) == 0
    assert_close(kernel(graphs), reference_gram(graphs, graphs, ref_gaussian("x", 0.5), "dirac"), 1e-12)
    # neither assigning the attribute nor editing the vertex kernel in place can reach a stale batch
    kernel.node_kernel = gaussian
    kernel(graphs)
    gaussian.gamma = 1 / (2 * 0.7 ** 2)
    assert_close(kernel(graphs), reference_gram(graphs, graphs, ref_gaussian("x", 0.7), "dirac"), 1e-12)
    kernel.node_kernel = DiracNode("c")
    assert_close(kernel(graphs), reference_gram(graphs, graphs, ref_dirac("c"), "dirac"), 1e-12)


def test_set_params_and_pickling_drop_the_batches(rng):
    graphs = zoo(rng)
    kernel = ShortestPathKernel(node_kernel=MIXED, backend="cpu")
    K = kernel(graphs)
    batch = weakref.ref(kernel._batch(graphs, "X", kernel._config()))
    kernel.set_params(n_threads=1)
    assert batch() is None and len(kernel._batches) == 0  # freed at once, not by the collector
    kernel(graphs)
    copy = pickle.loads(pickle.dumps(kernel))
    assert len(copy._batches) == 0 and copy._gpu is None and len(kernel._batches) == 1
    assert np.array_equal(copy(graphs), K)


def test_cache_keeps_no_graph_alive(rng):
    graphs = zoo(rng)
    kernel = ShortestPathKernel(node_kernel=MIXED, backend="cpu")
    kernel(graphs)
    kernel.fit(graphs[:3]).transform(graphs[3:])
    batch = weakref.ref(kernel._batch(graphs, "X", kernel._config()))
    refs = [weakref.ref(g) for g in graphs]
    del kernel.X_fit_
    del graphs
    # the graphs go at once (the caches hold them weakly), and with them the entries and the batch
    assert all(r() is None for r in refs)
    assert batch() is None and len(kernel._batches) == 0


# --------------------------------------------------------------------------- GPU on a fake runtime

class FakeBuffer:
    def __init__(self, array):
        self.host = array

    def zero(self, stream=None):
        self.host[...] = 0

    def memset32(self, value, stream=None):
        self.host.view(np.uint32)[...] = value

    def copy_from_host(self, array, stream=None, offset=0):
        self.host.view(np.uint8)[offset:offset + array.nbytes] = np.ascontiguousarray(array).view(np.uint8).ravel()

    def to_host(self):
        return self.host.copy()


class FakePinned:
    def __init__(self, nbytes, mapped=False):
        self.bytes = np.zeros(nbytes, np.uint8)

    def array(self, dtype, shape=None):
        a = self.bytes.view(dtype)
        return a if shape is None else a[:int(np.prod(shape))].reshape(shape)

    def device_pointer(self, device):
        return 0


class FakeEvent:
    def __init__(self, runtime_, timing=True):
        self.rt = runtime_

    def record(self, stream=None):
        pass

    def query(self):
        # the hybrid's CPU side gets a few steps before the launch reports itself done
        self.rt.queries += 1
        return self.rt.queries > self.rt.busy_queries

    def synchronize(self):
        pass

    def elapsed_ms(self, end):
        return 1.0


class FakeRuntime:
    """The parts of graphkern._cuda.runtime the shortest-path runner uses, on the host."""

    def __init__(self):
        self.devices = {}
        self.uploads = []  # (device ordinal, bytes) of each to_device
        self.launches = 0
        self.queries = self.busy_queries = 0

    def get_device(self, ordinal=0):
        return self.devices.setdefault(ordinal, type("FakeDevice", (), dict(
            ordinal=ordinal, properties=dict(multiprocessor_count=4, max_shared_memory_per_block_optin=99 * 1024)))())

    def kernel(self, device, module, name):
        return type("FakeFunction", (), dict(name=name, set_max_dynamic_shared_memory=lambda self, n: None,
                                              max_active_blocks_per_sm=lambda self, block, shared: 2))()

    def to_device(self, device, array, stream=None, dtype=None):
        array = np.array(array, dtype=dtype)
        self.uploads.append((device.ordinal, array.nbytes))
        return FakeBuffer(array)

    def alloc(self, device, shape, dtype):
        return FakeBuffer(np.zeros(shape, dtype))

    def check_fits(self, device, nbytes, what):
        pass

    def Stream(self, device):
        return type("FakeStream", (), dict(synchronize=lambda self: None, wait_event=lambda self, e: None,
                                           query=lambda self: True))()

    def Event(self, device, timing=True):
        return FakeEvent(self, timing)

    def launch(self, fn, grid, block, args, shared_mem=0, stream=None):
        """gpu_batched by the CPU's FCSP, on what was uploaded (float32 values read as float64)."""
        assert fn.name.startswith("spgk_batched_")
        self.launches += 1
        sets, job = [a.fields for a in args[:2]], types.SimpleNamespace(**args[2].fields)
        assert [a.layout for a in args] == ["spgk:batch", "spgk:batch", f"spgk:batched_{fn.name[-3:]}"]
        views = []
        for d in sets:
            n = int(d["node_offsets"].host[-1])
            views.append(cpu_spgk.GraphBatch(d["node_offsets"].host, d["disc"].host.reshape(n, job.n_disc),
                                             d["cont"].host.reshape(n, job.n_cont).astype(np.float64),
                                             d["path_offsets"].host, d["ends"].host.reshape(-1, 2),
                                             d["lengths"].host))
        self.continuous_dtype = sets[0]["cont"].host.dtype
        m = job.n_pairs if job.limit is None else min(job.n_pairs, int(job.limit.host[0]))
        a, b = job.pair_a.host[:m], job.pair_b.host[:m]
        sizes = np.diff(sets[0]["node_offsets"].host)[a] * np.diff(sets[1]["node_offsets"].host)[b]
        # each block's V fits in shared memory or in its slice of the scratch
        assert m == 0 or sizes.max() <= max(job.shared_capacity, job.scratch_stride)
        work = np.empty(int(sizes.max()) if m else 1)
        values = np.empty(m)
        cpu_spgk.kernel_pairs("fcsp", views[0], views[1], a, b, values, job.weights.host.astype(np.float64),
                              job.kind, job.param, work, len(work), 1)
        job.out.host[:m] = values

    @staticmethod
    def PinnedBuffer(nbytes, mapped=False):
        return FakePinned(nbytes, mapped)


@pytest.fixture
def fake_gpu(monkeypatch):
    fake = FakeRuntime()
    for name in ("get_device", "kernel", "to_device", "alloc", "check_fits", "Stream", "Event", "launch",
                 "PinnedBuffer"):
        monkeypatch.setattr(runtime, name, getattr(fake, name))
    monkeypatch.setattr(runtime, "layout", SimulatedLayout)
    monkeypatch.setattr(runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(runtime, "device_count", lambda: 2)
    monkeypatch.setattr(spgk_gpu, "_PINNED_PAIRS", [])  # no fake buffer may reach the real pool
    return fake


BATCH_ARRAYS = 7  # node offsets, discrete, continuous, path offsets, ends, lengths, gammas
PAIR_ARRAYS = 2


def test_gpu_runner_and_uploads_are_reused(rng, fake_gpu):
    graphs = zoo(rng)
    expected = reference_gram(graphs, graphs, MIXED_REF, "gaussian")
    kernel = ShortestPathKernel(node_kernel=MIXED, edge_kernel=EDGE["gaussian"], backend="gpu")
    first = kernel(graphs)
    assert_close(first, expected, 1e-12)
    assert len(fake_gpu.uploads) == BATCH_ARRAYS + PAIR_ARRAYS
    runner = kernel._gpu[1]
    assert np.array_equal(kernel(graphs), first)
    assert len(fake_gpu.uploads) == BATCH_ARRAYS + PAIR_ARRAYS and kernel._gpu[1] is runner
    # a changed label: a new batch, uploaded
    x = graphs[2].node_labels["x"].copy()
    x[1] -= 0.5
    graphs[2].node_labels["x"] = x
    expected = reference_gram(graphs, graphs, MIXED_REF, "gaussian")
    assert_close(kernel(graphs), expected, 1e-12)
    assert len(fake_gpu.uploads) == 2 * (BATCH_ARRAYS + PAIR_ARRAYS)
    # another edge kernel: another runner, and the batch's copies serve it
    kernel.edge_kernel = EDGE["brownian"]
    assert_close(kernel(graphs), reference_gram(graphs, graphs, MIXED_REF, "brownian"), 1e-12)
    assert len(fake_gpu.uploads) == 2 * (BATCH_ARRAYS + PAIR_ARRAYS) + PAIR_ARRAYS
    kernel.edge_kernel = EDGE["gaussian"]
    assert np.array_equal(kernel(graphs), kernel(graphs))
    # float32 and another device: copies of their own
    n = len(fake_gpu.uploads)
    kernel.dtype = np.float32
    assert_close(kernel(graphs), expected, 1e-5)
    assert fake_gpu.continuous_dtype == np.float32 and len(fake_gpu.uploads) == n + BATCH_ARRAYS + PAIR_ARRAYS
    kernel.set_params(device=1)
    n = len(fake_gpu.uploads)
    assert_close(kernel(graphs), expected, 1e-5)
    assert [d for d, _ in fake_gpu.uploads[n:]] == [1] * (BATCH_ARRAYS + PAIR_ARRAYS)


def test_gpu_cross_matrix_and_vertex_kernel_change(rng, fake_gpu):
    X, Y = zoo(rng), [random_graph(rng, 7) for _ in range(4)]
    kernel = ShortestPathKernel(node_kernel=GaussianNode("x", sigma=1.0), backend="gpu", normalize=True)
    cpu = ShortestPathKernel(node_kernel=GaussianNode("x", sigma=1.0), backend="cpu", normalize=True)
    assert_close(kernel(X, Y), cpu(X, Y), 1e-12)
    assert_close(kernel(X, Y), cpu(X, Y), 1e-12)
    # as many graphs, larger: the same pair lists, not the same launch plan
    larger = [random_graph(rng, 20) for _ in range(4)]
    assert_close(kernel(X, larger), cpu(X, larger), 1e-12)
    # the gammas travel with the batch: a runner kept from the first call must not use old ones
    kernel.node_kernel = cpu.node_kernel = GaussianNode("x", sigma=0.3)
    assert_close(kernel(X, Y), cpu(X, Y), 1e-12)
    assert_close(kernel(X), cpu(X), 1e-12)


def test_hybrid_on_the_fake_runtime(rng, fake_gpu, monkeypatch):
    graphs = zoo(rng)
    expected = reference_gram(graphs, graphs, MIXED_REF, "gaussian")
    kernel = ShortestPathKernel(node_kernel=MIXED, edge_kernel=EDGE["gaussian"], backend="hybrid", n_threads=3)
    for busy in (0, 3, 0):
        fake_gpu.queries, fake_gpu.busy_queries = 0, busy
        assert_close(kernel(graphs), expected, 1e-12)
        split = kernel.hybrid_split_
        assert split["cpu_pairs"] + split["gpu_pairs"] == len(graphs) * (len(graphs) + 1) // 2
        assert (split["cpu_steps"] > 0) == (busy > 0)
    assert len(fake_gpu.uploads) == BATCH_ARRAYS + PAIR_ARRAYS and fake_gpu.launches == 3


def test_long_pair_lists_are_not_kept(rng, fake_gpu, monkeypatch):
    monkeypatch.setattr(spgk_batch, "_PAIRS_KEPT", 10)
    graphs = zoo(rng)
    kernel = ShortestPathKernel(node_kernel=MIXED, backend="gpu")
    first = kernel(graphs)
    assert np.array_equal(kernel(graphs), first)
    # the batch's copies serve both calls; the pairs, made anew, are uploaded with each launch
    assert len(fake_gpu.uploads) == BATCH_ARRAYS + 2 * PAIR_ARRAYS and not kernel._gpu[1]._plans
    small = graphs[:4]  # 10 pairs: kept, read-only, and so is their plan
    kernel(small)
    pa, pb = kernel._batch(small, "X", kernel._config()).pairs()
    assert not pa.flags.writeable and not pb.flags.writeable and len(kernel._gpu[1]._plans) == 1


def test_hybrid_runs_the_gpu_alone_when_every_pair_has_a_block(rng, fake_gpu):
    """4 fake SMs x 2 blocks: an idle GPU starts every pair of 5 graphs at once, so the CPU takes none."""
    graphs = zoo(rng)[:5]
    kernel = ShortestPathKernel(node_kernel=MIXED, edge_kernel=EDGE["gaussian"], backend="hybrid", n_threads=3)
    fake_gpu.queries, fake_gpu.busy_queries = 0, 3
    assert_close(kernel(graphs), reference_gram(graphs, graphs, MIXED_REF, "gaussian"), 1e-12)
    split = kernel.hybrid_split_
    assert split["gpu_alone"] and split["cpu_pairs"] == 0 and split["gpu_pairs"] == 15
