"""The hybrid backend: gpu_batched on every pair while the calling thread's CPU team takes pairs from
the light end, the two meeting where the GPU's progress reaches the CPU's claim."""

from __future__ import annotations

import time

import numpy as np

from graphkern.spgk.cpu import DENSE_EDGES, dense_auto, run_cpu
from graphkern.spgk.gpu import PROGRESS_STRIDE, suffix_sums


# share_from_both_ends: the CPU claims pairs in steps of about this long at its measured speed
# (its last step can end after the GPU's, so this bounds the imbalance), and at most this share
# of the GPU's predicted time to the claim
_HYBRID_STEP_SECONDS = 1e-3
_HYBRID_STEP_SHARE = 0.5
# cores the CPU share leaves free, for the system and the driver: a team thread preempted holds
# its step's barrier for a whole time slice, which would make a step of two pairs last ~1 ms
_HYBRID_FREE_CORES = 1


def share_from_both_ends(works, run_cpu, gpu, *, n_threads, step_seconds=None, clock=time.perf_counter,
                         tail=None):
    """Run the pairs of a running GPU launch from its light end on the CPU until the two meet.

    ``works``: each pair's work in the launch's order (heaviest first; the GPU takes positions
    0, 1, 2, ... as its blocks free up).  ``gpu``: the launch (:class:`graphkern.spgk.gpu._BatchedLaunch` or a test
    double) with ``progress()``, ``set_limit(b)`` and ``done()``.  ``run_cpu(lo, hi)`` computes
    positions [lo, hi) on the CPU threads.  The CPU claims a step below the current limit
    (lowering the limit first, so a block past it stops), computes it, and claims again until
    the GPU's progress reaches the limit or the launch is done: the meeting point is measured
    in every call, on these pairs, with no rate model carried between calls.

    A step is the work the CPU did in ``step_seconds`` at its last step's speed (its first step:
    two pairs per thread; a step that took under half its time doubles the next, since a short
    step's speed is mostly its fixed cost), and at most half the time the GPU needs to reach the
    limit at its pace during the last step, so that the steps shrink as the two meet and the CPU
    rarely finishes after the GPU.  A block may take a pair just before the CPU's claim reaches
    it; both then compute it (the CPU's value is used).  ``tail``: :func:`suffix_sums` of ``works``
    when known.  Returns the final limit (positions >= it are the CPU's) and the split's record.
    """
    step_seconds = _HYBRID_STEP_SECONDS if step_seconds is None else step_seconds
    works = np.asarray(works, dtype=np.float64)
    seen = None  # (time, progress) at the previous step: the GPU's recent pace
    n = len(works)
    # work of positions [b, n) is tail[b]
    tail = suffix_sums(works) if tail is None else tail
    b = n
    cpu_seconds = last_work = last_seconds = 0.0
    steps = 0
    t_start = clock()
    capacity = getattr(gpu, "capacity", n)
    while steps < capacity and not gpu.done():
        p = gpu.progress()
        free = b - (p + 1) - (PROGRESS_STRIDE if p >= 0 else 0)  # p lags the blocks by < the stride
        if free <= 0:
            break
        if steps == 0:
            c = min(free, 2 * n_threads)
        else:
            budget = step_seconds
            now = clock()
            # the GPU's pace in positions per second over the last step (it quickens as the
            # pairs get lighter), else since the start
            if seen is not None and p > seen[1] and now > seen[0]:
                budget = min(budget, _HYBRID_STEP_SHARE * free * (now - seen[0]) / (p - seen[1]))
            elif p >= 0 and now > t_start:
                budget = min(budget, _HYBRID_STEP_SHARE * free * (now - t_start) / (p + 1))
            seen = (now, p)
            want = budget * last_work / last_seconds
            if last_seconds < 0.5 * budget:
                want = max(want, 2 * last_work)
            lo = int(np.searchsorted(-tail, -(tail[b] + want), side="left"))  # tail is non-increasing
            c = min(free, max(1, b - lo))
        gpu.set_limit(b - c)
        t0 = clock()
        run_cpu(b - c, b)
        last_seconds = max(clock() - t0, 1e-9)
        last_work = tail[b - c] - tail[b]
        cpu_seconds += last_seconds
        b -= c
        steps += 1
    return b, dict(cpu_pairs=n - b, gpu_pairs=b, cpu_steps=steps, cpu_seconds=cpu_seconds,
                   cpu_work=float(tail[b]), gpu_work=float(tail[0] - tail[b]),
                   threshold_work=float(works[b - 1]) if 0 < b else np.inf)


def run_hybrid(runner, cfg, A, B, pa, pb):
    """The values of the pairs ``(pa, pb)`` of batches ``A``, ``B`` by gpu_batched on ``runner`` and
    openmp_out on ``cfg["n_threads"]`` less one threads, and the split's record."""
    if len(pa) == 0:
        return np.empty(0), {}
    runner.upload(A, B)
    edge, dtype, walk = cfg["edge_kernel"], cfg["dtype"], cfg["cpu_walk"]
    n_threads = max(1, cfg["n_threads"] - _HYBRID_FREE_CORES)
    t0 = time.perf_counter()
    launch = runner.start_batched(A, B, pa, pb, shared_with_cpu=True)
    order = launch.order
    cpu_values = np.empty(len(pa))
    if launch.idle and len(pa) <= launch.blocks + PROGRESS_STRIDE:
        # an idle GPU gives every pair a block at once: the CPU could only compute pairs twice
        out = launch.finish()
        return out, dict(cpu_pairs=0, gpu_pairs=len(pa), cpu_steps=0, cpu_seconds=0.0, cpu_work=0.0,
                                  gpu_work=float(launch.plan.tail[0]), threshold_work=float(launch.works[-1]),
                                  gpu_alone=True, gpu_seconds=launch.gpu_seconds(),
                                  seconds=time.perf_counter() - t0)
    if edge.code in DENSE_EDGES and (walk == "dense" or (walk == "auto" and dense_auto())):
        A.cpu(False, walk), B.cpu(False, walk)  # made (once per batch) while the GPU runs, not in a CPU step

    def cpu_step(lo, hi):
        idx = order[lo:hi]
        cpu_values[lo:hi] = run_cpu("openmp_out", A, B, pa[idx], pb[idx], edge, n_threads, dtype, walk)

    try:
        b, split = share_from_both_ends(launch.works, cpu_step, launch, n_threads=n_threads, tail=launch.plan.tail)
    finally:
        out = launch.finish()  # waits for the GPU even when the CPU side raised
    out[order[b:]] = cpu_values[b:]
    split.update(gpu_alone=False, gpu_seconds=launch.gpu_seconds(), seconds=time.perf_counter() - t0)
    return out, split
