"""The GEMM GPU solver of the marginalized graph kernel for dense graphs (``techniques="gemm"``): cuda_src/mgk_gemm.cu.

The octile and CSR solvers evaluate the edge kernel once per pair of stored entries: nnz1 nnz2
terms per XMV (67M for two 96-vertex graphs of density 0.9).  When the edge kernel is a
constant or ``scale * KroneckerDelta(h)`` of one edge-label column
(:meth:`graphkern.basekernels.KernelProgram.edge_form` ``("constant", c)`` or ``("kronecker",
scale, h, column)``), the product-graph operator factorizes exactly: with X the ``n1 x n2``
matrix of a product vector and W^c the entries of W whose edge label is category c,

    (A1 (x) A2 (.) E) vec(X)  =  scale [h W1 X W2^T + (1 - h) sum_c W1^c X W2^cT],

a sum of T terms ``alpha L X R^T`` over masked adjacency matrices.  :func:`pair_terms` picks the
fewest: 1 for a constant kernel; for the Kronecker delta ``min(1 + common categories,
categories of G1, categories of G2)`` (regrouping the sum over one graph's categories, each term
``W1^c X (h W2 + (1 - h) W2^c)^T``); only the common ones when h = 0.  A term is two small dense
GEMMs, ``2 (n1^2 n2 + n1 n2^2)`` flops: 10.6 MFLOP per XMV for the 96-vertex dense set with 3
edge categories (T = 3), where the element-wise solvers evaluate 67M edge-kernel terms.

The kernel (its header comment has the details) solves a pair per block of 16 x 16 threads with
the other GPU solvers' preconditioned CG (same system, preconditioner, stopping rule, float64
scalars, nodal output), each thread owning an R x R register tile of the n1 x n2 output; the
entry point of tile R takes pairs with ``max(n1, n2) <= 16 R`` (R <= 8 in float32, <= 6 in
float64: three ``16 R x 16 R`` arrays of shared memory per block).  Its data (:class:`GemmData`,
built on the host once per dataset and edge-label column, uploaded once per device):

* per graph the dense weights, transposed (``wt[k n4 + a] = W[a][k]``, rows of ``n4`` = n
  rounded up to 4 for 16-byte loads), and the same layout of each entry's *local* category
  (the index of its label among the graph's sorted distinct labels, uint8): the masks of the
  terms are applied while an operand is staged into shared memory, so one copy of W serves
  every category;
* per graph its sorted category codes (at most :data:`MAX_CATEGORIES`), from which the kernel
  forms a pair's terms;
* vertex degrees and features in the caller's numbering (no renumbering: the nodal matrices
  come out as they are).

Dense layouts are built only for graphs that some pair routed here needs (grown on demand), so a
sparse data set that never reaches this solver costs nothing but its category lists.

Routing (:func:`route_pairs`): a pair runs here when the edge form is constant or Kronecker on
a scalar column, both graphs fit a tile, each has at most :data:`MAX_CATEGORIES` edge
categories, and -- under ``techniques="auto"`` -- :func:`gemm_wins`: the GEMM's work per XMV,
``T ((LD^2 + 4 LD)(n1 + n2) + 65536)`` FMA-equivalents (``LD = 16 R``, the padded side; then the
operand staging, and a term's fixed cost, :data:`TERM_OVERHEAD_FMAS`) plus ``4 n1 n2`` for the
vector updates, is at most :data:`CSR_ENTRY_PAIR_FMAS` times the CSR solver's ``nnz1 nnz2``
entry pairs (the constant's comment says where its value comes from).  At 96 vertices a pair
comes here from a density of ~0.04 with one term (a constant edge kernel) and ~0.075 with three;
molecules (~30 vertices, ~60 entries) stay on the CSR solver.  ``techniques="gemm"`` runs every
pair that fits here, whatever the cost.  graphkern.mgk.router gives the others to the next
solver; pairs whose dense layout or CG vectors do not fit the free device memory come back
declined, never raising :class:`~graphkern.errors.GraphTooLargeError` themselves.

Gradients (``eval_gradient=True``, :meth:`GEMMGPUEngine.solve_gradient`) run here for the pairs
this solver takes, under ``techniques="auto"`` too unless ``gemm_gradients=False`` (then the CSR
and core solvers take them; ``techniques="gemm"`` runs them here either way).  The gradient
kernels solve M x = b and the adjoint M y = 1 in one block, by ``gradient_solves``: one after
the other (mgk_gemm_gradient_seq_r<R>_*, the default), the adjoint from the warm start alpha x
with K's three ``16 R x 16 R`` arrays, or in lockstep (mgk_gemm_gradient_r<R>_*), each staged
operand of a term serving the GEMMs of both directions (two X and two Z matrices in shared
memory: five arrays, so R <= 6 in float32 and <= 4 in float64, :func:`gradient_shared_bytes`;
a converged side stops); the stopping rule, tolerances and the raw derivative columns are those
of the CSR gradient (graphkern/mgk/gradient.py): the vertex-kernel derivative programs and dK/dq
as diagonal sums, the free contractions as ``factor * y^T (D V^-1 x - b)``, the others as one
factorized XMV of x dotted with y (the Kronecker delta's derivative by h, ``1 - delta``, is
``W1 X W2^T`` minus the common categories' terms).

Cost floor: 10.6 MFLOP per pair-iteration of the 96-vertex dense set, 0.16 us of a GPU of
67 FP32 TFLOP/s.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

from graphkern._cuda import runtime as rt
from graphkern.errors import GraphTooLargeError
from graphkern.mgk.core import (SCRATCH_SHARE, align16, check_contractions, gradient_outputs, gradient_terms,
                                graph_sets, in_launch_order, launch_order, solve_outputs, timed_launch, uploaded)
from graphkern.mgk import csr as csr_solver
from graphkern.mgk.data import _nonempty
from graphkern.mgk.gradient import EDGE_FORMS
from graphkern.mgk.results import Solved, empty_result, gradient_result, merge_parts

__all__ = ["GEMM_TECHNIQUE", "GemmData", "gemm_data", "GEMMGPUEngine", "pair_terms",
           "term_counts", "contraction_terms", "tile_of", "shared_bytes", "gradient_shared_bytes", "gemm_work",
           "gemm_wins", "route_pairs", "xmv_flops", "MAX_CATEGORIES"]

#: the ``techniques=`` name of this solver
GEMM_TECHNIQUE = "gemm"
# What routing plans with (it runs, and is tested, without a device); the kernel module exports the
# same values and the engine checks them when it loads the module (graphkern._cuda.runtime.exports).
TILE_THREADS = 16           # a block is a TILE_THREADS x TILE_THREADS grid of threads
REDUCE_BYTES = 8 * 2 * 8    # its reduction slots: 8 warps x 2 doubles (the gradient's: x 4)
GRADIENT_REDUCE_BYTES = 8 * 4 * 8
MAX_CATEGORIES = 16         # edge categories per graph
MAX_TERMS = MAX_CATEGORIES
MAX_GRADIENT_TERMS = MAX_CATEGORIES + 1
TERM_BYTES = {4: 20, 8: 32}  # a staged term, by itemsize
MAX_TILE = {4: 8, 8: 6}     # the largest tile R with an entry point, by itemsize
MAX_GRADIENT_TILE = {4: 6, 8: 4}  # ... of the gradient entry points (five arrays of shared memory)
FORM_CODES = {"constant": 0, "kronecker": 1}
_PLANNED = {"tile_threads": TILE_THREADS, "reduce_bytes": REDUCE_BYTES, "gradient_reduce_bytes": GRADIENT_REDUCE_BYTES,
            "max_categories": MAX_CATEGORIES, "max_terms": MAX_TERMS, "max_gradient_terms": MAX_GRADIENT_TERMS,
            "term_bytes_f32": TERM_BYTES[4], "term_bytes_f64": TERM_BYTES[8], "max_tile_f32": MAX_TILE[4],
            "max_tile_f64": MAX_TILE[8], "max_gradient_tile_f32": MAX_GRADIENT_TILE[4],
            "max_gradient_tile_f64": MAX_GRADIENT_TILE[8], "form_constant": FORM_CODES["constant"],
            "form_kronecker": FORM_CODES["kronecker"]}
#: GEMM FMA-equivalents one entry pair of the CSR solver is worth (module docstring): the
#: crossover of the two solvers' per-pair-iteration times on dense and sparse labeled sets,
#: from graphkern-bench mgk (docs/performance.md)
CSR_ENTRY_PAIR_FMAS = 12
#: FMA-equivalents of a term's fixed cost: two stagings that each wait ~1000 cycles on L2 (half of
#: an SM's 128 FMA/cycle, the other resident block computing meanwhile) and four barriers
TERM_OVERHEAD_FMAS = 1 << 16
_CODE_BITS = 25             # category codes are below 2^24 (graphkern.basekernels)


def tile_of(n1, n2):
    """The tile R of pairs of sizes n1, n2: the smallest with ``16 R >= max(n1, n2)`` (arrays)."""
    n = np.maximum(np.asarray(n1, dtype=np.int64), np.asarray(n2, dtype=np.int64))
    return np.maximum(1, -(-n // TILE_THREADS))


def shared_bytes(itemsize, tile, ncode_len, nparam_len):
    """Dynamic shared memory of a block of tile R (mgk_gemm.cu: terms_end, the node program, Xs, Zt, op)."""
    return _block_bytes(itemsize, tile, ncode_len, nparam_len, REDUCE_BYTES, MAX_TERMS, 3)


def gradient_shared_bytes(itemsize, tile, ncode_len, nparam_len, directions=2):
    """... of a gradient block (mgk_gemm.cu: gemm_gradient; two X, two Z and the operand; with
    ``directions=1``, the sequential solves, one X and one Z)."""
    return _block_bytes(itemsize, tile, ncode_len, nparam_len, GRADIENT_REDUCE_BYTES, MAX_GRADIENT_TERMS,
                        5 if directions == 2 else 3)


def _block_bytes(itemsize, tile, ncode_len, nparam_len, reduce_bytes, max_terms, arrays):
    side = TILE_THREADS * np.asarray(tile, dtype=np.int64)
    header = (reduce_bytes + align16(max_terms * TERM_BYTES[itemsize]) + 16 + align16(nparam_len * itemsize)
              + align16(ncode_len * 4))
    return header + arrays * side * side * itemsize


def edge_shape(args):
    """``(form, scale, h)`` of the edge kernel this solver can factorize, or None.

    ``args``: :func:`graphkern.mgk.solver_arguments`.  A Kronecker delta with h = 1 is constant.
    """
    name = args["form_name"]
    if name == "constant":
        return "constant", float(args["ek_scale"]), 1.0
    if name == "kronecker":
        h = float(args["ek_theta"])
        return ("constant" if h == 1 else "kronecker"), float(args["ek_scale"]), h
    return None


def pair_terms(cats1, cats2, form, scale, h):
    """The terms ``(c1, c2, lam1, lam2, alpha)`` of one pair, as cuda_src/mgk_gemm.cu's pair_terms forms them.

    Term t is ``alpha L X R^T`` with ``L = W1 (cat1 == c1 ? 1 : lam1)`` and ``R = W2 (cat2 == c2 ?
    1 : lam2)``, c1 / c2 local category indices (-1: none).  ``cats1``, ``cats2``: the graphs'
    distinct category codes in local order.
    """
    if scale == 0:
        return []
    if form == "constant":
        return [(-1, -1, 1.0, 1.0, scale)]
    cats1, cats2 = list(cats1), list(cats2)
    in2 = [cats2.index(c) if c in cats2 else -1 for c in cats1]
    in1 = [cats1.index(c) if c in cats1 else -1 for c in cats2]
    common = sum(j >= 0 for j in in2)
    if h == 0:
        return [(i, j, 0.0, 0.0, scale) for i, j in enumerate(in2) if j >= 0]
    if 1 + common <= len(cats1) and 1 + common <= len(cats2):
        shared = [(i, j, 0.0, 0.0, scale * (1 - h)) for i, j in enumerate(in2) if j >= 0]
        return [(-1, -1, 1.0, 1.0, scale * h)] + shared
    if len(cats1) <= len(cats2):
        return [(i, j, 0.0, h, scale) for i, j in enumerate(in2)]
    return [(i, j, h, 0.0, scale) for j, i in enumerate(in1)]


def contraction_terms(cats1, cats2, contraction_form, theta):
    """The terms of an edge contraction's XMV, as cuda_src/mgk_gemm.cu's contraction_terms forms them.

    ``contraction_form``: graphkern.mgk.gradient.EDGE_FORMS' "constant" (the constant 1),
    "kronecker" (the base kernel ``theta + (1 - theta) delta``, scale 1) or "kronecker_derivative"
    (``1 - delta``: ``W1 X W2^T`` minus the terms of the common categories, at most
    ``1 + MAX_CATEGORIES`` terms).
    """
    if contraction_form == EDGE_FORMS["constant"]:
        return pair_terms(cats1, cats2, "constant", 1.0, 1.0)
    if contraction_form == EDGE_FORMS["kronecker"]:
        return pair_terms(cats1, cats2, "constant" if theta == 1 else "kronecker", 1.0, theta)
    if contraction_form != EDGE_FORMS["kronecker_derivative"]:
        raise ValueError(f"the GEMM solver has no contraction of form {contraction_form}")
    cats2 = list(cats2)
    common = [(i, cats2.index(c), 0.0, 0.0, -1.0) for i, c in enumerate(cats1) if c in cats2]
    return [(-1, -1, 1.0, 1.0, 1.0)] + common


def term_counts(form, scale, h, n_cats1, n_cats2, common):
    """The number of terms :func:`pair_terms` forms, for arrays of pairs."""
    n_cats1, n_cats2, common = (np.asarray(v, dtype=np.int64) for v in (n_cats1, n_cats2, common))
    shape = np.broadcast(n_cats1, n_cats2, common).shape
    if scale == 0:
        return np.zeros(shape, dtype=np.int64)
    if form == "constant":
        return np.ones(shape, dtype=np.int64)
    if h == 0:
        return np.broadcast_to(common, shape).copy()
    return np.minimum(1 + common, np.minimum(n_cats1, n_cats2))


def gemm_work(terms, n1, n2):
    """FMA-equivalents of one XMV and CG update of the kernel (module docstring), arrays of pairs."""
    terms, n1, n2 = (np.asarray(v, dtype=np.float64) for v in (terms, n1, n2))
    side = TILE_THREADS * tile_of(n1.astype(np.int64), n2.astype(np.int64)).astype(np.float64)
    return terms * ((side * side + 4 * side) * (n1 + n2) + TERM_OVERHEAD_FMAS) + 4 * n1 * n2


def gemm_wins(terms, n1, n2, nnz1, nnz2):
    """The cost rule of ``techniques="auto"``: the GEMM solver's work is at most the CSR solver's."""
    csr = CSR_ENTRY_PAIR_FMAS * np.asarray(nnz1, dtype=np.float64) * np.asarray(nnz2, dtype=np.float64)
    return gemm_work(terms, n1, n2) <= csr


def xmv_flops(terms, n1, n2):
    """The flops one XMV of the kernel performs on the unpadded matrices: ``2 T n1 n2 (n1 + n2)``."""
    terms, n1, n2 = (np.asarray(v, dtype=np.float64) for v in (terms, n1, n2))
    return 2 * terms * n1 * n2 * (n1 + n2)


class GemmData:
    """One dataset's graphs as cuda_src/mgk_gemm.cu reads them, for one edge-label column (``slot``;
    None for a constant edge kernel, which needs no categories).

    ``n_cats[g]``: graph g's distinct edge labels, ``codes[g, :n_cats[g]]`` their codes sorted
    (-1 beyond; graphs with more than :data:`MAX_CATEGORIES` keep only ``n_cats``), ``local``:
    each stored entry's index among its graph's codes.  The dense layout covers the graphs of
    ``included`` (:meth:`require` adds more); ``dense_off[g]`` is -1 for the others.
    """

    def __init__(self, ds, slot):
        self.ds = ds
        self.slot = slot
        n_graphs = ds.n_graphs
        n_entries = int(ds.entry_offsets[-1])
        self.graph_of_entry = np.repeat(np.arange(n_graphs, dtype=np.int64), ds.n_entries)
        self.codes = np.full((max(n_graphs, 1), MAX_CATEGORIES), -1, dtype=np.int32)
        if slot is None or n_entries == 0:
            self.n_cats = np.zeros(max(n_graphs, 1), dtype=np.int32)
            self.local = np.zeros(n_entries, dtype=np.int64)
        else:
            code = ds.edge_features[:n_entries, slot].astype(np.int64)
            key = (self.graph_of_entry << _CODE_BITS) | code
            uniq, inverse = np.unique(key, return_inverse=True)
            graph_of_uniq = uniq >> _CODE_BITS
            first = np.searchsorted(graph_of_uniq, np.arange(n_graphs))
            self.n_cats = _nonempty(np.bincount(graph_of_uniq, minlength=n_graphs).astype(np.int32))
            rank = np.arange(len(uniq)) - first[graph_of_uniq]
            keep = rank < MAX_CATEGORIES
            self.codes[graph_of_uniq[keep], rank[keep]] = uniq[keep] & ((1 << _CODE_BITS) - 1)
            self.local = rank[np.asarray(inverse).reshape(-1)]
        self.masks = _category_masks(self.codes)
        self.n4 = (ds.n_nodes.astype(np.int64) + 3) & ~3
        self.included = np.zeros(n_graphs, dtype=bool)
        self.dense_off = np.full(max(n_graphs, 1), -1, dtype=np.int64)
        self.wt = np.zeros(1, dtype=ds.dtype)
        self.cat = np.zeros(4, dtype=np.uint8)
        self.device_copies = {}

    def require(self, graphs):
        """Lay out the graphs of ``graphs`` (indices) too, if not yet; drops stale device copies."""
        graphs = np.asarray(graphs, dtype=np.int64)
        if np.all(self.included[graphs]):
            return
        self.included[graphs] = True
        ds = self.ds
        size = np.where(self.included, self.n4 * self.n4, 0)
        offsets = np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
        self.dense_off[:ds.n_graphs] = np.where(self.included, offsets, -1)
        total = int(size.sum())
        wt = np.zeros(max(total, 1), dtype=ds.dtype)
        cat = np.zeros(max(total, 4), dtype=np.uint8)
        g = self.graph_of_entry
        sel = self.included[g]
        n_entries = len(g)
        row_global = np.repeat(np.arange(int(ds.node_offsets[-1]), dtype=np.int64), np.diff(ds.rowptr))
        row = row_global[sel] - ds.node_offsets[g[sel]]
        col = ds.indices[:n_entries][sel].astype(np.int64)
        pos = offsets[g[sel]] + col * self.n4[g[sel]] + row  # wt[k n4 + a] = W[a][k]
        wt[pos] = ds.weights[:n_entries][sel]
        cat[pos] = np.minimum(self.local[sel], 255).astype(np.uint8)
        self.wt, self.cat = wt, cat
        self.device_copies = {}

    def on_device(self, dev):
        """The fields of the set's GemmSet (cuda_src/mgk_gemm_xmv.cuh) on ``dev`` (uploaded once per
        layout); GraphTooLargeError if they do not fit."""
        ds = self.ds
        host = dict(node_off=ds.node_offsets, degree=ds.degree, node_feat=ds.node_features, dense_off=self.dense_off,
                    wt=self.wt, cat=self.cat, cats=self.codes, n_cats=self.n_cats)
        return uploaded(self.device_copies, dev, host, f"the dense layout of {int(self.included.sum())} graphs",
                        dict(n_nfeat=ds.node_features.shape[1]))


def gemm_data(ds, slot):
    """The :class:`GemmData` of a packed dataset for edge-feature ``slot``, built on first use and kept on it."""
    cache = getattr(ds, "_gemm_solver_data", None)
    if cache is None:
        cache = ds._gemm_solver_data = {}
    data = cache.get(slot)
    if data is None:
        data = cache[slot] = GemmData(ds, slot)
    return data


def _category_masks(codes):
    """Each graph's category codes as bits of a uint64 (None when a code passes 63)."""
    if codes.max(initial=-1) >= 64:
        return None
    bits = np.where(codes >= 0, np.left_shift(np.uint64(1), np.maximum(codes, 0).astype(np.uint64)), np.uint64(0))
    return np.bitwise_or.reduce(bits, axis=1)


