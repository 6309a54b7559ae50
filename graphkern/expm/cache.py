"""The matrix cache of graphkern.expm: a validated CSR per user matrix, reused while its content is
unchanged (why, and what a caller sees: graphkern.expm.api, Caching).

An entry holds only a weak reference to the user's object: when the object is collected, the entry
and everything hanging on it (device memory included) go with it.  A lookup hits only when the
object, the identity of each backing array, the layout (format, shape, dtypes) and the content (a
64-bit hash of every byte of the backing arrays; nothing for a Graph, whose arrays are read-only
and its own) are those the entry was built from.  Formats without flat backing arrays (lil, dok)
are validated on every call and not cached.

:meth:`MatrixCache.get_speculative` serves callers whose work runs off the host (the GPU solve): on
an entry for the same object and arrays it hands out the cached value at once and hashes the
content on a background thread meanwhile, so the check of a warm call costs the longer of the two
rather than their sum; the caller confirms before it returns and, when A was edited in place,
redoes its work on a fresh entry.  Matrices of less than ``speculate_bytes`` are hashed in place:
their hash takes less than handing it to a thread.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from graphkern._cpu import expm as cpu
from graphkern.graph import Graph

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


def _array_digest(a, n_threads):
    """A hash of ``a``'s dtype, shape and every byte of its contents."""
    if a is None:
        return None
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    whole = len(flat) // 8 * 8
    words = flat[:whole].view(np.uint64)
    return a.dtype.str, a.shape, cpu.hash_words(words, n_threads), flat[whole:].tobytes()


def content_digest(A, arrays, n_threads):
    """The content key of A: nothing more for a Graph (its arrays are read-only and its own, so the
    object and the identity of its arrays say all), else a hash of every backing array."""
    if isinstance(A, Graph):
        return ("graph",)
    return tuple(_array_digest(a, n_threads) for a in arrays)


_hasher_lock = threading.Lock()
_hasher = None


def _hashing_thread():
    """The one background thread that hashes for speculative lookups (started on first use)."""
    global _hasher
    with _hasher_lock:
        if _hasher is None:
            _hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphkern-hash")
        return _hasher


def already_checked():
    """The ``confirm`` of a lookup that hashed A's content itself (and of a check with nothing left to do)."""
    return True


class _Entry:
    __slots__ = ("ref", "array_refs", "layout", "digest", "value")

    def __init__(self, ref, arrays, layout, digest, value):
        self.ref = ref
        self.array_refs = tuple(None if a is None else weakref.ref(a) for a in arrays)
        self.layout, self.digest, self.value = layout, digest, value

    def built_from(self, A, arrays, layout):
        """Whether this is A's entry, of the same layout and the very same backing arrays (their content aside)."""
        if self.ref() is not A or layout != self.layout or len(arrays) != len(self.array_refs):
            return False
        return all((a is None) == (ref is None) and (ref is None or ref() is a)
                   for a, ref in zip(arrays, self.array_refs))


class MatrixCache:
    """Values derived from user matrices, one per object, valid while its content is unchanged."""

    # below this many bytes of backing arrays a speculative lookup hashes in place (about 0.1 ms at
    # memory speed, the order of a hand-off to another thread)
    speculate_bytes = 1 << 20

    def __init__(self, max_entries=MAX_ENTRIES):
        self.max_entries = max_entries
        self._entries = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, A, build, n_threads=1):
        """``(value, hit)``: the cached ``build(A)`` while A is unchanged, else a fresh one (cached)."""
        described = _backing_arrays(A)
        if described is None:
            with self._lock:
                self.misses += 1
            return build(A), False
        arrays, layout = described
        digest = content_digest(A, arrays, n_threads)
        key = id(A)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.built_from(A, arrays, layout) and entry.digest == digest:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry.value, True
            self.misses += 1
        value = build(A)  # outside the lock: validation is the slow part
        try:
            entry = _Entry(weakref.ref(A, self._forget_callback(key)), arrays, layout, digest, value)
        except TypeError:  # an object or array that takes no weak reference: not cached
            return value, False
        dropped = []  # released outside the lock: dropping a value may free device memory
        with self._lock:
            dropped.append(self._entries.pop(key, None))
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                dropped.append(self._entries.popitem(last=False)[1])
        del dropped
        return value, False

    def get_speculative(self, A, build, n_threads=1):
        """``(value, hit, confirm)``.  Where A has an entry built from the same object and arrays,
        its value is returned at once and A's content hashed on a background thread (with one
        thread fewer than ``n_threads``, the caller's own being busy); ``confirm()`` waits for the
        hash and says whether the content is the entry's.  When it is not, the entry is dropped
        and the caller must discard what it did with the value and start again (a fresh lookup
        then builds anew).  Otherwise this is :meth:`get` with a ``confirm`` that is always True."""
        described = _backing_arrays(A)
        entry = None
        if (described is not None and not isinstance(A, Graph)
                and sum(a.nbytes for a in described[0] if a is not None) >= self.speculate_bytes):
            arrays, layout = described
            key = id(A)
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and not entry.built_from(A, arrays, layout):
                    entry = None
        if entry is None:
            value, hit = self.get(A, build, n_threads)
            return value, hit, already_checked
        pending = _hashing_thread().submit(content_digest, A, arrays, max(1, n_threads - 1))
        answer = []

        def confirm():
            if not answer:
                same = pending.result() == entry.digest
                with self._lock:
                    if same:
                        self.hits += 1
                        if self._entries.get(key) is entry:
                            self._entries.move_to_end(key)
                    else:
                        self.misses += 1
                if not same:
                    self._pop(key, lambda e: e is entry)
                answer.append(same)
            return answer[0]
        return entry.value, True, confirm

    def _forget_callback(self, key):
        cache_ref = weakref.ref(self)

        def forget(ref):
            cache = cache_ref()
            if cache is not None:
                cache._pop(key, lambda entry: entry.ref is ref)
        return forget

    def _pop(self, key, belongs):
        """Forget the entry at ``key`` where ``belongs(entry)``; its value (released by the caller,
        outside the lock), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not belongs(entry):
                return None
            del self._entries[key]
        return entry.value

    def discard(self, A):
        """Forget A's entry; its value, or None when there was none."""
        return self._pop(id(A), lambda entry: entry.ref() is A)

    def clear(self):
        """Forget every entry; their values."""
        with self._lock:
            entries, self._entries = self._entries, OrderedDict()
        return [e.value for e in entries.values()]

    def __len__(self):
        return len(self._entries)
