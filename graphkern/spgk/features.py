"""The shortest-path kernel with discrete base kernels as an inner product of explicit features.

With ``DiracNode`` on zero or more integer label columns and ``DiracEdge`` on the lengths, the
kernel of the package docstring is ``K(G, G') = <phi(G), phi(G')>`` where ``phi(G)`` counts the
triplets ``(labels of a, labels of b, length of the shortest a-b path)`` over the ordered pairs
``(a, b)`` of distinct vertices with a path (both directions of each path, one length: the one
the pairwise methods use).  This is GraKeL's ``ShortestPath(with_labels=True)`` map.

Counting runs in compiled code (graphkern/_cpu/spgk_paths.pyx), one OpenMP pass over the graphs
with the shortest paths inside it.  A :class:`Vocabulary` learned from one list of graphs names
the columns; a triplet of another list that the vocabulary lacks (an unseen label or length)
scores 0 against every vocabulary graph but still counts in that graph's own ``K(G, G)``, which
:class:`TripletCounts` keeps apart.  Counts are integers and the products are accumulated in
float64, exact while every entry of ``K`` stays below 2**53.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from graphkern.basekernels.shortest_path import DiracEdge, DiracNode, node_features
from graphkern.graph import require_valid_all

# label-tuple ids and length ids below 2**ID_BITS each: a triplet's key fits in 63 bits
ID_BITS = 21
MAX_IDS = 1 << ID_BITS
# the CPU product: a dense tile of the Gram matrix at most this many bytes
_TILE_BYTES = 256 << 20
# work a thread is started for: graphs in a counting pass, entries of K in a product (a team's start
# and join cost about what this much work does)
GRAPHS_PER_THREAD = 32
ENTRIES_PER_THREAD = 1 << 16
# a scattered sparse multiply-add costs about this many dense (BLAS) ones: the CPU product sends
# each column the cheaper way
_SPARSE_COST = 8.0


def threads_for(work, per_thread, n_threads):
    """Threads worth starting for ``work`` units: one per ``per_thread`` units, 1 to ``n_threads``."""
    return int(max(1, min(n_threads, work // per_thread)))


def applies(node_kernel, edge_kernel):
    """Whether the kernel has a feature map: Dirac factors only (or none), Dirac lengths."""
    if not isinstance(edge_kernel, DiracEdge):
        return False
    return node_kernel is None or all(isinstance(f, DiracNode) for f in node_kernel.factors())


def label_columns(node_kernel):
    """The label columns the vertex kernel compares, each once, in order."""
    return () if node_kernel is None else tuple(dict.fromkeys(f.column for f in node_kernel.factors()))


def pack_structure(graphs, names):
    """``(node_offsets, edge_offsets, indptr, indices, weights)`` of ``graphs`` laid end to end, as
    graphkern/_cpu/spgk_paths.pyx reads them (``weights`` None when no graph is weighted).

    Row pointers and column indices are those of checked graphs (:func:`require_valid_all`: the
    compiled passes read them unguarded).  Weights must be non-negative and finite; ``names(k)``
    names graph ``k`` in the error.
    """
    require_valid_all(graphs)
    G = len(graphs)
    indptrs, indices = [None] * G, [None] * G
    weighted = False
    for k, g in enumerate(graphs):
        indptrs[k], indices[k] = g.indptr, g.indices
        weighted = weighted or g.weights is not None
    node_offsets = np.zeros(G + 1, np.int64)
    edge_offsets = np.zeros(G + 1, np.int64)
    np.cumsum(np.fromiter(map(len, indptrs), np.int64, G) - 1, out=node_offsets[1:])
    np.cumsum(np.fromiter(map(len, indices), np.int64, G), out=edge_offsets[1:])
    indptr = np.concatenate(indptrs or [np.zeros(0, np.int64)]).astype(np.int64, copy=False)
    index = np.concatenate(indices or [np.zeros(0, np.int32)]).astype(np.int32, copy=False)
    weights = None
    if weighted:
        weights = np.concatenate([g.weight_array() for g in graphs]).astype(np.float64, copy=False)
        bad = ~np.isfinite(weights) | (weights < 0)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            gi = int(np.searchsorted(edge_offsets, k, side="right") - 1)
            g, local = graphs[gi], k - int(edge_offsets[gi])
            i = int(np.searchsorted(g.indptr, local, side="right") - 1)
            problem = "negative" if weights[k] < 0 else "non-finite"
            raise ValueError(f"{names(gi)} has a {problem} edge weight {weights[k]} on edge ({i}, "
                             f"{int(g.indices[local])}): shortest paths need non-negative finite weights")
    return node_offsets, edge_offsets, indptr, index, weights


def _rows_as_keys(rows):
    """Each row of an int64 ``(N, k)`` array as one comparable scalar (a byte string)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return rows.view(np.dtype((np.void, 8 * rows.shape[1]))).ravel() if rows.shape[1] else np.zeros(len(rows), np.int8)


