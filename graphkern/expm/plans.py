"""SpMV plans of the GPU Lanczos solver: which kernel runs one device's rows, and how those rows are
cut into tasks (kernels in ``cuda_src/expm.cu``; the variants, ``spmv=``, are described in
graphkern.expm.api, Backends).  :func:`choose_variant` and :func:`choose_reorder` make the "auto"
choices from the degree statistics; the measurements behind their thresholds are in
``docs/expm-tuning.md``.
"""

from __future__ import annotations

import numpy as np

from graphkern._backend import resolve_threads
from graphkern._cuda import runtime as rt

VARIANTS = ("scalar", "vector", "rowblock", "hybrid")
REORDERS = ("degree", "none")
# How several GPUs exchange their shares of each step (expm_multiply's ``exchange``): "store" needs
# peer access between every pair of at most MAX_ROW_PEERS + 1 devices.
EXCHANGES = ("auto", "store", "copy")
# How the task kernels' grids are sized: "tasks" (a block per task; the hardware hands the next task
# to whichever SM frees a slot) or "resident" (at most the resident blocks, each walking the task
# table with a stride).
TASK_GRIDS = ("tasks", "resident")
# The kernels' shapes and limits that planning holds (it runs, and is tested, without a device);
# cuda_src/expm.cu exports the same values, checked when it loads (:func:`kernel`).
BLOCK = 256
WARP = 32
STREAM_CAPACITY = 2048
STREAM_ROWS = 1023
TASK_WIDTH = 8
TASK_STREAM, TASK_THREAD_LIST, TASK_WARP_LIST, TASK_LONG = range(4)
# the update kernel's parameters for the other devices' rows (peer stores)
MAX_ROW_PEERS = 7
# rows per block of the degree order's scans
SCAN_CHUNK = BLOCK * 16
# Column indices and values are read as aligned quads: their device arrays are padded to a multiple of 4.
QUAD = 4
# Row-block construction: blocks target ROWBLOCK_COST nonzeros + rows; rows longer than LONG_ROW
# get blocks of their own, split into LONG_SEGMENT-nonzero segments.  With these values every other
# row block has at most STREAM_ROWS rows and fewer than STREAM_CAPACITY nonzeros (_rowblock_tasks).
ROWBLOCK_COST = STREAM_ROWS
LONG_ROW = STREAM_CAPACITY // 2
LONG_SEGMENT = 4096
# int32 row pointers while every index a kernel forms (pointer + a stride of up to LONG_SEGMENT) fits
INT32_POINTER_LIMIT = np.iinfo(np.int32).max - 2 * LONG_SEGMENT
# Hybrid split: rows of at most HYBRID_SHORT entries go one per thread, up to LONG_ROW one per warp.
HYBRID_SHORT = 16
HYBRID_ROWS_PER_WARP_BLOCK = 16
# spmv="auto": a thread per row on near-regular graphs of at most this degree (grids, road networks).
SCALAR_MAX_DEGREE = 8
# reorder="auto": relabel by decreasing degree from this many nonzeros, when the largest degree is at
# least REORDER_SKEW times the mean (below that the gain does not pay for building the order).
REORDER_MIN_NNZ = 1_000_000
REORDER_SKEW = 1000
# Gathers of x's first HOT_X_BYTES (by column) go through L1, the rest skip it (gather_x in
# cuda_src/expm.cu), in a degree-ordered matrix only, where those columns are the hubs'.
HOT_X_BYTES = 96 << 10
_ALL_COLUMNS = np.iinfo(np.int32).max
# hot_columns' second range when there is none (see gather_x)
_NO_SECOND_RANGE = np.uint32(1 << 31)


_PLANNED = {"block": BLOCK, "warp": WARP, "stream_capacity": STREAM_CAPACITY, "stream_rows": STREAM_ROWS,
            "task_width": TASK_WIDTH, "task_stream": TASK_STREAM, "task_thread_list": TASK_THREAD_LIST,
            "task_warp_list": TASK_WARP_LIST, "task_long": TASK_LONG, "max_row_peers": MAX_ROW_PEERS,
            "scan_chunk": SCAN_CHUNK}


