"""The GPU driver of the similarity kernels (cuda_src/jaccard.cu): one graph's buffers and launches.

:class:`DeviceSimilarity` takes its decisions from :func:`~graphkern.similarity.plan.plan_similarity`
and only allocates, copies and launches; :func:`gpu_values` is the path of a user's call.
"""

from __future__ import annotations

import time

import numpy as np

from graphkern._cuda.csr_check import check_csr
from graphkern._progress import Progress
from graphkern.similarity.plan import (BLOCK, INDEX_PADDING, STAGED_VARIANTS, DeviceOptions, kernel, plan_similarity,
                                       window_rows_per_block)

# A user's call runs the entry-parallel variants in up to this many launches over consecutive
# rows, each at least this many bytes of output, and copies each piece out while later ones compute.
RESULT_PIECES = 8
PIECE_MIN_BYTES = 8 << 20
PIECE_VARIANTS = ("element", "binary", "warp")


class DeviceCSR:
    """A CSR uploaded as the similarity kernels read it (int64 row pointers, int32 columns padded
    to a multiple of INDEX_PADDING) and checked there by one launch of the shared CSR check
    (graphkern/_cuda/csr_check.py).

    :meth:`check` uploads ``pattern``'s arrays and the matrix's stored ``values`` (any dtype of
    1, 2, 4 or 8 bytes: the check compares them bit for bit; None where the caller found every
    value equal, finite and, with ``check_negative``, non-negative, so that only the pattern is
    left to check) and returns the kernel's flags: 0 when the CSR is canonical, finite,
    symmetric in pattern and values and, with ``check_negative``, free of negative values.
    :class:`DeviceSimilarity` then takes the arrays without copying them again.
    """

    def __init__(self, dev, pattern, stream=None):
        from graphkern._cuda import runtime as rt

        self.rt, self.dev, self.pattern = rt, dev, pattern
        self.stream = stream if stream is not None else rt.Stream(dev)
        nnz = pattern.nnz
        padded = nnz + (-nnz) % INDEX_PADDING
        self.nbytes = 8 * (pattern.n + 1) + 4 * padded
        rt.check_fits(dev, self.nbytes, f"a graph with {pattern.n} nodes and {nnz} stored entries")
        self.indptr = rt.alloc(dev, (pattern.n + 1,), np.int64)
        self.indices = rt.alloc(dev, (padded,), np.int32)
        if padded > nnz:  # never read as a column: the vector merge masks what lies past a row
            self.indices.view(4 * nnz, 4 * (padded - nnz)).zero(self.stream)

    def check(self, values, *, check_negative, times):
        """Upload, launch the check and return its flags (``times``: seconds of upload and
        validate_device, the check and its read-back)."""
        rt, p = self.rt, self.pattern
        t = time.perf_counter()
        # pinned chunks on several host threads: the driver's own staging of a pageable copy runs on
        # one thread, slower than the bus (docs/performance.md has the rates)
        rt.copy_from_pageable(self.indptr, p.indptr)
        rt.copy_from_pageable(self.indices, p.indices)
        return self._check(t, values, check_negative, times)

    def check_values(self, values, *, times):
        """The check of :meth:`check` with ``values``, on a pattern that is on the device already
        (an unweighted call that found its values unequal while the kernels ran)."""
        return self._check(time.perf_counter(), values, False, times)

    def _check(self, t, values, check_negative, times):
        rt, p, st = self.rt, self.pattern, self.stream
        raw = None
        if values is not None:
            raw = rt.alloc(self.dev, (values.size,), values.dtype)
            rt.copy_from_pageable(raw, values)
        st.synchronize()
        times["upload"] = times.get("upload", 0.0) + (t1 := time.perf_counter()) - t
        flags, _ = check_csr("jaccard", self.indptr, self.indices, n_cols=p.n, nnz=p.nnz, values=raw,
                             check_negative=check_negative, check_symmetry=True, stream=st)
        times["validate_device"] = times.get("validate_device", 0.0) + time.perf_counter() - t1
        return flags


