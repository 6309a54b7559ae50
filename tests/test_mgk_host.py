"""The host side of the GPU path of the marginalized kernel, run on a simulated driver.

``FakeDriver`` stands in for the compiled driver layer (graphkern/_cuda/_driver.pyx): buffers are
host byte arrays, copies are memcpys, and a launch writes, for each pair (a, b) it is given in
launch order, the value ``(a + 1) (b + 1) + 0.5`` (exact in float32 for the sizes used here) to
the K output, 3 to the iterations and 1e-13 to the residuals.  Every Python line of the GPU path
(routing, launch planning, staging, readback, scattering, assembly) runs as on a device, so the
tests below check that each pair's value lands in its place of the Gram matrix whatever solver
took it, and ``python3 tests/test_mgk_host.py`` times that host work per call (the launches'
simulated work is taken out).
"""

from __future__ import annotations

import gc
import sys
import time
import weakref

import numpy as np
import pytest

from graphkern._cuda import runtime as rt

from conftest import SimulatedLayout, launch_arguments, launched_pairs, simulated_exports


class _Function:
    def __init__(self, name):
        self.name = name

    def set_max_dynamic_shared_memory(self, nbytes):
        pass

    def max_active_blocks_per_sm(self, block_size, dynamic_shared=0):
        return 2


class _Module:
    def __init__(self, key):
        self.key = key

    def function(self, name):
        return _Function(name)

    def global_bytes(self, name):
        assert name == "graphkern_exports"
        return np.array([(k.encode(), v) for k, v in simulated_exports(self.key).items()], rt._EXPORT_ROW).tobytes()


class _Device:
    def __init__(self, ordinal):
        self.ordinal = ordinal
        self.properties = {"name": "simulated", "multiprocessor_count": 132, "compute_capability": (9, 0),
                           "max_shared_memory_per_block_optin": 227 * 1024}

    def activate(self):
        pass

    def synchronize(self):
        pass

    def memory_info(self):
        return 70 << 30, 80 << 30

    def load_module(self, key, image):
        return _Module(key)

    def can_access_peer(self, other):
        return False


