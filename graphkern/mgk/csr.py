"""The CSR GPU solver of the marginalized graph kernel (``techniques="csr"``): cuda_src/mgk_csr.cu.

The core solver (cuda_src/mgk.cu) forms the Kronecker matrix-vector product (XMV) from dense
8x8 octile products: 64 x 64 element pairs per pair of non-empty octiles, whatever their fill.
On sparse graphs almost all of them are zero (160 Barabasi-Albert graphs of 96 vertices, m=6:
~80M element products per XMV where nnz1 nnz2 = 1.17M are not), and the solver is bound by
instruction issue.  This one sums over pairs of stored entries only:

    (A1 (x) A2 (.) E) p [(i1, i2)] = sum_{j1 ~ i1} sum_{j2 ~ i2} E(e_i1j1, e'_i2j2) w_i1j1 w'_i2j2 p[(j1, j2)]

with one thread block per pair (grid-stride over the pairs, largest first), both graphs' CSR
and the search direction p in shared memory and the other CG vectors in a global scratch slot
per resident block (the kernel's header comment has the layout).  The linear system,
preconditioner, tolerance, float32/float64 handling and the nodal output are the core
solver's.  ``eval_gradient=True`` runs :meth:`CSRGPUEngine.solve_gradient`: the adjoint solve
after the forward one in the same block, from the warm start alpha x, with K's footprint
(``gradient_solves="sequential"``, the default), or in lockstep with it (both search
directions interleaved in shared memory, one gather and one edge-kernel evaluation per entry pair
serving both; a converged side stops); then the contractions of graphkern/_mgk_gradient.py, those of a constant factor of the
edge kernel free (a diagonal sum).  Pairs whose footprint does not fit run the core solver's
gradient.

Cost floor (one pair, per CG iteration): nnz1 nnz2 entry pairs at ~7-8 warp instructions per
32 of them (a broadcast 128-bit load of G1's record, a gathered load of p, the edge kernel, an
FMA); the gathered load of p is the shared-memory bottleneck (~2-3.5 wavefronts per warp-load
for scattered columns, one wavefront per clock per SM).  For the 96-vertex BA set: 1.17M
entry pairs, ~0.28 us per pair-iteration at issue rate on 132 SMs, ~0.6 us at the
shared-memory rate; ~6 iterations: 2-4 us per pair.

Vertices are renumbered per graph by decreasing row length (graphkern.mgk.data.renumbered)
so that the 32 outputs of a warp have rows of similar length; the nodal matrices come back in
the caller's numbering.  Pairs whose staged data exceed the device's shared memory per block
(:func:`shared_memory_limit`) run on the core solver instead, in the same call.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from graphkern._cpu import pairs
from graphkern._cuda import runtime as rt
from graphkern.mgk.core import (align16, check_contractions, gradient_outputs, gradient_terms, graph_sets, pair_job,
                                scratch_units, solve_outputs, timed_launch, uploaded)
from graphkern.mgk.data import _nonempty, renumbered
from graphkern.mgk.results import Solved, empty_result, gradient_result

__all__ = ["CSR_TECHNIQUE", "CSRData", "csr_data", "CSRGPUEngine", "gradient_entry", "header_bytes",
           "pair_shared_bytes", "shared_memory_limit"]

#: the ``techniques=`` name of this solver
CSR_TECHNIQUE = "csr"
# The shared memory layout routing plans with (it runs, and is tested, without a device); the kernel
# module exports the same values, checked when the engine loads it (graphkern._cuda.runtime.exports).
REDUCE_BYTES = 8 * 4 * 8       # the reduction slots: 8 warps x 4 doubles
ENTRY_BYTES = {4: 16, 8: 32}   # a staged entry record, by itemsize
_PLANNED = {"reduce_bytes": REDUCE_BYTES, "entry_bytes_f32": ENTRY_BYTES[4], "entry_bytes_f64": ENTRY_BYTES[8]}
_KEPT = threading.local()   # CSRData.launch_plan's last kept plan, per thread


class CSRData:
    """One dataset's graphs renumbered by decreasing row length, as cuda_src/mgk_csr.cu reads them.

    ``rowptr`` (global, int64), ``indices`` (local, int32), ``weights``, ``edge_features``,
    ``degree`` and ``node_features`` are those of :class:`graphkern.mgk.data.MGKDataset` in the
    new numbering; ``orig[v]`` is renumbered global vertex v's index in its graph as given.
    """

    def __init__(self, ds):
        n_vertices = int(ds.node_offsets[-1])
        graph_of_vertex = np.repeat(np.arange(ds.n_graphs, dtype=np.int64), ds.n_nodes)
        row_length = np.diff(ds.rowptr)
        # by graph, then longest row first (ties in the given order)
        order = np.lexsort((np.arange(n_vertices), -row_length, graph_of_vertex))
        local = order - ds.node_offsets[graph_of_vertex]  # order keeps every graph's vertices in its range
        perms = np.split(local, ds.node_offsets[1:-1]) if ds.n_graphs else []
        rd = renumbered(ds, perms)
        self.n_graphs = ds.n_graphs
        self.node_offsets = ds.node_offsets
        self.n_nodes = ds.n_nodes
        self.n_entries = ds.n_entries
        self.rowptr = rd.rowptr.astype(np.int64)
        self.indices = rd.indices
        self.weights = rd.weights
        self.edge_features = rd.edge_features
        self.degree = rd.degree
        self.node_features = rd.node_features
        self.orig = _nonempty((rd.perm_global - ds.node_offsets[graph_of_vertex]).astype(np.int32))
        self.device_copies = {}

    def launch_plan(self, other, pair_arr, f1, f2, cross):
        """:func:`graphkern._cpu.pairs.pair_plan` and a dict of the pairs' ``positions`` and device copies;
        the last plan of a read-only pair array (a whole Gram matrix) is kept, one per thread, for the
        next call with the same array, sets and footprint.  It holds only weak references to the array
        and the sets, and goes (with its device copies) when a later plan replaces it or the array
        goes (a kernel deleted, or its next call of another shape)."""
        last = getattr(_KEPT, "plan", None)
        if (last is not None and last[0]() is pair_arr and last[1]() is self and last[2]() is other
                and last[3] == cross and last[6] and np.array_equal(last[4], f1) and np.array_equal(last[5], f2)):
            return last[6][0]
        i64 = (lambda a: np.ascontiguousarray(a, dtype=np.int64))
        positions = np.empty(len(pair_arr), dtype=np.int64)
        plan = pairs.pair_plan(i64(pair_arr), i64(self.n_nodes), i64(other.n_nodes), i64(self.n_entries),
                               i64(other.n_entries), i64(f1), i64(f2), cross, positions) + ({"positions": positions},)
        if not pair_arr.flags.writeable:
            if last is not None:  # one plan per thread: the one it replaces goes now, not with its array
                last[6].clear()
                last[7].detach()
            holder = [plan]
            _KEPT.plan = (weakref.ref(pair_arr), weakref.ref(self), weakref.ref(other), cross, f1, f2, holder,
                          weakref.finalize(pair_arr, holder.clear))
        return plan

    def on_device(self, dev):
        """The fields of the set's CsrSet (cuda_src/mgk_csr.cu) on ``dev`` (uploaded once)."""
        host = dict(node_off=self.node_offsets, rowptr=self.rowptr, indices=self.indices, weights=self.weights,
                    edge_feat=self.edge_features, degree=self.degree, node_feat=self.node_features, orig=self.orig)
        return uploaded(self.device_copies, dev, host, f"the CSR of {self.n_graphs} graphs",
                        dict(n_efeat=self.edge_features.shape[1], n_nfeat=self.node_features.shape[1]))


