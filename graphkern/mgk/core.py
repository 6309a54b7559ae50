"""The core GPU solver of the marginalized graph kernel (cuda_src/mgk.cu), and the launch helpers all GPU solvers share.

One launch solves every pair of a call: a warp per pair (grid-stride over the pairs, which
are ordered by decreasing cost so that the long ones start first), CG vectors in a global
scratch slot per resident warp.  Datasets are uploaded once per device and kept on the
:class:`~graphkern.mgk.data.MGKDataset`, so a new call with other hyperparameters only
ships the programs and the pair list.  ``solve_gradient`` launches the gradient entry points
(the forward and adjoint solves of a pair in lockstep, sharing each XMV, then the
contractions of graphkern/mgk/gradient.py, the free ones as diagonal sums) the same way.
"""

from __future__ import annotations

import numpy as np

from graphkern._cpu import pairs
from graphkern._cuda import runtime as rt
from graphkern.errors import GraphTooLargeError
from graphkern.mgk.data import _nonempty
from graphkern.mgk.gradient import EDGE_FORMS
from graphkern.mgk.results import Solved, empty_result, gradient_result

# Leave room for other users of the device: the scratch takes at most this share of free memory.
SCRATCH_SHARE = 0.6


def align16(n):
    """``n`` bytes rounded up to 16, as the kernels lay out their shared memory."""
    return (n + 15) & ~15


def uploaded(copies, dev, host, what, scalars=None):
    """A graph set's fields: the arrays ``host`` (field name -> array) on ``dev`` and the numbers
    ``scalars``, uploaded on first use and kept in ``copies`` by device; GraphTooLargeError naming
    ``what`` where they do not fit the free device memory."""
    copy = copies.get(dev.ordinal)
    if copy is None:
        rt.check_fits(dev, sum(a.nbytes for a in host.values()), what)
        copy = copies[dev.ordinal] = {name: rt.to_device(dev, a) for name, a in host.items()} | dict(scalars or {})
    return copy


def device_dataset(dev, ds):
    """The dataset's octiles, degrees and vertex features on ``dev``: the fields of a GraphSet
    (cuda_src/mgk.cu)."""
    oc = ds.octiles
    host = dict(node_off=ds.node_offsets, rowptr_off=_nonempty(oc.rowptr_offset), tile_rowptr=oc.tile_rowptr,
                tile_col=_nonempty(oc.tile_col), tile_val=_nonempty(oc.values.reshape(-1)), degree=ds.degree,
                node_feat=ds.node_features)
    return uploaded(ds.device_copies, dev, host, f"the octiles of {ds.n_graphs} graphs",
                    dict(n_feat=ds.node_features.shape[1], channels=oc.channels))


def graph_sets(dev, module, dt, set1, set2):
    """The two graph-set arguments of a launch of ``cuda_src/<module>.cu``, packed from their fields."""
    layout = rt.layout(dev, module, f"set_{rt.precision(dt)}")
    first = layout.pack(**set1)
    return first, first if set2 is set1 else layout.pack(**set2)


def pair_job(dev, module, s, args, pair_g1, pair_g2, code, params, ek_slot, scratch, stride):
    """The PairJob argument (cuda_src/common/kernel_program.cuh) of a core, CSR or tiled launch: the pairs
    in launch order and the programs (device buffers), the edge kernel's shortcut of the call's
    ``args`` (``ek_slot`` where its form finds the feature), the settings' hyperparameters, the
    scratch of ``stride`` values per vector."""
    return rt.layout(dev, module, f"job_{rt.precision(s['dtype'])}").pack(
        pair_g1=pair_g1, pair_g2=pair_g2, n_pairs=pair_g1.shape[0], code=code, params=params,
        ncode_len=len(args["ncode"]), nparam_len=len(args["nparam"]), ecode_len=len(args["ecode"]),
        eparam_len=len(args["eparam"]), ek_scale=args["ek_scale"], ek_theta=args["ek_theta"], ek_aux=args["ek_aux"],
        ek_slot=ek_slot, q=s["q"], p2=s["p"] * s["p"], tol=s["tol"], max_iter=s["max_iter"], scratch=scratch,
        stride=stride)


