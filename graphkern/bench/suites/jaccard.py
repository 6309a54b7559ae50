"""Jaccard weights on every stored edge: graphkern's CPU kernel and GPU variants against peers.

Graphs (fixed seeds, graphkern.generators): Watts-Strogatz n=100k, k=10 ('smallworld', ~1M
entries); Barabasi-Albert n=100k, m=5; Chung-Lu gamma=2.3, average degree 16, degrees uncapped,
at n = 20k, 200k and 2M (~31M entries, max degree ~180k: the work grows ~1000x); R-MAT scale 20,
edge factor 16; Delaunay with 2^20 points.  ``--quick`` uses the same models at n=20000 (R-MAT
scale 14) and few repeats.

Graphkern is timed as a user calls it (``graphkern.jaccard(A, backend=...)`` on a fresh copy of
the SciPy matrix: first call and warm call, host clock) and as the kernel alone (the CPU kernel
on validated arrays; on the GPU every variant between device events, no copies).

Peers, each on the same graph and checked against graphkern's float64 CPU result (max abs
difference): SciPy (B·B by SpGEMM, B the symmetric pattern without self-loops, read at the
stored entries); igraph ``similarity_jaccard(pairs=edges)``; NetworkX ``jaccard_coefficient`` on
graphs of at most 2.5M entries (250k with --quick); on the GPU, CuPy (cuSPARSE SpGEMM, the same
masking).  A peer that is not installed, or whose product B·B would be too large, is listed as
skipped with the reason; one that fails is listed with its error.

Cost floor on an H100 (3.0 TB/s, 50 MB L2): one pass over the CSR and the output, about
(8 n + 8 nnz) bytes, is 3 us for Watts-Strogatz and 0.1 ms for the Chung-Lu graph.  The search
work is Σ over stored (i, j) of min(d_i, d_j) ("work" in the tables): 9.6e6 for Watts-Strogatz,
2.2e9 for Chung-Lu 2M.  If every lookup cost one 32-byte L2 sector (~7 TB/s) the Chung-Lu
searches would take about 5 ms; only L1 hits go below that.  Measured figures and their history
are in bench/results/ and docs/performance.md.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import scipy.sparse as sp

import graphkern
from graphkern.bench.report import (USER_CALL_COLUMNS, USER_CALL_LEGEND, Target, check_answer, failure_text, isolated,
                                    in_ms, print_table, print_targets, say, user_call_figures)
from graphkern.bench.timing import Timing, first_calls, time_cpu, time_gpu
from graphkern.similarity import VARIANTS
from graphkern.similarity.api import symmetric_pattern
from graphkern.similarity.cpu import cpu_values
from graphkern.similarity.gpu import DeviceSimilarity
from graphkern.similarity.plan import auto_variant

NAME = "jaccard"
HELP = "Jaccard edge weights: CPU and every GPU variant against SciPy, igraph, NetworkX and CuPy"

# model -> (generator name, keyword arguments at full size, at --quick size), fixed seeds
GRAPHS = {
    "smallworld": ("watts_strogatz", dict(n=100_000, k=10, p=0.1, seed=11), dict(n=20_000, k=10, p=0.1, seed=11)),
    "preferentialAttachment": ("barabasi_albert", dict(n=100_000, m=5, seed=12), dict(n=20_000, m=5, seed=12)),
    "chung_lu_20k": ("chung_lu", dict(n=20_000, gamma=2.3, avg_degree=16, max_degree=19_999, seed=13), None),
    "chung_lu_200k": ("chung_lu", dict(n=200_000, gamma=2.3, avg_degree=16, max_degree=199_999, seed=13), None),
    "chung_lu": ("chung_lu", dict(n=2_000_000, gamma=2.3, avg_degree=16, max_degree=1_999_999, seed=13),
                 dict(n=20_000, gamma=2.3, avg_degree=16, max_degree=19_999, seed=13)),
    "rmat": ("rmat", dict(scale=20, edge_factor=16, seed=14), dict(scale=14, edge_factor=16, seed=14)),
    "delaunay": ("delaunay", dict(n=2**20, seed=15), dict(n=20_000, seed=15)),
}
GPU_VARIANTS = [v for v in VARIANTS]  # "auto" first, then every named kernel
PEERS = ("scipy", "igraph", "networkx", "cupy")
# float32 results against the float64 CPU reference: a ratio in [0, 1] rounds by ~1e-7; more is wrong
FLOAT32_TOLERANCE = 1e-4
CPU_PEERS = ("scipy", "igraph", "networkx")
SIZES = "Watts-Strogatz / Barabasi-Albert n=100k, Chung-Lu n=2M, R-MAT scale 20"
TARGETS = {
    "element": Target("best GPU variant ≥ 2x the element-parallel kernel (one thread per entry) "
                      "on small-world and preferential-attachment graphs of 100,000 vertices", ">=", 2, sizes=SIZES),
    "element_cl": Target("best GPU variant ≥ 100x the element-parallel kernel on Chung-Lu n=2M", ">=", 100,
                         sizes=SIZES),
    "work": Target("GPU time per unit of work on Chung-Lu n=2M ≤ 3x that on the small-world graph", "<=", 3,
                   sizes=SIZES),
    "cpu_peer": Target("best GPU variant ≥ 100x the best CPU peer on graphs of ~1M entries", ">=", 100, sizes=SIZES),
    "first_call": Target("first call ≤ 3x the kernel on heavy-tailed graphs of ≥ 5M entries", "<=", 3,
                         sizes=SIZES),
    "gpu_vs_cpu": Target("GPU first call ≥ 10x the graphkern CPU first call on heavy-tailed graphs of ≥ 5M "
                         "entries", ">=", 10, sizes=SIZES),
}


def add_arguments(parser):
    parser.add_argument("--graphs", nargs="+", choices=sorted(GRAPHS), metavar="GRAPH",
                        help=f"only these graphs ({', '.join(GRAPHS)})")
    parser.add_argument("--variants", nargs="+", choices=GPU_VARIANTS, metavar="VARIANT",
                        help=f"only these GPU variants ({', '.join(GPU_VARIANTS)}; --quick: auto and element)")
    parser.add_argument("--no-peers", action="store_true", help="time graphkern only")
    parser.add_argument("--max-spgemm", type=float, default=None,
                        help="skip SpGEMM peers when Σ_k d_k^2 (their multiply-adds) exceeds this "
                             "(default 3e9, 5e7 with --quick)")


# --------------------------------------------------------------------------- graphs


def build_graph(name, quick):
    """(csr_matrix, description) of one benchmark graph, or (None, reason) if its generator is missing."""
    try:
        from graphkern import generators
    except ImportError as exc:
        return None, f"graphkern.generators has not landed yet ({exc})"
    gen_name, full, small = GRAPHS[name]
    gen = getattr(generators, gen_name, None)
    if gen is None:
        return None, f"graphkern.generators.{gen_name} has not landed yet"
    if quick and small is None:
        return None, "full runs only"
    kwargs = small if quick else full
    A = gen(**kwargs, as_csr=True)
    desc = f"{gen_name}(" + ", ".join(f"{k}={v}" for k, v in kwargs.items() if k != "seed") + ")"
    return sp.csr_matrix(A), desc


def graph_stats(pattern):
    d = pattern.degrees
    rows = np.repeat(np.arange(pattern.n, dtype=np.int64), d)
    work = int(np.minimum(d[rows], d[pattern.indices]).sum())
    return {"n": pattern.n, "nnz": pattern.nnz, "max_degree": int(d.max()) if d.size else 0,
            "mean_degree": float(d.mean()) if d.size else 0.0, "work": work,
            "spgemm_flops": float(np.sum(d.astype(np.float64) ** 2))}


def max_abs_diff(values, reference):
    return float(np.max(np.abs(np.asarray(values, dtype=np.float64) - reference))) if reference.size else 0.0


# --------------------------------------------------------------------------- peers


def _offdiagonal_pattern(A):
    """B: the stored pattern of A without the diagonal, as float64 ones (self-loops ignored)."""
    B = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    B.setdiag(0)
    B.eliminate_zeros()
    return B


def scipy_jaccard(A):
    """Jaccard at the stored entries of A from B·B (SciPy SpGEMM), read back by key search."""
    n = A.shape[0]
    B = _offdiagonal_pattern(A)
    C = (B @ B).tocsr()
    C.sort_indices()
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(A.indptr))
    key_a = rows * n + A.indices
    key_c = np.repeat(np.arange(n, dtype=np.int64), np.diff(C.indptr)) * n + C.indices
    pos = np.minimum(np.searchsorted(key_c, key_a), max(len(key_c) - 1, 0))
    inter = np.where(key_c[pos] == key_a, C.data[pos], 0.0) if len(key_c) else np.zeros(len(key_a))
    d = np.diff(B.indptr).astype(np.float64)
    union = d[rows] + d[A.indices] - inter
    out = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    out[rows == A.indices] = 1.0
    return out


def upper_edges(A):
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    upper = rows < A.indices
    return np.stack([rows[upper], A.indices[upper].astype(np.int64)], axis=1), np.flatnonzero(upper)


def run_igraph(A, edges):
    import igraph
    g = igraph.Graph(n=A.shape[0], edges=edges.tolist())
    pairs = [tuple(e) for e in edges.tolist()]
    return lambda: g.similarity_jaccard(pairs=pairs, loops=False)


def run_networkx(A, edges):
    import networkx as nx
    G = nx.Graph()
    G.add_nodes_from(range(A.shape[0]))
    G.add_edges_from(edges.tolist())
    ebunch = [tuple(e) for e in edges.tolist()]
    return lambda: [p for _, _, p in nx.jaccard_coefficient(G, ebunch)]


def run_cupy(A):
    """A closure computing Jaccard at A's entries with cuSPARSE SpGEMM, and one to synchronize."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    n = A.shape[0]
    B = csp.csr_matrix(_offdiagonal_pattern(A).astype(np.float32))
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(A.indptr))
    key_a = cp.asarray(rows * n + A.indices)
    rows_d, cols_d = cp.asarray(rows), cp.asarray(A.indices.astype(np.int64))
    deg = cp.asarray(np.diff(B.indptr.get()).astype(np.float32))
    diagonal = rows_d == cols_d

    def compute():
        C = B @ B
        C.sum_duplicates()  # canonical: sorted indices
        c_rows = cp.searchsorted(C.indptr, cp.arange(C.nnz), side="right") - 1
        key_c = c_rows.astype(cp.int64) * n + C.indices
        pos = cp.minimum(cp.searchsorted(key_c, key_a), max(C.nnz - 1, 0))
        inter = cp.where(key_c[pos] == key_a, C.data[pos], 0)
        union = deg[rows_d] + deg[cols_d] - inter
        out = cp.where(union > 0, inter / cp.where(union > 0, union, 1), 0)
        return cp.where(diagonal, 1, out)

    return compute, cp.cuda.Device().synchronize


