"""Generation time of the graph generators: a 10^6-node graph of each model, median of a few runs.

Target: a 10^6-node Barabási–Albert graph in under 10 s on a 2-core machine.
"""

from __future__ import annotations

import math

from graphkern import generators
from graphkern.bench.report import Target, print_table, print_targets
from graphkern.bench.timing import time_cpu

NAME = "generators"
HELP = "seconds to generate 10^6-node graphs of each model (Barabási–Albert, R-MAT, Delaunay, ...)"

# each case builds a graph of about n nodes, seeded
CASES = {
    "barabasi_albert": lambda n: generators.barabasi_albert(n, 5, seed=0),
    "watts_strogatz": lambda n: generators.watts_strogatz(n, 10, 0.1, seed=0),
    "newman_watts_strogatz": lambda n: generators.newman_watts_strogatz(n, 10, 0.1, seed=0),
    "rmat": lambda n: generators.rmat(max(1, round(math.log2(n))), 16, seed=0),
    "chung_lu": lambda n: generators.chung_lu(n, 2.5, 10, seed=0),
    "delaunay": lambda n: generators.delaunay(n, seed=0),
    "grid_2d": lambda n: generators.grid_2d(math.isqrt(n), math.isqrt(n)),
    "contact_graph_3d": lambda n: generators.contact_graph_3d(n, seed=0),
    # as many stored entries as a 10-regular graph on n nodes
    "complete": lambda n: generators.complete(math.isqrt(10 * n)),
}


TARGET = Target("a Barabási–Albert graph of 10^6 vertices generated in ≤ 10 s on 2 cores", "<=", 10, unit=" s",
                gpu=None, cores=2, sizes="10^6 vertices")


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=None,
                        help="nodes of the largest graph (default 10^6, 10^4 with --quick); a full run also "
                             "generates n/100 and n/10")
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), metavar="MODEL",
                        help=f"generate only these models ({', '.join(CASES)})")


def run(args, ctx):
    n = args.n or (10**4 if ctx.quick else 10**6)
    repeat = ctx.repeat or (1 if ctx.quick else 3)
    chosen = args.only or list(CASES)
    sizes = [n] if ctx.quick else [max(1, n // 100), max(1, n // 10), n]
    rows = []
    for model in ctx.progress(chosen, desc="generators"):
        for size in sizes:
            made = []
            timing = time_cpu(lambda: made.append(CASES[model](size)), repeat=repeat, warmup=0)
            graph = made[-1]
            rows.append({"graph": model, "n": graph.n_nodes, "nnz": graph.nnz, "seconds": timing.median,
                         **timing.as_dict()})
            made.clear()
    print_table(rows, ["graph", "n", "nnz", ("seconds", "time s (median)", "{:.3f}"), "repeats"],
                title=f"graph generation, {repeat} run(s) each")
    ba = next((r for r in reversed(rows) if r["graph"] == "barabasi_albert"), None)
    targets = [TARGET.judge(ba["seconds"], ctx, repeats=ba["repeats"], full_size=n >= 10**6)] if ba else []
    print_targets(targets)
    points = [{"kind": "point", "series": "graphkern " + r["graph"], "size": r["nnz"], "seconds": r["seconds"],
               "size_label": "stored entries", "graph": r["graph"]} for r in rows]
    return rows + targets + points
