"""Jaccard, Sorensen and overlap similarity of the two endpoints of every stored edge.

For each stored entry ``(i, j)`` of a symmetric adjacency matrix ``A`` the result holds

* :func:`jaccard`:  ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|``,
* :func:`sorensen`: ``2 |N(i) ∩ N(j)| / (|N(i)| + |N(j)|)``,
* :func:`overlap`:  ``|N(i) ∩ N(j)| / min(|N(i)|, |N(j)|)``,

as a ``scipy.sparse.csr_matrix`` with exactly the pattern of ``A``: the same stored entries
(explicit zeros included), sorted indices, duplicates of a COO input summed first.

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
  ``dtype``; backends agree to rounding.

GPU variants (``variant=``): ``"element"`` (the element-parallel baseline of the paper: a thread
per stored entry merges both neighbour lists), ``"binary"`` (a thread per upper-triangle entry
searches each element of the shorter list in the longer one), ``"warp"`` (a group of lanes per
entry shares that search), ``"balanced"`` (the searches of all entries laid end to end and cut
into equal chunks, for skewed degree distributions), and ``"auto"``, which picks one from the
degree distribution (:func:`choose_variant`).  All but ``"element"`` compute each undirected
pair once and write it to both ``(i, j)`` and ``(j, i)``.  The CPU backend has one method and
ignores ``variant``.
"""

from __future__ import annotations


import numpy as np
import scipy.sparse as sp

from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern.graph import as_csr_matrix

__all__ = ["jaccard", "sorensen", "overlap", "choose_variant", "VARIANTS"]

VARIANTS = ("auto", "element", "binary", "warp", "balanced")
_METRICS = {"jaccard": 0, "sorensen": 1, "overlap": 2}
_INT32_MAX = np.iinfo(np.int32).max
# Per-thread marks of the CPU kernel cost 4 bytes per node each; beyond this many bytes in all,
# fewer threads are used rather than exhausting host memory on huge sparse graphs.
_CPU_MARK_BYTES = 4 << 30

# ---- GPU launch shapes (the constants of cuda_src/jaccard.cu)
_BLOCK = 256
_SCAN_TILE = 256 * 16          # kBlock * kScanItems
_BALANCED_CHUNK = 32           # searches per thread in the balanced variant
_MAX_GRID = 2**31 - 1


def jaccard(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
            dtype=np.float32, variant="auto"):
    """Jaccard similarity ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|`` on every stored entry of ``G``.

    Parameters
    ----------
    G : Graph or scipy.sparse matrix
        A symmetric adjacency (square; duplicates of a COO matrix are summed).
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
        Output type; weighted sums also run in it.
    variant : str
        GPU kernel, one of :data:`VARIANTS`; ignored by the CPU backend.

    Returns
    -------
    scipy.sparse.csr_matrix with the pattern of ``G``.  See the module docstring for the
    conventions (self-loops, diagonal, empty sets).
    """
    return _similarity("jaccard", G, weighted=weighted, self_loops=self_loops, backend=backend, device=device,
                       n_threads=n_threads, dtype=dtype, variant=variant)


def sorensen(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
             dtype=np.float32, variant="auto"):
    """Sorensen-Dice similarity ``2 |N(i) ∩ N(j)| / (|N(i)| + |N(j)|)`` on every stored entry.

    Weighted: ``2 Σ_∩ min(w_ik, w_jk) / (W_i + W_j)``.  Parameters as :func:`jaccard`.
    """
    return _similarity("sorensen", G, weighted=weighted, self_loops=self_loops, backend=backend, device=device,
                       n_threads=n_threads, dtype=dtype, variant=variant)


def overlap(G, *, weighted=False, self_loops=False, backend="auto", device=None, n_threads=None,
            dtype=np.float32, variant="auto"):
    """Overlap (Szymkiewicz-Simpson) similarity ``|N(i) ∩ N(j)| / min(|N(i)|, |N(j)|)``.

    Weighted: ``Σ_∩ min(w_ik, w_jk) / min(W_i, W_j)``.  Parameters as :func:`jaccard`.
    """
    return _similarity("overlap", G, weighted=weighted, self_loops=self_loops, backend=backend, device=device,
                       n_threads=n_threads, dtype=dtype, variant=variant)


# --------------------------------------------------------------------------- input


