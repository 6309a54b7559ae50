"""Array checks under the graph model: numeric coercion, label columns, compiled CSR scans, hashing.

Everything here returns read-only arrays or raises an error naming the input; the O(nnz) checks
run in ``graphkern._cpu.validate``.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from graphkern._backend import resolve_threads
from graphkern._cpu import validate as _compiled

_INT32_MAX = np.iinfo(np.int32).max
_INT64_MAX = np.iinfo(np.int64).max

_SYMBOLS = (
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se "
    "Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy "
    "Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf "
    "Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()
# deuterium and tritium are hydrogen isotopes; MDL files may write them as D and T
ATOMIC_NUMBER = {sym: z for z, sym in enumerate(_SYMBOLS, 1)} | {"D": 1, "T": 1}
# the node label holding atomic numbers in every molecule graph (SD files, RDKit, SMILES, networkx)
ELEMENT_LABEL = "element"

# problem kinds reported by graphkern._cpu.validate.scan_csr, in its column order
RANGE, UNSORTED, DUPLICATE, NONFINITE, NEGATIVE, MISSING, DIFFERS, NOT_ONE = range(8)
# CSR scans of fewer entries run on one thread: starting a parallel region costs more
PARALLEL_ENTRIES = 1 << 16
# arrays of at least this many bytes are hashed in parallel blocks of this many 8-byte words
_HASH_PARALLEL_BYTES = 1 << 20
_HASH_BLOCK_WORDS = 1 << 15


def index_dtype(nnz):
    return np.int32 if nnz <= _INT32_MAX else np.int64


def scan_threads(n_entries):
    """Threads for a compiled pass over ``n_entries``: all cores, or one below PARALLEL_ENTRIES."""
    return resolve_threads(None) if n_entries >= PARALLEL_ENTRIES else 1


def require_memory(nbytes, what):
    """Refuse (MemoryError naming ``what``) an allocation larger than this machine's memory."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return
    if nbytes > total:
        raise MemoryError(f"{what} needs {nbytes / 2**30:.1f} GiB, more than the {total / 2**30:.1f} GiB "
                          "of memory of this machine")


def category_code(value):
    """A stable int64 code for a string category ('C', 'aromatic', ...), equal across graphs and runs."""
    digest = hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) & 0x7FFFFFFFFFFFFFFF


def frozen(src, dtype):
    """``src`` as a read-only C-contiguous array that no caller can write (copied if one could)."""
    if (type(src) is np.ndarray and not src.flags.writeable and src.flags.c_contiguous
            and (dtype is None or src.dtype == dtype) and type(src.base) is np.ndarray
            and not src.base.flags.writeable):
        return src  # what the checks below keep as it is, without their passes (graphs cut from one buffer)
    arr = np.ascontiguousarray(src, dtype=dtype)
    if arr.flags.writeable and isinstance(src, np.ndarray) and np.may_share_memory(arr, src):
        owner = src if src.base is None else src.base
        if src.flags.writeable or not isinstance(owner, np.ndarray) or owner.flags.writeable:
            arr = arr.copy()
    elif not arr.flags.writeable and arr.base is not None and not (
            isinstance(arr.base, np.ndarray) and not arr.base.flags.writeable):
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def numeric(values, what, *, integral=False):
    """``values`` as an array of real numbers, refusing strings, objects, complex and (``integral``)
    fractional values with a message naming ``what``."""
    if values is None:
        raise TypeError(f"{what} is None")
    try:
        arr = np.asarray(values)
    except ValueError as err:
        raise ValueError(f"{what} is ragged (rows of different lengths): {err}") from None
    if arr.dtype == object:
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{what} must hold numbers, got Python objects such as "
                            f"{next((v for v in arr.ravel() if not isinstance(v, (int, float))), None)!r}") from None
    if arr.dtype.kind == "c":
        raise TypeError(f"{what} is complex; graphkern takes real numbers only")
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{what} must hold numbers, got dtype {arr.dtype}")
    if integral and arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all() or np.any(arr != np.round(arr)):
            bad = arr[~finite | (arr != np.round(np.where(finite, arr, 0)))].ravel()[0]
            raise ValueError(f"{what} must hold integers, got {bad}")
    return arr


