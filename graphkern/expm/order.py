"""The degree order of the GPU solver, built on the device: A' = P A P^T with the rows by decreasing
degree (ties in row order), dealt round robin to the devices' blocks, and each block's row pointers
and rowblock SpMV plan, from A's row pointers as uploaded (cuda_src/expm_order.cuh).

The host builds none of it.  Host passes at this point would run beside the staged copy of A's
entries, whose threads hold every core: a pass on all cores then waits for its slowest thread,
which waits for a core, and took 5 to 13 times its time alone (docs/performance.md).  The device
does it in a few milliseconds while the entries still cross the link.
"""

from __future__ import annotations

import numpy as np

from graphkern._cuda import runtime as rt
from graphkern.expm.lanczos import dealt_bounds
from graphkern.expm.plans import (BLOCK, INT32_POINTER_LIMIT, LONG_ROW, LONG_SEGMENT, ROWBLOCK_COST, SCAN_CHUNK,
                                  TASK_LONG, TASK_STREAM, TASK_WIDTH, WARP, kernel)

# Degrees below ORDER_BUCKETS are counted, a tile's counts in 16 KiB of shared memory, and longer rows
# ranked apart; at most ORDER_MAX_TILES tiles of at least ORDER_TILE_ROWS rows.
ORDER_BUCKETS = 4096
ORDER_TILE_ROWS = 4096
ORDER_MAX_TILES = 1024


