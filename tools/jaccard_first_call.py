"""Jaccard as a user calls it against the kernel alone, on one GPU, in a fresh process.

    python3 tools/jaccard_first_call.py [--graph chung_lu|hub|both] [--repeat 5]

For each graph (fixed seeds, graphkern.generators): ``chung_lu`` is chung_lu(2_000_000, 2.3, 16,
seed=3) (~31.9M stored entries), ``hub`` is chung_lu(250_000, 2.1, 28, max_degree=90_000,
seed=3) (~5.8M entries, one hub of ~39k: ``auto`` picks ``longrow``), ``bench`` the benchmark's
Chung-Lu graph (n=2M, max_degree=n-1, seed 13: 31.2M entries, hubs up to 179k).  It prints

* cold: the process's first ``jaccard(A, backend="gpu")`` (CUDA context and module load included;
  only for the first graph),
* first: ``jaccard(A, backend="gpu")`` with the context up, each on a fresh copy of the SciPy
  matrix: the median of ``--repeat`` such calls, their spread, and the SimilarityInfo times
  (validate, validate_device, plan, upload, compute, download: the part of the copy left after
  the kernels, which copy finished rows out while later ones run) of the median call,
* checks: that call's input checks, split into the host's part and the device's check kernel,
* warm: the median of ``--repeat`` further calls on one matrix,
* kernel: DeviceSimilarity.compute alone between CUDA events (median of ``--repeat``),
* cpu: ``jaccard(A, backend="cpu")`` on all cores, each on a fresh copy (median of ``--repeat``),

and the targets, judged on the medians: first <= 3x kernel, and cpu / first >= 10.  A single first
call swings by 15% and more from one to the next (a host pass or the kernels slower once), so no
verdict rests on one.  Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import scipy.sparse as sp

GRAPHS = {
    "chung_lu": dict(n=2_000_000, gamma=2.3, avg_degree=16, seed=3),
    "hub": dict(n=250_000, gamma=2.1, avg_degree=28, max_degree=90_000, seed=3),
    "bench": dict(n=2_000_000, gamma=2.3, avg_degree=16, max_degree=1_999_999, seed=13),
}


def kernel_ms(A, repeat):
    from graphkern._cuda import runtime as rt
    from graphkern.similarity.api import symmetric_pattern
    from graphkern.similarity.gpu import DeviceSimilarity

    dev = rt.get_device(0)
    run = DeviceSimilarity(dev, symmetric_pattern(A), metric=0, self_loops=False, dtype=np.float32)
    run.upload()
    start, end = rt.Event(dev), rt.Event(dev)
    times = []
    for _ in range(repeat + 1):  # the first run warms up
        start.record(run.stream)
        run.compute()
        end.record(run.stream)
        end.synchronize()
        times.append(start.elapsed_ms(end))
    return float(np.median(times[1:])), run.variant


def main():
    import graphkern
    from graphkern.generators import chung_lu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", choices=("chung_lu", "hub", "bench", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3, help="the generator's seed (the benchmark's graphs use 13)")
    parser.add_argument("--profile", action="store_true", help="print the first call's slowest functions (cProfile)")
    args = parser.parse_args()
    names = ["chung_lu", "hub"] if args.graph == "both" else [args.graph]
    print(f"graphkern {graphkern.__version__}; {os.cpu_count()} CPUs")
    cold = True
    for name in names:
        t = time.perf_counter()
        A = sp.csr_matrix(chung_lu(**dict(GRAPHS[name], **({} if name == "bench" else {"seed": args.seed})),
                                   as_csr=True))
        degrees = np.diff(A.indptr)
        print(f"\n{name}: n={A.shape[0]:,} nnz={A.nnz:,} max degree {degrees.max():,} "
              f"(generated in {time.perf_counter() - t:.1f} s)")
        if cold:
            t = time.perf_counter()
            graphkern.jaccard(A.copy(), backend="gpu")
            print(f"  cold   {1e3 * (time.perf_counter() - t):9.1f} ms  (context and module load included) "
                  f"on {graphkern.devices()[0]['name']}")
            cold = False
        calls = []
        for _ in range(args.repeat):
            B = A.copy()
            t = time.perf_counter()
            R, info = graphkern.jaccard(B, backend="gpu", return_info=True)
            calls.append((1e3 * (time.perf_counter() - t), info))
            del B
        calls.sort(key=lambda c: c[0])
        first, info = calls[len(calls) // 2]
        parts = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in info.times.items())
        print(f"  first  {first:9.1f} ms  (median of {args.repeat} fresh copies, {calls[0][0]:.1f} to "
              f"{calls[-1][0]:.1f}) variant {info.variant}; ms: {parts}; plan {info.plan}")
        checked = "on the device" if "validate_device" in info.times else "on the host"
        print(f"  checks {1e3 * (info.times['validate'] + info.times.get('validate_device', 0.0)):9.1f} ms  "
              f"({checked}: host {1e3 * info.times['validate']:.1f} ms, device check "
              f"{1e3 * info.times.get('validate_device', 0.0):.1f} ms; CSR and value upload in 'upload')")
        warm = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            graphkern.jaccard(A, backend="gpu")
            warm.append(1e3 * (time.perf_counter() - t))
        print(f"  warm   {np.median(warm):9.1f} ms  (median of {args.repeat})")
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(graphkern.jaccard, A.copy(), backend="gpu")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        kernel, variant = kernel_ms(A, args.repeat)
        print(f"  kernel {kernel:9.2f} ms  ({variant}, CUDA events, median of {args.repeat})")
        cpus = []
        for _ in range(args.repeat):
            B = A.copy()
            t = time.perf_counter()
            C = graphkern.jaccard(B, backend="cpu")
            cpus.append(1e3 * (time.perf_counter() - t))
            del B
        cpu = float(np.median(cpus))
        print(f"  cpu    {cpu:9.1f} ms  (all cores, median of {args.repeat} fresh copies, {min(cpus):.1f} to "
              f"{max(cpus):.1f})")
        same = np.array_equal(C.data, R.data)
        print(f"  first / kernel = {first / kernel:.2f} (target <= 3: {'PASS' if first <= 3 * kernel else 'MISS'}); "
              f"cpu / first = {cpu / first:.1f} (target >= 10: {'PASS' if cpu >= 10 * first else 'MISS'}); "
              f"GPU == CPU: {same}")


if __name__ == "__main__":
    main()
