"""Benchmark suite ``mgk``: Gram matrices of the marginalized graph kernel.

Data sets (``--sets``), 160 graphs each unless ``--graphs``:

* ``nws`` / ``nws-labeled``: Newman-Watts-Strogatz graphs, 96 vertices, networkx's k=3 (one
  neighbour per side: ``k=2`` in graphkern.generators, which takes the even total), p=0.1;
* ``ba`` / ``ba-labeled``: Barabasi-Albert graphs, 96 vertices, m=6;
* ``dense-labeled``: 40 near-complete labeled graphs, 96 vertices (every octile full: the XMV
  at its densest, the FP32-peak target);
* ``molecules``: a real molecular set with atom (element) and bond (order) labels read from an
  SD file (``--sdf``; by default the packaged set of 1000 NCI molecules, with
  hydrogens).

Labeled sets use 4 vertex and 3 edge categories compared by ``KroneckerDelta(0.5)``; unlabeled
sets ``Constant(1.0)`` (the random-walk kernel).

Solvers: graphkern on the GPU (the tiled solver, ``techniques="tiled"``, and the CSR solver that
the default ``techniques="auto"`` uses on one GPU; every pair of the upper triangle in one
launch) and on the CPU
(OpenMP, all threads; on ``--cpu-graphs`` graphs, scaled and marked estimated when fewer than
the set), the dense NumPy solve of the product system (a few pairs, scaled), and GraKeL's
RandomWalk / RandomWalkLabeled (geometric, fast method) on ``--grakel-graphs`` graphs, scaled
and marked estimated.  GraKeL computes a related random-walk kernel, not this one: the
comparison is time per pair on the same graphs, as in the paper.

Printed per set and solver: pairs/s, mean CG iterations, time per pair-iteration (one CG
iteration of one pair), and for the GPU the XMV's achieved FLOP/s against the card's FP32
peak (67 TFLOP/s on an H100 SXM; FP64 34).

FLOPs counted (conservative): labeled edge kernels, 2 per element of each 64 x 64 product
block, i.e. 8192 per octile pair (the multiply-add of A_x (.) E_x with p; forming
w w' kappa is not counted); unlabeled, the factorized block W1 X W2^T, 2 * 2 * 8^3 = 2048 per
octile pair.  Cost floor: ``flops / 67e12`` s; the octiles of a 96-vertex graph (at most 144,
256 bytes each per plane) stay in L1/L2, so DRAM traffic (the CG vectors, 5 x 4 x n n'
bytes per pair-iteration over 3.0 TB/s) is a lower floor than the arithmetic.

The GPU csr solver row (``techniques="csr"``, cuda_src/mgk_csr.cu) sums over pairs of stored
entries instead of octile products: nnz1 nnz2 entry pairs per XMV (1.17M for the BA set, against
~80M element products of the octile solvers), ~8 warp instructions per 32 of them, so its
issue-rate floor is ``sum(iterations nnz1 nnz2) * 8 / 32 / (132 x 4 x 1.98e9 /s)`` ("floor_s"
in the JSON; ~0.3 us per BA pair-iteration); gathering p from shared memory with bank conflicts
(~2-3.5 wavefronts per warp load) puts the practical floor near twice that.  Its "XMV TFLOP/s"
counts the flops it performs: 2 per entry pair (the multiply-add; the edge kernel is not counted).

The GPU gemm solver row (``techniques="gemm"``, cuda_src/mgk_gemm.cu) factorizes the XMV of a
constant or single-column Kronecker edge kernel into T terms ``alpha L X R^T`` of masked
adjacency matrices (graphkern/mgk/gemm.py), each two dense GEMMs: ``2 T n1 n2 (n1 + n2)`` flops
per XMV, the flops this algorithm performs and the ones its "XMV TFLOP/s" counts (unpadded
sizes; T = 3 for the dense set: 10.6 MFLOP per pair-iteration, where the element-wise solvers
evaluate 67M edge-kernel terms).  Its floor is ``flops / 67e12`` s (0.39 ms for the dense set's
820 pairs x 3 iterations).  Pairs it cannot take (graphs over 128 vertices, 96 in float64; more
than 16 edge labels in a graph; other edge kernels) run on the CSR solver in the same call and
count no flops ("gemm pairs" in the JSON).  "x GraKeL" is each GPU solver's per-pair speed-up
over GraKeL.

Targets on one H100: >= 1000x GraKeL per pair on every labeled set (by the best GPU solver of the
set), and the dense-graph XMV above 30% of FP32 peak, judged on the fastest GPU solver of the
dense set at the flops it performs (for the gemm solver: the GEMMs' flops, far fewer than the
element-wise solvers' for the same XMV).  A full run also times the default kernel on 80, 250
and 1000 packaged molecules (150x the pairs): the user's first call (a fresh kernel object on
freshly read graphs), the warm call and the solve, with the targets first call <= 1.5x warm and
warm <= 1.5x the solve on the 1000 molecules.

``--gradient``: the time of K alone against ``(K, dK) = kernel(X, eval_gradient=True)`` on
the same sets, with every base-kernel hyperparameter and q free (p fixed).  The target rows
use the default GPU solver (``techniques="auto"``: the CSR solver of cuda_src/mgk_csr.cu for
every pair that fits its shared memory, K and gradients alike); the core solver of
cuda_src/mgk.cu (``techniques="core"``) is timed beside it for comparison.  The gradient also
solves the adjoint system, then contracts x and y: diagonal sums for the vertex kernel and q,
nothing more for a constant factor of the edge kernel (``M x = b`` makes its contraction a
diagonal sum: graphkern/mgk/gradient.py), one XMV for any other edge-kernel derivative
("contractions" below counts those).  The CPU solves the two systems one after the other: its
cost floor relative to K is ``(forward + adjoint iterations + contractions) / forward
iterations``; the GPU solvers run them in lockstep, one pass serving both directions while
both run, so they make ``max(forward, adjoint) + contractions`` passes ("XMV passes" prints
that count over K's iterations).  Cost floor of a paired pass on the CSR solver: per entry
pair one broadcast load of G1's record, one 64-bit (float) gather of both directions and the
edge kernel, as for K, plus one more FMA: ~9 instead of ~8 warp instructions per 32 entry
pairs at issue rate, and at the shared-memory rate (the binding one) a 64-bit gather of 32
scattered lanes takes two passes of ~2.5-3 wavefronts against ~3.5 for a 32-bit one, so a
paired pass costs ~1.3-1.6 single ones.  With the adjoint's extra iterations, the floor of
(K, dK) / K is about ``(1.5 forward + (adjoint - forward)) / forward``: ~1.6x at 37 / 42
iterations (nws), ~1.9x at 11 / 15 (ba), ~1.5x on the labeled sets (Kronecker: one XMV
contraction for the label's h); the set-up and the contractions' diagonal sums add ~1 pass.
Target on one H100: (K, dK) <= 2.5x K with the default GPU solver, on every set of 160 graphs.  The CPU
pair (on ``--cpu-graphs``, scaled) and the largest difference between each GPU solver's and
the CPU's dK on the CPU's graphs are printed too.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from graphkern.bench.suites._mgk_sets import SETS, _molecules, build_set
from graphkern.bench.report import (USER_CALL_COLUMNS, USER_CALL_LEGEND, Target, check_answer, failure_text, guarded,
                                    in_ms, print_table, print_targets, user_call_figures)
from graphkern.bench.timing import first_calls, settle, time_cpu

NAME = "mgk"
HELP = "marginalized graph kernel: Gram matrices on NWS, BA, dense and molecular sets vs dense NumPy and GraKeL"

FP32_PEAK = 67e12
FP64_PEAK = 34e12
FLOPS_PER_OCTILE_PAIR = {"constant": 2 * 2 * 8 ** 3, "kronecker": 2 * 64 * 64, "sqexp": 2 * 64 * 64,
                         "general": 2 * 64 * 64}
# The CSR solver's issue-rate floor: ~8 instructions per entry pair (a broadcast 128-bit load, a
# gathered load of p, compare/select, FMA, loop), 32 per warp instruction, 132 SMs x 4 schedulers
# x 1.98 GHz (H100 SXM / H200) warp instructions per second.
CSR_INSTRUCTIONS_PER_ENTRY_PAIR = 8
CSR_WARP_INSTRUCTIONS_PER_S = 132 * 4 * 1.98e9
# Peers and the CPU run on fewer graphs of the dense set: a near-complete 96-vertex pair costs
# GraKeL and the dense solve tens of seconds, and the CPU XMV nnz^2 = 7e7 kernel evaluations.
SUBSET_DEFAULTS = {"cpu_graphs": 40, "grakel_graphs": 6, "dense_pairs": 2}
DENSE_SET_DEFAULTS = {"cpu_graphs": 12, "grakel_graphs": 3, "dense_pairs": 1}


def add_arguments(parser):
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated subset of {','.join(SETS)}")
    parser.add_argument("--graphs", type=int, default=None, help="graphs per set (default 160; --quick 20)")
    parser.add_argument("--vertices", type=int, default=None, help="vertices per synthetic graph (default 96)")
    parser.add_argument("--q", type=float, default=0.05, help="stopping probability (default 0.05)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--sdf", default=None, help="SD file of the molecular set (default: the packaged 1000 NCI molecules)")
    parser.add_argument("--cpu-graphs", type=int, default=None,
                        help="graphs the CPU solver runs on (default 40, dense set 12; --quick: all); scaled to the set")
    parser.add_argument("--grakel-graphs", type=int, default=None,
                        help="graphs GraKeL runs on (default 6, dense set 3)")
    parser.add_argument("--dense-pairs", type=int, default=None, help="pairs the dense solver runs (default 2, dense set 1)")
    parser.add_argument("--no-peers", action="store_true", help="skip the dense NumPy and GraKeL peers")
    parser.add_argument("--techniques", action="store_true",
                        help="run the tiled solver's technique benchmark instead (the mgk-techniques suite)")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the default kernel on 80, 250 and 1000 molecules (full runs)")
    parser.add_argument("--gradient", action="store_true",
                        help="time K alone against K with its hyperparameter gradient (K, dK) instead")


# ---------------------------------------------------------------------------- data


# ---------------------------------------------------------------------------- measurements


def _n_pairs(n):
    return n * (n + 1) // 2


def _measure(kernel, graphs, repeat, **call):
    """Cold call (packing, octiles, upload) then timed warm calls: (cold_s, Timing, info, result)."""
    settle()
    t0 = time.perf_counter()
    K = kernel(graphs, **call)
    cold = time.perf_counter() - t0
    timing = time_cpu(lambda: kernel(graphs, **call), repeat=repeat, warmup=0)
    return cold, timing, kernel.info_, K


def _row(set_name, solver, pairs, seconds, *, estimated=False, **extra):
    row = {"set": set_name, "solver": solver, "pairs": pairs, "seconds": seconds,
           "pairs_per_s": pairs / seconds if seconds > 0 else float("nan"), "estimated": estimated,
           "est": "est" if estimated else ""}
    row.update(extra)
    if "cold_seconds" in extra:
        row.update(user_call_figures(extra["cold_seconds"], seconds, extra.get("kernel_seconds")))
    return row


TARGETS = {
    "grakel": Target("best GPU solver ≥ 1000x GraKeL's random-walk kernel per pair on labeled sets of 160 graphs",
                     ">=", 1000, sizes="160 graphs per set"),
    "peak": Target("dense-graph XMV ≥ 30% of the FP32 peak (fastest GPU solver, the flops it performs)", ">=", 30,
                   unit="%", sizes="40 near-complete graphs of 96 vertices"),
    "gradient": Target("K with its gradient (K, dK) ≤ 2.5x K alone on the default GPU solver, 160 graphs per set",
                       "<=", 2.5, sizes="160 graphs per set"),
    "first_warm": Target("first call ≤ 1.5x the warm call on the 1000 packaged molecules", "<=", 1.5,
                         sizes="the 1000 packaged molecules"),
    "warm_solve": Target("warm call ≤ 1.5x the GPU solve on the 1000 packaged molecules", "<=", 1.5,
                         sizes="the 1000 packaged molecules"),
    "user_rate": Target("warm call ≥ 6M pairs/s on the 1000 packaged molecules", ">=", 6.0, unit="M pairs/s",
                        sizes="the 1000 packaged molecules"),
}
TABLE_LEGEND = ("first call: fresh kernel object; warm: the same call again; kernel: the solve as the engine "
                "times it (- where the engine does not expose it); est: measured on a subset and scaled to the "
                "set; CG it: conjugate-gradient iterations per pair; us/pair-it: microseconds per CG iteration "
                "of one pair; XMV: the product-graph matrix-vector product; peers: the time of their call in the warm column")


def _grakel_input(G, labeled):
    A = G.to_scipy().toarray()
    if not labeled:
        return [A, {i: 0 for i in range(G.n_nodes)}]
    node_col = "label" if "label" in G.node_labels else "element"
    edge_col = "label" if "label" in G.edge_labels else "bond_order"
    nl = {i: int(v) for i, v in enumerate(G.node_labels[node_col])}
    rows = np.repeat(np.arange(G.n_nodes), np.diff(G.indptr))
    el = {(int(i), int(j)): int(v) for i, j, v in zip(rows, G.indices, G.edge_labels[edge_col])}
    return [A, nl, el]


def _grakel_row(set_name, graphs, labeled, n_sub, total_pairs, q):
    cls = "RandomWalkLabeled" if labeled else "RandomWalk"
    return guarded({"set": set_name, "solver": f"GraKeL {cls} (1 process)"}, _grakel_figures, set_name, graphs,
                   labeled, n_sub, total_pairs, q)


def _grakel_figures(set_name, graphs, labeled, n_sub, total_pairs, q):
    try:
        from grakel.kernels import RandomWalk, RandomWalkLabeled
    except ImportError as exc:
        return {"set": set_name, "solver": "GraKeL", "skipped": f"grakel not installed ({exc})"}
    cls = RandomWalkLabeled if labeled else RandomWalk
    sub = graphs[:n_sub]
    data = [_grakel_input(g, labeled) for g in sub]
    # lamda plays the role of the continuation probability; small enough for the series to converge
    kern = cls(lamda=min(q, 0.01), method_type="fast")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kern.fit_transform(data)
    dt = time.perf_counter() - t0
    per_pair = dt / _n_pairs(len(sub))
    return _row(set_name, f"GraKeL {cls.__name__} (1 process)", total_pairs, per_pair * total_pairs,
                estimated=len(sub) < len(graphs), measured_pairs=_n_pairs(len(sub)))


def _dense_row(*args):
    return guarded({"set": args[0], "solver": "dense NumPy (float64 LAPACK)"}, _dense_figures, *args)


def _dense_figures(set_name, graphs, node_kernel, edge_kernel, n_pairs, total_pairs, q, K_by_solver):
    from graphkern.mgk.dense import dense_mgk_pair

    nk, ek = node_kernel.compile(), edge_kernel.compile()
    idx = [(i, (i * 7 + 3) % len(graphs)) for i in range(n_pairs)]
    t0 = time.perf_counter()
    ref = [dense_mgk_pair(graphs[a], graphs[b], nk, ek, q=q) for a, b in idx]
    dt = time.perf_counter() - t0
    errors = {}
    for solver, (K, subset) in K_by_solver.items():
        errs = [abs(float(K[a, b]) - r) / r for (a, b), r in zip(idx, ref) if a < subset and b < subset]
        if errs:
            errors[f"max_rel_err_{solver}"] = max(errs)
    return _row(set_name, "dense NumPy (float64 LAPACK)", total_pairs, dt / n_pairs * total_pairs,
                estimated=True, measured_pairs=n_pairs, **errors)


SCALING_MOLECULES = (80, 250, 1000)
SCALING_MOLECULES_CPU = (50, 160, 600)  # 141x the pairs in minutes on a few cores


def _scaling(args, ctx, dtype, repeat, targets):
    """The default kernel on 80, 250 and 1000 packaged molecules (150x the pairs; 50, 160, 600 without a
    GPU): the user's three times; the molecules read with their hydrogens dropped (heavy atoms only,
    as cheminformatics kernels usually take them) and as in the file (about twice the atoms: four
    times the product graph), each judged on its own."""
    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel

    rows = []
    for hydrogens, label in ((False, "molecules, H dropped"), (True, "molecules with H")):
        for count in SCALING_MOLECULES if ctx.gpu else SCALING_MOLECULES_CPU:
            make = lambda: MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)),
                                                   TensorProduct(bond_order=KroneckerDelta(0.5)), q=args.q,
                                                   dtype=dtype)
            # read again each time: nothing cached on the graphs
            prepare = lambda: (make(), _molecules(args, count, None, hydrogens)[0])  # noqa: E731
            firsts, (kern, graphs), _ = first_calls(prepare, lambda k, g: k(g), MIN_FIRST_CALLS)
            warm = time_cpu(lambda: kern(graphs), repeat=repeat, warmup=0)
            kernel_s = getattr(kern.info_, "solve_seconds", None)
            rows.append(_row(label, f"graphkern default ({getattr(kern, 'backend_', 'auto')})", _n_pairs(count),
                             warm.median, graphs=count, repeats=len(warm.times), first_repeats=len(firsts),
                             **user_call_figures(float(np.median(firsts)), warm.median, kernel_s)))
        last = rows[-1]
        if last["graphs"] == 1000 and last.get("kernel_s"):
            for key, value, repeats in (("first_warm", last["first_s"] / last["warm_s"], MIN_FIRST_CALLS),
                                        ("warm_solve", last["warm_s"] / last["kernel_s"], last["repeats"]),
                                        ("user_rate", last["pairs"] / last["warm_s"] / 1e6, last["repeats"])):
                row = TARGETS[key].judge(value, ctx, repeats=repeats)
                targets.append(dict(row, target=f"{row['target']} ({label})"))
    print_table([in_ms(r, "first", "warm", "kernel") for r in rows],
                [("set", "set"), ("graphs", "molecules"), ("pairs", "pairs")] + USER_CALL_COLUMNS
                + [("pairs_per_s", "pairs/s", "{:.4g}")],
                title=f"the default kernel on the packaged molecules ({dtype.name}), first call: median of "
                      f"{MIN_FIRST_CALLS} fresh objects on freshly read graphs", legend=USER_CALL_LEGEND)
    return rows + [{"kind": "point", "series": f"graphkern default kernel ({r['set']})", "size": r["pairs"],
                    "seconds": r["warm_s"], "size_label": "pairs", "graph": f"molecules-{r['graphs']}"} for r in rows]


MIN_FIRST_CALLS = 3


def _series(solver):
    words = solver.split()
    return " ".join(words[:2]) if words[0] == "graphkern" else solver


def _xmv_stats(info, kernel_seconds, dtype):
    """Achieved XMV FLOP/s of a GPU call from its per-pair iterations and octile-pair counts."""
    per = FLOPS_PER_OCTILE_PAIR[info.edge_form]
    flops = float(np.sum(info.iterations.astype(np.float64) * info.octile_pairs)) * per
    peak = FP32_PEAK if np.dtype(dtype) == np.float32 else FP64_PEAK
    return dict(_rate(flops, kernel_seconds, dtype), floor_s=flops / peak)


def run(args, ctx):
    from graphkern._backend import resolve_threads
    from graphkern.bench.timing import scaled_estimate
    from graphkern.mgk import MarginalizedGraphKernel

    if getattr(args, "techniques", False):
        from graphkern.bench.suites import mgk_techniques
        return mgk_techniques.run(mgk_techniques.from_mgk_args(args), ctx)
    if getattr(args, "gradient", False):
        return run_gradient(args, ctx)
    quick = ctx.quick
    repeat = ctx.repeat or (1 if quick else 3)
    dtype = np.dtype(args.dtype)
    threads = resolve_threads(None)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    rows = []
    targets = []
    for set_name in sets:
        graphs, nk, ek, desc = build_set(set_name, args, quick)
        total = _n_pairs(len(graphs))
        sizes = np.array([g.n_nodes for g in graphs])
        ctx.log(f"-- {set_name}: {desc}; {total} pairs, {sizes.mean():.1f} vertices and "
                f"{np.mean([g.nnz for g in graphs]):.1f} stored edges per graph on average")
        set_rows = []
        K_by_solver = {}
        if ctx.gpu:
            for techniques, figures in (("tiled", _tiled_figures), ("csr", _csr_figures), ("gemm", _gemm_figures)):
                set_rows.append(_solver_row(techniques, figures, set_name, graphs, nk, ek, args.q, dtype, repeat,
                                            total, K_by_solver))
        defaults = DENSE_SET_DEFAULTS if set_name == "dense-labeled" else SUBSET_DEFAULTS
        n_cpu = len(graphs) if quick else min(len(graphs), args.cpu_graphs or defaults["cpu_graphs"])
        kern = MarginalizedGraphKernel(nk, ek, q=args.q, dtype=dtype, backend="cpu")
        cold, timing, info, K = _measure(kern, graphs[:n_cpu], repeat)
        scale = total / _n_pairs(n_cpu)
        t = scaled_estimate(timing, scale) if n_cpu < len(graphs) else timing
        cpu_calls = {} if t.estimated else {"cold_seconds": cold,
                                            "kernel_seconds": getattr(info, "solve_seconds", None)}
        set_rows.append(_row(set_name, f"graphkern CPU {dtype.name} ({threads} threads)", total, t.median,
                             estimated=t.estimated, measured_pairs=_n_pairs(n_cpu), **cpu_calls,
                             iterations_per_pair=info.iterations.mean(),
                             us_per_pair_iteration=timing.median / info.total_iterations * 1e6))
        K_by_solver["cpu"] = (K, n_cpu)
        if args.no_peers:
            set_rows.append({"set": set_name, "solver": "peers", "skipped": "--no-peers"})
        else:
            n_dense = args.dense_pairs or (3 if quick else defaults["dense_pairs"])
            set_rows.append(_dense_row(set_name, graphs, nk, ek, n_dense, total, args.q, K_by_solver))
            n_gk = min(len(graphs), args.grakel_graphs or (3 if quick else defaults["grakel_graphs"]))
            set_rows.append(_grakel_row(set_name, graphs, set_name != "nws" and set_name != "ba", n_gk, total,
                                        args.q))
        gpu_rows = [r for r in set_rows if r["solver"].startswith("graphkern GPU") and "seconds" in r]
        best_gpu = min(gpu_rows, key=lambda r: r["seconds"], default=None)
        best = best_gpu or next(r for r in set_rows if "seconds" in r)
        for r in set_rows:
            if "seconds" in r and r is not best:
                r["slower_than_best_x"] = r["seconds"] / best["seconds"]
        rows += set_rows
        shown = [in_ms(dict(r, warm_s=r.get("warm_s", r.get("seconds"))), "first", "warm", "kernel")
                 for r in set_rows]
        print_table(shown, [("solver", "solver")] + USER_CALL_COLUMNS +
                    [("est", "est"), ("pairs_per_s", "pairs/s", "{:.4g}"),
                     ("iterations_per_pair", "CG it", "{:.1f}"), ("us_per_pair_iteration", "us/pair-it", "{:.3g}"),
                     ("xmv_tflops", "XMV TFLOP/s", "{:.3g}"), ("xmv_peak_frac", "of peak", "{:.1%}"),
                     ("x_grakel", "x GraKeL", "{:.4g}"), ("note", "note")],
                    title=f"{set_name} ({desc}), {total} pairs; times of the whole Gram matrix", legend=TABLE_LEGEND)
        for r in set_rows:
            errs = {k: v for k, v in r.items() if k.startswith("max_rel_err")}
            for k, v in errs.items():
                check_answer(f"mgk {set_name} {k[12:]}", v, 1e-2 if dtype == np.float32 else 1e-6)
            if errs:
                ctx.log("  accuracy vs dense float64: " + ", ".join(f"{k[12:]} {v:.1e}" for k, v in errs.items()))
        labeled = set_name not in ("nws", "ba")
        grakel = next((r for r in set_rows if r["solver"].startswith("GraKeL") and "seconds" in r), None)
        ours = best_gpu or next((r for r in set_rows if "seconds" in r and r["solver"].startswith("graphkern")), None)
        if grakel is not None:
            for r in set_rows:
                if r["solver"].startswith("graphkern") and "seconds" in r:
                    r["x_grakel"] = grakel["seconds"] / r["seconds"]
            if ours is not None:
                rows.append({"kind": "headline_candidate", "what": f"mgk {ours['solver'].split()[1]} warm call, "
                             f"{set_name}", "ratio": grakel["seconds"] / ours["seconds"], "peer": "GraKeL",
                             "estimated": grakel["estimated"] or ours["estimated"], "pairs": total})
        if labeled and grakel is not None and best_gpu is not None:
            targets.append(TARGETS["grakel"].judge(grakel["seconds"] / best_gpu["seconds"], ctx,
                                                   estimated=grakel["estimated"], repeats=repeat,
                                                   detail=f"{set_name}: {best_gpu['solver']}",
                                                   full_size=len(graphs) >= 160))
        if set_name == "dense-labeled":
            rated = min((r for r in gpu_rows if "xmv_peak_frac" in r), key=lambda r: r["seconds"], default=None)
            if rated is not None and dtype == np.float32:
                targets.append(TARGETS["peak"].judge(100 * rated["xmv_peak_frac"], ctx, repeats=repeat,
                                                     detail=rated["solver"], full_size=len(graphs) >= 40))
        for r in set_rows:
            if "seconds" in r:
                rows.append({"kind": "point", "series": _series(r["solver"]), "size": total, "seconds": r["seconds"],
                             "estimated": r["estimated"], "size_label": "pairs", "graph": set_name})
    if not quick and not args.no_scaling:
        rows += _scaling(args, ctx, dtype, repeat, targets)
    if not ctx.gpu:
        targets.append(TARGETS["grakel"].judge(None, ctx, detail="needs a GPU"))
    print_targets(targets, title="targets (set for one H100-class GPU and 16 cores)")
    cands = [r for r in rows if r.get("kind") == "headline_candidate"]
    if cands:
        rows.append(dict(max(cands, key=lambda r: (not r["estimated"], r["pairs"])), kind="headline"))
    return rows + targets


def _solver_row(techniques, figures, set_name, graphs, node_kernel, edge_kernel, q, dtype, repeat, total,
                K_by_solver):
    """One GPU solver (``techniques``) on the whole set, with ``figures(kern, info, graphs, kernel_s)``
    added to its row; or a row saying how it failed (a solver variant failing is a row; the wrong-answer
    check is what fails the run)."""
    from graphkern.mgk import MarginalizedGraphKernel

    solver = f"graphkern GPU {techniques} solver {dtype.name}"
    try:
        kern = MarginalizedGraphKernel(node_kernel, edge_kernel, q=q, dtype=dtype, backend="gpu",
                                       techniques=techniques)
        cold, timing, info, K = _measure(kern, graphs, repeat)
        extra = figures(kern, info, graphs, info.solve_seconds)
    except Exception as exc:
        return {"set": set_name, "solver": solver, "failed": failure_text(exc), "note": failure_text(exc)}
    K_by_solver["gpu" if techniques == "tiled" else f"gpu_{techniques}"] = (K, len(graphs))
    return _row(set_name, solver, total, timing.median, cold_seconds=cold, kernel_seconds=info.solve_seconds,
                iterations_per_pair=info.iterations.mean(),
                us_per_pair_iteration=timing.median / info.total_iterations * 1e6, **extra)


def _tiled_figures(kern, info, graphs, kernel_s):
    """The tiled solver (techniques="tiled"): the XMV's rate in octile products."""
    return _xmv_stats(info, kernel_s, kern.dtype)