class _Buffer:
    def __init__(self, device, nbytes, *, dtype=None, shape=None):
        self.device, self.nbytes = device, nbytes
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.shape = shape
        self.data = np.empty(nbytes, dtype=np.uint8)
        self.ptr = self.data.ctypes.data

    def view(self, offset, nbytes, *, dtype=None, shape=None):
        part = _Buffer(self.device, 0, dtype=dtype, shape=shape)
        part.nbytes, part.data = nbytes, self.data[offset:offset + nbytes]
        part.ptr = part.data.ctypes.data
        return part

    def copy_from_host(self, host, stream=None, offset=0):
        src = memoryview(host).cast("B")
        self.data[offset:offset + src.nbytes] = np.frombuffer(src, dtype=np.uint8)

    def copy_to_host(self, out, stream=None, offset=0):
        dst = memoryview(out).cast("B")
        np.frombuffer(dst, dtype=np.uint8)[:] = self.data[offset:offset + dst.nbytes]
        return out

    def memset32(self, value, stream=None):  # device work: not host time
        t0 = time.perf_counter()
        self.data[:self.nbytes // 4 * 4].view(np.uint32)[:] = value
        FakeDriver.device_seconds += time.perf_counter() - t0

    def zero(self, stream=None):
        self.memset32(0, stream)

    def to_host(self, dtype=None, shape=None):
        dtype = np.dtype(dtype or self.dtype or np.uint8)
        shape = shape or self.shape or (self.nbytes // dtype.itemsize,)
        return self.data[:int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape).copy()

    def array(self, dtype, shape=None):
        return self.data.view(dtype) if shape is None else self.data.view(dtype).reshape(shape)


class _Pinned(_Buffer):
    def __init__(self, nbytes, mapped=False):
        super().__init__(None, nbytes)


class _Stream:
    def __init__(self, device):
        self.device = device

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass


class _Event:
    def __init__(self, device, timing=True):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def elapsed_ms(self, end):
        return 0.0


def value_of(a, b):
    """The simulated kernel value of the pair (a, b)."""
    return (a + 1.0) * (b + 1.0) + 0.5


class FakeDriver:
    """The driver module's names (init, Device, DeviceBuffer, ...) over host memory; ``launches``
    lists the kernels launched, ``device_seconds`` the time spent simulating them and memsets."""

    device_seconds = 0.0  # simulated device work (launches, memsets), not host time
    PinnedBuffer = _Pinned
    Stream = _Stream
    Event = _Event

    def __init__(self):
        self.launches = []
        FakeDriver.device_seconds = 0.0

    def init(self):
        pass

    def device_count(self):
        return 1

    def driver_version(self):
        return 13000

    def Device(self, ordinal):
        return _Device(ordinal)

    def DeviceBuffer(self, device, nbytes, *, dtype=None, shape=None):
        return _Buffer(device, nbytes, dtype=dtype, shape=shape)

    def launch(self, fn, grid, block, args, shared_mem=0, stream=None):
        t0 = time.perf_counter()
        self.launches.append(fn.name)
        if "gradient" in fn.name:
            raise NotImplementedError("the simulated driver runs K launches only")
        d_g1, d_g2, m = launched_pairs(args)
        g1, g2 = (d.data.view(np.int64)[:m] for d in (d_g1, d_g2))
        d_k, d_it, d_res = launch_arguments(args)[-5:-2]
        d_k.data.view(np.float64)[:m] = value_of(g1, g2)
        d_it.data.view(np.int32)[:m] = 3
        d_res.data.view(np.float64)[:m] = 1e-13
        FakeDriver.device_seconds += time.perf_counter() - t0


@pytest.fixture
def fake_gpu(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(rt, "_driver", driver)
    monkeypatch.setattr(rt, "_devices", {})
    monkeypatch.setattr(rt, "_state", {"checked": True, "reason": None})
    monkeypatch.setattr(rt, "_images", _AnyImage())
    monkeypatch.setattr(rt, "layout", SimulatedLayout)
    monkeypatch.setattr(rt, "_staging", {"free": {}, "made": 0, "lanes": {}, "pool": None})
    return driver


class _AnyImage(dict):
    def get(self, name, default=None):
        return b""


def _kernel(**kw):
    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel

    return MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)),
                                   TensorProduct(bond_order=KroneckerDelta(0.5)), q=0.05, backend="gpu", **kw)


def _molecules(n, hydrogens=False):
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    base = [g for g in read_sdf(molecules_path(), hydrogens=hydrogens) if g.n_nodes > 0]
    return [base[k % len(base)] for k in range(n)]


def _expected(nx, ny, offset=0):
    a = np.arange(nx, dtype=np.float64)[:, None]
    b = np.arange(ny, dtype=np.float64)[None, :]
    return value_of(a, b + offset)