def _cupy_measure(indptr, indices, shape, repeat):
    """The CuPy peer timed in its own process: (seconds of each repeat, values at A's entries)."""
    A = sp.csr_matrix((np.ones(len(indices), np.float32), indices, indptr), shape=shape)
    compute, sync = run_cupy(A)
    out = []
    # host clock around compute + device synchronize (CuPy streams are not graphkern streams)
    timing = time_cpu(lambda: (out.append(compute()), sync()), repeat=repeat, warmup=1, max_seconds=30)
    return timing.times, out[-1].get()


def peer_rows(name, A, stats, reference, *, quick, repeat, gpu, max_spgemm, progress):
    """Time and check every peer on A; a skipped or failed peer gets a row with the reason."""
    rows = []
    edges, upper_pos = upper_edges(A)
    nx_limit = 250_000 if quick else 2_500_000
    # B·B may store up to Σ d^2 entries (index and value, and SciPy's temporaries: ~24 bytes each)
    memory_limit = _available_memory() / 2 / 24
    too_big = stats["spgemm_flops"] > min(max_spgemm, memory_limit)
    spgemm_reason = (f"B·B needs {stats['spgemm_flops']:.2e} multiply-adds (Σ d^2), over "
                     + (f"--max-spgemm {max_spgemm:.0e}" if max_spgemm <= memory_limit else
                        f"half the available memory ({_available_memory() / 2**30:.0f} GiB)"))

    def measure(peer):
        """(timing, values at the stored entries or at the upper ones, positions), or a skip reason."""
        if peer == "scipy" and too_big:
            return spgemm_reason
        if peer == "cupy" and stats["spgemm_flops"] > max_spgemm:
            return f"B·B needs {stats['spgemm_flops']:.2e} multiply-adds (Σ d^2), over --max-spgemm {max_spgemm:.0e}"
        if peer == "scipy":
            out = []
            timing = time_cpu(lambda: out.append(PEER_FUNCTIONS["scipy"](A)), repeat=repeat, warmup=0, max_seconds=30)
            return timing, out[-1], None
        if peer == "igraph":
            try:
                fn = PEER_FUNCTIONS["igraph"](A, edges)
            except ImportError:
                return "python-igraph is not installed"
            out = []
            timing = time_cpu(lambda: out.append(fn()), repeat=repeat, warmup=0, max_seconds=30)
            return timing, np.asarray(out[-1]), upper_pos
        if peer == "networkx":
            if A.nnz > nx_limit:
                return f"{A.nnz:,} entries is over this suite's NetworkX limit of {nx_limit:,}"
            try:
                fn = PEER_FUNCTIONS["networkx"](A, edges)
            except ImportError:
                return "networkx is not installed"
            out = []
            return time_cpu(lambda: out.append(fn()), repeat=1, warmup=0), np.asarray(out[-1]), upper_pos
        if not gpu:
            return "no GPU"
        if importlib.util.find_spec("cupy") is None:
            return "cupy is not installed"
        # cuSPARSE's SpGEMM has crashed its process on some graphs: it runs in a process of its own
        times, values = isolated(_cupy_measure, A.indptr, A.indices, A.shape, repeat)
        return Timing(times), values, None

    for peer in progress(PEERS, desc=f"{name}: peers"):
        row = {"graph": name, "impl": peer, "kind": "peer", "device": "gpu" if peer == "cupy" else "cpu"}
        try:
            got = measure(peer)
        except Exception as exc:  # a peer's failure is a row, not the end of the suite
            rows.append(dict(row, failed=failure_text(exc), note=failure_text(exc)))
            continue
        if isinstance(got, str):
            rows.append(dict(row, skipped=got, note="skipped: " + got))
            continue
        timing, values, positions = got
        rows.append(dict(row, time_s=timing.median, repeats=len(timing.times),
                         max_abs_diff=max_abs_diff(values, reference if positions is None else reference[positions])))
    return rows