class _Launch:
    """What both entry points of a call share: the pairs in launch order, the kernel, shared memory,
    the grid, the scratch vectors and the device copies of the pairs and programs."""

    def __init__(self, engine, ds1, ds2, pair_arr, args, entry, *, vectors, slices, extra_shared,
                 out_bytes_per_pair, out_values_per_vertex_pair=0):
        """``vectors``: the name of the scratch vectors' count in the module's exports."""
        s = engine.s
        dt = s["dtype"]
        dev = engine.dev
        self.m = m = len(pair_arr)
        self.args = args
        self.g1 = g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
        self.g2 = g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
        self.sizes = sizes = ds1.n_nodes[g1] * ds2.n_nodes[g2]
        self.tile_pairs = tile_pairs = ds1.octiles.tiles_per_graph()[g1] * ds2.octiles.tiles_per_graph()[g2]
        if m == 0:
            return
        lim = rt.exports(dev, "mgk")
        if len(args["nparam"]) > lim.max_params or len(args["eparam"]) > lim.max_params:
            raise ValueError(f"a kernel program has more than {lim.max_params} parameters")
        self.set1 = device_dataset(dev, ds1)
        self.set2 = self.set1 if ds2 is ds1 else device_dataset(dev, ds2)

        # Longest pairs first: with a static grid-stride order they would otherwise finish last.
        self.order = order = launch_order(tile_pairs.astype(np.float64) * 64 + sizes)
        form = args["form_name"]
        self.fn = fn = rt.kernel(dev, "mgk", f"{entry}_{form}_{rt.precision(dt)}")
        staged = getattr(lim, f"staged_channels_{form}") or ds1.octiles.channels
        code = np.concatenate([args["ncode"], args["ecode"]]).astype(np.int32)
        params = np.concatenate([args["nparam"], args["eparam"]]).astype(dt)
        # cuda_src/mgk.cu share_block: programs, then per warp two octiles and `slices` vector slices
        warps = lim.warps_per_block
        self.threads = 32 * warps
        self.shared = shared = ((2 * lim.max_params + warps * (2 * staged + slices) * lim.octile_size) * dt.itemsize
                                + code.nbytes + extra_shared)
        limit = dev.properties.get("max_shared_memory_per_block_optin", 48 * 1024)
        if shared > limit:
            raise ValueError(f"the kernel programs and octile planes ({staged} per octile) need {shared} bytes of "
                             f"shared memory per block; device {dev.ordinal} allows {limit}")
        if shared > 48 * 1024:
            fn.set_max_dynamic_shared_memory(shared)
        self.stride = stride = int(-(-int(sizes.max()) // 32) * 32)

        out_bytes = m * out_bytes_per_pair + int(sizes.sum()) * out_values_per_vertex_pair * dt.itemsize
        n_vectors = getattr(lim, vectors)
        per_warp = n_vectors * stride * dt.itemsize
        sms = dev.properties["multiprocessor_count"]
        resident = sms * max(1, fn.max_active_blocks_per_sm(self.threads, shared))
        self.blocks = blocks = scratch_units(dev, min(-(-m // warps), resident), per_warp * warps, out_bytes, sizes)

        scratch = rt.alloc(dev, blocks * warps * n_vectors * stride, dt)
        job = pair_job(dev, "mgk", s, args, rt.to_device(dev, in_launch_order(g1, order)),
                       rt.to_device(dev, in_launch_order(g2, order)), rt.to_device(dev, code),
                       rt.to_device(dev, params), 1 + args["ek_slot"], scratch, stride)
        self.head = graph_sets(dev, "mgk", dt, self.set1, self.set2) + (job,)

    def run(self, dev, tail):  # the kernel's seconds
        return timed_launch(dev, self.fn, self.blocks, self.threads, self.head + tail, self.shared)


def launch_order(cost):
    """The pairs by decreasing ``cost``, quantized to 1/65535 of the largest (a counting sort of
    16-bit keys, linear in the pairs: graphkern._cpu.pairs).  The order only balances a launch --
    the longest pairs start first -- and no pair's result depends on it."""
    return pairs.launch_order(np.ascontiguousarray(cost, dtype=np.float64))


def in_launch_order(values, order):
    """``values[order]`` (the pairs' graph indices as the launch reads them), over threads."""
    return pairs.take(np.ascontiguousarray(values), order)


def scratch_units(dev, wanted, per_unit, out_bytes, sizes):
    """How many units (blocks, teams) of CG scratch of ``per_unit`` bytes to allocate: at most
    ``wanted``, within :data:`SCRATCH_SHARE` of the free device memory left by ``out_bytes`` of
    results; GraphTooLargeError when not one fits (``sizes``: the pairs' product-graph sizes, or the largest)."""
    free, _ = dev.memory_info()
    affordable = int((free - out_bytes) * SCRATCH_SHARE // per_unit)
    if affordable < 1:
        raise GraphTooLargeError(
            f"the CG vectors of one block of pairs need {per_unit / 2**30:.2f} GiB (largest product graph: "
            f"{int(np.max(sizes))} vertex pairs) plus {out_bytes / 2**30:.2f} GiB of results on device "
            f"{dev.ordinal}, but only {free / 2**30:.2f} GiB is free")
    units = min(wanted, affordable)
    rt.check_fits(dev, units * per_unit + out_bytes, "the CG work vectors and results")
    return units


class PairOutputs:
    """A launch's per-pair outputs in one device buffer, ``parts`` ``(count, dtype)`` in order, each at
    an 8-byte boundary: allocated with every byte 0xFF (NaN in a float, -1 in an integer, so that an
    output the kernel never wrote shows up), one device view a part (``views``), and read back in one
    copy (:meth:`read`)."""

    def __init__(self, dev, parts, stream=None):
        self.parts, at = [], 0
        for count, dtype in parts:
            dtype = np.dtype(dtype)
            self.parts.append((at, count, dtype))
            at += -(-count * dtype.itemsize // 8) * 8
        self.nbytes = max(at, 8)
        self.block = rt.alloc(dev, self.nbytes, np.uint8)
        self.block.memset32(0xFFFFFFFF, stream)
        self.views = [self.block.view(at, count * dtype.itemsize, dtype=dtype, shape=(count,))
                      for at, count, dtype in self.parts]

    def read(self):
        """Every part as a host array (in launch order), after the launch's stream has finished."""
        host = rt.copy_to_pageable(self.block, np.empty(self.nbytes, np.uint8))
        return [host[at:at + count * dtype.itemsize].view(dtype) for at, count, dtype in self.parts]


def check_contractions(plan, args):
    """The plan's edge contractions must be of the launch's edge-kernel form (or its derivative) and
    read its feature: the kernels stage one form's data (the CSR one: theta * w where labels differ)."""
    form = args["form_name"]
    allowed = {EDGE_FORMS[form], EDGE_FORMS.get(f"{form}_derivative", EDGE_FORMS[form])}
    base = plan.contraction_form == EDGE_FORMS[form]
    if (not set(plan.contraction_form.tolist()) <= allowed or np.any(plan.contraction_slot != args["ek_slot"])
            or (form == "kronecker" and np.any(plan.contraction_theta[base] != args["ek_theta"]))):
        raise ValueError(f"edge contractions {plan.contraction_form.tolist()} do not fit the {form!r} edge kernel")


def gradient_terms(dev, module, plan, dt):
    """The GradientTerms argument (cuda_src/common/kernel_program.cuh) of a gradient launch of
    ``cuda_src/<module>.cu``: the derivative programs, the edge contractions and their programs,
    uploaded once per plan, device and type (every launch of a call reads the same)."""
    key = dev.ordinal, module, np.dtype(dt).str
    terms = plan.device_terms.get(key)
    if terms is None:
        terms = plan.device_terms[key] = _gradient_terms(dev, module, plan, dt)
    return terms


def _gradient_terms(dev, module, plan, dt):
    nd, ct = plan.node_programs, plan.contraction_programs
    return rt.layout(dev, module, f"terms_{rt.precision(dt)}").pack(
        n_node=len(nd), ncode=rt.to_device(dev, nd.code), npar=rt.to_device(dev, nd.params.astype(dt)),
        ncode_off=rt.to_device(dev, nd.code_off), npar_off=rt.to_device(dev, nd.param_off),
        n_contractions=plan.n_contractions, cform=rt.to_device(dev, _nonempty(plan.contraction_form)),
        ctheta=rt.to_device(dev, _nonempty(plan.contraction_theta.astype(dt))),
        caux=rt.to_device(dev, _nonempty(plan.contraction_aux.astype(dt))),
        ccode=rt.to_device(dev, ct.code), cpar=rt.to_device(dev, ct.params.astype(dt)),
        ccode_off=rt.to_device(dev, ct.code_off), cpar_off=rt.to_device(dev, ct.param_off),
        cfree=rt.to_device(dev, _nonempty(plan.contraction_free)), ccode_len=len(ct.code),
        cpar_len=len(ct.params), n_raw=plan.n_raw)


def _check_written(K, iters, m):
    # min and max carry a NaN through: three reductions, no per-pair masks
    if m and not (np.isfinite(K.min()) and np.isfinite(K.max()) and iters.min() >= 0):
        raise RuntimeError(f"the GPU solver left {int(np.sum(~np.isfinite(K)))} of {m} pairs unwritten")


def pair_positions(order):
    """Each pair's place in the launch (the inverse permutation: ``positions[order[k]] = k``)."""
    m = len(order)
    return pairs.scatter(np.empty(m, dtype=np.int64), order, np.arange(m, dtype=np.int64))


def in_pair_order(values, order, positions=None):
    """Per-pair host arrays of one launch (in launch ``order``) in the caller's pair order, gathered
    through the pairs' ``positions`` in the launch (:func:`pair_positions`, computed here when not
    given: the gathers write in order, which costs less than scattered writes)."""
    positions = pair_positions(order) if positions is None else positions
    return [pairs.take(v, positions) for v in values]


def nodal_blocks(flat, nodal_off, order, n1, n2):
    """The nodal matrices of a launch (block k_sorted of its flat output, read back, is pair
    order[k_sorted]) in pair order."""
    blocks = [None] * len(order)
    for k_sorted, k in enumerate(order.tolist()):
        blocks[k] = flat[nodal_off[k_sorted]:nodal_off[k_sorted + 1]].reshape(int(n1[k]), int(n2[k])).copy()
    return blocks


def timed_launch(dev, fn, n_blocks, threads, args, shared):
    """One launch; the kernel's seconds (CUDA events)."""
    start, end = rt.Event(dev), rt.Event(dev)
    start.record()
    rt.launch(fn, n_blocks, threads, args, shared_mem=shared)
    end.record()
    return start.elapsed_ms(end) / 1e3


def solve_outputs(dev, module, launch, order, n1, n2, dt, nodal, positions=None):
    """The per-pair outputs of a K launch of ``cuda_src/<module>.cu``: allocated poisoned, passed to
    ``launch(outputs)`` (which returns the kernel's seconds) as its SolveOutputs argument (K,
    iterations, residuals, nodal buffer, nodal offsets), read back in pair order.  ``order`` is the launch order of the pairs,
    ``n1``, ``n2`` their graphs' sizes (read only with ``nodal``).  Returns (K, iterations, residuals,
    nodal blocks or None, seconds); ``positions``: :func:`pair_positions` of ``order`` where known."""
    m = len(order)
    nodal_off = None
    if nodal:
        nodal_off = np.concatenate([[0], np.cumsum((n1.astype(np.int64) * n2)[order])]).astype(np.int64)
    outputs = PairOutputs(dev, [(m, np.float64), (m, np.int32), (m, np.float64)]
                          + ([(max(int(nodal_off[-1]), 1), dt)] if nodal else []))
    d_k, d_it, d_res, *d_nodal = outputs.views
    seconds = launch(rt.layout(dev, module, f"out_{rt.precision(dt)}").pack(
        k=d_k, iterations=d_it, residuals=d_res, nodal=d_nodal[0] if nodal else None,
        nodal_off=rt.to_device(dev, nodal_off) if nodal else None))
    K, iters, resid, *flat = outputs.read()
    K, iters, resid = in_pair_order((K, iters, resid), order, positions)
    _check_written(K, iters, m)
    blocks = nodal_blocks(flat[0], nodal_off, order, n1, n2) if nodal else None
    return K, iters, resid, blocks, seconds


def gradient_outputs(dev, module, launch, order, plan, solver):
    """The per-pair outputs of a gradient launch of ``cuda_src/<module>.cu``, like
    :func:`solve_outputs`: ``launch(outputs)`` gets the GradientOutputs argument (K, iterations,
    residuals, adjoint iterations, adjoint residuals, raw derivatives (m x plan.n_raw)).  Returns those in pair order and the
    kernel's seconds; ``solver`` names the solver in the error for unwritten derivatives."""
    m = len(order)
    outputs = PairOutputs(dev, [(m, np.float64), (m, np.int32), (m, np.float64), (m, np.int32), (m, np.float64),
                                (max(m * plan.n_raw, 1), np.float64)])
    d_k, d_it, d_res, d_adj_it, d_adj_res, d_grad = outputs.views
    seconds = launch(rt.layout(dev, module, "gradient_out").pack(
        k=d_k, iterations=d_it, residuals=d_res, adjoint_iterations=d_adj_it, adjoint_residuals=d_adj_res,
        gradient=d_grad))
    *per_pair, grad = outputs.read()
    K, iters, resid, adj_iters, adj_resid = in_pair_order(per_pair, order)
    raw = np.empty((m, plan.n_raw))
    raw[order] = grad[:m * plan.n_raw].reshape(m, plan.n_raw)
    _check_written(K, np.minimum(iters, adj_iters), m)
    if not np.all(np.isfinite(raw)):
        raise RuntimeError(f"the {solver} left {int(np.sum(~np.isfinite(raw)))} of {raw.size} derivatives "
                           "unwritten")
    return K, iters, resid, adj_iters, adj_resid, raw, seconds


class GPUEngine:
    """Runs the core CUDA solver (cuda_src/mgk.cu) over a list of pairs on one device: every pair, K,
    nodal matrices and gradients."""

    name = "gpu"

    def __init__(self, ordinal, s):
        self.dev = rt.get_device(ordinal)
        self.s = s

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=False):
        """Every pair."""
        return np.ones(len(pair_arr), dtype=bool)

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        dt = self.s["dtype"]
        dev = self.dev
        launch = _Launch(self, ds1, ds2, pair_arr, args, "mgk_solve", vectors="vectors", slices=1, extra_shared=0,
                         out_bytes_per_pair=8 + 4 + 8, out_values_per_vertex_pair=1 if nodal else 0)
        if launch.m == 0:
            return empty_result(nodal, launch.tile_pairs)
        K, iters, resid, blocks, seconds = solve_outputs(
            dev, "mgk", lambda outputs: launch.run(dev, (outputs,)), launch.order, ds1.n_nodes[launch.g1],
            ds2.n_nodes[launch.g2], dt, nodal)
        return Solved(K=K, iterations=iters, residuals=resid, nodal=blocks, octile_pairs=launch.tile_pairs,
                      seconds=seconds)

    def solve_gradient(self, ds1, ds2, pair_arr, args, plan):
        """K and the raw derivatives of :class:`graphkern.mgk.gradient.GradientPlan` for each pair."""
        dt = self.s["dtype"]
        dev = self.dev
        ct = plan.contraction_programs
        launch = _Launch(self, ds1, ds2, pair_arr, args, "mgk_gradient", vectors="gradient_vectors", slices=2,
                         extra_shared=len(ct.params) * dt.itemsize + ct.code.nbytes,
                         out_bytes_per_pair=2 * (8 + 4 + 8) + 8 * plan.n_raw)
        if launch.m == 0:
            return empty_result(False, launch.tile_pairs, plan.n_raw)
        check_contractions(plan, launch.args)
        terms = gradient_terms(dev, "mgk", plan, dt)
        K, iters, resid, adj_iters, adj_resid, raw, seconds = gradient_outputs(
            dev, "mgk", lambda outputs: launch.run(dev, (terms, outputs)), launch.order, plan, "GPU solver")
        return gradient_result(K, iters, resid, adj_iters, adj_resid, raw, launch.tile_pairs, seconds)
