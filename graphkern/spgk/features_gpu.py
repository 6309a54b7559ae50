"""The feature map on the GPU (cuda_src/spgk_features.cu): each graph's triplet counts, and the Gram
matrix, streamed in row tiles.

The counting covers the common case of molecules: unweighted graphs of at most 64 vertices whose
tables fit the kernel's (:func:`triplet_counts` says None otherwise, and the host counts).  It gives
the host's arrays bit for bit, and the columns of the batch's own vocabulary with them, so that the
host neither counts nor numbers; the counts stay on the device for the product (:class:`DeviceRows`).

Both count matrices go to the device as dense float64 rows (scattered there from CSR).  The Gram
matrix is made a tile of rows at a time and each tile is copied into ``out`` (host memory or a memory
map) while the next one is computed: a tile (_TILE_BYTES) is large enough that each copy's fixed
costs (the staging lanes taken and started, the slowest lane's tail) stay small beside its bytes, and
small enough that three or more overlap at 10^4 graphs.  A symmetric Gram matrix that fits on the
device is kept there whole (_RESIDENT_SHARE): each off-diagonal 64 x 64 block is computed once and
written to both sides, so the product costs half; otherwise each tile is computed in full into one
of two buffers.

A finished tile comes back through the runtime's staged copy (graphkern._cuda.runtime.copy_to_pageable):
pinned chunks on several host threads, each copying one chunk into ``out`` while the next crosses
the bus.  A Gram matrix is mostly fresh pages, whose first touch paces the copy more than the bus
does, so the host threads matter more than the chunks' size (docs/performance.md has the rates).
"""

from __future__ import annotations

import numpy as np

# The kernels' tiles and the counting's limits and output layout come from the module's exports
# (graphkern._cuda.runtime.exports): ``tile`` rows and columns of output per block, ``depth`` feature
# columns per step, ``threads`` per block; the counting runs a warp a graph, ``count_warps`` a block,
# on graphs of at most ``max_vertices`` vertices (a 64-bit row each), and its output starts with
# ``header`` words of sizes.
_MAX_GRID_Y = 65535  # a tile's blocks of rows (the grid's second dimension)
# a tile of rows holds at most this many bytes of output: one is copied out while the next computes
_TILE_BYTES = 256 << 20
# a symmetric Gram matrix is kept whole on the device when it takes at most this share of the free memory
_RESIDENT_SHARE = 0.5
# the counting's table over (label, label, hops) of a batch has at most this many cells
_TABLE_CELLS = 1 << 24