class DeviceOrder:
    """A's degree order (the rows by decreasing degree, ties in row order, dealt round robin to
    ``parts`` blocks) on the device of ``upload`` (a graphkern.expm.device._SourceUpload: its row pointers are there, its
    entries may still be crossing), and
    block ``index`` of ``parts``: its ``nnz``, pointer type and row pointers from 0 (``indptr_dev``).

    ``order_dev`` and ``inverse_dev`` (int32, every vertex) stay on the device; the host reads
    ``order`` and ``inverse`` only when asked (a solve with its basis on the host).  ``reserve(nbytes,
    what)`` makes room on the device or raises.  The sort's scratch is kept until :meth:`release`,
    since freeing device memory waits for the copies in flight."""

    def __init__(self, upload, mat, parts, index, reserve):
        dev = self.dev = upload.dev
        self.n = n = mat.n
        self.bounds = dealt_bounds(n, parts)
        row0, row1 = int(self.bounds[index]), int(self.bounds[index + 1])
        buckets = int(min(mat.degree_stats()[1] + 1, ORDER_BUCKETS))
        tile_rows = max(ORDER_TILE_ROWS, -(-n // ORDER_MAX_TILES))
        tiles = max(1, -(-n // tile_rows))
        most_big = max(1, min(n, mat.nnz // buckets))
        chunks = max(1, -(-n // SCAN_CHUNK))
        reserve(4 * (tiles * buckets + 2 * buckets + 3 * n) + 8 * (most_big + chunks + n + 3),
                f"exp(beta A) x: A's degree order on device {dev.ordinal}")
        alloc = lambda count, dtype: rt.alloc(dev, max(int(count), 1), dtype)  # noqa: E731
        self.order_dev, self.inverse_dev = alloc(n, np.int32), alloc(n, np.int32)
        counts, totals, starts = alloc(tiles * buckets, np.int32), alloc(buckets, np.int32), alloc(buckets, np.int32)
        big_keys, n_big, new_degree = alloc(most_big, np.uint64), alloc(1, np.uint64), alloc(n, np.int32)
        sums, new_indptr = alloc(chunks + 1, np.int64), alloc(n + 1, np.int64)
        self._scratch = [counts, totals, starts, big_keys, n_big, new_degree, sums, new_indptr]
        # its own stream: the legacy stream's copies and kernels would wait for A's entries
        self.stream = stream = rt.Stream(dev)
        n_big.zero(stream)
        if n:
            n64 = np.int64(n)
            order = (rt.layout(dev, "expm", "degree_order").pack(
                indptr=upload.old_indptr, n=n, tile_rows=tile_rows, tiles=tiles, buckets=buckets, tile_counts=counts,
                totals=totals, starts=starts, big_keys=big_keys, n_big=n_big, parts=parts, per=n // parts,
                extra=n % parts, order=self.order_dev, inverse=self.inverse_dev, new_degree=new_degree),)
            self._launch("degree_order_count", tiles, BLOCK, order, 4 * buckets)
            self._launch("degree_order_tiles", -(-buckets // BLOCK), BLOCK, order)
            self._launch("degree_order_starts", 1, BLOCK, order)
            self._launch("degree_order_scatter", tiles, WARP, order, 4 * buckets)
            self._launch("degree_order_big", min(-(-most_big // BLOCK), 4 * dev.properties["multiprocessor_count"]),
                         BLOCK, order)
            self._launch("degree_order_chunk_sums", chunks, BLOCK, (new_degree, n64, sums))
            self._launch("scan_chunk_sums", 1, BLOCK, (sums, np.int64(chunks)))
            self._launch("degree_order_pointers", chunks, BLOCK, (new_degree, n64, sums, new_indptr))
        else:
            new_indptr.zero(stream)
        ends = np.empty(2, dtype=np.int64)
        new_indptr.copy_to_host(ends[:1], stream, offset=8 * row0)
        new_indptr.copy_to_host(ends[1:], stream, offset=8 * row1)
        stream.synchronize()
        self.nrows, self.nnz = row1 - row0, int(ends[1] - ends[0])
        self.ptr_type = np.int32 if self.nnz <= INT32_POINTER_LIMIT else np.int64
        self.pointer_name = "i32" if self.ptr_type == np.int32 else "i64"
        self.indptr_dev = rt.alloc(dev, self.nrows + 1, self.ptr_type)
        self._launch(f"degree_order_local_pointers_{self.pointer_name}", min(-(-(self.nrows + 1) // BLOCK),
                                                                             8 * dev.properties["multiprocessor_count"]),
                     BLOCK, (new_indptr, np.int64(row0), np.int64(self.nrows), self.indptr_dev))
        stream.synchronize()  # the legacy stream's kernels read what these wrote
        self._host = {}

    def _launch(self, name, grid, block, args, shared_mem=0):
        rt.launch(kernel(self.dev, name), int(grid), block, args, shared_mem, self.stream)

    def rowblock_plan(self, reserve):
        """This block's rowblock plan (graphkern.expm.plans.SpmvPlan's fields, the task table on the
        device), built from ``indptr_dev`` by the rules of graphkern._cpu.expm.rowblock_tasks."""
        chunks = max(1, -(-self.nrows // SCAN_CHUNK))
        sums = rt.alloc(self.dev, 3 * (chunks + 1), np.int64)
        rule = rt.layout(self.dev, "expm", "rowblock_rule").pack(
            nrows=self.nrows, cost=ROWBLOCK_COST, long_row=LONG_ROW, segment=LONG_SEGMENT, stream_kind=TASK_STREAM,
            long_kind=TASK_LONG)
        self._launch(f"rowblock_count_{self.pointer_name}", chunks, BLOCK, (self.indptr_dev, rule, np.int64(chunks),
                                                                            sums))
        for j in range(3):  # tasks, long rows, segments
            self._launch("scan_chunk_sums", 1, BLOCK, (sums.view(8 * j * (chunks + 1), 8 * (chunks + 1)),
                                                       np.int64(chunks)))
        totals = np.empty(3 * (chunks + 1), dtype=np.int64)
        sums.copy_to_host(totals, self.stream)
        self.stream.synchronize()
        n_tasks, n_long, n_segments = (int(totals[j * (chunks + 1) + chunks]) for j in range(3))
        reserve((n_tasks + 1) * TASK_WIDTH * 8, f"exp(beta A) x: the rowblock SpMV plan on device {self.dev.ordinal}")
        plan = _DevicePlanFields(rt.alloc(self.dev, (max(n_tasks, 1), TASK_WIDTH), np.int64), n_long, n_segments)
        if n_tasks:
            self._launch(f"rowblock_write_{self.pointer_name}", chunks, BLOCK, (self.indptr_dev, rule,
                                                                                np.int64(chunks), sums, plan.tasks))
        else:  # one empty block keeps the grid valid
            plan.tasks.zero(self.stream)
        self.stream.synchronize()
        return plan

    def local_indptr(self):
        """This block's row pointers from 0, on the host (plans other than rowblock)."""
        return self.indptr_dev.to_host()

    def _host_copy(self, name):
        array = self._host.get(name)
        if array is None:
            array = self._host[name] = np.empty(self.n, dtype=np.int32)
            getattr(self, f"{name}_dev").copy_to_host(array, self.stream)
            self.stream.synchronize()
        return array

    @property
    def order(self):
        """``order[i]``: the old id of new vertex i (host, copied once)."""
        return self._host_copy("order")

    @property
    def inverse(self):
        """``inverse[j]``: the new id of old vertex j (host, copied once)."""
        return self._host_copy("inverse")

    def release(self):
        """Free the sort's scratch (once the copies beside it have ended)."""
        self._scratch = []


class _DevicePlanFields:
    """A rowblock :class:`~graphkern.expm.plans.SpmvPlan` whose task table is on the device."""

    variant, kernel, threads_per_row, rowlist = "rowblock", "tasks", None, None

    def __init__(self, tasks, n_long, n_segments):
        self.tasks, self.n_long, self.n_segments = tasks, n_long, n_segments
