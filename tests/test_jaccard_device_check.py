"""The GPU path checks a SciPy CSR on the device after its upload (the shared CSR check) and runs
the host check only where the device finds a problem: results and messages match the host path."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph
from graphkern.similarity import jaccard
from graphkern.similarity.api import symmetric_pattern, unchecked_pattern
from jaccard_graphs import random_graph

from graphkern._cuda.csr_check import ASYMMETRIC, INDPTR, NEGATIVE, NONFINITE, RANGE


def outcome(A, **kw):
    """("ok", values, indices, indptr) of jaccard(A, **kw), or ("error", type, message)."""
    try:
        R = jaccard(A, **kw)
    except (ValueError, TypeError) as e:
        return ("error", type(e), str(e))
    return ("ok", R.data.tobytes(), R.indices.tolist(), R.indptr.tolist())


def sym(rng, n=40, density=0.15):
    A = random_graph(rng, n, density)
    A.sort_indices()
    return A


def with_entry(A, i, j, value):
    """A copy of A with entry (i, j) set to value (stored), canonical."""
    B = A.tolil(copy=True)
    B[i, j] = value
    B = sp.csr_matrix(B)
    B.sort_indices()
    return B


def first_pair_without_mirror(A):
    D = A.toarray()
    i, j = next((i, j) for i in range(A.shape[0]) for j in range(A.shape[0]) if i != j and D[i, j] == 0)
    return i, j


def bad_inputs(rng):
    """(name, matrix, weighted, the flag the device must raise) for every kind of problem."""
    A = sym(rng)
    n = A.shape[0]
    out = []
    i, j = first_pair_without_mirror(A)
    out.append(("asymmetric pattern", with_entry(A, i, j, 1.0), False, ASYMMETRIC))
    k = int(np.flatnonzero(A.indices != np.repeat(np.arange(n), np.diff(A.indptr)))[0])
    B = A.copy()
    B.data[k] += 1.5
    out.append(("asymmetric weights", B, True, ASYMMETRIC))
    out.append(("asymmetric values, unweighted", B.copy(), False, ASYMMETRIC))
    B = A.copy()
    B.data[k] = np.nan
    out.append(("NaN", B, False, NONFINITE))
    B = A.copy()
    B.data[k] = np.inf
    out.append(("infinite", B, True, NONFINITE))
    B = A.tolil(copy=True)
    r, c = int(np.searchsorted(A.indptr, k, side="right") - 1), int(A.indices[k])
    B[r, c] = B[c, r] = -2.0
    B = sp.csr_matrix(B)
    B.sort_indices()
    out.append(("negative weight", B, True, NEGATIVE))
    for bad in (n, n + 7, -1):
        B = A.copy()
        B.indices[k] = bad
        out.append((f"column {bad}", B, False, RANGE))
    B = A.copy()
    r = int(np.flatnonzero(np.diff(A.indptr) >= 2)[0])
    B.indptr[r + 1] = B.indptr[r] - 1 if B.indptr[r] > 0 else B.indptr[r + 2] + 1
    out.append(("decreasing indptr", B, False, INDPTR))
    B = A.copy()
    B.indptr[0] = 1
    out.append(("indptr not from 0", B, False, INDPTR))
    B = A.copy()  # drop the last stored entry: off the diagonal, so the matrix is also asymmetric
    B.setdiag(0)  # (dropping a diagonal entry would leave a valid matrix)
    B.eliminate_zeros()
    B.indptr[-1] -= 1
    out.append(("indptr short of nnz", B, False, INDPTR))
    return out


def non_canonical_inputs(rng):
    """Valid inputs the host path canonicalizes: unsorted rows, and duplicates that sum to a
    symmetric matrix (every entry split into two halves)."""
    A = sym(rng)
    rows = []
    for r in range(A.shape[0]):
        s = slice(A.indptr[r], A.indptr[r + 1])
        rows.append((A.indices[s][::-1], A.data[s][::-1]))
    U = sp.csr_matrix((np.concatenate([d for _, d in rows]), np.concatenate([c for c, _ in rows]), A.indptr.copy()),
                      shape=A.shape)
    D = sp.csr_matrix((np.repeat(A.data / 2, 2), np.repeat(A.indices, 2), 2 * A.indptr), shape=A.shape)
    return [("unsorted rows", U), ("duplicates", D)]


def test_unchecked_pattern_takes_the_arrays_as_they_are(rng):
    A = sym(rng)
    pattern, values = unchecked_pattern(A, weighted=True)
    assert np.shares_memory(pattern.indices, A.indices) and not pattern.owns_indices
    assert values is A.data or np.shares_memory(values, A.data)
    assert pattern.indptr.dtype == np.int64 and np.array_equal(pattern.indptr, A.indptr)
    assert np.array_equal(pattern.weights, A.data)
    assert unchecked_pattern(A, weighted=False)[0].weights is None
    assert pattern.figures.top == np.diff(A.indptr).max() and pattern.figures.total == A.nnz
    B = A.copy()
    B.indices = B.indices.astype(np.int64)
    for other in (A.tocoo(), sp.csr_matrix(A.shape), B, sp.csr_matrix(np.ones((2, 3))), A.astype(np.complex128),
                  Graph.from_scipy(A)):
        assert unchecked_pattern(other) is None


def uniform_inputs(rng):
    """(matrix, weighted, whether its values stay on the host): every value the same."""
    A = sym(rng)
    out = []
    for value, weighted, host in ((1.0, False, True), (1.0, True, True), (-2.0, False, True), (-2.0, True, False),
                                  (-0.0, True, True), (np.nan, False, False), (np.inf, True, False)):
        for value_type in (np.float64, np.float32, np.float16):
            data = np.full(A.nnz, value, dtype=value_type)
            out.append((sp.csr_matrix((data, A.indices, A.indptr), shape=A.shape), weighted, host))
    for value_type in (np.bool_, np.int8, np.uint16, np.int64):
        data = np.ones(A.nnz, dtype=value_type)
        out.append((sp.csr_matrix((data, A.indices, A.indptr), shape=A.shape), False, True))
    return out


def test_uniform_values_are_checked_on_the_host(rng):
    for B, weighted, host in uniform_inputs(rng):
        pattern, values = unchecked_pattern(B, weighted=weighted, n_threads=2)
        assert (values is None) == host, (B.dtype, B.data[0], weighted)
    B = sym(rng)
    B.data[:] = 1.0
    B.data[-1] = 2.0  # the same bits everywhere but one entry: the values go to the device
    assert unchecked_pattern(B)[1] is B.data


@pytest.mark.gpu
def test_uniform_inputs_give_the_host_paths_results(rng):
    for B, weighted, _ in uniform_inputs(rng):
        device = outcome(B, weighted=weighted, backend="gpu")
        if B.dtype != np.float16:  # a COO input takes the host check; newer SciPy makes no float16 COO
            assert device == outcome(B.tocoo(), weighted=weighted, backend="gpu"), (B.dtype, B.data[0], weighted)
        cpu = outcome(B, weighted=weighted, backend="cpu")
        assert device[0] == cpu[0] and (device == cpu or weighted), (B.dtype, B.data[0], weighted)


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("value_type", [np.float64, np.float32, np.int64, np.bool_])
def test_device_checked_inputs_give_the_host_paths_results(rng, weighted, value_type):
    for n, density in ((50, 0.2), (300, 0.03), (2000, 0.004)):
        A = random_graph(rng, n, density)
        A.sort_indices()
        if value_type != np.float64:
            A = sp.csr_matrix((np.maximum(A.data, 1).astype(value_type), A.indices, A.indptr), shape=A.shape)
        R, info = jaccard(A, weighted=weighted, backend="gpu", return_info=True)
        assert "validate_device" in info.times  # the device checked it
        H, host_info = jaccard(A.tocoo(), weighted=weighted, backend="gpu", return_info=True)
        assert "validate_device" not in host_info.times  # the host checked it
        assert R.data.tobytes() == H.data.tobytes()
        assert np.array_equal(R.indices, H.indices) and np.array_equal(R.indptr, H.indptr)
        C = jaccard(A, weighted=weighted, backend="cpu")
        if weighted:
            np.testing.assert_allclose(R.data, C.data, rtol=1e-5)
        else:
            assert R.data.tobytes() == C.data.tobytes()


@pytest.mark.gpu
def test_a_graph_is_not_checked_again(rng):
    A = sym(rng)
    _, info = jaccard(Graph.from_scipy(A), backend="gpu", return_info=True)
    assert "validate_device" not in info.times


@pytest.mark.gpu
def test_device_check_flags_every_kind_of_problem(rng, gpu_device):
    from graphkern.similarity.gpu import DeviceCSR

    for name, B, weighted, flag in bad_inputs(rng):
        pattern, values = unchecked_pattern(B, weighted=weighted)
        flags = DeviceCSR(gpu_device, pattern).check(values, check_negative=weighted, times={})
        assert flags & flag, (name, flags)
    A = sym(rng)
    pattern, values = unchecked_pattern(A, weighted=True)
    assert DeviceCSR(gpu_device, pattern).check(values, check_negative=True, times={}) == 0


@pytest.mark.gpu
def test_invalid_inputs_raise_the_host_paths_messages(rng):
    for name, B, weighted, _ in bad_inputs(rng):
        host = outcome(B, weighted=weighted, backend="cpu")
        device = outcome(B, weighted=weighted, backend="gpu")
        assert host[0] == "error", name
        assert device[:3] == host[:3], name
        with pytest.raises(host[1]) as e:
            symmetric_pattern(B, weighted=weighted)
        assert str(e.value) == host[2], name


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
def test_non_canonical_inputs_are_canonicalized_as_before(rng, weighted):
    for name, B in non_canonical_inputs(rng):
        device = outcome(B.copy(), weighted=weighted, backend="gpu")
        host_checked = outcome(B.tocoo(), weighted=weighted, backend="gpu")
        assert device[0] == "ok", name
        assert device[2:] == host_checked[2:], name
        assert device[1] == host_checked[1], name
        cpu = jaccard(B.copy(), weighted=weighted, backend="cpu")
        np.testing.assert_allclose(np.frombuffer(device[1], dtype=np.float32), cpu.data, rtol=1e-5, err_msg=name)


@pytest.mark.gpu
def test_unweighted_values_are_checked_after_the_kernels_only_when_unequal(rng, monkeypatch):
    """An unweighted call scans the stored values while the kernels run; values that are not all
    the same go to the device for their check afterwards, and a problem there raises the host
    path's error instead of returning the result."""
    from graphkern.similarity.gpu import DeviceCSR

    calls = []
    original = DeviceCSR.check_values

    def counted(self, values, **kw):
        calls.append(values.size)
        return original(self, values, **kw)

    monkeypatch.setattr(DeviceCSR, "check_values", counted)
    A = sym(rng, n=300, density=0.03)
    ones = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    assert outcome(ones, backend="gpu") == outcome(ones, backend="cpu")
    assert calls == []
    assert outcome(A, backend="gpu") == outcome(A, backend="cpu")  # symmetric, unequal values
    assert calls == [A.nnz]
    for name, B, weighted, _ in bad_inputs(rng):
        if not weighted:
            assert outcome(B, backend="gpu") == outcome(B, backend="cpu"), name