def label_column(values, length, *, what, name):
    """Validate and normalise one label column of ``length`` rows."""
    label = f"{what} label {name!r}"
    try:
        arr = np.asarray(values)
    except ValueError as err:
        raise ValueError(f"{label} is ragged (rows of different lengths): {err}") from None
    if arr.ndim == 0 or arr.ndim > 2:
        raise ValueError(f"{label}: expected shape ({length},) or ({length}, d), got {arr.shape}")
    if arr.shape[0] != length:
        raise ValueError(f"{label} has {arr.shape[0]} rows but the graph has {length} "
                         f"{'nodes' if what == 'node' else 'stored edge entries'}")
    if arr.dtype.kind in "US" or (arr.dtype == object and arr.size and all(isinstance(v, str) for v in arr.ravel())):
        if not isinstance(values, np.ndarray) and not all(isinstance(v, str) for v in values):
            raise TypeError(f"{label} mixes strings and numbers; give one kind")
        if arr.ndim != 1:
            raise ValueError(f"{label}: string labels must be one column, got shape {arr.shape}")
        if what == "node" and name == ELEMENT_LABEL:
            return element_numbers(arr.tolist(), label)
        return np.array([category_code(v) for v in arr.tolist()], dtype=np.int64)
    arr = numeric(arr, label)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.integer):
        if arr.ndim != 1:
            raise ValueError(f"{label}: integer labels must be one column, got shape {arr.shape}")
        if arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
            raise ValueError(f"{label} has the value {int(arr.max())}, beyond the int64 range of labels")
        return arr.astype(np.int64, copy=False)
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr)
    if bad.any():
        pos = int(np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1))[0])
        kind = "NaN" if np.isnan(arr).any() else "infinite"
        raise ValueError(f"{label} has a {kind} value at {what} {pos}")
    return arr


def element_numbers(symbols, label):
    """Atomic numbers of element symbols ("C", "cl" and "Cl" alike), refusing unknown ones."""
    out = np.empty(len(symbols), dtype=np.int64)
    for k, sym in enumerate(symbols):
        z = ATOMIC_NUMBER.get(sym.strip().capitalize())
        if z is None:
            raise ValueError(f"{label}: {sym!r} at node {k} is not an element symbol")
        out[k] = z
    return out


#: what a graph keeps about its content (graphkern.graph): dropped whenever a label column changes
CONTENT_KEYS = ("fingerprint", "content_token")


def _content_changed(cache):
    for key in CONTENT_KEYS:
        cache.pop(key, None)


class LabelColumns(dict):
    """The named label columns of one graph; a column set here is validated (length, dtype) and frozen
    (``validated``: columns the graph has checked already, stored as they are)."""

    __slots__ = ("_what", "_length", "_owner_cache")

    def __init__(self, what, length, owner_cache, columns=(), *, validated=()):
        # validated columns go straight in, frozen (a reader's graphs: thousands of them per file)
        super().__init__((key, frozen(col, None)) for key, col in
                         (validated.items() if isinstance(validated, dict) else validated))
        self._what, self._length, self._owner_cache = what, length, owner_cache
        if columns:
            self.update(columns)

    @classmethod
    def _views(cls, what, length, owner_cache, columns):
        """Columns that are read-only views of read-only arrays, validated by their maker (a
        reader's graphs, cut from its arrays), stored as they are: what :func:`frozen` keeps."""
        self = cls.__new__(cls)
        dict.__init__(self, columns)
        self._what, self._length, self._owner_cache = what, length, owner_cache
        return self

    def __setitem__(self, key, values):
        col = frozen(label_column(values, self._length, what=self._what, name=key), None)
        _content_changed(self._owner_cache)
        super().__setitem__(str(key), col)

    def _put(self, key, col):
        """Store an already validated column (the graph's own re-orderings)."""
        super().__setitem__(key, frozen(col, None))

    def __delitem__(self, key):
        _content_changed(self._owner_cache)
        super().__delitem__(key)

    def update(self, *args, **kwargs):
        for key, col in dict(*args, **kwargs).items():
            self[key] = col

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, *args):
        _content_changed(self._owner_cache)
        return super().pop(*args)

    def popitem(self):
        _content_changed(self._owner_cache)
        return super().popitem()

    def clear(self):
        _content_changed(self._owner_cache)
        super().clear()

    def __reduce__(self):
        return dict, (dict(self),)


