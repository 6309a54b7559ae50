"""The local cluster ``gram`` starts when it is given no client: one worker per visible GPU, else
one CPU worker running the kernel's OpenMP threads."""

from __future__ import annotations

import contextlib
import logging
import os


@contextlib.contextmanager
def environ_kept():
    """Restore this process's environment afterwards: Dask's nannies set OMP_NUM_THREADS=1 (and
    other thread limits) in the process that starts them, which would quietly make every later
    OpenMP call of graphkern in the user's process single-threaded."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def visible_gpus():
    """The identifiers of the GPUs this process sees (as CUDA_VISIBLE_DEVICES names them)."""
    import graphkern

    if not graphkern.gpu_available():
        return []
    n = len(graphkern.devices())
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[:n] if named else [str(k) for k in range(n)]


def gpu_worker_threads(n_gpus):
    """OpenMP threads of each GPU worker of a local cluster: its share of the cores."""
    return max(1, (os.cpu_count() or 1) // max(1, n_gpus))


@environ_kept()
def local_cluster(gpus, n_threads, gpu_threads=None):
    """A started cluster for this machine: one worker per GPU of ``gpus`` (identifiers as
    :func:`visible_gpus` gives them), each with ``gpu_threads`` OpenMP threads for its host work
    (default :func:`gpu_worker_threads`), or one CPU worker when ``gpus`` is empty; this process's
    environment is left as it was.

    GPUs: dask-cuda's LocalCUDACluster when installed, else one worker process per GPU whose
    CUDA_VISIBLE_DEVICES lists its own GPU first (dask-cuda's convention, so device 0 of every
    worker is its own card).  No GPU: one worker process with one task thread, whose kernel uses
    ``n_threads`` OpenMP threads (Dask sets OMP_NUM_THREADS=1 in workers unless told).
    """
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    gpus = list(gpus)
    if not gpus:
        return LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                            env={"OMP_NUM_THREADS": str(n_threads)})
    per_gpu_threads = str(gpu_threads if gpu_threads is not None else gpu_worker_threads(len(gpus)))
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        LocalCUDACluster = None
    if LocalCUDACluster is not None:
        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(gpus), threads_per_worker=1,
                                env={"OMP_NUM_THREADS": per_gpu_threads})
    workers = {}
    for k, gpu in enumerate(gpus):
        order = gpus[k:] + gpus[:k]
        workers[f"gpu-{gpu}"] = {"cls": Nanny, "options": {
            "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": ",".join(order), "OMP_NUM_THREADS": per_gpu_threads},
            "silence_logs": logging.WARNING}}
    # quiet as LocalCluster is by default: Dask's start-up and shutdown notes are not the user's output
    return SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": ":8787"}}, workers=workers,
                       silence_logs=logging.WARNING)
