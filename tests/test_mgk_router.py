"""The router of the marginalized graph kernel: the pairs partitioned once between a solver chain,
declined pairs handed on, results merged in the caller's order (CPU engines stand in for GPU ones)."""

import types

import numpy as np
import pytest

from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk.core import launch_order
from graphkern.mgk.cpu import CPUEngine
from graphkern.mgk.csr import CSRGPUEngine, header_bytes, pair_shared_bytes
from graphkern.mgk.gemm import _cost_candidates, route_pairs
from graphkern.mgk.results import solver_arguments
from graphkern.mgk.router import Router

from conftest import SimulatedLayout, launch_arguments, launched_pairs, simulated_exports
from test_mgk import KERNELS, random_graph
from test_mgk_gemm import H100_SHARED, kernel as gemm_kernel, labeled_graph


class Picky(CPUEngine):
    """A CPU engine that accepts the pairs ``accept(pairs)`` marks and declines ``decline(pairs)``."""

    def __init__(self, s, name, accept=True, decline=None):
        super().__init__(1, s)
        self.name, self.accept, self.decline, self.seen = name, accept, decline, []

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=None):
        return self.accept if isinstance(self.accept, bool) else self.accept(pair_arr)

    def _mark(self, sol, pair_arr):
        self.seen.append(pair_arr.copy())
        if self.decline is not None:
            sol.declined = np.flatnonzero(self.decline(pair_arr))
            sol.K[sol.declined] = np.nan
        return sol

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        return self._mark(super().solve(ds1, ds2, pair_arr, args, nodal=nodal), pair_arr)

    def solve_gradient(self, ds1, ds2, pair_arr, args, plan):
        return self._mark(super().solve_gradient(ds1, ds2, pair_arr, args, plan), pair_arr)


def setup(rng, n=9):
    X = [random_graph(rng, int(k)) for k in rng.integers(2, 12, n)]
    kern = MarginalizedGraphKernel(*KERNELS["kronecker"], dtype=np.float64, tol=1e-13, backend="cpu")
    s = kern._settings()
    ds = kern._dataset(X, s)
    i, j = np.triu_indices(n)
    return kern, s, ds, solver_arguments(ds, ds, s), np.stack([i, j], axis=1).astype(np.int64)


@pytest.mark.parametrize("gradient", [False, True])
def test_partition_decline_and_merge(rng, gradient):
    kern, s, ds, args, pairs = setup(rng)
    small = lambda p: ds.n_nodes[p[:, 0]] * ds.n_nodes[p[:, 1]] < 30
    first = Picky(s, "first", accept=small, decline=lambda p: p[:, 0] == p[:, 1])  # declines the diagonal
    second = Picky(s, "second", accept=lambda p: p[:, 0] % 2 == 0)
    last = Picky(s, "last")
    chain = [("first", first), ("second", second), ("last", last)]
    router = Router(chain, lambda: chain)
    plan = kern._gradient_plan(s, ds, args) if gradient else None
    got = router.solve(ds, ds, pairs, args, plan=plan)
    ref = CPUEngine(1, s)
    want = ref.solve_gradient(ds, ds, pairs, args, plan) if gradient else ref.solve(ds, ds, pairs, args, nodal=False)
    np.testing.assert_array_equal(got.K, want.K)
    np.testing.assert_array_equal(got.iterations, want.iterations)
    if gradient:
        np.testing.assert_array_equal(got.gradient, want.gradient)
        np.testing.assert_array_equal(got.adjoint_iterations, want.adjoint_iterations)
    # each pair ran once where the chain says: first where small and off the diagonal, ...
    take1 = small(pairs)
    ran_first = take1 & (pairs[:, 0] != pairs[:, 1])
    to_second = ~ran_first & (pairs[:, 0] % 2 == 0)
    assert router.last_run == {k: v for k, v in (("first", ran_first.sum()), ("second", to_second.sum()),
                                                 ("last", (~ran_first & ~to_second).sum())) if v}
    if take1.any():  # fresh random sizes: there may be no pair small enough for the first engine
        np.testing.assert_array_equal(first.seen[0], pairs[take1])
    else:
        assert not first.seen
    if second.seen:
        np.testing.assert_array_equal(second.seen[0], pairs[to_second])