def _available_memory():
    """Bytes of memory available to a new process (the SpGEMM peers' product must fit)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**40


PEER_FUNCTIONS = {"scipy": scipy_jaccard, "igraph": run_igraph, "networkx": run_networkx, "cupy": run_cupy}


# --------------------------------------------------------------------------- graphkern


def user_call_row(name, A, device, reference, repeat, kernel_s):
    """graphkern.jaccard as a user calls it: first calls, each on a fresh copy of the SciPy matrix, and warm calls."""
    firsts, (first_A,), out = first_calls(lambda: (A.copy(),), lambda B: graphkern.jaccard(B, backend=device),
                                          min(repeat, 3))
    first = float(np.median(firsts))
    warm = time_cpu(lambda: graphkern.jaccard(first_A, backend=device), repeat=repeat, warmup=0, max_seconds=10)
    error = max_abs_diff(out.data, reference)
    check_answer(f"jaccard {name} {device}", error, FLOAT32_TOLERANCE)
    return {"graph": name, "impl": f"graphkern.jaccard {device}", "kind": "graphkern", "device": device,
            "repeats": len(warm.times), "first_repeats": len(firsts), "max_abs_diff": error, "time_s": kernel_s,
            **user_call_figures(first, warm.median, kernel_s)}


def graphkern_rows(name, A, pattern, reference, *, repeat, gpu, variants, progress):
    out = []
    timing = time_cpu(lambda: out.append(cpu_values(pattern, 0, False, np.dtype(np.float32), _threads())),
                      repeat=repeat, warmup=1, max_seconds=30)
    check_answer(f"jaccard {name} cpu kernel", max_abs_diff(out[-1], reference), FLOAT32_TOLERANCE)
    rows = [user_call_row(name, A, "cpu", reference, repeat, timing.median)]
    if not gpu:
        return rows
    from graphkern._cuda import runtime as rt

    dev = rt.get_device(0)
    host_out = np.empty(pattern.nnz, dtype=np.float32)
    for variant in progress(variants, desc=f"{name}: GPU variants"):
        row = {"graph": name, "impl": f"gpu {variant}", "kind": "graphkern", "device": "gpu", "requested": variant}
        try:
            run = DeviceSimilarity(dev, pattern, metric=0, self_loops=False, dtype=np.float32, variant=variant)
        except ValueError as exc:  # a variant that does not apply to this graph (shortrow past 32)
            rows.append(dict(row, skipped=str(exc), note="does not apply: " + str(exc)))
            continue
        except Exception as exc:  # one variant's failure is a row; a wrong answer is what fails the run
            rows.append(dict(row, failed=failure_text(exc), note=failure_text(exc)))
            continue
        try:
            run.upload()
            kernel = time_gpu(run.compute, run.stream, repeat=repeat, warmup=2, max_seconds=10)
            with_copies = time_gpu(lambda: (run.upload(), run.compute(), run.out.copy_to_host(host_out, run.stream)),
                                   run.stream, repeat=repeat, warmup=1, max_seconds=10)
            run.stream.synchronize()
        except Exception as exc:  # one variant's failure is a row; a wrong answer is what fails the run
            rows.append(dict(row, failed=failure_text(exc), note=failure_text(exc)))
            continue
        error = max_abs_diff(host_out, reference)
        check_answer(f"jaccard {name} gpu {variant}", error, FLOAT32_TOLERANCE)
        if variant == "auto":
            row["impl"] += f" ({run.variant})"
        note = f"{run.hubs.size} bitmaps, {run.hubs.size * run.hub_words * 4 / 2**20:.0f} MiB" if run.hubs.size else ""
        rows.append(dict(row, variant=run.variant, time_s=kernel.median, with_copies_s=with_copies.median,
                         repeats=len(kernel.times), max_abs_diff=error, note=note))
        del run
    auto = next((r for r in rows if r.get("requested") == "auto" and "time_s" in r), None)
    rows.insert(1, user_call_row(name, A, "gpu", reference, repeat, auto["time_s"] if auto else None))
    return rows


def _threads():
    from graphkern._backend import resolve_threads
    return resolve_threads(None)


# --------------------------------------------------------------------------- report


TABLE_LEGEND = ("kernel: the compute alone (CPU: validated arrays; GPU: device events, no copies); +copies: with "
                "the CSR upload and result download; work: Σ over stored entries of min(d_i, d_j); diff: max abs "
                "difference from the float64 CPU result; peer ratio: best peer time / this kernel time")


def print_graph_table(name, desc, stats, rows):
    peers = [r for r in rows if r["kind"] == "peer" and "time_s" in r]
    best_peer = min(peers, key=lambda r: r["time_s"], default=None)
    shown = []
    for r in rows:
        s = in_ms(r, "time", "with_copies", "first", "warm", "kernel")
        if "time_s" in r and r["time_s"]:
            s["ns_per_work"] = r["time_s"] / stats["work"] * 1e9 if stats["work"] else None
            if best_peer is not None and r["kind"] == "graphkern":
                s["vs_peer"] = best_peer["time_s"] / r.get("warm_s", r["time_s"])
        shown.append(s)
    title = (f"{name}: {desc}: n={stats['n']:,}, nnz={stats['nnz']:,}, max degree {stats['max_degree']:,}, "
             f"work {stats['work']:.3g}" + (f"; best peer {best_peer['impl']}" if best_peer else ""))
    print_table([s for s in shown if "first_s" in s], [("impl", "graphkern call")] + USER_CALL_COLUMNS
                + [("vs_peer", "peer ratio (warm)", "{:.3g}x")], title=title + " — the user's call",
                legend=USER_CALL_LEGEND)
    print_table([s for s in shown if "first_s" not in s],
                [("impl", "implementation"), ("time_ms", "kernel ms", "{:.4g}"),
                 ("with_copies_ms", "+copies ms", "{:.4g}"), ("ns_per_work", "ns/work", "{:.3g}"),
                 ("max_abs_diff", "diff", "{:.1e}"), ("vs_peer", "peer ratio", "{:.3g}x"), ("note", "note")],
                title=f"{name}: kernels and peers", legend=TABLE_LEGEND)
    print(flush=True)


def _best_gpu(results, graph, variant="best"):
    rows = [r for r in results.get(graph, []) if r.get("kind") == "graphkern" and r.get("requested") and "time_s" in r]
    if variant != "best":
        rows = [r for r in rows if r["requested"] == variant]
    return min(rows, key=lambda r: r["time_s"], default=None)


def evaluate_targets(results, ctx):
    """Every target of this suite, judged by the shared verdict helper."""
    out = []
    judge = lambda key, value, repeats, detail: out.append(TARGETS[key].judge(value, ctx, repeats=repeats,
                                                                            detail=detail))
    for graph in ("smallworld", "preferentialAttachment", "chung_lu"):
        best, element = _best_gpu(results, graph), _best_gpu(results, graph, "element")
        if best and element:
            judge("element_cl" if graph == "chung_lu" else "element", element["time_s"] / best["time_s"],
                  min(best["repeats"], element["repeats"]), f"{graph}: {best['variant']}")
    cl, sw = _best_gpu(results, "chung_lu"), _best_gpu(results, "smallworld")
    if cl and sw:
        per = lambda r, g: r["time_s"] / results[g][0]["work"]
        judge("work", per(cl, "chung_lu") / per(sw, "smallworld"), min(cl["repeats"], sw["repeats"]), "")
    for graph, rows in results.items():
        nnz = rows[0].get("nnz", 0) if rows else 0
        best = _best_gpu(results, graph)
        cpu_peers = [r for r in rows if r["kind"] == "peer" and r["impl"] in CPU_PEERS and "time_s" in r]
        peer = min(cpu_peers, key=lambda r: r["time_s"], default=None)
        if 0.99e6 <= nnz < 2e6 and best and peer:
            judge("cpu_peer", peer["time_s"] / best["time_s"], min(best["repeats"], peer["repeats"]),
                  f"{graph}: vs {peer['impl']}")
        calls = {r["device"]: r for r in rows if "first_s" in r}
        if nnz >= 5e6 and graph in ("chung_lu", "rmat") and "gpu" in calls and calls["gpu"].get("kernel_s"):
            first_n = calls["gpu"]["first_repeats"]
            judge("first_call", calls["gpu"]["first_s"] / calls["gpu"]["kernel_s"], first_n, f"{graph}")
            if "cpu" in calls:
                judge("gpu_vs_cpu", calls["cpu"]["first_s"] / calls["gpu"]["first_s"],
                      min(first_n, calls["cpu"]["first_repeats"]), f"{graph}")
    if not ctx.gpu:
        out.append(TARGETS["element"].judge(None, ctx, detail="needs a GPU"))
    return out


def headline(results):
    """graphkern's user call (GPU where present) against the best peer on the largest graph with a peer."""
    best = None
    for graph, rows in results.items():
        peers = [r for r in rows if r["kind"] == "peer" and "time_s" in r]
        calls = [r for r in rows if "first_s" in r]
        if peers and calls:
            peer = min(peers, key=lambda r: r["time_s"])
            ours = calls[-1]
            cand = {"kind": "headline", "what": f"jaccard {ours['device']} warm call, {graph}",
                    "ratio": peer["time_s"] / ours["warm_s"], "peer": peer["impl"], "nnz": rows[0]["nnz"]}
            if best is None or cand["nnz"] >= best["nnz"]:
                best = cand
    return [best] if best else []