class SymmetricPattern:
    """A validated symmetric CSR: int64 ``indptr``, sorted int32 ``indices``, float64 weights or None."""

    __slots__ = ("n", "indptr", "indices", "weights")

    def __init__(self, n, indptr, indices, weights):
        self.n = n
        self.indptr = indptr
        self.indices = indices
        self.weights = weights

    @property
    def nnz(self):
        return len(self.indices)

    @property
    def degrees(self):
        return np.diff(self.indptr)


def symmetric_pattern(G, *, weighted=False):
    """Validate ``G`` (Graph or square scipy.sparse) into a :class:`SymmetricPattern`."""
    if not isinstance(weighted, (bool, np.bool_)):
        raise TypeError(f"weighted must be True or False, got {weighted!r}")
    A, _ = as_csr_matrix(G, name="G")  # square, symmetric values, finite, duplicates summed
    n = A.shape[0]
    if n > _INT32_MAX:
        raise ValueError(f"G has {n} nodes; at most {_INT32_MAX} are supported")
    if not A.has_sorted_indices:
        A = A.sorted_indices()
    data = A.data
    weights = None
    if weighted:
        weights = np.asarray(data, dtype=np.float64)
        if np.any(weights < 0):
            k = int(np.flatnonzero(weights < 0)[0])
            i = int(np.searchsorted(A.indptr, k, side="right") - 1)
            raise ValueError(f"G has a negative weight {weights[k]} at ({i}, {int(A.indices[k])}); "
                             "weighted similarity needs non-negative weights")
    return SymmetricPattern(n, A.indptr.astype(np.int64), A.indices.astype(np.int32, copy=False), weights)


# --------------------------------------------------------------------------- dispatch


def _similarity(metric, G, *, weighted, self_loops, backend, device, n_threads, dtype, variant):
    if not isinstance(self_loops, (bool, np.bool_)):
        raise TypeError(f"self_loops must be True or False, got {self_loops!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {variant!r}")
    dtype = resolve_dtype(dtype)
    pattern = symmetric_pattern(G, weighted=weighted)
    backend = resolve_backend(backend)
    n_threads = resolve_threads(n_threads)
    if backend == "gpu":
        devices = resolve_devices(device)
        if len(devices) != 1:
            raise ValueError(f"{metric} runs on one device; got devices {devices}")
    if pattern.nnz == 0:
        values = np.zeros(0, dtype=dtype)
    elif backend == "gpu":
        values = _gpu_values(pattern, _METRICS[metric], bool(self_loops), dtype, devices[0], variant)
    else:
        values = _cpu_values(pattern, _METRICS[metric], bool(self_loops), dtype, n_threads)
    # pattern.indptr is a fresh copy; pattern.indices may be the caller's array
    result = sp.csr_matrix((values, pattern.indices.copy(), pattern.indptr), shape=(pattern.n, pattern.n))
    result.has_sorted_indices = True
    return result


