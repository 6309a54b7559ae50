"""exp(beta A) x on R-MAT: the first call in a fresh process against the upload floor and the warm call.

    python3 tools/expm_first_call.py [--scale 22] [--backend gpu] [--repeat 5] [--timeline] [--cache FILE]

Generates R-MAT (graphkern.generators.rmat, seed 1) once, saves its CSR to a temporary file, and
runs each measurement in a fresh Python process that loads it into host memory:

* first call: ``expm_multiply(G, beta=...)`` on a Graph built before the clock starts (CUDA
  context and module loading done beforehand by a call on a 2-vertex graph, and reported apart),
  with its phases from ``info.times`` (validate, reorder, upload, plan, solve);
* warm call: the median of ``--repeat`` further calls on the same Graph;
* kernel only: the warm call's SpMV and vector kernels (device events);
* floor: the upload's bytes (row pointers and column indices, values if weighted) over the
  host-to-device bandwidth measured on the same bytes, from pinned and from pageable memory.

It prints one table and the target: first call <= 1.5 x (bytes / pinned bandwidth + warm call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CHILD = r"""
import json, sys, time
import numpy as np
import graphkern
from graphkern import Graph
from graphkern.expm import expm_multiply

path, backend, repeat, beta, timeline = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
data = np.load(path)
G = Graph(data["indptr"], data["indices"], validate=False)  # the generator's CSR: symmetric and sorted
out = {"n": int(G.n_nodes), "nnz": int(G.nnz)}
t0 = time.perf_counter()
expm_multiply(Graph(np.array([0, 1, 2]), np.array([1, 0])), backend=backend)
out["init_s"] = time.perf_counter() - t0  # driver, context, module
t0 = time.perf_counter()
y, info = expm_multiply(G, beta=beta, backend=backend)
out["first_s"] = time.perf_counter() - t0
out["first_times"] = info.times
out["reorder"], out["spmv"], out["krylov"] = info.reorder, info.spmv, info.krylov_dim
warm = []
for _ in range(repeat):
    t0 = time.perf_counter()
    y2, info2 = expm_multiply(G, beta=beta, backend=backend)
    warm.append(time.perf_counter() - t0)
assert info2.cached and np.array_equal(y, y2)
out["warm_s"] = float(np.median(warm))
out["kernel_s"] = info2.times["spmv"] + info2.times["vector"]
nbytes = data["indptr"].nbytes + data["indices"].nbytes
out["upload_bytes"] = nbytes
if backend == "gpu":
    from graphkern._cuda import runtime as rt
    dev = rt.get_device(0)
    host = np.concatenate([data["indptr"].view(np.uint8), data["indices"].view(np.uint8)])
    pinned = rt.PinnedBuffer(nbytes).array(np.uint8, (nbytes,))
    pinned[:] = host
    buf = rt.alloc(dev, nbytes, np.uint8)
    for name, src, copy in (("pinned", pinned, buf.copy_from_host), ("pageable", host, buf.copy_from_host),
                            ("staged", host, lambda a: rt.copy_from_pageable(buf, a))):
        best = 1e9
        for _ in range(3):
            dev.synchronize()
            t0 = time.perf_counter()
            copy(src)
            dev.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[name + "_gb_s"] = nbytes / best / 1e9
    out["card"] = dev.properties["name"]
    out["staging"] = (rt.STAGING_THREADS, rt.STAGING_CHUNK)
if timeline == "1" and backend == "gpu":
    # where a first call after clear_cache() spends its time: the setup's steps on each thread
    import threading
    from graphkern._cuda import runtime
    from graphkern._cpu import expm as cpu
    from graphkern.expm import clear_cache, device, lanczos, plans
    spans, t_call = [], [0.0]

    def traced(owner, name, label):
        fn = getattr(owner, name)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                nbytes = next((x.nbytes for x in a if isinstance(x, np.ndarray)), 0)
                spans.append((t - t_call[0], time.perf_counter() - t_call[0], label, threading.current_thread().name,
                              nbytes))
        setattr(owner, name, wrapper)

    for owner, name in (("_SourceUpload", "__init__"), ("_SourceUpload", "wait"), ("_SourceUpload", "release"),
                        ("DeviceOrder", "release"), ("DeviceOrder", "__init__"),
                        ("DeviceOrder", "rowblock_plan"), ("DeviceRows", "__init__"), ("DeviceRows", "plan_for"),
                        ("DeviceRows", "_permuted"), ("DeviceRows", "finish"), ("Residency", "settle"),
                        (None, "_to_device"), (None, "_check_indices"), (None, "ensure_free"),
                        ("Workspace", "__init__"), (runtime, "alloc"), (runtime, "copy_from_pageable"),
                        (plans.SpmvPlan, "__init__"), (cpu, "rowblock_tasks"), (lanczos.CsrMatrix, "degree_stats")):
        owner = device if owner is None else getattr(device, owner, None) if isinstance(owner, str) else owner
        if owner is not None and hasattr(owner, name):  # what this version of the package has
            traced(owner, name, f"{getattr(owner, '__name__', owner)}.{name}")
    clear_cache()
    t_call[0] = time.perf_counter()
    expm_multiply(G, beta=beta, backend=backend)
    out["call_s"] = time.perf_counter() - t_call[0]
    out["timeline"] = sorted(spans)
