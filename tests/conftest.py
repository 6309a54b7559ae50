"""Shared test set-up: GPU tests skip cleanly (with the reason) where no device is usable."""

import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import pytest

import graphkern
from graphkern._cuda import runtime


def pytest_collection_modifyitems(config, items):
    reason = runtime.unavailable_reason()
    n_dev = runtime.device_count() if reason is None else 0
    for item in items:
        if "gpu" in item.keywords and reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"no usable GPU: {reason}"))
        elif "multigpu" in item.keywords and n_dev < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 GPUs, {n_dev} usable"))


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed on failure for reproduction."""
    seed = np.random.SeedSequence().entropy % (2**32)
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def gpu_device():
    return runtime.get_device(0)


BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]

# the compute-sanitizer tool this run is under (tools/sanitize.py sets it), "" otherwise: a
# sanitizer makes kernel launches slow and partly synchronous, so assertions about how work
# interleaves in time (not about results) hold only without one
SANITIZER = os.environ.get("GRAPHKERN_TEST_SANITIZER", "")


_AS_SMALL = object()


def sanitized(normal, small, race=_AS_SMALL):
    """``small`` under a sanitizer, ``normal`` otherwise: the size of a test's inputs (fewer graphs,
    pairs or vertices, never another route through the code) that finishes under one.  ``race``,
    where given, under racecheck instead: it instruments every shared-memory access, and the
    solvers that keep their working vectors and octiles in shared memory run CG there, so its
    cost grows with product-graph size x iterations x pairs far past memcheck's."""
    if SANITIZER == "racecheck" and race is not _AS_SMALL:
        return race
    return small if SANITIZER else normal


# What the MGK kernel modules export beyond the values their Python plans with (cuda_src/*.cu:
# GRAPHKERN_EXPORTS), for the tests whose driver is simulated
_LAUNCH_EXPORTS = {"mgk": dict(warps_per_block=4, max_params=96, octile_size=64, vectors=5, gradient_vectors=9,
                               staged_channels_general=0, staged_channels_constant=1, staged_channels_kronecker=2,
                               staged_channels_sqexp=2),
                   "mgk_csr": dict(threads=256, vectors=4, gradient_vectors=7),
                   "mgk_gemm": dict(vectors=4, gradient_vectors=7), "mgk_tiled": dict(vectors=5)}


def simulated_exports(module):
    """The export table of MGK kernel module ``module`` as a simulated driver gives it (name -> value)."""
    from graphkern.mgk import csr, gemm, tiled

    planned = {"mgk_csr": csr._PLANNED, "mgk_gemm": gemm._PLANNED, "mgk_tiled": tiled._PLANNED}.get(module, {})
    return {**planned, **_LAUNCH_EXPORTS[module]}


class SimulatedLayout:
    """A kernel's struct parameter as a simulated driver takes it: ``pack`` keeps the fields by name
    (the layout, offsets and widths, comes from a compiled module only)."""

    def __init__(self, device, module, name):
        self.name = f"{module}:{name}"

    def pack(self, **fields):
        return types.SimpleNamespace(layout=self.name, fields=fields)


def launch_arguments(args):
    """A launch's arguments with every struct's fields in its place: the values in the order the
    kernel's parameters read them."""
    return [v for a in args for v in (a.fields.values() if hasattr(a, "fields") else (a,))]


def launched_pairs(args):
    """The device buffers of a launch's pairs (its job's ``pair_g1``, ``pair_g2``) and their count."""
    job = next((a.fields for a in args if "pair_g1" in getattr(a, "fields", ())), None)
    if job is not None:
        return job["pair_g1"], job["pair_g2"], int(job["n_pairs"])
    at = next(k for k, a in enumerate(args) if isinstance(a, np.int64) and k >= 2)  # a positional head
    return args[at - 2], args[at - 1], int(args[at])


def run_python(code, *, env=None, timeout=120):
    """Run ``code`` in a fresh interpreter that imports the same graphkern as this test run.

    The child starts in an empty folder (so ``-c`` does not put the source tree first on
    sys.path) with PYTHONPATH pointing at the graphkern being tested, installed or in-place.
    """
    parent = os.path.dirname(os.path.dirname(os.path.abspath(graphkern.__file__)))
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, child_env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env,
                              cwd=cwd, timeout=timeout)


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=150,
                     help="cases per family of tests/test_fuzz.py (each family scales it by its cost)")
    parser.addoption("--combination-share", type=int, default=1, metavar="N",
                     help="tests that loop over every combination of solver options run one in N of them "
                          "(a random offset each run): sizes that finish under compute-sanitizer (tools/sanitize.py)")
    parser.addoption("--fuzz-seed", default="0",
                     help="seed of tests/test_fuzz.py's draws: the same cases every run (a test run judges the "
                          "code, not its luck); 'random' draws fresh ones to look for new bugs")


@pytest.fixture
def fuzz_examples(request):
    return request.config.getoption("--fuzz-examples")


@pytest.fixture
def combinations(request, rng):
    """``combinations(items, race=None)``: the items a combination-looping test runs, every one by
    default, one in ``--combination-share`` from a random offset otherwise (never none); under
    racecheck at most ``race`` of those, drawn at random, where ``race`` is given."""
    share = max(1, request.config.getoption("--combination-share"))

    def pick(items, race=None):
        chosen = one_in(items, share, int(rng.integers(share)))
        if race is not None and SANITIZER == "racecheck" and len(chosen) > race:
            chosen = [chosen[k] for k in np.sort(rng.choice(len(chosen), race, replace=False))]
        return chosen

    return pick


def one_in(items, share, offset):
    """Every ``share``-th of ``items`` from ``offset`` (all of them for a share of 1; never none)."""
    items = list(items)
    if share <= 1 or not items:
        return items
    return items[offset % len(items)::share] or items[:1]


@pytest.fixture
def fuzz_seed(request):
    value = request.config.getoption("--fuzz-seed")
    return None if value == "random" else int(value)


def rebuilt(G, *, indices=None, weights=None, node_labels=None, edge_labels=None, validate=False):
    """A new Graph like ``G`` with some arrays replaced (a Graph's own arrays are read-only, so a
    test that wants a changed or broken graph builds one; ``validate=False`` lets bad values in)."""
    from graphkern.graph import Graph

    return Graph(G.indptr, G.indices if indices is None else indices,
                 G.weights if weights is None else weights,
                 node_labels=dict(G.node_labels, **(node_labels or {})),
                 edge_labels=dict(G.edge_labels, **(edge_labels or {})), validate=validate)


@pytest.fixture(autouse=True)
def _thread_settings_unchanged():
    """A test must not leave thread limits behind (Dask's nannies set OMP_NUM_THREADS=1 in the
    process that starts them): the tests after it would quietly run single-threaded."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    before = {k: os.environ.get(k) for k in keys}
    yield
    after = {k: os.environ.get(k) for k in keys}
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    assert after == before, f"the test changed the thread settings: {before} -> {after}"