def _cpu_values(pattern, metric, self_loops, dtype, n_threads):
    try:
        from graphkern._cpu import jaccard as cpu_kernels
    except ImportError as exc:  # pragma: no cover - depends on the build
        raise ImportError(f"the CPU Jaccard kernels are not built ({exc}); reinstall graphkern") from None
    n_threads = max(1, min(n_threads, _CPU_MARK_BYTES // max(1, 4 * pattern.n)))
    weighted = pattern.weights is not None
    weights = pattern.weights.astype(dtype) if weighted else np.zeros(0, dtype=dtype)
    out = np.empty(pattern.nnz, dtype=dtype)
    cpu_kernels.similarity(pattern.indptr, pattern.indices, weights, out, metric, weighted, self_loops, n_threads)
    return out


def _gpu_values(pattern, metric, self_loops, dtype, device, variant):
    from graphkern._cuda import runtime as rt

    dev = rt.get_device(device)
    stream = rt.Stream(dev)
    run = DeviceSimilarity(dev, pattern, metric=metric, self_loops=self_loops, dtype=dtype, variant=variant,
                           stream=stream)
    run.upload()
    run.compute()
    out = np.empty(pattern.nnz, dtype=dtype)
    run.download(out)
    return out


# --------------------------------------------------------------------------- GPU


def choose_variant(degrees):
    """The GPU variant ``variant="auto"`` uses for a graph with these row lengths.

    Chosen from the measured variants on an H200 (graphkern-bench jaccard, 2026-11-26):
    short lists everywhere (max degree <= 32: Watts-Strogatz, Delaunay) favour a thread per
    entry merging both lists (``"element"``, 0.05 ms for 10^6 entries); moderately skewed
    graphs (Barabasi-Albert, R-MAT scale 14, hubs of 10^3-10^4) favour a group of lanes per
    entry (``"warp"``, 2.1x element); only hubs past 8192 that dwarf the mean (Chung-Lu's
    180k hub) need the work-balanced decomposition (``"balanced"``), which matched warp at a
    20k hub and is the one whose cost stays proportional to the work beyond it.
    """
    d = np.asarray(degrees)
    d = d[d > 0]
    if d.size == 0:
        return "element"
    mean, top = float(d.mean()), int(d.max())
    if top <= 32:
        return "element"
    if top >= 8192 and top > 64 * mean:
        return "balanced"
    return "warp"


def warp_group_size(degrees):
    """Lanes per entry of the ``"warp"`` variant: about half the mean degree, 4 to 32."""
    d = np.asarray(degrees)
    d = d[d > 0]
    mean = float(d.mean()) if d.size else 1.0
    g = 4
    while g < 32 and g < mean / 2:
        g *= 2
    return g


class DeviceSimilarity:
    """One graph's CSR on a device and the buffers of one similarity computation on ``stream``.

    :func:`jaccard` and friends call :meth:`upload`, :meth:`compute`, :meth:`download`; the
    benchmark times :meth:`compute` alone (no host-device copies) and the three together.
    The output is poisoned with NaN at allocation, so an entry no kernel writes shows.
    """

    def __init__(self, dev, pattern, *, metric, self_loops, dtype, variant="auto", stream=None):
        from graphkern._cuda import runtime as rt

        self.rt = rt
        self.dev = dev
        self.stream = stream if stream is not None else rt.Stream(dev)
        self.pattern = pattern
        self.metric = int(metric)
        self.self_loops = bool(self_loops)
        self.dtype = np.dtype(dtype)
        self.weighted = pattern.weights is not None
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {variant!r}")
        degrees = pattern.degrees
        self.variant = choose_variant(degrees) if variant == "auto" else variant
        self.group = warp_group_size(degrees)
        n, nnz, s = pattern.n, pattern.nnz, self.dtype.itemsize
        if nnz == 0:
            raise ValueError("DeviceSimilarity needs at least one stored entry")
        self.n_tiles = -(-nnz // _SCAN_TILE)
        entries_per_block = _BLOCK // self.group if self.variant == "warp" else _BLOCK
        if -(-nnz // entries_per_block) > _MAX_GRID:
            raise ValueError(f"G has {nnz} stored entries, too many for one launch of the {self.variant!r} variant")

        sizes = {"indptr": 8 * (n + 1), "indices": 4 * nnz, "out": s * nnz}
        if self.weighted:
            sizes.update(weights=s * nnz, wsum=s * n, selfw=s * n)
        else:
            sizes.update(deg=4 * n, adj=4 * n)
        if self.variant == "balanced":
            sizes.update(rows=4 * nnz, offsets=8 * (nnz + 1), tile_sums=8 * self.n_tiles,
                         inter=(s if self.weighted else 4) * nnz)
        self.nbytes = sum(sizes.values())
        rt.check_fits(dev, self.nbytes, f"{('weighted ' if self.weighted else '')}similarity ({self.variant} "
                      f"variant) of a graph with {n} nodes and {nnz} stored entries")

        def alloc(name, count, dt):
            return rt.alloc(dev, (count,), dt) if name in sizes else None

        self.indptr = alloc("indptr", n + 1, np.int64)
        self.indices = alloc("indices", nnz, np.int32)
        self.weights = alloc("weights", nnz, self.dtype)
        self.out = alloc("out", nnz, self.dtype)
        self.deg = alloc("deg", n, np.int32)
        self.adj = alloc("adj", n, np.int32)
        self.wsum = alloc("wsum", n, self.dtype)
        self.selfw = alloc("selfw", n, self.dtype)
        self.rows = alloc("rows", nnz, np.int32)
        self.offsets = alloc("offsets", nnz + 1, np.int64)
        self.tile_sums = alloc("tile_sums", self.n_tiles, np.int64)
        self.inter = alloc("inter", nnz, self.dtype if self.weighted else np.int32)
        self.out.memset32(0x7FC00000)  # NaN in float32, and a NaN pattern in float64

        self._host_weights = pattern.weights.astype(self.dtype) if self.weighted else None
        flavour = f"{'weight' if self.weighted else 'count'}_{'f32' if self.dtype == np.float32 else 'f64'}"
        self._fn = {name: rt.kernel(dev, "jaccard", f"jaccard_{name}_{flavour}")
                    for name in ("element", "binary", "warp", "balanced", "finalize")}
        self._fn_vertex = (rt.kernel(dev, "jaccard", f"jaccard_vertex_weights_{flavour[-3:]}") if self.weighted
                           else rt.kernel(dev, "jaccard", "jaccard_vertex_counts"))
        self._fn_work = rt.kernel(dev, "jaccard", "jaccard_balanced_work")
        self._fn_scan_sums = rt.kernel(dev, "jaccard", "jaccard_scan_tile_sums")
        self._fn_scan_tiles = rt.kernel(dev, "jaccard", "jaccard_scan_tiles")
        sms = dev.properties["multiprocessor_count"]
        self._balanced_grid = sms * max(1, self._fn["balanced"].max_active_blocks_per_sm(_BLOCK, 0))

    def upload(self):
        """Copy the CSR (and weights) to the device, on the stream."""
        self.indptr.copy_from_host(self.pattern.indptr, self.stream)
        self.indices.copy_from_host(self.pattern.indices, self.stream)
        if self.weighted:
            self.weights.copy_from_host(self._host_weights, self.stream)

    def compute(self):
        """Enqueue every kernel of the chosen variant on the stream (no copies, no host waits)."""
        rt, st, p = self.rt, self.stream, self.pattern
        n, nnz = p.n, p.nnz
        n32, nnz64 = np.int32(n), np.int64(nnz)
        scalar = self.dtype.type
        if self.weighted:
            rt.launch(self._fn_vertex, -(-n // (_BLOCK // 32)), _BLOCK,
                      (self.indptr, self.indices, self.weights, n32, np.int32(self.self_loops), self.wsum,
                       self.selfw), stream=st)
        else:
            rt.launch(self._fn_vertex, -(-n // _BLOCK), _BLOCK,
                      (self.indptr, self.indices, n32, np.int32(self.self_loops), self.deg, self.adj), stream=st)
        common = (self.indptr, self.indices, self.weights, n32, nnz64, np.int32(self.metric), self.deg, self.adj,
                  self.wsum, self.selfw, scalar(1 if self.self_loops else -1), self.out)
        entry_grid = -(-nnz // _BLOCK)
        if self.variant in ("element", "binary"):
            rt.launch(self._fn[self.variant], entry_grid, _BLOCK, common, stream=st)
        elif self.variant == "warp":
            rt.launch(self._fn["warp"], -(-nnz // (_BLOCK // self.group)), _BLOCK, common + (np.int32(self.group),),
                      stream=st)
        else:
            self.inter.zero(st)
            rt.launch(self._fn_work, self.n_tiles, _BLOCK,
                      (self.indptr, self.indices, n32, nnz64, self.rows, self.offsets, self.tile_sums), stream=st)
            total = self.offsets.view(8 * nnz, 8, dtype=np.int64, shape=(1,))
            rt.launch(self._fn_scan_sums, 1, 1024, (self.tile_sums, np.int64(self.n_tiles), total), stream=st)
            rt.launch(self._fn_scan_tiles, self.n_tiles, _BLOCK, (self.offsets, nnz64, self.tile_sums), stream=st)
            rt.launch(self._fn["balanced"], self._balanced_grid, _BLOCK,
                      (self.indptr, self.indices, self.weights, self.rows, self.offsets, nnz64,
                       np.int32(_BALANCED_CHUNK), self.inter), stream=st)
            rt.launch(self._fn["finalize"], entry_grid, _BLOCK, common + (self.rows, self.inter), stream=st)

    def download(self, out):
        """Copy the result into the host array ``out`` and wait for the stream."""
        self.out.copy_to_host(out, self.stream)
        self.stream.synchronize()
        return out
