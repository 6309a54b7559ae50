"""The device-resident operator of the GPU Lanczos solver: A's rows on a tuple of devices, their
SpMV plans and the work memory, kept between calls (why: graphkern.expm.api, Caching).

A :class:`Residency` (per device its :class:`DeviceRows` and per dtype its :class:`Workspace`) hangs
on the validated :class:`~graphkern.expm.lanczos.CsrMatrix` (``mat.gpu[(devices, reorder)]``), which
graphkern.expm caches per matrix content, and is reused by every later call.  A degree-ordered
operator (``reorder="degree"``) is its own residency: each device sorts A's rows by degree itself
(:class:`DeviceOrder`) while A's entries cross the link, then moves the nonzeros
(:meth:`DeviceRows._permuted`).  A residency is released with its CsrMatrix (the cache entry dropped
or ``clear_cache()``), when more than MAX_RESIDENT residencies exist (least recently used first), and
when an allocation made here would not fit (other residencies on that device first, least recently
used first; then this one's other dtypes and plans).  Callers serialise GPU solves (graphkern.expm
holds a lock), since a residency's work vectors serve one solve at a time.

Several devices: the rows of A are split into one contiguous block per device -- with the degree
order, the vertices dealt round robin by decreasing degree (DeviceOrder with parts = devices), so
that every block has the same mix of hubs and short rows; in A's order, blocks of about the same
``nonzeros + rows``.  With peer access between every pair of at most MAX_ROW_PEERS + 1 devices,
each device gets a per-row ``peer_mask`` of the other devices whose rows read that column, so that
the update kernel stores each new row only where it is read (see graphkern.expm.gpu).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from graphkern._backend import resolve_threads
from graphkern._cpu import expm as cpu
from graphkern._cuda import runtime as rt
from graphkern._cuda.csr_check import INDPTR, RANGE, check_csr
from graphkern.expm.lanczos import COLUMN_CHUNK
from graphkern.expm.order import DeviceOrder
from graphkern.expm.plans import BLOCK, INT32_POINTER_LIMIT, MAX_ROW_PEERS, QUAD, WARP, SpmvPlan, kernel

# Residencies (matrix x device tuple) kept at most; the least recently used goes first.
MAX_RESIDENT = 4
# the gate's two mapped words sit on cache lines of their own (the host writes one, the device the other)
GATE_LINE = 128

_stats = {"uploads": 0, "plans": 0, "upload_bytes": 0}


_stats_lock = threading.Lock()


def _count_upload(nbytes):
    """Count bytes that cross to a device (``upload_bytes`` in :func:`residency_info`)."""
    with _stats_lock:
        _stats["upload_bytes"] += int(nbytes)


def _to_device(dev, array):
    _count_upload(array.nbytes)
    return rt.to_device(dev, array)


def _padded(count):
    """Entries allocated for ``count`` quad-read entries: a multiple of QUAD, at least one quad."""
    return max(QUAD, -(-count // QUAD) * QUAD)


def _upload_padded(dev, array, dtype):
    """``array`` on ``dev`` in a buffer padded with zeros to :func:`_padded` entries."""
    count = len(array)
    buf = rt.alloc(dev, _padded(count), dtype)
    array = np.ascontiguousarray(array, dtype=dtype)
    _count_upload(array.nbytes)
    rt.copy_from_pageable(buf, array)
    tail = buf.nbytes - count * np.dtype(dtype).itemsize
    if tail:
        buf.view(buf.nbytes - tail, tail).zero()
    return buf


def _check_indices(mat, indptr, indices, nnz):
    """Where the check of A's column indices was left to the device (``mat.pending_check``), make it
    on the uploaded ``indptr`` and ``indices`` (graphkern._cuda.csr_check) before a kernel maps or
    gathers through them.  A problem found drops A's device copies and runs the host check, which
    raises naming the entry."""
    if mat.pending_check is None:
        return
    flags, first = check_csr("expm", indptr, indices, n_cols=mat.n, nnz=nnz)
    if flags & (INDPTR | RANGE):
        mat.gpu.clear()
        mat.require_checked()
        raise ValueError(f"A has a column index out of range (stored entry {first} of the rows on device "
                         f"{indptr.device.ordinal})")


def _buffers_nbytes(buffers):
    return sum(b.nbytes for b in buffers if b is not None)


class DevicePlan:
    """An :class:`SpmvPlan` on one device: the uploaded task table and row list, the long-row
    scratch, and per dtype the kernel and its grid."""

    def __init__(self, rows, plan):
        dev = rows.dev
        self.variant = plan.variant
        self.kernel = plan.kernel
        self.threads_per_row = plan.threads_per_row
        self.n_tasks = 0 if plan.tasks is None else plan.tasks.shape[0]
        self.tasks = _to_device(dev, plan.tasks) if isinstance(plan.tasks, np.ndarray) else plan.tasks
        self.rowlist = _to_device(dev, plan.rowlist) if plan.rowlist is not None else None
        self.seg_partials = rt.alloc(dev, max(plan.n_segments, 1), np.float64)
        self.seg_counters = rt.alloc(dev, max(plan.n_long, 1), np.uint32)
        self.seg_counters.zero()
        self.n_long = plan.n_long
        self.long_alpha = rt.alloc(dev, max(plan.n_long, 1), np.float64)
        self._launch = {}

    def launch_config(self, rows, dtype, weighted, task_grid="tasks"):
        """``(kernel, grid)`` of the SpMV for ``dtype``: for task tables a block per task or at most
        the resident blocks (``task_grid``, see TASK_GRIDS), a grid-stride grid of at most the
        resident blocks otherwise."""
        key = (np.dtype(dtype), weighted, task_grid)
        config = self._launch.get(key)
        if config is None:
            pn = "i32" if rows.ptr_type == np.int32 else "i64"
            fn = kernel(rows.dev, f"lanczos_spmv_{self.kernel}_{rt.precision(dtype)}_{'w' if weighted else 'u'}_{pn}")
            resident = max(1, fn.max_active_blocks_per_sm(BLOCK, 0)) * rows.dev.properties["multiprocessor_count"]
            if self.tasks is not None:
                grid = self.n_tasks if task_grid == "tasks" else min(self.n_tasks, resident)
            else:
                threads = max(1, rows.nrows) * self.threads_per_row
                grid = min(-(-threads // BLOCK), resident)
            config = self._launch[key] = (fn, int(grid))
        return config

    def nbytes(self):
        return _buffers_nbytes((self.tasks, self.rowlist, self.seg_partials, self.seg_counters, self.long_alpha))


class _SourceUpload:
    """A as given on one device, for the reordering (:meth:`DeviceRows._permuted`): its row pointers
    (int64, ``old_indptr``) and one array of its entries, ``source`` (``whole``).  The row pointers
    cross first, through the staging lanes (int32 ones widened on the device), so they are there
    when the constructor returns; the entries (most of the bytes) follow, with ``background`` on a
    worker thread (:meth:`wait` waits for them) while the calling thread drives the device's setup.
    A copy beside the lanes' one, on the calling thread, would share the link with them and end
    long after it."""

    def __init__(self, dev, residency, mat, source, background):
        ensure_free(dev, DeviceRows._permute_scratch(mat, source.dtype.itemsize), residency,
                    f"exp(beta A) x: A as given on device {dev.ordinal}, while it is reordered")
        self.dev = dev
        self.old_indptr = rt.alloc(dev, mat.n + 1, np.int64)
        self.whole = rt.alloc(dev, max(len(source), 1), source.dtype)
        indptr = np.ascontiguousarray(mat.indptr)
        _count_upload(indptr.nbytes + source.nbytes)
        self._pending = self._narrow = None
        if indptr.dtype == np.int64:
            rt.copy_from_pageable(self.old_indptr, indptr)
        else:  # int32 crosses (half the bytes) and is widened on the device
            self._narrow = rt.copy_from_pageable(rt.alloc(dev, len(indptr), np.int32), indptr)
            stream = rt.Stream(dev)
            rt.launch(kernel(dev, "widen_pointers"), -(-len(indptr) // BLOCK), BLOCK,
                      (self._narrow, np.int64(len(indptr)), self.old_indptr), stream=stream)
            stream.synchronize()
        if background:  # the worker's copy runs without the GIL once started: wait for that
            started = threading.Event()
            self._pending = copy_pool().submit(rt.copy_from_pageable, self.whole, source, started=started)
            while not started.wait(0.001) and not self._pending.done():
                pass
        else:
            rt.copy_from_pageable(self.whole, source)

    def wait(self):
        if self._pending is not None:
            self._pending.result()  # the worker's copies finished (synchronously) before the move's launch

    def release(self):
        """Free A as given on the device (once the move has read it)."""
        self.whole = self.old_indptr = self._narrow = None


class DeviceRows:
    """One device's row block of A, uploaded once: local row pointers (int32 where they fit),
    global column indices padded to quads, values per dtype, and SpMV plans per variant.

    With a :class:`DeviceOrder` the rows are those of the reordered A' = P A P^T: the host uploads
    A as it is (all of it, with the old row pointers; freed after), the device sorts the rows and a
    kernel moves each row to its new place, mapping column ids through ``inverse`` (and checking
    them).  The order and inverse stay on the device (``order_dev``, ``inverse_dev``) to permute x
    on entry and y on exit."""

    def __init__(self, residency, ordinal, index, mat, row0, row1, order=None, upload=None, variant=None):
        self.dev = rt.get_device(ordinal)
        self.ordinal, self.index = ordinal, index
        self.order = order
        self.row0, self.row1 = int(row0), int(row1)
        self.nrows = self.row1 - self.row0
        if order is None:
            self.e0 = int(mat.indptr[row0])
            self.nnz = int(mat.indptr[row1]) - self.e0
            self.ptr_type = np.int32 if self.nnz <= INT32_POINTER_LIMIT else np.int64
            need = (self.nrows + 1) * np.dtype(self.ptr_type).itemsize
        else:  # its row pointers and A as given are on the device already
            self.e0, self.nnz, self.ptr_type = None, order.nnz, order.ptr_type
            need = 0
        ensure_free(self.dev, need + _padded(self.nnz) * 4, residency,
                    f"exp(beta A) x: A's rows on device {ordinal} ({self.nrows} rows, {self.nnz} nonzeros)")
        self.order_dev = self.inverse_dev = None
        self._pending_move = None
        self.plans = {}
        if order is None:
            self.indptr = _to_device(self.dev, self.local_indptr(mat))
            self.indices = _upload_padded(self.dev, mat.indices[self.e0:self.e0 + self.nnz], np.int32)
            _check_indices(mat, self.indptr, self.indices, self.nnz)
        else:
            # A as given (most of the bytes) is on its way first; the order's arrays follow beside it
            self.indptr, self.order_dev, self.inverse_dev = order.indptr_dev, order.order_dev, order.inverse_dev
            self.indices = self._permuted(residency, mat, mat.indices, "idx", map_columns=True, upload=upload,
                                          background=True)
            if variant == "rowblock":  # planned on the device while A crosses
                self.plans[variant] = DevicePlan(self, order.rowblock_plan(reserver(self.dev, residency)))
                _stats["plans"] += 1
        self.values = {}
        self.peer_mask = None  # several devices: which rows each other device reads (Residency)
        residency.uploaded = True
        _stats["uploads"] += 1

    def local_indptr(self, mat):
        """This block's row pointers (host, from 0, in ``ptr_type``)."""
        if self.order is not None:
            return self.order.local_indptr()
        return cpu.rebased_indptr(np.ascontiguousarray(mat.indptr), self.row0, self.row1, self.e0,
                                  self.ptr_type == np.int64, resolve_threads(None))

    @staticmethod
    def _permute_scratch(mat, itemsize):
        """Device bytes held while a reordered array is built: A's row pointers and the whole array."""
        return 8 * (mat.n + 1) + mat.nnz * itemsize

    def _permuted(self, residency, mat, source, type_name, map_columns=False, upload=None, background=False):
        """This block's part of ``source`` (indices or values of A, host) in the reordered rows,
        built on the device into a quad-padded buffer from ``upload`` (a :class:`_SourceUpload` of
        ``source``; None: one is started here); the time goes to ``residency.reorder_seconds``.

        With ``background`` the move waits for :meth:`finish`, so that the host builds the SpMV
        plans while A crosses the link."""
        t0 = time.perf_counter()
        dtype = source.dtype
        out = rt.alloc(self.dev, _padded(self.nnz), dtype)
        tail = out.nbytes - self.nnz * dtype.itemsize
        if tail:
            out.view(out.nbytes - tail, tail).zero()
        if self.nrows:
            if upload is None:
                upload = _SourceUpload(self.dev, residency, mat, source, background)

            def move():
                t1 = time.perf_counter()
                upload.wait()
                pn = "i32" if self.ptr_type == np.int32 else "i64"
                fn = kernel(self.dev, f"lanczos_permute_rows_{type_name}_{pn}")
                resident = max(1, fn.max_active_blocks_per_sm(BLOCK, 0)) * self.dev.properties["multiprocessor_count"]
                grid = int(min(-(-self.nrows * WARP // BLOCK), resident))
                rows_order = self.order_dev.view(4 * self.row0, 4 * self.nrows, dtype=np.int32, shape=(self.nrows,))
                bad = None
                if map_columns:  # the move checks the column ids it maps (none found: all ones)
                    bad = rt.to_device(self.dev, np.full(1, -1, dtype=np.int64).view(np.uint64))
                move = rt.layout(self.dev, "expm", "row_move").pack(
                    old_indptr=upload.old_indptr, order=rows_order, new_indptr=self.indptr, nrows=self.nrows,
                    inverse=self.inverse_dev if map_columns else None, n_cols=mat.n, bad=bad)
                rt.launch(fn, grid, BLOCK, (move, upload.whole, out))
                self.dev.synchronize()  # before the scratch is freed (with this closure); also times the build
                if bad is not None:
                    first = int(bad.copy_to_host(np.empty(1, dtype=np.uint64))[0])
                    if first != np.iinfo(np.uint64).max:
                        mat.gpu.clear()
                        mat.require_checked()  # the host's check raises, naming the entry
                        raise ValueError(f"A has a column index out of range (stored entry {first} of the rows "
                                         f"on device {self.ordinal})")
                upload.release()
                if self.order is not None:
                    self.order.release()
                if background:  # run later, by finish(); else inside the time counted below
                    residency.reorder_seconds += time.perf_counter() - t1

            if background:
                self._pending_move = move
            else:
                move()
        residency.reorder_seconds += time.perf_counter() - t0
        return out

    def finish(self):
        """Complete a reordering left to the background by :meth:`_permuted` (nothing otherwise)."""
        move, self._pending_move = self._pending_move, None
        if move is not None:
            move()

    def values_for(self, residency, mat, dtype):
        """The values in ``dtype`` on this device (None when unweighted), uploaded on first use."""
        if not mat.weighted:
            return None
        dtype = np.dtype(dtype)
        buf = self.values.get(dtype)
        if buf is None:
            need = _padded(self.nnz) * dtype.itemsize
            if self.order is not None:
                need += self._permute_scratch(mat, dtype.itemsize)
            ensure_free(self.dev, need, residency, f"exp(beta A) x: A's {dtype.name} values on device {self.ordinal}")
            if self.order is None:
                buf = _upload_padded(self.dev, mat.values_as(dtype)[self.e0:self.e0 + self.nnz], dtype)
            else:
                buf = self._permuted(residency, mat, mat.values_as(dtype), rt.precision(dtype))
            self.values[dtype] = buf
            residency.uploaded = True
        return buf

    def plan_for(self, residency, mat, variant):
        plan = self.plans.get(variant)
        if plan is None:
            host_plan = SpmvPlan(variant, self.local_indptr(mat), mat.degree_stats()[0])
            size = sum(a.nbytes for a in (host_plan.tasks, host_plan.rowlist) if a is not None)
            ensure_free(self.dev, size + 8 * (host_plan.n_segments + 1) + 12 * (host_plan.n_long + 1), residency,
                         f"exp(beta A) x: the {variant} SpMV plan on device {self.ordinal}")
            plan = self.plans[variant] = DevicePlan(self, host_plan)
            residency.uploaded = True
            _stats["plans"] += 1
        return plan

    def nbytes(self):
        return (_buffers_nbytes((self.indptr, self.indices, self.order_dev, self.inverse_dev, self.peer_mask,
                                 *self.values.values()))
                + sum(p.nbytes() for p in self.plans.values()))


class Workspace:
    """One device's work memory for one dtype, kept between solves: the vector ring, the stored
    basis blocks, the start vector of the basis-free modes, reduction scratch, coefficients, the
    output rows, streams, events and pinned staging (the last two used on the lead device)."""

    def __init__(self, rows, dtype, n, n_dev):
        dev = self.dev = rows.dev
        self.dtype = np.dtype(dtype)
        self.n = n
        self.nrows, self.row0 = rows.nrows, rows.row0
        self.stream = rt.Stream(dev)
        self.copy_stream = None
        self.ring = []
        self.blocks = []
        self.columns = {}
        self.start = None
        self.partials = None
        self.counter = rt.alloc(dev, 1, np.uint32)
        self.counter.zero()
        self.cap = 0
        self.coef = self.g = self.table = None
        self.alpha_slots = rt.alloc(dev, n_dev, np.float64)
        self.beta_slots = rt.alloc(dev, n_dev, np.float64)
        self.index = rows.index
        self.alpha_out = self.alpha_slots.view(8 * rows.index, 8, dtype=np.float64, shape=(1,))
        self.beta_out = self.beta_slots.view(8 * rows.index, 8, dtype=np.float64, shape=(1,))
        self.alpha_peers = self.beta_peers = None  # this device's slot on the other devices (peer stores)
        self.n_peers = 0
        self.y = rt.alloc(dev, max(self.nrows, 1), np.float64)
        self.peak = rt.alloc(dev, 1, np.uint64)
        # the step gate (lanczos_gate): skip, in device memory, read by the step's kernels; stop_at
        # and ran in mapped host memory, written by the host and by the gate
        self.skip = rt.alloc(dev, 1, np.int32)
        self.skip.zero()
        gate = rt.PinnedBuffer(2 * GATE_LINE, mapped=True)
        self.gate_words = gate.array(np.int64)
        self.stop_at = np.uint64(gate.device_pointer(dev))
        self.ran = np.uint64(gate.device_pointer(dev) + GATE_LINE)
        self.gate_host = gate
        self.out = None  # view of ring[0] at this device's rows: the scaled output in dtype
        pinned = rt.PinnedBuffer(16)
        self.rscale_host = pinned.array(np.float64, (2,))[:1]
        self.peak_host = pinned.array(np.uint64, (2,))[1:]
        self.ev_alpha = rt.Event(dev, timing=False)   # this device's alpha share was sent
        self.ev_step = rt.Event(dev, timing=False)    # its beta share and rows of w_{k+1} were sent
        self.ev_vector = rt.Event(dev, timing=False)  # w_{k+1} is complete (host mode copy-out)
        self.copy_done = []                           # host mode: ring slot's copy-out finished
        self.timing_events = []                       # lead: (start, after SpMV, after update) per step
        self.staging = []                             # lead: two pinned check-point buffers
        self.staging_done = [rt.Event(dev, timing=False), rt.Event(dev, timing=False)]
        self.combine_events = (rt.Event(dev), rt.Event(dev))
        # (what they were packed from, the SpMV's and the update's share structs, empty row peers):
        # graphkern.expm.gpu._Share keeps them here between solves
        self.share_structs = None

    def ensure(self, residency, cap, grid, ring_size):
        """Grow what this solve needs: coefficients for ``cap`` steps, ``grid`` block partials,
        ``ring_size`` ring vectors."""
        isz = self.dtype.itemsize
        need = 0
        if cap > self.cap:
            need += 8 * (3 * cap + 1) + 16 * (cap + 1)
        if self.partials is None or self.partials.shape[0] < grid:
            need += 8 * grid
        need += max(0, ring_size - len(self.ring)) * self.n * isz
        if need:
            ensure_free(self.dev, need, residency, f"exp(beta A) x: {ring_size} work vectors of {self.n} on device "
                                                    f"{self.dev.ordinal}")
        if cap > self.cap:
            self.coef = rt.alloc(self.dev, 3 * cap + 1, np.float64)
            self.coef.zero()  # check points copy the whole array back, steps not taken yet included
            self.g = rt.alloc(self.dev, cap + 1, np.float64)
            self.table = rt.alloc(self.dev, cap + 1, np.uint64)
            self.staging = [rt.PinnedBuffer(8 * (3 * cap + 1)).array(np.float64, (3 * cap + 1,)) for _ in range(2)]
            self.cap = cap
        if self.partials is None or self.partials.shape[0] < grid:
            self.partials = rt.alloc(self.dev, grid, np.float64)
        while len(self.ring) < ring_size:
            self.ring.append(rt.alloc(self.dev, self.n, self.dtype))
        while len(self.copy_done) < ring_size:
            self.copy_done.append(rt.Event(self.dev, timing=False))
        if self.out is None and self.nrows:
            self.out = self.ring[0].view(self.row0 * isz, self.nrows * isz, dtype=self.dtype)
        return self

    def link_peers(self, workspaces):
        """Tables of the addresses of this device's alpha and beta slots on the other devices
        (``workspaces``: every device's, in device order), where the reductions store its shares."""
        others = [w for w in workspaces if w is not self]
        self.n_peers = len(others)
        for name, slots in (("alpha_peers", "alpha_slots"), ("beta_peers", "beta_slots")):
            table = np.array([getattr(w, slots).ptr + 8 * self.index for w in others], dtype=np.uint64)
            setattr(self, name, _to_device(self.dev, table))

    def column(self, j):
        """Stored basis column j (a view into its block)."""
        view = self.columns.get(j)
        if view is None:
            block, r = divmod(j, COLUMN_CHUNK)
            nbytes = self.n * self.dtype.itemsize
            view = self.columns[j] = self.blocks[block].view(r * nbytes, nbytes, dtype=self.dtype, shape=(self.n,))
        return view

    def timing(self, i):
        while len(self.timing_events) <= i:
            self.timing_events.append((rt.Event(self.dev), rt.Event(self.dev), rt.Event(self.dev)))
        return self.timing_events[i]

    def nbytes(self):
        return _buffers_nbytes((*self.ring, *self.blocks, self.start, self.partials, self.counter, self.coef, self.g,
                                self.table, self.alpha_slots, self.beta_slots, self.alpha_peers, self.beta_peers,
                                self.y, self.peak))


class Residency:
    """A (reordered or not) on a tuple of devices (one :class:`DeviceRows` each) and its workspaces
    per dtype.

    ``active`` is the (dtype, variant) of the solve using it (kept under memory pressure);
    ``uploaded`` says that host-to-device copies were issued since the last :meth:`settle`;
    ``reorder_seconds`` accumulates the time spent reordering until a solve takes it."""

    def __init__(self, mat, devices, reorder="none", variant=None):
        self.devices = tuple(devices)
        self.n = mat.n
        self.reorder = reorder
        self.active = None
        self.uploaded = False
        self.work = {}
        self.reorder_seconds = 0.0
        orders = uploads = (None,) * len(self.devices)
        if reorder == "degree":
            # A as given starts up to every device; each sorts its rows by degree once the row
            # pointers have landed, beside the entries' copy
            uploads = [_SourceUpload(rt.get_device(d), self, mat, mat.indices, True) for d in self.devices]
            t0 = time.perf_counter()
            orders = [DeviceOrder(u, mat, len(self.devices), i, reserver(u.dev, self)) for i, u in enumerate(uploads)]
            self.reorder_seconds += time.perf_counter() - t0
            bounds = orders[0].bounds
        else:
            bounds = mat.chunks(len(self.devices))
        self.order, self.bounds = orders[0], bounds
        self.rows = [DeviceRows(self, d, i, mat, bounds[i], bounds[i + 1], orders[i], uploads[i], variant)
                     for i, d in enumerate(self.devices)]
        self.peer_access = True  # between every pair of devices
        for a, b in itertools.permutations(self.rows, 2):
            if a.dev is b.dev:  # shares of one device reach each other's memory without peer access
                continue
            if a.dev.can_access_peer(b.dev):
                a.dev.enable_peer_access(b.dev)
            else:
                self.peer_access = False
        if 1 < len(self.rows) <= MAX_ROW_PEERS + 1 and self.peer_access:
            self._build_peer_masks()

    def _build_peer_masks(self):
        """Each device's ``peer_mask``: bit p of byte i is set when the p-th other device (in device
        order) has a row that reads column row0 + i, so that the peer-store exchange sends a device
        only the entries of the new vector its rows read.  On a power-law graph that is nearly every
        row; on a grid or mesh in its natural order, a boundary (3200 of the 5.1M rows of a 3200^2
        grid's half), which turns the exchange from n/2 values per device per step into almost none.
        The marks are made on the devices (one pass over the column indices), the masks on the host."""
        reads = []
        for r in self.rows:
            r.finish()
            ensure_free(r.dev, self.n + r.nrows, self, f"exp(beta A) x: the columns device {r.ordinal}'s rows read")
            marks = rt.alloc(r.dev, max(self.n, 1), np.uint8)
            marks.zero()
            if r.nnz:
                fn = kernel(r.dev, "lanczos_mark_columns")
                grid = int(min(-(-r.nnz // BLOCK), 4 * r.dev.properties["multiprocessor_count"]))
                rt.launch(fn, grid, BLOCK, (r.indices, np.int64(r.nnz), marks))
            reads.append(marks.to_host())  # the legacy stream: after the marks
            del marks
        for r in self.rows:
            others = [o for o in self.rows if o is not r]  # the order of GpuLanczos._step's row peers
            mask = np.zeros(r.nrows, dtype=np.uint8)
            for p, o in enumerate(others):
                mask |= (reads[o.index][r.row0:r.row1] != 0).astype(np.uint8) << np.uint8(p)
            if r.nrows:
                r.peer_mask = _to_device(r.dev, mask)

    def take_reorder_seconds(self):
        """Reordering time not yet reported by a solve (and reset it)."""
        seconds, self.reorder_seconds = self.reorder_seconds, 0.0
        return seconds

    def settle(self):
        """Wait for uploads: a pageable copy may still be in flight when it returns, and the solve's
        streams do not synchronise with the legacy stream that carried it."""
        for r in self.rows:
            r.finish()
        if self.uploaded:
            for r in self.rows:
                r.dev.synchronize()
            self.uploaded = False

    def workspaces(self, dtype):
        dtype = np.dtype(dtype)
        ws = self.work.get(dtype)
        if ws is None:
            ws = self.work[dtype] = [Workspace(r, dtype, self.n, len(self.rows)) for r in self.rows]
            if len(ws) > 1 and self.peer_access:
                for w in ws:
                    w.link_peers(ws)
                self.uploaded = True  # the tables' pageable copies: settle() before a kernel reads them
        return ws

    def trim(self):
        """Drop the workspaces, values and plans that the active solve does not use (memory pressure)."""
        if self.active is None:
            return
        dtype, variant = self.active
        for other in [d for d in self.work if d != np.dtype(dtype)]:
            del self.work[other]
        for w in self.work.get(np.dtype(dtype), ()):
            w.share_structs = None  # they hold the plans and values dropped below
        for r in self.rows:
            for other in [d for d in r.values if d != np.dtype(dtype)]:
                del r.values[other]
            for other in [v for v in r.plans if v != variant]:
                del r.plans[other]

    def nbytes(self):
        return (sum(r.nbytes() for r in self.rows)
                + sum(w.nbytes() for ws in self.work.values() for w in ws))


# Residencies by registration, least recently used first: key -> (weakref to the CsrMatrix, layout),
# where layout = (devices, reorder) is the residency's key in ``mat.gpu``.
_registry = OrderedDict()
_registry_lock = threading.RLock()


def residency(mat, devices, reorder="none", variant=None):
    """``(Residency, reused)`` of ``mat`` on ``devices`` in vertex order ``reorder``: the kept one,
    or a new one (uploading A; with ``variant``, its SpMV plans are built while A crosses)."""
    layout = (tuple(devices), reorder)
    res = mat.gpu.get(layout)
    key = (id(mat), layout)
    if res is not None:
        with _registry_lock:
            _registry[key] = (weakref.ref(mat), layout)  # a stale entry of a dead matrix with this id is replaced
            _registry.move_to_end(key)
        return res, True
    res = Residency(mat, layout[0], reorder, variant)
    mat.gpu[layout] = res
    with _registry_lock:
        _registry[key] = (weakref.ref(mat), layout)
        _registry.move_to_end(key)  # the newest, also where a dead matrix with this id left an entry
        _sweep()
        while len(_registry) > MAX_RESIDENT:
            _evict(next(iter(_registry)))
    return res, False


def _sweep():
    """Forget registry entries whose matrix or residency is gone."""
    for key in [k for k, (ref, layout) in _registry.items() if ref() is None or layout not in ref().gpu]:
        del _registry[key]


def _evict(key):
    ref, layout = _registry.pop(key)
    mat = ref()
    if mat is not None:
        mat.gpu.pop(layout, None)  # the device memory goes with the last reference


def make_room(dev, nbytes, keep):
    """Whether ``nbytes`` are free on ``dev``, after evicting other residencies there (least
    recently used first) and then ``keep``'s parts that its active solve does not use, while they
    are not."""
    if dev.memory_info()[0] >= nbytes:
        return True
    with _registry_lock:
        _sweep()
        for key in list(_registry):
            ref, layout = _registry[key]
            mat = ref()
            res = mat.gpu.get(layout) if mat is not None else None
            if res is None or res is keep or dev.ordinal not in layout[0]:
                continue
            _evict(key)
            if dev.memory_info()[0] >= nbytes:
                return True
    if keep is not None:
        keep.trim()
    return dev.memory_info()[0] >= nbytes


def ensure_free(dev, nbytes, keep, what):
    """Make ``nbytes`` free on ``dev`` (:func:`make_room`) or raise GraphTooLargeError naming ``what``."""
    if not make_room(dev, nbytes, keep):
        rt.check_fits(dev, nbytes, what)


def reserver(dev, keep):
    """``reserve(nbytes, what)``: :func:`ensure_free` on ``dev``, keeping the residency ``keep``."""
    return lambda nbytes, what: ensure_free(dev, nbytes, keep, what)


_pool = None
_pool_lock = threading.Lock()


def copy_pool():
    """Threads that copy the devices' parts of an output to the host side by side (GpuLanczos._copy_out), and A's background uploads."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_ROW_PEERS, thread_name_prefix="graphkern-expm-copy")
        return _pool


def release_all():
    """Drop every residency (graphkern.expm.clear_cache)."""
    with _registry_lock:
        for key in list(_registry):
            _evict(key)


def residency_info():
    """``resident`` residencies, their ``device_bytes``, and the ``uploads`` and ``plans`` made so far
    (and the ``upload_bytes`` that crossed to the devices for them)."""
    with _registry_lock:
        _sweep()
        alive = [ref().gpu[layout] for ref, layout in _registry.values()]
        return {"resident": len(alive), "device_bytes": sum(r.nbytes() for r in alive), **_stats}
