"""Jaccard, Sorensen and overlap similarity of the two endpoints of every stored edge.

For each stored entry ``(i, j)`` of a symmetric adjacency matrix ``A`` the result holds

* :func:`jaccard`:  ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|``,
* :func:`sorensen`: ``2 |N(i) ∩ N(j)| / (|N(i)| + |N(j)|)``,
* :func:`overlap`:  ``|N(i) ∩ N(j)| / min(|N(i)|, |N(j)|)``,

as a ``scipy.sparse.csr_matrix`` with exactly the pattern of ``A``: the same stored entries
(explicit zeros included), sorted indices, duplicates of a COO input summed first.
``return_info=True`` returns ``(matrix, info)`` with a :class:`SimilarityInfo`.

Conventions
-----------
* Every stored entry is an edge, an explicitly stored zero included; the input must be square
  and symmetric (a directed graph is an error; symmetrize it first).
* ``self_loops=False`` (default): self-loops are left out of the neighbour sets.
  ``self_loops=True``: every vertex belongs to its own set, ``N[i] = N(i) ∪ {i}``.
* A stored diagonal entry ``(i, i)`` gets 1.0; an empty denominator gives 0.
* ``weighted=True`` uses the weights ``w`` (non-negative) and the sums
  ``S_ij = Σ_{k ∈ N(i) ∩ N(j)} min(w_ik, w_jk)`` and ``W_i = Σ_{k ∈ N(i)} w_ik``:
  jaccard is the Ruzicka similarity ``S_ij / (W_i + W_j - S_ij)``, which equals
  ``Σ_k min(w_ik, w_jk) / Σ_k max(w_ik, w_jk)`` over the union; sorensen is
  ``2 S_ij / (W_i + W_j)``; overlap is ``S_ij / min(W_i, W_j)``.  With ``self_loops=True``
  vertex ``i``'s own weight is its stored ``w_ii``, or 1 where no self-loop is stored.
* Unweighted counts are exact integers divided in double precision, then rounded to
  ``dtype``: the CPU and every GPU variant give identical values.  Weighted sums run in
  ``dtype``; backends agree to rounding.  Where the sums could overflow ``dtype`` (weights near
  its largest value), float32 sums run in float64, and float64 weights are first scaled by a
  power of two (exact for all but subnormal results; ``info.weight_scale`` records it).  The
  GPU kernels count a missing self-loop as weight 1, so a scaled float64 run with
  ``self_loops=True`` on a graph where some vertex has no stored self-loop is refused there
  (ValueError); the CPU computes it.

GPU variants (``variant=``): ``"element"`` (the element-parallel baseline: a thread per stored
entry merges both neighbour lists), ``"binary"`` (a thread per upper-triangle entry searches each
element of the shorter list in the longer one), ``"warp"`` (a group of lanes per entry shares
that search), ``"balanced"`` (the searches of all entries laid end to end and cut into equal
chunks, for skewed degree distributions), ``"hub"`` (balanced, with a bitmap of the neighbour set
of each of the highest-degree vertices, so that looking an element up in a hub's list is one bit
test; unweighted only, weighted ``"hub"`` runs as ``"balanced"``), ``"shortrow"`` (graphs whose
rows all have at most 32 entries: a group of lanes per row holds its list and tests the lists of
its neighbours against it, in one launch; other graphs are a ValueError), ``"pair"`` (for short
lists: a block lists the upper-triangle entries of a range of rows in shared memory and every
thread merges the two lists of one of them, in one launch; correct on any graph, slow past a few
hundred entries per row), ``"staged"`` (``"pair"`` with each block's rows first copied into
shared memory, so that the pairs between two of a block's rows merge there: for graphs stored in
an order that keeps neighbours close, such as meshes, small-world rings and road networks;
weighted ``"staged"`` runs as ``"pair"``), ``"window"`` (for banded orders: each row becomes a
64-bit mask of its neighbours within 32 of its own index plus a list of at most 4 farther ones,
and a pair (i, j) with |i - j| < 32 is a popcount of the two masks and a few lookups; the other
pairs are merged as in ``"pair"``, so it is correct on any graph; weighted ``"window"`` runs as
``"pair"``), ``"longrow"`` (``"hub"`` with every pair's work carried by its longer list, so that
consecutive searches hit one list or one bitmap; unweighted, a list of at least
``hash_min_degree`` entries without a bitmap gets a hash table, so that a search in it is mostly
one 16-byte load; weighted ``"longrow"`` has no bitmaps or tables), and ``"auto"``, which picks
one from the degree distribution (:func:`~graphkern.similarity.choose_variant`).  All but
``"element"`` compute each undirected pair once and write it to both ``(i, j)`` and ``(j, i)``.
The CPU backend has one method and ignores ``variant`` and ``hash_min_degree``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern.errors import GraphTooLargeError
from graphkern.graph import Graph, as_csr_matrix
from graphkern.similarity.plan import HASH_MIN_DEGREE, INT32_MAX, DegreeFigures, DeviceOptions

METRICS = {"jaccard": 0, "sorensen": 1, "overlap": 2}


@dataclass(frozen=True)
class SimilarityInfo:
    """What a similarity call did (``return_info=True``).

    metric, backend ("cpu" or "gpu"), dtype (of the result); variant: the GPU kernel that ran
    ("auto" resolved) or "cpu"; options: the keyword arguments that chose it (weighted,
    self_loops, variant, hash_min_degree, n_threads or device); compute_dtype: the type the
    sums ran in (float64 for float32 results whose weight sums could overflow float32);
    weight_scale: the power of two the weights were multiplied by (1.0 unless their sums could
    overflow float64); plan: on the GPU, the plan's figures (hubs with a bitmap, rows with a hash
    table, work items, device bytes); times: seconds -- validate (host checks and conversion of
    the input), validate_device (on the GPU, where a SciPy CSR is checked there after its upload:
    the check kernel and its read-back), plan (GPU planning and device buffers), upload, compute
    (the kernels, by host clock after a synchronize), download, and total.
    """

    metric: str
    backend: str
    dtype: str
    variant: str
    options: dict
    compute_dtype: str
    weight_scale: float = 1.0
    plan: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)


def jaccard(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
            dtype=np.float32, variant="auto", hash_min_degree=HASH_MIN_DEGREE, verbose=False, return_info=False):
    """Jaccard similarity ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|`` on every stored entry of ``G``.

    Parameters
    ----------
    G : Graph, scipy.sparse matrix or networkx graph
        A symmetric adjacency (square; duplicates of a COO matrix are summed).  A networkx graph's
        rows and columns follow ``G.nodes``; its ``weight`` attribute gives the weights.
    weighted : bool
        Use the Ruzicka form ``Σ min(w_ik, w_jk) / Σ max(w_ik, w_jk)`` (non-negative weights).
    self_loops : bool
        Put every vertex in its own neighbour set (otherwise self-loops are ignored).
    backend : "auto", "cpu" or "gpu"
    device : int or a one-element list, optional
        GPU ordinal (default 0).
    n_threads : int, optional
        CPU threads (default: all cores, honouring OMP_NUM_THREADS).
    dtype : float32 or float64
        Output type; weighted sums also run in it (see the module documentation for overflow).
    variant : str
        GPU kernel, one of :data:`~graphkern.similarity.VARIANTS`; ignored by the CPU backend.
    hash_min_degree : int >= 0
        GPU ``"longrow"``, unweighted: rows of at least this degree without a bitmap get a hash
        table of their columns (0: none).
    verbose : bool or callable
        Progress: rows done on the CPU, the upload, kernels and download on the GPU
        (see graphkern._progress; a callable receives ``(done, total)``).
    return_info : bool
        Also return a :class:`SimilarityInfo`.

    Returns
    -------
    scipy.sparse.csr_matrix with the pattern of ``G`` (and the info with ``return_info``).  See
    the module docstring for the conventions (self-loops, diagonal, empty sets).
    """
    return _similarity("jaccard", G, weighted, self_loops, backend, device, n_threads, dtype, variant,
                       hash_min_degree, verbose, return_info)


def sorensen(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
             dtype=np.float32, variant="auto", hash_min_degree=HASH_MIN_DEGREE, verbose=False, return_info=False):
    """Sorensen-Dice similarity ``2 |N(i) ∩ N(j)| / (|N(i)| + |N(j)|)`` on every stored entry.

    Weighted: ``2 Σ_∩ min(w_ik, w_jk) / (W_i + W_j)``.  Parameters as :func:`jaccard`.
    """
    return _similarity("sorensen", G, weighted, self_loops, backend, device, n_threads, dtype, variant,
                       hash_min_degree, verbose, return_info)


def overlap(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
            dtype=np.float32, variant="auto", hash_min_degree=HASH_MIN_DEGREE, verbose=False, return_info=False):
    """Overlap (Szymkiewicz-Simpson) similarity ``|N(i) ∩ N(j)| / min(|N(i)|, |N(j)|)``.

    Weighted: ``Σ_∩ min(w_ik, w_jk) / min(W_i, W_j)``.  Parameters as :func:`jaccard`.
    """
    return _similarity("overlap", G, weighted, self_loops, backend, device, n_threads, dtype, variant,
                       hash_min_degree, verbose, return_info)


# --------------------------------------------------------------------------- input


class SymmetricPattern:
    """A validated symmetric CSR: int64 ``indptr``, sorted int32 ``indices``, float64 weights or
    None; ``owns_indices`` says whether ``indices`` is a private array (else the caller's);
    ``figures``: the row lengths' DegreeFigures where the caller has them."""

    __slots__ = ("n", "indptr", "indices", "weights", "owns_indices", "_degrees", "_figures")

    def __init__(self, n, indptr, indices, weights, owns_indices=False, figures=None):
        self.n = n
        self.indptr = indptr
        self.indices = indices
        self.weights = weights
        self.owns_indices = owns_indices
        self._degrees = None
        self._figures = figures

    @property
    def figures(self):
        """The row lengths' :class:`~graphkern.similarity.plan.DegreeFigures`, computed once."""
        if self._figures is None:
            self._figures = DegreeFigures.of(self.degrees)
        return self._figures

    @property
    def nnz(self):
        return len(self.indices)

    @property
    def degrees(self):
        """Row lengths (int64), computed once."""
        if self._degrees is None:
            self._degrees = np.diff(self.indptr)
        return self._degrees


def symmetric_pattern(G, *, weighted=False, n_threads=1):
    """Validate ``G`` (Graph or square scipy.sparse) into a :class:`SymmetricPattern`
    (``n_threads``: of the pass over its row pointers)."""
    if not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"weighted must be True or False, got {weighted!r}")
    source = G.indices if isinstance(G, (Graph, sp.csr_matrix, sp.csr_array)) else None
    if isinstance(G, Graph):
        # A Graph built with validate=False arrives unchecked, and the kernels index with its
        # arrays: they are checked at the point of use, once per Graph (its arrays are read-only;
        # a validated Graph passes at once), and a problem is worded by the CSR index check.
        try:
            G.require_valid()
        except ValueError:
            _check_csr_indices(G.indptr, G.indices, G.n_nodes)
            raise
    A, _ = as_csr_matrix(G, name="G")  # square, symmetric values, finite, duplicates summed
    n = A.shape[0]
    if n > INT32_MAX:
        raise ValueError(f"G has {n} nodes; at most {INT32_MAX} are supported")
    if not A.has_sorted_indices:
        A = A.sorted_indices()
    indptr, figures = _row_pointers(A.indptr, n_threads)
    indices = A.indices.astype(np.int32, copy=False)
    weights = None
    if weighted:
        weights = np.asarray(A.data, dtype=np.float64)
        if weights.size and weights.min() < 0:
            k = int(np.flatnonzero(weights < 0)[0])
            i = int(np.searchsorted(indptr, k, side="right") - 1)
            raise ValueError(f"G has a negative weight {weights[k]} at ({i}, {int(indices[k])}); "
                             "weighted similarity needs non-negative weights")
    owns = source is None or not np.may_share_memory(indices, source)
    return SymmetricPattern(n, indptr, indices, weights, owns_indices=owns, figures=figures)


