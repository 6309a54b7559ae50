"""Benchmark suite ``mgk-techniques``: the tiled MGK solver's techniques added one at a time.

Also reached as ``graphkern-bench mgk --techniques``.  Sets (``--sets``):

* ``nws``, ``ba`` (and ``-labeled``): the core suite's 160 Newman-Watts-Strogatz / Barabasi-Albert
  graphs of 96 vertices (graphkern.bench.suites._mgk_sets.build_set; ``--quick``: 20 of 32 vertices);
* ``molecules``: the packaged NCI molecules (``--sdf`` for another SD file), element and bond-order
  labels compared by ``KroneckerDelta(0.5)``;
* ``protein``: 3D contact graphs (``contact_graph_3d``, 500-1000 residues, ``--protein-graphs``),
  residue types (20 categories, ``KroneckerDelta(0.5)``) and distance-labeled edges compared by
  ``SquareExponential(1.0)``.

Printed per set:

1. non-empty octiles summed over the set under natural, RCM and PBR order, stored entries per
   octile, and PBR's time for the whole set (CPU, all threads; measured without a GPU too);
2. on the GPU, the time to solution of the whole Gram matrix (upper triangle) with the techniques
   added one at a time: Dense, +Sparse, +Reorder, +Adaptive, +Compact, +Block, +DynSched
   (graphkern.mgk.tiled.INCREMENTAL_STEPS), the library's default ``techniques="auto"`` ("all
   (auto)": every tiled technique, plus the CSR solver of graphkern.mgk.csr for the pairs whose
   product graph fits a block's shared memory, e.g. every molecule pair and no protein pair), and
   the core solver (``techniques="core"``).
   A row whose kernel time, predicted from a measured row with the same octile products (dense x
   dense: the core solver, Dense, +Sparse, +Reorder) scaled by the ratio of octile products (per
   pair: CG iterations x octiles of G1 x octiles of G2), exceeds ``--budget`` seconds is that
   prediction, marked estimated (Dense on the protein-like set: a 1000-residue graph has 15625
   octiles).  Before a row runs on the whole set its largest pair runs alone: when that alone
   exceeds the budget the row is that time, marked estimated as a lower bound (the warp-team rows
   on the protein-like set, where one warp carries a 1000-residue pair).
   Columns: warm wall time of the call, kernel time (CUDA events), speedups over Dense and over
   the core solver, CG iterations, and the distance from the cost floor;
3. one GPU against all visible GPUs (at least two) on the largest Gram matrix;
4. with ``--thresholds`` (and in a full run): the adaptive-primitive microbenchmark.

Cost floor (one H100: FP32 67 TFLOP/s, FP64 34, SFU 132 SMs x 16 / clock x 1.755 GHz = 3.7e12
exponentials/s, 3.0 TB/s): per pair and CG iteration the XMV needs nnz1 x nnz2 nonzero terms
(2 flops each; one exponential each with a square-exponential edge kernel), and CG streams at
least 9 vectors of n1 n2 values (fused: read p, diag; write Ap; read x, r, Ap; write x, r, p).
The floor of a set is the largest of sum(iterations x nnz1 nnz2) x 2 / peak, the exponentials
over the SFU rate, and sum(iterations x 9 n1 n2 x itemsize) / 3.0 TB/s, with each pair's
iterations as measured.  With the iterations of the CPU solver (same CG) on samples of pairs,
q = 0.05, float32: NWS (160 x 96, 37 iterations) 53 ms and BA (11 iterations) 16 ms, both bound
by the vector traffic (a 96 x 96 pair's five vectors, 184 KB, do not stay in L2 once the GPU
holds ~1600 pairs at once), labeled NWS / BA 16 / 8.5 ms; the 160 NCI molecules (15
iterations) 2.1 ms of vector traffic at DRAM speed and 0.02 ms of arithmetic, though 1600
resident pairs' vectors (18 KB each) fit in L2, so their true floor is lower still and their
time is latency and per-pair overhead; 32 protein-like graphs of 500-1000 residues (5
iterations) 253 ms, bound by the exponentials (the default 16 graphs: about a quarter of that).  Counting 8192 flops per
octile pair instead (the core suite's XMV rate), NWS / BA / molecules would be 79 / 208 / 2.5 ms
at FP32 peak under PBR order.

Targets on one H100: every technique together (the "all (auto)" row) >= 5x faster than the core
solver on the molecular and protein-like sets (the paper's techniques alone, +DynSched, are
printed beside it); two GPUs >= 1.8x one GPU on the largest Gram matrix.  The octile counts are
shown as information: the target on them (PBR against RCM) is the reorder suite's.  ``--quick``
times the techniques on the molecular set only.

Threshold microbenchmark: graphs of 64 vertices whose octiles (a band of three tile diagonals)
all hold about k nonzeros, solved with each primitive forced (``primitives="dd"|"ds"|"ss"``)
for k from 1 to 64 and every edge-kernel form; it prints the kernel time per octile product and
the k up to which sparse x sparse and dense x sparse win, the values for
graphkern.mgk.tiled.FORM_THRESHOLDS.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from graphkern.bench.report import Target, print_table, print_targets
from graphkern.bench.suites._mgk_sets import SETS as CORE_SETS, build_set

NAME = "mgk-techniques"
HELP = "tiled MGK solver: Dense/+Sparse/+Reorder/+Adaptive/+Compact/+Block/+DynSched, octile counts, GPUs"

SETS = ("nws", "ba", "nws-labeled", "ba-labeled", "molecules", "protein")
DEFAULT_SETS = ("nws", "ba", "molecules", "protein")
FP32_PEAK, FP64_PEAK = 67e12, 34e12
SFU_RATE = 132 * 16 * 1.755e9
BANDWIDTH = 3.0e12
CG_VECTOR_PASSES = 9
THRESHOLD_NNZ = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)
# 2080 pairs: more warp teams than an H100 holds at once, so the sweep measures throughput, not latency
THRESHOLD_GRAPHS = 64
TARGETS = {
    "core": Target("all techniques (the default solver) ≥ 5x the core solver on molecules and protein contact graphs",
                   ">=", 5, sizes="the full sets"),
    "two_gpus": Target("two GPUs ≥ 1.8x one GPU on the largest Gram matrix", ">=", 1.8, gpus=2,
                       sizes="the full sets"),
}
OPTIONS = dict(sets=",".join(DEFAULT_SETS), graphs=None, vertices=None, protein_graphs=None, protein_sizes="500,1000",
               q=0.05, dtype="float32", sdf=None, budget=None, thresholds=False, no_thresholds=False, no_core=False,
               multi_gpu_only=False,
               seed=0)


def add_arguments(parser):
    parser.add_argument("--sets", default=OPTIONS["sets"], help=f"comma-separated subset of {','.join(SETS)}")
    parser.add_argument("--graphs", type=int, default=None, help="graphs per NWS/BA/molecule set (default 160; --quick 20)")
    parser.add_argument("--vertices", type=int, default=None, help="vertices per NWS/BA graph (default 96; --quick 32)")
    parser.add_argument("--protein-graphs", type=int, default=None, help="protein-like graphs (default 16; --quick 3)")
    parser.add_argument("--protein-sizes", default=OPTIONS["protein_sizes"],
                        help="smallest,largest residue count (default 500,1000; --quick uses the smallest)")
    parser.add_argument("--q", type=float, default=OPTIONS["q"], help="stopping probability (default 0.05)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=OPTIONS["dtype"])
    parser.add_argument("--sdf", default=None, help="SD file of the molecular set (default: the packaged NCI set)")
    parser.add_argument("--budget", type=float, default=None,
                        help="predicted kernel seconds above which a row is estimated, not run (default 120; --quick 5)")
    parser.add_argument("--thresholds", action="store_true",
                        help="run the adaptive-primitive threshold microbenchmark (always in a full GPU run)")
    parser.add_argument("--no-thresholds", action="store_true",
                        help="skip the threshold microbenchmark in a full GPU run")
    parser.add_argument("--no-core", action="store_true", help="skip the core solver row")
    parser.add_argument("--multi-gpu-only", action="store_true",
                        help="only the table of one GPU against every GPU, on the last set of --sets (no octile "
                             "counts, technique rows or thresholds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated sets")


def from_mgk_args(args):
    """This suite's options for ``graphkern-bench mgk --techniques`` (the mgk suite's parser)."""
    opts = dict(OPTIONS)
    for key in ("graphs", "vertices", "q", "dtype", "sdf"):
        if getattr(args, key, None) is not None:
            opts[key] = getattr(args, key)
    chosen = getattr(args, "sets", None)
    if chosen and chosen != ",".join(CORE_SETS):  # sets named on the command line: the ones this suite has
        opts["sets"] = ",".join(s for s in chosen.split(",") if s.strip() in SETS) or opts["sets"]
    return argparse.Namespace(**opts)


# ---------------------------------------------------------------------------- data


def protein_set(count, sizes, seed):
    """Contact graphs of folded chains with residue types and distance-labeled edges."""
    from graphkern import generators as gen

    rng = np.random.default_rng(seed)
    lo, hi = sizes
    graphs = []
    for s, n in enumerate(rng.integers(lo, hi + 1, size=count)):
        g = gen.contact_graph_3d(int(n), seed=seed + s)
        g.node_labels["residue"] = rng.integers(0, 20, g.n_nodes)
        graphs.append(g)
    return graphs


def build_sets(args, quick):
    """(name, graphs, node_kernel, edge_kernel, description) of every requested set."""
    from graphkern.basekernels import KroneckerDelta, SquareExponential, TensorProduct

    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    for name in names:
        if name not in SETS:
            raise ValueError(f"unknown set {name!r}; choose from {', '.join(SETS)}")
        if name == "protein":
            lo, hi = (int(v) for v in args.protein_sizes.split(","))
            count = args.protein_graphs or (3 if quick else 16)
            graphs = protein_set(count, (lo, lo if quick else hi), args.seed)
            yield (name, graphs, TensorProduct(residue=KroneckerDelta(0.5)),
                   TensorProduct(distance=SquareExponential(1.0)),
                   f"{count} 3D contact graphs, {min(g.n_nodes for g in graphs)}-{max(g.n_nodes for g in graphs)} "
                   "residues, residue types and distance-labeled edges")
        else:
            yield (name, *build_set(name, args, quick, seed=args.seed))


# ---------------------------------------------------------------------------- octile counts (CPU)


def octile_rows(name, graphs, threads):
    from graphkern.reorder import octile_count, reorder_many

    row = {"set": name, "graphs": len(graphs), "mean_n": float(np.mean([g.n_nodes for g in graphs]))}
    for method in (None, "rcm", "pbr"):
        key = "natural" if method is None else method
        t0 = time.perf_counter()
        perms = reorder_many(graphs, method, n_threads=threads)
        seconds = time.perf_counter() - t0
        stats = [octile_count(g, p) for g, p in zip(graphs, perms)]
        tiles = sum(s["nonempty_tiles"] for s in stats)
        row[f"{key}_tiles"] = tiles
        row[f"{key}_nnz_per_tile"] = sum(s["nnz"] for s in stats) / tiles if tiles else 0.0
        if method == "pbr":
            row["pbr_seconds"] = seconds
    row["threads"] = threads
    row["pbr_fewer_than_rcm"] = row["pbr_tiles"] < row["rcm_tiles"]
    return row


# ---------------------------------------------------------------------------- GPU rows


def _upper_pairs(n):
    i, j = np.triu_indices(n)
    return np.stack([i, j], axis=1).astype(np.int64)


def _octile_work(kern, graphs, pairs, iterations):
    """Octile products of solving ``pairs`` with these iterations under the kernel's variant (its octiles)."""
    from graphkern.mgk.results import solver_arguments
    from graphkern.mgk.tiled import resolve_techniques

    s = kern._settings()
    ds = kern._dataset(graphs, s)
    if resolve_techniques(kern.techniques) is None:
        tiles = ds.octiles.tiles_per_graph()
    else:
        td, _ = kern._router(s).engines["tiled"].datasets(ds, ds, solver_arguments(ds, ds, s))
        tiles = td.tiles_per_graph
    return float(np.sum(np.asarray(iterations, dtype=np.float64) * tiles[pairs[:, 0]] * tiles[pairs[:, 1]]))


