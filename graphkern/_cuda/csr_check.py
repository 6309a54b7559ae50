"""The content check of a CSR on the device after its upload (cuda_src/common/csr_check.cuh, whose
entry points ``csr_check_i32``/``_i64`` a module instantiates, each taking the struct of that name
the module exports): one launch instead of a host pass; it says which kinds of problem it found and
the first entry at fault, so the caller runs its exact host check, with its messages, only where a
bit is set."""

from __future__ import annotations

import numpy as np

from graphkern._cuda import runtime as rt

INDPTR, RANGE, UNSORTED, NONFINITE, NEGATIVE, ASYMMETRIC = 1, 2, 4, 8, 16, 32
BLOCK = 256
# value_kind of the kernel by NumPy dtype kind
_VALUE_KINDS = {"b": 0, "u": 0, "i": 1, "f": 2}


def check_csr(module, indptr, indices, *, n_cols, nnz, values=None, check_negative=False, check_symmetry=False,
              stream=None):
    """``(flags, first)`` of the CSR held by the device buffers ``indptr`` (int32 or int64, its rows'
    pointers from 0) and ``indices`` (int32, at least ``nnz``) with ``n_cols`` columns: the OR of the
    problem bits found and the first stored entry at fault (``nnz`` where none names one).

    ``values``: a device buffer of one element per entry (any dtype of 1, 2, 4 or 8 bytes), checked
    finite and, with ``check_negative``, not negative.  ``check_symmetry``: the whole square matrix
    is given; each entry's mirror must be stored with the same value bits.  Queued on ``stream``
    (the legacy stream when None) and waited for."""
    dev = indptr.device
    n_rows = int(indptr.shape[0]) - 1
    status = rt.alloc(dev, 2, np.uint64)
    start = np.array([0, nnz], dtype=np.uint64)  # no flags; no offending entry
    status.copy_from_host(start, stream)
    pointer = "i32" if np.dtype(indptr.dtype) == np.int32 else "i64"
    fn = rt.kernel(dev, module, f"csr_check_{pointer}")
    grid = max(1, -(-max(n_rows + 1, nnz) // BLOCK))
    value_size, value_kind = (0, 0) if values is None else (np.dtype(values.dtype).itemsize,
                                                            _VALUE_KINDS[np.dtype(values.dtype).kind])
    check = rt.layout(dev, module, f"csr_check_{pointer}").pack(
        indptr=indptr, idx=indices, values=values, value_size=value_size, value_kind=value_kind,
        check_negative=int(bool(check_negative)), check_symmetry=int(bool(check_symmetry)), n_rows=n_rows,
        n_cols=n_cols, nnz=nnz, status=status)
    rt.launch(fn, grid, BLOCK, (check,), stream=stream)
    out = np.empty(2, dtype=np.uint64)
    if stream is not None:
        stream.synchronize()
    status.copy_to_host(out)
    return int(out[0]), int(out[1])