def test_one_engine_taking_every_pair_gets_the_callers_array(rng):
    kern, s, ds, args, pairs = setup(rng)
    nobody, everyone, last = Picky(s, "a", accept=False), Picky(s, "b", accept=True), Picky(s, "c")
    chain = [("a", nobody), ("b", everyone), ("c", last)]
    router = Router(chain, lambda: chain)
    sol = router.solve(ds, ds, pairs, args, nodal=True)
    assert everyone.seen[0] is not None and router.last_run == {"b": len(pairs)} and not nobody.seen and not last.seen
    want = CPUEngine(1, s).solve(ds, ds, pairs, args, nodal=True)
    for a, b in zip(sol.nodal, want.nodal):
        np.testing.assert_array_equal(a, b)
    # a per-pair mask before an engine that takes all: the last engine gets nothing
    some, rest, last = Picky(s, "a", accept=lambda p: p[:, 0] == 0), Picky(s, "b", accept=True), Picky(s, "c")
    chain = [("a", some), ("b", rest), ("c", last)]
    router = Router(chain, lambda: chain)
    np.testing.assert_array_equal(router.solve(ds, ds, pairs, args).K, want.K)
    assert router.last_run == {"a": int(np.sum(pairs[:, 0] == 0)), "b": int(np.sum(pairs[:, 0] != 0))}


def test_progress_chunks_give_the_same_result(rng):
    class Counter:
        done = 0

        def update(self, n):
            self.done += n

    kern, s, ds, args, pairs = setup(rng, 14)
    engine = CPUEngine(2, s)
    engine.progress_chunk = 7
    router = Router([("cpu", engine)], lambda: [("cpu", engine)])
    bar = Counter()
    sol = router.solve(ds, ds, pairs, args, progress=bar)
    assert bar.done == len(pairs)
    np.testing.assert_array_equal(sol.K, CPUEngine(2, s).solve(ds, ds, pairs, args, nodal=False).K)


def test_launch_order_is_a_permutation_largest_first(rng):
    cost = np.concatenate([rng.uniform(0, 1e6, 5000), np.zeros(10), [3e6]])
    order = launch_order(cost)
    np.testing.assert_array_equal(np.sort(order), np.arange(len(cost)))
    assert order[0] == len(cost) - 1
    assert np.all(np.diff(cost[order]) <= 3e6 / 65535 * 1.01)  # descending up to the quantum
    np.testing.assert_array_equal(launch_order(np.zeros(4)), np.arange(4))
    assert len(launch_order(np.zeros(0))) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("edges", ["kronecker", "sqexp", "general"])
def test_csr_shared_bytes_split_per_graph_equal_the_layout(rng, dtype, edges):
    X = [random_graph(rng, int(k), float(d)) for k, d in zip(rng.integers(1, 40, 12), rng.uniform(0.05, 0.9, 12))]
    kern = MarginalizedGraphKernel(*KERNELS[edges], dtype=dtype, backend="cpu")
    s = dict(kern._settings(), gradient_solves="lockstep")
    ds = kern._dataset(X, s)
    args = solver_arguments(ds, ds, s)
    engine = CSRGPUEngine.__new__(CSRGPUEngine)  # no device: the host arithmetic only
    engine.s = s
    i, j = np.triu_indices(len(X))
    pairs = np.stack([i, j], axis=1)
    plan = kern._gradient_plan(s, ds, args)
    for p, directions in ((None, 1), (plan, 2)):
        c1, c2, code, params, fixed, f1, f2, cross = engine._parts(ds, ds, args, p)
        extra = (0, 0) if p is None else (len(plan.contraction_programs.params), len(plan.contraction_programs.code))
        want = header_bytes(np.dtype(dtype).itemsize, len(params) + extra[0], len(code) + extra[1]) + pair_shared_bytes(
            np.dtype(dtype).itemsize, args["form_name"], ds.n_nodes[i], ds.n_nodes[j], ds.n_entries[i],
            ds.n_entries[j], ds.edge_features.shape[1], directions)
        np.testing.assert_array_equal(fixed + f1[i] + f2[j] + cross * ds.n_nodes[i] * ds.n_nodes[j], want)
        assert engine._need(ds, ds, pairs, args, p)[-1] == want.max()


