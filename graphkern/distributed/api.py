"""``gram``: a Gram matrix computed tile by tile on a Dask cluster, into NumPy or Zarr."""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import time
import uuid

import numpy as np

from graphkern._backend import resolve_dtype, resolve_threads
from graphkern._progress import Progress
from graphkern.distributed._cluster import environ_kept, local_cluster, visible_gpus
from graphkern.distributed._plan import Plan, default_tile, graph_weights
from graphkern.distributed._ship import pack
from graphkern.distributed._tasks import (MISSING, NORMALIZED, RAW, ZarrSink, compute_diag, compute_tile, forget,
                                          normalize_tile, normalized)
from graphkern.convert import as_graphs
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.spgk import ShortestPathKernel

# tasks kept submitted per worker: enough to keep each busy, few enough for 10^5 tiles
_IN_FLIGHT_PER_WORKER = 4
_RECORD = "graphkern_gram"


def gram(kernel, X, Y=None, *, client=None, out=None, tile=None, resume=True, verbose=False, retries=2):
    """The Gram matrix ``kernel(X, Y)`` computed tile by tile on the workers of a Dask cluster.

    Parameters
    ----------
    kernel : MarginalizedGraphKernel or ShortestPathKernel
        Each worker runs a copy on its first visible GPU (``device`` is not used: give every
        worker its own GPU, as dask-cuda does) or, without one, on its CPU threads.
        ``normalize=True`` is done as a second pass: raw tiles first, then each divided by
        ``sqrt(K_ii K_jj)`` from the diagonal.
    X, Y : lists of graphkern.Graph
        ``Y=None``: the symmetric ``K(X, X)``, each off-diagonal tile computed once and mirrored.
    client : distributed.Client or None
        None: a local cluster for the call, one worker per visible GPU (dask-cuda's
        LocalCUDACluster if installed), else one CPU worker.
    out : None, a path or a Zarr store
        None: return a NumPy array.  Otherwise a Zarr group there holds ``K`` (the matrix,
        chunked ``tile x tile``), ``tiles`` (the state of each tile: 0 missing, 1 computed,
        2 normalized) and the plan in its attributes; ``K`` (a ``zarr.Array``) is returned.
        Workers write their tiles to the store themselves, so it must be storage they share
        (an in-memory store is written by the caller instead).
    tile : int or None
        Edge of a Zarr chunk in graphs.  Tiles are whole chunks, joined where graphs are lighter
        than average so that every tile has about the same predicted cost.  None: about four
        tiles per worker, within 32-2048 graphs.
    resume : bool
        With ``out``, keep the tiles a previous run of the same computation wrote and compute only
        the others (``False``: start afresh).  A different computation in ``out`` is an error.
    verbose : bool or callable
        Progress in tiles (graphkern._progress.Progress); the Dask dashboard shows the tasks too.
    retries : int
        Times a tile whose task raised is run again (a tile lost with its worker is rerun by Dask).

    The values equal the single-process kernel's bit for bit where its ``normalize`` is off
    (each pair is computed on its own) and with ``normalize`` in float64; in float32 the
    normalized values come from the float32 raw values, within a float32 rounding of the
    single-process ones.
    """
    return _gram(kernel, X, Y, client=client, out=out, tile=tile, resume=resume, verbose=verbose,
                 retries=retries)[0]


