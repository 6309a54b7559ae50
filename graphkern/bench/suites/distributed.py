"""graphkern.distributed.gram on a local cluster: tiles/s and pairs/s for 1, 2, ... workers.

The marginalized kernel (element and bond-order Kronecker deltas, h=0.5, q=0.05, float32) on the
packaged 1000 NCI molecules repeated (as distinct Graph objects) to ``--molecules`` (default
4000, 8 million pairs).  With GPUs: one worker per GPU for 1, 2, ... of them, against the
in-process kernel on one GPU and on the same GPUs (``device=[0, 1, ...]``, its tiled multi-GPU
solver).  Without: CPU workers of one thread each against the in-process kernel with as many
OpenMP threads (``--quick``: 120 molecules, seconds).

Each time is one ``gram`` call on a started cluster, graphs on the host: scattering the graphs,
packing them on every worker, the tiles, gathering the matrix; the cluster's start is shown on
its own.  The in-process time is the first call on a fresh kernel (packing included).
Per-tile overhead = (workers x wall time - the tiles' kernel seconds) / tiles.  ``bit-equal``
compares with the row's in-process run: on several GPUs that is the tiled multi-GPU solver, whose
rounding differs from the one-GPU solvers each worker runs, so there it is expected False.
Times are medians of ``--repeat`` calls (3 on a full run).  Targets, judged by the shared helper
on two H100-class GPUs at 4,000 molecules or more: 2 workers >= 1.8x one; Dask within 10% of the
in-process multi-GPU run.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from graphkern.bench.cli import print_table
from graphkern.bench.report import Target, print_targets

NAME = "distributed"
HELP = "graphkern.distributed.gram: tiles/s and pairs/s on 1, 2, ... workers vs the in-process kernel"


def add_arguments(parser):
    parser.add_argument("--molecules", type=int, default=None, help="graphs (default 4000; --quick 120)")
    parser.add_argument("--tile", type=int, default=None, help="tile edge in graphs (default: gram's choice)")
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="worker counts to run, e.g. 1,2 (default: 1 and every GPU, or 1,2 CPU workers)")
    parser.add_argument("--gpu-worker-threads", type=int, default=None,
                        help="OpenMP threads of every GPU worker (default: its share of the cores, cores / workers); "
                             "the same count for every worker count separates the GPUs' scaling from the cores'")


def _molecules(n):
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    base = [g for g in read_sdf(molecules_path()) if g.n_nodes > 0]
    return [base[k % len(base)] if k < len(base) else copy.deepcopy(base[k % len(base)]) for k in range(n)]


def _kernel(**kw):
    from graphkern.basekernels import KroneckerDelta, TensorProduct
    from graphkern.mgk import MarginalizedGraphKernel

    return MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)),
                                   TensorProduct(bond_order=KroneckerDelta(0.5)), q=0.05, **kw)


def _warm_worker(backend):
    """A small Gram matrix on this worker (run on every worker by ``Client.run``)."""
    _kernel(backend=backend, n_threads=1)(_molecules(40))


TARGETS = {
    "scale": Target("2 Dask GPU workers ≥ 1.8x one", ">=", 1.8, gpus=2, sizes="4,000 molecules or more"),
    "overhead": Target("Dask on 2 GPUs within 10% of the in-process kernel on them", "<=", 1.1, unit="", gpus=2,
                       sizes="4,000 molecules or more"),
}


def _median_run(runs):
    """The run of median time among ``(seconds, ...)`` tuples (the upper one of an even count)."""
    return sorted(runs, key=lambda r: r[0])[len(runs) // 2]


def _in_process(graphs, repeat, **kw):
    runs = []
    for _ in range(repeat):
        kernel = _kernel(**kw)
        t0 = time.perf_counter()
        K = kernel(graphs)
        runs.append((time.perf_counter() - t0, K))
    return _median_run(runs)


def _where_the_time_went(spans, t0, t1):
    """From each tile's ``(worker, start, end, received)`` (wall clock) and the call's span: the
    mean delay until a worker starts its first tile, its mean idle time between tiles, the mean
    time from its last tile to the end of the call, and the mean time a result takes to reach
    the caller, in ms."""
    by_worker = {}
    for worker, start, end, received in spans:
        by_worker.setdefault(worker, []).append((start, end))
    firsts, gaps, tails = [], [], []
    for runs in by_worker.values():
        runs.sort()
        firsts.append(runs[0][0] - t0)
        gaps += [b[0] - a[1] for a, b in zip(runs, runs[1:])]
        tails.append(t1 - runs[-1][1])
    mean = lambda v: 1e3 * float(np.mean(v)) if v else 0.0  # noqa: E731
    return {"first_start_ms": mean(firsts), "idle_ms_per_tile": mean(gaps), "tail_ms": mean(tails),
            "latency_ms_per_tile": mean([r - e for _, _, e, r in spans])}


def run(args, ctx):
    try:
        from distributed import Client
    except ImportError:
        ctx.log("skipped: dask.distributed is not installed (pip install 'graphkern[distributed]')")
        return [{"skipped": "dask.distributed is not installed"}]
    from graphkern.distributed._cluster import environ_kept, gpu_worker_threads, local_cluster, visible_gpus
    from graphkern.distributed.api import _gram

    gpus = visible_gpus()
    n = args.molecules or (120 if ctx.quick else 4000)
    repeat = ctx.repeat or (1 if ctx.quick else 3)
    counts = args.workers or ([1] + list(range(2, len(gpus) + 1)) if gpus else [1, 2])
    graphs = _molecules(n)
    pairs = n * (n + 1) // 2
    where = "gpu" if gpus else "cpu"
    ctx.log(f"-- {n} molecules ({pairs:,} pairs), MGK float32 q=0.05, {where} workers {counts}")
    rows = []
    for k in counts:
        if gpus and k > len(gpus):
            ctx.log(f"   {k} workers: only {len(gpus)} GPU(s) visible, skipped")
            continue
        kw = dict(backend="gpu", device=list(range(k)) if k > 1 else 0) if gpus else dict(backend="cpu", n_threads=k)
        base_s, K_ref = _in_process(graphs, repeat, **kw)
        t0 = time.perf_counter()
        threads = 1
        if gpus:
            threads = args.gpu_worker_threads or gpu_worker_threads(k)
            cluster = local_cluster(gpus[:k], 1, threads)
        else:
            from distributed import LocalCluster
            with environ_kept():  # the nannies would leave OMP_NUM_THREADS=1 in this process
                cluster = LocalCluster(n_workers=k, threads_per_worker=1, processes=True, dashboard_address=None)
        with cluster, Client(cluster) as client:
            client.wait_for_workers(k)
            start_s = time.perf_counter() - t0
            # as a user builds it: GPU workers run the host work on their share of the cores (the
            # cluster's OMP_NUM_THREADS); a CPU worker is one core, against the in-process n_threads=k
            kernel = _kernel(backend="gpu") if gpus else _kernel(backend="cpu", n_threads=1)
            # every worker imports graphkern, starts CUDA and loads the solvers' modules before the clock
            client.run(_warm_worker, "gpu" if gpus else "cpu")
            runs = []
            for _ in range(repeat):
                t0, w0 = time.perf_counter(), time.time()
                K, stats = _gram(kernel, graphs, client=client, tile=args.tile)
                wall = time.perf_counter() - t0
                runs.append((wall, dict(stats, **_where_the_time_went(stats["tile_spans"], w0, w0 + wall))))
        wall, stats = _median_run(runs)
        same = bool(np.array_equal(K, K_ref))
        tiles = stats["tiles"]
        host_s = sum(stats["tile_seconds"]) - sum(stats["solve_seconds"])
        rows.append({"workers": k, "device": where, "threads": threads, "tiles": tiles, "pairs": stats["pairs"],
                     "seconds": wall, "tile_seconds_sum": sum(stats["tile_seconds"]),
                     "host_ms_per_tile": 1e3 * host_s / max(tiles, 1),
                     "tiles_per_s": tiles / wall, "pairs_per_s": stats["pairs"] / wall,
                     "overhead_ms_per_tile": 1e3 * (k * wall - sum(stats["tile_seconds"])) / max(tiles, 1),
                     "first_start_ms": stats["first_start_ms"], "idle_ms_per_tile": stats["idle_ms_per_tile"],
                     "tail_ms": stats["tail_ms"], "latency_ms_per_tile": stats["latency_ms_per_tile"],
                     "in_process_s": base_s, "dask_vs_in_process": wall / base_s, "cluster_start_s": start_s,
                     "equal_to_in_process": same, "max_abs_diff": float(np.max(np.abs(K - K_ref)))})
    one = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["speedup_vs_1"] = one["seconds"] / r["seconds"] if one else float("nan")
    print_table(rows, ["workers", "device", "threads", "tiles", ("pairs", "pairs", "{:,}"), ("seconds", "s", "{:.2f}"),
                       ("tile_seconds_sum", "tiles' own s", "{:.2f}"), ("host_ms_per_tile", "host ms/tile", "{:.1f}"),
                       ("tiles_per_s", "tiles/s", "{:.1f}"), ("pairs_per_s", "pairs/s", "{:,.0f}"),
                       ("speedup_vs_1", "vs 1", "{:.2f}x"), ("overhead_ms_per_tile", "ms/tile overhead", "{:.1f}"),
                       ("first_start_ms", "first tile ms", "{:.0f}"), ("idle_ms_per_tile", "idle ms/tile", "{:.1f}"),
                       ("tail_ms", "tail ms", "{:.0f}"), ("latency_ms_per_tile", "result ms/tile", "{:.1f}"),
                       ("in_process_s", "in-process s", "{:.2f}"), ("dask_vs_in_process", "dask/in-proc", "{:.2f}"),
                       ("cluster_start_s", "start s", "{:.1f}"), ("equal_to_in_process", "bit-equal")],
                legend="threads: OpenMP threads of each worker; tiles' own s: the tiles' seconds summed over the "
                       "workers; host: a tile's own seconds less its solvers' (the kernel's info_.solve_seconds); "
                       "overhead: workers x wall - the tiles' own seconds, per tile; first tile: from the "
                       "call to a worker's first tile (graphs scattered, tasks scheduled); idle: a worker's mean gap between "
                       "tiles; tail: from its last tile to the end of the call; result: from a tile's end to its "
                       "arrival at the caller")
    two = next((r for r in rows if r["workers"] == 2 and r["device"] == "gpu"), None)
    verdicts = [TARGETS["scale"].judge(two["speedup_vs_1"] if two and one else None, ctx, repeats=repeat,
                                       full_size=n >= 4000),
                TARGETS["overhead"].judge(two["dask_vs_in_process"] if two else None, ctx, repeats=repeat,
                                          full_size=n >= 4000)]
    print_targets(verdicts, title="distributed targets (set for two H100-class GPUs)")
    return rows + verdicts
