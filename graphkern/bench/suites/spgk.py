"""Shortest-path kernel Gram matrices: every algorithm and backend, GraKeL beside them.

Datasets (the FCSP paper's synthetic sets and a molecular one):

* ``complete-N``: 256 complete graphs of N vertices (N = 10, 15, ..., 50), a standard
  normal continuous attribute ``x`` per vertex; kernel ``GaussianNode('x', sigma=1)``
  with ``DiracEdge`` (GraKeL's ShortestPathAttr with a Gaussian metric computes the same);
* ``mixed``: 180 complete graphs of 10 vertices and 76 of 50, the same kernel;
* ``molecules-bonds`` / ``molecules-3d``: molecules from ``--sdf`` (or ``--smiles``),
  hydrogens dropped; element labels with DiracNode, paths counted in bonds with DiracEdge
  (GraKeL's ShortestPath computes the same) or measured along 3D bond lengths with
  BrownianBridgeEdge(c=0.5).  Without a file, the packaged 1000 NCI molecules
  (``graphkern.bench.data``).

The paper's CPU algorithms (naive, fcsp, openmp_in, openmp_out) run its walk over both
graphs' path arrays (``cpu_walk="edges"``), and the targets' ratios against sequential FCSP
use that walk; ``fcsp_dense`` and ``openmp_out_dense`` are the same schedules with the dense
walk (``cpu_walk="dense"``: one graph's lengths as a matrix whose rows run 4-8 doubles wide),
and the hybrid's CPU side uses the default ``cpu_walk="auto"``.

Every time is the whole Gram matrix (upper triangle) with the shortest paths already
cached on the kernel object; computing them once per graph is shown on its own row.
Slow methods (naive, GraKeL) run on a random subset of the graphs chosen to fit
``--budget`` seconds and are scaled up by the ratio of work (sum over pairs of
(|P|+n)(|P'|+n'); for GraKeL's ShortestPathAttr its loop count n(n-1) n'(n'-1)); those
rows are marked ``~`` (estimated).  Where one GraKeL pair alone would pass the budget
(complete graphs of 25 vertices and more), its time is its measured seconds per loop
iteration on 8-vertex complete graphs times the loop count.

Cost floor on an H100 for complete-50 (32,896 pairs of 1,225 x 1,225 unordered paths,
4.9e10 path pairs): each reads four float64 values of V from shared memory; at 32
banks x 4 B per clock on 132 SMs at 1.755 GHz (about 3.7e12 8-byte loads/s) that is
about 54 ms; the six FP64 operations per path pair take 2.9e11 / 34 TFLOP/s = 9 ms; the
path arrays (40 KB per pair) come from L1.  So about 50 ms for the batched kernel,
against about 40 s for sequential FCSP at 0.8 ns per path pair (the target, 100x,
asks for 0.4 s).
"""

from __future__ import annotations

import time

import numpy as np

from graphkern.bench.report import (USER_CALL_COLUMNS, USER_CALL_LEGEND, Target, failure_text, in_ms, print_table,
                                    print_targets, say, user_call_figures)
from graphkern.bench.timing import Timing, first_calls, scaled_estimate, time_cpu

NAME = "spgk"
HELP = "shortest-path kernel: naive, FCSP, OpenMP, GPU 1D/2D/overlap/batched, hybrid; GraKeL peers"

CPU_ROWS = ("naive", "fcsp", "openmp_in", "openmp_out")
DENSE_ROWS = ("fcsp_dense", "openmp_out_dense")
GPU_ROWS = ("gpu_1d", "gpu_2d", "gpu_1d_overlap", "gpu_2d_overlap", "gpu_batched", "hybrid")
SIGMA = 1.0
FULL = "256 complete graphs of 50 vertices; the mixed set 180x10 + 76x50"
TARGETS = {
    "naive": Target("sequential FCSP ≥ 50x the naive algorithm on complete graphs of 50 vertices", ">=", 50,
                    gpu=None, cores=1, sizes=FULL),
    "gpu_fcsp": Target("best GPU method ≥ 100x sequential FCSP on complete graphs of 50 vertices", ">=", 100,
                       sizes=FULL),
    "grakel": Target("graphkern ≥ 1000x GraKeL ShortestPathAttr on complete graphs of 50 vertices", ">=", 1000,
                     sizes=FULL),
    "hybrid": Target("hybrid faster than every single backend on the mixed set", ">=", 1, sizes=FULL),
    "first_warm": Target("first call ≤ 2x the warm call on ≥ 250 molecules", "<=", 2,
                         sizes="≥ 250 molecules"),
}
# bond lengths are 1.0-1.6 Angstrom: paths within half an Angstrom of each other still match a little
BROWNIAN_C = 0.5


