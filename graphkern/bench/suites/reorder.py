"""Non-empty 8x8 adjacency tiles (octiles) under natural, RCM, PBR and space-filling-curve orders.

The marginalized graph kernel streams only non-empty octiles, so its time per pair follows
their count; the order is chosen once per graph and is amortized over all pairs.  For
each graph set the suite prints the off-diagonal non-empty octiles summed over the set
under every order (the diagonal ones are the same ``ceil(n/8)`` in every order but for
empty parts), PBR's time per graph (one thread) and for the whole set through
``reorder_many`` on one thread and on ``--threads``, and the target: PBR with
fewer off-diagonal non-empty octiles than RCM on every set (the one definition of that target;
the mgk-techniques suite shows the counts too).

Sets (generated, seeded):

* ``nws``: Newman-Watts-Strogatz, 96 vertices, k=4, p=0.1 (the MGK suite's synthetic set;
  the generator needs an even k);
* ``ba``: Barabási-Albert, 96 vertices, m=6;
* ``nci``: real molecules, the packaged set (``graphkern.bench.data.molecules_path()``: NCI
  structures with hydrogens and 3D coordinates, mean 29 atoms), atoms in file order;
* ``molecule``: molecule-like skeletons, 12-60 atoms: 5/6-rings (some fused), chains and
  branches, degree <= 4, atoms numbered in growth order as a SMILES parser would;
* ``protein``: 3D contact graphs of a folded chain (``contact_graph_3d``), 500-1000
  residues, in chain order as read from a PDB file; ``protein_shuffled``: the same graphs
  with their residues numbered at random.  Both carry coordinates, so Morton and Hilbert
  orders are measured too.

CPU only: nothing here runs on the GPU.
"""

from __future__ import annotations

import numpy as np

from graphkern import generators
from graphkern._backend import resolve_threads
from graphkern.bench.data import molecules_path
from graphkern.bench.report import Target, print_table, print_targets
from graphkern.bench.timing import time_cpu
from graphkern.graph import Graph
from graphkern.reorder import octile_count, reorder, reorder_many

NAME = "reorder"
HELP = "non-empty octiles under natural / RCM / PBR / Morton / Hilbert order, and PBR's time"

SETS = ("nws", "ba", "nci", "molecule", "protein", "protein_shuffled")
# graphs per set: (quick, full)
SET_SIZES = {"nws": (6, 160), "ba": (6, 160), "nci": (40, 1000), "molecule": (20, 500), "protein": (2, 32),
             "protein_shuffled": (2, 32)}
PBR_TARGET = Target("PBR leaves fewer non-empty off-diagonal octiles than RCM on every graph set (worst PBR / RCM)",
                    "<", 1, unit="", gpu=None, cores=1, sizes="the full sets (32-1000 graphs each)")


