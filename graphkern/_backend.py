"""One convention for every public function: backend, device, n_threads, dtype."""

from __future__ import annotations

import math
import numbers
import os
import warnings

import numpy as np

from graphkern._cuda import runtime

BACKENDS = ("auto", "cpu", "gpu")


def resolve_backend(backend, *, allowed=BACKENDS):
    """'cpu' or 'gpu' (or another allowed name) from the user's ``backend``.

    ``"auto"`` picks the GPU when one is usable, else the CPU.  ``"gpu"`` on a machine
    without one raises GPUUnavailableError with the reason.
    """
    if backend not in allowed:
        raise ValueError(f"backend must be one of {', '.join(map(repr, allowed))}; got {backend!r}")
    if backend == "auto":
        return "gpu" if runtime.gpu_available() else "cpu"
    if backend in ("gpu", "hybrid"):
        runtime.require_gpu()
    return backend


def resolve_devices(device):
    """A list of device ordinals from ``None`` (device 0), an int, or a sequence of ints."""
    if device is None:
        return [0]
    if isinstance(device, (int, np.integer)):
        ids = [int(device)]
    else:
        try:
            ids = [int(d) for d in device]
        except TypeError:
            raise TypeError(f"device must be an int or a list of ints, got {device!r}") from None
    if not ids:
        raise ValueError("device list is empty")
    if len(set(ids)) != len(ids):
        raise ValueError(f"device list {ids} names a device twice")
    n = runtime.device_count()
    for d in ids:
        if d < 0 or d >= n:
            raise ValueError(f"device {d} does not exist: {n} CUDA device(s) are visible")
    return ids


# Most OpenMP threads a call may ask for, per core available to the process: a little
# oversubscription can help a latency-bound kernel, a thread per request (100000, 2**31)
# exhausts memory or aborts libgomp.
MAX_THREADS_PER_CORE = 4


def available_cores():
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def resolve_threads(n_threads):
    """Thread count for OpenMP regions: None means all cores (OMP_NUM_THREADS honoured).

    A count above ``MAX_THREADS_PER_CORE`` times the available cores is lowered to that
    maximum with a warning.
    """
    cores = available_cores()
    limit = MAX_THREADS_PER_CORE * cores
    if n_threads is None:
        env = os.environ.get("OMP_NUM_THREADS")
        if env:
            try:
                return min(limit, max(1, int(env.split(",")[0])))
            except ValueError:
                pass
        return cores
    if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)):
        raise TypeError(f"n_threads must be a positive int or None, got {n_threads!r}")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    if n_threads > limit:
        warnings.warn(f"n_threads={n_threads} lowered to {limit} ({MAX_THREADS_PER_CORE} per available core; "
                      f"{cores} available)", RuntimeWarning, stacklevel=3)
        return limit
    return int(n_threads)


def resolve_dtype(dtype, allowed=(np.float32, np.float64)):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype {dtype!r} is not a NumPy dtype") from None
    if dt.type not in allowed:
        names = ", ".join(np.dtype(a).name for a in allowed)
        raise ValueError(f"dtype must be one of {names}; got {dt.name}")
    return dt


def finite_real(value, name):
    """``value`` as a float, refusing bools, non-numbers and NaN/inf with a message naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
