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
into equal chunks, for skewed degree distributions), ``"hub"`` (balanced, with a bitmap of the
neighbour set of each of the highest-degree vertices, so that looking an element up in a hub's
list is one bit test; unweighted only, weighted ``"hub"`` runs as ``"balanced"``),
``"shortrow"`` (graphs whose rows all have at most 32 entries: a group of lanes per row holds
its list and tests the lists of its neighbours against it, in one launch; other graphs are a
ValueError), ``"pair"`` (for short lists: a block lists the upper-triangle entries of a range
of rows in shared memory and every thread merges the two lists of one of them, in one launch;
correct on any graph, slow past a few hundred entries per row), ``"staged"`` (``"pair"`` with
each block's rows first copied into shared memory, so that the pairs between two of a block's
rows merge there: for graphs stored in an order that keeps neighbours close, such as meshes,
small-world rings and road networks; a block with too many entries to stage reads global memory;
weighted ``"staged"`` runs as ``"pair"``), ``"window"`` (for banded orders: each row becomes a 64-bit
mask of its neighbours within 32 of its own index plus a list of at most 4 farther ones, and a
pair (i, j) with |i - j| < 32 is a popcount of the two masks and a few lookups, with no merge;
the other pairs are merged as in ``"pair"``, so it is correct on any graph; weighted
``"window"`` runs as ``"pair"``),
``"longrow"`` (``"hub"`` with
every pair's work carried by its longer list, so that consecutive searches hit one list or one
bitmap, and each pair finished from that side; unweighted, a list of at least 128 entries
without a bitmap gets a hash table, so that a search in it is mostly one 16-byte load, and
fewer lists get bitmaps; weighted ``"longrow"`` has no bitmaps or tables), and
``"auto"``, which picks one from the degree distribution (:func:`choose_variant`).  All but ``"element"`` compute each undirected pair once and write it
to both ``(i, j)`` and ``(j, i)``.  The CPU backend has one method and ignores ``variant``.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern.graph import as_csr_matrix

__all__ = ["jaccard", "sorensen", "overlap", "choose_variant", "VARIANTS"]

VARIANTS = ("auto", "element", "binary", "warp", "balanced", "hub", "shortrow", "pair", "staged", "window",
            "longrow")
_METRICS = {"jaccard": 0, "sorensen": 1, "overlap": 2}
_INT32_MAX = np.iinfo(np.int32).max
# Per-thread marks of the CPU kernel cost 4 bytes per node each; beyond this many bytes in all,
# fewer threads are used rather than exhausting host memory on huge sparse graphs.
_CPU_MARK_BYTES = 4 << 30

