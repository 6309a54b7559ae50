"""The child process of the fuzz suite: runs a batch of cases, one outcome line per case.

``python fuzz_worker.py CASES RESULTS`` unpickles a list of ``(family, case)`` and appends, for
each, ``START k`` before running it and one JSON outcome after: ``ok``, ``error`` (an error type
the library may raise, with its message), ``unclear`` (an error type that is no clear error),
or ``wrong`` (a result that disagrees with the reference).  A crash leaves ``START k`` as the last
line: the parent names case ``k``.
"""

import json
import pickle
import sys
import warnings

import numpy as np
import scipy.linalg
import scipy.sparse as sp

import graphkern
from graphkern import Graph, NotConvergedError
from graphkern.graph import as_csr_matrix

# the error types a library user can catch as "bad input"; anything else is no clear error
CLEAR = (ValueError, TypeError, KeyError, MemoryError, NotConvergedError, OverflowError, ArithmeticError)
UNCLEAR = (IndexError, ZeroDivisionError, AttributeError, UnicodeDecodeError, AssertionError, SystemError)


# NumPy's and Python's own words: an error carrying them does not name the input
RAW_WORDS = ("cannot reshape", "out of bounds for axis", "setting an array element", "could not broadcast",
             "operands could not", "invalid literal", "object of type", "unsupported operand")


class Wrong(Exception):
    """A result that disagrees with the reference."""


def check(condition, message):
    if not condition:
        raise Wrong(message)


def csr(case):
    n, rows, cols, vals = case["n"], case["rows"], case["cols"], case["vals"]
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    return A if not case.get("symmetric") else (A + A.T).tocsr()


def reference_symmetric(A):
    A = A.copy()
    A.sum_duplicates()
    if A.nnz and not np.all(np.isfinite(A.data)):
        return "nonfinite"
    pattern = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    return "ok" if abs(A - A.T).sum() == 0 and abs(pattern - pattern.T).sum() == 0 else "asymmetric"


def run_validate(case):
    A = csr(case)
    try:
        as_csr_matrix(A, name="A")
        got = "ok"
    except ValueError as err:
        got = "nonfinite" if "NaN" in str(err) else "asymmetric"
    check(got == reference_symmetric(A), f"as_csr_matrix says {got}")


def run_constructor(case):
    G = Graph.from_edges(case["edges"], case.get("n_nodes"), weights=case.get("weights"),
                         node_labels=case.get("node_labels"))
    A = G.to_scipy()
    check(abs(A - A.T).sum() == 0, "asymmetric Graph")
    check(all(np.all(np.diff(G.indices[G.indptr[i]:G.indptr[i + 1]]) > 0) for i in range(G.n_nodes)), "unsorted")
    again = Graph(G.indptr, G.indices, G.weights, node_labels=G.node_labels, edge_labels=G.edge_labels)
    check(again == G and again.fingerprint == G.fingerprint, "not reproducible from its arrays")


def jaccard_reference(A):
    A = A.copy()
    A.setdiag(0)
    A.eliminate_zeros()
    sets = [set(A.indices[A.indptr[i]:A.indptr[i + 1]].tolist()) for i in range(A.shape[0])]
    return sets


def run_similarity(case):
    A = csr(case)
    A.data[:] = 1.0
    A.setdiag(0)
    A.eliminate_zeros()
    metric = case["metric"]
    S = getattr(graphkern, metric)(A, backend=case.get("backend", "cpu"), n_threads=case["n_threads"],
                                   dtype=case["dtype"])
    sets = jaccard_reference(A)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    for k, (i, j) in enumerate(zip(rows, A.indices)):
        a, b = sets[i], sets[j]
        inter = len(a & b)
        num, den = {"jaccard": (inter, len(a | b)), "sorensen": (2 * inter, len(a) + len(b)),
                    "overlap": (inter, min(len(a), len(b)))}[metric]
        want = num / den if den else 0.0
        check(abs(S.data[k] - want) <= 1e-6, f"{metric}({i}, {j}) = {S.data[k]}, reference {want}")