def csr_data(ds):
    """The :class:`CSRData` of a packed dataset, built on first use and kept on it."""
    data = getattr(ds, "_csr_solver_data", None)
    if data is None:
        data = CSRData(ds)
        ds._csr_solver_data = data
    return data


def header_bytes(itemsize, param_len, code_len):
    """Shared bytes of a block's fixed part: reduction slots, parameters, code (mgk_csr.cu: header_bytes)."""
    return REDUCE_BYTES + align16(param_len * itemsize) + align16(code_len * 4)


def pair_shared_bytes(itemsize, form, n1, n2, nnz1, nnz2, n_edge_features, directions=1):
    """Shared bytes of each pair's staged data (arrays or ints): both graphs' entry records, the
    search directions (``directions=2`` for gradients: the forward and adjoint ones interleaved),
    the general form's edge features, both row-pointer arrays (mgk_csr.cu: pair_layout)."""
    n1, n2, nnz1, nnz2 = (np.asarray(v, dtype=np.int64) for v in (n1, n2, nnz1, nnz2))
    features = n_edge_features if form == "general" else 0
    return ((nnz1 + nnz2) * ENTRY_BYTES[itemsize] + directions * n1 * n2 * itemsize
            + (nnz1 + nnz2) * features * itemsize + (n1 + n2 + 2) * 4)


#: How the gradient kernels (this solver's and the GEMM solver's) run the forward and adjoint
#: solves (``MarginalizedGraphKernel(gradient_solves=...)``): "sequential" (the adjoint after the
#: forward solve, from a warm start, with K's footprint: one direction in shared memory, K's
#: blocks per SM) or "lockstep" (both at once, both directions in shared memory).  A lockstep
#: iteration costs about 2.3 K iterations, a sequential one about one (docs/performance.md).
GRADIENT_ENTRIES = {"lockstep": ("mgk_csr_gradient", 2), "sequential": ("mgk_csr_gradient_seq", 1)}