def test_cost_candidates_hold_every_pair_the_gemm_solver_wins(rng):
    X = [labeled_graph(rng, int(n), float(d), [0, 1, 2]) for n, d in
         zip(rng.integers(2, 100, 16), rng.uniform(0.02, 0.95, 16))] + [labeled_graph(rng, 6, 0.5, [0, 1])]
    for edge in ("constant", "kronecker"):
        kern = gemm_kernel(edge, backend="cpu")
        s = kern._settings()
        ds = kern._dataset(X, s)
        i, j = np.triu_indices(len(X))
        pairs = np.stack([i, j], axis=1)
        wins = route_pairs(ds, ds, pairs, s, solver_arguments(ds, ds, s), shared_limit=H100_SHARED, by_cost=True).take
        cand = np.zeros(len(pairs), dtype=bool)
        cand[_cost_candidates(ds, ds, pairs)] = True
        assert wins.any() and np.all(cand[wins]), edge
        assert not cand[-1]  # the filter leaves out a pair of small graphs


class _Buf:
    def __init__(self, a):
        self.a, self.ptr, self.poisoned = a, 0, False

    def memset32(self, value, stream=None):
        self.a.view(np.uint8)[:] = 0xFF
        self.poisoned = True

    def zero(self, stream=None):
        self.a[...] = 0

    def view(self, offset, nbytes, *, dtype, shape):
        part = _Buf(self.a.reshape(-1).view(np.uint8)[offset:offset + nbytes].view(dtype).reshape(shape))
        part.poisoned = self.poisoned
        return part

    def to_host(self):
        return self.a.copy()

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def copy_to_host(self, out, stream=None, offset=0):
        out.reshape(-1).view(np.uint8)[:] = self.a.reshape(-1).view(np.uint8)[offset:offset + out.nbytes]


class _Dev:
    ordinal = 0
    properties = {"max_shared_memory_per_block_optin": 227 * 1024, "multiprocessor_count": 132,
                  "compute_capability": (9, 0)}

    def memory_info(self):
        return 70e9, 80e9

    def synchronize(self):
        pass

    activate = synchronize


def _stub_exports(dev, module, agree=None):
    return types.SimpleNamespace(**simulated_exports(module))


@pytest.fixture
def stub_device(monkeypatch):
    """The driver layer replaced by host arrays: a launch records its entry point and pairs and
    writes K = 1, iterations 1, residuals and derivatives 0 into its poisoned outputs."""
    import graphkern.mgk.kernel as kernel_module
    from graphkern._cuda import runtime as rt

    launches = []

    def launch(fn, blocks, threads, args, shared_mem=0, stream=None):
        g1, g2, _ = launched_pairs(args)
        launches.append((fn.name, g1.a.copy(), g2.a.copy()))
        first = True
        for a in launch_arguments(args):
            if isinstance(a, _Buf) and a.poisoned:
                a.a[...] = (1.0 if first else 0.0) if a.a.dtype.kind == "f" else 1
                first = first and a.a.dtype.kind != "f"

    event = type("Event", (), {"__init__": lambda self, dev: None, "record": lambda self, stream=None: None,
                               "elapsed_ms": lambda self, other: 0.0})
    stream = type("Stream", (), {"__init__": lambda self, dev: None, "synchronize": lambda self: None})
    fn = type("Fn", (), {"__init__": lambda self, name: setattr(self, "name", name),
                         "set_max_dynamic_shared_memory": lambda self, n: None,
                         "max_active_blocks_per_sm": lambda self, threads, shared: 2})
    for name, value in dict(get_device=lambda ordinal: _Dev(), kernel=lambda dev, module, name: fn(name),
                            exports=_stub_exports, layout=SimulatedLayout,
                            check_fits=lambda *a: None, alloc=lambda dev, shape, dtype: _Buf(np.empty(shape, dtype)),
                            to_device=lambda dev, a, stream=None: _Buf(np.array(a)), launch=launch, Event=event,
                            Stream=stream).items():
        monkeypatch.setattr(rt, name, value)
    monkeypatch.setattr(kernel_module, "resolve_backend", lambda backend: "gpu")
    monkeypatch.setattr(kernel_module, "resolve_devices", lambda device: [0])
    return launches