def kernel(dev, name):
    """The kernel ``name`` of cuda_src/expm.cu on ``dev`` (the module's first load checks its exports
    against what the planning here holds)."""
    rt.exports(dev, "expm", agree=_PLANNED)
    return rt.kernel(dev, "expm", name)


def choose_variant(mat):
    """The SpMV variant for ``spmv="auto"`` from the degree statistics.

    Near-regular graphs of small degree (coefficient of variation <= 0.5, no row beyond
    SCALAR_MAX_DEGREE entries: grids, road networks) take a thread per row, which reads each row
    as one short contiguous run.  Everything else takes the nonzero-balanced row blocks, which stage short rows
    through shared memory and split long ones over several thread blocks (fastest or tied on the
    Barabasi-Albert, Delaunay and R-MAT graphs of the benchmark).
    """
    mean, dmax, cv = mat.degree_stats()
    if cv <= 0.5 and dmax <= SCALAR_MAX_DEGREE:
        return "scalar"
    return "rowblock"


def choose_reorder(mat):
    """The vertex order for ``reorder="auto"``: "degree" for large skewed graphs, else "none".

    On a power-law graph in random vertex order nearly every gather of x misses L1 and moves its
    own 32-byte L2 sector (R-MAT scale 22: 4.1 GB per SpMV against 0.6 GB of DRAM traffic).  Most
    nonzeros point at a few hubs; numbered first, the hubs' entries of x share a few cache lines
    that stay in L1 and L2.  Small graphs fit in L2 anyway, and near-regular ones gain nothing.
    The thresholds (REORDER_MIN_NNZ, REORDER_SKEW) come from the runs in docs/expm-tuning.md.
    """
    mean, dmax, _ = mat.degree_stats()
    return "degree" if mat.nnz >= REORDER_MIN_NNZ and dmax >= REORDER_SKEW * mean else "none"


def sub_warp_size(mean_degree):
    """Threads per row of the "vector" variant: the power of two nearest the mean degree on a log
    scale, 2..32.  Rounding up as often as down lets a typical row finish in one round of loads
    (Delaunay, mean degree 6: 8 lanes, one round for nearly every row, where 4 lanes took two
    dependent rounds); a grid (mean 4) keeps 4."""
    if mean_degree <= 2:
        return 2
    return int(min(WARP, 2 ** int(np.floor(np.log2(mean_degree) + 0.5))))


class SpmvPlan:
    """How one device's row block is cut into work (host arrays): the kernel and, for task-driven
    variants, the task table (TASK_WIDTH int64 per task) and row list."""

    def __init__(self, variant, indptr, mean_degree):
        self.variant = variant
        self.tasks = None
        self.rowlist = None
        self.n_segments = 0
        self.n_long = 0
        if variant == "scalar":
            self.kernel, self.threads_per_row = "scalar", 1
        elif variant == "vector":
            s = sub_warp_size(mean_degree)
            self.kernel, self.threads_per_row = f"vector{s}", s
        elif variant == "rowblock":
            self.kernel, self.threads_per_row = "tasks", None
            self.tasks = _rowblock_tasks(indptr, self)
        elif variant == "hybrid":
            self.kernel, self.threads_per_row = "tasks", None
            self.tasks, self.rowlist = _hybrid_tasks(indptr, self)
        else:  # pragma: no cover - validated by the caller
            raise ValueError(variant)


