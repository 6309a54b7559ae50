"""The CPU path of the pairwise shortest-path kernel: the dense walk's length matrices and the call
into graphkern/_cpu/spgk.pyx (methods naive, fcsp, openmp_in, openmp_out)."""

from __future__ import annotations

import numpy as np

CPU_METHODS = ("naive", "fcsp", "openmp_in", "openmp_out")
# the CPU methods the dense walk applies to (cpu_walk=), and its length kernels (Dirac, Brownian)
DENSE_METHODS = ("fcsp", "openmp_out")
DENSE_EDGES = (0, 2)
CPU_WALKS = ("auto", "edges", "dense")
_WALK_MODES = {"edges": 0, "auto": 1, "dense": 2}


def dense_auto():
    from graphkern._cpu import spgk as cpu

    return cpu.dense_auto()


# the dense walk's length matrices of one batch take at most this much memory (beyond, the
# remaining graphs keep the edge walk)
_DENSE_BUDGET = 256 << 20


def dense_ld(n):
    """The dense walk's row length for graphs of ``n`` vertices (an array): n rounded up to the row
    alignment."""
    from graphkern._cpu import spgk as cpu

    align = cpu.dense_layout()[0]
    return -(-n // align) * align


def dense_lengths(batch, walk):
    """``(offsets, lengths)`` of the dense walk (graphkern/_cpu/spgk.pyx): for each graph of at
    most DENSE_MAX_NODES vertices -- with ``walk`` "auto" only those whose rows can cost less
    than their paths (cost n ld <= P, cost from graphkern._cpu.spgk.dense_layout(); otherwise
    "auto" never takes them as the inner graph) -- an n x ld matrix of path lengths, +inf where
    there is none, offset -1 for the others."""
    from graphkern._cpu import spgk as cpu

    _, max_nodes, cost = cpu.dense_layout()
    n = batch.n_nodes.astype(np.int64)
    ld = dense_ld(n)
    size = n * ld
    want = (n <= max_nodes) & (n > 0) & (batch.n_paths > 0)
    if walk == "auto":
        want &= cost * size <= batch.n_paths
    size = np.where(want, size, 0)
    keep = want & (np.cumsum(size) <= _DENSE_BUDGET)
    size = np.where(keep, size, 0)
    starts = np.cumsum(size) - size
    offsets = np.where(keep, starts, -1).astype(np.int64)
    dense = np.full(int(size.sum()), np.inf)
    graph_of_path = np.repeat(np.arange(len(n)), batch.n_paths)
    on = keep[graph_of_path]
    g = graph_of_path[on]
    a = batch.ends[on, 0].astype(np.int64)
    b = batch.ends[on, 1].astype(np.int64)
    dense[starts[g] + a * ld[g] + b] = batch.lengths[on]
    dense[starts[g] + b * ld[g] + a] = batch.lengths[on]
    return offsets, dense


def run_cpu(method, A, B, pa, pb, edge_kernel, n_threads, dtype, walk="edges"):
    from graphkern._cpu import spgk as cpu

    out = np.empty(len(pa))
    if len(pa) == 0:
        return out
    if method not in DENSE_METHODS or edge_kernel.code not in DENSE_EDGES or (walk == "auto" and not cpu.dense_auto()):
        walk = "edges"
    if method == "naive":
        stride, copies = 0, 0
    else:
        n1, n2 = A.n_nodes[pa].astype(np.int64), B.n_nodes[pb].astype(np.int64)
        stride = int((n1 * n2).max())
        if walk != "edges":
            stride = max(stride, int((n1 * dense_ld(n2)).max()), int((n2 * dense_ld(n1)).max()))
        copies = n_threads if method == "openmp_out" else 1
    scratch = np.empty(max(stride * copies, 1), dtype=dtype)
    cpu.kernel_pairs(method, A.cpu(method == "naive", walk), B.cpu(method == "naive", walk),
                     np.ascontiguousarray(pa, np.int64), np.ascontiguousarray(pb, np.int64), out,
                     np.ascontiguousarray(A.weights, np.float64), edge_kernel.code, edge_kernel.parameter,
                     scratch, stride, n_threads, _WALK_MODES[walk])
    return out