def add_arguments(parser):
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS), metavar="SET",
                        help=f"graph sets to measure ({', '.join(SETS)})")
    parser.add_argument("--n-graphs", type=int, default=None, help="graphs per set (default: per set, fewer with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="threads for the whole-set PBR run (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated sets")


def molecule_like(rng):
    """A molecule-like skeleton: rings of 5 or 6 (attached or fused), chains and branches, degree <= 4."""
    n_atoms = int(rng.integers(12, 61))
    degree = []
    edges = []

    def new_atom():
        degree.append(0)
        return len(degree) - 1

    def bond(a, b):
        edges.append((a, b))
        degree[a] += 1
        degree[b] += 1

    def ring_through(first, last, size):
        prev = first
        for _ in range(size - 2):
            atom = new_atom()
            bond(prev, atom)
            prev = atom
        bond(prev, last)

    start = new_atom()
    ring_through(start, start, int(rng.choice([5, 6])) + 1)
    while len(degree) < n_atoms:
        free = np.flatnonzero(np.array(degree) < 3)
        if not len(free):
            break
        a = int(rng.choice(free))
        roll = rng.random()
        if roll < 0.12:  # a new ring hanging off a
            first = new_atom()
            bond(a, first)
            ring_through(first, first, int(rng.choice([5, 6])) + 1)
        elif roll < 0.22:  # a ring fused on a bond of a
            partners = [y for x, y in edges if x == a and degree[y] < 3] + [x for x, y in edges if y == a and degree[x] < 3]
            if partners:
                ring_through(a, partners[0], int(rng.choice([5, 6])))
        else:
            bond(a, new_atom())
    return Graph.from_edges(np.array(edges, dtype=np.int64), len(degree), name="molecule-like")


def build_set(name, count, rng):
    seeds = rng.integers(0, 2**31, size=count)
    if name == "nws":
        return [generators.newman_watts_strogatz(96, 4, 0.1, seed=int(s)) for s in seeds]
    if name == "ba":
        return [generators.barabasi_albert(96, 6, seed=int(s)) for s in seeds]
    if name == "molecule":
        return [molecule_like(np.random.default_rng(int(s))) for s in seeds]
    if name == "nci":
        from itertools import islice

        from graphkern.io import iter_sdf
        return list(islice(iter_sdf(molecules_path()), count))
    sizes = rng.integers(500, 1001, size=count)
    graphs = [generators.contact_graph_3d(int(n), seed=int(s)) for n, s in zip(sizes, seeds)]
    if name == "protein_shuffled":
        graphs = [g.permute(rng.permutation(g.n_nodes)) for g in graphs]
    return graphs


def measure_set(name, graphs, threads, repeat, ctx):
    has_coords = all("coords" in g.node_labels for g in graphs)
    methods = [None, "rcm", "pbr"] + (["morton", "hilbert"] if has_coords else [])
    row = {"set": name, "graphs": len(graphs), "mean_n": float(np.mean([g.n_nodes for g in graphs])),
           "mean_nnz": float(np.mean([g.nnz for g in graphs]))}
    per_graph_s = []
    for method in methods:
        key = "natural" if method is None else method
        offdiag = total = 0
        entries_in_tiles = []
        for g in ctx.progress(graphs, desc=f"{name} {key}"):
            if method == "pbr":
                holder = []
                timing = time_cpu(lambda: holder.append(reorder(g, "pbr")), repeat=repeat, warmup=0)
                per_graph_s.append(timing.median)
                perm = holder[-1]
            else:
                perm = reorder(g, method)
            stats = octile_count(g, perm)
            offdiag += stats["offdiag_nonempty_tiles"]
            total += stats["nonempty_tiles"]
            entries_in_tiles.append(stats["nnz"])
        row[f"{key}_offdiag"] = offdiag
        row[f"{key}_tiles"] = total
        row[f"{key}_nnz_per_tile"] = sum(entries_in_tiles) / total if total else 0.0
    row["pbr_vs_rcm"] = row["pbr_offdiag"] / row["rcm_offdiag"] if row["rcm_offdiag"] else float("nan")
    row["pbr_vs_natural"] = row["pbr_offdiag"] / row["natural_offdiag"] if row["natural_offdiag"] else float("nan")
    row["pbr_ms_per_graph_median"] = 1e3 * float(np.median(per_graph_s))
    row["pbr_ms_per_graph_max"] = 1e3 * float(np.max(per_graph_s))
    one = time_cpu(lambda: reorder_many(graphs, "pbr", n_threads=1), repeat=repeat, warmup=0)
    many = time_cpu(lambda: reorder_many(graphs, "pbr", n_threads=threads), repeat=repeat, warmup=0)
    row["pbr_set_s_1thread"] = one.median
    row["pbr_set_s_threads"] = many.median
    row["threads"] = threads
    row["thread_speedup"] = one.median / many.median if many.median > 0 else float("nan")
    return row


def run(args, ctx):
    threads = resolve_threads(args.threads)
    repeat = ctx.repeat or (1 if ctx.quick else 3)
    rng = np.random.default_rng(args.seed)
    rows = []
    for name in args.sets:
        count = args.n_graphs or SET_SIZES[name][0 if ctx.quick else 1]
        graphs = build_set(name, count, rng)
        rows.append(measure_set(name, graphs, threads, repeat, ctx))

    print_table(rows, ["set", "graphs", ("mean_n", "mean n", "{:.0f}"),
                       ("natural_offdiag", "natural", "{}"), ("rcm_offdiag", "RCM", "{}"),
                       ("morton_offdiag", "Morton", "{}"), ("hilbert_offdiag", "Hilbert", "{}"),
                       ("pbr_offdiag", "PBR", "{}"), ("pbr_vs_rcm", "PBR/RCM", "{:.3f}"),
                       ("pbr_vs_natural", "PBR/natural", "{:.3f}")],
                title="off-diagonal non-empty octiles, summed over each set")
    print()
    print_table(rows, ["set", ("natural_tiles", "natural all", "{}"), ("rcm_tiles", "RCM all", "{}"),
                       ("pbr_tiles", "PBR all", "{}"), ("rcm_nnz_per_tile", "RCM nnz/tile", "{:.2f}"),
                       ("pbr_nnz_per_tile", "PBR nnz/tile", "{:.2f}")],
                title="all non-empty octiles (diagonal included) and stored entries per non-empty octile")
    print()
    print_table(rows, ["set", ("pbr_ms_per_graph_median", "PBR ms/graph (median)", "{:.2f}"),
                       ("pbr_ms_per_graph_max", "max", "{:.2f}"),
                       ("pbr_set_s_1thread", "set s, 1 thread", "{:.3f}"),
                       ("pbr_set_s_threads", "set s, threads", "{:.3f}"), "threads",
                       ("thread_speedup", "speedup", "{:.2f}")],
                title=f"PBR run time (median of {repeat} run(s); per graph on one thread, whole set via reorder_many)",
                legend="speedup: the whole set on one thread / on all threads")
    print()
    missed = [r["set"] for r in rows if not r["pbr_offdiag"] < r["rcm_offdiag"]]
    worst = max(rows, key=lambda r: r["pbr_vs_rcm"])
    target = PBR_TARGET.judge(worst["pbr_vs_rcm"], ctx, full_size=args.n_graphs is None,
                              detail=f"worst: {worst['set']}" + (f"; not fewer on {', '.join(missed)}" if missed else ""))
    print_targets([target])
    best = min(rows, key=lambda r: r["pbr_vs_rcm"])
    head = {"kind": "headline", "what": f"PBR off-diagonal octiles, {best['set']}", "ratio": 1 / best["pbr_vs_rcm"],
            "peer": "RCM (fewer octiles)"}
    return rows + [target, head]