@environ_kept()  # a nanny restarting a lost worker sets thread limits in this process
def _gram(kernel, X, Y=None, *, client=None, out=None, tile=None, resume=True, verbose=False, retries=2):
    """``gram`` and a dict of what the run did (tiles, pairs, seconds, per-tile kernel seconds)."""
    kind, dtype = _kind(kernel)
    X = as_graphs(X, "X")
    Y = None if Y is None else as_graphs(Y, "Y")
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1):
        raise ValueError(f"tile must be a positive int or None, got {tile!r}")
    if not isinstance(resume, (bool, np.bool_)):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if isinstance(retries, bool) or not isinstance(retries, (int, np.integer)) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    params = {name: copy.deepcopy(value) for name, value in kernel.get_params(deep=False).items()}
    params.update(normalize=False, device=None)
    job = (uuid.uuid4().hex, type(kernel), params)

    try:
        from distributed import Client
    except ImportError as exc:
        raise ImportError(f"graphkern.distributed needs dask.distributed ({exc}): "
                          "pip install 'graphkern[distributed]'") from None
    own = None
    if client is None:
        cluster = local_cluster(visible_gpus() if params["backend"] != "cpu" else [],
                                resolve_threads(params["n_threads"]))
        own = (cluster, Client(cluster))
        client = own[1]
    try:
        n_workers = max(1, len(client.scheduler_info()["workers"]))
        symmetric = Y is None
        wx = graph_weights(kind, X)
        wy = wx if symmetric else graph_weights(kind, Y)
        chunk = int(tile) if tile is not None else default_tile(len(X), len(wy), n_workers, symmetric)
        plan = Plan.make(wx, wy, chunk, symmetric)
        record = {"plan": plan.record(), "kernel": repr(kernel), "dtype": dtype.str,
                  "normalize": bool(kernel.normalize)}
        sink, remote = _open_output(out, plan, dtype, record, resume)
        run = _Run(client, n_workers, job, retries, verbose, _label_columns(kernel))
        run.raw_tiles(plan, ZarrSink(sink.store) if remote else None, sink, X, Y, (wx, wy))
        if kernel.normalize:
            run.normalize(plan, sink, remote, X, Y, dtype)
        return sink.result(), run.stats
    finally:
        if own is not None:
            own[1].close()
            own[0].close()
        elif client.status == "running":
            client.run(forget, job[0], on_error="ignore")  # a long-lived cluster keeps no finished call's kernels


def _kind(kernel):
    if isinstance(kernel, MarginalizedGraphKernel):
        return "mgk", resolve_dtype(kernel.dtype)
    if isinstance(kernel, ShortestPathKernel):
        return "spgk", np.dtype(np.float64)
    raise TypeError(f"kernel must be a MarginalizedGraphKernel or a ShortestPathKernel, got {type(kernel).__name__}")


def _label_columns(kernel):
    """``(node columns, edge columns)``: the label columns the workers' kernel reads, the only ones
    shipped; None (all of them) for a kernel that does not name them."""
    if isinstance(kernel, MarginalizedGraphKernel):
        return kernel.node_kernel.compile().columns, kernel.edge_kernel.compile().columns
    return None