def run_variant(label, graphs, nk, ek, args, repeat, budget, *, techniques, reorder, iterations=None, known=(),
                device=0, octiles=True):
    """Time one variant on the whole upper triangle (warm calls, CUDA-event kernel time).

    When ``iterations`` (per pair, from a converged run) and ``known`` (rows measured with the
    same primitives) are given and the nearest known row, scaled by the ratio of octile
    products, predicts more than ``budget`` kernel seconds, the row is that prediction, marked
    estimated.  ``octiles=False``: the variant may not run on octiles (``techniques="auto"``
    sends the pairs that fit to the CSR solver), so its octile products are not counted.
    """
    from graphkern.bench.timing import time_cpu
    from graphkern.mgk import MarginalizedGraphKernel

    dtype = np.dtype(args.dtype)
    kern = MarginalizedGraphKernel(nk, ek, q=args.q, dtype=dtype, backend="gpu", techniques=techniques,
                                   reorder=reorder, device=device)
    pairs = _upper_pairs(len(graphs))
    smallest = int(np.argmin([g.n_nodes for g in graphs]))
    t0 = time.perf_counter()
    kern(graphs, pairs=np.array([[smallest, smallest]]))  # packing, octiles (reordering), upload
    row = {"variant": label, "pairs": len(pairs), "cold_s": time.perf_counter() - t0, "K": None,
           "octile_products": None}
    if iterations is not None and octiles:
        row["octile_products"] = _octile_work(kern, graphs, pairs, iterations)
        base = min(known, key=lambda r: abs(np.log(r["octile_products"] / row["octile_products"])), default=None)
        if base is not None:
            scale = row["octile_products"] / base["octile_products"]
            if base["kernel_s"] * scale > budget:
                row.update(seconds=base["seconds"] * scale, kernel_s=base["kernel_s"] * scale, estimated=True,
                           iterations=base["iterations"], estimated_from=base["variant"])
                return row, None
    if len(pairs) > 1:
        # the set takes at least as long as its largest pair alone: a row whose teams give that pair
        # too little of the GPU (a warp per 1000-residue pair) is that lower bound, not a run
        largest = int(np.argmax([g.n_nodes for g in graphs]))
        kern(graphs, pairs=np.array([[largest, largest]]))
        probe = kern.info_.solve_seconds
        if probe > budget:
            row.update(seconds=probe, kernel_s=probe, estimated=True, iterations=float(kern.info_.iterations.mean()),
                       estimated_from="largest pair alone (a lower bound)")
            return row, None
    kernel_times = []

    def call():
        row["K"] = kern(graphs)
        kernel_times.append(kern.info_.solve_seconds)

    first = time_cpu(call, repeat=1, warmup=0)
    more = repeat if first.median * (repeat + 1) <= budget else 0
    wall = time_cpu(call, repeat=more, warmup=1) if more else first
    info = kern.info_
    row.update(seconds=wall.median, kernel_s=float(np.median(kernel_times[-max(more, 1):])), estimated=False,
               iterations=float(info.iterations.mean()), repeats=len(wall.times))
    if iterations is None and octiles:
        row["octile_products"] = _octile_work(kern, graphs, pairs, info.iterations)
    return row, info


