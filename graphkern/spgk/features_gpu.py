"""The feature map's Gram matrix on the GPU (cuda_src/spgk_features.cu), streamed in row tiles.

Both count matrices go to the device as dense float64 rows (scattered there from CSR).  The Gram
matrix is made a tile of rows at a time and each tile is copied into ``out`` (host memory or a memory
map) while the next one is computed: a tile is small enough (_TILE_BYTES) that a dozen or more
overlap at 10^4 graphs.  A symmetric Gram matrix that fits on the device is kept there whole
(_RESIDENT_SHARE): each off-diagonal 64 x 64 block is computed once and written to both sides, so
the product costs half; otherwise each tile is computed in full into one of two buffers.

A finished tile comes back through the runtime's staged copy (graphkern._cuda.runtime.copy_to_pageable):
pinned chunks on several host threads, each copying one chunk into ``out`` while the next crosses
the bus.  A Gram matrix is mostly fresh pages, whose first touch paces the copy more than the bus
does, so the host threads matter more than the chunks' size (docs/performance.md has the rates).
"""

from __future__ import annotations

import numpy as np

_TILE_ROWS = 64  # the kernel's tile (rows and columns of output per block)
_DEPTH = 16  # its step through the feature columns
_THREADS = 256
_MAX_GRID_Y = 65535  # a tile's blocks of rows (the grid's second dimension)
# a tile of rows holds at most this many bytes of output: one is copied out while the next computes
_TILE_BYTES = 64 << 20
# a symmetric Gram matrix is kept whole on the device when it takes at most this share of the free memory
_RESIDENT_SHARE = 0.5


def _pad(n):
    return -(-max(n, 1) // _TILE_ROWS) * _TILE_ROWS


def _dense(rt, dev, M, rank, depth, stream):
    """The CSR count matrix ``M`` as dense float64 rows of ``depth`` columns on the device (column
    ``j`` at ``rank[j]``, a device int32 array), its rows padded with zeros to a multiple of the
    tile; and the flags of its (64-row tile, 16-column step) blocks that hold a nonzero."""
    rows = _pad(M.shape[0])
    dense = rt.alloc(dev, (rows, depth), np.float64)
    dense.zero(stream=stream)
    flags = rt.alloc(dev, (rows // _TILE_ROWS, depth // _DEPTH), np.uint8)
    flags.zero(stream=stream)
    if M.nnz:
        indptr = rt.to_device(dev, M.indptr.astype(np.int64, copy=False), stream=stream)
        cols = rt.to_device(dev, M.indices.astype(np.int32, copy=False), stream=stream)
        counts = rt.to_device(dev, M.data.astype(np.int64, copy=False), stream=stream)
        grid = max(1, min(-(-M.shape[0] // (_THREADS // 32)), 65535))
        rt.launch(rt.kernel(dev, "spgk_features", "spgk_features_scatter"), grid, _THREADS,
                  (indptr, cols, counts, rank, np.int64(M.shape[0]), dense, np.int64(depth), flags), stream=stream)
        stream.synchronize()  # the host arrays of the copies above go out of scope
    return dense, flags


def features_gram(device, A, B, out, *, symmetric, scale=None, progress=None, n_threads=1):
    """``out = A B^T`` for CSR count matrices ``A`` ``(na, F)`` and ``B`` ``(nb, F)``; ``scale``:
    ``(dx, dy)`` to normalise as the host does.  ``symmetric`` (``B`` is ``A``) uploads one copy
    and, when the whole matrix fits on the device, computes each off-diagonal block once;
    ``n_threads`` host threads copy the tiles into ``out``."""
    from graphkern._cuda import runtime as rt

    na, nb = A.shape[0], B.shape[0]
    if na == 0 or nb == 0:
        return out
    dev = rt.get_device(device)
    depth = max(_DEPTH, -(-A.shape[1] // _DEPTH) * _DEPTH)
    step = max(_TILE_ROWS, min(_pad(na), _TILE_BYTES // (8 * nb) // _TILE_ROWS * _TILE_ROWS, _MAX_GRID_Y * _TILE_ROWS))
    free, _ = dev.memory_info()
    inputs = 8 * depth * (_pad(nb) + (0 if symmetric else _pad(na))) + (16 * (na + nb) if scale else 0)
    resident = symmetric and inputs + 8 * na * nb <= _RESIDENT_SHARE * free
    if not resident:
        while step > _TILE_ROWS and inputs + 2 * 8 * step * nb > 0.9 * free:
            step = max(_TILE_ROWS, step // 2 // _TILE_ROWS * _TILE_ROWS)
    rt.check_fits(dev, inputs + (8 * na * nb if resident else 2 * 8 * step * nb),
                  f"the shortest-path features of {na} x {nb} graphs ({A.shape[1]} triplets) and the output tiles")
    stream = rt.Stream(dev)
    # the columns by decreasing frequency, so that the rare ones gather in steps most tiles skip
    rank = np.empty(A.shape[1], np.int32)
    rank[np.argsort(-np.bincount(B.indices, minlength=A.shape[1]), kind="stable")] = np.arange(A.shape[1])
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
    starts = list(range(0, na, step))
    done = [rt.Event(dev, timing=False) for _ in range(2)]  # tile t's at t % 2

    def launch(t):
        i0 = starts[t]
        rows = min(step, na - i0)
        a = dA.view(8 * i0 * depth, 8 * _pad(rows) * depth)
        steps = depth // _DEPTH
        fa = fA.view(i0 // _TILE_ROWS * steps, _pad(rows) // _TILE_ROWS * steps)
        grid = (-(-(nb - i0 if resident else nb) // _TILE_ROWS), -(-rows // _TILE_ROWS))
        tile_dx = None if dx is None else dx.view(8 * i0, 8 * rows)  # the kernel counts rows from the tile's first
        rt.launch(fn, grid, _THREADS, (a, np.int64(rows), dB, np.int64(nb), np.int64(depth), fa, fB, tile_dx, dy,
                                       tiles[0 if resident else t % 2], np.int64(nb), np.int64(i0),
                                       np.int32(resident)), stream=stream)
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
