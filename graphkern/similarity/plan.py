"""The host plan of a GPU similarity run: the variant, its launch shapes, the rows that get a
bitmap or a hash table and the device buffers' sizes.

:func:`plan_similarity` is a function of the CSR arrays, the options and the free device memory
only, so it is computed and tested without a device.  The variant and launch shapes come from
the pattern's :class:`DegreeFigures` (a few numbers from its pass over the row pointers); the
degrees themselves are read only for bitmaps and hash tables, and one parallel pass over the
stored entries (``plan_counts`` of graphkern/_cpu/jaccard.pyx) runs only for graphs of short rows
under ``variant="auto"``, for their localities.  The work line of the balanced, hub and longrow
variants (the sum of min(d_i, d_j) over the upper entries, a gather per entry) is summed by the
device, which sizes its table of groups from it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from graphkern._cuda import runtime as rt

VARIANTS = ("auto", "element", "binary", "warp", "balanced", "hub", "shortrow", "pair", "staged", "window",
            "longrow")

# ---- GPU launch shapes.  Those cuda_src/jaccard.cu also holds it exports, checked when it loads
# (:func:`kernel`): BLOCK, SCAN_TILE, STAGE_CAP, WINDOW_HALF, WINDOW_FAR, the vector merge's pad
# (PAIR_PAD) and the hash tables' bucket (HASH_BUCKET).
BLOCK = 256
SCAN_TILE = 256 * 16           # entries per block of the work prefix sum: 16 a thread
BALANCED_CHUNK = 8             # searches per thread in the balanced, hub and longrow variants (8 beat 16 and 32)
PAIR_ENTRIES_PER_BLOCK = 960   # "pair": rows per block sized for about this many upper entries
STAGE_CAP = 2048               # "staged": column indices a block copies to shared memory
STAGE_FILL = 0.8               # "staged": rows per block sized for this share of STAGE_CAP at the mean degree
# auto: "staged" over "pair" when this share of entries stays in a block (a ring order gains a
# few percent, a shuffled order loses more)
STAGE_MIN_LOCALITY = 0.5
# auto, rows past 32: "warp" on graphs under this many stored entries whose mean degree is at most
# WARP_MAX_MEAN (and no hub of 8192 dwarfs it), else "longrow" (choose_variant)
LONGROW_MIN_ENTRIES = 1 << 21
WARP_MAX_MEAN = 12
STAGED_VARIANTS = ("staged", "window")  # unweighted kernels that stage the block's rows in shared memory
WINDOW_HALF = 32               # "window": row r's mask covers the vertices [r - 32, r + 32)
WINDOW_FAR = 4                 # "window": entries outside its window a row may have for the fast path
WINDOW_MIN_LOCALITY = 0.5      # auto: "window" where this share of pairs takes the fast path
PAIR_WIDTHS = (1, 2, 4)        # "pair": column indices per load of its merge (1: element by element)
# the vector merge's extra compares cost more than its fewer loads save on short rows
PAIR_WIDTH = 1
INT32_MAX = np.iinfo(np.int32).max
# The vector merge pads rows with the indices PAIR_PAD = 2^31 - 2 and 2^31 - 1, so it needs every
# vertex index below them; the index buffer is padded to a multiple of 4 for its aligned loads.
PAIR_PAD = INT32_MAX - 1
PAIR_VECTOR_MAX_NODES = PAIR_PAD - 1
INDEX_PADDING = 4
HASH_BUCKET = 4                # a hash table's slots per bucket (one aligned load)
_PLANNED = {"block": BLOCK, "scan_tile": SCAN_TILE, "stage_cap": STAGE_CAP, "window_half": WINDOW_HALF,
            "window_far": WINDOW_FAR, "pad_after_b": PAIR_PAD, "hash_bucket": HASH_BUCKET}
BITMAP_VARIANTS = ("hub", "longrow")
WORK_LINE_VARIANTS = ("balanced", "hub", "longrow")
MAX_GRID = 2**31 - 1
SHORTROW_MAX_DEGREE = 32       # a row's group of lanes is at most a warp
# Bitmaps: vertices of at least this degree, highest first, as many as fit in
# min(HUB_MAX_BYTES, HUB_FREE_FRACTION of the device's free memory).  A bit test replaces a
# gallop through a list of this length or more; below it the list is a few cache lines anyway.
HUB_MIN_DEGREE = 64
# A bit test is a random L2 sector while a gallop through a list of ~10^3 hits L1, so more than
# 0.25 GiB of bitmaps is slower on a Chung-Lu graph of 2M vertices.
HUB_MAX_BYTES = 1 << 28
HUB_FREE_FRACTION = 0.1
# "longrow", unweighted: a row of at least this degree without a bitmap gets an open-addressing
# hash table of its columns (see hash_table_rows), so that looking a short row's element up in
# it is mostly one 16-byte load instead of a gallop of ~2 log2(d_long / d_short) + 1 dependent
# loads.  Degrees 64 to 256 are within 1% of each other on Chung-Lu graphs; R-MAT graphs run a
# few percent slower with tables (``hash_min_degree=0`` turns them off).
HASH_MIN_DEGREE = 128
# "longrow" with tables: the bitmaps' cap in place of HUB_MAX_BYTES, so that rows of 10^3 to
# 10^4 entries get tables (8 to 64 KiB) instead of bitmaps (n / 8 bytes each), whose bit tests
# are random L2 sectors.
HASH_HUB_MAX_BYTES = 1 << 25


def kernel(dev, name):
    """The kernel ``name`` of cuda_src/jaccard.cu on ``dev`` (the module's first load checks its exports
    against the shapes planned here)."""
    rt.exports(dev, "jaccard", agree=_PLANNED)
    return rt.kernel(dev, "jaccard", name)


@dataclass(frozen=True)
class DeviceOptions:
    """The tuning options of a GPU run, checked on construction (before any device is used).

    ``hub_min_degree`` and ``hub_max_bytes`` (default: min(0.25 GiB, or 32 MiB for ``"longrow"``
    with hash tables, and 10% of free device memory)) choose the bitmaps of the ``"hub"`` and
    ``"longrow"`` variants (:func:`hub_vertices`).  ``hash_min_degree``: in the unweighted
    ``"longrow"`` variant the rows of at least this degree without a bitmap get a hash table
    (0: none; :func:`hash_table_rows`), unless the tables would not fit in the free device memory.
    ``balanced_chunk``: consecutive searches per thread in the balanced, hub and longrow variants.
    ``rows_per_block``: rows per block of ``"pair"``, ``"staged"`` and ``"window"`` (1 to 256;
    default :func:`pair_rows_per_block`, :func:`staged_rows_per_block`,
    :func:`window_rows_per_block`).  ``pair_width``: column indices per load in the ``"pair"``
    merge, 1, 2 or 4 (weighted graphs and graphs of 2^31 - 2 nodes or more merge element by element).
    """

    variant: str = "auto"
    hub_min_degree: int = HUB_MIN_DEGREE
    hub_max_bytes: int | None = None
    hash_min_degree: int = HASH_MIN_DEGREE
    balanced_chunk: int = BALANCED_CHUNK
    rows_per_block: int | None = None
    pair_width: int = PAIR_WIDTH

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}; got {self.variant!r}")
        if not _is_int(self.balanced_chunk) or not 1 <= self.balanced_chunk <= 1 << 16:
            raise ValueError(f"balanced_chunk must be 1 to 65536, got {self.balanced_chunk!r}")
        if self.rows_per_block is not None and (not _is_int(self.rows_per_block)
                                                or not 1 <= self.rows_per_block <= BLOCK):
            raise ValueError(f"rows_per_block must be 1 to {BLOCK}, got {self.rows_per_block!r}")
        if self.pair_width not in PAIR_WIDTHS:
            raise ValueError(f"pair_width must be one of {PAIR_WIDTHS}, got {self.pair_width!r}")
        if not _is_int(self.hash_min_degree) or self.hash_min_degree < 0:
            raise ValueError(f"hash_min_degree must be an integer >= 0 (0: no hash tables), "
                             f"got {self.hash_min_degree!r}")
        if not _is_int(self.hub_min_degree) or self.hub_min_degree < 0:
            raise ValueError(f"hub_min_degree must be an integer >= 0, got {self.hub_min_degree!r}")
        if self.hub_max_bytes is not None and (not _is_int(self.hub_max_bytes) or self.hub_max_bytes < 0):
            raise ValueError(f"hub_max_bytes must be an integer >= 0 or None, got {self.hub_max_bytes!r}")


@dataclass(frozen=True)
class DegreeFigures:
    """The figures of a graph's row lengths that choose its variant and launch shapes: rows,
    stored entries, the longest row and the non-empty rows."""

    n: int
    total: int
    top: int
    nonempty: int

    @classmethod
    def of(cls, degrees):
        """The figures of an array of row lengths (figures are returned as they are)."""
        if isinstance(degrees, cls):
            return degrees
        d = np.asarray(degrees)
        return cls(d.size, int(d.sum(dtype=np.int64)), int(d.max()) if d.size else 0, int(np.count_nonzero(d)))

    @property
    def mean(self):
        """The mean length of the non-empty rows (1 without any)."""
        return self.total / self.nonempty if self.nonempty else 1.0


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass
class SimilarityPlan:
    """What a GPU run does, before any device memory is touched.

    ``variant`` the kernel that runs (``"auto"`` resolved; weighted ``"staged"`` and ``"window"``
    run as ``"pair"``); ``group`` lanes per entry of ``"warp"``; ``shortrow_group`` lanes per row
    of ``"shortrow"``; ``rows_per_block`` of the row-block variants (None for ``"window"`` until
    the device's block slots are known); ``pair_width``; ``hubs`` the rows with a bitmap, highest
    degree first; ``hash_rows`` the rows with a hash table and ``hash_slots``/``hash_items``
    where their tables and entries lie; ``sizes`` the device buffers in bytes by name (the
    work-line variants' table of groups of ``group_items`` work items aside: the device sums the
    work line and the run sizes that table then).
    """

    variant: str
    group: int
    shortrow_group: int
    rows_per_block: int | None
    pair_width: int
    balanced_chunk: int
    group_items: int
    n_tiles: int
    hubs: np.ndarray
    hash_rows: np.ndarray
    hash_slots: np.ndarray
    hash_items: np.ndarray
    sizes: dict

    @property
    def nbytes(self):
        return sum(self.sizes.values())


def plan_similarity(pattern, options, *, weighted, dtype, free_bytes, n_threads=1):
    """The :class:`SimilarityPlan` of ``pattern`` (a SymmetricPattern with at least one entry)
    under ``options`` (:class:`DeviceOptions`) on a device with ``free_bytes`` free."""
    figures = pattern.figures
    n, nnz, s = pattern.n, pattern.nnz, np.dtype(dtype).itemsize
    variant = auto_variant(pattern, n_threads=n_threads) if options.variant == "auto" else options.variant
    if options.variant == "auto" and variant == "longrow":
        need = {v: sum(_buffers(v, n, nnz, s, weighted).values()) for v in ("longrow", "warp")}
        if need["longrow"] > free_bytes >= need["warp"]:
            variant = "warp"  # the work line does not fit where a group of lanes per entry does
    if variant in STAGED_VARIANTS and weighted:
        variant = "pair"  # the staged merge and the window lookups count; weighted pairs merge by element
    group = warp_group_size(figures)
    rows_per_block = options.rows_per_block
    if rows_per_block is None and variant != "window":
        rows_per_block = (staged_rows_per_block if variant in STAGED_VARIANTS else pair_rows_per_block)(figures)
    pair_width = 1 if weighted or n > PAIR_VECTOR_MAX_NODES else int(options.pair_width)
    shortrow_group = shortrow_group_size(figures) if variant == "shortrow" else 0
    entries_per_block = BLOCK // group if variant == "warp" else BLOCK
    if -(-nnz // entries_per_block) > MAX_GRID:
        raise ValueError(f"G has {nnz} stored entries, too many for one launch of the {variant!r} variant")

    hubs = np.zeros(0, dtype=np.int32)
    bitmaps = variant in BITMAP_VARIANTS and not weighted
    tables = variant == "longrow" and not weighted and options.hash_min_degree > 0
    hash_rows, hash_slots = np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    hash_items = np.zeros(1, dtype=np.int64)
    if bitmaps:
        from graphkern._cpu.jaccard import long_rows

        # the rows long enough for a bitmap or a table, in one pass over the row pointers
        floor = min(options.hub_min_degree, options.hash_min_degree if tables else options.hub_min_degree)
        rows, lengths = long_rows(pattern.indptr, max(1, floor), max(1, int(n_threads)))
        hub_max_bytes = options.hub_max_bytes
        if hub_max_bytes is None:
            hub_max_bytes = min(HASH_HUB_MAX_BYTES if tables else HUB_MAX_BYTES, int(HUB_FREE_FRACTION * free_bytes))
        hubs = hub_vertices(lengths, min_degree=options.hub_min_degree, max_bytes=hub_max_bytes, rows=rows, n=n)
        if tables:
            hash_rows, hash_slots = hash_table_rows(lengths, hubs, min_degree=options.hash_min_degree, rows=rows)
            # listed row w's entries are items [hash_items[w], hash_items[w + 1]) of row_hashes' line
            hash_items = np.zeros(hash_rows.size + 1, dtype=np.int64)
            np.cumsum(lengths[np.searchsorted(rows, hash_rows)], out=hash_items[1:])

    group_items = 32 * int(options.balanced_chunk)  # work items of one warp's 32 chunks
    n_tiles = -(-nnz // SCAN_TILE)
    sizes = _buffers(variant, n, nnz, s, weighted)
    if hubs.size:
        sizes.update(hub_list=4 * hubs.size, hub_slot=4 * n, bitmaps=4 * -(-n // 32) * hubs.size)
    if hash_rows.size:
        m = hash_rows.size
        hash_sizes = dict(hash_list=4 * m, hash_items=8 * (m + 1), hash_slots=8 * (m + 1), hash_off=8 * n,
                          hash_keys=4 * int(hash_slots[-1]))
        if sum(sizes.values()) + sum(hash_sizes.values()) > free_bytes:  # the tables only speed it up
            hash_rows, hash_slots, hash_items = hash_rows[:0], hash_slots[:1], hash_items[:1]
        else:
            sizes.update(hash_sizes)
    if variant in ("shortrow",) + STAGED_VARIANTS or (variant == "pair" and not weighted):
        for name in ("deg", "adj", "wsum", "selfw"):  # the vertex terms are computed in the kernel
            sizes.pop(name, None)
    return SimilarityPlan(variant=variant, group=group, shortrow_group=shortrow_group,
                          rows_per_block=None if rows_per_block is None else int(rows_per_block),
                          pair_width=pair_width, balanced_chunk=int(options.balanced_chunk), group_items=group_items,
                          n_tiles=n_tiles, hubs=hubs, hash_rows=hash_rows, hash_slots=hash_slots,
                          hash_items=hash_items, sizes=sizes)


def _buffers(variant, n, nnz, itemsize, weighted):
    """The device buffers of a run of ``variant`` in bytes by name, bitmaps and hash tables aside."""
    s = itemsize
    sizes = {"indptr": 8 * (n + 1), "indices": 4 * (nnz + (-nnz) % INDEX_PADDING), "out": s * nnz}
    sizes.update(dict(weights=s * nnz, wsum=s * n, selfw=s * n) if weighted else dict(deg=4 * n, adj=4 * n))
    if variant in WORK_LINE_VARIANTS:
        sizes.update(rows=4 * nnz, offsets=8 * (nnz + 1), tile_sums=8 * -(-nnz // SCAN_TILE),
                     inter=(s if weighted else 4) * nnz)
    if variant == "longrow":
        sizes.update(mirror_off=4 * nnz)  # the balanced pass notes where the finalize pass writes the mirror
    return sizes


# --------------------------------------------------------------------------- the variant


def choose_variant(degrees, locality=None, window=None):
    """The GPU variant ``variant="auto"`` uses for a graph with these row lengths (or their
    :class:`DegreeFigures`; and
    ``locality``, :func:`row_locality` at the staged variant's rows per block, and ``window``,
    :func:`window_locality`, when known).

    Short lists everywhere (max degree <= 32: Watts-Strogatz, Delaunay) favour computing each
    pair once by a thread that merges both lists (``"pair"``, about twice ``"element"``), with
    row masks where at least half the pairs lie within 32 of each other (``"window"``), else
    staged in shared memory block by block where at least half the entries stay inside a block
    (``"staged"``).  Longer lists favour the work line, carried by each pair's long list with
    bitmaps and hash tables of the long lists (``"longrow"``, ahead of ``"warp"`` and ``"hub"`` on
    large graphs of every degree distribution and on small ones of high mean degree), except on a
    small graph (under LONGROW_MIN_ENTRIES stored entries) of low mean degree (at most
    WARP_MAX_MEAN) without a hub of 8192 that dwarfs the mean: there a group of lanes per entry
    (``"warp"``) is about as fast, ahead on some graphs and behind on others by fractions of a
    millisecond, and keeps weighted sums free of float atomics (the figures: docs/performance.md).
    Weighted graphs run ``"longrow"`` without bitmaps and tables; :func:`plan_similarity` runs
    ``"warp"`` where the work line does not fit.
    """
    f = DegreeFigures.of(degrees)
    if f.nonempty == 0:
        return "element"
    top, mean = f.top, f.mean
    if top <= 32:
        if window is not None and window >= WINDOW_MIN_LOCALITY:
            return "window"
        return "staged" if locality is not None and locality >= STAGE_MIN_LOCALITY else "pair"
    if f.total < LONGROW_MIN_ENTRIES and mean <= WARP_MAX_MEAN and not (top >= 8192 and top > 64 * mean):
        return "warp"
    return "longrow"


def auto_variant(pattern, *, n_threads=1):
    """:func:`choose_variant` for a SymmetricPattern, with its :func:`row_locality` and
    :func:`window_locality` where the choice depends on them (every row at most 32 entries)."""
    f = pattern.figures
    if not 0 < f.top <= 32:
        return choose_variant(f)
    rows = staged_rows_per_block(f)
    _, off, in_block, near = _counts(pattern, block_rows=rows, window=True, n_threads=n_threads)
    window = near / off if off else 0.0
    return choose_variant(f, in_block / off if off else 0.0, window)


def _counts(pattern, *, block_rows=0, window=False, n_threads=1):
    from graphkern._cpu.jaccard import plan_counts

    threads = max(1, min(int(n_threads), os.cpu_count() or 1))  # a pass over memory gains nothing past the cores
    counts = plan_counts(pattern.indptr, pattern.indices, block_rows, window, WINDOW_HALF, WINDOW_FAR, threads)
    if counts[0]:
        raise ValueError(f"G has {counts[0]} column indices outside [0, {pattern.n})")
    return counts


def row_locality(pattern, rows_per_block, *, n_threads=1):
    """The share of stored off-diagonal entries (i, j) whose row j lies in i's block of
    ``rows_per_block`` rows when the ``"staged"`` variant stages it: the merges it serves from
    shared memory.  A ring lattice or a mesh in a banded order is close to 1, the same graph with
    its vertices shuffled close to 0."""
    _, off, in_block, _ = _counts(pattern, block_rows=rows_per_block, n_threads=n_threads)
    return in_block / off if off else 0.0


def window_locality(pattern, *, n_threads=1):
    """The share of stored off-diagonal entries (i, j) that the ``"window"`` variant computes from
    its row masks: |i - j| < 32, and rows i and j each with at most 4 entries 32 or more away
    from their own index.  Close to 1 for a ring lattice with few shortcuts or a narrow band,
    close to 0 for a shuffled or wide-band order (those pairs are merged, as in ``"pair"``)."""
    _, off, _, near = _counts(pattern, window=True, n_threads=n_threads)
    return near / off if off else 0.0


# --------------------------------------------------------------------------- launch shapes


def shortrow_group_size(degrees):
    """Lanes per row of the ``"shortrow"`` variant: the longest row rounded up to a power of two.

    Raises ValueError when a row has more than 32 entries (the variant's lists live in one warp).
    """
    top = DegreeFigures.of(degrees).top
    if top > SHORTROW_MAX_DEGREE:
        raise ValueError(f"the 'shortrow' variant needs every row to have at most {SHORTROW_MAX_DEGREE} stored "
                         f"entries; G has a row of {top}")
    return 1 << max(0, top - 1).bit_length() if top > 1 else 1


def warp_group_size(degrees):
    """Lanes per entry of the ``"warp"`` variant: about half the mean degree, 4 to 32."""
    mean = DegreeFigures.of(degrees).mean
    g = 4
    while g < 32 and g < mean / 2:
        g *= 2
    return g


def _mean(degrees):
    f = DegreeFigures.of(degrees)
    return f.total / f.n if f.n else 1.0


def pair_rows_per_block(degrees, *, entries=PAIR_ENTRIES_PER_BLOCK):
    """Rows per block of the ``"pair"`` variant: about ``entries`` upper entries per block.

    Half the mean degree is a row's expected number of upper entries; the result is a multiple
    of 8 from 8 to 256 (one block of threads).  A block with more upper entries than its shared
    list holds (2048) lists them in several passes.
    """
    rows = int(entries / max(_mean(degrees) / 2, 1.0))
    return int(min(BLOCK, max(8, rows - rows % 8)))


def staged_rows_per_block(degrees):
    """Rows per block of the ``"staged"`` variant: about ``STAGE_FILL * STAGE_CAP`` stored entries
    per block at the mean degree (so that nearly every block stages), a multiple of 8 from 8 to 256."""
    rows = int(STAGE_FILL * STAGE_CAP / max(_mean(degrees), 1.0))
    return int(min(BLOCK, max(8, rows - rows % 8)))


def window_rows_per_block(n, slots):
    """Rows per block of the ``"window"`` variant on a device that holds ``slots`` of its blocks at
    once: the fewest rows (a multiple of 8, at least 96, at most 256) that fit the whole graph in
    one wave of blocks.  Each block walks through a few phases whose latency does not shrink with
    fewer rows, so a second, partial wave costs nearly a block's whole time; past 256 rows a
    block's 256 threads run out, and big graphs take several waves of 256 rows."""
    rows = -(-int(n) // max(int(slots), 1))
    rows += -rows % 8
    return int(min(BLOCK, max(96, rows)))


# --------------------------------------------------------------------------- bitmaps and tables


def hub_vertices(degrees, *, min_degree, max_bytes, rows=None, n=None):
    """The vertices that get a bitmap in the ``"hub"`` and ``"longrow"`` variants, highest degree first.

    Vertices of degree >= ``min_degree``, as many of the highest-degree ones as fit in
    ``max_bytes`` at ``4 * ceil(n / 32)`` bytes per bitmap.  ``degrees``: every row's length, or
    with ``rows`` (increasing, every candidate among them) and ``n`` those rows' lengths.  Returns
    an int32 array.
    """
    d = np.asarray(degrees)
    rows = np.arange(d.size) if rows is None else np.asarray(rows)
    words = -(-(d.size if n is None else n) // 32)
    limit = int(max_bytes) // (4 * words) if words else 0
    if limit <= 0:
        return np.zeros(0, dtype=np.int32)
    candidates = np.flatnonzero(d >= max(1, min_degree))
    if candidates.size > limit:
        candidates = candidates[np.argpartition(-d[candidates], limit - 1)[:limit]]
    order = np.lexsort((candidates, -d[candidates]))  # by degree, then index: the same hubs every run
    return rows[candidates[order]].astype(np.int32)


def hash_table_rows(degrees, hubs, *, min_degree, rows=None):
    """The rows that get a hash table of their columns in the ``"longrow"`` variant, and where.

    The rows of degree >= ``min_degree`` (0: none) outside ``hubs`` (a hub's row tests its
    bitmap instead), in vertex order.  Row ``rows[w]``, of degree d, gets the
    max(4, 2^ceil(log2(2 d))) slots ``[slots[w], slots[w + 1])`` of one int32 array: a load
    factor of at most 1/2, at least one bucket of 4 slots, and the size that ``hash_shift`` of
    cuda_src/jaccard_search.cuh derives from d (so every table starts at a multiple of 4 slots,
    as its vector loads need).  Returns ``rows`` (int32) and ``slots`` (int64, one longer;
    ``slots[-1]`` is the size of all the tables).  ``degrees``: every row's length, or with
    ``rows`` (increasing, every chosen row among them) those rows' lengths.
    """
    d = np.asarray(degrees)
    if min_degree <= 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    rows = np.arange(d.size) if rows is None else np.asarray(rows)
    chosen = np.flatnonzero((d >= max(1, int(min_degree))) & ~np.isin(rows, np.asarray(hubs, dtype=np.int64)))
    # 2d - 1 has ceil(log2(2d)) significant bits, which frexp gives exactly below 2^53
    _, bits = np.frexp((2 * d[chosen].astype(np.int64) - 1).astype(np.float64))
    slots = np.zeros(chosen.size + 1, dtype=np.int64)
    np.cumsum(np.left_shift(np.int64(1), np.maximum(bits, HASH_BUCKET.bit_length() - 1).astype(np.int64)),
              out=slots[1:])
    return rows[chosen].astype(np.int32), slots
