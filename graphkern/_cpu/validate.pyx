# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Checks of a CSR adjacency in one O(nnz) pass, parallel over blocks of rows.

:func:`scan_csr` finds, for each kind of problem, the first stored entry that has it: a column
index out of range, a row not sorted, a duplicate, a non-finite or negative value, an entry whose
mirror ``(j, i)`` is not stored, or is stored with another value, and a value other than 1 (an
unweighted graph has none).  The mirror of ``(i, j)`` is
found by a binary search for ``i`` in row ``j``, so the symmetry answer holds only when every
row is sorted (the caller sorts and scans again otherwise).  No transpose is built.
"""

import numpy as np

from cython.parallel cimport prange
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from libc.math cimport isfinite
from libc.string cimport memcpy
from libc.stdint cimport int32_t, int64_t, uint64_t

from graphkern._cpu._search cimport lower_bound

ctypedef fused index_t:
    int32_t
    int64_t

ctypedef fused value_t:
    float
    double
    int64_t

# Problem kinds, the columns of scan_csr's result (the order is the order of the messages' priority).
cdef enum:
    RANGE, UNSORTED, DUPLICATE, NONFINITE, NEGATIVE, MIRROR_MISSING, MIRROR_DIFFERS, NOT_ONE, N_KINDS

KINDS = ("range", "unsorted", "duplicate", "nonfinite", "negative", "mirror_missing", "mirror_differs", "not_one")


cdef inline void first_at(int64_t[:, ::1] firsts, Py_ssize_t b, int kind, int64_t k) noexcept nogil:
    if k < firsts[b, kind]:
        firsts[b, kind] = k


cdef void scan_rows(const int64_t[::1] indptr, const index_t[::1] indices, const value_t[::1] values,
                    bint has_values, bint symmetric, bint signed, int64_t n, int64_t r0, int64_t r1,
                    int64_t[:, ::1] firsts, Py_ssize_t b) noexcept nogil:
    cdef int64_t i, k, j, lo, hi, m, prev
    cdef const index_t* idx = &indices[0]
    for i in range(r0, r1):
        lo = indptr[i]
        hi = indptr[i + 1]
        prev = -1
        for k in range(lo, hi):
            j = idx[k]
            if j < 0 or j >= n:
                first_at(firsts, b, RANGE, k)
                prev = j
                continue
            if k > lo:
                if j < prev:
                    first_at(firsts, b, UNSORTED, k)
                elif j == prev:
                    first_at(firsts, b, DUPLICATE, k)
            prev = j
            if has_values:
                if value_t is not int64_t:
                    if not isfinite(values[k]):
                        first_at(firsts, b, NONFINITE, k)
                if signed and values[k] < 0:
                    first_at(firsts, b, NEGATIVE, k)
                if values[k] != 1:
                    first_at(firsts, b, NOT_ONE, k)
            if symmetric:
                m = lower_bound(idx, indptr[j], indptr[j + 1], i)
                if m >= indptr[j + 1] or idx[m] != i:
                    first_at(firsts, b, MIRROR_MISSING, k)
                elif has_values and values[m] != values[k]:
                    first_at(firsts, b, MIRROR_DIFFERS, k)


def _row_blocks(ptr, int n_threads, int per_thread=8):
    """Row boundaries of blocks holding about equal numbers of entries (``per_thread`` per thread)."""
    n = len(ptr) - 1
    if n_threads == 1:
        return np.array([0, max(n, 0)], dtype=np.int64)
    parts = max(1, min(n, per_thread * n_threads))
    bounds = np.searchsorted(ptr, np.linspace(0, ptr[n], parts + 1), side="left").astype(np.int64)
    bounds[0] = 0
    bounds[parts] = n
    return np.maximum.accumulate(np.minimum(bounds, n))


def scan_csr(const int64_t[::1] indptr, const index_t[::1] indices, const value_t[::1] values, *,
             bint has_values, bint symmetric, bint signed, int n_threads):
    """First stored entry of each problem kind (``nnz`` where there is none), an int64 array.

    ``indptr`` must be valid (see :func:`check_indptr`); ``values`` is ignored unless
    ``has_values`` (pass a one-element array then).
    """
    cdef int64_t n = indptr.shape[0] - 1
    cdef int64_t nnz = indices.shape[0]
    cdef int64_t[::1] bounds = _row_blocks(np.asarray(indptr), n_threads)
    cdef Py_ssize_t parts = bounds.shape[0] - 1, b
    firsts_arr = np.full((max(parts, 1), N_KINDS), nnz, dtype=np.int64)
    cdef int64_t[:, ::1] firsts = firsts_arr
    if nnz == 0:
        return firsts_arr[0]
    if n_threads == 1:  # no parallel region: its start costs more than a small graph's scan
        with nogil:
            for b in range(parts):
                scan_rows(indptr, indices, values, has_values, symmetric, signed, n, bounds[b], bounds[b + 1],
                          firsts, b)
    else:
        for b in prange(parts, nogil=True, num_threads=n_threads, schedule="dynamic"):
            scan_rows(indptr, indices, values, has_values, symmetric, signed, n, bounds[b], bounds[b + 1],
                      firsts, b)
    return firsts_arr.min(axis=0)


def check_indptr(const index_t[::1] indptr, int64_t nnz, int n_threads=1):
    """The first row whose pointers are wrong (start != 0, decreasing, or end != nnz), else -1;
    blocks of rows in parallel on ``n_threads``."""
    cdef int64_t n = indptr.shape[0] - 1, i, bad = -1
    cdef Py_ssize_t blocks = max(1, min(8 * n_threads, n // 4096)), b
    if n < 0 or indptr[0] != 0:
        return 0
    firsts_arr = np.full(blocks, n, dtype=np.int64)
    cdef int64_t[::1] firsts = firsts_arr
    for b in prange(blocks, nogil=True, num_threads=n_threads, schedule="static", use_threads_if=blocks > 1):
        for i in range(n * b // blocks, n * (b + 1) // blocks):
            if indptr[i + 1] < indptr[i]:
                firsts[b] = i
                break
    bad = int(firsts_arr.min())
    if bad < n:
        return bad
    return n if indptr[n] != nnz else -1


def mirror_positions(const int64_t[::1] indptr, const index_t[::1] indices, int n_threads):
    """For each stored entry ``(i, j)`` the position of ``(j, i)``, or -1 (rows must be sorted)."""
    cdef int64_t n = indptr.shape[0] - 1, i, k, j, m
    out_arr = np.empty(indices.shape[0], dtype=np.int64)
    cdef int64_t[::1] out = out_arr
    if indices.shape[0] == 0:
        return out_arr
    cdef const index_t* idx = &indices[0]
    for i in prange(n, nogil=True, num_threads=n_threads, schedule="guided", use_threads_if=n_threads > 1):
        for k in range(indptr[i], indptr[i + 1]):
            j = idx[k]
            m = lower_bound(idx, indptr[j], indptr[j + 1], i)
            out[k] = m if (m < indptr[j + 1] and idx[m] == i) else -1
    return out_arr


cdef int mirror_walk(const int64_t* ptr, const index_t* idx, const value_t[::1] values, bint has_values,
                     int64_t[::1] cur, int64_t c0, int64_t c1) noexcept nogil:
    """Match every stored (i, j), i < j, j in [c0, c1), with the next unmatched (j, i) of row j.

    Rows visited in increasing i meet the lower entries of row j in their sorted order, so with a
    cursor per row j each match is one step, no search.  0: symmetric; 1: an entry has no mirror;
    2: a mirror holds another value.
    """
    cdef int64_t i, j, k, hi, m
    for j in range(c0, c1):
        cur[j] = ptr[j]
    for i in range(c1 - 1 if c1 > 0 else 0):
        hi = ptr[i + 1]
        k = lower_bound(idx, ptr[i], hi, c0 if c0 > i + 1 else i + 1)
        while k < hi and idx[k] < c1:
            j = idx[k]
            m = cur[j]
            if m >= ptr[j + 1] or idx[m] != i:
                return 1
            if has_values and values[m] != values[k]:
                return 2
            cur[j] = m + 1
            k += 1
    for j in range(c0, c1):  # every lower entry of row j was matched, none is left over
        m = cur[j]
        if m < ptr[j + 1] and idx[m] < j:
            return 1
    return 0


def is_symmetric(const int64_t[::1] indptr, const index_t[::1] indices, const value_t[::1] values, *,
                 bint has_values, int n_threads):
    """0 if the CSR (sorted rows, indices in range) is symmetric, 1 if its pattern is not, 2 if
    only its values are not; one pass, the rows split between threads by their mirror rows."""
    cdef int64_t n = indptr.shape[0] - 1
    if indices.shape[0] == 0:
        return 0
    ptr_arr = np.asarray(indptr)
    # one block of mirror rows per thread: every block walks the rows below its end, so more
    # blocks than threads would repeat that walk without balancing anything
    cdef int64_t[::1] bounds = _row_blocks(ptr_arr, n_threads, per_thread=1)
    cdef int64_t parts = bounds.shape[0] - 1
    cur_arr = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] cur = cur_arr
    verdicts_arr = np.zeros(parts, dtype=np.intc)
    cdef int[::1] verdicts = verdicts_arr
    cdef const int64_t* ptr = &indptr[0]
    cdef const index_t* idx = &indices[0]
    cdef Py_ssize_t t
    for t in prange(parts, nogil=True, num_threads=n_threads, schedule="static", chunksize=1,
                    use_threads_if=n_threads > 1):
        if bounds[t] < bounds[t + 1]:
            verdicts[t] = mirror_walk(ptr, idx, values, has_values, cur, bounds[t], bounds[t + 1])
    found = set(verdicts_arr.tolist())
    return 1 if 1 in found else 2 if 2 in found else 0


cdef inline uint64_t mix(uint64_t h, uint64_t w) noexcept nogil:
    h ^= w * 0x9E3779B97F4A7C15ULL
    h = (h << 31) | (h >> 33)
    return h * 0xC2B2AE3D27D4EB4FULL


def content_hash_blocks(const uint64_t[::1] words, int64_t block, int n_threads):
    """One 64-bit hash per block of ``block`` words (combined by the caller)."""
    cdef int64_t nwords = words.shape[0]
    cdef Py_ssize_t parts = (nwords + block - 1) // block if nwords else 0, b
    cdef int64_t k, end
    cdef uint64_t h
    out_arr = np.zeros(parts, dtype=np.uint64)
    cdef uint64_t[::1] out = out_arr
    for b in prange(parts, nogil=True, num_threads=n_threads, schedule="static", use_threads_if=n_threads > 1):
        h = 0x243F6A8885A308D3ULL + <uint64_t>b
        end = min((b + 1) * block, nwords)
        for k in range(b * block, end):
            h = mix(h, words[k])
        out[b] = h ^ (h >> 29)
    return out_arr


cdef inline void _absorb(uint64_t* lanes, const unsigned char* data, Py_ssize_t size) noexcept nogil:
    """Feed ``size`` bytes into the two hash lanes: whole words, then the tail with its length."""
    cdef Py_ssize_t k = 0
    cdef uint64_t w
    while k + 8 <= size:
        memcpy(&w, data + k, 8)  # no alignment assumed
        lanes[0] = mix(lanes[0], w)
        lanes[1] = mix(lanes[1] ^ 0x5851F42D4C957F2DULL, w)
        k += 8
    w = <uint64_t>size << 56
    if k < size:
        memcpy(&w, data + k, size - k)
        w ^= <uint64_t>size << 56
    lanes[0] = mix(lanes[0], w)
    lanes[1] = mix(lanes[1] ^ 0x5851F42D4C957F2DULL, w)


def fingerprint(bytes head, list arrays):
    """A 128-bit digest (32 hex digits) of ``head`` and of every entry of ``arrays`` in order: a C
    contiguous array's element format, shape and bytes, or a mark for None.  A cache key, not
    cryptographic: two lanes of the multiply-rotate mix of :func:`content_hash_blocks`, each
    finished by splitmix64's finaliser."""
    cdef uint64_t lanes[2]
    cdef uint64_t word
    cdef Py_buffer view
    cdef int d
    lanes[0] = 0x243F6A8885A308D3ULL
    lanes[1] = 0x13198A2E03707344ULL
    _absorb(lanes, <const unsigned char*>head, len(head))
    for arr in arrays:
        if arr is None:
            word = 0xA5A5A5A5A5A5A5A5ULL
            _absorb(lanes, <const unsigned char*>&word, 8)
            continue
        PyObject_GetBuffer(arr, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        try:
            _absorb(lanes, <const unsigned char*>view.format, len(view.format))
            word = <uint64_t>view.itemsize
            _absorb(lanes, <const unsigned char*>&word, 8)
            for d in range(view.ndim):
                word = <uint64_t>view.shape[d]
                _absorb(lanes, <const unsigned char*>&word, 8)
            _absorb(lanes, <const unsigned char*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)
    return f"{_mix(lanes[0]):016x}{_mix(lanes[1] ^ lanes[0]):016x}"


cdef enum:
    DIGIT = 1    # 0-9
    NUMERIC = 2  # a character of a decimal number, or of nan / inf / infinity (refused later, by name)
    BLANK = 4    # space, tab
    LINE_END = 8  # newline, carriage return

cdef unsigned char _CLASS[256]  # each byte's classes, read once per byte of a line


cdef void _fill_classes() noexcept:
    cdef int c
    for c in range(256):
        _CLASS[c] = 0
    for c in range(48, 58):
        _CLASS[c] = DIGIT | NUMERIC
    for c in b"+-.eEnNaAiIfFtTyY":
        _CLASS[c] = NUMERIC
    _CLASS[32] = _CLASS[9] = BLANK
    _CLASS[10] = _CLASS[13] = LINE_END


_fill_classes()


cdef Py_ssize_t _check_line(const unsigned char[::1] text, Py_ssize_t pos, Py_ssize_t size, int n_fields,
                            bint *size_line, bint *ok) noexcept nogil:
    """Check the line that starts at ``pos`` (``ok``; ``size_line``: it is the size line if it is
    not blank or a comment, and no longer after one) and return where the next line starts."""
    cdef int field, want
    cdef unsigned char seen, k
    ok[0] = True
    while pos < size and (text[pos] == 32 or text[pos] == 9):
        pos += 1
    if pos < size and text[pos] != 10 and text[pos] != 13 and text[pos] != 37:  # not blank, not %
        want = 3 if size_line[0] else n_fields
        field = 0
        while pos < size and text[pos] != 10 and text[pos] != 13:
            seen = DIGIT | NUMERIC  # the classes every byte of the field has
            while pos < size:
                k = _CLASS[text[pos]]
                if k & (BLANK | LINE_END):
                    break
                seen &= k
                pos += 1
            # a value such as "1V" is no number (the parser reads 1, or crashes at the end of a file)
            if not (seen & NUMERIC) or ((field < 2 or size_line[0]) and not (seen & DIGIT)):
                ok[0] = False
            field += 1
            while pos < size and (text[pos] == 32 or text[pos] == 9):
                pos += 1
        if field != want:
            ok[0] = False
        size_line[0] = False
    while pos < size and text[pos] != 10:
        pos += 1
    return pos + 1


cdef int64_t _first_bad_in(const unsigned char[::1] text, Py_ssize_t pos, Py_ssize_t end, int n_fields,
                           int64_t *lines) noexcept nogil:
    """The 1-based number, counted from ``pos``, of the first bad entry line of the whole lines in
    ``[pos, end)``, or 0 (``lines``: how many lines were read)."""
    cdef Py_ssize_t size = text.shape[0]
    cdef bint size_line = False, ok = True
    cdef int64_t line = 0
    while pos < end:
        line += 1
        pos = _check_line(text, pos, size, n_fields, &size_line, &ok)
        if not ok:
            lines[0] = line
            return line
    lines[0] = line
    return 0


def first_bad_coordinate_line(const unsigned char[::1] text, int n_fields, int n_threads=1,
                              Py_ssize_t chunk_bytes=1 << 20):
    """The 1-based number of the first line of a Matrix Market coordinate text that is not
    ``n_fields`` whitespace-separated fields with the first two made of digits and the others
    numbers (the size line, the first non-comment line, must be three digit fields), or 0 if
    every line is.  Comment (``%``) and blank lines are skipped.

    The lines up to the size line are read in order; the entries after it in runs of whole lines
    of at least ``chunk_bytes``, on up to ``n_threads`` threads, each run's first bad line and
    line count then combined in order."""
    cdef Py_ssize_t size = text.shape[0], pos = 0, cut
    cdef int64_t line = 0, before
    cdef bint size_line = True, ok = True
    cdef int t, nt
    with nogil:
        while pos < size and size_line and ok:
            line += 1
            pos = _check_line(text, pos, size, n_fields, &size_line, &ok)
    if not ok:
        return line
    if pos >= size:
        return 0
    nt = <int>max(1, min(<Py_ssize_t>max(n_threads, 1), (size - pos) // max(chunk_bytes, 1)))
    cdef int64_t[::1] bounds = np.empty(nt + 1, dtype=np.int64)
    cdef int64_t[::1] bad = np.zeros(nt, dtype=np.int64)
    cdef int64_t[::1] lines = np.zeros(nt, dtype=np.int64)
    bounds[0] = pos
    bounds[nt] = size
    with nogil:
        for t in range(1, nt):  # each run starts where a line does
            cut = max(<Py_ssize_t>bounds[t - 1], pos + (size - pos) * t // nt)
            while cut < size and text[cut - 1] != 10:
                cut += 1
            bounds[t] = cut
        for t in prange(nt, num_threads=nt, schedule="static", chunksize=1, use_threads_if=nt > 1):
            bad[t] = _first_bad_in(text, bounds[t], bounds[t + 1], n_fields, &lines[t])
    before = line
    for t in range(nt):
        if bad[t]:
            return before + bad[t]
        before += lines[t]
    return 0


cdef Py_ssize_t _edge_line(const unsigned char[::1] text, Py_ssize_t pos, Py_ssize_t end,
                           const unsigned char[::1] marks, int64_t *out, int *fields) noexcept nogil:
    """Read the line of an edge list that starts at ``pos`` and return where the next one starts:
    ``fields`` 0 for a blank or comment line (its first non-blank byte one of ``marks``), 2 or 3 for
    that many unsigned decimal integers of at most 18 digits separated by blanks (into ``out``), -1
    for any other line."""
    cdef int f = 0, digits, k
    cdef int64_t v
    cdef bint comment = False
    fields[0] = 0
    while pos < end and (text[pos] == 32 or text[pos] == 9):
        pos += 1
    if pos < end:
        for k in range(marks.shape[0]):
            comment = comment or text[pos] == marks[k]
    if pos < end and text[pos] != 10 and text[pos] != 13 and not comment:
        while pos < end and text[pos] != 10 and text[pos] != 13:
            digits, v = 0, 0
            while pos < end and 48 <= text[pos] <= 57 and digits < 18:
                v = v * 10 + (text[pos] - 48)
                pos += 1
                digits += 1
            if f == 3 or digits == 0 or (pos < end and _CLASS[text[pos]] & (BLANK | LINE_END) == 0):
                f = 0  # not an edge line
                break
            out[f] = v
            f += 1
            while pos < end and (text[pos] == 32 or text[pos] == 9):
                pos += 1
        fields[0] = f if f >= 2 else -1
    while pos < end and text[pos] != 10:
        pos += 1
    return pos + 1


cdef int64_t _edge_lines_in(const unsigned char[::1] text, Py_ssize_t pos, Py_ssize_t end,
                            const unsigned char[::1] marks, int64_t *table, int width) noexcept nogil:
    """The data lines of the whole lines in ``[pos, end)``.  With ``table`` NULL (``width`` 0) they
    are counted: ``rows * 4 + w`` for ``rows`` lines all ``w`` fields wide, 0 for none; otherwise
    they are written into ``table`` (rows of ``width``) and ``rows`` returned.  -1 where a line is
    not an edge line (:func:`_edge_line`) or not as wide as the others."""
    cdef int64_t rows = 0
    cdef int64_t row[3]
    cdef int fields, seen = width
    while pos < end:
        pos = _edge_line(text, pos, end, marks, row, &fields)
        if fields == 0:
            continue
        if fields < 0 or (seen and fields != seen):
            return -1
        seen = fields
        if table != NULL:
            table[rows * width] = row[0]
            table[rows * width + 1] = row[1]
            if width == 3:
                table[rows * width + 2] = row[2]
        rows += 1
    return rows if table != NULL or rows == 0 else rows * 4 + seen


def parse_edge_lines(const unsigned char[::1] text, const unsigned char[::1] marks, int n_threads=1,
                     Py_ssize_t chunk_bytes=1 << 20):
    """The edge list ``text`` as an int64 table of two or three columns (vertex ids, then an integer
    weight) in line order, parsed in runs of whole lines of at least ``chunk_bytes`` on up to
    ``n_threads`` threads; or None where a line is neither blank, a comment (first non-blank byte in
    ``marks``) nor two or three unsigned decimal integers of at most 18 digits separated by blanks,
    or the lines differ in width (the caller then parses the general way, which names the line)."""
    cdef Py_ssize_t size = text.shape[0], cut
    cdef int t, nt = <int>max(1, min(<Py_ssize_t>max(n_threads, 1), size // max(chunk_bytes, 1)))
    cdef int64_t[::1] bounds = np.empty(nt + 1, dtype=np.int64)
    cdef int64_t[::1] found = np.zeros(nt, dtype=np.int64)
    cdef int64_t[::1] start = np.zeros(nt + 1, dtype=np.int64)
    cdef int64_t[:, ::1] view
    cdef int width = 0
    bounds[0] = 0
    bounds[nt] = size
    with nogil:
        for t in range(1, nt):  # each run starts where a line does
            cut = max(<Py_ssize_t>bounds[t - 1], size * t // nt)
            while cut < size and text[cut - 1] != 10:
                cut += 1
            bounds[t] = cut
        for t in prange(nt, num_threads=nt, schedule="static", chunksize=1, use_threads_if=nt > 1):
            found[t] = _edge_lines_in(text, bounds[t], bounds[t + 1], marks, NULL, 0)
    for t in range(nt):  # rows * 4 + width per run (0 for a run of no data line), or -1
        if found[t] < 0 or (width and found[t] and found[t] % 4 != width):
            return None
        if found[t]:
            width = found[t] % 4
        start[t + 1] = start[t] + found[t] // 4
    out = np.empty((start[nt], max(width, 2)), np.int64)
    if start[nt] == 0:
        return out
    view = out
    with nogil:
        for t in prange(nt, num_threads=nt, schedule="static", chunksize=1, use_threads_if=nt > 1):
            if start[t + 1] > start[t]:
                _edge_lines_in(text, bounds[t], bounds[t + 1], marks, &view[start[t], 0], width)
    return out


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL
    return z ^ (z >> 31)


cdef inline uint64_t _entry_hash(uint64_t a, uint64_t b, uint64_t v, uint64_t key) noexcept nogil:
    return _mix(_mix(a * 0x9e3779b97f4a7c15ULL + b + key) ^ v)


def mirror_sums(const int64_t[::1] indptr, const index_t[::1] indices, const value_t[::1] values, *,
                bint has_values, uint64_t key, int n_threads):
    """``(sum over entries of h(i, j, v), sum of h(j, i, v))`` mod 2**64, ``h`` a hash keyed by
    ``key``.  A symmetric matrix stores the same entries both ways, so its two sums are equal; an
    asymmetric one gives equal sums only when ``h`` collides (about 2**-64 for a key the input
    cannot know).  One streaming pass, every thread its own rows: no search, no cursor."""
    cdef int64_t n = indptr.shape[0] - 1, i, k
    cdef uint64_t fwd = 0, bwd = 0, v, zero = 0
    cdef double d
    for i in prange(n, nogil=True, num_threads=n_threads, schedule="static", use_threads_if=n_threads > 1):
        for k in range(indptr[i], indptr[i + 1]):
            if not has_values:
                v = zero
            elif value_t is int64_t:
                v = <uint64_t>values[k]
            else:
                d = <double>values[k] + 0.0  # -0.0 and 0.0 compare equal: hash them alike
                v = (<uint64_t*>&d)[0]
            fwd += _entry_hash(<uint64_t>i, <uint64_t>indices[k], v, key)
            bwd += _entry_hash(<uint64_t>indices[k], <uint64_t>i, v, key)
    return int(fwd), int(bwd)


cdef extern from *:
    """
    #include <stdlib.h>
    #include <stdint.h>
    typedef struct { int32_t col; double val; } graphkern_entry;
    static int graphkern_by_col(const void* a, const void* b) {
        int32_t x = ((const graphkern_entry*)a)->col, y = ((const graphkern_entry*)b)->col;
        return (x > y) - (x < y);
    }
    /* one row's entries by column, values carried; 1 when two share a column (-1: no memory).
       A row already in order (the rows of a file written row by row) is only scanned. */
    static int graphkern_sort_row(int32_t* cols, double* vals, int64_t m) {
        int64_t i, j;
        for (i = 1; i < m && cols[i] > cols[i - 1]; i++) {}
        if (i == m) return 0;
        if (cols[i] == cols[i - 1]) return 1;
        if (m <= 32) {
            for (i = 1; i < m; i++) {
                int32_t c = cols[i]; double v = vals[i];
                for (j = i; j > 0 && cols[j - 1] > c; j--) { cols[j] = cols[j - 1]; vals[j] = vals[j - 1]; }
                cols[j] = c; vals[j] = v;
            }
        } else {
            graphkern_entry* t = (graphkern_entry*)malloc(m * sizeof(graphkern_entry));
            if (t == NULL) return -1;
            for (i = 0; i < m; i++) { t[i].col = cols[i]; t[i].val = vals[i]; }
            qsort(t, m, sizeof(graphkern_entry), graphkern_by_col);
            for (i = 0; i < m; i++) { cols[i] = t[i].col; vals[i] = t[i].val; }
            free(t);
        }
        for (i = 1; i < m; i++) if (cols[i] == cols[i - 1]) return 1;
        return 0;
    }
    """
    int sort_row "graphkern_sort_row"(int32_t* cols, double* vals, int64_t m) noexcept nogil

ctypedef fused coordinate_value_t:
    double
    int64_t

# what coordinates_to_csr counts, per thread
cdef enum:
    C_OUTSIDE, C_DIAGONAL, C_NONFINITE, C_NEGATIVE, C_NOT_ONE, C_DUPLICATE, C_KINDS


cdef void _count_own(const int32_t* rows, const int32_t* cols, const coordinate_value_t* values, int64_t nnz,
                     int64_t n, int64_t lo, int64_t hi, bint first, bint mirror, int64_t* counts,
                     int64_t* figures) noexcept nogil:
    """One thread's count of the entries in its rows ``[lo, hi)`` (``first``: it also counts the
    rows outside ``[0, n)``; ``mirror``: an entry ``(r, c)`` off the diagonal is also one of row
    ``c``).  The figures count each given entry once, by the thread of its row."""
    cdef int64_t k, r, c, outside = 0, diagonal = 0, nonfinite = 0, negative = 0, not_one = 0
    cdef double v
    for k in range(nnz):
        r = rows[k]
        c = cols[k]
        if mirror and c != r and c >= lo and c < hi:
            counts[c + 1] += 1
        if r < lo or r >= hi:
            outside += first and (r < 0 or r >= n)
            continue
        if c < 0 or c >= n:
            outside += 1
            continue
        counts[r + 1] += 1
        diagonal += r == c
        v = <double>values[k]
        if coordinate_value_t is double:
            nonfinite += not isfinite(v)
        negative += v < 0
        not_one += v != 1.0
    figures[C_OUTSIDE] = outside
    figures[C_DIAGONAL] = diagonal
    figures[C_NONFINITE] = nonfinite
    figures[C_NEGATIVE] = negative
    figures[C_NOT_ONE] = not_one


cdef void _place_own(const int32_t* rows, const int32_t* cols, const coordinate_value_t* values, int64_t nnz,
                     int64_t lo, int64_t hi, bint mirror, const int64_t* indptr, int64_t* cursor, int32_t* indices,
                     double* data, int64_t* figures) noexcept nogil:
    """One thread's placing of the entries in its rows ``[lo, hi)`` (with ``mirror``, ``(c, r)``
    for each ``(r, c)`` off the diagonal too), then the sort of each row."""
    cdef int64_t k, r, c, p, i
    for k in range(nnz):
        r = rows[k]
        c = cols[k]
        if r >= lo and r < hi:
            p = cursor[r]
            cursor[r] = p + 1
            indices[p] = <int32_t>c
            data[p] = <double>values[k]
        if mirror and c != r and c >= lo and c < hi:
            p = cursor[c]
            cursor[c] = p + 1
            indices[p] = <int32_t>r
            data[p] = <double>values[k]
    for i in range(lo, hi):
        if indptr[i + 1] - indptr[i] > 1 and sort_row(indices + indptr[i], data + indptr[i],
                                                      indptr[i + 1] - indptr[i]) != 0:
            figures[C_DUPLICATE] = 1


def coordinates_to_csr(const int32_t[::1] rows, const int32_t[::1] cols, const coordinate_value_t[::1] values,
                       int64_t n, int n_threads, bint mirror=False):
    """The CSR of the ``n x n`` matrix with the entries ``(rows[k], cols[k], values[k])`` -- and,
    with ``mirror``, ``(cols[k], rows[k], values[k])`` for each off the diagonal (the stored triangle
    of a symmetric file) -- every row sorted by column, the values as float64, and what the given
    entries hold.

    Each thread owns a range of rows and reads every entry's row (and column), counting and then
    placing only its own: no atomic updates, whose ordering would keep the scattered writes from
    overlapping, and the entries of a row stay in file order until the sort of each row.  Returns
    ``(indptr, indices, data, figures)`` with ``figures`` a dict over the given entries:
    ``diagonal`` (entries with ``i == j``), ``duplicate`` (two entries of the result share a place),
    ``nonfinite``, ``negative`` and ``not_one`` (counts of such values); or None when an index lies
    outside ``[0, n)``.  The result does not depend on the thread count.
    """
    cdef int64_t nnz = rows.shape[0]
    cdef int t, nt = <int>max(1, min(<int64_t>max(n_threads, 1), n // 64))
    counts_out = np.zeros(n + 1, np.int64)
    cdef int64_t[::1] counts = counts_out
    cdef int64_t[:, ::1] figures = np.zeros((nt, C_KINDS), np.int64)
    cdef int64_t[::1] cursor
    cdef int32_t[::1] indices
    cdef double[::1] data
    if nnz == 0:
        return counts_out, np.empty(0, np.int32), np.empty(0, np.float64), dict(
            diagonal=0, duplicate=False, nonfinite=0, negative=0, not_one=0)
    with nogil:
        for t in prange(nt, num_threads=nt, schedule="static", chunksize=1, use_threads_if=nt > 1):
            _count_own(&rows[0], &cols[0], &values[0], nnz, n, n * t // nt, n * (t + 1) // nt, t == 0, mirror,
                       &counts[0], &figures[t, 0])
    total = np.asarray(figures).sum(axis=0)
    if total[C_OUTSIDE]:
        return None
    indptr_out = np.cumsum(counts_out, out=counts_out)
    stored = int(indptr_out[n])
    indices_out = np.empty(stored, np.int32)
    data_out = np.empty(max(stored, 1), np.float64)[:stored]
    indices = indices_out
    data = data_out if stored else np.empty(1, np.float64)
    cursor = indptr_out[:n].copy()
    with nogil:
        for t in prange(nt, num_threads=nt, schedule="static", chunksize=1, use_threads_if=nt > 1):
            _place_own(&rows[0], &cols[0], &values[0], nnz, n * t // nt, n * (t + 1) // nt, mirror, &counts[0],
                       &cursor[0], &indices[0], &data[0], &figures[t, 0])
    total = np.asarray(figures).sum(axis=0)
    return indptr_out, indices_out, data_out, dict(
        diagonal=int(total[C_DIAGONAL]), duplicate=bool(total[C_DUPLICATE]), nonfinite=int(total[C_NONFINITE]),
        negative=int(total[C_NEGATIVE]), not_one=int(total[C_NOT_ONE]))
