"""Property-based fuzzing of every public entry point, each batch in a child process.

Hypothesis draws the cases (graphs, matrices, labels, parameters, damaged files) in this
process; ``fuzz_worker.py`` runs them in a child, so a segfault or a hang fails the test with
the case that caused it instead of killing pytest.  Each case must give a result that agrees
with an independent reference (dense SciPy/NumPy, set arithmetic, the dense MGK solve,
invariants such as symmetry and renumbering) or a clear error.  ``--fuzz-examples`` sets the
cases per family (CI: the default; the GPU machine: more).

A region where a bug is known is left out of the random draws and pinned instead by a
reproducer in ``OPEN`` below (``xfail(strict=True)``), which flips when the owner fixes it;
a fixed one stays a regression test and its region goes back into the draws.
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import graphkern

from conftest import sanitized

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(graphkern.__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
# seconds the case in flight (or the child's start before its first case) may run before it counts
# as a hang; the limit is per case, so a batch slowed as a whole (a sanitizer, a loaded machine)
# is not mistaken for a hang
CASE_TIMEOUT = 150
SPECIAL = [0.0, 1.0, 2.0, 0.5, -1.0, np.nan, np.inf, 1e300, 1e-300, 3.0]
THREADS = st.sampled_from([None, 1, 2, 3, 100_000, 2**31])


def run_cases(family_cases, tmp_path, backend="cpu"):
    """Run ``[(family, case)]`` in child processes; ``[(case, status, message)]`` for every case."""
    results = []
    pending = list(family_cases)
    while pending:
        cases_path, results_path = tmp_path / "cases.pkl", tmp_path / "results.txt"
        with open(cases_path, "wb") as f:
            pickle.dump(pending, f)
        results_path.write_text("")
        # the worker imports the graphkern this process imported (an install, or a build in place)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
        ended = run_worker(cases_path, results_path, env)
        done, started = 0, None
        for line in results_path.read_text().splitlines():
            if line.startswith("START "):
                started = int(line.split()[1])
            else:
                outcome = json.loads(line)
                results.append((pending[started], outcome["status"], outcome.get("message", "")))
                done = started + 1
                started = None
        if ended is None:
            break
        if started is None:  # the child died before its first case
            results.append((pending[done], "crash", ended))
            started = done
        else:
            results.append((pending[started], ended.split()[0], ended))
        pending = pending[started + 1:]
    return results


def run_worker(cases_path, results_path, env):
    """Run ``fuzz_worker.py`` on ``cases_path``; None when it ends well, else why it ended: a crash
    (its exit status and last words) or a hang (no line added to ``results_path`` for CASE_TIMEOUT
    seconds)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fuzz_worker.py"), str(cases_path),
                                 str(results_path)], env=env, stdout=subprocess.DEVNULL, stderr=err)
        size, last = -1, time.monotonic()
        while proc.poll() is None:
            now_size = os.path.getsize(results_path)
            if now_size != size:
                size, last = now_size, time.monotonic()
            elif time.monotonic() - last > CASE_TIMEOUT:
                proc.kill()
                proc.wait()
                return f"hang (no answer within {CASE_TIMEOUT} s)"
            time.sleep(0.05)
        if proc.returncode == 0:
            return None
        err.seek(0)
        return f"crash (exit status {proc.returncode}): " + err.read().decode(errors="replace")[-300:]


def collect(strategy, count, fuzz_seed):
    """``count`` examples of ``strategy`` drawn by Hypothesis (no shrinking: a child runs them),
    the same ones every run for a given ``fuzz_seed``, fresh ones each run for None."""
    found = []

    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(case):
        found.append(case)

    (draw if fuzz_seed is None else seed(fuzz_seed)(draw))()
    return found


def assert_reliable(family, results):
    bad = [(case, status, message) for case, status, message in results if status not in ("ok", "error")]
    counts = {s: sum(1 for _, status, _ in results if status == s) for s in ("ok", "error", "unclear", "wrong",
                                                                             "crash", "hang")}
    print(f"{family}: {len(results)} cases {counts}")
    assert not bad, "\n".join(f"{status}: {message}\n  case: {case!r}" for case, status, message in bad[:5])


# ----------------------------------------------------------------------------- strategies

@st.composite
def matrices(draw, *, symmetric=None, values=st.sampled_from(SPECIAL), max_n=12):
    n = draw(st.integers(1, max_n))
    m = draw(st.integers(0, 3 * n))
    return {"n": n, "rows": draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)),
            "cols": draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m)),
            "vals": draw(st.lists(values, min_size=m, max_size=m)),
            "symmetric": draw(st.booleans()) if symmetric is None else symmetric}


