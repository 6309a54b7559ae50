"""Generation time of the graph generators: a 10^6-node graph of each model, median of a few runs.

Target: a 10^6-node Barabási–Albert graph in under 10 s on a 2-core machine.
"""

from __future__ import annotations

import math

from graphkern import generators
from graphkern.bench.report import Target, guarded, print_table, print_targets
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


# the same models in NetworkX, timed up to PEER_MAX_N vertices (pure Python: minutes at 10^6)
PEERS = {
    "barabasi_albert": lambda nx, n: nx.barabasi_albert_graph(n, 5, seed=0),
    "watts_strogatz": lambda nx, n: nx.watts_strogatz_graph(n, 10, 0.1, seed=0),
}
PEER_MAX_N = 10**5
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
            if model in PEERS and size <= PEER_MAX_N:
                rows[-1].update(guarded({}, _peer_seconds, model, size, repeat))
                if rows[-1].get("networkx_s"):
                    rows[-1]["vs_networkx"] = rows[-1]["networkx_s"] / rows[-1]["seconds"]
    print_table(rows, ["graph", "n", "nnz", ("seconds", "time s", "{:.3f}"), "repeats",
                       ("networkx_s", "NetworkX s", "{:.3f}"), ("vs_networkx", "x NetworkX", "{:.3g}"),
                       ("note", "note")],
                title=f"graph generation, median of {repeat} run(s) each",
                legend=f"NetworkX: the same model in networkx (up to {PEER_MAX_N:,} vertices); "
                       "x NetworkX: its time / graphkern's")
    ba = next((r for r in reversed(rows) if r["graph"] == "barabasi_albert"), None)
    targets = [TARGET.judge(ba["seconds"], ctx, repeats=ba["repeats"], full_size=n >= 10**6)] if ba else []
    print_targets(targets)
    points = [{"kind": "point", "series": "graphkern " + r["graph"], "size": r["nnz"], "seconds": r["seconds"],
               "size_label": "stored entries", "graph": r["graph"]} for r in rows]
    points += [{"kind": "point", "series": "networkx " + r["graph"], "size": r["nnz"], "seconds": r["networkx_s"],
                "size_label": "stored entries", "graph": r["graph"]} for r in rows if r.get("networkx_s")]
    compared = [r for r in rows if r.get("vs_networkx")]
    head = [{"kind": "headline", "what": f"{r['graph']} n={r['n']:,}", "ratio": r["vs_networkx"], "peer": "NetworkX"}
            for r in sorted(compared, key=lambda r: (r["graph"] == "barabasi_albert", r["n"]))[-1:]]
    return rows + targets + points + head


def _peer_seconds(model, n, repeat):
    """NetworkX's time for the same model and size, and graphkern's speed-up over it."""
    try:
        import networkx as nx
    except ImportError:
        return {"note": "networkx is not installed"}
    timing = time_cpu(lambda: PEERS[model](nx, n), repeat=repeat, warmup=0)
    return {"networkx_s": timing.median}