class _Run:
    """Submits tasks with a bounded number in flight and gathers their results as they finish."""

    def __init__(self, client, n_workers, job, retries, verbose, labels=None):
        self.client = client
        self.job = job
        self.labels = labels
        self.retries = int(retries)
        self.verbose = verbose
        self.window = _IN_FLIGHT_PER_WORKER * n_workers
        self.stats = {"workers": n_workers, "tiles": 0, "pairs": 0, "tile_seconds": [], "solve_seconds": [],
                      "tile_spans": [], "seconds": 0.0}
        self._scattered = {}

    def graphs(self, name, graphs):
        """The graphs as one future held by every worker: shipped once per worker, not per task.

        They travel as one byte string of flat arrays (``_ship.pack``) with only the label columns
        the kernel reads: Dask would send a list of Graphs as one frame per NumPy array.  The key is
        unique to this call (``hash=False``): a content-hashed key shared with an earlier call on the
        same graphs could be released under this call's tiles ("lost dependencies").
        """
        if graphs is None:
            return None
        if name not in self._scattered:
            blob = pack(graphs, self.labels)
            self._scattered[name] = self.client.scatter([blob], broadcast=True, hash=False)[0]
        return self._scattered[name]

    def each(self, items, submit, on_result, desc):
        """``submit(item)`` for every item (at most ``window`` in flight); ``on_result(item, value)``."""
        from distributed import as_completed

        items = list(items)
        todo = iter(items)
        pending = {}
        done = as_completed()

        def fill():
            for item in itertools.islice(todo, max(0, self.window - len(pending))):
                fut = submit(item)
                pending[fut.key] = (fut, item)
                done.add(fut)

        try:
            with Progress(len(items), self.verbose, "tiles", desc) as bar:
                fill()
                for fut in done:
                    _, item = pending.pop(fut.key)
                    on_result(item, fut.result())
                    del fut
                    bar.update(1)
                    fill()
        except BaseException:
            self.client.cancel([f for f, _ in pending.values()])
            raise

    def raw_tiles(self, plan, remote_sink, sink, X, Y, weights):
        tiles = plan.by_cost([t for t in plan.tiles() if sink.states[t.ti, t.tj] == MISSING], *weights)
        Xf, Yf = self.graphs("X", X), self.graphs("Y", Y)
        t0 = time.perf_counter()

        def submit(t):
            return self.client.submit(compute_tile, self.job, Xf, Yf, t, remote_sink, pure=False,
                                      retries=self.retries, key=f"graphkern-tile-{self.job[0]}-{t.ti}-{t.tj}")

        def on_result(t, value):
            K, (worker, start, end), solve = value
            self.stats["tile_spans"].append((worker, start, end, time.time()))
            self.stats["solve_seconds"].append(solve)
            if K is None:
                sink.states[t.ti, t.tj] = RAW  # the worker wrote it
            else:
                sink.write(t, K, RAW)
            self.stats["tile_seconds"].append(end - start)
            self.stats["pairs"] += plan.pairs(t)

        self.each(tiles, submit, on_result, "gram")
        self.stats["tiles"] += len(tiles)
        self.stats["seconds"] += time.perf_counter() - t0

    def diagonal(self, plan, graphs, name):
        """``diag`` of ``graphs``, in runs of the plan's chunk, on the workers."""
        d = np.empty(len(graphs))
        runs = [(lo, min(lo + plan.chunk, len(graphs))) for lo in range(0, len(graphs), plan.chunk)]
        gf = self.graphs(name, graphs)

        def submit(r):
            return self.client.submit(compute_diag, self.job, name, gf, *r, pure=False, retries=self.retries,
                                      key=f"graphkern-diag-{self.job[0]}-{name}-{r[0]}")

        def on_result(r, value):
            d[r[0]:r[1]] = value

        self.each(runs, submit, on_result, f"diag {name}")
        return d

    def normalize(self, plan, sink, remote, X, Y, dtype):
        dx, dy = sink.diagonals()
        if dx is None:
            if plan.symmetric:
                dx = dy = np.concatenate([np.diag(sink.read(t)).astype(np.float64) for t in plan.tiles()
                                          if t.ti == t.tj] or [np.zeros(0)])
            else:
                dx, dy = self.diagonal(plan, X, "X"), self.diagonal(plan, Y, "Y")
            sink.save_diagonals(dx, dy)
        tiles = [t for t in plan.tiles() if sink.states[t.ti, t.tj] == RAW]
        if not remote:
            for t in tiles:
                sink.write(t, normalized(sink.read(t), dx[t.i0:t.i1], dy[t.j0:t.j1], dtype), NORMALIZED)
            return
        worker_sink = ZarrSink(sink.store)

        def submit(t):
            return self.client.submit(normalize_tile, worker_sink, t, dx[t.i0:t.i1], dy[t.j0:t.j1], dtype, pure=False,
                                      retries=self.retries, key=f"graphkern-normalize-{self.job[0]}-{t.ti}-{t.tj}")

        self.each(tiles, submit, lambda t, v: None, "normalize")


