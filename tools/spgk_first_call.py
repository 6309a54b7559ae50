"""The shortest-path kernel's feature map (DiracNode("element") x DiracEdge): where a first call goes.

    python3 tools/spgk_first_call.py [--backend gpu] [--small 1000] [--large 10000] [--repeat 7]

Molecules: the packaged set (hydrogens dropped), augmented as in the scaling table of
``graphkern-bench spgk`` (graphkern/bench/suites/_spgk_scaling.py).  One call on two molecules
first loads the libraries and the device's modules.  Then, ``--repeat`` times on fresh Graph
objects and a fresh kernel:

* ``--small`` molecules: the first call and the median of five warm calls, with the first call's
  parts (input checks, pack, label ids, counting, vocabulary, product) from wrapped functions; the
  counting alone on the same fresh graphs with 1, 4, 8 and all threads (its spread shows how much
  of it is waiting for threads);
* ``--large`` molecules: the first call split the same way (the product is the GPU's or the CPU's
  Gram matrix including its copy into host memory).

It prints the medians and the spreads and the targets: first <= 2x warm at ``--small``; at
``--large`` (10,000), a first call <= 50 ms on the GPU (100x GraKeL's 5.0 s).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gpu", choices=["gpu", "cpu"])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from graphkern.bench.data import molecules_path
    from graphkern.bench.suites._spgk_scaling import augmented_molecules
    from graphkern.io import read_sdf
    from graphkern.spgk import DiracNode, ShortestPathKernel, api, features, features_gpu
    from graphkern._cpu import spgk_paths

    threads = len(os.sched_getaffinity(0))
    base = read_sdf(molecules_path(), hydrogens=False)
    node = DiracNode("element")

    def make():
        return ShortestPathKernel(node_kernel=node, backend=args.backend, n_threads=threads)

    make()(base[:2])
    parts = {}

    def timed(owner, attr, name):
        original = getattr(owner, attr)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - t

        setattr(owner, attr, wrapper)

    timed(api, "as_graphs", "input checks")
    timed(features, "pack", "pack")
    timed(features, "_label_ids", "label ids")
    timed(spgk_paths, "triplet_counts", "counting")
    timed(features_gpu, "triplet_counts", "counting")  # with the numbering of the vocabulary
    timed(features, "_length_ids", "vocabulary")
    timed(spgk_paths, "number_columns", "vocabulary")
    timed(features.Vocabulary, "_phi", "vocabulary")
    timed(features_gpu, "features_gram", "product")
    timed(features, "gram_cpu", "product")

    def fresh(n):
        graphs = augmented_molecules(base, n)
        gc.collect()
        return graphs

    def first_call(n):
        graphs, kernel = fresh(n), make()
        parts.clear()
        t = time.perf_counter()
        kernel(graphs)
        return time.perf_counter() - t, dict(parts), graphs, kernel

    def show(label, values):
        ms = 1e3 * np.asarray(values)
        return f"{label} {np.median(ms):8.3f} ms (min {ms.min():.3f}, max {ms.max():.3f})"

    print(f"{args.backend}, {threads} threads, DiracNode('element') x DiracEdge")
    firsts, warms, split, alone = [], [], [], {}
    for _ in range(args.repeat):
        first, got, graphs, kernel = first_call(args.small)
        firsts.append(first)
        split.append(got)
        w = []
        for _ in range(5):
            t = time.perf_counter()
            kernel(graphs)
            w.append(time.perf_counter() - t)
        warms.append(float(np.median(w)))
        del kernel
        graphs = fresh(args.small)  # the counting alone on fresh graphs, each thread count
        structure, labels = features.pack(graphs, str, node, threads)
        labels, ids = features._label_ids(labels)
        for n_threads in sorted({1, 4, 8, threads}):
            t = time.perf_counter()
            spgk_paths.triplet_counts(*structure, ids, len(labels), n_threads)
            alone.setdefault(n_threads, []).append(time.perf_counter() - t)
    print(f"\n{args.small} molecules, {args.repeat} fresh calls")
    print(show("first call", firsts) + "   " + show("warm call", warms))
    for name in split[0]:
        print("  first call's " + show(name, [s.get(name, 0.0) for s in split]))
    for n_threads, values in alone.items():
        print(f"  counting alone on fresh graphs, {n_threads:2d} threads: " + show("", values))
    ratio = np.median(firsts) / np.median(warms)
    print(f"target first <= 2x warm: {ratio:.2f}x {'PASS' if ratio <= 2 else 'MISS'}")

    print(f"\n{args.large} molecules, {max(2, args.repeat // 2)} fresh calls")
    firsts, split = [], []
    for _ in range(max(2, args.repeat // 2)):
        first, got, graphs, kernel = first_call(args.large)
        firsts.append(first)
        split.append(got)
        del graphs, kernel
    print(show("first call", firsts))
    for name in split[0]:
        print("  " + show(name, [s.get(name, 0.0) for s in split]))
    if args.large == 10_000 and args.backend == "gpu":
        best = np.median(firsts)
        print(f"target first call <= 50 ms: {1e3 * best:.1f} ms {'PASS' if best <= 0.05 else 'MISS'}")


if __name__ == "__main__":
    main()