def _pad(n, tile):
    return -(-max(n, 1) // tile) * tile


def _dense(rt, dev, M, rank, depth, stream):
    """The CSR count matrix ``M`` as dense float64 rows of ``depth`` columns on the device (column
    ``j`` at ``rank[j]``, a device int32 array), its rows padded with zeros to a multiple of the
    tile; and the flags of its (tile, depth step) blocks that hold a nonzero."""
    lim = rt.exports(dev, "spgk_features")
    rows = _pad(M.shape[0], lim.tile)
    dense = rt.alloc(dev, (rows, depth), np.float64)
    dense.zero(stream=stream)
    flags = rt.alloc(dev, (rows // lim.tile, depth // lim.depth), np.uint8)
    flags.zero(stream=stream)
    if M.nnz:
        if isinstance(M, DeviceRows):
            indptr, cols, counts = M.indptr, M.indices, M.data
        else:
            indptr = rt.to_device(dev, M.indptr.astype(np.int64, copy=False), stream=stream)
            cols = rt.to_device(dev, M.indices.astype(np.int32, copy=False), stream=stream)
            counts = rt.to_device(dev, M.data.astype(np.int64, copy=False), stream=stream)
        grid = max(1, min(-(-M.shape[0] // (lim.threads // 32)), 65535))
        rt.launch(rt.kernel(dev, "spgk_features", "spgk_features_scatter"), grid, lim.threads,
                  (indptr, cols, counts, rank, np.int64(M.shape[0]), dense, np.int64(depth), flags), stream=stream)
        stream.synchronize()  # the host arrays of the copies above go out of scope
    return dense, flags


def triplet_counts(device, structure, ids, n_labels, id_bits):
    """The triplet counts of the packed graphs ``structure`` (:func:`graphkern.spgk.features.pack`)
    with vertex label ids ``ids`` (int64, below ``n_labels``) counted on ``device``, or None where
    the kernel does not apply (weighted graphs, more than 64 vertices, a graph's table too large).

    Returns ``(row_offsets, self_dot, keys, lengths, rows)``: per graph the offsets of its triplets
    and ``K(G, G)`` (as :func:`graphkern._cpu.spgk_paths.triplet_counts` gives them), the batch's
    distinct triplets as sorted ``keys`` ``la << 2 id_bits | lb << id_bits | length id``, the
    distinct ``lengths`` (float64) the ids index, and the triplets themselves as :class:`DeviceRows`
    over those columns (each graph's in ``(la, lb, length)`` order), left on the device.
    """
    from graphkern._cuda import runtime as rt

    node_offsets, edge_offsets, indptr, indices, weights = structure
    G = len(node_offsets) - 1
    if weights is not None or G == 0:
        return None
    dev = rt.get_device(device)
    lim = rt.exports(dev, "spgk_features")
    sizes = np.diff(node_offsets)
    width = max(1, int(sizes.max()))
    cells = n_labels * n_labels * width
    if width > lim.max_vertices or cells > _TABLE_CELLS:
        return None
    bound = int(np.dot(sizes, sizes - 1))  # a graph has at most its ordered pairs' triplets
    stream = rt.Stream(dev)
    # the graphs in one copy (the int32 indices last, so every int64 array stays aligned)
    inputs = (node_offsets, edge_offsets, indptr, ids, indices)
    block = rt.to_device(dev, np.concatenate([a.view(np.uint8) for a in inputs]), stream=stream)
    ends = np.cumsum([a.nbytes for a in inputs]).tolist()
    node_offsets, edge_offsets, indptr, ids, indices = (block.view(end - a.nbytes, a.nbytes)
                                                        for a, end in zip(inputs, ends))
    # scratch: the columns of the cells (int64); the marks of the cells and hop counts, zeroed; each
    # graph's number of triplets (int32)
    scratch = rt.alloc(dev, 8 * (cells + 1) + 4 * (cells + lim.max_vertices + G), np.uint8)
    columns = scratch.view(0, 8 * (cells + 1))
    marks = scratch.view(8 * (cells + 1), 4 * (cells + lim.max_vertices))
    used, hops = marks.view(0, 4 * cells), marks.view(4 * cells, 4 * lim.max_vertices)
    found = scratch.view(8 * (cells + 1) + 4 * (cells + lim.max_vertices), 4 * G)
    marks.zero(stream=stream)
    head = lim.header + 2 * G + 1 + lim.max_vertices
    out = rt.alloc(dev, head + 2 * min(cells, bound) + 1, np.int64)
    out.view(0, 8 * lim.header).zero(stream=stream)
    count = rt.kernel(dev, "spgk_features", "spgk_count_graphs")
    grid = min(-(-G // lim.count_warps), 1 << 20)
    args = (rt.layout(dev, "spgk_features", "graphs").pack(
                node_offsets=node_offsets, edge_offsets=edge_offsets, indptr=indptr, indices=indices, labels=ids,
                n_graphs=G, n_labels=n_labels, width=width),
            rt.layout(dev, "spgk_features", "tables").pack(used=used, hops=hops, found=found, columns=columns, out=out))
    rt.launch(count, grid, 32 * lim.count_warps, (*args, np.int32(0), None), stream=stream)
    rt.launch(rt.kernel(dev, "spgk_features", "spgk_count_offsets"), 1, 1024, (found, np.int64(G), out),
              stream=stream)
    rt.launch(rt.kernel(dev, "spgk_features", "spgk_count_columns"), 1, 1024, (*args, np.int32(id_bits)),
              stream=stream)
    header = out.copy_to_host(np.empty(lim.header, np.int64), stream)
    stream.synchronize()
    nnz, F, n_lengths, too_large = header.tolist()
    if too_large:
        return None
    # the rows the product reads, kept with the counts: sized now, their offsets copied in
    rows = rt.alloc(dev, G + 1 + nnz + -(-nnz // 2), np.int64)
    rows.copy_from_device(out, 8 * (G + 1), stream, 0, 8 * lim.header)
    rt.launch(count, grid, 32 * lim.count_warps, (*args, np.int32(1), rows), stream=stream)
    host = out.copy_to_host(np.empty(head + 2 * F, np.int64), stream)
    stream.synchronize()
    at = lim.header + G + 1
    device_rows = DeviceRows((G, F), nnz, rows.view(0, 8 * (G + 1)), rows.view(8 * (G + 1 + nnz), 4 * nnz),
                             rows.view(8 * (G + 1), 8 * nnz), host[head + F:])
    return (host[lim.header:at], host[at:at + G].view(np.float64), host[head:head + F],
            host[at + G:head].view(np.float64)[:n_lengths], device_rows)


class DeviceRows:
    """A count matrix ``shape`` with ``nnz`` entries as CSR arrays on a device: ``indptr`` (int64),
    ``indices`` (int32), ``data`` (int64); ``holding``: how many rows hold each column (host)."""

    def __init__(self, shape, nnz, indptr, indices, data, holding):
        self.shape, self.nnz = shape, nnz
        self.indptr, self.indices, self.data, self.holding = indptr, indices, data, holding
        self.device = indptr.device

    def to_host(self):
        """``(indices, data)`` copied into host memory."""
        return (self.indices.copy_to_host(np.empty(self.nnz, np.int32)),
                self.data.copy_to_host(np.empty(self.nnz, np.int64)))


def features_gram(device, A, B, out, *, symmetric, scale=None, progress=None, n_threads=1):
    """``out = A B^T`` for count matrices ``A`` ``(na, F)`` and ``B`` ``(nb, F)`` (CSR, or
    :class:`DeviceRows` on ``device``); ``scale``:
    ``(dx, dy)`` to normalise as the host does.  ``symmetric`` (``B`` is ``A``) uploads one copy
    and, when the whole matrix fits on the device, computes each off-diagonal block once;
    ``n_threads`` host threads copy the tiles into ``out``."""
    from graphkern._cuda import runtime as rt

    na, nb = A.shape[0], B.shape[0]
    if na == 0 or nb == 0:
        return out
    dev = rt.get_device(device)
    lim = rt.exports(dev, "spgk_features")
    side = lim.tile
    depth = max(lim.depth, -(-A.shape[1] // lim.depth) * lim.depth)
    step = max(side, min(_pad(na, side), _TILE_BYTES // (8 * nb) // side * side, _MAX_GRID_Y * side))
    free, _ = dev.memory_info()
    inputs = 8 * depth * (_pad(nb, side) + (0 if symmetric else _pad(na, side))) + (16 * (na + nb) if scale else 0)
    resident = symmetric and inputs + 8 * na * nb <= _RESIDENT_SHARE * free
    if not resident:
        while step > side and inputs + 2 * 8 * step * nb > 0.9 * free:
            step = max(side, step // 2 // side * side)
    rt.check_fits(dev, inputs + (8 * na * nb if resident else 2 * 8 * step * nb),
                  f"the shortest-path features of {na} x {nb} graphs ({A.shape[1]} triplets) and the output tiles")
    stream = rt.Stream(dev)
    # the columns by decreasing frequency, so that the rare ones gather in steps most tiles skip
    rank = np.empty(A.shape[1], np.int32)
    holding = B.holding if isinstance(B, DeviceRows) else np.bincount(B.indices, minlength=A.shape[1])
    rank[np.argsort(-holding, kind="stable")] = np.arange(A.shape[1])
    rank = rt.to_device(dev, rank, stream=stream)
    dB, fB = _dense(rt, dev, B, rank, depth, stream)
    dA, fA = (dB, fB) if symmetric else _dense(rt, dev, A, rank, depth, stream)
    dx = dy = None
    if scale is not None:
        dx = rt.to_device(dev, np.ascontiguousarray(scale[0], np.float64), stream=stream)
        dy = rt.to_device(dev, np.ascontiguousarray(scale[1], np.float64), stream=stream)
    # resident: the whole matrix, each tile's rows at their place; else two tiles, one computed while
    # the other is copied out
    tiles = [rt.alloc(dev, (na, nb), np.float64)] if resident else [rt.alloc(dev, (step, nb), np.float64)
                                                                  for _ in range(2)]
    fn = rt.kernel(dev, "spgk_features", "spgk_features_gram")
    dense_rows = rt.layout(dev, "spgk_features", "dense_rows")
    all_rows = dense_rows.pack(values=dB, steps=fB, self_dot=dy, count=nb, ld=depth)
    gram_tile = rt.layout(dev, "spgk_features", "gram_tile")
    starts = list(range(0, na, step))
    done = [rt.Event(dev, timing=False) for _ in range(2)]  # tile t's at t % 2

    def launch(t):
        i0 = starts[t]
        rows = min(step, na - i0)
        steps = depth // lim.depth
        # the tile's rows of A, counted from its first (as are its flags and self dots)
        tile_rows = dense_rows.pack(
            values=dA.view(8 * i0 * depth, 8 * _pad(rows, side) * depth),
            steps=fA.view(i0 // side * steps, _pad(rows, side) // side * steps),
            self_dot=None if dx is None else dx.view(8 * i0, 8 * rows), count=rows, ld=depth)
        grid = (-(-(nb - i0 if resident else nb) // side), -(-rows // side))
        rt.launch(fn, grid, lim.threads, (tile_rows, all_rows, gram_tile.pack(
            C=tiles[0 if resident else t % 2], ldc=nb, row0=i0, mirror=int(resident))), stream=stream)
        done[t % 2].record(stream)

    host_contiguous = out.flags.c_contiguous
    launch(0)
    for t, i0 in enumerate(starts):
        if t + 1 < len(starts):
            launch(t + 1)  # computes while tile t is copied out (its buffer's copy, t - 1, has finished)
        rows = min(step, na - i0)
        tile, offset = (tiles[0], 8 * i0 * nb) if resident else (tiles[t % 2], 0)
        done[t % 2].synchronize()
        if host_contiguous:
            rt.copy_to_pageable(tile, out[i0:i0 + rows], offset, threads=n_threads)
        else:
            out[i0:i0 + rows] = tile.view(offset, 8 * rows * nb).to_host(np.float64, (rows, nb))
        if progress is not None:
            progress.update(rows * nb)
    return out