class _NumpySink:
    """The result in memory, written by the caller."""

    def __init__(self, plan, dtype):
        self.K = np.empty(plan.shape, dtype=dtype)
        self.states = np.zeros(plan.grid, dtype=np.uint8)
        self._diag = (None, None)

    def read(self, t):
        return self.K[t.i0:t.i1, t.j0:t.j1]

    def write(self, t, K, state):
        self.K[t.i0:t.i1, t.j0:t.j1] = K
        if t.mirror:
            self.K[t.j0:t.j1, t.i0:t.i1] = K.T
        self.states[t.ti, t.tj] = state

    def diagonals(self):
        return self._diag

    def save_diagonals(self, dx, dy):
        self._diag = (dx, dy)

    def result(self):
        return self.K


class _ZarrResult(ZarrSink):
    """The caller's side of a Zarr result: tile states read once, diagonals saved for a resumed run."""

    def __init__(self, store, states):
        super().__init__(store)
        self.states = states

    def write(self, t, K, state):
        super().write(t, K, state)
        self.states[t.ti, t.tj] = state

    def diagonals(self):
        if not self.group.attrs.get("diagonals_saved", False):
            return None, None
        return self.group["diag_x"][:], self.group["diag_y"][:]

    def save_diagonals(self, dx, dy):
        g = self.group
        for name, d in (("diag_x", dx), ("diag_y", dy)):
            g.create_array(name, shape=d.shape, chunks=(max(1, len(d)),), dtype=np.float64, overwrite=True)[:] = d
        g.attrs["diagonals_saved"] = True  # after the data: a run cut short before it recomputes them

    def result(self):
        return self.group["K"]


def _open_output(out, plan, dtype, record, resume):
    """``(sink, remote)``: where tiles go, and whether workers write them there themselves."""
    if out is None:
        return _NumpySink(plan, dtype), False
    try:
        import zarr
        from zarr.storage import MemoryStore
    except ImportError as exc:
        raise ImportError(f"out={out!r} needs zarr 3 ({exc}): pip install 'graphkern[distributed]' "
                          "(Python >= 3.11), or out=None for a NumPy result") from None

    store = os.fspath(out) if isinstance(out, os.PathLike) else out
    remote = not isinstance(store, MemoryStore)
    if resume:
        try:
            g = zarr.open_group(store, mode="r")
        except (FileNotFoundError, zarr.errors.GroupNotFoundError):
            g = None
        if g is not None and _RECORD in g.attrs:
            old = g.attrs[_RECORD]
            if old != record:
                diff = ", ".join(k for k in record if old.get(k) != record[k])
                raise ValueError(f"out={out!r} holds a Gram matrix of another computation (its {diff} differ); "
                                 "pass resume=False to overwrite it, or another out")
            return _ZarrResult(store, _read_states(g["tiles"])), remote
        if g is not None and len(list(g.keys())):
            raise ValueError(f"out={out!r} holds a Zarr group that is not a graphkern Gram matrix; "
                             "pass resume=False to overwrite it, or another out")
    g = zarr.open_group(store, mode="w")
    chunks = (max(1, min(plan.chunk, plan.shape[0])), max(1, min(plan.chunk, plan.shape[1])))
    g.create_array("K", shape=plan.shape, chunks=chunks, dtype=dtype, fill_value=np.nan)
    g.create_array("tiles", shape=plan.grid, chunks=(1, 1), dtype=np.uint8, fill_value=MISSING, compressors=None)
    g.attrs[_RECORD] = record
    return _ZarrResult(store, np.zeros(plan.grid, dtype=np.uint8)), remote


def _read_states(markers):
    """The tile states; a marker left unreadable by a process killed while writing it counts as missing."""
    try:
        return markers[:]
    except Exception:  # noqa: BLE001 - any decoding error of a torn one-byte chunk
        states = np.zeros(markers.shape, dtype=np.uint8)
        for ti, tj in np.ndindex(*markers.shape):
            with contextlib.suppress(Exception):
                states[ti, tj] = markers[ti, tj]
        return states
