"""The benchmark's timing helpers: first calls start on an idle process."""

import threading
import time

import numpy as np

from graphkern.bench import timing


def _busy_share(seconds=0.05):
    used, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - used) / (time.perf_counter() - t0)


def test_settle_returns_at_once_on_an_idle_process():
    t0 = time.perf_counter()
    assert timing.settle()
    assert time.perf_counter() - t0 < 0.5


def test_settle_gives_up_while_a_thread_stays_busy():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        t0 = time.perf_counter()
        assert not timing.settle(max_seconds=0.2)
        assert 0.2 <= time.perf_counter() - t0 < 1.0
    finally:
        stop.set()
        worker.join()


def test_settle_waits_for_spinning_blas_threads():
    a = np.random.default_rng(0).random((1500, 1500))
    a @ a  # noqa: B018 - its threads spin on after the product, if the BLAS is threaded
    assert timing.settle()
    assert _busy_share() < 0.5


def test_first_calls_settle_before_each_timed_call():
    events = []
    real = timing.settle
    timing.settle = lambda: events.append("settle") or True
    try:
        seconds, args, out = timing.first_calls(lambda: (len(events),), lambda k: events.append("call") or k, 3)
    finally:
        timing.settle = real
    assert events == ["settle", "call"] * 3  # the collection between them runs on the calling thread
    assert len(seconds) == 3 and out == args[0]