# ---- GPU launch shapes (the constants of cuda_src/jaccard.cu)
_BLOCK = 256
_SCAN_TILE = 256 * 16          # kBlock * kScanItems
# H100 sweep of 2026-11-26 (Chung-Lu 2M): chunk 8 beat 16 and 32 in hub and longrow
_BALANCED_CHUNK = 8            # searches per thread in the balanced, hub and longrow variants
# H100 sweep of 2026-11-26 (Watts-Strogatz 100k, k=10): 192 rows per block (960 upper entries)
# was the fastest, 48 to 256 within 10%
_PAIR_ENTRIES_PER_BLOCK = 960  # "pair": rows per block sized for about this many upper entries
_STAGE_CAP = 2048              # "staged": column indices a block copies to shared memory (kStageCap)
_STAGE_FILL = 0.8              # "staged": rows per block sized for this share of _STAGE_CAP at the mean degree
# auto: "staged" over "pair" when this share of entries stays in a block (H200: Watts-Strogatz
# ring order, locality 0.88, staged 4% faster; Delaunay RCM 0.37, a tie; random order 0.0, 8% slower)
_STAGE_MIN_LOCALITY = 0.5
_STAGED_VARIANTS = ("staged", "window")  # unweighted kernels that stage the block's rows in shared memory
_WINDOW_HALF = 32              # "window": row r's mask covers the vertices [r - 32, r + 32) (kWinHalf)
_WINDOW_FAR = 4                # "window": entries outside its window a row may have for the fast path (kWinFar)
_WINDOW_MIN_LOCALITY = 0.5     # auto: "window" where this share of pairs takes the fast path
_PAIR_WIDTHS = (1, 2, 4)       # "pair": column indices per load of its merge (1: element by element)
# H100 sweep of 2026-11-26 (Watts-Strogatz 100k, k=10, rows/block 192): width 1 0.0250 ms, 2
# 0.0288 ms, 4 0.0298 ms: the vector merge's extra compares cost more than its fewer loads save
_PAIR_WIDTH = 1
# The vector merge pads rows with the indices 2^31 - 2 and 2^31 - 1, so it needs every vertex
# index below them; the index buffer is padded to a multiple of 4 for its aligned loads.
_PAIR_VECTOR_MAX_NODES = _INT32_MAX - 2
_INDEX_PADDING = 4
_BITMAP_VARIANTS = ("hub", "longrow")
_WORK_LINE_VARIANTS = ("balanced", "hub", "longrow")
_MAX_GRID = 2**31 - 1
_SHORTROW_MAX_DEGREE = 32      # a row's group of lanes is at most a warp
# The hub variant's bitmaps: vertices of at least this degree, highest first, as many as fit in
# min(_HUB_MAX_BYTES, _HUB_FREE_FRACTION of the device's free memory).  A bit test replaces a
# gallop through a list of this length or more; below it the list is a few cache lines anyway.
_HUB_MIN_DEGREE = 64
# H100 sweep of 2026-11-26, longrow on Chung-Lu 2M: 0.25 GiB (bitmaps of degree >= 1198) beat
# 0.5 and 1 GiB; a bit test is a random L2 sector, a gallop through a list of ~10^3 is L1 hits.
_HUB_MAX_BYTES = 1 << 28
_HUB_FREE_FRACTION = 0.1
# "longrow", unweighted: a row of at least this degree without a bitmap gets an open-addressing
# hash table of its columns (max(4, 2^ceil(log2(2 d))) int32 slots; see hash_table_rows), so
# that looking a short row's element up in it is mostly one 16-byte load instead of a gallop of
# ~2 log2(d_long / d_short) + 1 dependent loads; 0: no tables (and _HUB_MAX_BYTES, as before
# the tables).  The environment variable GRAPHKERN_JACCARD_HASH_MIN_DEGREE (an integer >= 0),
# read when a DeviceSimilarity is made, overrides it for experiments.  H100 sweep of
# 2026-11-26, longrow on Chung-Lu 2M (17.4 ms without tables): with 32 MiB of bitmaps, tables
# from degree 64 14.56 ms, 96 14.47, 128 14.53, 192 14.52, 256 14.64, 512 15.10; with 0.25 GiB
# of bitmaps, from 32 18.2, 128 17.7, 256 17.1: a gallop through a short, L1-resident list
# costs about what a lookup does, and the build does not pay there (an atomic per entry: 0.50
# ms for the 11.7M entries of the rows from degree 32).  Using a table only for pairs
# with d_long >= 4, 8 or 16 d_short was slower (16.7, 17.9, 18.8 ms from degree 128).  R-MAT
# scale 20 went the other way: 68.4 ms without tables, 71.8 with these settings.
_HASH_MIN_DEGREE = 128
_HASH_MIN_DEGREE_ENV = "GRAPHKERN_JACCARD_HASH_MIN_DEGREE"
# "longrow" with tables: the bitmaps' cap in place of _HUB_MAX_BYTES, so that rows of 10^3 to
# 10^4 entries get tables (8 to 64 KiB at load 3/8) instead of bitmaps (n / 8 bytes, 250 KiB at
# n = 2M), whose bit tests are random L2 sectors: in the same sweep, tables from degree 256 and
# bitmaps of 0.25 GiB (degree >= 1198) 17.1 ms, 128 MiB (>= 2011) 15.5, 48 MiB (>= 4181) 14.7,
# 32 MiB (>= 5625) 14.6, 16 MiB (>= 9357) 14.9, 8 MiB 15.1, none 15.5.
_HASH_HUB_MAX_BYTES = 1 << 25


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


