"""The feature map's Gram matrix on the GPU (cuda_src/spgk_features.cu), streamed in row tiles.

Both count matrices go to the device as dense float64 rows (scattered there from CSR); the Gram
matrix never does: each tile of rows is multiplied into one of two device buffers and copied into
``out`` (host memory or a memory map) while the next tile is computed on the other stream.  The
copy goes through pinned chunks on several host threads: a Gram matrix is mostly fresh pages, whose
first touch paces the copy more than the bus does.
"""

from __future__ import annotations

import numpy as np

_TILE_ROWS = 64  # the kernel's tile (rows and columns of output per block)
_DEPTH = 16  # its step through the feature columns
_THREADS = 256
_MAX_GRID_Y = 65535  # a tile's blocks of rows (the grid's second dimension)
# one output tile buffer holds at most this many bytes (two of them are in flight)
_TILE_BYTES = 1 << 30


def _dense(rt, dev, M, rank, depth, stream):
    """The CSR count matrix ``M`` as dense float64 rows of ``depth`` columns on the device (column
    ``j`` at ``rank[j]``), its rows padded with zeros to a multiple of the tile; and the flags of
    its (64-row tile, 16-column step) blocks that hold a nonzero."""
    rows = -(-max(M.shape[0], 1) // _TILE_ROWS) * _TILE_ROWS
    tiles = rows // _TILE_ROWS
    flags = np.zeros((tiles, depth // _DEPTH), np.uint8)
    cols = rank[M.indices].astype(np.int32)
    # each entry's tile of rows, from the row pointers at the tiles' first rows
    tile_starts = M.indptr[np.minimum(np.arange(tiles + 1) * _TILE_ROWS, M.shape[0])]
    flags[np.repeat(np.arange(tiles), np.diff(tile_starts)), cols // _DEPTH] = 1
    dense = rt.alloc(dev, (rows, depth), np.float64)
    dense.zero(stream=stream)
    d_flags = rt.to_device(dev, flags, stream=stream)
    if M.nnz:
        indptr = rt.to_device(dev, M.indptr.astype(np.int64, copy=False), stream=stream)
        cols = rt.to_device(dev, cols, stream=stream)
        counts = rt.to_device(dev, M.data.astype(np.int64, copy=False), stream=stream)
        grid = max(1, min(-(-M.shape[0] // (_THREADS // 32)), 65535))
        rt.launch(rt.kernel(dev, "spgk_features", "spgk_features_scatter"), grid, _THREADS,
                  (indptr, cols, counts, np.int64(M.shape[0]), dense, np.int64(depth)), stream=stream)
    stream.synchronize()  # the host arrays of the copies above go out of scope
    return dense, d_flags


def features_gram(device, A, B, out, *, symmetric, scale=None, progress=None, n_threads=1):
    """``out = A B^T`` for CSR count matrices ``A`` ``(na, F)`` and ``B`` ``(nb, F)``; ``scale``:
    ``(dx, dy)`` to normalise as the host does.  ``symmetric`` (``B`` is ``A``) uploads one copy;
    ``n_threads`` host threads copy the tiles into ``out``."""
    from graphkern._cuda import runtime as rt

    na, nb = A.shape[0], B.shape[0]
    if na == 0 or nb == 0:
        return out
    dev = rt.get_device(device)
    depth = max(_DEPTH, -(-A.shape[1] // _DEPTH) * _DEPTH)
    pad = lambda n: -(-n // _TILE_ROWS) * _TILE_ROWS
    step = max(_TILE_ROWS, min(pad(na), _TILE_BYTES // (8 * nb) // _TILE_ROWS * _TILE_ROWS, _MAX_GRID_Y * _TILE_ROWS))
    free, _ = dev.memory_info()
    inputs = 8 * depth * (pad(nb) + (0 if symmetric else pad(na))) + (16 * (na + nb) if scale else 0)
    while step > _TILE_ROWS and inputs + 2 * 8 * step * nb > 0.9 * free:
        step = max(_TILE_ROWS, step // 2 // _TILE_ROWS * _TILE_ROWS)
    rt.check_fits(dev, inputs + 2 * 8 * step * nb,
                  f"the shortest-path features of {na} x {nb} graphs ({A.shape[1]} triplets) and two output tiles")
    streams = [rt.Stream(dev), rt.Stream(dev)]
    # the columns by decreasing frequency, so that the rare ones gather in steps most tiles skip
    rank = np.empty(A.shape[1], np.int64)
    rank[np.argsort(-np.bincount(B.indices, minlength=A.shape[1]), kind="stable")] = np.arange(A.shape[1])
    dB, fB = _dense(rt, dev, B, rank, depth, streams[0])
    dA, fA = (dB, fB) if symmetric else _dense(rt, dev, A, rank, depth, streams[0])
    dx = dy = None
    if scale is not None:
        dx = rt.to_device(dev, np.ascontiguousarray(scale[0], np.float64))
        dy = rt.to_device(dev, np.ascontiguousarray(scale[1], np.float64))
    tiles = [rt.alloc(dev, (step, nb), np.float64) for _ in range(2)]
    fn = rt.kernel(dev, "spgk_features", "spgk_features_gram")
    starts = list(range(0, na, step))

    def launch(t):
        i0 = starts[t]
        rows = min(step, na - i0)
        a = dA.view(8 * i0 * depth, 8 * pad(rows) * depth)
        steps = depth // _DEPTH
        fa = fA.view(i0 // _TILE_ROWS * steps, pad(rows) // _TILE_ROWS * steps)
        grid = (-(-nb // _TILE_ROWS), -(-rows // _TILE_ROWS))
        tile_dx = None if dx is None else dx.view(8 * i0, 8 * rows)  # the kernel counts rows from the tile's first
        rt.launch(fn, grid, _THREADS, (a, np.int64(rows), dB, np.int64(nb), np.int64(depth), fa, fB, tile_dx, dy,
                                       tiles[t % 2], np.int64(nb)), stream=streams[t % 2])

    host_contiguous = out.flags.c_contiguous
    launch(0)
    for t, i0 in enumerate(starts):
        if t + 1 < len(starts):
            launch(t + 1)  # computes while tile t is copied back
        rows = min(step, na - i0)
        streams[t % 2].synchronize()
        if host_contiguous:
            rt.copy_to_pageable(tiles[t % 2], out[i0:i0 + rows], threads=n_threads)
        else:
            out[i0:i0 + rows] = tiles[t % 2].to_host(shape=(step, nb))[:rows]
        if progress is not None:
            progress.update(rows * nb)
    return out