def gradient_entry(solves):
    """(entry point prefix, directions in shared memory) of the gradient scheme ``solves``."""
    if solves not in GRADIENT_ENTRIES:
        raise ValueError(f"gradient_solves must be 'lockstep' or 'sequential', not {solves!r}")
    return GRADIENT_ENTRIES[solves]


def shared_memory_limit(dev):
    """Dynamic shared memory one block of the solver may use on ``dev``."""
    return int(dev.properties.get("max_shared_memory_per_block_optin", 48 * 1024))


class CSRGPUEngine:
    """Runs cuda_src/mgk_csr.cu over a list of pairs on one device; :meth:`accepts` says which pairs
    fit its shared memory (graphkern.mgk.router gives the others to another solver)."""

    name = "gpu"

    def __init__(self, ordinal, s):
        self.dev = rt.get_device(ordinal)
        self.s = s

    def exports(self):
        """The kernel module's threads and scratch vectors (and its layout checked against the one
        planned here), loading it on first use."""
        return rt.exports(self.dev, "mgk_csr", agree=_PLANNED)

    def _parts(self, ds1, ds2, args, plan=None):
        """The shared bytes of a block as ``fixed + f1[g1] + f2[g2] + cross n1[g1] n2[g2]`` (the sum
        of :func:`header_bytes` and :func:`pair_shared_bytes`, split per graph): (c1, c2, code,
        params, fixed, f1, f2, cross)."""
        dt = self.s["dtype"]
        extra_code = extra_params = 0
        directions = 1
        if plan is not None:
            extra_code, extra_params = len(plan.contraction_programs.code), len(plan.contraction_programs.params)
            directions = gradient_entry(self.s["gradient_solves"])[1]
        c1 = csr_data(ds1)
        c2 = c1 if ds2 is ds1 else csr_data(ds2)
        code = np.concatenate([args["ncode"], args["ecode"]]).astype(np.int32)
        params = np.concatenate([args["nparam"], args["eparam"]]).astype(dt)
        fixed = header_bytes(dt.itemsize, len(params) + extra_params, len(code) + extra_code) + 8
        per_entry = ENTRY_BYTES[dt.itemsize] + (ds1.edge_features.shape[1] * dt.itemsize
                                                if args["form_name"] == "general" else 0)
        f1 = c1.n_entries * per_entry + 4 * c1.n_nodes
        f2 = f1 if c2 is c1 else c2.n_entries * per_entry + 4 * c2.n_nodes
        return c1, c2, code, params, fixed, f1, f2, directions * dt.itemsize

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=None):
        """The pairs whose staged data fit one block's shared memory (``gradient``: the plan of a
        gradient solve, whose search directions and contraction programs take room too); True
        when every pair of the two sets fits."""
        c1, c2, _, _, fixed, f1, f2, cross = self._parts(ds1, ds2, args, gradient)
        limit = shared_memory_limit(self.dev)
        if fixed + f1.max(initial=0) + f2.max(initial=0) + cross * c1.n_nodes.max(initial=0) * c2.n_nodes.max(
                initial=0) <= limit:
            return True
        g1, g2 = pair_arr[:, 0], pair_arr[:, 1]
        return fixed + f1[g1] + f2[g2] + cross * c1.n_nodes[g1] * c2.n_nodes[g2] <= limit

    def _need(self, ds1, ds2, pair_arr, args, plan=None):
        """What a launch needs on the host: (c1, c2, code, params, launch, the largest pair's shared
        bytes), ``launch`` being :func:`graphkern._cpu.pairs.pair_plan`'s launch order, graphs in
        launch order, largest and total product-graph size.  A pair's cost, which orders the launch
        (longest first), is its entry pairs per XMV plus its vertex pairs."""
        c1, c2, code, params, fixed, f1, f2, cross = self._parts(ds1, ds2, args, plan)
        order, g1, g2, largest, total, footprint, kept = c1.launch_plan(c2, pair_arr, f1, f2, cross)
        return c1, c2, code, params, (order, g1, g2, largest, total, kept), fixed + footprint

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        """Pairs that :meth:`accepts`: K, iterations, residuals (and nodal matrices)."""
        if len(pair_arr) == 0:
            return empty_result(nodal)
        c1, c2, code, params, launch, need = self._need(ds1, ds2, pair_arr, args)
        k, it, res, nod, seconds = self._launch(c1, c2, pair_arr, launch, args, code, params, need, nodal)
        return Solved(K=k, iterations=it, residuals=res, nodal=nod, octile_pairs=None, seconds=seconds)

    def solve_gradient(self, ds1, ds2, pair_arr, args, plan):
        """K and the raw derivatives of :class:`graphkern.mgk.gradient.GradientPlan` for pairs that
        :meth:`accepts` with ``gradient=plan``."""
        if len(pair_arr) == 0:
            return empty_result(False, None, plan.n_raw)
        entry = gradient_entry(self.s["gradient_solves"])[0]
        c1, c2, code, params, launch, need = self._need(ds1, ds2, pair_arr, args, plan)
        check_contractions(plan, args)
        K, iters, resid, adj_iters, adj_resid, raw, seconds = self._launch_gradient(
            c1, c2, launch, args, code, params, need, plan, entry)
        return gradient_result(K, iters, resid, adj_iters, adj_resid, raw, None, seconds)

    def _prepare(self, c1, c2, launch, args, code, params, shared, entry, vectors, out_bytes):
        """The launch of ``entry`` over the pairs of ``launch`` (:meth:`_need`): its kernel, grid, threads
        per block and the arguments every entry point begins with (sets, pairs, programs,
        hyperparameters, scratch); ``vectors``: the name of the scratch vectors' count in the module's
        exports."""
        s = self.s
        lim = self.exports()
        n_vectors = getattr(lim, vectors)
        dt = s["dtype"]
        dev = self.dev
        order, g1, g2, largest, _, kept = launch
        m = len(order)
        fn = rt.kernel(dev, "mgk_csr", f"{entry}_{args['form_name']}_{rt.precision(dt)}")
        if shared > 48 * 1024:
            fn.set_max_dynamic_shared_memory(shared)
        stride = int(-(-largest // 32) * 32)
        per_block = n_vectors * stride * dt.itemsize
        resident = dev.properties["multiprocessor_count"] * max(1, fn.max_active_blocks_per_sm(lim.threads, shared))
        n_blocks = scratch_units(dev, min(m, resident), per_block, out_bytes, largest)

        set1 = c1.on_device(dev)
        sets = graph_sets(dev, "mgk_csr", dt, set1, set1 if c2 is c1 else c2.on_device(dev))
        scratch = rt.alloc(dev, n_blocks * n_vectors * stride, dt)
        graphs = kept.get(dev.ordinal)
        if graphs is None:
            graphs = kept[dev.ordinal] = (rt.to_device(dev, g1), rt.to_device(dev, g2))
        job = pair_job(dev, "mgk_csr", s, args, *graphs, rt.to_device(dev, _nonempty(code)),
                       rt.to_device(dev, _nonempty(params)), args["ek_slot"], scratch, stride)
        return fn, n_blocks, lim.threads, sets + (job,)

    def _launch(self, c1, c2, pair_arr, launch, args, code, params, shared, nodal):
        """Solve the pairs of ``launch`` (:meth:`_need`; ``pair_arr`` in the caller's order) that fit
        ``shared`` bytes: (K, iterations, residuals, nodal blocks, seconds)."""
        dt = self.s["dtype"]
        order, total = launch[0], launch[4]
        out_bytes = len(order) * (8 + 4 + 8) + (total * dt.itemsize if nodal else 0)
        fn, n_blocks, threads, head = self._prepare(c1, c2, launch, args, code, params, shared, "mgk_csr",
                                                    "vectors", out_bytes)
        n1, n2 = (c1.n_nodes[pair_arr[:, 0]], c2.n_nodes[pair_arr[:, 1]]) if nodal else (None, None)
        run = (lambda outputs: timed_launch(self.dev, fn, n_blocks, threads, head + (outputs,), shared))
        return solve_outputs(self.dev, "mgk_csr", run, order, n1, n2, dt, nodal, launch[5]["positions"])

    def _launch_gradient(self, c1, c2, launch, args, code, params, shared, plan, entry="mgk_csr_gradient"):
        """K and raw derivatives of the pairs of ``launch`` (:meth:`_need`) that fit ``shared`` bytes:
        (K, iterations, residuals, adjoint iterations, adjoint residuals, raw (m, n_raw), seconds)."""
        dt = self.s["dtype"]
        order = launch[0]
        fn, n_blocks, threads, head = self._prepare(c1, c2, launch, args, code, params, shared, entry,
                                                    "gradient_vectors", len(order) * (2 * (8 + 4 + 8) + 8 * plan.n_raw))
        head = head + (gradient_terms(self.dev, "mgk_csr", plan, dt),)
        run = (lambda outputs: timed_launch(self.dev, fn, n_blocks, threads, head + (outputs,), shared))
        return gradient_outputs(self.dev, "mgk_csr", run, order, plan, "GPU solver")