def _row_pointers(indptr, n_threads):
    """The row pointers as a new int64 array (the input's own where it is int64) and their
    DegreeFigures, in one compiled pass."""
    from graphkern._cpu.jaccard import row_figures

    wide, top, nonempty = row_figures(indptr, n_threads)
    return wide, DegreeFigures(wide.size - 1, int(wide[-1] - wide[0]), top, nonempty)


def unchecked_pattern(G, *, weighted=False, n_threads=1, scan=True):
    """``(pattern, values)`` of a scipy CSR ``G`` taken as it is, with O(n) host work and one
    pass over its values, for a check on the device: the SymmetricPattern holds ``G``'s own
    arrays (int64 row pointers by conversion) and ``values`` its stored values for that check,
    or None where every value has the bits of the first and that value is finite (and
    non-negative when ``weighted``): such values are symmetric wherever the pattern is, and
    need not cross to the device.  None where the host path must run: not a CSR, not square, no
    entries, int64 columns (their int32 conversion needs a range check), a value type the device
    check does not read, or arrays SciPy would refuse.  ``scan=False`` leaves the values unscanned
    (always returned) for a caller that runs :func:`values_need_check` later itself.
    """
    if not isinstance(G, (sp.csr_matrix, sp.csr_array)) or G.ndim != 2 or G.shape[0] != G.shape[1]:
        return None
    n, data, indices, indptr = G.shape[0], G.data, G.indices, G.indptr
    if (n > INT32_MAX or data.dtype.kind not in "fiub" or data.dtype.itemsize not in (1, 2, 4, 8)
            or indices.dtype != np.int32 or indptr.dtype.kind != "i" or indptr.shape != (n + 1,)
            or indices.ndim != 1 or data.shape != indices.shape or indices.size == 0):
        return None
    values = np.ascontiguousarray(data)
    weights = np.asarray(values, dtype=np.float64) if weighted else None
    wide, figures = _row_pointers(indptr, n_threads)
    pattern = SymmetricPattern(n, wide, np.ascontiguousarray(indices), weights, owns_indices=False, figures=figures)
    if scan and not values_need_check(values, weighted, n_threads):
        values = None
    return pattern, values


