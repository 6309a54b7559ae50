"""The shortest-path kernel with discrete base kernels as an inner product of explicit features.

With ``DiracNode`` on zero or more integer label columns and ``DiracEdge`` on the lengths, the
kernel of the package docstring is ``K(G, G') = <phi(G), phi(G')>`` where ``phi(G)`` counts the
triplets ``(labels of a, labels of b, length of the shortest a-b path)`` over the ordered pairs
``(a, b)`` of distinct vertices with a path (both directions of each path, one length: the one
the pairwise methods use).  This is GraKeL's ``ShortestPath(with_labels=True)`` map.

Counting runs in compiled code (graphkern/_cpu/spgk_paths.pyx), one OpenMP pass over the graphs
with the shortest paths inside it; on the GPU backend, for unweighted graphs of at most 64 vertices
(molecules), a warp a graph on the device (graphkern.spgk.features_gpu), which numbers the columns
too and leaves the counts there for the Gram product.  A :class:`Vocabulary` learned from one list of graphs names
the columns; a triplet of another list that the vocabulary lacks (an unseen label or length)
scores 0 against every vocabulary graph but still counts in that graph's own ``K(G, G)``, which
:class:`TripletCounts` keeps apart.  Counts are integers and the products are accumulated in
float64, exact while every entry of ``K`` stays below 2**53.
"""

from __future__ import annotations

import contextlib

import numpy as np
import scipy.sparse as sp

from graphkern.basekernels.shortest_path import DiracEdge, DiracNode, node_features
from graphkern.graph import Graph, require_valid_all

# label-tuple ids and length ids below 2**ID_BITS each: a triplet's key fits in 63 bits
ID_BITS = 21
MAX_IDS = 1 << ID_BITS
# the CPU product: a dense tile of the Gram matrix at most this many bytes
_TILE_BYTES = 256 << 20
# work a thread is started for: graphs in a counting pass, entries of K in a product (a team's start
# and join cost about what this much work does).  Counting a molecule is cheap: on a thousand of
# them a team larger than eight costs more to start than it saves (the counts by team size are in
# bench/results)
GRAPHS_PER_THREAD = 128
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


def pack(graphs, names, node_kernel=None, n_threads=1):
    """``(structure, labels)``: ``structure`` is ``(node_offsets, edge_offsets, indptr, indices,
    weights)`` of ``graphs`` laid end to end as graphkern/_cpu/spgk_paths.pyx reads them
    (``weights`` None when no graph is weighted), ``labels`` int64 ``(N, k)`` the vertices' values of
    the ``k`` label columns ``node_kernel``'s Dirac factors read (:func:`label_columns`).

    One compiled pass over the graphs' arrays, which also checks the row pointers and column
    indices of graphs not yet known valid (the compiled passes read them unguarded), the weights
    (non-negative and finite; ``names(k)`` names graph ``k`` in the error) and the label columns
    (present, integer), with the errors of :func:`require_valid_all` and :func:`node_features`.
    """
    from graphkern._cpu import spgk_paths

    columns = label_columns(node_kernel)
    graphs = graphs if type(graphs) is list else list(graphs)
    *structure, labels, problems = spgk_paths.pack(graphs, Graph, columns, n_threads)
    not_graph, bad_structure, bad_weight, bad_label = problems.tolist()
    if not_graph >= 0:
        raise TypeError(f"item {not_graph} is a {type(graphs[not_graph]).__name__}, expected graphkern.Graph")
    if bad_structure >= 0:
        require_valid_all(graphs)  # raises, naming the first graph at fault
    if bad_weight >= 0:
        edge_offsets, weights = structure[1], structure[4]
        gi = int(np.searchsorted(edge_offsets, bad_weight, side="right") - 1)
        g, local = graphs[gi], bad_weight - int(edge_offsets[gi])
        i = int(np.searchsorted(g.indptr, local, side="right") - 1)
        w = weights[bad_weight]
        raise ValueError(f"{names(gi)} has a {'negative' if w < 0 else 'non-finite'} edge weight {w} on edge ({i}, "
                         f"{int(g.indices[local])}): shortest paths need non-negative finite weights")
    if bad_label >= 0:
        node_features(node_kernel, graphs)  # raises, naming the graph and the column
    if max(bad_structure, bad_label) >= 0:
        raise ValueError(f"{names(max(bad_structure, bad_label))} cannot be read by the shortest-path kernel")
    return tuple(structure), labels


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
        from graphkern._cpu import spgk_paths

        # atomic numbers, residue codes: a table beats a sort
        got = spgk_paths.number_labels(np.ascontiguousarray(discrete[:, 0]), _TABLE_SPAN)
        if got is not None:
            return got
    uniq, ids = np.unique(_rows_as_keys(discrete), return_inverse=True)
    rows = uniq.view(np.int64).reshape(len(uniq), discrete.shape[1])
    order = np.lexsort(rows.T[::-1])  # the byte order of the keys is not the values' order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rows[order], rank[ids.reshape(-1)]