def _common_categories(d1, d2, g1, g2):
    """How many category codes graphs d1[g1[k]] and d2[g2[k]] share (arrays of pairs; only
    meaningful for graphs of at most MAX_CATEGORIES categories)."""
    if d1.masks is not None and d2.masks is not None and hasattr(np, "bitwise_count"):  # NumPy 2: the usual case
        return np.bitwise_count(d1.masks[g1] & d2.masks[g2]).astype(np.int64)
    codes1, codes2 = d1.codes[g1], d2.codes[g2]
    common = np.zeros(len(g1), dtype=np.int64)
    for c in range(MAX_CATEGORIES):  # codes are distinct within a graph; -1 pads never match (codes >= 0)
        col = codes1[:, c:c + 1]
        common += np.any((codes2 == col) & (col >= 0), axis=1)
    return common


def _cost_candidates(ds1, ds2, pair_arr):
    """Indices of the pairs that may pass :func:`gemm_wins` when their kernel forms at least one term.

    Such a pair costs at least :data:`TERM_OVERHEAD_FMAS` plus ``side^2 (n1 + n2) >= n1 n2 (n1 + n2)``
    FMA-equivalents here, so it needs ``CSR_ENTRY_PAIR_FMAS nnz1 nnz2`` above both.  The test
    depends on (n, nnz) only: it runs on the grid of the distinct (n, nnz) of both sets first,
    and reaches the pairs only where some combination passes.
    """
    def signatures(ds):
        sig, inv = np.unique(np.stack([ds.n_nodes, ds.n_entries], axis=1), axis=0, return_inverse=True)
        return sig.astype(np.float64), inv.reshape(-1)

    (s1, inv1), (s2, inv2) = signatures(ds1), signatures(ds2)
    n1, e1, n2, e2 = s1[:, :1], s1[:, 1:], s2[:, 0], s2[:, 1]
    work = CSR_ENTRY_PAIR_FMAS * e1 * e2
    ok = (work > TERM_OVERHEAD_FMAS) & (work >= n1 * n2 * (n1 + n2))
    if not ok.any():
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(ok[inv1[pair_arr[:, 0]], inv2[pair_arr[:, 1]]])