def _csr_figures(kern, info, graphs, kernel_s):
    """The CSR solver (cuda_src/mgk_csr.cu): entry pairs per second and its issue-rate floor (module docstring)."""
    nnz = np.array([g.nnz for g in graphs], dtype=np.float64)
    entry_pairs = float(np.sum(info.iterations * nnz[info.pairs[:, 0]] * nnz[info.pairs[:, 1]]))
    return dict(entry_pairs_per_s=entry_pairs / kernel_s if kernel_s > 0 else float("nan"),
                floor_s=entry_pairs * CSR_INSTRUCTIONS_PER_ENTRY_PAIR / 32 / CSR_WARP_INSTRUCTIONS_PER_S,
                **_rate(2 * entry_pairs, kernel_s, kern.dtype))


def _gemm_figures(kern, info, graphs, kernel_s):
    """The GEMM solver (cuda_src/mgk_gemm.cu): the XMV's FLOP/s in the flops its GEMMs perform, on the
    pairs its engine routes to it (module docstring)."""
    from graphkern.mgk.gemm import xmv_flops
    from graphkern.mgk.results import solver_arguments

    s = kern._settings()
    ds = kern._dataset(graphs, s)
    plan = kern._router(s).engines["gemm"].route(ds, ds, info.pairs, solver_arguments(ds, ds, s))
    n1, n2 = ds.n_nodes[info.pairs[:, 0]], ds.n_nodes[info.pairs[:, 1]]
    flops = float(np.sum(np.where(plan.take, info.iterations * xmv_flops(plan.terms, n1, n2), 0.0)))
    peak = FP32_PEAK if np.dtype(kern.dtype) == np.float32 else FP64_PEAK
    return dict(gemm_pairs=int(plan.take.sum()),
                terms_per_pair=float(plan.terms[plan.take].mean()) if plan.take.any() else 0.0,
                floor_s=flops / peak, **_rate(flops, kernel_s, kern.dtype))