def choose_variant(degrees, locality=None, window=None):
    """The GPU variant ``variant="auto"`` uses for a graph with these row lengths (and
    ``locality``, :func:`row_locality` at the staged variant's rows per block, and ``window``,
    :func:`window_locality`, when known).

    From the H100 sweep of 2026-11-26 (device time only; the H200 sweep before it ranked the
    others the same): short lists everywhere (max degree <= 32: Watts-Strogatz, Delaunay) favour
    computing each pair once by a thread that merges both lists (``"pair"``, 0.025 ms for 10^6
    entries against 0.048 for ``"element"`` and 0.085 for ``"shortrow"``), staged in shared memory
    block by block where at least half the entries stay inside a block (``"staged"``, H200 sweep
    of the fourth session: Watts-Strogatz in ring order 0.0259 ms against 0.0269 for ``"pair"``;
    a Delaunay graph in RCM order ties, in random order staging is 8% slower); moderately skewed
    graphs (Barabasi-Albert, hubs of 10^3) favour a group of lanes per entry (``"warp"``, 2.4x
    element; ``"pair"`` is slow there: one thread merges a hub's list); hubs past 8192 that dwarf
    the mean favour the work line carried by each pair's long list, with bitmaps of the largest
    lists (``"longrow"``, chunk 8, 0.25 GiB of bitmaps: Chung-Lu 2M, 180k hub, 25.0 ms against
    29.3 for ``"hub"``, 38 for ``"balanced"`` and 49 for ``"warp"``).  Weighted graphs run
    ``"longrow"`` without bitmaps.  Short lists in a banded order where at least half the pairs
    are within 32 of each other (``window`` >= 0.5) favour the row masks (``"window"``, H100 sweep
    of the fifth session: Watts-Strogatz in ring order, window locality 0.90, 0.0214 ms against
    0.0247 for ``"staged"``; Delaunay in RCM order, 0.375, is twice as slow as ``"pair"`` there).
    """
    d = np.asarray(degrees)
    d = d[d > 0]
    if d.size == 0:
        return "element"
    mean, top = float(d.mean()), int(d.max())
    if top <= 32:
        if window is not None and window >= _WINDOW_MIN_LOCALITY:
            return "window"
        return "staged" if locality is not None and locality >= _STAGE_MIN_LOCALITY else "pair"
    if top >= 8192 and top > 64 * mean:
        return "longrow"
    return "warp"


def auto_variant(pattern):
    """:func:`choose_variant` for a :class:`SymmetricPattern`, with its :func:`row_locality` and
    :func:`window_locality` where the choice depends on them (every row at most 32 entries)."""
    d = pattern.degrees
    top = int(d.max()) if d.size else 0
    if not 0 < top <= 32:
        return choose_variant(d)
    window = window_locality(pattern)
    if window >= _WINDOW_MIN_LOCALITY:  # decided: no need for the staged variant's locality
        return choose_variant(d, None, window)
    return choose_variant(d, row_locality(pattern, staged_rows_per_block(d)), window)


def shortrow_group_size(degrees):
    """Lanes per row of the ``"shortrow"`` variant: the longest row rounded up to a power of two.

    Raises ValueError when a row has more than 32 entries (the variant's lists live in one warp).
    """
    d = np.asarray(degrees)
    top = int(d.max()) if d.size else 0
    if top > _SHORTROW_MAX_DEGREE:
        raise ValueError(f"the 'shortrow' variant needs every row to have at most {_SHORTROW_MAX_DEGREE} stored "
                         f"entries; G has a row of {top}")
    g = 1
    while g < top:
        g *= 2
    return g


