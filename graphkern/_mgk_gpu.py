"""GPU backend of the marginalized graph kernel: uploads octile datasets once, launches cuda_src/mgk.cu.

One launch solves every pair of a call: a warp per pair (grid-stride over the pairs, which
are ordered by decreasing cost so that the long ones start first), CG vectors in a global
scratch slot per resident warp.  Datasets are uploaded once per device and kept on the
:class:`~graphkern._mgk_data.MGKDataset`, so a new call with other hyperparameters only
ships the programs and the pair list.
"""

from __future__ import annotations

import numpy as np

from graphkern._cuda import runtime as rt
from graphkern._mgk_data import _nonempty
from graphkern.errors import GraphTooLargeError

WARPS_PER_BLOCK = 4           # cuda_src/mgk.cu: kWarpsPerBlock
THREADS_PER_BLOCK = 32 * WARPS_PER_BLOCK
MAX_PARAMS = 96               # cuda_src/mgk.cu: kMaxParams (per program)
N_VECTORS = 5                 # x, r, p, Ap, diagonal
OCTILE_SIZE = 64
# Leave room for other users of the device: the scratch takes at most this share of free memory.
SCRATCH_SHARE = 0.6

_STAGED_CHANNELS = {"constant": 1, "kronecker": 2, "sqexp": 2}


def device_dataset(dev, ds):
    """The dataset's arrays on ``dev`` (uploaded on first use, then reused)."""
    copy = ds.device_copies.get(dev.ordinal)
    if copy is not None:
        return copy
    oc = ds.octiles
    host = {
        "node_off": ds.node_offsets,
        "rowptr_off": _nonempty(oc.rowptr_offset),
        "tile_rowptr": oc.tile_rowptr,
        "tile_col": _nonempty(oc.tile_col),
        "tile_val": _nonempty(oc.values.reshape(-1)),
        "degree": ds.degree,
        "node_feat": ds.node_features,
    }
    rt.check_fits(dev, sum(a.nbytes for a in host.values()), f"the octiles of {ds.n_graphs} graphs")
    copy = {k: rt.to_device(dev, v) for k, v in host.items()}
    copy["n_feat"] = np.int32(ds.node_features.shape[1])
    copy["channels"] = np.int32(oc.channels)
    ds.device_copies[dev.ordinal] = copy
    return copy


def _set_args(copy):
    return (copy["node_off"], copy["rowptr_off"], copy["tile_rowptr"], copy["tile_col"], copy["tile_val"],
            copy["degree"], copy["node_feat"], copy["n_feat"], copy["channels"])