def add_arguments(parser):
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="complete-graph sizes (default 10,15,...,50; --quick: 10,20)")
    parser.add_argument("--graphs", type=int, default=None, help="graphs per size (default 256; --quick: 24)")
    parser.add_argument("--mixed", default=None, metavar="AxN,BxM",
                        help="the mixed set as count x size (default 180x10,76x50; --quick: 18x10,6x30)")
    parser.add_argument("--sdf", default=None, help="molecules from this SD file, hydrogens dropped (default: the packaged 1000 NCI molecules)")
    parser.add_argument("--smiles", default=None, help="molecules from this SMILES file (needs RDKit; no 3D set)")
    parser.add_argument("--molecules", type=int, default=None, help="molecules used (default 1000; --quick: 40)")
    parser.add_argument("--attr-dim", type=int, default=1, help="length of the continuous vertex attribute")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds one measurement may take before it runs on a subset (default 10; --quick: 1)")
    parser.add_argument("--methods", nargs="+", default=None, choices=CPU_ROWS + DENSE_ROWS + GPU_ROWS,
                        help="time only these algorithms")
    parser.add_argument("--no-peers", action="store_true", help="skip GraKeL")
    parser.add_argument("--datasets", nargs="+", default=None, metavar="NAME",
                        help="only these datasets (complete-N, mixed, molecules-bonds, molecules-3d, scaling)")
    parser.add_argument("--scaling", type=lambda s: [int(x) for x in s.split(",")], default=None, metavar="N,N",
                        help="molecule counts of the scaling table (default 100,1000,10000,100000; --quick: 100,1000)")
    parser.add_argument("--scaling-budget", type=float, default=60.0,
                        help="seconds a scaling-table call may be predicted to take and still run (default 60)")


# --------------------------------------------------------------------------- datasets

def _with_attributes(graph, rng, dim):
    from graphkern import Graph

    x = rng.normal(size=graph.n_nodes) if dim == 1 else rng.normal(size=(graph.n_nodes, dim))
    return Graph(graph.indptr, graph.indices, graph.weights, node_labels={"x": x})


def _complete_graphs(sizes_and_counts, rng, dim):
    from graphkern import generators

    shapes = {n: generators.complete(n) for n, _ in sizes_and_counts}
    return [_with_attributes(shapes[n], rng, dim) for n, count in sizes_and_counts for _ in range(count)]


def _molecules(args, n_wanted, rng):
    """(bond-count graphs, 3D-length graphs or None, a line saying where they come from)."""
    if args.sdf or not args.smiles:
        from graphkern.bench.data import molecules_path
        from graphkern.io import read_sdf

        args.sdf = args.sdf or molecules_path()
        bonds = read_sdf(args.sdf, hydrogens=False)[:n_wanted]
        lengths = read_sdf(args.sdf, hydrogens=False, distance_weights=True)[:n_wanted]
        return bonds, lengths, f"{len(bonds)} molecules from {args.sdf}"
    from graphkern.io import read_smiles

    bonds = [g for g in read_smiles(args.smiles)[:n_wanted] if g.n_nodes > 0]
    return bonds, None, f"{len(bonds)} molecules from {args.smiles} (no 3D coordinates: no molecules-3d set)"


