"""The shortest-path kernel's scaling table: 100 to 100,000 molecules, the feature map against GraKeL.

The molecules are the packaged 1000 NCI molecules (hydrogens dropped), repeated: copy 0 is the set
itself; in every further copy each atom, with probability 0.1, takes the element of a random atom
of the same molecule (seeded), so copies differ while the elements and bonds stay those of real
molecules.  Kernel: ``DiracNode("element")`` with ``DiracEdge`` (bond counts), which GraKeL's
``ShortestPath(with_labels=True)`` computes too.

Every time is a first call: a fresh kernel object, graphs on the host, the Gram matrix in host
memory (the GPU streams it there in row tiles), started on an idle process (the worker threads of
the side before asleep, :func:`graphkern.bench.timing.first_calls`).  GraKeL runs in this process
(one core) where its time, predicted from the size before (N^2 growth), fits ``--scaling-budget``;
graphkern's CPU and GPU likewise.  Gram matrices are compared exactly: whole where two fit in memory,
else on 256 random rows recomputed on the CPU.
"""

from __future__ import annotations

import numpy as np

from graphkern.bench.cli import print_table
from graphkern.bench.report import Target, print_targets
from graphkern.bench.timing import first_calls

_SAMPLE_ROWS = 256
_SEED = 20


def augmented_molecules(base, n, seed=_SEED):
    """``n`` molecules: ``base`` repeated, each copy after the first with 10% of the atoms relabelled
    by the element of another atom of the same molecule."""
    from graphkern import Graph

    rng = np.random.default_rng(seed)
    out = []
    for copy in range(-(-n // len(base))):
        for g in base[:n - len(out)]:
            element = g.node_labels["element"]
            if copy:
                element = element.copy()
                pick = np.flatnonzero(rng.random(len(element)) < 0.1)
                element[pick] = element[rng.integers(0, len(element), len(pick))]
            out.append(Graph(g.indptr, g.indices, g.weights, node_labels={"element": element}, validate=False))
    return out


def _kernel(make):
    from graphkern.spgk import DiracNode

    kernel = make()
    kernel.set_params(node_kernel=DiracNode("element"))
    return kernel


def _predicted(history, n):
    """Seconds at ``n`` molecules from the largest smaller size measured (N^2 growth), or 0."""
    done = [(m, s) for m, s in history if m < n]
    if not done:
        return 0.0
    m, s = max(done)
    return s * (n / m) ** 2


def _same(K, reference, graphs, rows):
    if reference is None:
        return None
    if rows is None:
        return bool(np.array_equal(K, reference))
    return bool(np.array_equal(K[rows], reference))


def scaling_table(args, ctx, grakel_runner):
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf
    from graphkern.spgk import DiracNode, ShortestPathKernel

    sizes = args.scaling or ([100, 1000] if ctx.quick else [100, 1000, 10_000, 100_000])
    budget = args.scaling_budget
    threads = ctx.system.get("threads") or 1
    base = read_sdf(molecules_path(), hydrogens=False)
    peer = None if args.no_peers else grakel_runner("ShortestPath", {})
    gram_peer = peer[0][0] if peer and peer[0] else None
    sides = {"graphkern CPU": lambda: ShortestPathKernel(backend="cpu", n_threads=threads)}
    if ctx.gpu:
        sides["graphkern GPU"] = lambda: ShortestPathKernel(backend="gpu")
    for make in sides.values():  # once per process: libraries loaded, the device's context, modules and
        make().set_params(node_kernel=DiracNode("element"))(base)  # page-locked download ring
    if gram_peer is not None:
        sides["GraKeL ShortestPath"] = None
    history = {name: [] for name in sides}
    rows = []
    ram = _ram_bytes()
    for n in sizes:
        graphs = augmented_molecules(base, n)
        whole = 2 * 8 * n * n < 0.6 * ram  # two Gram matrices fit in memory
        sample = None if whole else np.sort(np.random.default_rng(n).choice(n, min(n, _SAMPLE_ROWS), replace=False))
        reference = None
        if gram_peer is not None and _predicted(history["GraKeL ShortestPath"], n) <= budget:
            gram_peer(graphs)  # its input format, built outside the timed run
        for name, make in sides.items():
            row = dict(kind="scaling", molecules=n, method=name)
            predicted = _predicted(history[name], n)
            if predicted > budget:
                rows.append(dict(row, skipped=f"predicted {predicted:.0f} s > budget {budget:.0f} s"))
                continue
            # a first call on an idle process: a fresh kernel (GraKeL's input converted before)
            if make is None:
                (seconds,), _, K = first_calls(lambda: (), lambda: np.asarray(gram_peer(graphs), dtype=np.float64), 1)
            else:
                (seconds,), _, K = first_calls(lambda: (_kernel(make),), lambda kernel: kernel(graphs), 1)
            history[name].append((n, seconds))
            if reference is None:
                reference = K if whole else ShortestPathKernel(node_kernel=DiracNode("element"), backend="cpu",
                                                               n_threads=threads)([graphs[i] for i in sample], graphs)
                same = None
            else:
                same = _same(K, reference, graphs, sample)
            rows.append(dict(row, seconds=seconds, equal=same))
            del K
        del reference
    _print(rows, sizes)
    return rows + _verdicts(rows, ctx)


def _ram_bytes():
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def _get(rows, n, method):
    for r in rows:
        if r.get("molecules") == n and r.get("method") == method and "seconds" in r:
            return r["seconds"]
    return None


def _print(rows, sizes):
    methods = list(dict.fromkeys(r["method"] for r in rows))
    table = []
    for n in sizes:
        line = dict(molecules=f"{n:,}")
        peer = _get(rows, n, "GraKeL ShortestPath")
        for r in rows:
            if r["molecules"] != n:
                continue
            if "seconds" in r:
                cell = f"{r['seconds']:.3f}"
                if peer and r["method"] != "GraKeL ShortestPath":
                    cell += f" ({peer / r['seconds']:.1f}x)"
                if r.get("equal") is not None:
                    cell += " =" if r["equal"] else " DIFFERENT"
            else:
                cell = "skipped: " + r["skipped"]
            line[r["method"]] = cell
        table.append(line)
    print_table(table, ["molecules"] + methods,
                title="scaling: DiracNode('element') x DiracEdge, first calls, seconds (x GraKeL; = same Gram "
                      "matrix as the first column measured)")
    print(flush=True)


TARGETS = {
    "gpu": Target("GPU ≥ 100x GraKeL ShortestPath at 10,000 molecules, identical Gram matrix", ">=", 100,
                  sizes="10,000 molecules", quick_ok=True),
    "cpu": Target("CPU (16 threads) ≥ 10x GraKeL ShortestPath at 10,000 molecules", ">=", 10, gpu=None,
                  sizes="10,000 molecules", quick_ok=True),
    "every": Target("CPU faster than GraKeL ShortestPath at every size", ">", 1, gpu=None,
                    sizes="every size measured", quick_ok=True),
    "big": Target("100,000 molecules on one GPU, Gram matrix streamed in tiles", "<", 60, unit=" s",
                  sizes="100,000 molecules", quick_ok=True),
}


def _verdicts(rows, ctx):
    """The scaling targets, judged by the shared helper (only on the hardware and sizes they were set for)."""
    out = []
    peer = _get(rows, 10_000, "GraKeL ShortestPath")
    gpu = _get(rows, 10_000, "graphkern GPU")
    cpu = _get(rows, 10_000, "graphkern CPU")
    equal = all(r.get("equal") is not False for r in rows)
    gpu_ratio = peer / gpu if peer and gpu and equal else None
    out.append(TARGETS["gpu"].judge(gpu_ratio, ctx, detail="" if equal else "Gram matrices differ"))
    out.append(TARGETS["cpu"].judge(peer / cpu if peer and cpu else None, ctx))
    sizes = sorted({r["molecules"] for r in rows if _get(rows, r["molecules"], "GraKeL ShortestPath")})
    ratios = [_get(rows, n, "GraKeL ShortestPath") / _get(rows, n, "graphkern CPU") for n in sizes
              if _get(rows, n, "graphkern CPU")]
    out.append(TARGETS["every"].judge(min(ratios) if ratios else None, ctx, detail=f"sizes {sizes}"))
    out.append(TARGETS["big"].judge(_get(rows, 100_000, "graphkern GPU"), ctx))
    print_targets(out, title="scaling targets (set for one H100-class GPU and 16 cores)")
    return out