# one label column spanning fewer values than this is numbered through a table, not a sort
_TABLE_SPAN = 1 << 20


def _label_ids(discrete):
    """``(labels, ids)``: the distinct rows of the int64 ``(N, k)`` label array, sorted (``(L, k)``;
    one empty row when ``k`` is 0 and ``N`` > 0), and each vertex's row number in them (int64)."""
    if discrete.shape[1] == 0:
        return np.zeros((min(1, len(discrete)), 0), np.int64), np.zeros(len(discrete), np.int64)
    if discrete.shape[1] == 1 and len(discrete):
        col = discrete[:, 0]
        lo, hi = int(col.min()), int(col.max())
        if hi - lo < _TABLE_SPAN:  # atomic numbers, residue codes: a table beats a sort
            present = np.zeros(hi - lo + 1, bool)
            present[col - lo] = True
            number = np.cumsum(present) - 1
            return (np.flatnonzero(present) + lo).reshape(-1, 1), number[col - lo]
    uniq, ids = np.unique(_rows_as_keys(discrete), return_inverse=True)
    rows = uniq.view(np.int64).reshape(len(uniq), discrete.shape[1])
    order = np.lexsort(rows.T[::-1])  # the byte order of the keys is not the values' order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rows[order], rank[ids.reshape(-1)]


def _match_rows(reference, rows):
    """For each row of ``rows``, its index in the distinct rows ``reference`` (same width), or -1."""
    if len(reference) == 0 or reference.shape[1] != rows.shape[1]:
        return np.full(len(rows), -1, np.int64)
    mine = _rows_as_keys(reference)
    order = np.argsort(mine)
    theirs = _rows_as_keys(rows)
    pos = np.minimum(np.searchsorted(mine[order], theirs), len(mine) - 1)
    return np.where(mine[order[pos]] == theirs, order[pos], -1)


class TripletCounts:
    """Each graph's triplet histogram in batch-local ids: ``row_offsets`` (graph g's triplets are
    ``[row_offsets[g], row_offsets[g+1])``), ``labels`` (the distinct label tuples, ``(L, k)``
    int64, sorted), ``la``, ``lb`` (label-tuple ids), ``lengths`` (float64), ``counts`` (int64),
    and ``self_dot`` (``K(G, G)``, float64, over every triplet)."""

    def __init__(self, graphs, node_kernel, n_threads, names):
        from graphkern._cpu import spgk_paths

        structure = pack_structure(graphs, names)
        _, discrete, _, _ = node_features(node_kernel, graphs)
        self.labels, ids = _label_ids(discrete)
        n_labels = max(1, len(self.labels))
        self.row_offsets, pairs, self.lengths, self.counts = spgk_paths.triplet_counts(
            *structure, ids, n_labels, threads_for(len(graphs), GRAPHS_PER_THREAD, n_threads))
        self.la, self.lb = np.divmod(pairs, n_labels)
        row = np.repeat(np.arange(len(graphs)), np.diff(self.row_offsets))
        self.self_dot = np.bincount(row, weights=self.counts.astype(np.float64) ** 2, minlength=len(graphs))
        self.cache = {}  # what a vocabulary made of these counts (keyed by the vocabulary's id)

    def __len__(self):
        return len(self.row_offsets) - 1