@st.composite
def constructor_cases(draw):
    m = draw(st.integers(0, 8))
    valid = draw(st.integers(0, 3)) > 0  # three cases in four are well-formed, the rest probe the errors
    endpoint = st.integers(0, 9) if valid else st.one_of(st.integers(-2, 10), st.sampled_from([0.5, 2.0, 2**64 - 1]))
    edges = draw(st.lists(st.tuples(endpoint, endpoint), min_size=m, max_size=m, unique_by=lambda e: frozenset(e)))
    n_nodes = draw(st.sampled_from([None, 10]) if valid else st.one_of(st.integers(0, 10), st.sampled_from([3.5, -1])))
    weight = st.sampled_from([0.5, 1.0, 2.0]) if valid else st.one_of(st.sampled_from(SPECIAL), st.just("1"))
    weights = draw(st.one_of(st.none(), st.lists(weight, min_size=m, max_size=m), *([] if valid else [
        st.lists(weight, max_size=3)])))
    n = n_nodes if isinstance(n_nodes, int) and n_nodes >= 0 else 11
    label = st.one_of(st.integers(-3, 3), st.sampled_from(["C", "N", "x"]))
    if valid:
        n = 10 if n_nodes == 10 else max((max(e) for e in edges), default=-1) + 1
        label = st.sampled_from(["C", "N", "O"]) if draw(st.booleans()) else st.integers(-3, 3)
    labels = draw(st.one_of(st.none(), st.builds(lambda c: {"element": c}, st.lists(label, min_size=n, max_size=n)),
                            *([] if valid else [st.builds(lambda c: {"e": c}, st.lists(label, max_size=3))])))
    return {"edges": edges, "n_nodes": n_nodes, "weights": weights, "node_labels": labels}


@st.composite
def similarity_cases(draw):
    case = draw(matrices(symmetric=True, values=st.just(1.0), max_n=15))
    case.update(metric=draw(st.sampled_from(["jaccard", "sorensen", "overlap"])), n_threads=draw(THREADS),
                dtype=draw(st.sampled_from(["float32", "float64"])))
    return case


@st.composite
def expm_cases(draw):
    # entries of 1e300 beside entries of 1 with any beta: scales too far apart for one Krylov space
    case = draw(matrices(symmetric=True, values=st.sampled_from([0.5, 1.0, 2.0, -1.0, 1e3, 1e-300, 1e300]),
                         max_n=10))
    n = case["n"]
    case.update(x=draw(st.lists(st.sampled_from([1.0, -2.0, 0.0, 1e-300, 1e100]), min_size=n, max_size=n)),
                beta=draw(st.sampled_from([0.0, 0.1, 1.0, -1.0, 1e-3, 1e-300])),
                fn=draw(st.sampled_from(["expm_multiply", "total_communicability"])), n_threads=draw(THREADS))
    return case


@st.composite
def graph_sets(draw, min_graphs=1):
    graphs = []
    for _ in range(draw(st.integers(min_graphs, 4))):
        n = draw(st.integers(1, 6))
        pairs = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=8))
        edges = sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})
        weights = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=len(edges),
                                                     max_size=len(edges))))
        labels = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        graphs.append((np.array(edges, dtype=np.int64).reshape(-1, 2), n, weights, labels))
    return graphs


@st.composite
def spgk_cases(draw):
    return {"graphs": draw(graph_sets()), "n_threads": draw(THREADS)}


@st.composite
def mgk_cases(draw):
    return {"graphs": draw(graph_sets()), "n_threads": draw(THREADS), "q": draw(st.sampled_from([0.05, 0.5, 0.9])),
            "h": draw(st.sampled_from([0.3, 0.9])), "length": draw(st.sampled_from([0.5, 2.0]))}


MM = b"%%MatrixMarket matrix coordinate real symmetric\n4 4 3\n2 1 1.0\n3 2 2.5\n4 4 1\n"
SDF = (b"m\n  x\n\n  2  1  0  0  0  0  0  0  0  0999 V2000\n"
       b"    0.0000    0.0000    0.0000 C   0  0  0  0  0  0  0  0  0  0  0  0\n"
       b"    1.0000    0.0000    0.0000 O   0  0  0  0  0  0  0  0  0  0  0  0\n"
       b"  1  2  2  0\nM  END\n$$$$\n")
EDGES = b"# n 5\n0\t1\n1\t2 \n% KONECT\n4 3\n2 1\n0 0\n"
SEED_FILES = {"mtx": MM, "sdf": SDF, "txt": EDGES}