def values_need_check(values, weighted, n_threads):
    """False when every one of the stored ``values`` has the bits of the first and that value is
    finite (and non-negative when ``weighted``): then they are symmetric wherever the pattern is,
    and only the pattern needs a check.  One parallel pass."""
    from graphkern._cpu.jaccard import uniform_values

    first = values[0]
    return not ((values.dtype.kind != "f" or np.isfinite(first)) and not (weighted and first < 0)
                and uniform_values(values, n_threads))


def _check_csr_indices(indptr, indices, n):
    """Row pointers from 0 to nnz, never decreasing, and every column in [0, n), else ValueError."""
    nnz = indices.size
    if indptr.size != n + 1 or indptr[0] != 0 or indptr[-1] != nnz or (n and np.diff(indptr).min() < 0):
        raise ValueError(f"G's row pointers are not a valid CSR of {n} rows and {nnz} entries "
                         "(start at 0, never decrease, end at the number of entries)")
    if nnz and (indices.min() < 0 or indices.max() >= n):
        k = int(np.flatnonzero((indices < 0) | (indices >= n))[0])
        i = int(np.searchsorted(indptr, k, side="right") - 1)
        raise ValueError(f"G has a column index {int(indices[k])} out of range [0, {n}) in row {i}")


def weight_scaling(pattern, dtype, backend, self_loops):
    """The type the weighted sums run in and the power of two the weights are scaled by.

    The largest sum a kernel forms is below ``2 (d_max + 1) w_max`` (W_i + W_j, with a vertex's
    own unit weight): where that may pass a quarter of ``dtype``'s range, float32 sums run in
    float64, and where it may pass a quarter of float64's, the weights are scaled by 2^-k first.
    """
    if pattern.weights is None or pattern.nnz == 0:
        return np.dtype(dtype), 0
    w_max = float(pattern.weights.max())
    d_max = pattern.figures.top
    with np.errstate(over="ignore"):
        bound = 2.0 * (d_max + 1) * w_max
    if bound < float(np.finfo(dtype).max) / 4:
        return np.dtype(dtype), 0
    if bound < float(np.finfo(np.float64).max) / 4:
        return np.dtype(np.float64), 0
    _, e = np.frexp(w_max)  # w_max < 2^e
    k = int(e) + 1 + int(d_max).bit_length() - 1022  # 2 (d_max + 1) w_max 2^-k <= 2^1022
    if backend == "gpu" and self_loops:
        rows = np.repeat(np.arange(pattern.n, dtype=np.int64), pattern.degrees)
        if np.count_nonzero(rows == pattern.indices) < pattern.n:
            raise ValueError("G's weight sums overflow float64, and the GPU kernels cannot scale them with "
                             "self_loops=True while a vertex has no stored self-loop (its own weight is a fixed 1): "
                             "use backend='cpu', store the self-loops, or scale the weights down")
    return np.dtype(np.float64), k


