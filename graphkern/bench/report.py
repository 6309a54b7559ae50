"""Tables, targets and verdicts shared by every benchmark suite.

One verdict helper (:meth:`Target.judge`) for every suite: a target is stated in the user's
terms, records the hardware and sizes it was set for, and is judged PASS / MISS only there, on
a measured (not estimated) median of at least ``MIN_REPEATS`` runs; anywhere else the figure is
shown as ``info`` with the goal beside it.  Peers and graphkern variants run through
:func:`guarded`, so a failure becomes a row saying ``failed: <error>`` and the suite goes on.
"""

from __future__ import annotations

import math
import os
import re
import sys
import textwrap
import time
from dataclasses import dataclass

WIDTH = 120
MIN_REPEATS = 3
_NUMBER = re.compile(r"(est |~)?[-+]?[\d.,]+(e[-+]?\d+)?%?x?|nan|inf")
_state = {"wide": False, "wrong": []}


def set_wide(flag):
    _state["wide"] = bool(flag)


def say(*args):
    """Print a line of text, wrapped at ``WIDTH`` columns unless --wide."""
    text = " ".join(str(a) for a in args)
    for part in text.split("\n"):
        lines = [part] if _state["wide"] else textwrap.wrap(part, WIDTH, subsequent_indent="    ") or [""]
        print("\n".join(lines), flush=True)


def wrong_answers():
    """Messages of graphkern results that disagreed with their reference in this run."""
    return list(_state["wrong"])


def reset():
    _state["wrong"].clear()


def check_answer(what, error, tolerance):
    """Record ``what`` as a wrong answer when ``error`` (vs an independent reference) exceeds ``tolerance``."""
    if error is not None and error > tolerance:  # NaN (no error measured) is never over
        _state["wrong"].append(f"{what}: error {error:.3g} over {tolerance:.1g}")
        print(f"  WRONG ANSWER: {what}: error {error:.3g} over the tolerance {tolerance:.1g}", flush=True)
        return False
    return True


# --------------------------------------------------------------------------- failures


def error_text(exc):
    """``Type: first line of the message``."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__


def failure_text(exc):
    return "failed: " + error_text(exc)


def guarded(row, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a dict of figures) merged into ``row``; on an exception the row says why."""
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:  # a peer's failure is a result, not the end of the suite
        return dict(row, failed=failure_text(exc), note=failure_text(exc))
    return dict(row, **(out or {}))


class PeerCrashed(RuntimeError):
    """A peer ended its process (a signal such as SIGSEGV, or a hard exit) instead of raising."""


def _isolated_main(queue, fn, args):
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # sent back and raised in the parent as a failed row
        queue.put(("error", error_text(exc)))


def isolated(fn, *args, timeout=300):
    """``fn(*args)`` in a fresh process, for peers that can crash their interpreter (a native
    library's segfault cannot be caught in-process).  ``fn`` and its arguments must pickle.
    A crash or a timeout raises :class:`PeerCrashed`; an exception in the child, RuntimeError."""
    import multiprocessing as mp
    import queue as queue_mod
    import signal

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_isolated_main, args=(q, fn, args), daemon=True)
    proc.start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, value = q.get(timeout=0.2)
            break
        except queue_mod.Empty:
            if proc.is_alive() and time.monotonic() < deadline:
                continue
            if proc.is_alive():
                proc.kill()
            proc.join()
            code = proc.exitcode
            if code is not None and code < 0:
                raise PeerCrashed(f"the peer's process died with {signal.Signals(-code).name}") from None
            raise PeerCrashed(f"the peer's process gave no answer (exit code {code}, limit {timeout} s)") from None
    proc.join()
    if status == "error":
        raise RuntimeError(value)
    return value


# --------------------------------------------------------------------------- targets


def _hopper(gpu):
    return tuple(gpu.get("compute_capability") or ())[:1] == (9,)


@dataclass(frozen=True)
class Target:
    """A speed or quality goal in the user's terms and the setting it was set for.

    ``op`` is ``">="``, ``"<="``, ``">"`` or ``"<"``; ``unit`` is printed after the numbers (``"x"``, ``"%"``,
    ``""``).  ``gpu``: the device class (``"H100-class GPU"``: compute capability 9.x, H100 or
    H200) or None for a CPU target; ``cores``: the fewest CPU cores it assumes; ``sizes``: the
    problem sizes in words (judged only on a full run unless ``quick_ok``).
    """

    claim: str
    op: str
    goal: float
    unit: str = "x"
    gpu: str | None = "H100-class GPU"
    cores: int = 16
    sizes: str = "the full run"
    quick_ok: bool = False
    gpus: int = 1

    def goal_text(self):
        return f"{ {'>=': '≥', '<=': '≤'}.get(self.op, self.op)} {self.goal:g}{self.unit}"

    def why_not_judged(self, system, quick):
        gpus = [g for g in system.get("gpus") or [] if _hopper(g)] if self.gpu else []
        if self.gpu and len(gpus) < self.gpus:
            return f"set for {self.gpus if self.gpus > 1 else 'an'} {self.gpu}{'s' if self.gpus > 1 else ''}"
        if (system.get("cores") or os.cpu_count() or 1) < self.cores:
            return f"set for >= {self.cores} cores"
        if quick and not self.quick_ok:
            return "set for the full sizes"
        return None

    def judge(self, value, ctx, *, estimated=False, repeats=None, detail="", full_size=True):
        """The verdict row of ``value`` (a median of ``repeats`` timed runs; None: not a timing) in ``ctx``."""
        row = {"kind": "target", "target": self.claim, "goal": self.goal_text(), "value": value,
               "repeats": repeats, "estimated": bool(estimated), "detail": detail}
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return dict(row, verdict="n/a", measured="-", why=detail or "not measured")
        row["measured"] = f"{'est ' if estimated else ''}{value:.3g}{self.unit}"
        why = self.why_not_judged(ctx.system, ctx.quick or not full_size)
        if estimated:
            why = "estimated value, never judged"
        elif why is None and repeats is not None and repeats < MIN_REPEATS:
            why = f"median of {repeats or 0} runs (needs {MIN_REPEATS})"
        if why is not None:
            return dict(row, verdict="info", why=why)
        ok = {">=": value >= self.goal, "<=": value <= self.goal, "<": value < self.goal, ">": value > self.goal}[self.op]
        return dict(row, verdict="PASS" if ok else "MISS",
                    why=f"median of {repeats} runs" if repeats else "measured (not a timing)")