def _length_ids(lengths):
    """``(distinct, ids)``: the sorted distinct path lengths and each length's index in them (int64);
    whole lengths below _TABLE_SPAN (hop counts) through a compiled table, others through a sort."""
    from graphkern._cpu import spgk_paths

    got = spgk_paths.number_lengths(lengths, _TABLE_SPAN)
    if got is not None:
        return got
    distinct, ids = np.unique(lengths, return_inverse=True)
    return distinct, ids.reshape(-1)


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
    ``[row_offsets[g], row_offsets[g+1])``, sorted by ``(la, lb, length)``), ``labels`` (the
    distinct label tuples, ``(L, k)`` int64, sorted), ``la``, ``lb`` (label-tuple ids), ``lengths``
    (float64), ``counts`` (int64), and ``self_dot`` (``K(G, G)``, float64, over every triplet).

    ``device``: count on that GPU where its kernel applies (graphkern.spgk.features_gpu), which
    also numbers the batch's own vocabulary (kept in ``cache["vocabulary"]``) and leaves the
    counts on the device as ``device_rows`` for the Gram product there; the host's copies of the
    triplets are read back when first asked for.
    """

    def __init__(self, graphs, node_kernel, n_threads, names, device=None):
        from graphkern._cpu import spgk_paths

        structure, discrete = pack(graphs, names, node_kernel, n_threads)
        self.labels, ids = _label_ids(discrete)
        self.cache = {}  # what a vocabulary made of these counts (keyed by the vocabulary's id)
        self.device_rows = self._triplets = self._columns = None
        n_labels = max(1, len(self.labels))
        got = None
        if device is not None and n_labels <= MAX_IDS:
            from graphkern.spgk import features_gpu

            got = features_gpu.triplet_counts(device, structure, ids, n_labels, ID_BITS)
        if got is None:
            self.row_offsets, la, lb, lengths, self._counts, self.self_dot = spgk_paths.triplet_counts(
                *structure, ids, n_labels, threads_for(len(graphs), GRAPHS_PER_THREAD, n_threads))
            self._triplets = (la, lb, lengths)
        else:
            self.row_offsets, self.self_dot, keys, lengths, self.device_rows = got
            self._counts = None
            self.cache["vocabulary"] = Vocabulary.numbered(self, label_columns(node_kernel), keys, lengths)

    @property
    def counts(self):
        if self._counts is None:
            self._read_back()
        return self._counts

    def columns(self):
        """Each triplet's column in the vocabulary the device numbered (int32)."""
        if self._columns is None:
            self._read_back()
        return self._columns

    def _read_back(self):
        self._columns, self._counts = self.device_rows.to_host()

    @property
    def la(self):
        return self._expanded()[0]

    @property
    def lb(self):
        return self._expanded()[1]

    @property
    def lengths(self):
        return self._expanded()[2]

    def _expanded(self):
        """``(la, lb, lengths)`` of every triplet: from the vocabulary the device numbered."""
        if self._triplets is None:
            vocab = self.cache["vocabulary"]
            la, rest = np.divmod(vocab.keys, 1 << (2 * ID_BITS))
            lb, lid = np.divmod(rest, 1 << ID_BITS)
            col = self.columns()
            self._triplets = (la[col], lb[col], vocab.lengths[lid[col]])
        return self._triplets

    def __getstate__(self):
        state = dict(self.__dict__)
        if self.device_rows is not None:  # the host's copies travel, not the device's
            state["_counts"], state["_columns"], state["device_rows"] = self.counts, self._columns, None
        return state

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
        from graphkern._cpu import spgk_paths

        self.columns = tuple(columns)
        self.labels = counts.labels
        nl = max(1, len(self.labels))
        # the few label pairs and hop counts of real sets: one table, lengths and columns at once
        got = spgk_paths.number_columns(counts.la, counts.lb, counts.lengths, nl, _TABLE_SPAN, ID_BITS)
        if got is not None:
            self.lengths, self.keys, col = got
        else:
            self.lengths, lid = _length_ids(counts.lengths)
            if len(self.lengths) > MAX_IDS:
                raise ValueError(f"the feature map supports up to {MAX_IDS} distinct path lengths; the graphs have "
                                 f"{len(self.lengths)}: use the pairwise methods (method='openmp_out' or a GPU "
                                 "method)")
            got = spgk_paths.number_columns(counts.la, counts.lb, lid, nl, _TABLE_SPAN, ID_BITS)
            if got is not None:  # few label pairs and distinct lengths
                _, self.keys, col = got
            else:
                self.keys, col = np.unique((counts.la << (2 * ID_BITS)) | (counts.lb << ID_BITS) | lid,
                                           return_inverse=True)
        # the graphs it was learned from hold only its columns: their matrix needs no matching
        self._cached(counts, self._phi(counts, col.reshape(-1), counts.row_offsets))

    @classmethod
    def numbered(cls, counts, columns, keys, lengths):
        """The vocabulary of ``counts`` as numbered elsewhere (on the device): its sorted ``keys``
        and the ``lengths`` their ids index; ``counts.columns()`` gives each triplet's column."""
        self = cls.__new__(cls)
        self.columns = tuple(columns)
        self.labels = counts.labels
        self.lengths, self.keys = lengths, keys
        return self

    def __len__(self):
        return len(self.keys)

    def names(self):
        """One ``(labels of a, labels of b, length)`` per column; a label tuple holds the values of
        ``columns`` in order (empty without a vertex kernel)."""
        la, rest = np.divmod(self.keys, 1 << (2 * ID_BITS))
        lb, lid = np.divmod(rest, 1 << ID_BITS)
        lab = [tuple(int(v) for v in row) for row in self.labels]
        return [(lab[a], lab[b], float(self.lengths[d])) for a, b, d in zip(la, lb, lid)]

    def matrix(self, counts, device=None):
        """``counts`` over these columns: a CSR matrix (int64), one row per graph; triplets not in
        the vocabulary are left out.  ``device`` (an ordinal): the rows the device counted instead
        (graphkern.spgk.features_gpu.DeviceRows), where they are there and numbered with this
        vocabulary."""
        rows = counts.device_rows
        if rows is not None and device is not None and rows.device.ordinal == device and \
                counts.cache.get("vocabulary") is self:
            return rows
        got = counts.cache.get(id(self))
        if got is not None and got[0] is self:
            return got[1]
        if counts.cache.get("vocabulary") is self and counts._triplets is None:  # numbered on the device
            return self._cached(counts, self._phi(counts, counts.columns(), counts.row_offsets))
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
        # each graph's triplets come in (la, lb, length) order and the columns are numbered in the
        # same order (label tuples and lengths sorted in both lists): every row is sorted already
        data = counts.counts if keep is None else counts.counts[keep]
        phi = sp.csr_matrix((data, col, indptr), shape=(len(counts), len(self.keys)))
        phi.has_sorted_indices = True
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
    from graphkern._cpu import spgk_gram

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
            spgk_gram.gram_sparse(a.indptr.astype(np.int64), a.indices.astype(np.int32), a.data.astype(np.int64),
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
        spgk_gram.mirror_upper(out, mirror_threads)
    return out


_CONTROLLER = []  # threadpoolctl's view of the loaded BLAS, made once (it reads every loaded library)


@contextlib.contextmanager
def _blas_threads(n):
    """Limit the BLAS threads to ``n`` inside the block (threadpoolctl when installed)."""
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _CONTROLLER.append(None)
        else:
            _CONTROLLER.append(ThreadpoolController())
    if _CONTROLLER[0] is None:
        yield
    else:
        with _CONTROLLER[0].limit(limits=n, user_api="blas"):
            yield
