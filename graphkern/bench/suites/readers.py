"""The file readers against the libraries users read the same files with.

* Matrix Market: a weighted Chung-Lu graph written as a symmetric coordinate file (its lower
  triangle, one entry per line, 17 significant digits), read by ``read_matrix_market`` (a Graph:
  every line checked, then parsed by SciPy's fast_matrix_market, made a symmetric CSR) beside
  ``scipy.io.mmread`` alone and followed by ``.tocsr()``; the two CSR matrices must be equal.
* SD files: the packaged 1000 NCI molecules repeated, read by ``read_sdf`` beside RDKit's
  ``SDMolSupplier`` without sanitization (when RDKit is installed); the atom counts must agree.
* Edge lists: the same Chung-Lu graph's edges, each once as ``u<TAB>v`` (no comment lines, which
  igraph's reader refuses), read by ``read_edgelist`` (a Graph) beside ``networkx.read_edgelist``,
  ``igraph.Graph.Read_Edgelist`` (when installed) and ``numpy.loadtxt`` followed by the symmetric
  SciPy CSR; the edge counts and the CSR must agree.

Targets (16 cores): ``read_sdf`` at 50,000 molecules/s or more on 20,000 molecules;
``read_matrix_market`` within 1.25x the time of ``scipy.io.mmread(path).tocsr()`` (the library's
parse and SciPy's conversion, what a user does to hold the same CSR) on 3.5 million entry lines.
"""

from __future__ import annotations

import gzip
import os
import tempfile

import numpy as np

from graphkern.bench.report import Target, check_answer, guarded, print_table, print_targets
from graphkern.bench.timing import time_cpu

NAME = "readers"
HELP = ("read_matrix_market, read_sdf and read_edgelist against scipy.io.mmread, RDKit's SDMolSupplier and the "
        "networkx, igraph and NumPy edge-list readers")

SDF_TARGET = Target("read_sdf ≥ 50,000 molecules/s", ">=", 50_000, unit=" molecules/s", gpu=None,
                    sizes="20,000 molecules")
MTX_TARGET = Target("read_matrix_market ≤ 1.25x the time of scipy.io.mmread(...).tocsr()", "<=", 1.25,
                    gpu=None, sizes="3.5 million entry lines")


def add_arguments(parser):
    parser.add_argument("--entries", type=int, default=None,
                        help="entry lines of the Matrix Market file (default 3.5 million; --quick 200,000)")
    parser.add_argument("--molecules", type=int, default=None,
                        help="molecules of the SD file (default 20,000; --quick 2,000)")


def run(args, ctx):
    entries = args.entries or (200_000 if ctx.quick else 3_500_000)
    molecules = args.molecules or (2_000 if ctx.quick else 20_000)
    repeat = ctx.repeat or (1 if ctx.quick else 3)
    rows, targets = [], []
    with tempfile.TemporaryDirectory(prefix="graphkern-bench-readers-") as tmp:
        mtx = _matrix_market_rows(os.path.join(tmp, "graph.mtx"), entries, repeat)
        sdf = _sdf_rows(os.path.join(tmp, "molecules.sdf"), molecules, repeat)
        edges = _edgelist_rows(os.path.join(tmp, "graph.txt"), entries, repeat)
    rows += mtx + sdf + edges
    for r in rows:
        if r.get("seconds"):
            r["rate"] = r["items"] / r["seconds"]
    print_table(rows, [("file", "file"), ("reader", "reader"), ("items", "items", "{:,}"),
                       ("megabytes", "MB", "{:.1f}"), ("seconds", "time s", "{:.3f}"), "repeats",
                       ("rate", "items/s", "{:,.0f}"), ("vs", "x graphkern time", "{:.2f}"), ("note", "note")],
                title=f"file readers, median of {repeat} read(s) each",
                legend="items: entry lines of the Matrix Market file, molecules of the SD file, lines of the edge "
                       "list; x graphkern time: "
                       "the reader's time over graphkern's (above 1: graphkern is faster)")
    ours = {r["file"]: r for r in rows if r["reader"].startswith("graphkern")}
    peer = next((r for r in mtx if r["reader"] == "scipy.io.mmread + tocsr" and r.get("seconds")), None)
    if "matrix market" in ours and peer:
        targets.append(MTX_TARGET.judge(ours["matrix market"]["seconds"] / peer["seconds"], ctx, repeats=repeat,
                                        full_size=entries >= 3_500_000))
    if "sd file" in ours:
        targets.append(SDF_TARGET.judge(ours["sd file"]["rate"], ctx, repeats=repeat,
                                        full_size=molecules >= 20_000))
    print_targets(targets)
    head = [{"kind": "headline", "what": f"read_matrix_market, {entries:,} lines", "ratio": r["vs"],
             "peer": r["reader"]} for r in mtx if r.get("vs") and r["reader"] == "scipy.io.mmread + tocsr"]
    return rows + targets + head