def _datasets(args, ctx):
    from graphkern.spgk import BrownianBridgeEdge, DiracEdge, DiracNode, GaussianNode

    quick = ctx.quick
    rng = np.random.default_rng(2015)
    sizes = args.sizes or ([10, 20] if quick else list(range(10, 51, 5)))
    count = args.graphs or (16 if quick else 256)
    mixed = args.mixed or ("18x10,4x30" if quick else "180x10,76x50")
    mixed = [tuple(int(v) for v in part.split("x")) for part in mixed.split(",")]
    continuous = dict(node_kernel=GaussianNode("x", sigma=SIGMA), edge_kernel=DiracEdge())
    out = []
    for n in sizes:
        out.append(dict(name=f"complete-{n}", graphs=_complete_graphs([(n, count)], rng, args.attr_dim),
                        kernel=continuous, peer="ShortestPathAttr", about=f"{count} complete graphs of {n} vertices"))
    out.append(dict(name="mixed", graphs=_complete_graphs([(n, c) for c, n in mixed], rng, args.attr_dim),
                    kernel=continuous, peer="ShortestPathAttr",
                    about=" + ".join(f"{c} complete graphs of {n}" for c, n in mixed)))
    bonds, lengths, about = _molecules(args, args.molecules or (24 if quick else 1000), rng)
    out.append(dict(name="molecules-bonds", graphs=bonds, peer="ShortestPath", about=about,
                    kernel=dict(node_kernel=DiracNode("element"), edge_kernel=DiracEdge())))
    if lengths is not None:
        out.append(dict(name="molecules-3d", graphs=lengths, peer=None, about=about + ", paths in bond lengths",
                        kernel=dict(node_kernel=DiracNode("element"), edge_kernel=BrownianBridgeEdge(BROWNIAN_C))))
    if args.datasets:
        out = [d for d in out if d["name"] in args.datasets]
    return out


# --------------------------------------------------------------------------- timing on a budget

def _work(graphs):
    """Per-graph size term of our kernels: a pair costs about the product of its graphs' terms."""
    from graphkern.spgk import shortest_path_graph

    return np.array([len(shortest_path_graph(g)[1]) + g.n_nodes for g in graphs], dtype=np.float64)


def _ordered_pairs(graphs):
    """GraKeL's ShortestPathAttr runs its loop body n1 (n1 - 1) n2 (n2 - 1) times per pair."""
    return np.array([g.n_nodes * (g.n_nodes - 1) for g in graphs], dtype=np.float64)


def _pair_work(w):
    return float((w.sum() ** 2 + (w ** 2).sum()) / 2)  # sum over i <= j of w_i w_j


class _Budget:
    """Times a Gram computation on all graphs, or on a random subset scaled up by work."""

    def __init__(self, graphs, seconds, repeat, seed=0, work=_work):
        self.graphs = graphs
        self.seconds = seconds
        self.repeat = repeat
        self.order = np.random.default_rng(seed).permutation(len(graphs))
        self.w = work(graphs)
        self.total = _pair_work(self.w)

    def subset(self, m):
        idx = np.sort(self.order[:m])
        return [self.graphs[i] for i in idx], _pair_work(self.w[idx])

    def measure(self, run, probe=3, rate=None):
        """``run(graphs)`` computes one Gram matrix; returns (Timing, graphs used).

        ``rate`` (seconds per unit of work, measured on small graphs) lets a run that
        would pass the budget even on ``probe`` graphs be estimated without running.
        """
        n = len(self.graphs)
        m = min(n, probe)
        probe_graphs, probe_work = self.subset(m)
        if rate is not None and rate * probe_work > self.seconds:
            return Timing([rate * self.total], estimated=True), 0
        t0 = time.perf_counter()
        run(probe_graphs)  # warms caches (shortest paths, GPU modules)
        first = time.perf_counter() - t0
        if first < self.seconds / 20:
            t0 = time.perf_counter()
            run(probe_graphs)
            first = time.perf_counter() - t0
        per_work = first / max(probe_work, 1.0)
        while m < n and per_work * self.subset(m + 1)[1] <= self.seconds:
            m += 1
        graphs, work = self.subset(m)
        # the first run on these graphs is the warm-up; it is the timing itself when repeats
        # would not fit the budget
        t0 = time.perf_counter()
        run(graphs)
        full = time.perf_counter() - t0
        if m < n and full * self.total / work <= self.seconds / 2:
            # the probe's fixed costs made the rate look higher than it is (fast methods: a GPU
            # launch on three graphs): the whole set fits the budget after all
            graphs, work, m = self.graphs, self.total, n
            t0 = time.perf_counter()
            run(graphs)
            full = time.perf_counter() - t0
        if full < self.seconds / 5:
            timing = time_cpu(lambda: run(graphs), repeat=self.repeat, warmup=0, max_seconds=self.seconds)
        else:
            timing = Timing([full])
        if m < n:
            timing = scaled_estimate(timing, self.total / work)
        return timing, m