class GPUEngine:
    """Runs the CUDA solver over a list of pairs on one device."""

    name = "gpu"

    def __init__(self, ordinal, s):
        self.dev = rt.get_device(ordinal)
        self.s = s

    def solve(self, ds1, ds2, pair_arr, *, nodal):
        from graphkern.mgk import _Solved, solver_arguments

        s = self.s
        dt = s["dtype"]
        T = dt.type
        dev = self.dev
        m = len(pair_arr)
        args = solver_arguments(ds1, ds2, s)
        g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
        g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
        sizes = ds1.n_nodes[g1] * ds2.n_nodes[g2]
        tile_pairs = ds1.octiles.tiles_per_graph()[g1] * ds2.octiles.tiles_per_graph()[g2]
        if m == 0:
            return _Solved(K=np.zeros(0), iterations=np.zeros(0, np.int32), residuals=np.zeros(0),
                           nodal=[] if nodal else None, octile_pairs=tile_pairs, seconds=0.0)
        if len(args["nparam"]) > MAX_PARAMS or len(args["eparam"]) > MAX_PARAMS:
            raise ValueError(f"a kernel program has more than {MAX_PARAMS} parameters")

        set1 = _set_args(device_dataset(dev, ds1))
        set2 = set1 if ds2 is ds1 else _set_args(device_dataset(dev, ds2))

        # Longest pairs first: with a static grid-stride order they would otherwise finish last.
        order = np.argsort(-(tile_pairs.astype(np.float64) * 64 + sizes), kind="stable")
        form = args["form_name"]
        fn = rt.kernel(dev, "mgk", f"mgk_solve_{form}_{'f32' if dt == np.float32 else 'f64'}")
        staged = _STAGED_CHANNELS.get(form, ds1.octiles.channels)
        code = np.concatenate([args["ncode"], args["ecode"]]).astype(np.int32)
        params = np.concatenate([args["nparam"], args["eparam"]]).astype(dt)
        shared = ((2 * MAX_PARAMS + WARPS_PER_BLOCK * (2 * staged + 1) * OCTILE_SIZE) * dt.itemsize
                  + code.nbytes)
        limit = dev.properties.get("max_shared_memory_per_block_optin", 48 * 1024)
        if shared > limit:
            raise ValueError(f"the edge kernel reads {staged - 1} feature values per edge, whose octiles need "
                             f"{shared} bytes of shared memory per block; device {dev.ordinal} allows {limit}")
        if shared > 48 * 1024:
            fn.set_max_dynamic_shared_memory(shared)
        stride = int(-(-int(sizes.max()) // 32) * 32)

        nodal_off = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int64) if nodal else None
        out_bytes = m * (8 + 4 + 8) + (int(nodal_off[-1]) * dt.itemsize if nodal else 0)
        per_warp = N_VECTORS * stride * dt.itemsize
        free, _ = dev.memory_info()
        sms = dev.properties["multiprocessor_count"]
        resident = sms * max(1, fn.max_active_blocks_per_sm(THREADS_PER_BLOCK, shared))
        blocks = min(-(-m // WARPS_PER_BLOCK), resident)
        affordable = int((free - out_bytes) * SCRATCH_SHARE // (per_warp * WARPS_PER_BLOCK))
        if affordable < 1:
            raise GraphTooLargeError(
                f"the CG vectors of one block of pairs need {per_warp * WARPS_PER_BLOCK / 2**30:.2f} GiB "
                f"(largest product graph: {int(sizes.max())} vertex pairs) plus {out_bytes / 2**30:.2f} GiB of "
                f"results on device {dev.ordinal}, but only {free / 2**30:.2f} GiB is free")
        blocks = min(blocks, affordable)
        rt.check_fits(dev, blocks * WARPS_PER_BLOCK * per_warp + out_bytes, "the CG work vectors and results")

        scratch = rt.alloc(dev, blocks * WARPS_PER_BLOCK * N_VECTORS * stride, dt)
        d_g1 = rt.to_device(dev, g1[order])
        d_g2 = rt.to_device(dev, g2[order])
        d_code = rt.to_device(dev, code)
        d_params = rt.to_device(dev, params)
        d_k = rt.alloc(dev, m, np.float64)
        d_it = rt.alloc(dev, m, np.int32)
        d_res = rt.alloc(dev, m, np.float64)
        for buf in (d_k, d_res):
            buf.memset32(0xFFFFFFFF)  # NaN: a pair the kernel never wrote shows up
        d_it.memset32(0xFFFFFFFF)
        if nodal:
            d_nodal = rt.alloc(dev, max(int(nodal_off[-1]), 1), dt)
            d_nodal_off = rt.to_device(dev, nodal_off)
        else:
            d_nodal = d_nodal_off = None

        start, end = rt.Event(dev), rt.Event(dev)
        start.record()
        rt.launch(fn, blocks, THREADS_PER_BLOCK,
                  set1 + set2 + (d_g1, d_g2, np.int64(m), d_code, d_params,
                                 np.int32(len(args["ncode"])), np.int32(len(args["nparam"])),
                                 np.int32(len(args["ecode"])), np.int32(len(args["eparam"])),
                                 T(args["ek_scale"]), T(args["ek_theta"]), T(args["ek_aux"]),
                                 np.int32(1 + args["ek_slot"]), T(s["q"]), T(s["p"] * s["p"]),
                                 np.float64(s["tol"]), np.int32(s["max_iter"]), scratch, np.int64(stride),
                                 d_k, d_it, d_res, d_nodal, d_nodal_off),
                  shared_mem=shared)
        end.record()
        seconds = start.elapsed_ms(end) / 1e3

        K = np.empty(m)
        iters = np.empty(m, dtype=np.int32)
        resid = np.empty(m)
        K[order] = d_k.to_host()
        iters[order] = d_it.to_host()
        resid[order] = d_res.to_host()
        if not (np.all(np.isfinite(K)) and np.all(iters >= 0)):
            raise RuntimeError(f"the GPU solver left {int(np.sum(~np.isfinite(K)))} of {m} pairs unwritten")
        blocks_out = None
        if nodal:
            flat = d_nodal.to_host()
            blocks_out = [None] * m
            for k_sorted, k in enumerate(order.tolist()):
                lo, hi = nodal_off[k_sorted], nodal_off[k_sorted + 1]
                blocks_out[k] = flat[lo:hi].reshape(ds1.n_nodes[g1[k]], ds2.n_nodes[g2[k]]).copy()
        return _Solved(K=K, iterations=iters, residuals=resid, nodal=blocks_out, octile_pairs=tile_pairs,
                       seconds=seconds)