def run_expm(case):
    A = csr(case)
    x = np.asarray(case["x"], dtype=np.float64)
    if case["fn"] == "total_communicability":
        y, info = graphkern.total_communicability(A, beta=case["beta"], backend=case.get("backend", "cpu"),
                                                  n_threads=case["n_threads"])
        x = np.ones(A.shape[0])
    else:
        y, info = graphkern.expm_multiply(A, x, beta=case["beta"], backend=case.get("backend", "cpu"),
                                          n_threads=case["n_threads"])
    with np.errstate(all="ignore"):
        want = scipy.linalg.expm(case["beta"] * A.toarray()) @ x
        # a result out of the dtype's range comes back scaled: the true vector is y * exp(log_scale)
        y = np.asarray(y, dtype=np.float64) * np.exp(getattr(info, "log_scale", 0.0))
    if not np.all(np.isfinite(want)):
        return  # the reference itself overflows: any clear answer is accepted
    if not info.converged:
        return  # flagged, with a warning: not a claim (a wrong answer reported converged is the failure)
    scale = max(np.max(np.abs(want)), 1e-300)
    err = np.max(np.abs(y - want))
    # a Krylov method is accurate relative to ||exp(beta A)|| ||x||: where x mixes scales of 1e100
    # and 1 and exp(beta A) shrinks the large part away, the small part's answer is below its reach
    with np.errstate(all="ignore"):
        normwise = np.linalg.norm(scipy.linalg.expm(case["beta"] * A.toarray()), 2) * np.linalg.norm(x)
    check(err <= 1e-6 * scale or err <= 1e-8 * normwise,
          f"max error {err / scale:.3g} (relative), {err / max(normwise, 1e-300):.3g} (normwise)")


def small_graphs(case):
    return [Graph.from_edges(e, n, weights=w, node_labels={"c": c}) for e, n, w, c in case["graphs"]]


def run_spgk(case):
    from graphkern.spgk import DiracNode, ShortestPathKernel
    graphs = small_graphs(case)
    kern = ShortestPathKernel(node_kernel=DiracNode("c"), backend=case.get("backend", "cpu"),
                              n_threads=case["n_threads"])
    K = kern(graphs)
    check(np.allclose(K, K.T), "Gram matrix not symmetric")
    check(np.all(K >= -1e-9), "negative entry from a Dirac kernel")
    perm = [g.permute(np.random.default_rng(0).permutation(g.n_nodes)) for g in graphs]
    check(np.allclose(kern(perm), K, rtol=1e-9, atol=1e-9), "not invariant under renumbering the nodes")


def run_mgk(case):
    from graphkern.basekernels import KroneckerDelta, SquareExponential, TensorProduct
    from graphkern.mgk.dense import dense_mgk
    graphs = small_graphs(case)
    nk = TensorProduct(c=KroneckerDelta(case["h"]))
    ek = TensorProduct(w=SquareExponential(case["length"]))
    for g in graphs:
        g.edge_labels["w"] = g.weight_array()
    kern = graphkern.MarginalizedGraphKernel(nk, ek, q=case["q"], dtype=np.float64, tol=1e-12,
                                             backend=case.get("backend", "cpu"), n_threads=case["n_threads"])
    K = kern(graphs)
    ref = dense_mgk(graphs, None, nk.compile(), ek.compile(), q=case["q"])
    check(np.all(np.isfinite(K)), "non-finite Gram matrix")
    check(np.max(np.abs(K - ref) / np.maximum(np.abs(ref), 1e-300)) < 1e-6, "Gram matrix differs from the dense solve")


def run_reader(case):
    import graphkern.io as gio
    path = case["path"]
    with open(path, "wb") as f:
        f.write(case["data"])
    {"mtx": gio.read_matrix_market, "sdf": gio.read_sdf, "smi": gio.read_smiles,
     "txt": gio.read_edgelist}[case["format"]](path)


def run_snippet(case):
    """A reproducer: Python code that raises Wrong (via ``check``) on a wrong result."""
    exec(case["code"], {"np": np, "sp": sp, "graphkern": graphkern, "Graph": Graph, "check": check})


FAMILIES = {"snippet": run_snippet, "validate": run_validate, "constructor": run_constructor, "similarity": run_similarity,
            "expm": run_expm, "spgk": run_spgk, "mgk": run_mgk, "reader": run_reader}


def outcome(family, case):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            FAMILIES[family](case)
    except Wrong as err:
        return {"status": "wrong", "message": str(err)}
    except UNCLEAR as err:
        return {"status": "unclear", "message": f"{type(err).__name__}: {err}"}
    except CLEAR as err:
        status = "unclear" if any(words in str(err) for words in RAW_WORDS) else "error"
        return {"status": status, "message": f"{type(err).__name__}: {err}"}
    except Exception as err:  # noqa: BLE001 - every other type is reported, not hidden
        return {"status": "unclear", "message": f"{type(err).__name__}: {err}"}
    return {"status": "ok"}


def main(cases_path, results_path):
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    with open(results_path, "a", buffering=1) as out:
        for k, (family, case) in enumerate(cases):
            out.write(f"START {k}\n")
            out.write(json.dumps(outcome(family, case)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