def hub_vertices(degrees, *, min_degree, max_bytes):
    """The vertices that get a bitmap in the ``"hub"`` variant, highest degree first.

    Vertices of degree >= ``min_degree``, as many of the highest-degree ones as fit in
    ``max_bytes`` at ``4 * ceil(n / 32)`` bytes per bitmap.  Returns an int32 array.
    """
    d = np.asarray(degrees)
    n = d.size
    words = -(-n // 32)
    limit = int(max_bytes) // (4 * words) if words else 0
    candidates = np.flatnonzero(d >= max(1, min_degree))
    if limit <= 0 or candidates.size == 0:
        return np.zeros(0, dtype=np.int32)
    if candidates.size > limit:
        candidates = candidates[np.argpartition(-d[candidates], limit - 1)[:limit]]
    order = np.lexsort((candidates, -d[candidates]))  # by degree, then index: the same hubs every run
    return candidates[order].astype(np.int32)


def default_hash_min_degree():
    """The smallest degree of a row with a hash table in the ``"longrow"`` variant (0: none):
    ``GRAPHKERN_JACCARD_HASH_MIN_DEGREE`` where set, else ``_HASH_MIN_DEGREE``."""
    value = os.environ.get(_HASH_MIN_DEGREE_ENV, "").strip()
    if not value:
        return _HASH_MIN_DEGREE
    try:
        degree = int(value)
    except ValueError:
        degree = -1
    if degree < 0:
        raise ValueError(f"{_HASH_MIN_DEGREE_ENV} must be an integer >= 0 (0: no hash tables); got {value!r}")
    return degree


def hash_table_rows(degrees, hubs, *, min_degree):
    """The rows that get a hash table of their columns in the ``"longrow"`` variant, and where.

    The rows of degree >= ``min_degree`` (0: none) outside ``hubs`` (a hub's row tests its
    bitmap instead), in vertex order.  Row ``rows[w]``, of degree d, gets the
    max(4, 2^ceil(log2(2 d))) slots ``[slots[w], slots[w + 1])`` of one int32 array: a load
    factor of at most 1/2, at least one bucket of 4 slots, and the size that ``hash_shift`` of
    cuda_src/jaccard_search.cuh derives from d (so every table starts at a multiple of 4 slots,
    as its vector loads need).  Returns ``rows`` (int32) and ``slots`` (int64, one longer;
    ``slots[-1]`` is the size of all the tables).
    """
    d = np.asarray(degrees, dtype=np.int64)
    chosen = d >= max(1, int(min_degree)) if min_degree > 0 else np.zeros(d.size, dtype=bool)
    chosen[np.asarray(hubs, dtype=np.int64)] = False
    rows = np.flatnonzero(chosen)
    # 2d - 1 has ceil(log2(2d)) significant bits, which frexp gives exactly below 2^53
    _, bits = np.frexp((2 * d[rows] - 1).astype(np.float64))
    slots = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(np.left_shift(np.int64(1), np.maximum(bits, 2).astype(np.int64)), out=slots[1:])
    return rows.astype(np.int32), slots


def pair_rows_per_block(degrees, *, entries=_PAIR_ENTRIES_PER_BLOCK):
    """Rows per block of the ``"pair"`` variant: about ``entries`` upper entries per block.

    Half the mean degree is a row's expected number of upper entries; the result is a multiple
    of 8 from 8 to 256 (one block of threads).  A block with more upper entries than its shared
    list holds (2048) lists them in several passes.
    """
    d = np.asarray(degrees)
    mean = float(d.mean()) if d.size else 1.0
    rows = int(entries / max(mean / 2, 1.0))
    return int(min(_BLOCK, max(8, rows - rows % 8)))


def _entry_rows(pattern):
    """The row of every stored entry of ``pattern`` (int64, in storage order)."""
    return np.repeat(np.arange(pattern.n, dtype=np.int64), pattern.degrees)


def row_locality(pattern, rows_per_block):
    """The share of stored off-diagonal entries (i, j) whose row j lies in i's block of
    ``rows_per_block`` rows when the ``"staged"`` variant stages it: the merges it serves from
    shared memory.  A ring lattice or a mesh in a banded order is close to 1, the same graph with
    its vertices shuffled close to 0."""
    rows = _entry_rows(pattern)
    off = rows != pattern.indices
    if not off.any():
        return 0.0
    block = rows[off] // rows_per_block
    return float(np.mean(pattern.indices[off] // rows_per_block == block))


def window_locality(pattern):
    """The share of stored off-diagonal entries (i, j) that the ``"window"`` variant computes from
    its row masks: |i - j| < 32, and rows i and j each with at most 4 entries 32 or more away
    from their own index.  Close to 1 for a ring lattice with few shortcuts or a narrow band,
    close to 0 for a shuffled or wide-band order (those pairs are merged, as in ``"pair"``)."""
    n = pattern.n
    rows = _entry_rows(pattern)
    gap = np.abs(pattern.indices.astype(np.int64) - rows)
    off = gap > 0
    if not off.any():
        return 0.0
    far = np.bincount(rows[gap >= _WINDOW_HALF], minlength=n)
    complete = far <= _WINDOW_FAR
    near = (gap < _WINDOW_HALF) & complete[rows] & complete[pattern.indices]
    return float(np.mean(near[off]))


def window_rows_per_block(n, slots):
    """Rows per block of the ``"window"`` variant on a device that holds ``slots`` of its blocks at
    once: the fewest rows (a multiple of 8, at least 96, at most 256) that fit the whole graph in
    one wave of blocks.  Each block walks through a few phases whose latency does not shrink with
    fewer rows, so a second, partial wave costs nearly a block's whole time (H100, Watts-Strogatz
    100k: 192 rows = 521 blocks in 528 slots 0.0214 ms, 160 rows = 625 blocks 0.0251 ms); past
    256 rows a block's 256 threads run out, and big graphs take several waves of 256 rows."""
    rows = -(-int(n) // max(int(slots), 1))
    rows += -rows % 8
    return int(min(_BLOCK, max(96, rows)))


def staged_rows_per_block(degrees):
    """Rows per block of the ``"staged"`` variant: about ``_STAGE_FILL * _STAGE_CAP`` stored entries
    per block at the mean degree (so that nearly every block stages), a multiple of 8 from 8 to 256."""
    d = np.asarray(degrees)
    mean = float(d.mean()) if d.size else 1.0
    rows = int(_STAGE_FILL * _STAGE_CAP / max(mean, 1.0))
    return int(min(_BLOCK, max(8, rows - rows % 8)))


def work_line_length(pattern):
    """Work items of the balanced, hub and longrow variants: ``min(d_i, d_j)`` summed over the
    undirected off-diagonal pairs (each pair's work is carried by one of its two entries)."""
    d = pattern.degrees
    rows = np.repeat(np.arange(pattern.n, dtype=np.int32), d)
    upper = rows < pattern.indices
    return int(np.minimum(d[rows[upper]], d[pattern.indices[upper]]).sum())


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

    def __init__(self, dev, pattern, *, metric, self_loops, dtype, variant="auto", stream=None,
                 hub_min_degree=_HUB_MIN_DEGREE, hub_max_bytes=None, hash_min_degree=None,
                 balanced_chunk=_BALANCED_CHUNK, rows_per_block=None, pair_width=_PAIR_WIDTH):
        """``hub_min_degree`` and ``hub_max_bytes`` (default: min(0.25 GiB, or 32 MiB for
        ``"longrow"`` with hash tables, and 10% of free device memory)) choose the bitmaps of the
        ``"hub"`` and ``"longrow"`` variants; see :func:`hub_vertices`.  ``hash_min_degree``: in
        the unweighted ``"longrow"`` variant the rows of at least this degree without a bitmap
        get a hash table (0: none; default :func:`default_hash_min_degree`, read now; see
        :func:`hash_table_rows`), unless the tables would not fit in the free device memory,
        where it runs without them (``self.hash_rows`` lists the rows that have one).
        ``balanced_chunk``: consecutive searches per thread in the balanced, hub and longrow
        variants.  ``rows_per_block``: rows per block of the ``"pair"``, ``"staged"`` and ``"window"``
        variants (1 to 256; default :func:`pair_rows_per_block`, :func:`staged_rows_per_block`,
        :func:`window_rows_per_block`).  ``pair_width``: column indices
        per load in the ``"pair"`` merge, 1, 2 or 4 (aligned vector loads; weighted graphs and
        graphs of 2^31 - 2 nodes or more merge element by element, ``self.pair_width`` says
        which ran)."""
        from graphkern._cuda import runtime as rt

        self.rt = rt
        self.dev = dev
        self.pattern = pattern
        self.metric = int(metric)
        self.self_loops = bool(self_loops)
        self.dtype = np.dtype(dtype)
        self.weighted = pattern.weights is not None
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {variant!r}")
        degrees = pattern.degrees
        self.variant = auto_variant(pattern) if variant == "auto" else variant
        if self.variant in _STAGED_VARIANTS and self.weighted:
            self.variant = "pair"  # the staged merge and the window lookups count; weighted pairs merge by element
        self.group = warp_group_size(degrees)
        self.balanced_chunk = int(balanced_chunk)
        if not 1 <= self.balanced_chunk <= 1 << 16:
            raise ValueError(f"balanced_chunk must be 1 to 65536, got {balanced_chunk!r}")
        default_rows = staged_rows_per_block if self.variant in _STAGED_VARIANTS else pair_rows_per_block
        self.rows_per_block = int(default_rows(degrees) if rows_per_block is None else rows_per_block)
        if not 1 <= self.rows_per_block <= _BLOCK:
            raise ValueError(f"rows_per_block must be 1 to {_BLOCK}, got {rows_per_block!r}")
        if pair_width not in _PAIR_WIDTHS:
            raise ValueError(f"pair_width must be one of {_PAIR_WIDTHS}, got {pair_width!r}")
        self.hash_min_degree = default_hash_min_degree() if hash_min_degree is None else hash_min_degree
        if not isinstance(self.hash_min_degree, (int, np.integer)) or self.hash_min_degree < 0:
            raise ValueError(f"hash_min_degree must be an integer >= 0, got {hash_min_degree!r}")
        n, nnz, s = pattern.n, pattern.nnz, self.dtype.itemsize
        self.pair_width = 1 if self.weighted or n > _PAIR_VECTOR_MAX_NODES else int(pair_width)
        if nnz == 0:
            raise ValueError("DeviceSimilarity needs at least one stored entry")
        self.shortrow_group = shortrow_group_size(degrees) if self.variant == "shortrow" else 0
        self.n_tiles = -(-nnz // _SCAN_TILE)
        entries_per_block = _BLOCK // self.group if self.variant == "warp" else _BLOCK
        if -(-nnz // entries_per_block) > _MAX_GRID:
            raise ValueError(f"G has {nnz} stored entries, too many for one launch of the {self.variant!r} variant")
        self.stream = stream if stream is not None else rt.Stream(dev)  # the options are checked first
        self.hubs = np.zeros(0, dtype=np.int32)
        self.hub_words = -(-n // 32)
        tables = self.variant == "longrow" and not self.weighted and self.hash_min_degree > 0
        if self.variant in _BITMAP_VARIANTS and not self.weighted:
            if hub_max_bytes is None:
                cap = _HASH_HUB_MAX_BYTES if tables else _HUB_MAX_BYTES
                hub_max_bytes = min(cap, int(_HUB_FREE_FRACTION * dev.memory_info()[0]))
            self.hubs = hub_vertices(degrees, min_degree=hub_min_degree, max_bytes=hub_max_bytes)
        self.hash_rows, self._hash_slots = np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
        if tables:
            self.hash_rows, self._hash_slots = hash_table_rows(degrees, self.hubs, min_degree=self.hash_min_degree)
        # listed row w's entries are items [_hash_items[w], _hash_items[w + 1]) of row_hashes' line
        self._hash_items = np.zeros(self.hash_rows.size + 1, dtype=np.int64)
        np.cumsum(degrees[self.hash_rows], out=self._hash_items[1:])

        padded_nnz = nnz + (-nnz) % _INDEX_PADDING
        self.group_items = 32 * self.balanced_chunk  # work items of one warp's 32 chunks
        sizes = {"indptr": 8 * (n + 1), "indices": 4 * padded_nnz, "out": s * nnz}
        if self.weighted:
            sizes.update(weights=s * nnz, wsum=s * n, selfw=s * n)
        else:
            sizes.update(deg=4 * n, adj=4 * n)
        if self.variant in _WORK_LINE_VARIANTS:
            n_groups = max(1, -(-work_line_length(pattern) // self.group_items))
            sizes.update(rows=4 * nnz, offsets=8 * (nnz + 1), tile_sums=8 * self.n_tiles,
                         inter=(s if self.weighted else 4) * nnz, group_entry=8 * n_groups)
        if self.variant == "longrow":
            sizes.update(mirror_off=4 * nnz)  # the balanced pass notes where the finalize pass writes the mirror
        if self.hubs.size:
            sizes.update(hub_list=4 * self.hubs.size, hub_slot=4 * n, bitmaps=4 * self.hub_words * self.hubs.size)
        if self.hash_rows.size:
            m = self.hash_rows.size
            hash_sizes = dict(hash_list=4 * m, hash_items=8 * (m + 1), hash_slots=8 * (m + 1), hash_off=8 * n,
                              hash_keys=4 * int(self._hash_slots[-1]))
            if sum(sizes.values()) + sum(hash_sizes.values()) > dev.memory_info()[0]:  # the tables only speed it up
                self.hash_rows, self._hash_slots, self._hash_items = (self.hash_rows[:0], self._hash_slots[:1],
                                                                      self._hash_items[:1])
            else:
                sizes.update(hash_sizes)
        if self.variant in ("shortrow",) + _STAGED_VARIANTS or (self.variant == "pair" and not self.weighted):
            for name in ("deg", "adj", "wsum", "selfw"):  # the vertex terms are computed in the kernel
                sizes.pop(name, None)
        self.nbytes = sum(sizes.values())
        rt.check_fits(dev, self.nbytes, f"{('weighted ' if self.weighted else '')}similarity ({self.variant} "
                      f"variant) of a graph with {n} nodes and {nnz} stored entries")

        def alloc(name, count, dt):
            return rt.alloc(dev, (count,), dt) if name in sizes else None

        self.indptr = alloc("indptr", n + 1, np.int64)
        self.indices = alloc("indices", padded_nnz, np.int32)
        if padded_nnz > nnz:  # never read as a column: the vector merge masks what lies past a row
            self.indices.view(4 * nnz, 4 * (padded_nnz - nnz)).zero()
        self.weights = alloc("weights", nnz, self.dtype)
        self.out = alloc("out", nnz, self.dtype)
        self.deg = alloc("deg", n, np.int32)
        self.adj = alloc("adj", n, np.int32)
        self.wsum = alloc("wsum", n, self.dtype)
        self.selfw = alloc("selfw", n, self.dtype)
        self.rows = alloc("rows", nnz, np.int32)
        self.offsets = alloc("offsets", nnz + 1, np.int64)
        self.tile_sums = alloc("tile_sums", self.n_tiles, np.int64)
        self.group_entry = alloc("group_entry", sizes.get("group_entry", 0) // 8, np.int64)
        self.inter = alloc("inter", nnz, self.dtype if self.weighted else np.int32)
        self.mirror_off = alloc("mirror_off", nnz, np.int32)
        self.hub_list = alloc("hub_list", self.hubs.size, np.int32)
        self.hub_slot = alloc("hub_slot", n, np.int32)
        self.bitmaps = alloc("bitmaps", self.hub_words * self.hubs.size, np.uint32)
        if self.bitmaps is not None:
            self.bitmaps.zero()  # once: each compute clears only the words it is about to set
        self.hash_list = alloc("hash_list", self.hash_rows.size, np.int32)
        self.hash_items = alloc("hash_items", self.hash_rows.size + 1, np.int64)
        self.hash_slots = alloc("hash_slots", self.hash_rows.size + 1, np.int64)
        self.hash_off = alloc("hash_off", n, np.int64)
        self.hash_keys = alloc("hash_keys", int(self._hash_slots[-1]), np.int32)
        if self.hash_off is not None:
            self.hash_off.memset32(0xFFFFFFFF)  # -1, no table; once: each compute writes the same rows' offsets
        self.out.memset32(0x7FC00000)  # NaN in float32, and a NaN pattern in float64

        self._host_weights = pattern.weights.astype(self.dtype) if self.weighted else None
        flavour = f"{'weight' if self.weighted else 'count'}_{'f32' if self.dtype == np.float32 else 'f64'}"
        self._fn = {name: rt.kernel(dev, "jaccard", f"jaccard_{name}_{flavour}")
                    for name in ("element", "binary", "warp", "balanced", "finalize", "shortrow")}
        pair_kernel = "pair" if self.pair_width == 1 else f"pair_vec{self.pair_width}"
        self._fn["pair"] = rt.kernel(dev, "jaccard", f"jaccard_{pair_kernel}_{flavour}")
        if self.variant in _STAGED_VARIANTS:
            self._fn[self.variant] = rt.kernel(dev, "jaccard", f"jaccard_{self.variant}_{flavour}")
        self._fn_vertex = (rt.kernel(dev, "jaccard", f"jaccard_vertex_weights_{flavour[-3:]}") if self.weighted
                           else rt.kernel(dev, "jaccard", "jaccard_vertex_counts"))
        self._fn_work = rt.kernel(dev, "jaccard", "jaccard_balanced_work")
        self._fn_hub_bitmaps = rt.kernel(dev, "jaccard", "jaccard_hub_bitmaps")
        self._fn_row_hashes = rt.kernel(dev, "jaccard", "jaccard_row_hashes")
        self._fn_scan_sums = rt.kernel(dev, "jaccard", "jaccard_scan_tile_sums")
        self._fn_scan_tiles = rt.kernel(dev, "jaccard", "jaccard_scan_tiles")
        sms = dev.properties["multiprocessor_count"]
        self._balanced_grid = sms * max(1, self._fn["balanced"].max_active_blocks_per_sm(_BLOCK, 0))
        if self.variant == "window" and rows_per_block is None:
            slots = sms * max(1, self._fn["window"].max_active_blocks_per_sm(_BLOCK, 0))
            self.rows_per_block = window_rows_per_block(n, slots)

    def upload(self):
        """Copy the CSR (and weights) to the device, on the stream."""
        self.indptr.copy_from_host(self.pattern.indptr, self.stream)
        self.indices.copy_from_host(self.pattern.indices, self.stream)
        if self.weighted:
            self.weights.copy_from_host(self._host_weights, self.stream)
        if self.hub_list is not None:
            self.hub_list.copy_from_host(self.hubs, self.stream)
        if self.hash_list is not None:
            self.hash_list.copy_from_host(self.hash_rows, self.stream)
            self.hash_items.copy_from_host(self._hash_items, self.stream)
            self.hash_slots.copy_from_host(self._hash_slots, self.stream)

    def compute(self):
        """Enqueue every kernel of the chosen variant on the stream (no copies, no host waits).

        The hub and longrow variants' bitmaps and vertex-to-bitmap map, and longrow's hash tables,
        are built here, as part of the work.
        """
        rt, st, p = self.rt, self.stream, self.pattern
        n, nnz = p.n, p.nnz
        n32, nnz64 = np.int32(n), np.int64(nnz)
        scalar = self.dtype.type
        if self.variant == "shortrow":
            g = self.shortrow_group
            rt.launch(self._fn["shortrow"], -(-n // (_BLOCK // g)), _BLOCK,
                      (self.indptr, self.indices, self.weights, n32, np.int32(self.metric),
                       np.int32(self.self_loops), self.out, np.int32(g)), stream=st)
            return
        common = (self.indptr, self.indices, self.weights, n32, nnz64, np.int32(self.metric), self.deg, self.adj,
                  self.wsum, self.selfw, scalar(1 if self.self_loops else -1), self.out)
        if self.variant in ("pair",) + _STAGED_VARIANTS and not self.weighted:  # one launch: it finds the vertex terms
            self._launch_pair(common)
            return
        if self.hub_slot is not None:
            self.hub_slot.memset32(0xFFFFFFFF, st)  # -1: no bitmap
            rt.launch(self._fn_hub_bitmaps, self.hubs.size, _BLOCK,
                      (self.indptr, self.indices, self.hub_list, np.int64(self.hub_words), self.bitmaps,
                       self.hub_slot), stream=st)
        if self.hash_keys is not None:
            items = int(self._hash_items[-1])
            self.hash_keys.memset32(0xFFFFFFFF, st)  # kHashEmpty: row_hashes inserts into empty tables
            rt.launch(self._fn_row_hashes, -(-items // _BLOCK), _BLOCK,
                      (self.indptr, self.indices, self.hash_list, self.hash_items, self.hash_slots,
                       np.int32(self.hash_rows.size), np.int64(items), self.hash_off, self.hash_keys), stream=st)
        if self.weighted:
            rt.launch(self._fn_vertex, -(-n // (_BLOCK // 32)), _BLOCK,
                      (self.indptr, self.indices, self.weights, n32, np.int32(self.self_loops), self.wsum,
                       self.selfw), stream=st)
        else:
            rt.launch(self._fn_vertex, -(-n // _BLOCK), _BLOCK,
                      (self.indptr, self.indices, n32, np.int32(self.self_loops), self.deg, self.adj), stream=st)
        entry_grid = -(-nnz // _BLOCK)
        if self.variant in ("element", "binary"):
            rt.launch(self._fn[self.variant], entry_grid, _BLOCK, common, stream=st)
        elif self.variant == "pair":
            self._launch_pair(common)
        elif self.variant == "warp":
            rt.launch(self._fn["warp"], -(-nnz // (_BLOCK // self.group)), _BLOCK, common + (np.int32(self.group),),
                      stream=st)
        else:
            long_owner = np.int32(self.variant == "longrow")
            self.inter.zero(st)
            if self.mirror_off is not None:
                self.mirror_off.memset32(0xFFFFFFFF, st)  # -1: not recorded, the finalize pass searches
            rt.launch(self._fn_work, self.n_tiles, _BLOCK,
                      (self.indptr, self.indices, self.hub_slot, long_owner, n32, nnz64, self.rows, self.offsets,
                       self.tile_sums), stream=st)
            total = self.offsets.view(8 * nnz, 8, dtype=np.int64, shape=(1,))
            rt.launch(self._fn_scan_sums, 1, 1024, (self.tile_sums, np.int64(self.n_tiles), total), stream=st)
            rt.launch(self._fn_scan_tiles, self.n_tiles, _BLOCK,
                      (self.offsets, nnz64, self.tile_sums, np.int64(self.group_items), self.group_entry), stream=st)
            rt.launch(self._fn["balanced"], self._balanced_grid, _BLOCK,
                      (self.indptr, self.indices, self.weights, self.rows, self.offsets, nnz64,
                       np.int32(self.balanced_chunk), self.group_entry, self.hub_slot, self.bitmaps,
                       np.int64(self.hub_words), self.hash_off, self.hash_keys, self.inter, self.mirror_off),
                      stream=st)
            rt.launch(self._fn["finalize"], entry_grid, _BLOCK,
                      common + (self.rows, self.hub_slot, long_owner, self.inter, self.mirror_off), stream=st)

    def _launch_pair(self, common):
        rows = self.rows_per_block
        self.rt.launch(self._fn[self.variant], -(-self.pattern.n // rows), _BLOCK,
                       common + (np.int32(self.self_loops), np.int32(rows)), stream=self.stream)

    def download(self, out):
        """Copy the result into the host array ``out`` and wait for the stream."""
        self.out.copy_to_host(out, self.stream)
        self.stream.synchronize()
        return out