def gpu_values(pattern, metric, self_loops, dtype, device, options, *, scale=0, n_threads=1, verbose=False,
               times=None, while_computing=None, csr=None):
    """The similarity of every stored entry of ``pattern`` on GPU ``device``, in ``dtype``.

    Returns ``(values, variant, plan)``: the host array (written by the download itself), the
    variant that ran and the plan's figures.  ``scale`` as in graphkern.similarity.cpu.cpu_values.
    ``times`` (a dict) receives the seconds of plan, upload, compute (host clock from the first
    launch to the stream's end) and download (what is left of it then: the pieces before the last
    are copied while later ones compute).  ``while_computing``: host work (a callable) run while
    the kernels run.  ``csr``: a :class:`DeviceCSR` of ``pattern`` already on the device.
    """
    from graphkern._cuda import runtime as rt

    times = {} if times is None else times
    out = np.empty(pattern.nnz, dtype=dtype)
    with Progress(3, verbose, "steps", "similarity (GPU)") as bar:
        if pattern.nnz == 0:
            if while_computing is not None:
                while_computing()
            bar.update(3)
            return out, "none", {}
        t = time.perf_counter()
        dev = rt.get_device(device)
        run = DeviceSimilarity(dev, pattern, metric=metric, self_loops=self_loops, dtype=dtype, options=options,
                               weight_scale=scale, n_threads=n_threads, csr=csr)
        times["plan"] = (t1 := time.perf_counter()) - t
        run.upload()
        run.stream.synchronize()
        times["upload"] = times.get("upload", 0.0) + (t2 := time.perf_counter()) - t1
        bar.update()
        done = run.compute(pieces=max(1, min(RESULT_PIECES, out.nbytes // PIECE_MIN_BYTES)))
        if while_computing is not None:
            while_computing()
        run.download(out, done[:-1])
        done[-1][2].synchronize()
        times["compute"] = (t3 := time.perf_counter()) - t2
        bar.update()
        run.download(out, done[-1:])
        times["download"] = time.perf_counter() - t3
        bar.update()
    plan = run.plan
    figures = dict(hubs=int(plan.hubs.size), hash_rows=int(plan.hash_rows.size), work_items=run.work_items,
                   device_bytes=int(plan.nbytes), rows_per_block=run.rows_per_block, group=plan.group)
    return out, run.variant, figures


class DeviceSimilarity:
    """One graph's CSR on a device and the buffers of one similarity computation on ``stream``.

    :func:`gpu_values` calls :meth:`upload`, :meth:`compute` (in pieces), :meth:`download`; the
    benchmark times :meth:`compute` alone (no host-device copies) and the three together.  The
    output is poisoned with NaN at allocation, so an entry no kernel writes shows.
    """

    def __init__(self, dev, pattern, *, metric, self_loops, dtype, variant="auto", stream=None, options=None,
                 weight_scale=0, n_threads=1, csr=None, **tuning):
        """``options``: a :class:`~graphkern.similarity.plan.DeviceOptions`, or its fields as
        keyword arguments (``variant`` and ``tuning``: hub_min_degree, hub_max_bytes,
        hash_min_degree, balanced_chunk, rows_per_block, pair_width), checked before the device
        is used.  ``weight_scale``: the weights are multiplied by 2^-weight_scale on upload.
        ``n_threads``: host threads of the planning pass.  ``csr``: a :class:`DeviceCSR` of
        ``pattern`` whose arrays (and stream) are used instead of new ones."""
        from graphkern._cuda import runtime as rt

        if options is None:
            options = DeviceOptions(variant=variant, **{k: v for k, v in tuning.items() if v is not None})
        elif tuning:
            raise TypeError("pass either options or its fields, not both")
        if pattern.nnz == 0:
            raise ValueError("DeviceSimilarity needs at least one stored entry")
        self.rt = rt
        self.dev = dev
        self.pattern = pattern
        self.options = options
        self.metric = int(metric)
        self.self_loops = bool(self_loops)
        self.dtype = np.dtype(dtype)
        self.weighted = pattern.weights is not None
        self.hash_min_degree = options.hash_min_degree
        self.plan = plan = plan_similarity(pattern, options, weighted=self.weighted, dtype=self.dtype,
                                           free_bytes=dev.memory_info()[0], n_threads=n_threads)
        n, nnz = pattern.n, pattern.nnz
        self.variant, self.group, self.shortrow_group = plan.variant, plan.group, plan.shortrow_group
        self.rows_per_block, self.pair_width = plan.rows_per_block, plan.pair_width
        self.balanced_chunk, self.group_items, self.n_tiles = plan.balanced_chunk, plan.group_items, plan.n_tiles
        self.hubs, self.hub_words = plan.hubs, -(-n // 32)
        self.hash_rows, self._hash_slots, self._hash_items = plan.hash_rows, plan.hash_slots, plan.hash_items
        sizes = plan.sizes
        self.csr = csr
        self.stream = csr.stream if csr is not None else stream if stream is not None else rt.Stream(dev)
        self.nbytes = plan.nbytes
        rt.check_fits(dev, self.nbytes - (csr.nbytes if csr is not None else 0),
                      f"{('weighted ' if self.weighted else '')}similarity ({self.variant} "
                      f"variant) of a graph with {n} nodes and {nnz} stored entries")

        def alloc(name, count, dt):
            return rt.alloc(dev, (count,), dt) if name in sizes else None

        if csr is None:
            csr = DeviceCSR(dev, pattern, self.stream)
        self.indptr, self.indices = csr.indptr, csr.indices
        self.weights = alloc("weights", nnz, self.dtype)
        self.out = alloc("out", nnz, self.dtype)
        self.deg = alloc("deg", n, np.int32)
        self.adj = alloc("adj", n, np.int32)
        self.wsum = alloc("wsum", n, self.dtype)
        self.selfw = alloc("selfw", n, self.dtype)
        self.rows = alloc("rows", nnz, np.int32)
        self.offsets = alloc("offsets", nnz + 1, np.int64)
        self.tile_sums = alloc("tile_sums", self.n_tiles, np.int64)
        self.group_entry = None  # sized by compute, once the device has the work line's length
        self.work_items = 0
        self._work_host = rt.PinnedBuffer(8).array(np.int64, (1,))
        self.inter = alloc("inter", nnz, self.dtype if self.weighted else np.int32)
        self.mirror_off = alloc("mirror_off", nnz, np.int32)
        self.hub_list = alloc("hub_list", self.hubs.size, np.int32)
        self.hub_slot = alloc("hub_slot", n, np.int32)
        self.bitmaps = alloc("bitmaps", self.hub_words * self.hubs.size, np.uint32)
        if self.bitmaps is not None:
            self.bitmaps.zero()  # once: each compute clears only the words it is about to set
        self.hash_list = alloc("hash_list", self.hash_rows.size, np.int32)
        self.hash_items = alloc("hash_items", self.hash_rows.size + 1, np.int64)
        self.hash_slots = alloc("hash_slots", self.hash_rows.size + 1, np.int64)
        self.hash_off = alloc("hash_off", n, np.int64)
        self.hash_keys = alloc("hash_keys", int(self._hash_slots[-1]), np.int32)
        if self.hash_off is not None:
            self.hash_off.memset32(0xFFFFFFFF)  # -1, no table; once: each compute writes the same rows' offsets
        self.out.memset32(0x7FC00000)  # NaN in float32, and a NaN pattern in float64

        self._host_weights = None
        if self.weighted:
            w = np.ldexp(pattern.weights, -weight_scale) if weight_scale else pattern.weights
            self._host_weights = w.astype(self.dtype, copy=False)
        precision = rt.precision(self.dtype)
        flavour = f"{'weight' if self.weighted else 'count'}_{precision}"
        self._fn = {name: kernel(dev, f"jaccard_{name}_{flavour}")
                    for name in ("element", "binary", "warp", "balanced", "finalize", "shortrow")}
        pair_kernel = "pair" if self.pair_width == 1 else f"pair_vec{self.pair_width}"
        self._fn["pair"] = kernel(dev, f"jaccard_{pair_kernel}_{flavour}")
        if self.variant in STAGED_VARIANTS:
            self._fn[self.variant] = kernel(dev, f"jaccard_{self.variant}_{flavour}")
        self._fn_vertex = (kernel(dev, f"jaccard_vertex_weights_{precision}") if self.weighted
                           else kernel(dev, "jaccard_vertex_counts"))
        self._fn_work = kernel(dev, "jaccard_balanced_work")
        self._fn_hub_bitmaps = kernel(dev, "jaccard_hub_bitmaps")
        self._fn_row_hashes = kernel(dev, "jaccard_row_hashes")
        self._fn_scan_sums = kernel(dev, "jaccard_scan_tile_sums")
        self._fn_scan_tiles = kernel(dev, "jaccard_scan_tiles")
        self._similarity = rt.layout(dev, "jaccard", f"similarity_{precision}")
        sms = dev.properties["multiprocessor_count"]
        self._balanced_grid = sms * max(1, self._fn["balanced"].max_active_blocks_per_sm(BLOCK, 0))
        if self.rows_per_block is None:  # "window": as many rows per block as fill one wave of blocks
            slots = sms * max(1, self._fn["window"].max_active_blocks_per_sm(BLOCK, 0))
            self.rows_per_block = window_rows_per_block(n, slots)

    def upload(self):
        """Copy the CSR (unless it came checked on the device) and weights to the device: the large
        arrays through pinned chunks (finished on return), the small ones on the stream.  Work
        already on the stream finishes first: the staged copies are not ordered with it."""
        rt = self.rt
        self.stream.synchronize()
        if self.csr is None:
            rt.copy_from_pageable(self.indptr, self.pattern.indptr)
            rt.copy_from_pageable(self.indices, self.pattern.indices)
        if self.weighted:
            rt.copy_from_pageable(self.weights, self._host_weights)
        if self.hub_list is not None:
            self.hub_list.copy_from_host(self.hubs, self.stream)
        if self.hash_list is not None:
            self.hash_list.copy_from_host(self.hash_rows, self.stream)
            self.hash_items.copy_from_host(self._hash_items, self.stream)
            self.hash_slots.copy_from_host(self._hash_slots, self.stream)

    def compute(self, pieces=1):
        """Enqueue every kernel of the chosen variant on the stream (no copies, no host waits).

        The hub and longrow variants' bitmaps and vertex-to-bitmap map, and longrow's hash tables,
        are built here, as part of the work.  Returns ``[(start, end, event), ...]``: once an
        event has passed, the entries before its ``end`` are final.  With ``pieces`` > 1 the
        entry-parallel variants (element, binary, warp) run in that many launches over
        consecutive rows, each followed by its event: a pair is computed by its upper entry,
        whose mirror lies in a later row, so every entry of a finished range of rows is final.
        The other variants are one piece.
        """
        done = []
        self._enqueue(max(1, int(pieces)), done)
        if not done:
            self._mark(done, self.pattern.nnz)
        return done

    def _mark(self, done, end):
        event = self.rt.Event(self.dev, timing=False)
        event.record(self.stream)
        done.append((done[-1][1] if done else 0, end, event))

    def _enqueue(self, pieces, done):
        rt, st, p = self.rt, self.stream, self.pattern
        n, nnz = p.n, p.nnz
        n32, nnz64 = np.int32(n), np.int64(nnz)
        if self.variant == "shortrow":
            g = self.shortrow_group
            rt.launch(self._fn["shortrow"], -(-n // (BLOCK // g)), BLOCK,
                      (self.indptr, self.indices, self.weights, n32, np.int32(self.metric),
                       np.int32(self.self_loops), self.out, np.int32(g)), stream=st)
            return
        common = self._common(nnz)
        if self.variant in ("pair",) + STAGED_VARIANTS and not self.weighted:  # one launch: it finds the vertex terms
            self._launch_pair(common)
            return
        if self.hub_slot is not None:
            self.hub_slot.memset32(0xFFFFFFFF, st)  # -1: no bitmap
            rt.launch(self._fn_hub_bitmaps, self.hubs.size, BLOCK,
                      (self.indptr, self.indices, self.hub_list, np.int64(self.hub_words), self.bitmaps,
                       self.hub_slot), stream=st)
        if self.hash_keys is not None:
            items = int(self._hash_items[-1])
            self.hash_keys.memset32(0xFFFFFFFF, st)  # kHashEmpty: row_hashes inserts into empty tables
            tables = rt.layout(self.dev, "jaccard", "row_tables").pack(
                rows=self.hash_list, items=self.hash_items, slots=self.hash_slots, n_rows=self.hash_rows.size,
                n_items=items, hash_off=self.hash_off, hash_keys=self.hash_keys)
            rt.launch(self._fn_row_hashes, -(-items // BLOCK), BLOCK, (self.indptr, self.indices, tables), stream=st)
        if self.weighted:
            rt.launch(self._fn_vertex, -(-n // (BLOCK // 32)), BLOCK,
                      (self.indptr, self.indices, self.weights, n32, np.int32(self.self_loops), self.wsum,
                       self.selfw), stream=st)
        else:
            rt.launch(self._fn_vertex, -(-n // BLOCK), BLOCK,
                      (self.indptr, self.indices, n32, np.int32(self.self_loops), self.deg, self.adj), stream=st)
        entry_grid = -(-nnz // BLOCK)
        if self.variant in PIECE_VARIANTS:
            warp = self.variant == "warp"
            per_block, group = (BLOCK // self.group, (np.int32(self.group),)) if warp else (BLOCK, ())
            targets = np.arange(1, pieces, dtype=np.int64) * nnz // pieces
            ends = np.unique(np.append(p.indptr[np.searchsorted(p.indptr, targets)], nnz))  # row starts
            start = 0
            for end in ends.tolist():
                if end > start:  # the launch's entries are [start, end): its `nnz` is their end
                    rt.launch(self._fn[self.variant], -(-(end - start) // per_block), BLOCK,
                              self._common(end) + group + (np.int64(start),), stream=st)
                    self._mark(done, end)
                start = end
        elif self.variant == "pair":
            self._launch_pair(common)
        else:
            long_owner = np.int32(self.variant == "longrow")
            self.inter.zero(st)
            if self.mirror_off is not None:
                self.mirror_off.memset32(0xFFFFFFFF, st)  # -1: not recorded, the finalize pass searches
            rt.launch(self._fn_work, self.n_tiles, BLOCK,
                      (self.indptr, self.indices, self.hub_slot, long_owner, n32, nnz64, self.rows, self.offsets,
                       self.tile_sums), stream=st)
            total = self.offsets.view(8 * nnz, 8, dtype=np.int64, shape=(1,))
            rt.launch(self._fn_scan_sums, 1, 1024, (self.tile_sums, np.int64(self.n_tiles), total), stream=st)
            self._size_groups(total)
            rt.launch(self._fn_scan_tiles, self.n_tiles, BLOCK,
                      (self.offsets, nnz64, self.tile_sums, np.int64(self.group_items), self.group_entry), stream=st)
            rt.launch(self._fn["balanced"], self._balanced_grid, BLOCK,
                      (self.indptr, self.indices, self.weights, self.rows, self.offsets, nnz64,
                       np.int32(self.balanced_chunk), self.group_entry, self.hub_slot, self.bitmaps,
                       np.int64(self.hub_words), self.hash_off, self.hash_keys, self.inter, self.mirror_off),
                      stream=st)
            rt.launch(self._fn["finalize"], entry_grid, BLOCK,
                      common + (self.rows, self.hub_slot, long_owner, self.inter, self.mirror_off), stream=st)

    def _common(self, nnz):
        """The Similarity argument every similarity kernel begins with (cuda_src/jaccard.cu), as a
        1-tuple: the CSR, the vertex terms and the output, over the stored entries below ``nnz``."""
        return (self._similarity.pack(indptr=self.indptr, idx=self.indices, w=self.weights, n=self.pattern.n, nnz=nnz,
                                      metric=self.metric, deg=self.deg, adj=self.adj, wsum=self.wsum, selfw=self.selfw,
                                      sign=1.0 if self.self_loops else -1.0, out=self.out),)

    def _size_groups(self, total):
        """Read the work line's length (``total``, on the stream) and make ``group_entry`` hold its
        groups: the device sums it in a fraction of the time a host pass over the entries takes."""
        st = self.stream
        total.copy_to_host(self._work_host, st)
        st.synchronize()
        self.work_items = int(self._work_host[0])
        n_groups = max(1, -(-self.work_items // self.group_items))
        if self.group_entry is None or self.group_entry.shape[0] < n_groups:
            self.rt.check_fits(self.dev, 8 * n_groups, f"the work line's {n_groups} groups of the {self.variant} "
                                                        "similarity variant")
            self.group_entry = self.rt.alloc(self.dev, (n_groups,), np.int64)

    def _launch_pair(self, common):
        rows = self.rows_per_block
        self.rt.launch(self._fn[self.variant], -(-self.pattern.n // rows), BLOCK,
                       common + (np.int32(self.self_loops), np.int32(rows)), stream=self.stream)

    def download(self, out, done=None):
        """Copy the result into the host array ``out`` (through pinned chunks on several host
        threads: see graphkern._cuda.runtime.copy_to_pageable): all of it after the stream's
        end, or with ``done`` (pieces that :meth:`compute` returned) each piece once its event
        has passed, while later pieces compute."""
        if done is None:
            self.stream.synchronize()
            done = [(0, out.size, None)]
        for start, end, event in done:
            if event is not None:
                event.synchronize()
            self.rt.copy_to_pageable(self.out, out[start:end], offset=start * out.itemsize)
        return out