def _rate(flops, kernel_seconds, dtype):
    """Achieved FLOP/s of ``flops`` in ``kernel_seconds`` against the card's peak of ``dtype``."""
    peak = FP32_PEAK if np.dtype(dtype) == np.float32 else FP64_PEAK
    rate = flops / kernel_seconds if kernel_seconds > 0 else float("nan")
    return {"xmv_flops": flops, "xmv_tflops": rate / 1e12, "xmv_peak_frac": rate / peak}


# ---------------------------------------------------------------------------- --gradient


def _gradient_rows(set_name, solver, kernel, graphs, repeat, total, measured, scale):
    """Rows for K alone and for (K, dK) of one kernel on ``graphs`` (``scale``: to the whole set)."""
    from graphkern.bench.timing import scaled_estimate

    _, t_k, info_k, K = _measure(kernel, graphs, repeat)
    _, t_g, info_g, (K_g, dK) = _measure(kernel, graphs, repeat, eval_gradient=True)
    if scale != 1:
        t_k, t_g = scaled_estimate(t_k, scale), scaled_estimate(t_g, scale)
    forward = info_g.iterations - info_g.adjoint_iterations
    contractions = _contractions(kernel, graphs)
    # XMV passes per pair: the GPU pairs the two solves, the CPU runs them one after the other
    solves = np.maximum(forward, info_g.adjoint_iterations) if info_g.backend == "gpu" else info_g.iterations
    xmv_ratio = float(np.sum(solves) + contractions * len(info_g.pairs)) / max(info_k.total_iterations, 1)
    k_row = _row(set_name, f"{solver}: K", total, t_k.median, estimated=scale != 1, measured_pairs=measured,
                 kernel_seconds=info_k.solve_seconds, iterations_per_pair=info_k.iterations.mean())
    g_row = _row(set_name, f"{solver}: K, dK ({kernel.n_dims} hyperparameters)", total, t_g.median,
                 estimated=scale != 1, measured_pairs=measured, kernel_seconds=info_g.solve_seconds,
                 iterations_per_pair=forward.mean(), adjoint_iterations_per_pair=info_g.adjoint_iterations.mean(),
                 x_of_K=t_g.median / t_k.median, xmv_ratio=xmv_ratio, n_dims=kernel.n_dims,
                 contractions=contractions)
    return k_row, g_row, dK


