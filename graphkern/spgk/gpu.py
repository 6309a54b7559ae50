"""The GPU path of the pairwise shortest-path kernel (cuda_src/spgk.cu): device copies of batches,
the runner of the per-pair and batched methods, and the batched launch the hybrid shares."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from graphkern.spgk.batch import pair_work

GPU_METHODS = ("gpu_1d", "gpu_2d", "gpu_1d_overlap", "gpu_2d_overlap", "gpu_batched")
# the launch publishes its progress every this many pairs
PROGRESS_STRIDE = 32


_BLOCK = 256
_BLOCK_1D = 128
_BLOCK_2D = (32, 8)
_OVERLAP_STREAMS = 4
_DEFAULT_SHARED = 48 * 1024
_MAX_SHARED_V = 96 * 1024
# gpu_batched launch plans a runner keeps (a Gram matrix needs one, transform one)
_PLANS_KEPT = 2


class _DeviceBatch:
    """A batch's arrays on one device in one precision, uploaded once and kept by the batch."""

    def __init__(self, rt, dev, batch, dtype):
        # flat copies: the kernels index raw rows, and an empty (n, 0) array cannot be copied as bytes
        upload = lambda a, dt=None: rt.to_device(dev, np.ravel(np.ascontiguousarray(a, dtype=dt)))
        self.node_offsets = upload(batch.node_offsets)
        self.discrete = upload(batch.discrete)
        self.continuous = upload(batch.continuous, dtype)
        self.path_offsets = upload(batch.path_offsets)
        self.ends = upload(batch.ends)
        self.lengths = upload(batch.lengths)
        self.weights = upload(batch.weights, dtype)  # the vertex kernel's gamma per continuous dimension
        # the batched kernel's BatchArrays argument (cuda_src/spgk.cu)
        self.descriptor = rt.layout(dev, "spgk", "batch").pack(
            node_offsets=self.node_offsets, disc=self.discrete, cont=self.continuous, path_offsets=self.path_offsets,
            ends=self.ends, lengths=self.lengths)
        # the offsets the per-pair kernels' arguments are made of (not the batch, which holds this copy)
        self._rt, self._dev, self._offsets, self._graphs = rt, dev, (batch.node_offsets, batch.path_offsets), None

    def graphs(self):
        """Each graph's GraphPaths argument of the per-pair kernels (cuda_src/spgk.cu), made on first use."""
        if self._graphs is None:
            nodes, paths = self._offsets
            starts = paths[:-1].astype(np.uint64) * np.uint64(8)  # ends (int2) and lengths (double) alike
            self._graphs = self._rt.layout(self._dev, "spgk", "graph_paths").pack_rows(
                len(nodes) - 1, disc=self.discrete, cont=self.continuous, first=nodes[:-1], n=np.diff(nodes),
                ends=np.uint64(self.ends.ptr) + starts, lengths=np.uint64(self.lengths.ptr) + starts,
                P=np.diff(paths))
        return self._graphs

    @staticmethod
    def nbytes(batch, dtype):
        return (batch.node_offsets.nbytes + batch.discrete.nbytes + batch.continuous.size * dtype.itemsize
                + batch.path_offsets.nbytes + batch.ends.nbytes + batch.lengths.nbytes
                + batch.weights.size * dtype.itemsize)