# --------------------------------------------------------------------------- peers

def _grakel_runner(peer, dataset):
    """A function computing GraKeL's Gram matrix of a list of graphs, or (None, reason)."""
    try:
        import grakel
    except ImportError as exc:
        return None, f"GraKeL is not installed ({exc}); pip install grakel"
    import warnings

    warnings.filterwarnings("ignore", module="grakel")
    if peer == "ShortestPathAttr":
        def convert(g):
            x = g.node_labels["x"].reshape(g.n_nodes, -1)
            return grakel.Graph(g.to_scipy().toarray(), {i: x[i] for i in range(g.n_nodes)})

        def gaussian(x, y):
            return float(np.exp(-np.sum((x - y) ** 2) / (2 * SIGMA ** 2)))

        make = lambda: grakel.ShortestPathAttr(metric=gaussian)
        work = _ordered_pairs
    else:
        def convert(g):
            return grakel.Graph(g.to_scipy().toarray(), {i: int(v) for i, v in enumerate(g.node_labels["element"])})

        make = lambda: grakel.ShortestPath(with_labels=True)
        work = _work
    converted = {}  # id -> (graph, its GraKeL form): holding the graph keeps its id from being reused

    def gram(graphs):
        for g in graphs:  # GraKeL's input format, built outside the timed runs after the first
            if id(g) not in converted:
                converted[id(g)] = (g, convert(g))
        return make().fit_transform([converted[id(g)][1] for g in graphs])

    rate = None
    if peer == "ShortestPathAttr":
        # seconds per loop iteration, on two small graphs with attributes like the dataset's
        first = dataset["graphs"][0].node_labels["x"]
        dim = 1 if first.ndim == 1 else first.shape[1]
        small = _complete_graphs([(8, 2)], np.random.default_rng(0), dim)
        gram(small)
        t0 = time.perf_counter()
        gram(small)
        rate = (time.perf_counter() - t0) / _pair_work(_ordered_pairs(small))
    return (gram, work, rate), None



# --------------------------------------------------------------------------- the suite

# --quick times the methods the targets and the headline compare; --methods picks any
QUICK_METHODS = ("naive", "fcsp", "fcsp_dense", "openmp_out_dense", "gpu_batched", "hybrid")


def _methods(args, ctx):
    chosen = args.methods or list(QUICK_METHODS if ctx.quick else CPU_ROWS + DENSE_ROWS + GPU_ROWS)
    return ([m for m in chosen if m not in GPU_ROWS or ctx.gpu],
            [m for m in chosen if m in GPU_ROWS and not ctx.gpu])


def _kernel_for(method, spec, threads):
    from graphkern.spgk import ShortestPathKernel

    if method == "hybrid":
        return ShortestPathKernel(**spec, backend="hybrid", n_threads=threads)
    if method in DENSE_ROWS:
        base = method[:-len("_dense")]
        return ShortestPathKernel(**spec, backend="cpu", method=base, n_threads=1 if base == "fcsp" else threads,
                                  cpu_walk="dense")
    if method in CPU_ROWS:
        return ShortestPathKernel(**spec, backend="cpu", method=method,
                                  n_threads=1 if method in ("naive", "fcsp") else threads, cpu_walk="edges")
    return ShortestPathKernel(**spec, backend="gpu", method=method)


def run(args, ctx):
    budget = args.budget or (1.0 if ctx.quick else 10.0)
    repeat = ctx.repeat or 3
    threads = ctx.system.get("threads") or 1
    methods, no_gpu = _methods(args, ctx)
    rows = []
    if no_gpu:
        say(f"GPU rows skipped ({', '.join(no_gpu)}): {ctx.system.get('gpu_unavailable_reason') or 'no GPU'}")
    for ds in _datasets(args, ctx):
        rows += _run_dataset(ds, methods, budget, repeat, threads, args, ctx)
    if rows:
        _print_tables(rows)
        rows += _targets(rows, ctx)
    if not args.datasets or "scaling" in args.datasets:
        from graphkern.bench.suites._spgk_scaling import scaling_table

        rows += scaling_table(args, ctx, _grakel_runner)
    return rows + headline(rows) + points(rows)