def floor_seconds(graphs, pairs, iterations, edge_form, dtype):
    """The cost floor of solving ``pairs`` with these iterations (module docstring), and what bounds it."""
    nnz = np.array([g.nnz for g in graphs], dtype=np.float64)
    n = np.array([g.n_nodes for g in graphs], dtype=np.float64)
    it = np.asarray(iterations, dtype=np.float64)
    terms = float(np.sum(it * nnz[pairs[:, 0]] * nnz[pairs[:, 1]]))
    values = float(np.sum(it * n[pairs[:, 0]] * n[pairs[:, 1]]))
    peak = FP32_PEAK if np.dtype(dtype) == np.float32 else FP64_PEAK
    parts = {"flops": 2 * terms / peak, "sfu": terms / SFU_RATE if edge_form == "sqexp" else 0.0,
             "memory": CG_VECTOR_PASSES * values * np.dtype(dtype).itemsize / BANDWIDTH}
    bound = max(parts, key=parts.get)
    return parts[bound], bound


# the library's default: every tiled technique, and the CSR solver (graphkern.mgk.csr) for the
# pairs whose product graph fits a block's shared memory
AUTO_ROW = "all (auto)"
# --quick times the techniques on the GPU on this set only (the octile counts cover every set)
QUICK_GPU_SET = "molecules"
# the order rows are measured in: the fastest first (its iterations price the others), then the
# dense-product rows from fewest to most octiles, so each can be predicted from one measured before
_MEASURE_ORDER = ("+DynSched", AUTO_ROW, "+Block", "+Compact", "+Adaptive", "+Reorder", "+Sparse", "core",
                  "Dense")
