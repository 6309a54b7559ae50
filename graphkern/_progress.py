"""Progress reporting for long calls: a tqdm bar when tqdm is installed, plain text otherwise.

Every long-running public call takes ``verbose=False``.  ``verbose=True`` shows a bar of work
units done (pairs for Gram matrices, Lanczos steps, rows) with the rate and the ETA;
a callable ``verbose`` receives ``(done, total)`` after every update instead (unthrottled: it
may raise to stop the work), so notebooks, loggers and the Dask dashboard can follow along.  Work whose total is unknown reports counts.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Counts units of work done out of ``total`` and reports them as ``verbose`` asks.

    Use as a context manager: ``with Progress(total, verbose, "pairs") as bar: bar.update(n)``.
    Text and bars are throttled to a few updates a second, so ``update`` is cheap to call once
    per chunk of work.
    """

    def __init__(self, total, verbose=False, unit="pairs", desc="graphkern", *, min_interval=0.2,
                 stream=None):
        self.total = None if total is None else int(total)
        self.done = 0
        self.unit = unit
        self.desc = desc
        self._callback = verbose if callable(verbose) else None
        self._enabled = bool(verbose) or self._callback is not None
        self._min_interval = float(min_interval)
        self._stream = stream if stream is not None else sys.stderr
        self._bar = None
        self._t0 = self._last = None

    def __enter__(self):
        self._t0 = self._last = time.perf_counter()
        if self._enabled and self._callback is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # plain text lines instead
                pass
            else:
                self._bar = tqdm(total=self.total, unit=" " + self.unit, desc=self.desc,
                                 file=self._stream, unit_scale=True, dynamic_ncols=True)
        return self

    def update(self, n=1):
        """Add ``n`` units done and report if enough time has passed since the last report."""
        self.done += int(n)
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(int(n))
            return
        if self._callback is not None:  # every update: a callback may stop the work or throttle itself
            self._callback(self.done, self.total)
            return
        now = time.perf_counter()
        final = self.total is not None and self.done >= self.total
        if now - self._last < self._min_interval and not final:
            return
        self._last = now
        self._stream.write("\r" + self.line(now))
        self._stream.flush()

    def line(self, now=None):
        """One line of text: done/total, rate and ETA."""
        now = time.perf_counter() if now is None else now
        elapsed = max(now - self._t0, 1e-9)
        rate = self.done / elapsed
        if self.total:
            eta = f"{(self.total - self.done) / rate:.1f} s" if rate > 0 else "?"
            return (f"{self.desc}: {self.done:,}/{self.total:,} {self.unit} "
                    f"({100.0 * self.done / self.total:.0f}%), {rate:,.0f} {self.unit}/s, ETA {eta}")
        return f"{self.desc}: {self.done:,} {self.unit}, {rate:,.0f} {self.unit}/s"

    def __exit__(self, *exc):
        if not self._enabled:
            return False
        if self._bar is not None:
            self._bar.close()
        elif self._callback is None:
            self._stream.write("\r" + self.line() + "\n")
            self._stream.flush()
        elif self.total is not None and self.done < self.total and exc[0] is None:
            self._callback(self.done, self.total)
        return False