def route_pairs(ds1, ds2, pair_arr, s, args, *, shared_limit, by_cost, gradient=False):
    """Which pairs this solver takes, and how.

    Returns a namespace: ``take`` (bool per pair), ``tile`` (R per pair), ``terms`` (the kernel forms
    them; 0 where not taken), ``shape`` (:func:`edge_shape`) and the two :class:`GemmData`
    (None when the edge kernel does not factorize).  ``by_cost``: apply :func:`gemm_wins`
    (``techniques="auto"``); else every pair that fits.  ``gradient``: for the gradient entry
    points (their tiles and shared memory; a Kronecker delta with h = 1 keeps its categories,
    which the contraction of its derivative by h needs).  ``args``: the call's solver arguments.
    """
    dt = np.dtype(s["dtype"])
    m = len(pair_arr)
    g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
    g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
    n1, n2 = ds1.n_nodes[g1], ds2.n_nodes[g2]
    tile = tile_of(n1, n2)
    none = SimpleNamespace(take=np.zeros(m, dtype=bool), tile=tile, terms=np.zeros(m, dtype=np.int64), shape=None,
                           data=(None, None), g1=g1, g2=g2)
    shape = edge_shape(args)
    if shape is None or m == 0:
        return none
    form, scale, h = shape
    labeled = form == "kronecker" or (gradient and args["form_name"] == "kronecker")
    slot = int(args["ek_slot"]) if labeled else None
    d1 = gemm_data(ds1, slot)
    d2 = d1 if ds2 is ds1 else gemm_data(ds2, slot)
    if gradient:
        directions = csr_solver.gradient_entry(s["gradient_solves"])[1]
        need = gradient_shared_bytes(dt.itemsize, tile, len(args["ncode"]), len(args["nparam"]), directions)
        max_tile = MAX_GRADIENT_TILE
    else:
        need = shared_bytes(dt.itemsize, tile, len(args["ncode"]), len(args["nparam"]))
        max_tile = MAX_TILE
    take = (tile <= max_tile[dt.itemsize]) & (need <= shared_limit)
    if labeled:
        nc1, nc2 = d1.n_cats[g1], d2.n_cats[g2]
        take &= (nc1 <= MAX_CATEGORIES) & (nc2 <= MAX_CATEGORIES)
    if form == "kronecker":
        terms = term_counts(form, scale, h, nc1, nc2, _common_categories(d1, d2, g1, g2))
    else:
        terms = term_counts(form, scale, h, 0, 0, 0)
    if by_cost:
        take &= gemm_wins(terms, n1, n2, ds1.n_entries[g1], ds2.n_entries[g2])
    return SimpleNamespace(take=take, tile=tile, terms=np.where(take, terms, 0), shape=shape, data=(d1, d2),
                           g1=g1, g2=g2)