# --------------------------------------------------------------------------- dispatch


def _similarity(metric, G, weighted, self_loops, backend, device, n_threads, dtype, variant, hash_min_degree,
                verbose, return_info):
    t0 = time.perf_counter()
    if not isinstance(self_loops, (bool, np.bool_)):
        raise TypeError(f"self_loops must be True or False, got {self_loops!r}")
    options = DeviceOptions(variant=variant, hash_min_degree=hash_min_degree)
    dtype = resolve_dtype(dtype)
    backend = resolve_backend(backend)
    n_threads = resolve_threads(n_threads)
    if backend == "gpu":
        devices = resolve_devices(device)
        if len(devices) != 1:
            raise ValueError(f"{metric} runs on one device; got devices {devices}")
    if not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"weighted must be True or False, got {weighted!r}")
    times = {}
    csr = pattern = None
    # an unweighted result does not read the stored values: they are scanned while the kernels run,
    # and only values that are not all the same go to the device for their check, after them
    deferred = None
    unchecked = (unchecked_pattern(G, weighted=weighted, n_threads=n_threads, scan=bool(weighted))
                 if backend == "gpu" else None)
    if unchecked is not None:  # checked on the device after the upload; the host path names any problem
        from graphkern._cuda import runtime as rt
        from graphkern.similarity.gpu import DeviceCSR

        pattern, values = unchecked
        if not weighted:
            deferred, values = values, None
        try:
            csr = DeviceCSR(rt.get_device(devices[0]), pattern)
        except GraphTooLargeError:  # the host path checks first, then refuses it with the plan's size
            pattern = None
        if csr is not None and csr.check(values, check_negative=weighted, times=times):
            csr = pattern = None
    if pattern is None:
        deferred = None
        pattern = symmetric_pattern(G, weighted=weighted, n_threads=n_threads)
    compute_dtype, scale = weight_scaling(pattern, dtype, backend, bool(self_loops))
    times["validate"] = time.perf_counter() - t0 - times.get("upload", 0.0) - times.get("validate_device", 0.0)
    recorded = dict(weighted=bool(weighted), self_loops=bool(self_loops), variant=variant,
                    hash_min_degree=int(hash_min_degree))
    plan = {}
    ran = "cpu"
    arrays = []  # the result's indices (its own copy where they are the caller's) and row pointers

    def result_arrays():
        from graphkern._cpu.jaccard import parallel_copy

        arrays.append(pattern.indices if pattern.owns_indices
                      else parallel_copy(np.ascontiguousarray(pattern.indices), n_threads))
        # int32 row pointers where they fit, as SciPy would choose them (its own narrowing scans them)
        arrays.append(pattern.indptr.astype(np.int32 if pattern.nnz <= INT32_MAX else np.int64))

    if backend == "gpu":
        from graphkern.similarity.gpu import gpu_values

        recorded["device"] = devices[0]
        unsure = []  # whether the deferred values need their check on the device

        def while_computing():
            result_arrays()
            if deferred is not None:
                unsure.append(values_need_check(deferred, False, n_threads))

        values, ran, plan = gpu_values(pattern, METRICS[metric], bool(self_loops), compute_dtype, devices[0],
                                       options, scale=scale, n_threads=n_threads, verbose=verbose, times=times,
                                       while_computing=while_computing, csr=csr)
        if unsure and unsure[0] and csr.check_values(deferred, times=times):
            symmetric_pattern(G, weighted=weighted, n_threads=n_threads)  # raises, naming the problem
    else:
        from graphkern.similarity.cpu import cpu_values

        recorded["n_threads"] = n_threads
        values = cpu_values(pattern, METRICS[metric], bool(self_loops), compute_dtype, n_threads, scale=scale,
                            verbose=verbose, times=times)
    if values.dtype != dtype:
        values = values.astype(dtype)
    if not arrays:
        result_arrays()
    result = sp.csr_matrix((values, arrays[0], arrays[1]), shape=(pattern.n, pattern.n))
    result.has_sorted_indices = True
    if not return_info:
        return result
    times["total"] = time.perf_counter() - t0
    info = SimilarityInfo(metric=metric, backend=backend, dtype=dtype.name, variant=ran, options=recorded,
                          compute_dtype=compute_dtype.name, weight_scale=float(np.ldexp(1.0, -scale)), plan=plan,
                          times=times)
    return result, info

