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

from graphkern.bench import suites as suites_pkg


class Progress:
    """A minimal progress bar on stderr (only when stderr is a terminal or forced)."""

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, iterable, desc="", total=None):
        if total is None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        if not self.enabled:
            yield from iterable
            return
        t0 = time.perf_counter()
        for k, item in enumerate(iterable):
            self._draw(desc, k, total, t0)
            yield item
        self._draw(desc, total if total is not None else k + 1, total, t0, end="\n")

    @staticmethod
    def _draw(desc, k, total, t0, end=""):
        el = time.perf_counter() - t0
        if total:
            n = int(30 * k / total)
            bar = "#" * n + "." * (30 - n)
            sys.stderr.write(f"\r{desc:<28} [{bar}] {k}/{total} {el:6.1f}s{end}")
        else:
            sys.stderr.write(f"\r{desc:<28} {k} {el:6.1f}s{end}")
        sys.stderr.flush()


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
        print(*args, flush=True)


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
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": resolve_threads(None),
        "python": platform.python_version(),
        "build": runtime.build_summary(),
        "gpus": runtime.devices_info(),
        "driver_version": runtime.driver_version(),
        "gpu_unavailable_reason": runtime.unavailable_reason(),
    }
    import numpy
    import scipy
    info["numpy"] = numpy.__version__
    info["scipy"] = scipy.__version__
    return info


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
    p.add_argument("--json", metavar="FILE", help="write system info and every result row to FILE")
    p.add_argument("--quick", action="store_true", help="small inputs, few repeats (seconds per suite)")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per measurement")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="suite", metavar="SUITE")
    for name, mod in suites.items():
        sp = sub.add_parser(name, help=getattr(mod, "HELP", ""))
        sp.add_argument("--json", metavar="FILE", default=argparse.SUPPRESS)
        sp.add_argument("--quick", action="store_true", default=argparse.SUPPRESS)
        sp.add_argument("--repeat", type=int, default=argparse.SUPPRESS)
        sp.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS)
        mod.add_arguments(sp)
    return p


def main(argv=None):
    suites = discover_suites()
    parser = build_parser(suites)
    args = parser.parse_args(argv)
    info = system_info()
    print_header(info)
    progress = Progress(enabled=not args.no_progress and sys.stderr.isatty())
    results = {"system": info, "suites": {}}
    if args.suite is None:
        # the default job: every suite's quick version on built-in generated data
        chosen = list(suites)
        args.quick = True
    else:
        chosen = [args.suite]
    ctx = Context(quick=args.quick, progress=progress, system=info, repeat=args.repeat)
    status = 0
    for name in chosen:
        mod = suites[name]
        if args.suite is None:
            sub_args = parser.parse_args([name] + (["--quick"] if args.quick else []))
        else:
            sub_args = args
        print(f"== {name} ==", flush=True)
        t0 = time.perf_counter()
        try:
            rows = mod.run(sub_args, ctx)
        except Exception as exc:  # one suite's failure must not hide the others' results
            import traceback
            traceback.print_exc()
            rows = [{"error": f"{type(exc).__name__}: {exc}"}]
            status = 1
        results["suites"][name] = {"rows": rows, "seconds": time.perf_counter() - t0}
        print(flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=_jsonable)
        print(f"results written to {args.json}")
    return status


def _jsonable(obj):
    import numpy as np
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def print_table(rows, columns, *, title=None):
    """Print ``rows`` (dicts) as an aligned table of ``columns`` (key or (key, header, fmt))."""
    cols = [(c, c, "{}") if isinstance(c, str) else (c + ("{}",))[:3] for c in columns]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        line = []
        for key, _, fmt in cols:
            v = r.get(key, "")
            try:
                line.append(fmt.format(v) if v != "" and v is not None else "-")
            except (ValueError, TypeError):
                line.append(str(v))
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    if title:
        print(title)
    for k, row in enumerate(cells):
        print("  ".join(s.rjust(w) if k else s.ljust(w) for s, w in zip(row, widths)))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()