@pytest.mark.parametrize("techniques,solvers,gradient_solvers", [
    ("auto", {"gemm", "csr", "tiled"}, {"gemm", "csr", "core"}), ("gemm", {"gemm", "csr", "core"}, {"gemm", "csr", "core"}),
    ("csr", {"csr", "core"}, {"csr", "core"}), ("core", {"core"}, {"core"}), ("tiled", {"tiled"}, {"core"})])
@pytest.mark.parametrize("gradient", [False, True])
def test_every_pair_is_launched_once_on_its_solver(rng, stub_device, techniques, solvers, gradient_solvers, gradient):
    """With the device stubbed, the GPU chains run their host code: each pair of the Gram matrix
    reaches exactly one launch, on the solvers the chain names."""
    X = [labeled_graph(rng, n, 0.9, [0, 1, 2]) for n in (40, 57, 120)] + \
        [labeled_graph(rng, n, 0.05, [0, 1, 2]) for n in (50, 300)]
    kern = gemm_kernel("kronecker", q=0.05, techniques=techniques, gradient_dtype=None)
    K = kern(X, eval_gradient=gradient)[0] if gradient else kern(X)
    np.testing.assert_array_equal(K, np.ones((len(X), len(X)), dtype=np.float32))
    launched = sorted((int(a), int(b)) for _, g1, g2 in stub_device for a, b in zip(g1, g2))
    i, j = np.triu_indices(len(X))
    assert launched == sorted(zip(i.tolist(), j.tolist()))
    assert set(kern.info_.solvers) == (gradient_solvers if gradient else solvers)
    assert sum(kern.info_.solvers.values()) == len(i)


class _Device:
    def activate(self):
        pass


@pytest.mark.parametrize("gradient", [False, True])
@pytest.mark.parametrize("everyone", [True, False])
def test_device_router_shares_and_merge(rng, monkeypatch, gradient, everyone):
    """Two stand-in devices: each chain's share is solved once and the merge is the single engine's
    answer; when every pair goes to the devices each gets a contiguous run of the caller's array itself."""
    from graphkern.mgk import router as routing

    monkeypatch.setattr(routing.rt, "get_device", lambda ordinal: _Device())
    kern, s, ds, args, pairs = setup(rng, 14)
    small = True if everyone else (lambda p: ds.n_nodes[p[:, 0]] * ds.n_nodes[p[:, 1]] < 40)
    chains = [[("first", Picky(s, "first", accept=small)), ("last", Picky(s, "last"))] for _ in range(2)]
    seen = [[] for _ in chains]
    for k, chain in enumerate(chains):
        solve = chain[0][1].solve
        chain[0][1].solve = (lambda ds1, ds2, p, a, *, nodal, k=k, solve=solve:
                             seen[k].append(p) or solve(ds1, ds2, p, a, nodal=nodal))
    tiled = Picky(s, "tiled")
    router = routing.DeviceRouter([0, 1], [routing.Router(c, lambda c=c: c) for c in chains], tiled)
    plan = kern._gradient_plan(s, ds, args) if gradient else None
    got = router.solve(ds, ds, pairs, args, nodal=not gradient, plan=plan)
    ref = CPUEngine(1, s)
    want = (ref.solve_gradient(ds, ds, pairs, args, plan) if gradient
            else ref.solve(ds, ds, pairs, args, nodal=True))
    np.testing.assert_array_equal(got.K, want.K)
    np.testing.assert_array_equal(got.iterations, want.iterations)
    if gradient:
        np.testing.assert_array_equal(got.gradient, want.gradient)
    else:
        for a, b in zip(got.nodal, want.nodal):
            np.testing.assert_array_equal(a, b)
    assert sum(r[1] for r in router.device_runs) + router.last_run.get("tiled", 0) == len(pairs)
    if everyone or gradient:  # gradients: every pair to the devices' own chains
        assert not tiled.seen
        runs = [p for views in seen for p in views] if not gradient else []
        if runs:
            assert all(np.shares_memory(p, pairs) for p in runs)
            np.testing.assert_array_equal(np.concatenate(runs), pairs)


