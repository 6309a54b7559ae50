"""GPU faults in the middle of a call: out of memory, a kernel that fails to launch, a device lost
during a copy.  Each raises CudaError with the driver's name and the pairs involved, the device
memory the call allocated is freed (back to the level of the warm kernel before it), and the next
call works and gives the same answer.  The faults are injected at the runtime layer, the one
place the capabilities reach the driver through."""

import gc
import math

import numpy as np
import pytest

from graphkern import CudaError
from graphkern._cuda import runtime as rt
from graphkern.basekernels import KroneckerDelta, SquareExponential, TensorProduct
from graphkern.graph import Graph
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk import csr as csr_module
from graphkern.mgk.gemm import MAX_TILE, TILE_THREADS

from conftest import SANITIZER, sanitized
from test_mgk_csr import csr_shared_need

pytestmark = pytest.mark.gpu


def _graphs(rng):
    """Small graphs (the CSR solver) and two large ones (the tiled solver): a Gram matrix that
    launches more than one solver.  Under a sanitizer, five small ones and one large one, the
    smallest whose pair with itself neither the GEMM solver's largest float64 tile nor the CSR
    solver's shared memory holds (the search direction alone, n^2 float64, exceeds it); under
    racecheck three small ones of up to 11 vertices and a path of 24, whose pair with itself the
    test's CSR limit leaves to the tiled solver."""
    large = sanitized([260, 300], [max(math.isqrt(csr_module.shared_memory_limit(rt.get_device(0)) // 8) + 1,
                                       TILE_THREADS * MAX_TILE[8] + 1)], race=[24])
    sizes = [(int(n), 0.2) for n in rng.integers(4, sanitized(30, 30, race=12), sanitized(24, 5, race=3))]
    out = []
    for n, density in sizes + [(n, sanitized(0.03, 0.03, race=0.0)) for n in large]:
        upper = np.triu(rng.random((n, n)) < density, 1)
        i, j = np.nonzero(upper)
        edges = [(int(a), int(b)) for a, b in zip(i, j)] + [(k, k + 1) for k in range(n - 1)]
        edges = list(dict.fromkeys(edges))
        out.append(Graph.from_edges(edges, n, node_labels={"kind": rng.integers(0, 3, n)},
                                    edge_labels={"length": rng.random(len(edges))}))
    return out


def _inject(monkeypatch, name, error, after):
    """Make ``rt.<name>`` raise ``error`` from its ``after``-th call on (counting from 0)."""
    original = getattr(rt, name)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(rt, name, failing)
    return calls


@pytest.mark.parametrize("where, name, error", [
    ("alloc", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    ("launch", "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    ("copy_to_pageable", "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"),
])
@pytest.mark.parametrize("after", [0, 1])
def test_mgk_fault_mid_gram_is_named_freed_and_recoverable(monkeypatch, rng, where, name, error, after):
    X = _graphs(rng)
    kern = MarginalizedGraphKernel(TensorProduct(kind=KroneckerDelta(0.5)), TensorProduct(length=SquareExponential(1.0)),
                                   q=sanitized(0.05, 0.05, race=0.5), dtype=np.float64, backend="gpu", device=0)
    if SANITIZER == "racecheck":  # the CSR solver's shared memory just too small for the path's pair with itself
        limit = csr_shared_need(kern, X, len(X) - 1, len(X) - 1, gradient=False) - 1
        monkeypatch.setattr(csr_module, "shared_memory_limit", lambda dev: limit)
    K = kern(X)  # warm: the datasets and modules are on the device
    assert "tiled" in kern.info_.solvers and len(kern.info_.solvers) > 1
    dev = rt.get_device(0)
    dev.synchronize()
    gc.collect()
    held_before = dev.allocated_bytes()  # this process's buffers: other processes do not count
    with monkeypatch.context() as m:
        _inject(m, where, CudaError(name, error, call="injected"), after)
        with pytest.raises(CudaError) as info:
            kern(X)
    assert info.value.name == name and "pairs of graphs" in str(info.value)
    assert info.value.pairs.ndim == 2 and len(info.value.pairs) > 0
    del info
    gc.collect()
    dev.synchronize()
    assert dev.allocated_bytes() <= held_before + (2 << 20), "the failed call left device memory allocated"
    np.testing.assert_array_equal(kern(X), K)


def test_expm_launch_failure_is_named_and_the_next_call_works(monkeypatch, rng):
    import scipy.sparse as sp

    from graphkern.expm import expm_multiply

    A = sp.random(3000, 3000, density=0.002, random_state=7, format="csr")
    A = (A + A.T).tocsr()
    y, _ = expm_multiply(A, beta=0.5, backend="gpu")
    with monkeypatch.context() as m:
        _inject(m, "launch", CudaError("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure", call="injected"), 3)
        with pytest.raises(CudaError, match="CUDA_ERROR_LAUNCH_FAILED"):
            expm_multiply(A, beta=0.5, backend="gpu")
    gc.collect()
    np.testing.assert_allclose(expm_multiply(A, beta=0.5, backend="gpu")[0], y, rtol=1e-12)