_DENSE_PRODUCT_ROWS = ("+Reorder", "+Sparse", "core", "Dense")


def incremental_table(name, graphs, nk, ek, args, ctx, budget):
    from graphkern.mgk.tiled import INCREMENTAL_STEPS

    repeat = ctx.repeat or (1 if ctx.quick else 3)
    variants = {label: (tech, reorder) for label, tech, reorder in INCREMENTAL_STEPS}
    variants[AUTO_ROW] = ("auto", "pbr")
    if not args.no_core:
        variants["core"] = ("core", None)
    measured = {}
    iterations = None
    pairs = _upper_pairs(len(graphs))
    for label in ctx.progress([v for v in _MEASURE_ORDER if v in variants], desc=f"{name} techniques"):
        tech, reorder = variants[label]
        same_family = [r for r in measured.values() if (r["variant"] in _DENSE_PRODUCT_ROWS) ==
                       (label in _DENSE_PRODUCT_ROWS) and not r["estimated"] and r["octile_products"]]
        row, info = run_variant(label, graphs, nk, ek, args, repeat, budget, techniques=tech, reorder=reorder,
                                iterations=iterations, known=same_family, octiles=label != AUTO_ROW)
        if iterations is None:
            iterations = info.iterations
            floor, bound = floor_seconds(graphs, pairs, iterations, info.edge_form, args.dtype)
        measured[label] = row
    rows = [measured[label] for label in ["core"] + [s[0] for s in INCREMENTAL_STEPS] + [AUTO_ROW]
            if label in measured]
    dense, core = measured["Dense"], measured.get("core")
    ref_K = core["K"] if core is not None and core["K"] is not None else measured["+DynSched"]["K"]
    for r in rows:
        r["set"] = name
        r["vs_dense"] = dense["seconds"] / r["seconds"]
        if core is not None:
            r["vs_core"] = core["seconds"] / r["seconds"]
            r["kernel_vs_core"] = core["kernel_s"] / r["kernel_s"]
        r["floor_s"] = floor
        r["floor_bound"] = bound
        r["x_floor"] = r["kernel_s"] / floor if floor > 0 else float("nan")
        if r["K"] is not None and ref_K is not None and r["K"] is not ref_K:
            r["max_rel_diff"] = float(np.max(np.abs(r["K"] - ref_K) / np.abs(ref_K)))
    for r in rows:
        r["est"] = "est" if r.get("estimated") else ""
    print_table(rows, [("variant", "variant"), ("seconds", "time s", "{:.4g}"), ("est", "est"),
                       ("kernel_s", "kernel s", "{:.4g}"), ("vs_dense", "x Dense", "{:.3g}"),
                       ("vs_core", "x core", "{:.3g}"), ("iterations", "CG it/pair", "{:.1f}"),
                       ("octile_products", "octile products", "{:.3g}"), ("x_floor", "x floor", "{:.3g}"),
                       ("max_rel_diff", "max rel diff", "{:.1e}"), ("cold_s", "setup s", "{:.3g}"),
                       ("estimated_from", "estimated from")],
                title=f"{name}: techniques added one at a time ({len(pairs)} pairs; cost floor {floor * 1e3:.3g} ms, "
                      f"{bound}-bound)",
                legend="time: warm call of the whole Gram matrix; kernel: the solve (device events); est: scaled by "
                       "octile products from a measured row, never judged; x Dense / x core: their time / this "
                       "time; x floor: kernel time / the cost floor; CG it: conjugate-gradient iterations per "
                       "pair; setup: the first call on one pair (packing, octiles, upload)")
    for r in rows:
        r.pop("K", None)
    return rows


