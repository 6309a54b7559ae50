"""The one timing helper for benchmarks: warm-up, repeats, median; CUDA events on the GPU."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Timing:
    """Seconds per call: median of ``times`` (also min and the raw list)."""

    times: list = field(default_factory=list)
    estimated: bool = False

    @property
    def median(self):
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def min(self):
        return min(self.times) if self.times else float("nan")

    def as_dict(self):
        return {"median_s": self.median, "min_s": self.min, "repeats": len(self.times), "estimated": self.estimated}


def time_cpu(fn, *, repeat=5, warmup=1, max_seconds=None):
    """Time ``fn()`` on the host clock.  Stops repeating once ``max_seconds`` is spent."""
    for _ in range(warmup):
        fn()
    t = Timing()
    spent = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        t.times.append(dt)
        spent += dt
        if max_seconds is not None and spent >= max_seconds:
            break
    return t


def time_gpu(fn, stream, *, repeat=10, warmup=2, max_seconds=None):
    """Time ``fn()`` (which enqueues work on ``stream``) with CUDA events around it."""
    from graphkern._cuda import runtime as rt

    dev = stream.device
    start, end = rt.Event(dev), rt.Event(dev)
    for _ in range(warmup):
        fn()
    stream.synchronize()
    t = Timing()
    spent = 0.0
    for _ in range(repeat):
        start.record(stream)
        fn()
        end.record(stream)
        dt = start.elapsed_ms(end) / 1e3
        t.times.append(dt)
        spent += dt
        if max_seconds is not None and spent >= max_seconds:
            break
    return t


def scaled_estimate(timing, factor):
    """A timing measured on a subset, scaled up by ``factor`` and marked as estimated."""
    return Timing([x * factor for x in timing.times], estimated=True)
