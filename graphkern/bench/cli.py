"""Command-line benchmark runner: ``graphkern-bench [SUITE] [options]``.

With no suite it runs every suite's quick version on built-in generated data (the
README's main job).  Each suite lives in ``graphkern.bench.suites.<name>`` and defines
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args, ctx) -> list[dict]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import platform
import sys
import time
import traceback
from collections import Counter

import numpy as np
import scipy

from graphkern import _progress
from graphkern.bench import report
from graphkern.bench import suites as suites_pkg
from graphkern.bench.report import WIDTH, print_table  # noqa: F401  (suites import it from here)


class Progress:
    """Yields the items a suite walks, with graphkern's progress bar on stderr when ``enabled``."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, iterable, desc="", total=None):
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        with _progress.Progress(total, self.enabled, unit="items", desc=desc) as bar:
            for item in iterable:
                yield item
                bar.update()


class Context:
    """What every suite gets: quick flag, progress bars, system facts, a printer."""

    def __init__(self, quick, progress, system, repeat):
        self.quick = quick
        self.progress = progress
        self.system = system
        self.repeat = repeat

    @property
    def gpu(self):
        return bool(self.system.get("gpus"))

    def log(self, *args):
        """Print a line, wrapped at the table width unless --wide."""
        report.say(*args)


def discover_suites():
    found = {}
    for info in pkgutil.iter_modules(suites_pkg.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{suites_pkg.__name__}.{info.name}")
        if hasattr(mod, "run") and hasattr(mod, "NAME"):
            found[mod.NAME] = mod
    return dict(sorted(found.items()))


def system_info():
    from graphkern._backend import resolve_threads
    from graphkern._cuda import runtime

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": resolve_threads(None),
        "python": platform.python_version(),
        "build": runtime.build_summary(),
        "gpus": runtime.devices_info(),
        "driver_version": runtime.driver_version(),
        "gpu_unavailable_reason": runtime.unavailable_reason(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
    }


def print_header(info):
    print("graphkern-bench")
    print(f"  CPU     : {info['cpu']} ({info['cores']} cores, {info['threads']} threads)")
    b = info["build"]
    if b.get("cuda_built"):
        print(f"  build   : CUDA {b['cuda_header_version']} headers, archs {','.join(b['cuda_archs'] or [])}")
    else:
        print(f"  build   : CPU only ({b.get('reason')})")
    if info["gpus"]:
        for g in info["gpus"]:
            cc = g["compute_capability"]
            print(f"  GPU {g['ordinal']}   : {g['name']} (sm_{cc[0]}{cc[1]}, {g['multiprocessor_count']} SMs, "
                  f"{g['total_memory'] / 2**30:.0f} GiB), driver {info['driver_version']}")
    else:
        print(f"  GPU     : none ({info['gpu_unavailable_reason']})")
    print(flush=True)


def build_parser(suites):
    p = argparse.ArgumentParser(prog="graphkern-bench", description=__doc__.splitlines()[0])
    common = [
        (("--json",), dict(metavar="FILE", help="write system info and every result row to FILE")),
        (("--quick",), dict(action="store_true", help="small inputs, few repeats (seconds per suite)")),
        (("--repeat",), dict(type=int, help="timed repeats per measurement")),
        (("--no-progress",), dict(action="store_true", help="no progress bars")),
        (("--wide",), dict(action="store_true", help=f"every column, lines longer than {WIDTH} characters")),
        (("--plot",), dict(metavar="DIR", help="write PNG figures to DIR (needs matplotlib)")),
    ]
    for flags, kw in common:
        p.add_argument(*flags, default=False if kw.get("action") == "store_true" else None, **kw)
    p.add_argument("--figures-from", nargs="+", metavar="JSON",
                   help="run nothing: draw the figures (--plot DIR) of these --json files, runs of one card merged")
    sub = p.add_subparsers(dest="suite", metavar="SUITE")
    for name, mod in suites.items():
        sp = sub.add_parser(name, help=getattr(mod, "HELP", ""))
        for flags, kw in common:
            sp.add_argument(*flags, default=argparse.SUPPRESS, **kw)
        mod.add_arguments(sp)
    return p


def main(argv=None):
    """Run the chosen suite (or every suite's quick run); exit 1 only if graphkern failed or was wrong."""
    suites = discover_suites()
    parser = build_parser(suites)
    args = parser.parse_args(argv)
    if args.figures_from:
        return _figures_from(args.figures_from, args.plot or parser.error("--figures-from needs --plot DIR"))
    report.set_wide(args.wide)
    report.reset()
    t_start = time.perf_counter()
    info = system_info()
    print_header(info)
    progress = Progress(enabled=not args.no_progress and sys.stderr.isatty())
    results = {"system": info, "suites": {}}
    if args.suite is None:
        # the main job: every suite's quick run on built-in data
        chosen = list(suites)
        args.quick = True
    else:
        chosen = [args.suite]
    ctx = Context(quick=args.quick, progress=progress, system=info, repeat=args.repeat)
    crashed = []
    for name in chosen:
        mod = suites[name]
        sub_args = parser.parse_args([name] + (["--quick"] if args.quick else [])) if args.suite is None else args
        print(f"== {name} ==", flush=True)
        t0 = time.perf_counter()
        try:
            rows = mod.run(sub_args, ctx)
        except Exception as exc:  # graphkern itself crashed: report it, run the other suites, exit 1
            traceback.print_exc()
            rows = [{"kind": "crashed", "error": report.error_text(exc)}]
            crashed.append(f"{name}: {report.error_text(exc)}")
        results["suites"][name] = {"rows": rows, "seconds": time.perf_counter() - t0}
        print(flush=True)
    total = time.perf_counter() - t_start
    print_summary(results, total, crashed)
    results["total_seconds"] = total
    results["wrong_answers"] = report.wrong_answers()
    _copy_bandwidths(info)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=_jsonable)
        print(f"results written to {args.json}")
    if args.plot:
        from graphkern.bench.plots import write_plots

        for path in write_plots(results, args.plot):
            print(f"figure written to {path}")
    return 1 if crashed or report.wrong_answers() else 0