def test_merge_parts_by_slices_equals_by_index_arrays(rng):
    from graphkern.mgk.results import Solved, merge_parts

    m = 50
    K, it = rng.random(m), rng.integers(1, 9, m).astype(np.int32)

    def part(lo, hi):
        return Solved(K=K[lo:hi].copy(), iterations=it[lo:hi].copy(), residuals=K[lo:hi] / 10, nodal=None,
                      octile_pairs=None, seconds=1.0)

    cuts = [(0, 17), (17, 40), (40, m)]
    by_slice = merge_parts([("d", slice(lo, hi), part(lo, hi)) for lo, hi in cuts], m, False, None)
    by_index = merge_parts([("d", np.arange(lo, hi), part(lo, hi)) for lo, hi in cuts], m, False, None)
    for a, b in ((by_slice.K, by_index.K), (by_slice.iterations, by_index.iterations),
                 (by_slice.residuals, by_index.residuals)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(by_slice.K, K)
    assert by_slice.seconds == 3.0
    # runs that leave pairs out: those stay NaN / -1
    gap = merge_parts([("d", slice(0, 17), part(0, 17)), ("d", slice(40, m), part(40, m))], m, False, None)
    assert np.isnan(gap.K[17:40]).all() and (gap.iterations[17:40] == -1).all()
    np.testing.assert_array_equal(gap.K[:17], K[:17])


def test_parts_placed_from_threads_at_once(rng):
    """Each device's thread places its part as it finishes (graphkern.mgk.results.Merged): eight
    threads placing runs and scattered indices of one answer at once, with nodal blocks and
    gradients, give what merge_parts gives from the same parts in one thread."""
    from concurrent.futures import ThreadPoolExecutor

    from graphkern.mgk.results import Merged, Solved, merge_parts

    m, n_raw = 200_003, 3
    K, it = rng.random(m), rng.integers(1, 9, m).astype(np.int32)
    raw, adj = rng.random((m, n_raw)), rng.integers(1, 5, m).astype(np.int32)
    blocks = [np.full((1, 2), float(j)) for j in range(m)]
    runs = np.linspace(0, m, 9).astype(int)
    parts = []
    for k, (lo, hi) in enumerate(zip(runs[:-1], runs[1:])):
        idx = slice(lo, hi) if k % 2 else np.arange(lo, hi)[rng.permutation(hi - lo)]
        take = np.arange(m)[idx]
        parts.append(("d", idx, Solved(K=K[take], iterations=it[take], residuals=K[take] / 7,
                                       nodal=[blocks[j] for j in take], octile_pairs=None, seconds=0.5,
                                       gradient=raw[take], adjoint_iterations=adj[take])))

    class Plan:  # the one attribute of a graphkern.mgk.gradient.GradientPlan that a merge reads
        n_raw = 3

    merged = Merged(m, True, Plan(), covered=False)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda part: merged.place(part[1], part[2]), parts))
    got, want = merged.solved(), merge_parts(parts, m, True, Plan())
    for a, b in ((got.K, K), (got.iterations, it), (got.residuals, K / 7), (got.gradient, raw),
                 (got.adjoint_iterations, adj), (want.K, K), (want.gradient, raw)):
        np.testing.assert_array_equal(a, b)
    assert all(a is b for a, b in zip(got.nodal, blocks)) and got.seconds == want.seconds == 4.0