@pytest.mark.parametrize("techniques", ["auto", "csr", "gemm", "tiled", "core"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_pair_lands_in_its_place(fake_gpu, techniques, dtype):
    graphs = _molecules(60, hydrogens=True)
    kernel = _kernel(techniques=techniques, dtype=dtype)
    K = kernel(graphs)
    want = _expected(60, 60)
    want = np.minimum(want, want.T)  # only pairs i <= j are solved: (i+1)(j+1) is symmetric anyway
    np.testing.assert_array_equal(K, want.astype(dtype))
    assert K.dtype == dtype and sum(kernel.info_.solvers.values()) == 60 * 61 // 2
    np.testing.assert_array_equal(kernel(graphs), K)  # again: the kept pair list and launch plans
    KY = kernel(graphs[:25], graphs[25:])
    np.testing.assert_array_equal(KY, np.array([[value_of(a, b) for b in range(35)] for a in range(25)], dtype))
    pairs = np.array([[3, 7], [0, 0], [59, 2], [3, 7]])
    np.testing.assert_array_equal(kernel(graphs, pairs=pairs), value_of(pairs[:, 0], pairs[:, 1]).astype(dtype))
    assert fake_gpu.launches


def test_dense_and_sparse_pairs_split_between_solvers(fake_gpu):
    from graphkern import generators as gen

    rng = np.random.default_rng(5)
    from graphkern.graph import Graph
    graphs = []
    for s in range(24):
        g = gen.random_labeled(int(rng.integers(20, 90)), 0.9 if s % 2 else 0.05, n_node_labels=3,
                               n_edge_labels=3, seed=s)
        graphs.append(g)
    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel
    kernel = MarginalizedGraphKernel(TensorProduct(label=KroneckerDelta(0.5)), TensorProduct(label=KroneckerDelta(0.5)),
                                     q=0.05, backend="gpu")
    K = kernel(graphs)
    want = _expected(24, 24)
    np.testing.assert_array_equal(K, np.minimum(want, want.T).astype(np.float32))
    assert len([n for n, c in kernel.info_.solvers.items() if c]) >= 2, kernel.info_.solvers
    assert isinstance(graphs[0], Graph)


def test_launch_plans_are_kept_only_for_their_pairs_and_sets():
    """A launch plan (order, graphs, the largest pair that sizes the scratch) is reused only for the
    same read-only pair array, the same other set and footprint; anything else plans afresh."""
    from graphkern._cpu import pairs
    from graphkern.mgk.csr import csr_data

    graphs = _molecules(36, hydrogens=True)
    kernel = _kernel()
    s = kernel._settings()
    c1, c2, c3 = (csr_data(kernel._dataset(graphs[k:k + 12], s)) for k in (0, 12, 24))
    grid = kernel._pair_list(12, 12)
    assert kernel._pair_list(12, 12) is grid and not grid.flags.writeable
    from graphkern.mgk import kernel as kernel_module

    with pytest.MonkeyPatch.context() as mp:  # past the limit: made afresh, writable, so no plan is kept of it
        mp.setattr(kernel_module, "_PAIRS_KEPT", 142)
        big = kernel._pair_list(13, 11)
        assert big.flags.writeable and kernel._pair_list(13, 11) is not big
        np.testing.assert_array_equal(big, np.stack(np.meshgrid(np.arange(13), np.arange(11), indexing="ij"),
                                                     axis=-1).reshape(-1, 2))
        small = kernel._pair_list(11, None)
        assert small.shape == (66, 2) and not small.flags.writeable and kernel._pair_list(11, None) is small
    grid = kernel._pair_list(12, 12)
    foot = (lambda c, per_entry=20: c.n_entries * per_entry + 4 * c.n_nodes)

    def fresh(a, b, pair_arr, cross=4, per_entry=20):
        return pairs.pair_plan(pair_arr, a.n_nodes, b.n_nodes, a.n_entries, b.n_entries, foot(a, per_entry),
                               foot(b, per_entry), cross)

    def same(plan, want):
        assert all(np.array_equal(x, y) for x, y in zip(plan[:6], want))

    p12 = c1.launch_plan(c2, grid, foot(c1), foot(c2), 4)
    same(p12, fresh(c1, c2, grid))
    np.testing.assert_array_equal(p12[6]["positions"][p12[0]], np.arange(len(grid)))
    assert c1.launch_plan(c2, grid, foot(c1), foot(c2), 4) is p12
    replaced = weakref.ref(p12[6]["positions"])
    p13 = c1.launch_plan(c3, grid, foot(c1), foot(c3), 4)
    assert p13 is not p12
    del p12
    gc.collect()
    assert replaced() is None  # a replaced plan goes at once, though its pair array lives on (Dask tiles)
    same(p13, fresh(c1, c3, grid))
    for per_entry, cross in ((36, 4), (20, 8)):
        plan = c1.launch_plan(c3, grid, foot(c1, per_entry), foot(c3, per_entry), cross)
        assert plan is not p13
        same(plan, fresh(c1, c3, grid, cross, per_entry))
    writable = np.array(grid)
    once = c1.launch_plan(c3, writable, foot(c1), foot(c3), 4)
    assert c1.launch_plan(c3, writable, foot(c1), foot(c3), 4) is not once
    # the kept plan holds its array and sets weakly and goes with the array: a deleted kernel's pair
    # list frees it (its device copies included), and the sets are not kept alive by it
    from graphkern.mgk import csr as csr_module

    kept = c1.launch_plan(c3, grid, foot(c1), foot(c3), 4)
    assert csr_module._KEPT.plan[6] == [kept]
    dead = weakref.ref(c3)
    del kernel, grid, kept, p13, plan, c3
    gc.collect()
    assert csr_module._KEPT.plan[6] == [] and dead() is None


@pytest.mark.gpu
@pytest.mark.parametrize("techniques", ["auto", "csr"])
def test_kept_launch_plans_give_the_bits_of_fresh_calls(techniques):
    """On the device: repeated calls (the kept pair list, launch plan and device copies of the pairs)
    and tiles of one shape by turns give, bit for bit, what a fresh kernel gives for each."""
    graphs = _molecules(240, hydrogens=True)
    X, Y1, Y2 = graphs[:80], graphs[80:160], graphs[160:]
    kernel = _kernel(techniques=techniques)
    for args in ((graphs,), (graphs,), (X, Y1), (X, Y2), (X, Y1), (Y2, X)):
        np.testing.assert_array_equal(kernel(*args), _kernel(techniques=techniques)(*args))


def _profile(label, call, repeat):
    """Host milliseconds of ``call`` (median of ``repeat`` warm calls, the simulated launches taken out)."""
    call()
    times = []
    for _ in range(repeat):
        FakeDriver.device_seconds = 0.0
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0 - FakeDriver.device_seconds)
    print(f"{label}: host {1e3 * np.median(times):.1f} ms per warm call (min {1e3 * min(times):.1f}, "
          f"{repeat} calls)")
    return times


def main(argv):
    """Time the host work of a warm GPU call: (a) 1000 molecules (H dropped), symmetric; (b) a
    1333 x 1333 tile of 4000 molecules with hydrogens as in the file, as graphkern.distributed's
    tiles call it (two tiles by turns, their graphs packed once).  ``--profile``: cProfile of one warm call of each."""
    import cProfile
    import pstats

    driver = FakeDriver()
    rt._driver, rt._state = driver, {"checked": True, "reason": None}
    rt._images = _AnyImage()
    a_graphs = _molecules(1000)
    b_all = _molecules(4000, hydrogens=True)
    X, Ys = b_all[:1333], (b_all[1333:2666], b_all[2666:3999])
    ka, kb = _kernel(), _kernel()
    t0 = time.perf_counter()
    Ka = ka(a_graphs)
    print(f"(a) first call {1e3 * (time.perf_counter() - t0):.0f} ms")
    Kb = kb(X, Ys[0])
    kb(X, Ys[1])
    np.testing.assert_array_equal(Ka, np.minimum(_expected(1000, 1000), _expected(1000, 1000).T).astype(np.float32))
    np.testing.assert_array_equal(Kb, _expected(1333, 1333, 0).astype(np.float32))
    _profile("(a) 1000 molecules, symmetric", lambda: ka(a_graphs), 7)
    turn = [0]

    def tile():  # two tiles by turns, as a worker gets them: nothing of the last tile's pairs is reused
        turn[0] ^= 1
        return kb(list(X), list(Ys[turn[0]]))

    _profile("(b) 1333 x 1333 tile", tile, 6)
    if "--profile" in argv:
        for label, call in (("a", lambda: ka(a_graphs)), ("b", tile)):
            prof = cProfile.Profile()
            prof.runcall(call)
            print(f"---- ({label})")
            pstats.Stats(prof).sort_stats("cumtime").print_stats("graphkern", 30)


if __name__ == "__main__":
    main(sys.argv[1:])
