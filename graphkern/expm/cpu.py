"""The CPU solver of the Lanczos engine (graphkern.expm.lanczos), on the OpenMP kernels of
``graphkern/_cpu/expm.pyx``."""

from __future__ import annotations

import math
import time

import numpy as np

from graphkern._cpu import expm as cpu
from graphkern.expm.lanczos import COLUMN_CHUNK, HostSolver, even_chunks, finish_on_host

# Row chunks per OpenMP thread (handed out dynamically).
CHUNKS_PER_THREAD = 4

class CpuLanczos(HostSolver):
    """The Lanczos recurrence with the OpenMP kernels of ``graphkern/_cpu/expm.pyx``.

    ``store_basis=False`` keeps three vectors and reruns the recurrence in :meth:`result` (the
    "none" basis mode); otherwise every Lanczos vector is kept in host memory.
    """

    def __init__(self, mat, dtype, *, n_threads, store_basis, max_krylov, breakdown):
        self.mat = mat
        self.dtype = np.dtype(dtype)
        self.n_threads = n_threads
        self.values = mat.values_as(self.dtype)
        parts = n_threads * CHUNKS_PER_THREAD if n_threads > 1 else 1
        self.spmv_chunks = mat.chunks(parts)
        self.vector_chunks = even_chunks(mat.n, parts)
        self.breakdown = float(breakdown)
        self.store_basis = store_basis
        self.alpha = np.zeros(max_krylov)
        self.beta = np.zeros(max_krylov)
        self.rscale = np.zeros(max_krylov + 1)
        self.n_spmv = 0
        self._t = {"spmv": 0.0, "vector": 0.0}
        self._empty = np.empty(0, dtype=self.dtype)
        self._no_y = np.empty(0, dtype=np.float64)
        self._blocks = []   # stored basis: (COLUMN_CHUNK, n) arrays
        self._stored = 0    # columns [0, _stored) live in _blocks
        self._ring = [np.empty(mat.n, dtype=self.dtype) for _ in range(3)]

    def start(self, x, rscale0):
        self._blocks = [np.empty((COLUMN_CHUNK if self.store_basis else 1, self.mat.n), dtype=self.dtype)]
        self._blocks[0][0] = 1.0 if x is None else x  # None: the default x, ones
        self._stored = 1
        self.rscale[0] = rscale0

    def _column(self, j):
        if j < self._stored:
            return self._blocks[j // COLUMN_CHUNK][j % COLUMN_CHUNK]
        return self._ring[j % 3]

    def _reserve(self, j):
        if self.store_basis and j == self._stored:
            if j // COLUMN_CHUNK == len(self._blocks):
                self._blocks.append(np.empty((COLUMN_CHUNK, self.mat.n), dtype=self.dtype))
            self._stored = j + 1

    def _step(self, k, y=None, g=None):
        second_pass = y is not None
        if not second_pass:
            self._reserve(k + 1)
        cur, out = self._column(k), self._column(k + 1)
        prev = self._column(k - 1) if k > 0 else self._empty
        if k == 0:
            rs, sub = self.rscale[0], 0.0
        else:
            if not second_pass:
                b = self.beta[k - 1]
                self.rscale[k] = 1.0 / b if (b > self.breakdown and self.rscale[k - 1] != 0.0) else 0.0
            rs = self.rscale[k]
            sub = self.beta[k - 1] * self.rscale[k - 1] if rs != 0.0 else 0.0
        m = self.mat
        t0 = time.perf_counter()
        alpha = cpu.lanczos_spmv(m.indptr, m.indices, self.values, cur, prev, out, rs, sub, self.spmv_chunks,
                                 self.n_threads)
        t1 = time.perf_counter()
        if second_pass:
            alpha = self.alpha[k]
        else:
            self.alpha[k] = alpha
        norm2 = cpu.lanczos_update(cur, out, alpha * rs, y if second_pass else self._no_y,
                                   float(g[k + 1]) if second_pass else 0.0, self.vector_chunks, self.n_threads)
        if not second_pass:
            self.beta[k] = math.sqrt(norm2)
        self._t["spmv"] += t1 - t0
        self._t["vector"] += time.perf_counter() - t1
        self.n_spmv += 1

    def enqueue(self, k0, k1):
        for k in range(k0, k1):
            self._step(k)

    def result(self, m, g, scaling):
        t0 = time.perf_counter()
        y = np.zeros(self.mat.n)
        g = np.concatenate([g, [0.0]])
        stored = min(m, self._stored)
        for b, block in enumerate(self._blocks):
            j0 = b * COLUMN_CHUNK
            count = min(stored - j0, len(block))
            if count > 0:
                cpu.accumulate_columns(y, block[:count], g[j0:j0 + count], self.n_threads)
        self._t["vector"] += time.perf_counter() - t0
        # columns that were not kept are regenerated, bit for bit, from the last two kept ones
        for k in range(stored - 1, m - 1):
            self._step(k, y=y, g=g)
        return finish_on_host(y, scaling)