def print_targets(rows, title="targets"):
    targets = [r for r in rows if r.get("kind") == "target"]
    if not targets:
        return
    print_table(targets, [("target", "target"), ("measured", "measured"), ("goal", "goal"),
                          ("verdict", "verdict"), ("why", "judged on / why not")],
                title=title, legend="PASS / MISS: judged on the setting the target was set for; info: measured "
                                    "elsewhere (goal shown beside it); est: estimated, never judged")


# --------------------------------------------------------------------------- tables


def print_table(rows, columns, *, title=None, legend=None, wide=None, wrap=("note", "target", "why", "headline")):
    """Print ``rows`` (dicts) as an aligned table of ``columns`` (key or (key, header, fmt)).

    At most ``WIDTH`` columns of text unless ``--wide``: the longest text cells are wrapped onto
    more lines (columns named in ``wrap``) or cut (with ``…``), and if that is not enough the
    rightmost columns are left out and named under the table.  Columns with no value are left out.
    """
    wide = _state["wide"] if wide is None else wide
    cols = [(c, c, "{}") if isinstance(c, str) else (tuple(c) + ("{}",))[:3] for c in columns]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        line = []
        for key, _, fmt in cols:
            v = r.get(key, "")
            try:
                text = fmt.format(v) if v != "" and v is not None else "-"
            except (ValueError, TypeError):
                text = str(v)
            if isinstance(v, float) and math.isnan(v):
                text = "-"
            line.append(text)
        cells.append(line)
    keep = [i for i in range(len(cols)) if i == 0 or any(row[i] != "-" for row in cells[1:])]
    cells = [[row[i] for i in keep] for row in cells]
    wraps = [cols[i][0] in wrap for i in keep]
    caps = [None] * len(keep)
    hidden = []
    if not wide:
        widths = [max(len(row[i]) for row in cells) for i in range(len(keep))]
        while sum(widths) + 2 * (len(widths) - 1) > WIDTH:
            col = max(range(len(widths)), key=lambda i: widths[i])
            floor = max(len(cells[0][col]), 24)
            if widths[col] > floor:
                caps[col] = max(floor, widths[col] - (sum(widths) + 2 * (len(widths) - 1) - WIDTH))
                if not wraps[col]:
                    for row in cells[1:]:
                        if len(row[col]) > caps[col]:
                            row[col] = row[col][:caps[col] - 1] + "…"
                widths[col] = caps[col]
                continue
            hidden.append(cells[0][-1])
            cells, widths, caps, wraps = [row[:-1] for row in cells], widths[:-1], caps[:-1], wraps[:-1]
    numeric = [all(c == "-" or _NUMBER.fullmatch(c) for c in (row[i] for row in cells[1:])) for i in range(len(caps))]
    lines_of = [[textwrap.wrap(c, caps[i]) or [""] if caps[i] and wraps[i] else [c] for i, c in enumerate(row)]
                for row in cells]
    widths = [max(len(part) for row in lines_of for part in row[i]) for i in range(len(caps))]
    if title:
        for line in textwrap.wrap(title, WIDTH) if not wide else [title]:
            print(line)
    for k, row in enumerate(lines_of):
        for j in range(max(len(parts) for parts in row)):
            print("  ".join((parts[j] if j < len(parts) else "").rjust(w) if k and numeric[i]
                            else (parts[j] if j < len(parts) else "").ljust(w)
                            for i, (parts, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    notes = [f"not shown (--wide shows them): {', '.join(reversed(hidden))}" if hidden else None, legend]
    for note in filter(None, notes):
        for line in textwrap.wrap(note, WIDTH - 2, initial_indent="  ", subsequent_indent="  "):
            print(line)
    sys.stdout.flush()


# --------------------------------------------------------------------------- the three graphkern times


def user_call_figures(first_s, warm_s, kernel_s):
    """The row figures of one graphkern call: first, warm, kernel alone, share of the first call outside it."""
    out = {"first_s": first_s, "warm_s": warm_s, "kernel_s": kernel_s}
    if first_s and kernel_s is not None:
        out["outside_share"] = max(0.0, 1.0 - kernel_s / first_s)
    return out


USER_CALL_COLUMNS = [("first_ms", "first call ms", "{:.4g}"), ("warm_ms", "warm ms", "{:.4g}"),
                     ("kernel_ms", "kernel ms", "{:.4g}"), ("outside_share", "outside kernel", "{:.0%}")]
USER_CALL_LEGEND = ("first call: fresh object and inputs on the host, as a user calls it; warm: the same call "
                    "again; kernel: the compute alone (device events on the GPU); outside kernel: share of the "
                    "first call spent in validation, conversion, planning and copies")


def in_ms(row, *keys):
    """A copy of ``row`` with ``<key>_ms`` added for each ``<key>_s`` in seconds."""
    out = dict(row)
    for key in keys:
        v = row.get(f"{key}_s")
        if isinstance(v, (int, float)):
            out[f"{key}_ms"] = v * 1e3
    return out
