"""The CPU engine of the marginalized graph kernel: runs the Cython OpenMP solver (graphkern._cpu.mgk)."""

from __future__ import annotations

import time

import numpy as np

from graphkern._cpu import mgk as cpu_mgk
from graphkern.mgk.results import Solved, gradient_result

__all__ = ["CPUEngine"]


class CPUEngine:
    """Solves a list of pairs with ``n_threads`` OpenMP threads (K, nodal matrices and gradients)."""

    name = "cpu"
    #: pairs per Cython call while progress is shown (one call otherwise)
    progress_chunk = 2048

    def __init__(self, n_threads, s):
        self.n_threads = n_threads
        self.s = s

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=False):
        """Every pair."""
        return np.ones(len(pair_arr), dtype=bool)

    def _arguments(self, ds1, ds2, pair_arr, args):
        """``(g1, g2, arguments)``: the pairs' graph indices and the argument list both Cython entry
        points begin with (the two sets, the pairs, the programs, the hyperparameters)."""
        s = self.s
        dt = s["dtype"]
        g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
        g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
        return g1, g2, (ds1.node_offsets, ds1.rowptr, ds1.indices, ds1.weights, ds1.degree, ds1.node_features,
                        ds1.edge_features,
                        ds2.node_offsets, ds2.rowptr, ds2.indices, ds2.weights, ds2.degree, ds2.node_features,
                        ds2.edge_features,
                        g1, g2, args["ncode"], args["nparam"].astype(dt), args["ecode"], args["eparam"].astype(dt),
                        args["edge_form"], args["ek_scale"], args["ek_theta"], args["ek_aux"], args["ek_slot"],
                        s["q"], s["tol"], s["max_iter"], s["p"])

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        dt = self.s["dtype"]
        m = len(pair_arr)
        g1, g2, arguments = self._arguments(ds1, ds2, pair_arr, args)
        K = np.zeros(m)
        iters = np.zeros(m, dtype=np.int32)
        resid = np.zeros(m)
        sizes = ds1.n_nodes[g1] * ds2.n_nodes[g2] if nodal else ()  # without nodal: one unused element
        nodal_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        nodal_buf = np.zeros(max(int(nodal_off[-1]), 1), dtype=dt)
        t0 = time.perf_counter()
        cpu_mgk.solve_pairs(*arguments, K, iters, resid, nodal_buf, nodal_off, bool(nodal), self.n_threads)
        seconds = time.perf_counter() - t0
        blocks = [nodal_buf[nodal_off[k]:nodal_off[k + 1]].reshape(ds1.n_nodes[g1[k]], ds2.n_nodes[g2[k]]).copy()
                  for k in range(m)] if nodal else None
        return Solved(K=K, iterations=iters, residuals=resid, nodal=blocks, octile_pairs=None, seconds=seconds)

    def solve_gradient(self, ds1, ds2, pair_arr, args, plan):
        """K and the raw derivatives of :class:`graphkern.mgk.gradient.GradientPlan` for each pair."""
        dt = self.s["dtype"]
        m = len(pair_arr)
        _, _, arguments = self._arguments(ds1, ds2, pair_arr, args)
        K = np.zeros(m)
        iters, adj_iters = np.zeros(m, dtype=np.int32), np.zeros(m, dtype=np.int32)
        resid, adj_resid = np.zeros(m), np.zeros(m)
        raw = np.zeros((m, plan.n_raw))
        nd, ct = plan.node_programs, plan.contraction_programs
        t0 = time.perf_counter()
        cpu_mgk.solve_pairs_gradient(
            *arguments,
            nd.code, nd.params.astype(dt), nd.code_off, nd.param_off,
            plan.contraction_form, plan.contraction_theta, plan.contraction_aux, plan.contraction_slot,
            ct.code, ct.params.astype(dt), ct.code_off, ct.param_off, plan.contraction_free,
            K, iters, resid, adj_iters, adj_resid, raw, self.n_threads)
        return gradient_result(K, iters, resid, adj_iters, adj_resid, raw, None, time.perf_counter() - t0)