def multi_gpu_table(name, graphs, nk, ek, args, ctx, n_devices, targets):
    """:func:`multi_gpu_rows` printed, with the two-GPU target appended to ``targets``."""
    multi = multi_gpu_rows(name, graphs, nk, ek, args, ctx, n_devices)
    print_table(multi, ["set", "devices", "pairs", ("seconds", "time s", "{:.4g}"), ("kernel_s", "kernel s", "{:.4g}"),
                        ("speedup", "speedup", "{:.3g}"), ("pairs_per_device", "pairs per device"),
                        ("shared_queue", "shared queue")], title=f"one GPU against {n_devices} on {name}")
    targets.append(TARGETS["two_gpus"].judge(multi[1]["speedup"], ctx, repeats=ctx.repeat or 1, detail=name))
    return multi


def multi_gpu_only(args, ctx, n_devices):
    """``--multi-gpu-only``: one GPU against all of them on the last set of ``--sets``."""
    targets = []
    if n_devices < 2:
        targets.append(TARGETS["two_gpus"].judge(None, ctx, detail=f"{n_devices} GPU here"))
        rows = []
    else:
        name, graphs, nk, ek, desc = list(build_sets(args, ctx.quick))[-1]
        ctx.log(f"-- {name}: {desc}; {len(graphs) * (len(graphs) + 1) // 2} pairs")
        rows = multi_gpu_table(name, graphs, nk, ek, args, ctx, n_devices, targets)
    print_targets(targets)
    return rows + targets