def _run_dataset(ds, methods, budget, repeat, threads, args, ctx):
    graphs = ds["graphs"]
    n = len(graphs)
    timer = _Budget(graphs, budget, repeat)
    header = dict(dataset=ds["name"], graphs=n, pairs=n * (n + 1) // 2, work=timer.total)
    say(f"{ds['name']}: {ds['about']}")
    rows = [_user_call(ds, header, repeat, ctx.quick)]
    # the shortest paths, once per graph (every kernel object caches them)
    t0 = time.perf_counter()
    from graphkern.spgk import shortest_path_graph
    for g in graphs:
        shortest_path_graph(g)
    rows.append(dict(header, method="shortest paths", backend="cpu", seconds=time.perf_counter() - t0,
                     estimated=False, graphs_timed=n))
    for method in ctx.progress(methods, desc=ds["name"]):
        kernel = _kernel_for(method, ds["kernel"], threads)
        try:
            timing, used = timer.measure(kernel)
        except Exception as exc:  # one method's failure is a row; the others still run
            rows.append(dict(header, method=method, error=failure_text(exc)))
            continue
        row = dict(header, method=method, backend=_backend(method), seconds=timing.median,
                   estimated=timing.estimated, graphs_timed=used)
        if method == "hybrid" and hasattr(kernel, "hybrid_split_"):
            split = kernel.hybrid_split_
            row.update({f"hybrid_{k}": v for k, v in split.items()})
            total = split["cpu_work"] + split["gpu_work"]
            row["note"] = (f"last call: {split['cpu_pairs']} pairs ({split['cpu_work'] / max(total, 1):.1%} of the "
                           f"work) on the CPU in {split['cpu_steps']} steps ({1e3 * split['cpu_seconds']:.2f} ms), "
                           f"{split['gpu_pairs']} on the GPU ({1e3 * split['gpu_seconds']:.2f} ms kernel)")
        rows.append(row)
    if ds["peer"] and not args.no_peers:
        peer, reason = _grakel_runner(ds["peer"], ds)
        name = f"GraKeL {ds['peer']}"
        if peer is None:
            rows.append(dict(header, method=name, skipped=reason))
        else:
            gram, work, rate = peer
            try:
                timing, used = _Budget(graphs, budget, 1, work=work).measure(gram, probe=1, rate=rate)
            except Exception as exc:  # a peer's failure is a row, not the end of the suite
                rows.append(dict(header, method=name, backend="peer", error=failure_text(exc)))
                _print_dataset(ds, rows)
                return rows
            rows.append(dict(header, method=name, backend="peer", seconds=timing.median,
                             estimated=timing.estimated, graphs_timed=used,
                             **({"note": "from its time per loop iteration on 8-vertex graphs"} if used == 0
                                else {})))
    _print_dataset(ds, rows)
    return rows


def _fresh(g):
    """A new Graph with copies of ``g``'s arrays: nothing cached on it, as a user's freshly read graph."""
    from graphkern import Graph

    return Graph(g.indptr.copy(), g.indices.copy(), None if g.weights is None else g.weights.copy(),
                 node_labels={k: np.array(v) for k, v in g.node_labels.items()},
                 edge_labels={k: np.array(v) for k, v in g.edge_labels.items()})


def _user_call(ds, header, repeat, quick):
    """``ShortestPathKernel(...)(graphs)`` with default options, as a user calls it: first calls, each a
    fresh object on fresh graphs (the median of five in a full run), and warm calls.  One more first call
    runs before them and is shown on its own: a process's first loads the GPU module and makes the
    staging buffers and thread pools that later calls reuse."""
    from graphkern.spgk import ShortestPathKernel

    def prepare():
        return [_fresh(g) for g in ds["graphs"]], ShortestPathKernel(**ds["kernel"])

    call = lambda g, k: k(g)  # noqa: E731
    before = first_calls(prepare, call, 1)[0][0]
    firsts, (graphs, kernel), _ = first_calls(prepare, call, 3 if quick else 5)
    first = float(np.median(firsts))
    warm = time_cpu(lambda: kernel(graphs), repeat=repeat, warmup=0, max_seconds=5)
    split = getattr(kernel, "hybrid_split_", None)
    kernel_s = split.get("gpu_seconds") if split and not split.get("cpu_pairs") else None
    note = f"one first call before these: {1e3 * before:.4g} ms"
    return dict(header, method="user call", backend=getattr(kernel, "backend_", "default"), seconds=warm.median,
                estimated=False, graphs_timed=len(graphs), repeats=len(warm.times), first_repeats=len(firsts),
                first_before_s=before,
                note=note + ("" if kernel_s else "; kernel time not exposed by ShortestPathKernel on this backend"),
                **user_call_figures(first, warm.median, kernel_s))


def _backend(method):
    return "cpu" if method in CPU_ROWS + DENSE_ROWS else ("hybrid" if method == "hybrid" else "gpu")


def _seconds(rows, dataset, method):
    for r in rows:
        if r.get("dataset") == dataset and r.get("method") == method and "seconds" in r:
            return r["seconds"], r.get("estimated", False)
    return None, False


def _fmt_time(seconds, estimated):
    if seconds is None:
        return "-"
    return ("est " if estimated else "") + f"{seconds * 1e3:.4g}"


def _print_dataset(ds, rows):
    table = []
    fcsp, _ = _seconds(rows, ds["name"], "fcsp")
    for r in rows:
        line = dict(method=r["method"], backend=r.get("backend", ""), graphs_timed=r.get("graphs_timed", ""),
                    note=r.get("note", ""))
        if "seconds" in r:
            line["time"] = _fmt_time(r["seconds"], r["estimated"])
            if fcsp and r["method"] not in ("shortest paths",):
                line["vs_fcsp"] = _ratio(fcsp, r["seconds"])
        else:
            line["note"] = r["error"] if "error" in r else "skipped: " + r.get("skipped", "")
        table.append(line)
    user = [in_ms(r, "first", "warm", "kernel") for r in rows if "first_s" in r]
    print_table(user, [("backend", "ShortestPathKernel(...)(graphs)")] + USER_CALL_COLUMNS + [("note", "note")],
                title=f"{ds['name']}: {rows[0]['graphs']} graphs, {rows[0]['pairs']} pairs — the user's call",
                legend=USER_CALL_LEGEND)
    print_table(table[1:], ["method", "backend", ("time", "time ms"), ("graphs_timed", "graphs timed"),
                            ("vs_fcsp", "x fcsp"), "note"],
                title=f"{ds['name']}: every method (shortest paths cached)",
                legend="est: timed on a subset of the graphs (or GraKeL's time per loop iteration) and scaled to "
                       "the set, never judged; x fcsp: sequential FCSP's time / this time")
    print(flush=True)


def _ratio(a, b):
    return f"{a / b:.3g}x" if a and b else "-"


def _print_tables(rows):
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    ratio = _ratio
    # FCSP over naive
    table = []
    for d in datasets:
        naive, e1 = _seconds(rows, d, "naive")
        fcsp, e2 = _seconds(rows, d, "fcsp")
        table.append(dict(dataset=d, naive=_fmt_time(naive, e1), fcsp=_fmt_time(fcsp, e2), ratio=ratio(naive, fcsp)))
    print_table(table, ["dataset", ("naive", "naive ms"), ("fcsp", "fcsp ms"), ("ratio", "naive / fcsp")],
                title="FCSP over naive (sequential, one thread)")
    print()
    # every parallel variant over sequential FCSP
    variants = [m for m in ("openmp_in", "openmp_out") + DENSE_ROWS + GPU_ROWS
                if any(r.get("method") == m and "seconds" in r for r in rows)]
    if variants:
        table = [dict(dataset=d, **{m: ratio(_seconds(rows, d, "fcsp")[0], _seconds(rows, d, m)[0])
                                    for m in variants}) for d in datasets]
        print_table(table, ["dataset"] + variants, title="speed-up of each parallel variant over sequential FCSP")
        print()
    # hybrid against the others on the mixed set
    if "mixed" in datasets:
        hybrid, _ = _seconds(rows, "mixed", "hybrid")
        table = []
        for r in rows:
            if r.get("dataset") == "mixed" and "seconds" in r and r["method"] not in ("shortest paths", "hybrid", "user call"):
                table.append(dict(method=r["method"], time=_fmt_time(r["seconds"], r["estimated"]),
                                  hybrid_speedup=ratio(r["seconds"], hybrid)))
        print_table(table, ["method", ("time", "time ms"), ("hybrid_speedup", "this / hybrid")],
                    title="hybrid against the others on the mixed set"
                          + ("" if hybrid else " (no hybrid row: needs a GPU)"))
        print()


def _best(rows, dataset, methods):
    found = [(s, m, e) for m in methods for s, e in [_seconds(rows, dataset, m)] if s is not None]
    return min(found) if found else (None, None, False)


def _targets(rows, ctx):
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    largest = max((d for d in datasets if d.startswith("complete-")), key=lambda d: int(d.split("-")[1]),
                  default=None)
    full = not ctx.quick
    out = []

    def judge(key, num, den, detail, estimated=False, repeats=3, size_ok=True):
        value = num / den if num and den else None
        out.append(TARGETS[key].judge(value, ctx, estimated=estimated, repeats=repeats, detail=detail,
                                      full_size=full and size_ok))

    if largest:
        size_ok = largest == "complete-50"
        naive, e_naive = _seconds(rows, largest, "naive")
        fcsp, e_fcsp = _seconds(rows, largest, "fcsp")
        judge("naive", naive, fcsp, largest, e_naive or e_fcsp, size_ok=size_ok)
        gpu, name, e_gpu = _best(rows, largest, GPU_ROWS[:-1])
        judge("gpu_fcsp", fcsp, gpu, f"{largest}: {name}" if gpu else "needs a GPU", e_fcsp or e_gpu, size_ok=size_ok)
        ours, ours_name, e_ours = _best(rows, largest, CPU_ROWS[1:] + DENSE_ROWS + GPU_ROWS)
        peer, e_peer = _seconds(rows, largest, "GraKeL ShortestPathAttr")
        judge("grakel", peer, ours, f"{largest}: {ours_name}", e_peer or e_ours, size_ok=size_ok)
    if "mixed" in datasets:
        hybrid, e_h = _seconds(rows, "mixed", "hybrid")
        other, other_name, e_o = _best(rows, "mixed", CPU_ROWS[1:] + DENSE_ROWS + GPU_ROWS[:-1])
        judge("hybrid", other, hybrid, f"next best: {other_name}" if hybrid else "needs a GPU", e_h or e_o)
    for r in rows:
        if r.get("method") == "user call" and r["dataset"] == "molecules-bonds":
            judge("first_warm", r["first_s"], r["warm_s"], "", repeats=r["first_repeats"],
                  size_ok=r["graphs"] >= 250)
    print_targets(out, title="targets (set for one H100-class GPU and 16 cores)")
    return out


def headline(rows):
    """graphkern's fastest method against GraKeL on the largest set where both ran."""
    best = None
    for d in dict.fromkeys(r["dataset"] for r in rows if "dataset" in r):
        peer, e_peer = _seconds(rows, d, "GraKeL ShortestPathAttr")
        if peer is None:
            peer, e_peer = _seconds(rows, d, "GraKeL ShortestPath")
        ours, name, e_ours = _best(rows, d, CPU_ROWS[1:] + DENSE_ROWS + GPU_ROWS)
        if peer and ours:
            pairs = next(r["pairs"] for r in rows if r.get("dataset") == d)
            cand = {"kind": "headline", "what": f"spgk {name}, {d}", "ratio": peer / ours, "peer": "GraKeL",
                    "estimated": e_peer or e_ours, "pairs": pairs}
            if best is None or (not cand["estimated"], pairs) >= (not best["estimated"], best["pairs"]):
                best = cand
    return [best] if best else []


def points(rows):
    """Time against the work of the whole Gram matrix (Σ over pairs of the path-array products)."""
    out = []
    for r in rows:
        if r.get("seconds") and r.get("method") not in ("shortest paths",) and r.get("work"):
            series = {"peer": r["method"]}.get(r.get("backend"), f"graphkern {r.get('backend')} {r['method']}")
            if r["method"] == "user call":
                series = "graphkern user call"
            out.append({"kind": "point", "series": series, "size": r["work"], "seconds": r["seconds"],
                        "estimated": r.get("estimated", False), "size_label": "pair work", "graph": r["dataset"]})
    return out