@st.composite
def reader_cases(draw):
    fmt = draw(st.sampled_from(sorted(SEED_FILES)))
    data = bytearray(SEED_FILES[fmt])
    kind = draw(st.sampled_from(["edit", "edit", "truncate", "binary", "utf16"]))
    if kind == "edit":
        for _ in range(draw(st.integers(1, 4))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.sampled_from(b"0123456789-. \n9xV%$e"))
    elif kind == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif kind == "binary":
        data = bytearray(draw(st.binary(min_size=1, max_size=64)))
    else:
        data = bytearray(bytes(data).decode().encode("utf-16"))
    return {"format": fmt, "data": bytes(data)}


FAMILIES = {"validate": matrices(), "constructor": constructor_cases(), "similarity": similarity_cases(),
            "expm": expm_cases(), "spgk": spgk_cases(), "mgk": mgk_cases(), "reader": reader_cases()}
# cases per family relative to --fuzz-examples (the slow solvers get fewer)
SHARE = {"validate": 2.0, "constructor": 2.0, "similarity": 1.5, "expm": 1.5, "spgk": 1.0, "mgk": 0.7,
         "reader": 2.0}


def family_cases(family, count, tmp_path, fuzz_seed):
    cases = collect(FAMILIES[family], max(5, int(count * SHARE[family])), fuzz_seed)
    for k, case in enumerate(cases):
        if family == "reader":
            case["path"] = str(tmp_path / f"fuzz{k}.{case['format']}")
    return [(family, case) for case in cases]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fuzz_cpu(family, tmp_path, fuzz_examples, fuzz_seed):
    assert_reliable(family, run_cases(family_cases(family, fuzz_examples, tmp_path, fuzz_seed), tmp_path))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["similarity", "expm", "spgk", "mgk"])