class Vocabulary:
    """The triplets of one list of graphs, one column each, in a fixed order.

    ``labels`` ``(L, k)``: the label tuples (``k`` label columns, ``columns``); ``lengths``: the
    path lengths; ``keys``: the columns, each ``la << 2 ID_BITS | lb << ID_BITS | length id``
    with ids into ``labels`` and ``lengths``, sorted.
    """

    def __init__(self, counts, columns):
        if len(counts.labels) > MAX_IDS:
            raise ValueError(f"the feature map supports up to {MAX_IDS} distinct label tuples; the graphs have "
                             f"{len(counts.labels)}: use the pairwise methods (method='openmp_out' or a GPU method)")
        self.columns = tuple(columns)
        self.labels = counts.labels
        self.lengths = np.unique(counts.lengths)
        if len(self.lengths) > MAX_IDS:
            raise ValueError(f"the feature map supports up to {MAX_IDS} distinct path lengths; the graphs have "
                             f"{len(self.lengths)}: use the pairwise methods (method='openmp_out' or a GPU method)")
        lid = np.searchsorted(self.lengths, counts.lengths)
        nl, nd = max(1, len(self.labels)), max(1, len(self.lengths))
        if nl * nl * nd <= _TABLE_SPAN:  # the few label pairs and lengths of real sets: a table, no sort
            code = (counts.la * nl + counts.lb) * nd + lid
            present = np.zeros(nl * nl * nd, bool)
            present[code] = True
            col = (np.cumsum(present) - 1)[code]
            la, rest = np.divmod(np.flatnonzero(present), nl * nd)
            lb, lid = np.divmod(rest, nd)
            self.keys = (la << (2 * ID_BITS)) | (lb << ID_BITS) | lid
        else:
            self.keys, col = np.unique((counts.la << (2 * ID_BITS)) | (counts.lb << ID_BITS) | lid,
                                       return_inverse=True)
        # the graphs it was learned from hold only its columns: their matrix needs no matching
        self._cached(counts, self._phi(counts, col.reshape(-1), counts.row_offsets))

    def __len__(self):
        return len(self.keys)

    def names(self):
        """One ``(labels of a, labels of b, length)`` per column; a label tuple holds the values of
        ``columns`` in order (empty without a vertex kernel)."""
        la, rest = np.divmod(self.keys, 1 << (2 * ID_BITS))
        lb, lid = np.divmod(rest, 1 << ID_BITS)
        lab = [tuple(int(v) for v in row) for row in self.labels]
        return [(lab[a], lab[b], float(self.lengths[d])) for a, b, d in zip(la, lb, lid)]

    def matrix(self, counts):
        """``counts`` over these columns: a CSR matrix (int64), one row per graph; triplets not in
        the vocabulary are left out."""
        got = counts.cache.get(id(self))
        if got is not None and got[0] is self:
            return got[1]
        label_id = _match_rows(self.labels, counts.labels)
        la, lb = label_id[counts.la], label_id[counts.lb]
        pos = np.minimum(np.searchsorted(self.lengths, counts.lengths), max(len(self.lengths) - 1, 0))
        lid = np.where(self.lengths[pos] == counts.lengths, pos, -1) if len(self.lengths) else np.full(len(pos), -1)
        keep = (la >= 0) & (lb >= 0) & (lid >= 0)
        key = (la << (2 * ID_BITS)) | (lb << ID_BITS) | lid
        col = np.minimum(np.searchsorted(self.keys, key), max(len(self.keys) - 1, 0))
        if len(self.keys):
            keep &= self.keys[col] == key
        else:
            keep[:] = False
        row = np.repeat(np.arange(len(counts), dtype=np.int64), np.diff(counts.row_offsets))
        indptr = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(np.bincount(row[keep], minlength=len(counts)), out=indptr[1:])
        return self._cached(counts, self._phi(counts, col[keep], indptr, keep))

    def _phi(self, counts, col, indptr, keep=None):
        # a copy of the counts either way: sorting the rows permutes the matrix's arrays in place
        data = counts.counts.copy() if keep is None else counts.counts[keep]
        phi = sp.csr_matrix((data, col, indptr.copy()), shape=(len(counts), len(self.keys)))
        phi.has_sorted_indices = False
        phi.sort_indices()
        return phi

    def _cached(self, counts, phi):
        counts.cache[id(self)] = (self, phi)
        return phi


def scale_tile(tile, dx, dy):
    """Normalise a tile of ``K`` in place as the pairwise path does: ``K / sqrt(dx dy)``, 0 where
    that is 0."""
    scale = np.sqrt(np.outer(dx, dy))
    positive = scale > 0
    np.divide(tile, scale, out=tile, where=positive)
    tile[~positive] = 0.0