# The symmetry test compares two keyed sums of entry hashes (graphkern._cpu.validate.mirror_sums): a
# key drawn per process, which no input can be built against, leaves an asymmetric matrix about a
# 2**-64 chance of passing.
_MIRROR_KEY = int.from_bytes(os.urandom(8), "little")


def scan(indptr, indices, values=None, *, symmetric, signed=False, first=None):
    """First stored entry of each problem kind (see graphkern._cpu.validate), in compiled passes.

    The symmetry kinds are reported only for sorted rows with indices in range (the caller
    sorts and scans again otherwise).  ``first``: what a scan of the same arrays with
    ``symmetric=False`` found, so that only the symmetry pass runs.
    """
    ptr = np.ascontiguousarray(indptr, dtype=np.int64)
    idx = indices if indices.dtype in (np.int32, np.int64) else indices.astype(np.int64)
    idx = np.ascontiguousarray(idx)
    if values is None:
        vals = np.ones(1)
    elif values.dtype in (np.float32, np.float64, np.int64):
        vals = np.ascontiguousarray(values)
    else:  # equality survives the casts: wider floats, and uint64 -> int64 is one-to-one
        vals = np.ascontiguousarray(values, dtype=np.float64 if values.dtype.kind == "f" else np.int64)
    threads = scan_threads(len(idx))
    has_values = values is not None
    if first is None:
        first = _compiled.scan_csr(ptr, idx, vals, has_values=has_values, symmetric=False, signed=signed,
                                   n_threads=threads)
    else:
        first = first.copy()
    nnz = len(idx)
    if symmetric and min(first[RANGE], first[UNSORTED], first[DUPLICATE]) == nnz:
        # yes or no in one streaming pass; only a "no" pays for the binary searches that name the
        # first entry at fault.  With NaN (never equal to itself) the exact walk decides.
        if first[NONFINITE] == nnz:
            fwd, bwd = _compiled.mirror_sums(ptr, idx, vals, has_values=has_values, key=_MIRROR_KEY, n_threads=threads)
            asymmetric = fwd != bwd
        else:
            asymmetric = _compiled.is_symmetric(ptr, idx, vals, has_values=has_values, n_threads=threads)
        if asymmetric:
            exact = _compiled.scan_csr(ptr, idx, vals, has_values=has_values, symmetric=True, signed=signed,
                                       n_threads=threads)
            first[MISSING], first[DIFFERS] = exact[MISSING], exact[DIFFERS]
    return first


def indptr_problem(indptr, nnz):
    """A message if the row pointers cannot describe ``nnz`` entries, else None."""
    ptr = np.ascontiguousarray(indptr)
    if ptr.dtype not in (np.int32, np.int64):
        ptr = ptr.astype(np.int64)
    bad = _compiled.check_indptr(ptr, nnz, scan_threads(len(ptr)))
    if bad < 0:
        return None
    if bad == len(indptr) - 1:
        return f"indices has {nnz} entries but indptr[-1] = {int(indptr[-1])}"
    return f"indptr must start at 0 and never decrease (row {bad})"


def content_fingerprint(head, named):
    """A 32-hex-digit digest of ``head`` and of ``named``, a list of ``(name, array or None)``: every
    name, dtype, shape and byte, in one compiled pass (a cache key, not cryptographic).  Arrays of at
    least _HASH_PARALLEL_BYTES enter as their parallel block hashes and their tail bytes."""
    words, parts = [head], []
    for name, a in named:
        words.append(name)
        if a is not None and a.nbytes >= _HASH_PARALLEL_BYTES:
            flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            whole = flat.size // 8 * 8
            words.append(f"{a.dtype.str}{a.shape}")
            parts.append(_compiled.content_hash_blocks(flat[:whole].view(np.uint64), _HASH_BLOCK_WORDS,
                                                       resolve_threads(None)))
            a = flat[whole:]
        elif a is not None and not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        parts.append(a)
    return _compiled.fingerprint("\x00".join(words).encode(), parts)
