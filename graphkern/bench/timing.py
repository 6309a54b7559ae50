"""The one timing helper for benchmarks: warm-up, repeats, median; CUDA events on the GPU."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field

import numpy as np


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

    def record(self, seconds, max_seconds):
        """Add one repeat's ``seconds``; True once the repeats add up to ``max_seconds`` (None: no limit)."""
        self.times.append(seconds)
        return max_seconds is not None and sum(self.times) >= max_seconds

    def as_dict(self):
        return {"median_s": self.median, "min_s": self.min, "repeats": len(self.times), "estimated": self.estimated}


def settle(max_seconds=2.0, window=0.02, busy=0.1):
    """Wait until this process's threads are idle: until, over ``window`` seconds, they use less than
    ``busy`` of one core; at most ``max_seconds`` (then False).

    After a parallel region the worker threads of OpenMP (libgomp: 300,000 spins) and of OpenBLAS
    (2^28 cycles) keep spinning, 10-100 ms on 16 cores, waiting for more work.  A call timed in that
    window shares the cores with them (a GPU call's staging threads, its packing), which a user's
    call made after reading its data does not; so every first call starts on an idle process."""
    end = time.perf_counter() + max_seconds
    while True:
        used, t0 = time.process_time(), time.perf_counter()
        time.sleep(window)
        now = time.perf_counter()
        if time.process_time() - used < busy * (now - t0):
            return True
        if now >= end:
            return False


def first_calls(prepare, call, repeat):
    """``(seconds, args, result)`` of ``call(*args)`` for ``repeat`` fresh ``args = prepare()``, each
    timed on the host clock (the last ``args`` and ``result`` returned).  The garbage of preparing
    them (a list of fresh graphs is thousands of objects) is collected before each timed call, so a
    collection that preparing set off does not land in the call; collections the call sets off
    itself stay in its time.  (``timeit`` keeps the collector out of its timings altogether.)  Each
    call starts on an otherwise idle process (:func:`settle`, before that collection).  The last
    call's inputs and result are released before the next are made, as between warm calls, so that
    first and warm calls find the same memory."""
    seconds, args, out = [], None, None
    for _ in range(repeat):
        args = out = None
        args = prepare()
        settle()
        gc.collect()  # after the wait: the calling thread busy just before the call, as a user's is
        t0 = time.perf_counter()
        out = call(*args)
        seconds.append(time.perf_counter() - t0)
    return seconds, args, out


def time_cpu(fn, *, repeat=5, warmup=1, max_seconds=None):
    """Time ``fn()`` on the host clock.  Stops repeating once ``max_seconds`` is spent."""
    for _ in range(warmup):
        fn()
    t = Timing()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if t.record(time.perf_counter() - t0, max_seconds):
            break
    return t


def time_gpu(fn, stream, *, repeat=10, warmup=2, max_seconds=None):
    """Time the device work ``fn()`` enqueues on ``stream``, with CUDA events around it.

    Launching from Python costs microseconds per kernel, which is as long as a small kernel
    runs: with events simply recorded around ``fn()`` the device would sit idle between
    launches and the host's overhead would be timed.  So every repeat first enqueues a kernel
    that holds the stream for several times the host's enqueue time, then the start event,
    ``fn()`` and the end event: the device starts on ``fn``'s work only once all of it is
    queued.  If the hold ran out before the end event was enqueued (the start event has
    already completed), the repeat is discarded and retried with a hold twice as long.
    A ``fn`` that waits for the device itself (a copy from pageable memory, a synchronize)
    cannot be queued behind a hold; a probe finds those, and they are timed with plain
    events around the call.
    """
    from graphkern._cuda import runtime as rt

    dev = stream.device
    start, end = rt.Event(dev), rt.Event(dev)
    enqueue = 0.0
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        enqueue = max(enqueue, time.perf_counter() - t0)
    stream.synchronize()
    probe = 20e-3 + 4 * enqueue
    rt.hold_stream(stream, probe)
    t0 = time.perf_counter()
    fn()
    waits_for_device = time.perf_counter() - t0 >= 0.5 * probe
    stream.synchronize()
    hold = 4 * enqueue + 100e-6
    t = Timing()
    while len(t.times) < repeat:
        if not waits_for_device:
            rt.hold_stream(stream, hold)
        start.record(stream)
        fn()
        end.record(stream)
        if not waits_for_device and start.query() and hold < 0.1:  # the device waited on the host
            stream.synchronize()
            hold *= 2
            continue
        if t.record(start.elapsed_ms(end) / 1e3, max_seconds):
            break
    return t


def scaled_estimate(timing, factor):
    """A timing measured on a subset, scaled up by ``factor`` and marked as estimated."""
    return Timing([x * factor for x in timing.times], estimated=True)


def device_copy_bandwidth(device=0):
    """Device-to-device copy bandwidth of ``device`` (bytes read + written per second)."""
    from graphkern._cuda import runtime as rt

    dev = rt.get_device(device)
    nbytes = min(1 << 30, dev.memory_info()[0] // 8)
    src, dst = rt.alloc(dev, nbytes, np.uint8), rt.alloc(dev, nbytes, np.uint8)
    src.memset32(0x3F800000)
    stream = rt.Stream(dev)
    timing = time_gpu(lambda: dst.copy_from_device(src, nbytes, stream), stream, repeat=10)
    return 2 * nbytes / timing.median


def host_copy_bandwidth(nbytes=1 << 27):
    """Host memcpy bandwidth of one ``nbytes`` copy (bytes read + written per second)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    timing = time_cpu(lambda: np.copyto(dst, src), repeat=5, warmup=1)
    return 2 * nbytes / timing.min