def _contractions(kernel, graphs):
    """Edge contractions per pair of a gradient call that cost an XMV after the two solves (the
    free ones are diagonal sums on both backends)."""
    s = kernel._settings()
    ds = kernel._dataset(graphs, s)
    plan = kernel._gradient_plan(s, ds, ds)
    return int(np.count_nonzero(plan.contraction_free == 0))


def run_gradient(args, ctx):
    """``mgk --gradient``: K alone against (K, dK) on the GPU (default and core solvers) and the CPU
    (module docstring)."""
    from graphkern._backend import resolve_threads
    from graphkern.mgk import MarginalizedGraphKernel

    quick = ctx.quick
    repeat = ctx.repeat or (1 if quick else 3)
    dtype = np.dtype(args.dtype)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    rows, targets = [], []
    for set_name in sets:
        graphs, nk, ek, desc = build_set(set_name, args, quick)
        total = _n_pairs(len(graphs))
        ctx.log(f"-- {set_name} --gradient: {desc}; {total} pairs")
        set_rows = []
        gpu_rows = {}  # solver -> (K row, (K, dK) row, dK)
        if ctx.gpu:
            for solver, techniques in (("GPU default solver", "auto"), ("GPU core solver", "core")):
                kern = MarginalizedGraphKernel(nk, ek, q=args.q, dtype=dtype, backend="gpu", techniques=techniques)
                try:
                    gpu_rows[solver] = _gradient_rows(set_name, solver, kern, graphs, repeat, total, total, 1)
                except Exception as exc:  # a solver failing is a row; the others still run
                    set_rows.append({"set": set_name, "solver": f"{solver}: K, dK", "skipped": failure_text(exc)})
                    continue
                set_rows += list(gpu_rows[solver][:2])
        defaults = DENSE_SET_DEFAULTS if set_name == "dense-labeled" else SUBSET_DEFAULTS
        n_cpu = len(graphs) if quick else min(len(graphs), args.cpu_graphs or defaults["cpu_graphs"])
        cpu = MarginalizedGraphKernel(nk, ek, q=args.q, dtype=dtype, backend="cpu")
        k_cpu, g_cpu, dK_cpu = _gradient_rows(set_name, f"CPU ({resolve_threads(None)} threads)", cpu,
                                              graphs[:n_cpu], repeat, total, _n_pairs(n_cpu), total / _n_pairs(n_cpu))
        set_rows += [k_cpu, g_cpu]
        for _, g_row, dK_gpu in gpu_rows.values():
            sub = dK_gpu[:n_cpu, :n_cpu]
            g_row["max_rel_diff_dK_vs_cpu"] = float(np.max(np.abs(sub - dK_cpu)) / np.max(np.abs(dK_cpu)))
        rows += set_rows
        print_table(set_rows, [("solver", "solver"), ("pairs", "pairs"), ("seconds", "time s", "{:.4g}"),
                               ("est", "est"), ("kernel_seconds", "kernel s", "{:.4g}"),
                               ("iterations_per_pair", "CG it/pair", "{:.1f}"),
                               ("adjoint_iterations_per_pair", "adjoint it/pair", "{:.1f}"),
                               ("x_of_K", "x of K", "{:.2f}"), ("xmv_ratio", "XMV passes", "{:.2f}"),
                               ("contractions", "contractions", "{}"),
                               ("max_rel_diff_dK_vs_cpu", "dK GPU vs CPU", "{:.1e}"), ("skipped", "skipped")],
                    title=f"{set_name} --gradient ({desc})", legend=TABLE_LEGEND + "; x of K: this time / K's time")
        default = gpu_rows.get("GPU default solver")
        if default and set_name != "dense-labeled":  # dense-labeled is the XMV-peak set, not a gradient set
            targets.append(TARGETS["gradient"].judge(default[1]["x_of_K"], ctx, repeats=repeat, detail=set_name,
                                                     full_size=len(graphs) >= 160))
        core = gpu_rows.get("GPU core solver")
        if core:
            ctx.log(f"  core solver: (K, dK) {core[1]['x_of_K']:.3g}x its K"
                    + (f"; {core[1]['seconds'] / default[1]['seconds']:.3g}x the default solver's" if default else ""))
    if not ctx.gpu:
        targets.append(TARGETS["gradient"].judge(None, ctx, detail="needs a GPU"))
    print_targets(targets, title="targets (set for one H100-class GPU and 16 cores)")
    return rows + targets