def points(results):
    """(size, seconds) per implementation for the figures: the work of each graph against time."""
    out = []
    for graph, rows in results.items():
        for r in rows:
            t = r.get("warm_s") if "first_s" in r else r.get("time_s")
            if t and (r["kind"] == "peer" or "first_s" in r):
                series = f"graphkern {r['device']}" if r["kind"] == "graphkern" else r["impl"]
                out.append({"kind": "point", "series": series, "size": r["work"], "seconds": t, "graph": graph,
                            "size_label": "work Σ min(d_i, d_j)"})
            if "first_s" in r and r.get("kernel_s"):
                moved = 8 * (r["n"] + 2 * r["nnz"])  # indptr, indices read, output written
                out.append({"kind": "bandwidth", "series": f"graphkern {r['device']} kernel", "size": r["nnz"],
                            "bytes_per_s": moved / r["kernel_s"], "graph": graph, "device": r["device"]})
    return out


def run(args, ctx):
    quick = ctx.quick
    repeat = ctx.repeat or (2 if quick else 10)
    max_spgemm = args.max_spgemm or (5e7 if quick else 3e9)
    variants = args.variants or (("auto", "element") if quick else GPU_VARIANTS)
    chosen = args.graphs or [g for g in GRAPHS if GRAPHS[g][2] is not None or not quick]
    all_rows, results = [], {}
    for name in chosen:
        t0 = time.perf_counter()
        A, desc = build_graph(name, quick)
        if A is None:
            say(f"{name}: skipped: {desc}")
            continue
        pattern = symmetric_pattern(A)
        stats = graph_stats(pattern)
        built = time.perf_counter() - t0
        reference = cpu_values(pattern, 0, False, np.dtype(np.float64), _threads())
        rows = graphkern_rows(name, A, pattern, reference, repeat=repeat, gpu=ctx.gpu, variants=variants,
                              progress=ctx.progress)
        if not args.no_peers:
            rows += peer_rows(name, A, stats, reference, quick=quick, repeat=max(1, min(repeat, 3)), gpu=ctx.gpu,
                              max_spgemm=max_spgemm, progress=ctx.progress)
        auto = auto_variant(pattern)
        for r in rows:
            r.update({k: stats[k] for k in ("n", "nnz", "work", "max_degree")}, auto_variant=auto)
        print_graph_table(name, desc + f" (built in {built:.1f} s; auto variant {auto})", stats, rows)
        results[name] = rows
        all_rows += rows
    targets = evaluate_targets(results, ctx)
    print_targets(targets, title="targets (set for one H100-class GPU and 16 cores)")
    return all_rows + targets + headline(results) + points(results)
