"""The matrix cache of graphkern.expm: a validated CSR per user matrix, reused while it is unchanged.

Validating a scipy.sparse input (symmetry: ``A - A.T``; finiteness) and converting it costs several
passes over its nonzeros, and the GPU solver hangs A's device copy and SpMV plans on the validated
matrix (``graphkern._expm_gpu``); both are worth keeping across calls on the same matrix.

An entry is keyed on the identity of the user's object (a :class:`graphkern.Graph` or a
scipy.sparse matrix) and holds only a weak reference to it: when the object is collected, the entry
and everything hanging on it (device memory included) go with it.  Every lookup checks a cheap
fingerprint -- the format, shape, dtypes, the identity of each backing array (a replaced
``A.data`` is a different object) and a strided sample of each array's contents (an in-place
edit such as ``A.data *= 2`` changes the sample).  An in-place edit that touches none of the
sampled entries is not seen: after such an edit call ``graphkern.expm.clear_cache(A)``.
Formats without flat backing arrays (lil, dok) are validated on every call and not cached.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp

from graphkern.graph import Graph

# Entries sampled from each backing array (evenly spaced, both ends included).
SAMPLES_PER_ARRAY = 1024
# Matrices remembered at most (least recently used first out); an entry costs little host memory
# itself (it shares the user's arrays), but it keeps any device copy alive.
MAX_ENTRIES = 16


def _backing_arrays(A):
    """``(arrays, layout)`` describing A, or None when A cannot be fingerprinted cheaply."""
    if isinstance(A, Graph):
        return (A.indptr, A.indices, A.weights), ("graph", A.n_nodes)
    if not sp.issparse(A):
        return None
    fmt = A.format
    if fmt in ("csr", "csc", "bsr"):
        arrays = (A.indptr, A.indices, A.data)
    elif fmt == "coo":
        arrays = (A.row, A.col, A.data)
    elif fmt == "dia":
        arrays = (A.offsets, A.data)
    else:
        return None
    return arrays, (fmt, A.shape, getattr(A, "blocksize", None), type(A))


def _sample(a):
    """Dtype, shape and a strided sample of ``a``'s contents, as a comparable tuple."""
    if a is None:
        return None
    size = a.size
    if size == 0:
        return a.dtype.str, a.shape, b""
    positions = np.linspace(0, size - 1, min(size, SAMPLES_PER_ARRAY)).astype(np.intp)
    return a.dtype.str, a.shape, a.flat[positions].tobytes()


class _Entry:
    __slots__ = ("ref", "array_refs", "layout", "samples", "value")

    def matches(self, arrays, layout):
        if layout != self.layout or len(arrays) != len(self.array_refs):
            return False
        for a, ref in zip(arrays, self.array_refs):
            if (a is None) != (ref is None) or (ref is not None and ref() is not a):
                return False
        return all(_sample(a) == s for a, s in zip(arrays, self.samples))


class MatrixCache:
    """Values derived from user matrices, keyed on their identity, checked by fingerprint."""

    def __init__(self, max_entries=MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, A, build):
        """``(value, hit)``: the cached ``build(A)`` while A is unchanged, else a fresh one (cached)."""
        described = _backing_arrays(A)
        if described is None:
            with self._lock:
                self.misses += 1
            return build(A), False
        arrays, layout = described
        key = id(A)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.ref() is A and entry.matches(arrays, layout):
                self._entries.move_to_end(key)
                self.hits += 1
                return entry.value, True
            self.misses += 1
        value = build(A)  # outside the lock: validation is the slow part
        try:
            entry = _Entry()
            entry.ref = weakref.ref(A, self._forget_callback(key))
            entry.array_refs = tuple(None if a is None else weakref.ref(a) for a in arrays)
        except TypeError:  # an object or array that takes no weak reference: not cached
            return value, False
        entry.layout = layout
        entry.samples = tuple(_sample(a) for a in arrays)
        entry.value = value
        dropped = []  # released outside the lock: dropping a value may free device memory
        with self._lock:
            dropped.append(self._entries.pop(key, None))
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                dropped.append(self._entries.popitem(last=False)[1])
        del dropped
        return value, False

    def _forget_callback(self, key):
        cache_ref = weakref.ref(self)

        def forget(ref):
            cache = cache_ref()
            if cache is not None:
                cache._pop(key, lambda entry: entry.ref is ref)
        return forget

    def _pop(self, key, belongs):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not belongs(entry):
                return
            del self._entries[key]
        del entry  # outside the lock

    def peek(self, A):
        """A's cached value without a fingerprint check, or None."""
        with self._lock:
            entry = self._entries.get(id(A))
            return entry.value if entry is not None and entry.ref() is A else None

    def discard(self, A):
        """Forget A's entry (if any)."""
        self._pop(id(A), lambda entry: entry.ref() is A)

    def clear(self):
        with self._lock:
            entries, self._entries = self._entries, OrderedDict()
        del entries

    def values(self):
        with self._lock:
            return [e.value for e in self._entries.values()]

    def __len__(self):
        return len(self._entries)