class GEMMGPUEngine:
    """Runs cuda_src/mgk_gemm.cu over the pairs it takes (:func:`route_pairs`) on one device.
    ``by_cost``: take only the pairs where :func:`gemm_wins` (``techniques="auto"``).  Pairs whose
    dense layout or CG vectors do not fit the free device memory come back ``declined`` (the
    router gives them to the next solver).  ``last_run``: of the last solve, the pairs run here,
    the terms per pair (0 = not here) and the kernels' seconds.
    """

    name = "gpu"

    def __init__(self, ordinal, s, *, by_cost=False):
        self.dev = rt.get_device(ordinal)
        self.s = s
        self.by_cost = by_cost
        self.last_run = None
        # the route :meth:`accepts` made of a whole pair array, for the solve of that same array
        self._accepted = None

    def route(self, ds1, ds2, pair_arr, args, *, gradient=False, by_cost=None):
        by_cost = self.by_cost if by_cost is None else by_cost
        key = (ds1, ds2, pair_arr, args, gradient)
        held, self._accepted = self._accepted, None
        if not by_cost and held is not None and all(a is b for a, b in zip(held[0], key)):
            return held[1]
        return route_pairs(ds1, ds2, pair_arr, self.s, args, shared_limit=csr_solver.shared_memory_limit(self.dev),
                           by_cost=by_cost, gradient=gradient)

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=None):
        """The pairs this solver takes (``gradient``: the plan of a gradient solve); False when none.

        Under ``by_cost`` the pairs that cannot win (:func:`_cost_candidates`) are left out
        before routing.
        """
        cand = None
        shape = edge_shape(args)
        if shape is None:
            return False
        form, scale, h = shape
        if self.by_cost and scale != 0 and (form == "constant" or h != 0):
            cand = _cost_candidates(ds1, ds2, pair_arr)
            if not len(cand):
                return False
        sub = pair_arr if cand is None else pair_arr[cand]
        route = self.route(ds1, ds2, sub, args, gradient=gradient is not None)
        if cand is None and not self.by_cost:  # the solve of these pairs routes them the same way
            self._accepted = ((ds1, ds2, pair_arr, args, gradient is not None), route)
        take = route.take
        if not take.any():
            return False
        if cand is None:
            return take
        out = np.zeros(len(pair_arr), dtype=bool)
        out[cand] = take
        return out

    def _device_sets(self, plan, here):
        """Both sets' kernel arguments on the device with the layouts of pairs ``here``, or None when
        they do not fit (another solver needs far less device memory for these pairs)."""
        d1, d2 = plan.data
        try:  # require() takes indices with repeats: no sort to make them unique
            if d2 is d1:
                d1.require(np.concatenate((plan.g1[here], plan.g2[here])))
            else:
                d1.require(plan.g1[here])
                d2.require(plan.g2[here])
            set1 = d1.on_device(self.dev)
            return set1, (set1 if d2 is d1 else d2.on_device(self.dev))
        except GraphTooLargeError:
            return None

    def _by_tile(self, route, args, launch):
        """Run ``launch(sets, program, idx, tile)`` per tile over the pairs ``route`` takes, with both
        sets and the vertex-kernel program (``ncode``, ``nparam``) on the device, uploaded once for
        every tile; returns the results and the pairs done (a launch that returns None leaves its
        pairs undone)."""
        here = np.flatnonzero(route.take)
        sets = self._device_sets(route, here) if len(here) else None
        done = np.zeros(len(route.take), dtype=bool)
        results = []
        if sets is None:
            return results, done
        dt = np.dtype(self.s["dtype"])
        program = (rt.to_device(self.dev, _nonempty(np.asarray(args["ncode"], dtype=np.int32))),
                   rt.to_device(self.dev, _nonempty(np.asarray(args["nparam"]).astype(dt))))
        tiles = route.tile[here]
        for tile in np.flatnonzero(np.bincount(tiles)).tolist():  # tiles are small positive integers
            idx = here[tiles == tile]
            out = launch(sets, program, idx, int(tile))
            if out is not None:
                results.append((idx, out))
                done[idx] = True
        return results, done

    def _record(self, route, done, seconds):
        self.last_run = {"gemm_pairs": int(done.sum()), "terms": np.where(done, route.terms, 0),
                         "gemm_seconds": seconds}

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        """The pairs of ``pair_arr`` that :meth:`accepts` (others come back declined)."""
        m = len(pair_arr)
        if m == 0:
            return empty_result(nodal)
        route = self.route(ds1, ds2, pair_arr, args, by_cost=False)
        results, done = self._by_tile(route, args, lambda sets, program, idx, tile: self._launch(
            ds1, ds2, args, route, sets, program, idx, tile, nodal))
        merged = merge_parts([(None, idx, Solved(K=k, iterations=it, residuals=res, nodal=nod, octile_pairs=None,
                                                 seconds=sec)) for idx, (k, it, res, nod, sec) in results],
                             m, nodal, None)
        self._record(route, done, merged.seconds)
        return dataclasses.replace(merged, declined=np.flatnonzero(~done))

    def solve_gradient(self, ds1, ds2, pair_arr, args, plan):
        """Gradients of the pairs the gradient entry points take (:func:`route_pairs` with
        ``gradient=True``); the others come back declined."""
        m = len(pair_arr)
        if m == 0:
            return empty_result(False, None, plan.n_raw)
        route = self.route(ds1, ds2, pair_arr, args, gradient=True, by_cost=False)
        if route.take.any():
            check_contractions(plan, args)
        results, done = self._by_tile(route, args, lambda sets, program, idx, tile: self._launch_gradient(
            ds1, ds2, args, route, sets, program, idx, tile, plan))
        merged = merge_parts([(None, idx, gradient_result(*out[:6], None, out[6])) for idx, out in results], m, False,
                             plan)
        self._record(route, done, merged.seconds)
        return dataclasses.replace(merged, declined=np.flatnonzero(~done))

    def _prepare(self, ds1, ds2, args, plan, sets, program, idx, tile, entry, shared, vectors, out_bytes):
        """What every launch of pairs ``idx`` (tile ``tile``) begins with: (kernel, blocks, threads per
        block, launch order, the arguments up to the scratch slot), or None when the free device memory
        holds no block's CG vectors (``vectors``: the name of their count in the module's exports)
        besides ``out_bytes`` of results."""
        s = self.s
        lim = rt.exports(self.dev, "mgk_gemm", agree=_PLANNED)
        n_vectors, threads = getattr(lim, vectors), lim.tile_threads ** 2
        dt = np.dtype(s["dtype"])
        dev = self.dev
        form, scale, h = plan.shape
        g1, g2 = plan.g1[idx], plan.g2[idx]
        m = len(idx)
        # the longest pairs first: with a static grid-stride order they would otherwise finish last
        order = launch_order(gemm_work(plan.terms[idx], ds1.n_nodes[g1], ds2.n_nodes[g2]))
        fn = rt.kernel(dev, "mgk_gemm", f"{entry}_r{tile}_{rt.precision(dt)}")
        if shared > 48 * 1024:
            fn.set_max_dynamic_shared_memory(shared)
        per_block = n_vectors * tile * tile * threads * dt.itemsize
        free, _ = dev.memory_info()
        resident = dev.properties["multiprocessor_count"] * max(1, fn.max_active_blocks_per_sm(threads, shared))
        affordable = int((free - out_bytes) * SCRATCH_SHARE // per_block)
        if affordable < 1:
            return None
        n_blocks = min(m, resident, affordable)
        rt.check_fits(dev, n_blocks * per_block + out_bytes, "the CG work vectors and results")
        scratch = rt.alloc(dev, n_blocks * n_vectors * tile * tile * threads, dt)
        job = rt.layout(dev, "mgk_gemm", f"job_{rt.precision(dt)}").pack(
            pair_g1=rt.to_device(dev, in_launch_order(g1, order)), pair_g2=rt.to_device(dev, in_launch_order(g2, order)),
            n_pairs=m, ncode=program[0], nparam=program[1], ncode_len=len(args["ncode"]),
            nparam_len=len(args["nparam"]), form=FORM_CODES[form], scale=scale, h=h, q=s["q"], p2=s["p"] * s["p"],
            tol=s["tol"], max_iter=s["max_iter"], scratch=scratch)
        return fn, n_blocks, threads, order, graph_sets(dev, "mgk_gemm", dt, *sets) + (job,)

    def _launch(self, ds1, ds2, args, plan, sets, program, idx, tile, nodal):
        """Solve pairs ``idx`` of tile ``tile``: (K, iterations, residuals, nodal blocks, seconds), or
        None when the free device memory holds no block's CG vectors."""
        dt = np.dtype(self.s["dtype"])
        dev = self.dev
        m = len(idx)
        n1, n2 = ds1.n_nodes[plan.g1[idx]], ds2.n_nodes[plan.g2[idx]]
        sizes = n1.astype(np.int64) * n2
        out_bytes = m * (8 + 4 + 8) + (int(sizes.sum()) * dt.itemsize if nodal else 0)
        shared = int(shared_bytes(dt.itemsize, tile, len(args["ncode"]), len(args["nparam"])))
        prepared = self._prepare(ds1, ds2, args, plan, sets, program, idx, tile, "mgk_gemm", shared, "vectors",
                                 out_bytes)
        if prepared is None:
            return None
        fn, n_blocks, threads, order, head = prepared
        run = (lambda outputs: timed_launch(dev, fn, n_blocks, threads, head + (outputs,), shared))
        return solve_outputs(dev, "mgk_gemm", run, order, n1, n2, dt, nodal)

    def _launch_gradient(self, ds1, ds2, args, route, sets, program, idx, tile, plan):
        """K and raw derivatives of pairs ``idx`` of tile ``tile``: (K, iterations, residuals,
        adjoint iterations, adjoint residuals, raw (m, n_raw), seconds), or None when the free
        device memory holds no block's CG vectors."""
        dt = np.dtype(self.s["dtype"])
        dev = self.dev
        m = len(idx)

        directions = csr_solver.gradient_entry(self.s["gradient_solves"])[1]  # lockstep or sequential
        entry = "mgk_gemm_gradient" if directions == 2 else "mgk_gemm_gradient_seq"
        shared = int(gradient_shared_bytes(dt.itemsize, tile, len(args["ncode"]), len(args["nparam"]), directions))
        prepared = self._prepare(ds1, ds2, args, route, sets, program, idx, tile, entry, shared, "gradient_vectors",
                                 m * (2 * (8 + 4 + 8) + 8 * plan.n_raw))
        if prepared is None:
            return None
        fn, n_blocks, threads, order, head = prepared
        head = head + (gradient_terms(dev, "mgk_gemm", plan, dt),)
        run = (lambda outputs: timed_launch(dev, fn, n_blocks, threads, head + (outputs,), shared))
        return gradient_outputs(dev, "mgk_gemm", run, order, plan, "GEMM solver")