def gram_cpu(A, B, out, *, symmetric, n_threads, scale=None, progress=None):
    """``out = A B^T`` (``A``, ``B`` CSR count matrices) in tiles of rows; ``symmetric``: ``B`` is
    ``A`` and only entries on and above the diagonal are summed (then mirrored).  ``scale``:
    ``(dx, dy)`` to normalise each tile.

    The columns are split by cost: a triplet in ``c_a`` rows of ``A`` and ``c_b`` of ``B`` costs
    ``c_a c_b`` scattered multiply-adds in a sparse product but ``na nb`` in a dense one, so the
    frequent triplets go through dense BLAS tiles and the rare ones through a compiled sparse
    product (parallel over rows, added straight into ``out``)."""
    from graphkern._cpu import spgk_paths

    na, nb, F = A.shape[0], B.shape[0], A.shape[1]
    # a symmetric C-ordered output gets its lower triangle in one compiled pass at the end
    mirror_at_end = symmetric and out.flags.c_contiguous and out.dtype == np.float64
    mirror_threads = threads_for(na * nb, ENTRIES_PER_THREAD, n_threads)
    freq = np.bincount(A.indices, minlength=F).astype(np.float64) * np.bincount(B.indices, minlength=F)
    frequent = _SPARSE_COST * freq > float(na) * nb
    frequent &= np.cumsum(frequent) * nb * 8 <= 4 * _TILE_BYTES  # the dense columns of B fit in memory
    Ad, As = A[:, frequent], A[:, ~frequent]
    Bd = B[:, frequent].T.toarray().astype(np.float64) if frequent.any() else None
    Bs = B[:, ~frequent].tocsc()
    Bs.sort_indices()
    columns = (Bs.indptr.astype(np.int64), Bs.indices.astype(np.int32), Bs.data.astype(np.int64))
    step = max(1, min(na, _TILE_BYTES // max(8 * max(nb, F), 1)))
    n_threads = threads_for(min(step, na) * nb, ENTRIES_PER_THREAD, n_threads)
    with _blas_threads(n_threads):
        for i0 in range(0, na, step):
            i1 = min(na, i0 + step)
            j0 = i0 if symmetric else 0
            rows = out[i0:i1] if out[i0:i1].flags.c_contiguous else np.empty((i1 - i0, nb))
            if Bd is None:
                rows[:, j0:] = 0.0
            else:
                # straight into the output: a temporary of this size costs more in page faults (and
                # the copy) than the product itself, whose depth is only the frequent columns
                np.matmul(Ad[i0:i1].toarray().astype(np.float64), Bd[:, j0:], out=rows[:, j0:])
            a = As[i0:i1]
            spgk_paths.gram_sparse(a.indptr.astype(np.int64), a.indices.astype(np.int32), a.data.astype(np.int64),
                                   *columns, rows, i0, symmetric, n_threads, not mirror_at_end)
            if not np.shares_memory(rows, out):
                out[i0:i1, j0:] = rows[:, j0:]
            if scale is not None:
                scale_tile(out[i0:i1, j0:], scale[0][i0:i1], scale[1][j0:])
            if symmetric and not mirror_at_end:
                out[i1:, i0:i1] = out[i0:i1, i1:].T
            if progress is not None:
                progress.update((i1 - i0) * (nb - j0))
    if mirror_at_end:
        spgk_paths.mirror_upper(out, mirror_threads)
    return out


_CONTROLLER = []  # threadpoolctl's view of the loaded BLAS, made once (it reads every loaded library)


class _blas_threads:
    """Limit the BLAS threads to ``n`` inside the block (threadpoolctl when installed)."""

    def __init__(self, n):
        self.n, self.limit = n, None

    def __enter__(self):
        if not _CONTROLLER:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                _CONTROLLER.append(None)
            else:
                _CONTROLLER.append(ThreadpoolController())
        if _CONTROLLER[0] is not None:
            self.limit = _CONTROLLER[0].limit(limits=self.n, user_api="blas")
        return self

    def __exit__(self, *exc):
        if self.limit is not None:
            self.limit.restore_original_limits()