def multi_gpu_rows(name, graphs, nk, ek, args, ctx, n_devices):
    from graphkern.bench.timing import time_cpu
    from graphkern.mgk import MarginalizedGraphKernel

    repeat = ctx.repeat or (1 if ctx.quick else 3)
    rows = []
    for devices in ([0], list(range(n_devices))):
        kern = MarginalizedGraphKernel(nk, ek, q=args.q, dtype=np.dtype(args.dtype), backend="gpu", device=devices)
        kern(graphs)
        wall = time_cpu(lambda: kern(graphs), repeat=repeat, warmup=0)
        engine = kern.last_engine_.engines.get("tiled")
        per_device = getattr(engine, "last_run", None)
        rows.append({"set": name, "devices": len(devices), "seconds": wall.median,
                     "kernel_s": kern.info_.solve_seconds, "pairs": len(kern.info_.pairs),
                     "pairs_per_device": ([r[1] for r in per_device] if isinstance(per_device, list) else "-"),
                     "shared_queue": getattr(engine, "last_shared_queue", "-")})
    rows[1]["speedup"] = rows[0]["seconds"] / rows[1]["seconds"]
    return rows


# ---------------------------------------------------------------------------- threshold microbenchmark


def banded_octile_graph(k, rng, n_tiles=8):
    """A graph of 8 n_tiles vertices whose non-empty octiles (tile diagonals -1, 0, 1) hold ~k nonzeros."""
    from graphkern.graph import Graph

    rows, cols = [], []
    upper = [(r, s) for r in range(8) for s in range(r + 1, 8)]
    for R in range(n_tiles):
        pairs = min(k // 2, len(upper))
        diagonal = min(8, k - 2 * pairs)
        for idx in rng.choice(len(upper), pairs, replace=False):
            rows.append(8 * R + upper[idx][0])
            cols.append(8 * R + upper[idx][1])
        for d in rng.choice(8, diagonal, replace=False):
            rows.append(8 * R + d)
            cols.append(8 * R + d)
        if R + 1 < n_tiles:
            for e in rng.choice(64, k, replace=False):
                rows.append(8 * R + e // 8)
                cols.append(8 * (R + 1) + e % 8)
    edges = np.stack([rows, cols], axis=1)
    m = len(edges)
    return Graph.from_edges(edges, 8 * n_tiles, node_labels={"label": rng.integers(0, 3, 8 * n_tiles)},
                            edge_labels={"category": rng.integers(0, 3, m), "length": rng.uniform(1.0, 2.0, m)})


def threshold_rows(args, ctx):
    from graphkern.basekernels import Constant, KroneckerDelta, SquareExponential, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel

    forms = {"constant": Constant(1.0), "kronecker": TensorProduct(category=KroneckerDelta(0.5)),
             "sqexp": TensorProduct(length=SquareExponential(1.0))}
    rng = np.random.default_rng(args.seed)
    rows = []
    for k in ctx.progress(THRESHOLD_NNZ, desc="thresholds"):
        graphs = [banded_octile_graph(k, rng) for _ in range(THRESHOLD_GRAPHS)]
        for form, ek in forms.items():
            row = {"form": form, "k": k}
            for prim in ("dd", "ds", "ss"):
                kern = MarginalizedGraphKernel(TensorProduct(label=KroneckerDelta(0.5)), ek, q=args.q,
                                               dtype=np.dtype(args.dtype), backend="gpu", reorder=None,
                                               techniques=dict(primitives=prim, team="warp", schedule="static"))
                kern(graphs)
                times = []
                for _ in range(ctx.repeat or 3):
                    kern(graphs)
                    times.append(kern.info_.solve_seconds)
                products = float(np.sum(kern.info_.iterations.astype(np.float64) * kern.info_.octile_pairs))
                row[f"{prim}_ns"] = 1e9 * float(np.median(times)) / products
            rows.append(row)
    verdicts = []
    for form in forms:
        mine = [r for r in rows if r["form"] == form]
        ss_best = [r["k"] for r in mine if r["ss_ns"] <= min(r["dd_ns"], r["ds_ns"])]
        ds_best = [r["k"] for r in mine if r["ds_ns"] <= r["dd_ns"]]
        verdicts.append({"form": form, "ss_max": max(ss_best, default=-1), "ds_max": max(ds_best, default=-1)})
        print_table(mine, [("k", "nnz/octile"), ("dd_ns", "dd ns/product", "{:.3g}"),
                           ("ds_ns", "ds ns/product", "{:.3g}"), ("ss_ns", "ss ns/product", "{:.3g}")],
                    title=f"octile-pair products, {form} edge kernel (kernel time / (iterations x octile pairs))")
    print_table(verdicts, ["form", ("ss_max", "measured ss_max"), ("ds_max", "measured ds_max")],
                title="measured thresholds (largest k at which the primitive is the fastest / beats dense x dense)")
    return rows + verdicts


# ---------------------------------------------------------------------------- run


def run(args, ctx):
    from graphkern._backend import resolve_threads
    from graphkern._cuda import runtime as rt

    quick = ctx.quick
    budget = args.budget or (2.0 if quick else 120.0)
    threads = resolve_threads(None)
    n_devices = len(ctx.system.get("gpus") or [])
    rows, targets, gpu_rows = [], [], {}
    octiles = []
    if getattr(args, "multi_gpu_only", False):
        return multi_gpu_only(args, ctx, n_devices)
    for name, graphs, nk, ek, desc in build_sets(args, quick):
        ctx.log(f"-- {name}: {desc}; {len(graphs) * (len(graphs) + 1) // 2} pairs")
        octiles.append(octile_rows(name, graphs, threads))
        if ctx.gpu and (not quick or name == QUICK_GPU_SET):
            gpu_rows[name] = (incremental_table(name, graphs, nk, ek, args, ctx, budget), graphs, nk, ek)
            rows += gpu_rows[name][0]
        elif not ctx.gpu:
            rows.append({"set": name, "variant": "all", "skipped": f"no GPU ({rt.unavailable_reason()})"})
    print_table(octiles, ["set", "graphs", ("mean_n", "mean n", "{:.0f}"), ("natural_tiles", "natural", "{}"),
                          ("rcm_tiles", "RCM", "{}"), ("pbr_tiles", "PBR", "{}"),
                          ("natural_nnz_per_tile", "nnz/octile nat.", "{:.2f}"),
                          ("pbr_nnz_per_tile", "nnz/octile PBR", "{:.2f}"),
                          ("pbr_seconds", "PBR s (set)", "{:.3f}"), "threads"],
                title="non-empty octiles summed over each set, and PBR's time for the whole set")
    rows += octiles
    for name in ("molecules", "protein"):
        if name in gpu_rows:
            table = {r["variant"]: r for r in gpu_rows[name][0]}
            auto, dyn, core = table[AUTO_ROW], table["+DynSched"], table.get("core", {})
            targets.append(TARGETS["core"].judge(auto.get("vs_core"), ctx, repeats=min(auto.get("repeats", 0),
                                                                                       core.get("repeats", 0)),
                                                 estimated=bool(auto.get("estimated") or core.get("estimated")),
                                                 detail=name))
            targets.append(dict(TARGETS["core"].judge(dyn.get("vs_core"), ctx, repeats=dyn.get("repeats", 0),
                                                      detail=f"{name}: the paper's techniques (+DynSched)"),
                                verdict="info", why="the paper's techniques alone: shown, not a target"))
    if n_devices >= 2 and gpu_rows:
        largest = max(gpu_rows, key=lambda s: next(r for r in gpu_rows[s][0] if r["variant"] == "+DynSched")["kernel_s"])
        _, graphs, nk, ek = gpu_rows[largest]
        rows += multi_gpu_table(largest, graphs, nk, ek, args, ctx, n_devices, targets)
    else:
        targets.append(TARGETS["two_gpus"].judge(None, ctx, detail=f"{n_devices} GPU here"))
    if ctx.gpu and (args.thresholds or not quick) and not args.no_thresholds:
        rows += threshold_rows(args, ctx)
    if not ctx.gpu:
        targets.append(TARGETS["core"].judge(None, ctx, detail="needs a GPU"))
    print_targets(targets, title="targets (set for H100-class GPUs and 16 cores); PBR's octile target: the reorder suite")
    return rows + targets
