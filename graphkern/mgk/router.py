"""Which solver runs which pair: the pairs of a call are partitioned once, each solver runs its
share, and the results are merged in the caller's pair order.

A solver chain is an ordered list of engines; a pair goes to the first engine that
:meth:`accepts` it (the last accepts every pair).  On one GPU with ``techniques="auto"`` the chain
is the GEMM solver (pairs of dense graphs where it does less work: graphkern.mgk.gemm), the CSR
solver (pairs whose two graphs fit its shared memory: graphkern.mgk.csr), then the tiled solver
(graphkern.mgk.tiled); gradients run on the GEMM solver (unless ``gemm_gradients=False``), the
CSR solver and the core solver (graphkern.mgk.core).  An engine may decline pairs at run time
(the GEMM solver, when its dense layout or CG vectors do not fit the free device memory); those
go to the next engine of the chain that accepts them, in the same call.

On several GPUs (:class:`DeviceRouter`) every device has that chain: the pairs one device's chain
would give its GEMM and CSR solvers are split into one share per device of equal predicted cost,
each solved by its device's chain in its own thread, which puts the answers at their places in the
call's arrays as soon as it has them, and the pairs left (large graphs) go to the tiled solver, whose
devices claim them from one shared work queue.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from graphkern.mgk.core import GPUEngine
from graphkern.mgk.cpu import CPUEngine
from graphkern._cpu import pairs
from graphkern._cuda import runtime as rt
from graphkern.errors import CudaError, GraphTooLargeError
from graphkern.mgk.csr import CSR_TECHNIQUE, CSRGPUEngine, csr_data
from graphkern.mgk.gemm import GEMM_TECHNIQUE, GEMMGPUEngine
from graphkern.mgk.results import Merged, Solved, merge_parts
from graphkern.mgk.tiled import TiledGPUEngine, resolve_techniques

__all__ = ["Router", "DeviceRouter", "make_router"]


class Router:
    """Runs a call's pairs on a chain of solvers (module docstring).

    ``chain``: ``[(name, engine), ...]`` for K; ``gradient_chain``: a function returning the
    chain for gradients (built on first use: it may need one GPU where K does not).
    ``last_run``: the pairs each solver ran in the last :meth:`solve`.
    """

    def __init__(self, chain, gradient_chain):
        self.chain = chain
        self._gradient_factory = gradient_chain
        self._gradient_chain = None
        self.name = chain[-1][1].name
        self.last_run = {}

    @property
    def engines(self):
        """The K chain's engines by name (diagnostics: the GEMM engine's ``last_run``)."""
        return dict(self.chain)

    def gradient_chain(self):
        if self._gradient_chain is None:
            self._gradient_chain = self._gradient_factory()
        return self._gradient_chain

    def solve(self, ds1, ds2, pair_arr, args, *, nodal=False, plan=None, progress=None):
        """Every pair of ``pair_arr`` solved (``plan``: with its raw derivatives) as one :class:`Solved`;
        ``progress`` (graphkern._progress.Progress) counts the pairs as each launch returns."""
        chain = self.chain if plan is None else self.gradient_chain()
        m = len(pair_arr)
        if m == 0 or len(chain) == 1:
            name, engine = chain[0]
            self.last_run = {name: m}
            return _run(engine, ds1, ds2, pair_arr, args, nodal, plan, progress)
        # per engine: a bool per pair, or True / False for every pair
        masks = [_collapsed(engine.accepts(ds1, ds2, pair_arr, args, gradient=plan)) for _, engine in chain[:-1]]
        masks.append(True)
        first = next(k for k, mask in enumerate(masks) if not isinstance(mask, (bool, np.bool_)) or mask)
        if masks[first] is True or masks[first] is np.True_:  # one engine takes every pair
            owner = None
        else:
            owner = np.full(m, len(chain) - 1, dtype=np.int8)
            for k in range(len(chain) - 2, first - 1, -1):
                if not isinstance(masks[k], (bool, np.bool_)):
                    owner[masks[k]] = k
                elif masks[k]:
                    owner[:] = k
        parts = []
        for k, (name, engine) in enumerate(chain):
            if owner is None:  # every pair (no index list unless some come back declined)
                if k != first:
                    continue
                idx, pairs = None, pair_arr
            else:
                idx = np.flatnonzero(owner == k)
                if not len(idx):
                    continue
                pairs = pair_arr[idx]
            sol = _run(engine, ds1, ds2, pairs, args, nodal, plan, progress)
            if sol.declined is not None and len(sol.declined):
                if owner is None:
                    owner = np.full(m, k, dtype=np.int8)
                    idx = np.arange(m)
                declined = idx[sol.declined]
                for later in range(k + 1, len(chain)):
                    mask = masks[later]  # bool per pair, or one bool for all
                    takes = np.full(len(declined), bool(mask)) if isinstance(mask, (bool, np.bool_)) else mask[declined]
                    owner[declined[takes]] = later
                    declined = declined[~takes]
                kept = np.ones(len(idx), dtype=bool)
                kept[sol.declined] = False
                idx, sol = idx[kept], _subset(sol, kept)
            if idx is None or len(idx):
                parts.append((name, idx, sol))
        self.last_run = {name: m if idx is None else len(idx) for name, idx, _ in parts}
        return merge_parts(parts, m, nodal, plan)


class DeviceRouter:
    """Runs a call's pairs on several GPUs (module docstring).

    ``routers``: one single-GPU :class:`Router` per device; ``tiled``: the tiled engine over every
    device.  ``last_run``: the pairs each solver ran in the last :meth:`solve`, summed over the
    devices; ``device_runs``: per device, (ordinal, pairs, kernel seconds, wall seconds) of its share.
    """

    name = "gpu"

    def __init__(self, ordinals, routers, tiled):
        self.ordinals = list(ordinals)
        self.routers = routers
        self.tiled = tiled
        self.last_run = {}
        self.device_runs = []

    @property
    def chain(self):
        return self.routers[0].chain

    @property
    def engines(self):
        return {**self.routers[0].engines, "tiled": self.tiled}

    def gradient_chain(self):
        return self.routers[0].gradient_chain()

    def solve(self, ds1, ds2, pair_arr, args, *, nodal=False, plan=None, progress=None):
        m = len(pair_arr)
        lead = self.chain if plan is None else self.gradient_chain()
        # gradients: every pair to the devices' own chains (their last solver runs on one GPU)
        whole, idx, rest = True, None, ()
        if plan is None:  # the pairs no solver but the last (tiled) takes go to the shared-queue tiled engine
            small = np.zeros(m, dtype=bool)
            for _, engine in lead[:-1]:
                small |= engine.accepts(ds1, ds2, pair_arr, args, gradient=plan)
            whole = bool(small.all())
            if not whole:
                idx, rest = np.flatnonzero(small), np.flatnonzero(~small)
        runs, totals = [], {}
        # every pair to the devices (the common case): each takes a contiguous run of pair_arr itself,
        # a view, and puts its answers at their places in the call's arrays from its own thread, while
        # the other devices still solve; a gather of tens of millions of pairs per device, and their
        # scatter back, would cost seconds beside the solves
        merged = Merged(m, nodal, plan, covered=whole)
        to_devices = m if whole else len(idx)
        if to_devices:
            shares = _balanced_shares(ds1, ds2, pair_arr if whole else pair_arr[idx], len(self.routers))

            def run(k):
                rt.get_device(self.ordinals[k]).activate()
                lo, hi = int(shares[k]), int(shares[k + 1])
                mine = slice(lo, hi) if whole else idx[lo:hi]
                t0 = time.perf_counter()
                sol = self.routers[k].solve(ds1, ds2, pair_arr[mine], args, nodal=nodal, plan=plan, progress=progress)
                wall = time.perf_counter() - t0
                if hi > lo:
                    merged.place(mine, sol)
                return hi - lo, sol.seconds, wall, dict(self.routers[k].last_run)

            with ThreadPoolExecutor(max_workers=len(self.routers)) as pool:
                for k, (count, solve_seconds, wall, last) in enumerate(pool.map(run, range(len(self.routers)))):
                    runs.append((self.ordinals[k], count, solve_seconds, wall))
                    for name, ran in last.items():
                        totals[name] = totals.get(name, 0) + ran
        seconds = max((r[2] for r in runs), default=0.0)
        if len(rest):
            sol = _run(self.tiled, ds1, ds2, pair_arr[rest], args, nodal, plan, progress)
            merged.place(rest, sol)
            totals["tiled"] = totals.get("tiled", 0) + len(rest)
            seconds += sol.seconds
        self.last_run, self.device_runs = totals, runs
        return dataclasses.replace(merged.solved(), seconds=seconds)


def _balanced_shares(ds1, ds2, pair_arr, parts):
    """Boundaries ``b`` (``parts + 1`` of them) cutting ``pair_arr`` (in its order) into ``parts``
    contiguous runs of about equal predicted solve cost (a pair's: the entry pairs of one
    product-graph XMV and its vertex pairs): run ``k`` is ``pair_arr[b[k]:b[k + 1]]``."""
    c1 = csr_data(ds1)
    c2 = c1 if ds2 is ds1 else csr_data(ds2)
    i64 = (lambda a: np.ascontiguousarray(a, dtype=np.int64))
    return pairs.balanced_cuts(i64(pair_arr), i64(c1.n_nodes), i64(c2.n_nodes), i64(c1.n_entries),
                               i64(c2.n_entries), parts)


def _collapsed(mask):
    """A per-pair mask that is all False or all True as that one bool (no per-pair routing then)."""
    if isinstance(mask, np.ndarray):
        if not mask.any():
            return False
        if mask.all():
            return True
    return mask


def _run(engine, ds1, ds2, pair_arr, args, nodal, plan, progress):
    """One engine over ``pair_arr``; where the engine names a ``progress_chunk`` and ``progress`` is
    given, in chunks of that many pairs (each pair's result does not depend on its chunk)."""
    chunk = getattr(engine, "progress_chunk", None)
    m = len(pair_arr)
    if progress is None or not chunk or m <= chunk:
        sol = _solve_one(engine, ds1, ds2, pair_arr, args, nodal, plan)
        if progress is not None:
            progress.update(m)
        return sol
    parts = []
    for lo in range(0, m, chunk):
        idx = np.arange(lo, min(lo + chunk, m))
        parts.append((engine.name, idx, _solve_one(engine, ds1, ds2, pair_arr[idx], args, nodal, plan)))
        progress.update(len(idx))
    return merge_parts(parts, m, nodal, plan)


def _solve_one(engine, ds1, ds2, pair_arr, args, nodal, plan):
    try:
        if plan is None:
            return engine.solve(ds1, ds2, pair_arr, args, nodal=nodal)
        return engine.solve_gradient(ds1, ds2, pair_arr, args, plan)
    except (CudaError, GraphTooLargeError) as exc:
        raise _with_pairs(exc, engine, pair_arr) from exc


def _with_pairs(exc, engine, pair_arr):
    """``exc`` (a driver error or GraphTooLargeError) again, naming the pairs of the failed launch;
    ``.pairs`` holds them (indices into X and Y)."""
    if getattr(exc, "pairs", None) is not None:
        return exc
    shown = ", ".join(f"({int(i)}, {int(j)})" for i, j in pair_arr[:4])
    what = (f"while the {type(engine).__name__} solved {len(pair_arr)} pairs of graphs (X index, Y index): "
            f"{shown}{', ...' if len(pair_arr) > 4 else ''}")
    if isinstance(exc, CudaError):
        out = CudaError(exc.name, f"{exc.message} ({what})" if exc.message else what, exc.code, exc.call)
    else:
        out = GraphTooLargeError(f"{exc} ({what})")
    out.pairs = np.array(pair_arr, copy=True)
    return out


def _subset(sol, kept):
    """The rows ``kept`` (bool) of a solver's answer."""
    pick = (lambda a: None if a is None else a[kept])
    nodal = None if sol.nodal is None else [b for b, k in zip(sol.nodal, kept.tolist()) if k]
    return Solved(K=sol.K[kept], iterations=sol.iterations[kept], residuals=sol.residuals[kept], nodal=nodal,
                  octile_pairs=pick(sol.octile_pairs), seconds=sol.seconds, gradient=pick(sol.gradient),
                  adjoint_iterations=pick(sol.adjoint_iterations))


def _one_gpu(devices, what):
    if len(devices) != 1:
        raise ValueError(f"device: {what} runs on one GPU; got {devices}")
    return devices[0]


def make_router(s, *, backend, devices, techniques, reorder, n_threads):
    """The solver chains of a call: ``backend`` "cpu" or "gpu" (then ``devices``, ``techniques``:
    see :class:`graphkern.mgk.MarginalizedGraphKernel`)."""
    if backend == "cpu":
        chain = [("cpu", CPUEngine(n_threads, s))]
        return Router(chain, lambda: chain)

    def core_chain():
        what = "the core solver (techniques='core', and every eval_gradient=True call)"
        return [("core", GPUEngine(_one_gpu(devices, what), s))]

    if techniques == CSR_TECHNIQUE:
        dev = _one_gpu(devices, "the CSR solver (techniques='csr')")
        chain = [("csr", CSRGPUEngine(dev, s))] + core_chain()
        return Router(chain, lambda: chain)
    if techniques == GEMM_TECHNIQUE:
        dev = _one_gpu(devices, "the GEMM solver (techniques='gemm')")
        chain = [("gemm", GEMMGPUEngine(dev, s)), ("csr", CSRGPUEngine(dev, s))] + core_chain()
        return Router(chain, lambda: chain)
    tech = resolve_techniques(techniques)
    if tech is None:  # "core"
        chain = core_chain()
        return Router(chain, lambda: chain)
    if techniques in (None, "auto") and len(devices) > 1:
        routers = [make_router(s, backend=backend, devices=[d], techniques=techniques, reorder=reorder,
                               n_threads=n_threads) for d in devices]
        return DeviceRouter(devices, routers, TiledGPUEngine(devices, s, tech, reorder, n_threads))
    tiled = ("tiled", TiledGPUEngine(devices, s, tech, reorder, n_threads))
    if techniques in (None, "auto") and len(devices) == 1:
        gemm = ("gemm", GEMMGPUEngine(devices[0], s, by_cost=True))
        csr = ("csr", CSRGPUEngine(devices[0], s))
        return Router([gemm, csr, tiled],
                      lambda: ([gemm] if s["gemm_gradients"] else []) + [csr] + core_chain())
    return Router([tiled], core_chain)
