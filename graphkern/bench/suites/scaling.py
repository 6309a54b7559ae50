"""Scaling over the GPUs of one host: exp(βA)1 and the marginalized kernel on 1, 2, 4, ... GPUs.

exp(βA)1 (float64, tol 1e-10, degree order where the solver picks it) on R-MAT scale 23 and 24
(edge factor 16) and a Delaunay graph of 2^24 points.  For each device count: the first call
(cache cleared: validation, upload, plans), the median of warm calls, the wall time per Lanczos
step, and each device's timeline over the warm call's steps: seconds in its fused SpMVs (the
alpha reduction's partials included), in its updates (the new vector's rows stored into the other
devices' copies, the beta partials), and waiting between steps for the other devices or the
host.  The device with the least waiting is the one that bounds the step; the others' waits are
its lead.  Agreement: the relative 2-norm difference from the one-GPU answer.

The marginalized kernel, float32, in one process: 64 protein-like contact graphs of 300-600
residues (residue types, distance-labeled edges) and 10,000 molecules (the packaged 1000 repeated
as distinct Graph objects, 50 million pairs), with the default solvers: on several GPUs each
device runs its own CSR / GEMM solvers on a share of the small pairs of equal predicted cost, and
the pairs of large graphs go to the tiled solver, whose devices share one work queue.  Each device's pairs and kernel seconds are shown: the
gap between a device's seconds and the slowest one's is its idle tail.  The same Gram matrices
through ``graphkern.distributed`` with one Dask worker per GPU: ``graphkern-bench distributed``.

Targets (H100s; the full sizes): exp(βA)1 on the largest graph 4 GPUs ≥ 3.2x one and 8 GPUs ≥ 6x;
the marginalized kernel ≥ 3.6x on 4 GPUs and ≥ 7x on 8.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from graphkern.bench.report import Target, failure_text, print_table, print_targets, say
from graphkern.bench.timing import settle, time_cpu

NAME = "scaling"
HELP = "exp(beta A)1 and the marginalized kernel on 1, 2, 4, ... GPUs of one host (per-device timelines)"

GRAPHS = {
    "rmat23": ("R-MAT scale 23, edge factor 16", "rmat", (23, 16), {"seed": 23}),
    "rmat24": ("R-MAT scale 24, edge factor 16", "rmat", (24, 16), {"seed": 24}),
    "delaunay24": ("Delaunay 2^24 points", "delaunay", (1 << 24,), {"seed": 24}),
    # small stand-ins for --quick
    "rmat18": ("R-MAT scale 18, edge factor 16", "rmat", (18, 16), {"seed": 18}),
}
FULL_GRAPHS = ("rmat23", "rmat24", "delaunay24")
LARGEST = "rmat24"
TARGETS = {
    ("expm", 4): Target("exp(βA)1 on 4 GPUs ≥ 3.2x one GPU (warm call, R-MAT scale 24)", ">=", 3.2, gpus=4,
                        sizes="R-MAT scale 24"),
    ("expm", 8): Target("exp(βA)1 on 8 GPUs ≥ 6x one GPU (warm call, R-MAT scale 24)", ">=", 6, gpus=8,
                        sizes="R-MAT scale 24"),
    ("mgk", 4): Target("marginalized kernel on 4 GPUs ≥ 3.6x one GPU (warm Gram matrix)", ">=", 3.6, gpus=4,
                       sizes="64 protein-like graphs and 10,000 molecules"),
    ("mgk", 8): Target("marginalized kernel on 8 GPUs ≥ 7x one GPU (warm Gram matrix)", ">=", 7, gpus=8,
                       sizes="64 protein-like graphs and 10,000 molecules"),
}


def add_arguments(parser):
    parser.add_argument("--graphs", default=None,
                        help=f"comma-separated graphs for exp(βA)1 from {', '.join(GRAPHS)} "
                             f"(default {','.join(FULL_GRAPHS)}; rmat18 with --quick); 'none' skips them")
    parser.add_argument("--devices", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="device counts, e.g. 1,2,4 (default 1, 2, 4, 8 up to the GPUs visible)")
    parser.add_argument("--proteins", type=int, default=None, help="protein-like graphs (default 64; --quick 8)")
    parser.add_argument("--molecules", type=int, default=None,
                        help="molecules (default 10000; --quick 300); 0 skips the molecular set")


def _generate(spec):
    from graphkern import generators

    _, fn, a, kw = GRAPHS[spec]
    t0 = time.perf_counter()
    G = getattr(generators, fn)(*a, **kw)
    return G, time.perf_counter() - t0


def run(args, ctx):
    n_gpus = len(ctx.system.get("gpus") or [])
    if n_gpus < 2:
        ctx.log(f"skipped: {n_gpus} GPU visible (this suite compares several GPUs of one host with one)")
        return [{"skipped": f"{n_gpus} GPU"}]
    counts = args.devices or [k for k in (1, 2, 4, 8) if k <= n_gpus]
    counts = [k for k in counts if k <= n_gpus]
    names = [] if args.graphs == "none" else (args.graphs.split(",") if args.graphs else
                                              ["rmat18"] if ctx.quick else list(FULL_GRAPHS))
    unknown = [g for g in names if g not in GRAPHS]
    if unknown:
        raise ValueError(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(GRAPHS)}")
    ctx.log(f"-- {n_gpus} GPU(s) visible; device counts {counts}")
    rows, targets = [], []
    # the large graphs are generated in other processes while the marginalized kernel runs
    with ProcessPoolExecutor(max_workers=max(1, len(names)), mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {name: pool.submit(_generate, name) for name in names}
        rows += _mgk(args, ctx, counts, targets)
        for name in names:
            try:
                G, seconds = pending[name].result()
            except Exception as exc:  # a generator's failure is a row, not the end of the suite
                rows.append({"graph": name, "failed": failure_text(exc)})
                ctx.log(f"   {name}: failed to generate: {failure_text(exc)}")
                continue
            ctx.log(f"-- {GRAPHS[name][0]}: n={G.n_nodes:,}, {G.nnz:,} stored entries (generated in {seconds:.1f} s)")
            rows += _expm(name, G, ctx, counts, targets)
            del G
    print_targets(targets)
    return rows + targets


# ----------------------------------------------------------------------------- exp(βA)1


def _expm(name, G, ctx, counts, targets):
    from graphkern.expm import clear_cache, expm_multiply

    repeat = max(ctx.repeat or 5, 3)
    beta = 1.0
    rows, ref = [], None
    for k in counts:
        device = 0 if k == 1 else list(range(k))
        kw = dict(backend="gpu", device=device, dtype=np.float64, tol=1e-10)
        clear_cache()
        settle()
        t0 = time.perf_counter()
        try:
            _, probe = expm_multiply(G, beta=beta, **kw)
        except Exception as exc:
            rows.append({"graph": name, "devices": k, "failed": failure_text(exc)})
            ctx.log(f"   {k} GPU(s): failed: {failure_text(exc)}")
            continue
        first = time.perf_counter() - t0
        if abs(beta) * probe.lambda_max > 300 and k == counts[0]:
            beta = float(f"{150 / probe.lambda_max:.3g}")  # keep exp(beta lambda_1) finite in float64
            clear_cache()
            settle()
            t0 = time.perf_counter()
            expm_multiply(G, beta=beta, **kw)
            first = time.perf_counter() - t0
        out = []
        timing = time_cpu(lambda: out.append(expm_multiply(G, beta=beta, **kw)), repeat=repeat, warmup=1)
        y, info = out[-1]
        y = y.astype(np.float64) * math.exp(info.log_scale)
        if ref is None:
            ref = y
        rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        row = {"kind": "expm", "graph": name, "n": G.n_nodes, "nnz": G.nnz, "beta": beta, "devices": k,
               "first_s": first, "warm_s": timing.median, "repeats": len(timing.times), "krylov": info.krylov_dim,
               "n_spmv": info.n_spmv, "step_us": 1e6 * timing.median / max(info.n_spmv, 1),
               "lead_spmv_us": 1e6 * info.times["spmv"] / max(info.n_spmv, 1),
               "lead_vector_us": 1e6 * info.times["vector"] / max(info.n_spmv, 1),
               "host_s": info.times.get("host"), "output_s": info.times.get("output"), "exchange": info.exchange or "-",
               "reorder": info.reorder, "rel_vs_1gpu": rel, "timeline": [dict(t) for t in info.timeline]}
        rows.append(row)
    if not rows or "warm_s" not in rows[0]:
        return rows
    one = rows[0]
    for r in rows:
        if "warm_s" in r:
            r["speedup"] = one["warm_s"] / r["warm_s"]
    print_table(rows, ["devices", ("first_s", "first s", "{:.3f}"), ("warm_s", "warm s", "{:.4f}"),
                       ("speedup", "x 1 GPU", "{:.2f}"), "n_spmv", ("step_us", "us/step", "{:.0f}"),
                       ("lead_spmv_us", "lead SpMV us", "{:.0f}"), ("lead_vector_us", "lead update us", "{:.0f}"),
                       ("output_s", "output s", "{:.4f}"), ("exchange", "exchange"),
                       ("rel_vs_1gpu", "rel diff", "{:.1e}"), ("failed", "failed")],
                title=f"exp(βA)1 on {GRAPHS[name][0]} (β={beta:g}, float64; warm: median of {repeat})",
                legend="first: the first call after the cache is cleared; us/step: warm wall time per Lanczos "
                       "step (SpMV count); lead SpMV / update us: device 0's kernels per step (device events); "
                       "exchange: store = rows written into the other GPUs' copies inside the update; rel diff: "
                       "relative 2-norm difference from the one-GPU answer")
    _print_timelines(rows)
    for k in (4, 8):
        row = next((r for r in rows if r["devices"] == k and "speedup" in r), None)
        if row is not None and name == LARGEST:
            targets.append(TARGETS[("expm", k)].judge(row["speedup"], ctx, repeats=row["repeats"], detail=name))
    return rows


def _print_timelines(rows):
    lines = []
    for r in rows:
        for t in r.get("timeline") or []:
            steps = max(t["steps"], 1)
            lines.append({"devices": r["devices"], "device": t["device"], "rows": t["rows"],
                          "spmv_us": 1e6 * t["spmv"] / steps, "vector_us": 1e6 * t["vector"] / steps,
                          "wait_us": 1e6 * t["wait"] / steps, "steps": t["steps"]})
    if lines:
        print_table(lines, ["devices", "device", ("rows", "rows", "{:,}"), ("spmv_us", "SpMV us/step", "{:.0f}"),
                            ("vector_us", "update us/step", "{:.0f}"), ("wait_us", "wait us/step", "{:.0f}"), "steps"],
                    title="per-device timeline of the last warm call",
                    legend="wait: time between a device's steps not spent in its own kernels (the other devices, "
                           "the host's checks); the device that waits least bounds the step")


# ----------------------------------------------------------------------------- marginalized kernel


def _mgk_sets(args, ctx):
    from graphkern.basekernels import KroneckerDelta, SquareExponential, TensorProduct
    from graphkern.bench.suites.distributed import _molecules
    from graphkern.bench.suites.mgk_techniques import protein_set

    n_prot = args.proteins if args.proteins is not None else (8 if ctx.quick else 64)
    n_mol = args.molecules if args.molecules is not None else (300 if ctx.quick else 10_000)
    if n_prot:
        graphs = protein_set(n_prot, (300, 600), 0)
        yield (f"{n_prot} proteins", graphs, TensorProduct(residue=KroneckerDelta(0.5)),
               TensorProduct(distance=SquareExponential(1.0)))
    if n_mol:
        yield (f"{n_mol:,} molecules", _molecules(n_mol), TensorProduct(element=KroneckerDelta(0.5)),
               TensorProduct(bond_order=KroneckerDelta(0.5)))


def _mgk(args, ctx, counts, targets):
    from graphkern.mgk import MarginalizedGraphKernel

    repeat = ctx.repeat or (1 if ctx.quick else 3)
    rows = []
    for set_name, graphs, nk, ek in _mgk_sets(args, ctx):
        pairs = len(graphs) * (len(graphs) + 1) // 2
        ctx.log(f"-- marginalized kernel on {set_name} ({pairs:,} pairs, float32, q=0.05)")
        mine, K1 = [], None
        for k in counts:
            device = 0 if k == 1 else list(range(k))
            kern = MarginalizedGraphKernel(nk, ek, q=0.05, dtype=np.float32, backend="gpu", device=device)
            try:
                settle()
                t0 = time.perf_counter()
                K = kern(graphs)
                first = time.perf_counter() - t0
                timing = time_cpu(lambda: kern(graphs), repeat=repeat, warmup=0)
            except Exception as exc:
                mine.append({"kind": "mgk", "set": set_name, "devices": k, "failed": failure_text(exc)})
                continue
            if K1 is None:
                K1 = K
            per_device = _device_runs(kern.last_engine_) if k > 1 else []
            mine.append({"kind": "mgk", "set": set_name, "devices": k, "pairs": pairs, "first_s": first,
                         "warm_s": timing.median, "repeats": len(timing.times), "kernel_s": kern.info_.solve_seconds,
                         "pairs_per_s": pairs / timing.median,
                         "max_rel_vs_1gpu": float(np.max(np.abs(K - K1) / np.maximum(np.abs(K1), 1e-30))),
                         "solvers": dict(kern.last_engine_.last_run), "per_device": per_device})
        ok = [r for r in mine if "warm_s" in r]
        for r in ok:
            r["speedup"] = ok[0]["warm_s"] / r["warm_s"]
            if r["per_device"]:
                slowest = max(d["kernel_s"] for d in r["per_device"])
                r["idle_tail"] = ", ".join(f"{slowest - d['kernel_s']:.3f}" for d in r["per_device"])
                r["device_pairs"] = ", ".join(f"{d['pairs']:,}" for d in r["per_device"])
                r["teams"] = ", ".join(sorted({d["tiled_team"] for d in r["per_device"] if "tiled_team" in d})) or "-"
        print_table(mine, ["devices", ("first_s", "first s", "{:.3f}"), ("warm_s", "warm s", "{:.3f}"),
                           ("kernel_s", "kernel s", "{:.3f}"), ("pairs_per_s", "pairs/s", "{:,.0f}"),
                           ("speedup", "x 1 GPU", "{:.2f}"), ("device_pairs", "pairs per device"),
                           ("idle_tail", "idle tail s per device"), ("teams", "tiled teams"), ("max_rel_vs_1gpu", "max rel diff", "{:.1e}"),
                           ("failed", "failed")],
                    title=f"marginalized kernel on {set_name}: 1 GPU against several (default solvers); warm: "
                          f"median of {repeat}",
                    legend="kernel: the solve on the slowest device (device events); tiled teams: the team kind the "
                           "tiled solver chose (warp, block, cluster); idle tail: the slowest "
                           "device's kernel seconds minus this device's; max rel diff: against the one-GPU matrix")
        for k in (4, 8):
            row = next((r for r in ok if r["devices"] == k), None)
            if row is not None:
                targets.append(TARGETS[("mgk", k)].judge(row["speedup"], ctx, repeats=row["repeats"],
                                                         detail=set_name, full_size=not ctx.quick))
        rows += mine
    if not rows:
        say("   (no marginalized-kernel set chosen)")
    return rows


def _device_runs(router):
    """Per device of the last call: pairs and kernel seconds, over its own solvers' share and its
    claims from the tiled solver's shared queue."""
    runs = {int(d): {"device": int(d), "pairs": int(p), "kernel_s": float(s)}
            for d, p, s, _ in getattr(router, "device_runs", [])}
    if router.last_run.get("tiled"):
        for d, p, s, team in router.engines["tiled"].last_run:
            r = runs.setdefault(int(d), {"device": int(d), "pairs": 0, "kernel_s": 0.0})
            r["pairs"] += int(p)
            r["kernel_s"] += float(s)
            r["tiled_team"] = str(team)
    return sorted(runs.values(), key=lambda r: r["device"])