def _long_row_tasks(indptr, rows, plan):
    """LONG tasks for ``rows`` (each longer than LONG_ROW), LONG_SEGMENT nonzeros per segment."""
    rows = np.asarray(rows, dtype=np.int64)
    deg = (indptr[rows + 1] - indptr[rows]).astype(np.int64)
    n_seg = -(-deg // LONG_SEGMENT)
    total = int(n_seg.sum())
    owner = np.repeat(np.arange(len(rows)), n_seg)
    first_task = np.cumsum(n_seg) - n_seg
    seg_index = np.arange(total, dtype=np.int64) - first_task[owner]
    tasks = np.zeros((total, TASK_WIDTH), dtype=np.int64)
    e0 = indptr[rows].astype(np.int64)[owner] + seg_index * LONG_SEGMENT
    tasks[:, 0] = TASK_LONG
    tasks[:, 1] = rows[owner]
    tasks[:, 2] = e0
    tasks[:, 3] = np.minimum(e0 + LONG_SEGMENT, indptr[rows + 1].astype(np.int64)[owner])
    tasks[:, 4] = plan.n_segments + first_task[owner]
    tasks[:, 5] = seg_index
    tasks[:, 6] = n_seg[owner]
    tasks[:, 7] = plan.n_long + owner
    plan.n_segments += total
    plan.n_long += len(rows)
    return tasks


def _rowblock_tasks(indptr, plan):
    """Nonzero-balanced row blocks (graphkern._cpu.expm.rowblock_tasks, two parallel passes).

    A block is cut every ROWBLOCK_COST of ``nonzeros + rows`` and around every row longer than
    LONG_ROW.  A block then has cost below ROWBLOCK_COST + (its last row's degree) + 1, hence at
    most ROWBLOCK_COST rows (each row costs its degree + 1) and fewer than ROWBLOCK_COST + LONG_ROW
    + 1 = STREAM_CAPACITY nonzeros, so it is staged in shared memory; long rows get segment tasks
    in its place, so the tasks stay in row order.  Stream tasks carry their entry range, so the
    kernel needs no row pointer before its gathers.
    """
    from graphkern._cpu.expm import rowblock_tasks

    tasks, segments, longs = rowblock_tasks(np.ascontiguousarray(indptr), ROWBLOCK_COST, LONG_ROW, LONG_SEGMENT,
                                            TASK_STREAM, TASK_LONG, resolve_threads(None))
    plan.n_segments += segments
    plan.n_long += longs
    return tasks


def _hybrid_tasks(indptr, plan):
    """Rows split by degree with a stable partition (no sort): long rows first (segment tasks),
    then medium rows one warp each, then short rows one thread each."""
    deg = np.diff(indptr).astype(np.int64)
    short = np.flatnonzero(deg <= HYBRID_SHORT)
    medium = np.flatnonzero((deg > HYBRID_SHORT) & (deg <= LONG_ROW))
    long_rows = np.flatnonzero(deg > LONG_ROW)
    rowlist = np.concatenate([medium, short]).astype(np.int32)
    parts = [_long_row_tasks(indptr, long_rows, plan)] if len(long_rows) else []
    for kind, first, count, per_block in ((TASK_WARP_LIST, 0, len(medium), HYBRID_ROWS_PER_WARP_BLOCK),
                                          (TASK_THREAD_LIST, len(medium), len(short), BLOCK)):
        if count == 0:
            continue
        l0 = np.arange(first, first + count, per_block, dtype=np.int64)
        t = np.zeros((len(l0), TASK_WIDTH), dtype=np.int64)
        t[:, 0] = kind
        t[:, 1] = l0
        t[:, 2] = np.minimum(l0 + per_block, first + count)
        parts.append(t)
    if not parts:
        parts = [np.zeros((1, TASK_WIDTH), dtype=np.int64)]
    return np.concatenate(parts), (rowlist if len(rowlist) else np.zeros(1, dtype=np.int32))


def hot_columns(reorder, dtype, bounds=None):
    """The SpMV kernels' hot columns ``(len, start1)``: gathers of columns in [0, len) or [start1,
    start1 + len) use L1 (gather_x in cuda_src/expm.cu).  In A's own order every column; in a degree
    order the HOT_X_BYTES of x of the highest degrees.  ``bounds``: the devices' row blocks (None:
    one device).  Dealt round robin, each block starts with its share of the hubs, so on two devices
    the hot columns are the first HOT/2 of each block; with more, the kernel's two ranges cover the
    first two blocks (HOT/2 each) and the other blocks' hubs go through L2."""
    if reorder != "degree":
        return np.int32(_ALL_COLUMNS), _NO_SECOND_RANGE
    hot = HOT_X_BYTES // np.dtype(dtype).itemsize
    if bounds is None or len(bounds) < 3:  # one device
        return np.int32(hot), _NO_SECOND_RANGE
    return np.int32(hot // 2), np.uint32(bounds[1])