print("RESULT " + json.dumps(out))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=22)
    p.add_argument("--backend", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--timeline", action="store_true",
                   help="then a first call after clear_cache() with its setup steps timed on each thread")
    p.add_argument("--cache", metavar="FILE.npz", help="keep the generated matrix there and reuse it when present")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.cache or os.path.join(tmp, "rmat.npz")
        if not os.path.exists(path):
            from graphkern.generators import rmat
            t0 = time.perf_counter()
            A = rmat(args.scale, seed=1, as_csr=True)
            print(f"(generated in {time.perf_counter() - t0:.1f} s)")
            np.savez(path, indptr=A.indptr, indices=A.indices)
            del A
        with np.load(path) as saved:
            print(f"R-MAT scale {args.scale}: {len(saved['indptr']) - 1} vertices, {len(saved['indices'])} stored "
                  f"entries")
        proc = subprocess.run([sys.executable, "-c", CHILD, path, args.backend, str(args.repeat), str(args.beta),
                               "1" if args.timeline else "0"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        return proc.returncode
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    t = r["first_times"]
    solve = t["total"] - t["setup"]
    print(f"card: {r.get('card', 'cpu')}; reorder={r['reorder']} spmv={r['spmv']} krylov={r['krylov']}")
    print(f"{'CUDA init (2-vertex call)':32s} {1e3 * r['init_s']:9.1f} ms")
    print(f"{'first call':32s} {1e3 * r['first_s']:9.1f} ms")
    for key in ("validate", "reorder", "upload", "plan"):
        if key in t:
            print(f"{'  ' + key:32s} {1e3 * t[key]:9.1f} ms")
    print(f"{'  setup (all of the above)':32s} {1e3 * t['setup']:9.1f} ms")
    print(f"{'  solve and output':32s} {1e3 * solve:9.1f} ms")
    print(f"{'warm call (median)':32s} {1e3 * r['warm_s']:9.1f} ms")
    print(f"{'kernels only (warm)':32s} {1e3 * r['kernel_s']:9.1f} ms")
    if "pinned_gb_s" in r:
        floor = r["upload_bytes"] / (r["pinned_gb_s"] * 1e9)
        print(f"{'upload bytes':32s} {r['upload_bytes'] / 1e6:9.1f} MB  (H2D pinned {r['pinned_gb_s']:.1f} GB/s, "
              f"pageable {r['pageable_gb_s']:.1f} GB/s, staged through the pinned ring {r['staged_gb_s']:.1f} GB/s)")
        print(f"{'upload floor (pinned)':32s} {1e3 * floor:9.1f} ms  (staging: {r['staging'][0]} threads, "
              f"2 x {r['staging'][1] >> 20} MiB pinned each)")
        target = 1.5 * (floor + r["warm_s"])
        verdict = "met" if r["first_s"] <= target else "missed"
        print(f"target: first call <= 1.5 x (floor + warm) = {1e3 * target:.1f} ms: {verdict} "
              f"({r['first_s'] / (floor + r['warm_s']):.2f} x)")
    if "timeline" in r:
        print(f"first call after clear_cache(): {1e3 * r['call_s']:.1f} ms; its steps (ms from the call's start):")
        for start, end, label, thread, nbytes in r["timeline"]:
            size = f"{nbytes / 1e6:8.1f} MB" if nbytes else " " * 11
            print(f"  {1e3 * start:8.2f} {1e3 * end:8.2f} {1e3 * (end - start):8.2f}  {size}  {label:36s} {thread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
