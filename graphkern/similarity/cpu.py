"""The CPU driver of the similarity kernels (graphkern/_cpu/jaccard.pyx, OpenMP over rows)."""

from __future__ import annotations

import time

import numpy as np

from graphkern._progress import Progress

# Per-thread marks of the CPU kernel cost 4 bytes per node each; beyond this many bytes in all,
# fewer threads are used rather than exhausting host memory on huge sparse graphs.
CPU_MARK_BYTES = 4 << 30
# With progress asked for, the rows run in at most this many blocks, each of at least
# PROGRESS_BLOCK_ENTRIES stored entries on average (each block ends at a barrier of the threads).
PROGRESS_BLOCKS = 100
PROGRESS_BLOCK_ENTRIES = 1 << 18


def cpu_values(pattern, metric, self_loops, dtype, n_threads, *, scale=0, verbose=False, times=None):
    """The similarity of every stored entry of ``pattern`` (a SymmetricPattern) in ``dtype``.

    ``scale``: the weights are multiplied by 2^-scale first (and so is a vertex's own unit weight
    under ``self_loops``), which leaves every ratio unchanged.  ``verbose``: rows done, as
    graphkern._progress.Progress reports them.  ``times`` (a dict) receives the seconds of the
    kernel under "compute".
    """
    try:
        from graphkern._cpu import jaccard as cpu_kernels
    except ImportError as exc:  # pragma: no cover - depends on the build
        raise ImportError(f"the CPU Jaccard kernels are not built ({exc}); reinstall graphkern") from None
    n_threads = max(1, min(n_threads, CPU_MARK_BYTES // max(1, 4 * pattern.n)))
    dtype = np.dtype(dtype)
    weighted = pattern.weights is not None
    if weighted:
        weights = np.ldexp(pattern.weights, -scale).astype(dtype, copy=False) if scale else \
            pattern.weights.astype(dtype, copy=False)
    else:
        weights = np.zeros(0, dtype=dtype)
    out = np.empty(pattern.nnz, dtype=dtype)
    t0 = time.perf_counter()
    with Progress(pattern.n, verbose, "rows", "similarity") as bar:
        report = bar.update if verbose else None
        rows = max(-(-pattern.n // PROGRESS_BLOCKS), -(-pattern.n * PROGRESS_BLOCK_ENTRIES // max(pattern.nnz, 1)))
        rows = rows if verbose else 0
        cpu_kernels.similarity(pattern.indptr, pattern.indices, weights, out, metric, weighted, self_loops,
                               n_threads, unit=float(np.ldexp(1.0, -scale)), progress=report, progress_rows=rows)
    if times is not None:
        times["compute"] = time.perf_counter() - t0
    return out
