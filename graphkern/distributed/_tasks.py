"""What runs on a worker: one tile of the Gram matrix, one diagonal run, one tile's normalization.

Each worker thread builds its kernel once per ``gram`` call (from the class and its parameters,
which pickle whatever the kernel's caches hold) and keeps it while tiles of that call arrive, so
the kernel's caches (packed graphs, device copies, shortest paths) serve every tile that
shares a block of rows or columns.  The graphs arrive once per worker (scattered by the caller).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import numpy as np

from graphkern.distributed._ship import unpack

# tile states in the Zarr marker array
MISSING, RAW, NORMALIZED = 0, 1, 2

_KERNELS = OrderedDict()  # (call token, thread id) -> kernel
_KERNELS_KEPT = 8
_GRAPHS = OrderedDict()  # (call token, "X" or "Y") -> the call's graphs, unpacked once
_GRAPHS_KEPT = 4
_LOCK = threading.Lock()


def _kept(cache, limit, key, make):
    """``cache[key]``, made by ``make()`` on first use; the oldest entries beyond ``limit`` go."""
    with _LOCK:
        value = cache.get(key)
        if value is None:
            value = cache[key] = make()
            while len(cache) > limit:
                cache.popitem(last=False)
        return value


def _kernel(job):
    token, cls, params = job
    return _kept(_KERNELS, _KERNELS_KEPT, (token, threading.get_ident()), lambda: cls(**params))


def forget(token):
    """Drop the kernels of call ``token`` (their packed graphs and device memory) and its graphs
    from this worker."""
    with _LOCK:
        for cache in (_KERNELS, _GRAPHS):
            for key in [k for k in cache if k[0] == token]:
                del cache[key]


def shipped(job, name, blob):
    """The graphs ``blob`` (as :func:`graphkern.distributed._ship.pack` wrote them), rebuilt once
    per worker process and call and kept while its tiles arrive; None stays None."""
    return None if blob is None else _kept(_GRAPHS, _GRAPHS_KEPT, (job[0], name), lambda: unpack(blob))


def compute_tile(job, X, Y, tile, sink):
    """``(K, span, solve)``: the raw kernel values of ``tile`` (None when written to ``sink``),
    ``((process id, thread id), start, end)`` of the work on this worker thread, wall-clock
    seconds, so the caller can tell idle time between tiles from a result's trip to it, and the
    seconds of that span the kernel's solvers ran (its ``info_.solve_seconds``; NaN for a kernel
    that does not record them): the rest is the tile's host work."""
    kernel = _kernel(job)
    X, Y = shipped(job, "X", X), shipped(job, "Y", Y)
    start = time.time()
    if Y is None and tile.ti == tile.tj:
        K = kernel(X[tile.i0:tile.i1])
    else:
        K = kernel(X[tile.i0:tile.i1], (X if Y is None else Y)[tile.j0:tile.j1])
    K = np.asarray(K)
    if sink is not None:
        sink.write(tile, K, RAW)
        K = None
    span = ((os.getpid(), threading.get_ident()), start, time.time())
    return K, span, getattr(getattr(kernel, "info_", None), "solve_seconds", np.nan)


def compute_diag(job, name, graphs, lo, hi):
    """``kernel.diag`` of ``graphs[lo:hi]`` (the call's graphs ``name``, as :func:`shipped` takes them)."""
    return np.asarray(_kernel(job).diag(shipped(job, name, graphs)[lo:hi]), dtype=np.float64)


def normalized(K, dx, dy, dtype):
    """``K_ij / sqrt(dx_i dy_j)`` in float64, 0 where the product is 0, cast to ``dtype``: the
    arithmetic of both kernels' ``normalize=True``."""
    scale = np.sqrt(np.outer(dx, dy))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(scale > 0, K / np.where(scale > 0, scale, 1.0), 0.0)
    return out.astype(dtype, copy=False)


def normalize_tile(sink, tile, dx, dy, dtype):
    """Rewrite a raw tile of ``sink`` normalized by the diagonals ``dx`` (its rows) and ``dy``."""
    sink.write(tile, normalized(sink.read(tile), dx, dy, dtype), NORMALIZED)


class ZarrSink:
    """The Zarr group of a result: ``K`` (the matrix, chunked ``chunk x chunk``), ``tiles`` (one
    state per tile: MISSING, RAW, NORMALIZED), and ``diag_x``/``diag_y`` for ``normalize``.

    It pickles as its store, so workers write their tiles straight to shared storage.  A tile's
    marker is written after its data: a tile cut short by a lost worker stays MISSING.
    """

    def __init__(self, store):
        self.store = store
        self._group = None

    def __getstate__(self):
        return {"store": self.store, "_group": None}

    @property
    def group(self):
        if self._group is None:
            import zarr
            self._group = zarr.open_group(self.store, mode="r+")
        return self._group

    def read(self, tile):
        return self.group["K"][tile.i0:tile.i1, tile.j0:tile.j1]

    def write(self, tile, K, state):
        arr = self.group["K"]
        arr[tile.i0:tile.i1, tile.j0:tile.j1] = K
        if tile.mirror:
            arr[tile.j0:tile.j1, tile.i0:tile.i1] = K.T
        self.group["tiles"][tile.ti, tile.tj] = state