def _matrix_market_rows(path, entries, repeat):
    import scipy.io
    import scipy.sparse as sp

    from graphkern.generators import chung_lu
    from graphkern.io import read_matrix_market

    n = max(16, entries // 7)  # Chung-Lu at mean degree 14: about 7 lower-triangle entries per vertex
    lower = sp.tril(chung_lu(n, 2.3, 14, seed=3, as_csr=True)).tocoo()
    lower.data = np.random.default_rng(3).random(lower.nnz) + 0.5
    scipy.io.mmwrite(path, lower, symmetry="symmetric", precision=17)
    size = os.path.getsize(path) / 1e6
    got = []
    ours = time_cpu(lambda: got.append(read_matrix_market(path, as_csr=True)), repeat=repeat, warmup=0)
    base = {"file": "matrix market", "items": lower.nnz, "megabytes": size}
    rows = [dict(base, reader="graphkern read_matrix_market", seconds=ours.median, repeats=len(ours.times))]
    mine = got[-1]
    got.clear()
    for name, read in (("scipy.io.mmread", lambda: scipy.io.mmread(path)),
                       ("scipy.io.mmread + tocsr", lambda: scipy.io.mmread(path).tocsr())):
        rows.append(guarded(dict(base, reader=name), _peer, read, repeat, ours.median))
    want = scipy.io.mmread(path).tocsr()
    want.sort_indices()
    same = (mine.shape == want.shape and np.array_equal(mine.indptr, want.indptr)
            and np.array_equal(mine.indices, want.indices) and np.array_equal(mine.data, want.data))
    check_answer("read_matrix_market against scipy.io.mmread", 0.0 if same else 1.0, 0.0)
    return rows


def _edgelist_rows(path, entries, repeat):
    import scipy.sparse as sp

    from graphkern.generators import chung_lu
    from graphkern.io import read_edgelist

    n = max(16, entries // 7)
    upper = sp.triu(chung_lu(n, 2.3, 14, seed=3, as_csr=True), k=1).tocoo()
    np.savetxt(path, np.stack([upper.row, upper.col], axis=1), fmt="%d", delimiter="\t")
    base = {"file": "edge list", "items": upper.nnz, "megabytes": os.path.getsize(path) / 1e6}
    got = []
    ours = time_cpu(lambda: got.append(read_edgelist(path)), repeat=repeat, warmup=0)
    mine = got[-1].to_scipy()
    got.clear()
    rows = [dict(base, reader="graphkern read_edgelist", seconds=ours.median, repeats=len(ours.times))]

    def numpy_scipy():
        e = np.loadtxt(path, dtype=np.int64, ndmin=2)
        r, c = np.concatenate([e[:, 0], e[:, 1]]), np.concatenate([e[:, 1], e[:, 0]])
        return sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(int(e.max()) + 1,) * 2)

    def networkx_read():
        import networkx as nx
        return nx.read_edgelist(path, nodetype=int).number_of_edges()

    def igraph_read():
        import igraph
        return igraph.Graph.Read_Edgelist(path, directed=False).ecount()

    for name, read in (("numpy.loadtxt + scipy CSR", numpy_scipy), ("networkx.read_edgelist", networkx_read),
                       ("igraph Read_Edgelist", igraph_read)):
        rows.append(guarded(dict(base, reader=name), _edge_peer, read, repeat, ours.median, upper.nnz, mine))
    return rows


def _edge_peer(read, repeat, ours, edges, mine):
    """A peer's reading, timed; its edge count (or CSR) checked against graphkern's."""
    try:
        got = []
        timing = time_cpu(lambda: got.append(read()), repeat=repeat, warmup=0)
    except ImportError as err:
        return {"note": f"{err.name} is not installed"}
    answer = got[-1]
    if isinstance(answer, int):
        note = "the same edges" if answer == edges else f"{answer:,} edges against {edges:,}"
    else:
        answer.sort_indices()
        same = np.array_equal(answer.indptr, mine.indptr) and np.array_equal(answer.indices, mine.indices)
        note = "the same CSR" if same else "a different CSR"
    return {"seconds": timing.median, "repeats": len(timing.times), "vs": timing.median / ours, "note": note}


def _sdf_rows(path, molecules, repeat):
    from graphkern.bench.data import molecules_path
    from graphkern.io import read_sdf

    with gzip.open(molecules_path(), "rb") as f:
        text = f.read()
    records = text.count(b"$$$$")
    with open(path, "wb") as f:
        for _ in range(-(-molecules // records)):
            f.write(text)
    total = -(-molecules // records) * records
    size = os.path.getsize(path) / 1e6
    got = []
    ours = time_cpu(lambda: got.append(read_sdf(path)), repeat=repeat, warmup=0)
    base = {"file": "sd file", "items": total, "megabytes": size}
    rows = [dict(base, reader="graphkern read_sdf", seconds=ours.median, repeats=len(ours.times))]
    atoms = sum(g.n_nodes for g in got[-1])
    got.clear()
    rows.append(guarded(dict(base, reader="RDKit SDMolSupplier (no sanitization)"), _rdkit, path, repeat,
                        ours.median, atoms))
    return rows


def _peer(read, repeat, ours):
    timing = time_cpu(read, repeat=repeat, warmup=0)
    return {"seconds": timing.median, "repeats": len(timing.times), "vs": timing.median / ours}


def _rdkit(path, repeat, ours, atoms):
    try:
        from rdkit import Chem, RDLogger
    except ImportError:
        return {"note": "RDKit is not installed"}
    RDLogger.DisableLog("rdApp.*")
    counted = []
    timing = time_cpu(lambda: counted.append(sum(m.GetNumAtoms() for m in Chem.SDMolSupplier(
        path, sanitize=False, removeHs=False) if m is not None)), repeat=repeat, warmup=0)
    same = "the same atoms" if counted[-1] == atoms else f"{counted[-1]:,} atoms against graphkern's {atoms:,}"
    return {"seconds": timing.median, "repeats": len(timing.times), "vs": timing.median / ours, "note": same}