def test_fuzz_gpu_agrees_with_the_references(family, tmp_path, fuzz_examples, fuzz_seed):
    # under a sanitizer a fifth of the cases (the same strategies), each many times slower there;
    # under racecheck, which checks every shared-memory access, a tenth
    cases = family_cases(family, sanitized(fuzz_examples, fuzz_examples // 5, race=fuzz_examples // 10), tmp_path,
                         fuzz_seed)
    for _, case in cases:
        case["backend"] = "gpu"
        if family == "similarity" and case["dtype"] == "float32":
            case["dtype"] = "float64"  # the reference check is at 1e-6
    assert_reliable(f"{family} (gpu)", run_cases(cases, tmp_path))


# ----------------------------------------------------------------------------- known bugs

def _expect(family, case, tmp_path):
    [(_, status, message)] = run_cases([(family, case)], tmp_path)
    assert status in ("ok", "error"), f"{status}: {message}"


BAD_INDEX = "G = Graph([0, 1, 2], [1, 10**6], validate=False)\n"
# every capability reads a graph built without validation: a clear error, never a segfault
UNVALIDATED = {
    "jaccard": "graphkern.jaccard(G, backend='cpu')",
    "expm_multiply": "graphkern.expm_multiply(G, backend='cpu')",
    "total_communicability": "graphkern.total_communicability(G, backend='cpu')",
    "spgk": "graphkern.ShortestPathKernel(backend='cpu')([G, G])",
    "mgk": "from graphkern.basekernels import Constant\n"
           "graphkern.MarginalizedGraphKernel(Constant(1.0), Constant(1.0), backend='cpu')([G, G])",
    "reorder_many": "from graphkern.reorder import reorder_many\nreorder_many([G])",
}


@pytest.mark.parametrize("capability", list(UNVALIDATED))
def test_unvalidated_graph_with_a_bad_index(capability, tmp_path):
    [(_, status, message)] = run_cases([("snippet", {"code": BAD_INDEX + UNVALIDATED[capability]})], tmp_path)
    assert status == "error" and "out of range" in message, f"{status}: {message}"


@pytest.mark.parametrize("capability", list(UNVALIDATED))
def test_absurd_thread_counts_are_clamped(capability, tmp_path):
    code = "G = Graph.from_edges([(0, 1), (1, 2)])\n" + UNVALIDATED[capability].replace(
        "backend='cpu')", "backend='cpu', n_threads=100000)").replace("reorder_many([G])",
                                                                        "reorder_many([G], n_threads=2**31)")
    _expect("snippet", {"code": code}, tmp_path)


# reproducers: a wrong result or unclear error where a bug is open (xfail) or was fixed (a regression test)
REPRODUCERS = {
    "expm_huge_entries": (
        "expm_multiply: entries >= ~1e155 stopped the Lanczos run after one step (converged=True, breakdown=True)",
        "A = sp.csr_matrix(np.array([[0, 1e300], [1e300, 0]]))\n"
        "y, _ = graphkern.expm_multiply(A, np.array([1.0, 2.0]), beta=1e-300, backend='cpu')\n"
        "check(np.allclose(y, [np.cosh(1) + 2 * np.sinh(1), np.sinh(1) + 2 * np.cosh(1)]), f'{y}')"),
    "jaccard_weight_overflow": (
        "weighted Jaccard whose weight sums overflow float32 returned zeros without a warning",
        "import warnings\nA = sp.csr_matrix(np.full((3, 3), 3e38) - np.diag([3e38] * 3))\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    J = graphkern.jaccard(A, weighted=True, dtype=np.float32, backend='cpu')\n"
        "check(np.allclose(J.data, 1 / 3), f'{J.data}')"),  # K3 with equal weights: 1 / 3 each
    "mgk_tiny_q": (
        "MGK with an accepted q=1e-25 in float32 returns zeros",
        "from graphkern.basekernels import Constant\nG = Graph.from_edges([(0, 1), (1, 2)])\n"
        "K = graphkern.MarginalizedGraphKernel(Constant(1.0), Constant(1.0), q=1e-25, backend='cpu')([G, G])\n"
        "check(np.all(K > 0), f'{K}')"),
    "mgk_huge_p": (
        "MGK with p=1e200 returns inf",
        "from graphkern.basekernels import Constant\nG = Graph.from_edges([(0, 1), (1, 2)])\n"
        "K = graphkern.MarginalizedGraphKernel(Constant(1.0), Constant(1.0), p=np.full(3, 1e200), "
        "backend='cpu')([G, G])\ncheck(np.all(np.isfinite(K)), f'{K}')"),
    "mgk_edgeless_set": (
        "MGK on graphs without edges failed in basekernels' feature packing (cannot reshape array of size 0)",
        "from graphkern.basekernels import Constant, SquareExponential, TensorProduct\n"
        "from graphkern.mgk.dense import dense_mgk\n"
        "gs = [Graph.from_edges(np.zeros((0, 2), int), n, edge_labels={'w': []}) for n in (2, 3)]\n"
        "nk, ek = Constant(1.0), TensorProduct(w=SquareExponential(1.0))\n"
        "K = graphkern.MarginalizedGraphKernel(nk, ek, q=0.5, dtype=np.float64, tol=1e-12, backend='cpu')(gs)\n"
        "ref = dense_mgk(gs, None, nk.compile(), ek.compile(), q=0.5)\n"
        "check(np.allclose(K, ref, rtol=1e-9, atol=0) and np.all(K > 0), f'{K} vs {ref}')"),
    "expm_mixed_scales": (
        "exp(beta A) x with entries 1e300 apart and beta < 0: one Krylov space cannot resolve the small "
        "eigenvalues beside the huge one and returned exp(0) = 1 for them; the vertices are solved apart",
        "A = sp.diags([2.0, 0.0, 4e300]).tocsr()\n"
        "y, info = graphkern.total_communicability(A, beta=-1.0, backend='cpu')\n"
        "check(np.allclose(y * np.exp(info.log_scale), [np.exp(-2.0), 1.0, 0.0]), f'{y}')"),
    "square_exponential_tiny": (
        "SquareExponential(1e-300) raises ZeroDivisionError",
        "from graphkern.basekernels import SquareExponential\nSquareExponential(1e-300)"),
}


OPEN = ()


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=REPRODUCERS[name][0])) if name in OPEN else name
    for name in REPRODUCERS])
def test_reproducers(case, tmp_path):
    _expect("snippet", {"code": REPRODUCERS[case][1]}, tmp_path)


def test_the_guard_tells_hangs_and_crashes_from_slow_batches(tmp_path, monkeypatch):
    """A case that stops answering is a hang and one that kills the child a crash, each named with
    its case while the batch goes on after it; a batch slower as a whole than the limit, whose
    every case answers in time, is neither."""
    import test_fuzz

    monkeypatch.setattr(test_fuzz, "CASE_TIMEOUT", 3)
    snippet = lambda code: ("snippet", {"code": code})  # noqa: E731
    nap = snippet("import time; time.sleep(1.0)")
    cases = [nap] * 5 + [snippet("import time; time.sleep(60)"), nap,
                         snippet("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), nap]
    results = run_cases(cases, tmp_path)
    assert [status for _, status, _ in results] == ["ok"] * 5 + ["hang", "ok", "crash", "ok"]
    assert [case for case, _, _ in results] == cases
    assert "exit status -11" in results[7][2]