class GpuRunner:
    """Runs the GPU methods on one device in one precision for one edge kernel; kept by the kernel
    object across calls (its functions and streams), while each batch keeps its own device copies."""

    def __init__(self, device, dtype, edge_kernel):
        from graphkern._cuda import runtime as rt

        self.rt = rt
        self.dev = rt.get_device(device)
        self.dtype = dtype
        self.scalar = dtype.type
        self.edge = edge_kernel
        suffix = rt.precision(dtype)
        self.fn = {name: rt.kernel(self.dev, "spgk", f"spgk_{name}_{suffix}")
                   for name in ("vertex_matrix", "walk_1d", "walk_2d", "batched")}
        self.fn["reduce"] = rt.kernel(self.dev, "spgk", "spgk_reduce_partials")
        self.job_layout = rt.layout(self.dev, "spgk", f"batched_{suffix}")
        props = self.dev.properties
        self.n_sm = props["multiprocessor_count"]
        self.max_shared = props["max_shared_memory_per_block_optin"]
        self._copy_key = (self.dev.ordinal, dtype.str)  # the key of this runner's copies in Batch.device_copies
        self._plans = {}  # the last gpu_batched launch plans, oldest first
        self.stream = None  # gpu_batched's (created on first use)
        self.side_stream = None  # the hybrid's limit updates, beside a running launch

    def upload(self, *batches):
        """Copy the batches to the device unless they hold copies for this device and dtype already."""
        todo = [b for b in dict.fromkeys(batches) if self._copy_key not in b.device_copies]
        if not todo:
            return
        need = sum(_DeviceBatch.nbytes(b, self.dtype) for b in todo)
        self.rt.check_fits(self.dev, need, f"the shortest-path graphs and labels of {sum(map(len, todo))} graphs")
        for b in todo:
            b.device_copies[self._copy_key] = _DeviceBatch(self.rt, self.dev, b, self.dtype)

    def device_batch(self, batch):
        self.upload(batch)
        return batch.device_copies[self._copy_key]

    def run(self, method, A, B, pa, pb):
        out = np.zeros(len(pa))
        if len(pa) == 0:
            return out
        self.upload(A, B)
        if method == "gpu_batched":
            return self.batched(A, B, pa, pb)
        walk = "walk_1d" if method.startswith("gpu_1d") else "walk_2d"
        return self.per_pair(walk, method.endswith("_overlap"), A, B, pa, pb)

    # ---- one pair at a time (the paper's schedule), optionally on several streams
    def _walk_grid(self, walk, P1, P2):
        if walk == "walk_1d":
            return max(1, min(-(-P1 // _BLOCK_1D), 8 * self.n_sm)), _BLOCK_1D
        gx = max(1, min(-(-P2 // _BLOCK_2D[0]), 64))
        gy = max(1, min(-(-P1 // _BLOCK_2D[1]), 65535))
        return (gx, gy), _BLOCK_2D

    def per_pair(self, walk, overlap, A, B, pa, pb):
        rt, dev = self.rt, self.dev
        n_pairs = len(pa)
        swap = B.n_paths[pb] > A.n_paths[pa]
        max_v = int((A.n_nodes[pa] * B.n_nodes[pb]).max())
        grids = {}
        max_partials = 1
        for k in range(n_pairs):
            P1, P2 = int(A.n_paths[pa[k]]), int(B.n_paths[pb[k]])
            if swap[k]:
                P1, P2 = P2, P1
            grid, block = grids[k] = self._walk_grid(walk, P1, P2)
            max_partials = max(max_partials, int(np.prod(grid)))
        n_streams = _OVERLAP_STREAMS if overlap else 1
        itemsize = self.dtype.itemsize
        rt.check_fits(dev, n_streams * (max(max_v, 1) * itemsize + max_partials * 8) + n_pairs * 8,
                      "shortest-path kernel work buffers")
        streams = [rt.Stream(dev) for _ in range(n_streams)]
        V = [rt.alloc(dev, max(max_v, 1), self.dtype) for _ in range(n_streams)]
        partials = [rt.alloc(dev, max_partials, np.float64) for _ in range(n_streams)]
        d_out = rt.alloc(dev, n_pairs, np.float64)
        pinned = rt.PinnedBuffer(8 * n_pairs)
        host = pinned.array(np.float64, (n_pairs,))
        host[:] = 0.0
        dA, dB = self.device_batch(A), self.device_batch(B)
        param = self.scalar(self.edge.parameter)
        kind = np.int32(self.edge.code)
        n_disc, n_cont = np.int32(A.discrete.shape[1]), np.int32(A.continuous.shape[1])
        for k in range(n_pairs):
            (G1, D1, g1), (G2, D2, g2) = (A, dA, pa[k]), (B, dB, pb[k])
            if swap[k]:
                (G1, D1, g1), (G2, D2, g2) = (G2, D2, g2), (G1, D1, g1)
            P1, P2 = int(G1.n_paths[g1]), int(G2.n_paths[g2])
            if P1 == 0 or P2 == 0:
                continue
            s = k % n_streams
            n1, n2 = int(G1.n_nodes[g1]), int(G2.n_nodes[g2])
            pair = (D1.graphs()[g1], D2.graphs()[g2])
            rt.launch(self.fn["vertex_matrix"], max(1, min(-(-(n1 * n2) // _BLOCK), 4 * self.n_sm)), _BLOCK,
                      pair + (n_disc, n_cont, dA.weights, V[s]), stream=streams[s])
            grid, block = grids[k]
            rt.launch(self.fn[walk], grid, block, pair + (V[s], kind, param, partials[s]), stream=streams[s])
            rt.launch(self.fn["reduce"], 1, _BLOCK, (partials[s], np.int64(np.prod(grid)), d_out, np.int64(k),
                                                     np.float64(2.0)), stream=streams[s])
            d_out.copy_to_host(host[k:k + 1], stream=streams[s], offset=8 * k)
            if not overlap:
                streams[s].synchronize()
        for s in streams:
            s.synchronize()
        return host.copy()

    # ---- many pairs per launch
    def _plan(self, A, B, pa, pb):
        """The :class:`_LaunchPlan` of these pairs: the last calls' when they are the same read-only
        arrays (those a batch keeps, :meth:`graphkern.spgk.batch.Batch.pairs`) of the same batches, else a new one."""
        if pa.flags.writeable or pb.flags.writeable:
            return _LaunchPlan(A, B, pa, pb)
        for old, entry in list(self._plans.items()):  # plans of collected batches go
            if entry[0]() is None or entry[1]() is None:
                self._plans.pop(old, None)
        key = (id(A), id(B), id(pa), id(pb))
        entry = self._plans.pop(key, None)
        if entry is None or entry[0]() is not A or entry[1]() is not B or entry[2] is not pa or entry[3] is not pb:
            # the batches held weakly (their device memory goes with the batch cache's entry),
            # the read-only pair arrays strongly (their ids stay theirs)
            entry = (weakref.ref(A), weakref.ref(B), pa, pb, _LaunchPlan(A, B, pa, pb))
        self._plans[key] = entry
        for old in list(self._plans)[:-_PLANS_KEPT]:
            self._plans.pop(old, None)
        return entry[4]

    def batched(self, A, B, pa, pb):
        return self.start_batched(A, B, pa, pb).finish()

    def start_batched(self, A, B, pa, pb, shared_with_cpu=False):
        """Queue gpu_batched on the pairs and return at once: a :class:`_BatchedLaunch`.

        The pairs go heaviest first (the kernel's atomic pair counter then balances the tail).
        ``shared_with_cpu``: the launch reads a limit the CPU lowers and reports its progress
        (see :meth:`_BatchedLaunch.share`), so that the CPU can take pairs from the light end
        while it runs (:func:`share_from_both_ends`).
        """
        rt, dev = self.rt, self.dev
        fn = self.fn["batched"]
        itemsize = self.dtype.itemsize
        plan = self._plan(A, B, pa, pb)
        n_pairs = len(pa)
        reduction_bytes = 32 * 8
        # V in shared memory up to two blocks' worth per SM; larger V go to a global scratch (L2)
        budget = min(self.max_shared, _MAX_SHARED_V) - reduction_bytes - 64
        capacity = int(min(plan.max_vsize, budget // itemsize))
        shared = reduction_bytes + capacity * itemsize
        if shared > _DEFAULT_SHARED:
            fn.set_max_dynamic_shared_memory(shared)
        per_sm = max(1, fn.max_active_blocks_per_sm(_BLOCK, shared))
        grid = int(max(1, min(n_pairs, per_sm * self.n_sm)))
        stride = plan.max_vsize if plan.max_vsize > capacity else 0  # the largest V beyond shared memory
        if self.stream is None:
            self.stream = rt.Stream(dev)
        st = self.stream
        idle = st.query()  # nothing queued before this launch
        rt.check_fits(dev, grid * stride * itemsize + n_pairs * (8 if plan.d_pa is not None else 24) + 8,
                      "shortest-path kernel pair list and vertex-kernel scratch")
        if plan.d_pa is None:
            # on the stream of every launch that reads them (a runner has one), so they land first
            plan.d_pa = rt.to_device(dev, plan.pa, stream=st)
            plan.d_pb = rt.to_device(dev, plan.pb, stream=st)
        launch = _BatchedLaunch(self, plan.order)
        launch.blocks, launch.idle = grid, idle  # resident blocks: on an idle GPU each takes a pair at once
        launch.works = plan.works  # in the launch's order, heaviest first
        launch.plan = plan  # its host pair arrays stay alive while copied
        launch.d_pa, launch.d_pb = plan.d_pa, plan.d_pb
        launch.scratch = rt.alloc(dev, max(grid * stride, 1), self.dtype)
        launch.counter = rt.alloc(dev, 1, np.uint64)
        launch.counter.zero(stream=st)
        launch.d_out = rt.alloc(dev, n_pairs, np.float64)
        launch.d_out.memset32(0x7FC00000, stream=st)  # NaN: a pair the kernel missed cannot pass as a value
        limit = progress = None
        if shared_with_cpu:
            if self.side_stream is None:
                self.side_stream = rt.Stream(dev)
            launch.share(st)
            limit, progress = launch.limit_dev, np.uint64(launch.flags.device_pointer(dev) + _PROGRESS_OFFSET)
        dA, dB = self.device_batch(A), self.device_batch(B)
        job = self.job_layout.pack(
            n_disc=A.discrete.shape[1], n_cont=A.continuous.shape[1], weights=dA.weights, pair_a=launch.d_pa,
            pair_b=launch.d_pb, n_pairs=n_pairs, kind=self.edge.code, param=float(self.edge.parameter),
            shared_capacity=capacity, scratch_V=launch.scratch, scratch_stride=stride, next_pair=launch.counter,
            limit=limit, progress=progress, out=launch.d_out)
        launch.started.record(st)
        rt.launch(fn, grid, _BLOCK, (dA.descriptor, dB.descriptor, job), shared_mem=shared, stream=st)
        launch.ended.record(st)
        return launch


class _LaunchPlan:
    """gpu_batched's pair list, heaviest first (the kernel's atomic pair counter then balances the
    tail): ``order`` (the caller's positions in launch order), the pairs ``pa``, ``pb`` (int64) and
    their ``works`` in that order, the largest vertex-kernel matrix ``max_vsize``, and the pairs'
    device copies ``d_pa``, ``d_pb`` once a launch has made them."""

    def __init__(self, A, B, pa, pb):
        works = pair_work(A, B, pa, pb)
        self.order = np.argsort(-works, kind="stable")
        self.works = works[self.order]
        self.pa = np.ascontiguousarray(pa[self.order], dtype=np.int64)
        self.pb = np.ascontiguousarray(pb[self.order], dtype=np.int64)
        self.max_vsize = int((A.n_nodes[pa] * B.n_nodes[pb]).max()) if len(pa) else 0
        self.d_pa = self.d_pb = None
        self._tail = None
        for a in (self.order, self.works, self.pa, self.pb):
            a.flags.writeable = False  # a kept plan serves later launches

    @property
    def tail(self):
        """:func:`suffix_sums` of ``works`` (the hybrid's), made on first use."""
        if self._tail is None:
            self._tail = suffix_sums(self.works)
        return self._tail


class _BatchedLaunch:
    """A queued gpu_batched launch: ``order`` (the pairs' positions, heaviest first, as the
    kernel takes them), ``done()``, ``finish()`` (the values in the caller's pair order, after
    the copy back), and for a launch shared with the CPU (:meth:`share`): ``set_limit(b)``
    (positions >= b are the CPU's; at most ``capacity`` calls) and ``progress()`` (a position
    the blocks have reached, to within 32: a hint, -1 before the first)."""

    capacity = 0

    def __init__(self, runner, order):
        rt = runner.rt
        self.runner = runner
        self.order = order
        self.started = rt.Event(runner.dev)
        self.ended = rt.Event(runner.dev)
        self.flags = self.ring = None

    def share(self, stream):
        """The limit (device memory, set to "no limit" on ``stream`` before the launch), the ring
        of page-locked values its updates are copied from, and the mapped progress flag."""
        rt = self.runner.rt
        self.flags, self.ring = _pinned_pair()
        self._progress = self.flags.array(np.int64)[_PROGRESS_OFFSET // 8:][:1]
        self._progress[0] = -1
        self._ring = self.ring.array(np.int64)
        self.capacity = len(self._ring) - 1
        self._next = 1
        self._ring[0] = len(self.order)
        self.limit_dev = rt.alloc(self.runner.dev, 1, np.int64)
        self.limit_dev.copy_from_host(self._ring[:1], stream=stream)
        # the updates (on the side stream) must land after this first value, not overtake it
        self._limit_set = rt.Event(self.runner.dev, timing=False)
        self._limit_set.record(stream)
        self.runner.side_stream.wait_event(self._limit_set)

    def set_limit(self, b):
        i = self._next
        if i > self.capacity:
            raise RuntimeError("the hybrid's limit was set more often than its ring holds")
        self._ring[i] = b
        self.limit_dev.copy_from_host(self._ring[i:i + 1], stream=self.runner.side_stream)
        self._next = i + 1

    def progress(self):
        return int(self._progress[0])

    def done(self):
        return self.ended.query()

    def gpu_seconds(self):
        self.ended.synchronize()
        return self.started.elapsed_ms(self.ended) / 1e3

    def finish(self):
        """The values in the caller's pair order (NaN where the kernel stopped at the limit)."""
        self.runner.stream.synchronize()
        out = np.empty(len(self.order))
        out[self.order] = self.d_out.to_host()
        if self.flags is not None:
            self.runner.side_stream.synchronize()  # the ring's copies are done: it can be reused
            _release_pinned_pair((self.flags, self.ring))
            self.flags = self.ring = None
        return out


# share_from_both_ends steps at most this many times per call (the launch's ring of limits)
_HYBRID_MAX_STEPS = 2047
# the mapped progress flag sits on a cache line of its own, which the host only reads
_PROGRESS_OFFSET = 128
_PINNED_PAIRS = []
_PINNED_LOCK = threading.Lock()


def _pinned_pair():
    """(mapped flags, ring of limits): page-locked memory, pooled (pinning costs more than a launch)."""
    with _PINNED_LOCK:
        if _PINNED_PAIRS:
            return _PINNED_PAIRS.pop()
    from graphkern._cuda import runtime as rt

    return rt.PinnedBuffer(2 * _PROGRESS_OFFSET, mapped=True), rt.PinnedBuffer(8 * (_HYBRID_MAX_STEPS + 1))


def _release_pinned_pair(pair):
    with _PINNED_LOCK:
        _PINNED_PAIRS.append(pair)


def suffix_sums(works):
    """``tail[b] = works[b:].sum()`` for b in 0..n (summed from the end), read-only."""
    n = len(works)
    tail = np.zeros(n + 1)
    if n:
        np.cumsum(works[::-1], out=tail[n - 1::-1])
    tail.flags.writeable = False
    return tail