def _copy_bandwidths(info):
    """The copy bandwidths the bandwidth figures compare with: the device's on a GPU, the host's always."""
    from graphkern.bench.timing import device_copy_bandwidth, host_copy_bandwidth

    if info["gpus"]:
        try:
            info["device_copy_bandwidth"] = device_copy_bandwidth()
        except Exception as exc:  # the figure goes without the line, and says why
            print(f"device copy bandwidth not measured: {report.failure_text(exc)}")
    info["host_copy_bandwidth"] = host_copy_bandwidth()


def _figures_from(paths, directory):
    """The figures of several JSON results (one card), each suite's rows concatenated."""
    from graphkern.bench.plots import write_plots

    merged = {"system": {}, "suites": {}}
    for path in paths:
        with open(path) as fh:
            res = json.load(fh)
        merged["system"].update({k: v for k, v in res["system"].items() if v is not None})
        for name, suite in res["suites"].items():
            merged["suites"].setdefault(name, {"rows": [], "seconds": 0.0})
            merged["suites"][name]["rows"] += suite["rows"]
    for path in write_plots(merged, directory):
        print(f"figure written to {path}")
    return 0


def print_summary(results, total, crashed):
    """One line per suite (headline ratio against its best peer, verdict counts), then the totals."""
    lines, counts = [], Counter()
    for name, res in results["suites"].items():
        rows = res["rows"]
        verdicts = Counter(r.get("verdict") for r in rows if r.get("kind") == "target")
        counts += verdicts
        head = next((r for r in rows if r.get("kind") == "headline"), None)
        crash = next((r for r in rows if r.get("kind") == "crashed"), None)
        if crash is not None:
            headline = "graphkern crashed: " + crash["error"]
        elif head is None:
            headline = "no peer timed in this suite"
        else:
            headline = (f"{head['what']}: {'est ' if head.get('estimated') else ''}{head['ratio']:.3g}x "
                        f"{head['peer']}" if head.get("ratio") else f"{head['what']}: {head.get('note', '-')}")
        lines.append({"suite": name, "seconds": res["seconds"], "headline": headline,
                      "verdicts": " ".join(f"{verdicts[k]} {k}" for k in ("PASS", "MISS", "info") if verdicts[k]) or "-"})
    print_table(lines, [("suite", "suite"), ("seconds", "time s", "{:.1f}"), ("verdicts", "verdicts"),
                        ("headline", "graphkern against its best peer (ratio = peer time / graphkern time)")],
                title="summary")
    print(f"total: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['info']} info; {total:.1f} s"
          + (f"; graphkern crashed in: {'; '.join(crashed)}" if crashed else "")
          + (f"; wrong answers: {len(report.wrong_answers())}" if report.wrong_answers() else ""), flush=True)


def _jsonable(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
