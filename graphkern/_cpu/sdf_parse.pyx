# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""V2000 SD files parsed in one compiled pass over the file's bytes into flat per-molecule arrays
(``graphkern.io.sdf`` documents the checks).  Lines end in ``\\n``, ``\\r\\n`` or ``\\r``, as
Python's universal newlines do; the first problem stops the parse, the molecules before it complete.
``make_graphs`` turns the parsed molecules into Graphs whose arrays are read-only views of the parser's.
"""

import numpy as np

cimport numpy as cnp
from cpython.dict cimport PyDict_SetItem
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject, newfunc
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.math cimport isfinite, sqrt
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport strtod
from libc.string cimport memchr, memcmp

# the kinds of problem the parser reports
cdef enum:
    OK, HEADER_EOF, NO_COUNTS, ATOM_COUNT, BOND_COUNT, NEGATIVE, V3000, VERSION, ATOM_EOF, ATOM_LINE, COORD_X, \
    COORD_Y, COORD_Z, ELEMENT, CHARGE_NAN, CHARGE_CODE, BOND_EOF, BOND_LINE, BOND_ATOM_A, BOND_ATOM_B, \
    BOND_SELF, BOND_TYPE, BOND_REPEAT, PROPS_EOF, NO_END, CHG_COUNT, CHG_PAIRS, CHG_ATOM_NAN, CHG_ATOM, \
    CHG_NAN, AG_EOF, SKP_NAN, SKP_EOF, BOND_AFTER

# their names, as parse_sdf reports them
PROBLEMS = (None, 'header_eof', 'no_counts', 'atom_count', 'bond_count', 'negative', 'v3000',
            'version', 'atom_eof', 'atom_line', 'coord_x', 'coord_y', 'coord_z',
            'element', 'charge_nan', 'charge_code', 'bond_eof', 'bond_line', 'bond_atom_a',
            'bond_atom_b', 'bond_self', 'bond_type', 'bond_repeat', 'props_eof', 'no_end',
            'chg_count', 'chg_pairs', 'chg_atom_nan', 'chg_atom', 'chg_nan', 'ag_eof',
            'skp_nan', 'skp_eof', 'bond_after')
cdef int64_t INT_LIMIT = 99999999999999999  # larger integers are refused rather than overflow


cdef inline bint is_space(unsigned char c) noexcept nogil:
    return c == 32 or 9 <= c <= 13 or 28 <= c <= 31


cdef struct Reader:
    const unsigned char *buf
    Py_ssize_t n, pos, start, end  # the current line is buf[start:end]
    Py_ssize_t lf, cr  # where the next line feed and carriage return at or after pos are (n: none; < pos: unknown)
    int64_t lineno


cdef inline Py_ssize_t next_byte(Reader *r, Py_ssize_t p, int byte) noexcept nogil:
    """The position of the first ``byte`` at or after p, or n."""
    cdef const unsigned char *hit = <const unsigned char *>memchr(r.buf + p, byte, r.n - p)
    return r.n if hit == NULL else hit - r.buf


cdef inline bint next_line(Reader *r) noexcept nogil:
    """Advance to the next line; False at the end of the buffer.

    The line ends at the nearer of the next ``\\n`` and ``\\r``, each found by memchr and kept
    until the reader passes it: a file of one line ending is searched for the other once.
    """
    cdef Py_ssize_t p = r.pos
    if p >= r.n:
        return False
    r.start = p
    if r.lf < p:
        r.lf = next_byte(r, p, 10)
    if r.cr < p:
        r.cr = next_byte(r, p, 13)
    p = min(r.lf, r.cr)
    r.end = p
    if p < r.n:
        p += 2 if r.buf[p] == 13 and p + 1 < r.n and r.buf[p + 1] == 10 else 1
    r.pos = p
    r.lineno += 1
    return True


cdef inline void field(Reader *r, Py_ssize_t a, Py_ssize_t b, Py_ssize_t *s, Py_ssize_t *e) noexcept nogil:
    """Columns [a, b) of the current line, clipped to it and stripped of white space."""
    cdef Py_ssize_t length = r.end - r.start
    a = min(a, length)
    b = min(b, length)
    while a < b and is_space(r.buf[r.start + a]):
        a += 1
    while b > a and is_space(r.buf[r.start + b - 1]):
        b -= 1
    s[0] = r.start + a
    e[0] = r.start + b


cdef inline bint parse_int(const unsigned char *buf, Py_ssize_t s, Py_ssize_t e, int64_t *out) noexcept nogil:
    """An optionally signed decimal integer filling buf[s:e] (already stripped); False if not one."""
    cdef bint negative = False
    cdef int64_t v = 0
    if s < e and (buf[s] == 43 or buf[s] == 45):
        negative = buf[s] == 45
        s += 1
    if s >= e:
        return False
    while s < e:
        if not 48 <= buf[s] <= 57 or v > INT_LIMIT:
            return False
        v = v * 10 + (buf[s] - 48)
        s += 1
    out[0] = -v if negative else v
    return True


cdef inline bint int_field(Reader *r, Py_ssize_t a, Py_ssize_t b, int64_t *out) noexcept nogil:
    """Columns [a, b) of the current line as an integer; False if they hold none."""
    cdef Py_ssize_t s, e
    field(r, a, b, &s, &e)
    return parse_int(r.buf, s, e, out)


cdef inline bint next_token(Reader *r, Py_ssize_t *p, Py_ssize_t *s) noexcept nogil:
    """The next white-space separated token of the line from p: it is buf[s:p]; False at the line end."""
    while p[0] < r.end and is_space(r.buf[p[0]]):
        p[0] += 1
    if p[0] == r.end:
        return False
    s[0] = p[0]
    while p[0] < r.end and not is_space(r.buf[p[0]]):
        p[0] += 1
    return True


cdef inline bint is_word(const unsigned char *p, Py_ssize_t length, const char *word) noexcept nogil:
    """p[:length] spells ``word`` (lower case) ignoring case."""
    cdef Py_ssize_t k
    for k in range(length):
        if word[k] == 0 or (p[k] | 32) != word[k]:
            return False
    return word[length] == 0


cdef double[16] POWERS_OF_TEN = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15]


cdef bint parse_float(Reader *r, Py_ssize_t a, Py_ssize_t b, double *out) noexcept nogil:
    """Columns [a, b) of the line as a float, with Python's float() grammar less underscores.

    A plain decimal of at most 15 digits is its integer mantissa over a power of ten, both exact
    doubles, so the one division rounds correctly; anything else goes to strtod.
    """
    cdef Py_ssize_t s, e, p, digits = 0, fraction = 0
    cdef int64_t mantissa = 0
    cdef bint plain = True
    cdef double value
    cdef char text[32]
    field(r, a, b, &s, &e)
    if e - s == 0 or e - s > 30:
        return False
    p = s + (1 if r.buf[s] == 43 or r.buf[s] == 45 else 0)
    if p < e and ((r.buf[p] | 32) == 105 or (r.buf[p] | 32) == 110) and (
            is_word(r.buf + p, e - p, b"inf") or is_word(r.buf + p, e - p, b"infinity") or
            is_word(r.buf + p, e - p, b"nan")):
        plain = False
    else:
        while p < e and 48 <= r.buf[p] <= 57:
            mantissa = mantissa * 10 + (r.buf[p] - 48)
            p += 1
            digits += 1
        if p < e and r.buf[p] == 46:
            p += 1
            while p < e and 48 <= r.buf[p] <= 57:
                mantissa = mantissa * 10 + (r.buf[p] - 48)
                p += 1
                digits += 1
                fraction += 1
        if digits == 0:
            return False
        if p < e and (r.buf[p] | 32) == 101:
            plain = False
            p += 1
            if p < e and (r.buf[p] == 43 or r.buf[p] == 45):
                p += 1
            if p >= e or not 48 <= r.buf[p] <= 57:
                return False
            while p < e and 48 <= r.buf[p] <= 57:
                p += 1
        if p != e:
            return False
    if plain and digits <= 15:
        value = <double>mantissa / POWERS_OF_TEN[fraction]
        out[0] = -value if r.buf[s] == 45 else value  # -0.0 for '-0.0', as float() reads it
        return True
    for p in range(s, e):
        text[p - s] = <char>r.buf[p]
    text[e - s] = 0
    out[0] = strtod(text, NULL)
    return True


cdef inline bint starts(Reader *r, const char *prefix, Py_ssize_t length) noexcept nogil:
    return r.end - r.start >= length and memcmp(r.buf + r.start, prefix, length) == 0


cdef bint is_blank(Reader *r) noexcept nogil:
    cdef Py_ssize_t p
    for p in range(r.start, r.end):
        if not is_space(r.buf[p]):
            return False
    return True


cdef bint is_bond_line(Reader *r) noexcept nogil:
    """Three or more runs of digits separated by white space, nothing else."""
    cdef Py_ssize_t p = r.start
    cdef int runs = 0
    while True:
        while p < r.end and is_space(r.buf[p]):
            p += 1
        if p == r.end:
            return runs >= 3
        if not 48 <= r.buf[p] <= 57:
            return False
        while p < r.end and 48 <= r.buf[p] <= 57:
            p += 1
        runs += 1
        if p < r.end and not is_space(r.buf[p]):
            return False


cdef int element_of(Reader *r, const int64_t *keys, const int64_t *values, const int32_t *first) noexcept nogil:
    """The atomic number of the symbol in columns 32-34, or -1.

    A symbol is a key of three bytes (zeros after a shorter one), looked up in the sorted ``keys``
    among those of its first byte, ``keys[first[byte]:first[byte + 1]]``: a dozen at most, the
    symbol of one letter first.
    """
    cdef Py_ssize_t s, e, p
    cdef int64_t key = 0
    cdef int k
    field(r, 31, 34, &s, &e)
    for p in range(s, s + 3):
        key = key * 256 + (r.buf[p] if p < e else 0)
    for k in range(first[key >> 16], first[(key >> 16) + 1]):
        if keys[k] >= key:
            return <int>values[k] if keys[k] == key else -1
    return -1


cdef int charge_of_code(int64_t code) noexcept nogil:
    # codes 1-3 are +3..+1, 5-7 are -1..-3; 4 is a doublet radical, without charge
    return 0 if code == 0 or code == 4 else 4 - code


def parse_sdf(const unsigned char[::1] buf, const int64_t[::1] symbol_keys, const int64_t[::1] symbol_values,
              bint hydrogens, bint distance_weights):
    """Parse an SD file's bytes; returns (arrays dict, problem tuple or None).

    The arrays: per molecule ``n_atoms``, ``nnz`` (after dropping hydrogens), ``name`` and ``data``
    byte spans (``[start, end)``, the data items' lines after ``M  END``); per kept atom
    ``element``, ``charge``, ``coords``; per molecule the CSR ``indptr`` (n_atoms + 1 entries each),
    and per stored entry ``indices``, ``bond_order`` and ``weights``; ``lines`` counts the lines
    read.  The problem tuple is ``(kind, line, molecule, k, counts_line, first_bond_line)``, ``kind`` a name from ``PROBLEMS``.
    """
    cdef Py_ssize_t n = buf.shape[0], lines = 1
    cdef Py_ssize_t p, end_
    cdef const unsigned char *bytes_ = &buf[0] if n else NULL
    cdef unsigned char ends
    # line ends counted in bytes, 255 at a time, without a branch: the compiler vectorises it
    for p in range(0, n, 255):
        ends = 0
        for end_ in range(p, min(p + 255, n)):
            ends += (bytes_[end_] == 10) | (bytes_[end_] == 13)
        lines += ends
    # every atom and bond takes a line of its own: the line count bounds the arrays
    n_atoms_a = np.zeros(lines // 4 + 1, dtype=np.int32)
    nnz_a = np.zeros(lines // 4 + 1, dtype=np.int64)
    spans_a = np.zeros((lines // 4 + 1, 4), dtype=np.int64)
    element_a = np.empty(lines, dtype=np.int64)
    charge_a = np.empty(lines, dtype=np.int64)
    coords_a = np.empty((lines, 3), dtype=np.float64)
    indptr_a = np.empty(lines + lines // 4 + 1, dtype=np.int32)
    indices_a = np.empty(2 * lines, dtype=np.int32)
    order_a = np.empty(2 * lines, dtype=np.int64)
    weights_a = np.empty(2 * lines if distance_weights else 0, dtype=np.float64)
    cdef int32_t[::1] n_atoms_v = n_atoms_a, indptr_v = indptr_a, indices_v = indices_a
    cdef int64_t[::1] nnz_v = nnz_a, element_v = element_a, charge_v = charge_a, order_v = order_a
    cdef int64_t[:, ::1] spans = spans_a
    cdef double[:, ::1] coords = coords_a
    cdef double[::1] weights_v = weights_a
    # a count has three columns: at most 999 atoms and bonds
    cdef int32_t bond_a[1000]
    cdef int32_t bond_b[1000]
    cdef int32_t bond_o[1000]
    cdef int32_t new_index[1000]
    # the bonds read so far, listed by their lower atom: first[a], then after[k] (-1 ends a list)
    cdef int32_t first[1000]
    cdef int32_t after[1000]
    # where the keys of each first byte begin among the sorted keys
    cdef int32_t first_key[257]
    cdef int n_keys = symbol_keys.shape[0], byte
    p = 0
    for byte in range(257):
        while p < n_keys and symbol_keys[p] >> 16 < byte:
            p += 1
        first_key[byte] = <int32_t>p
    cdef int32_t fill[1001]
    cdef Reader r
    r.buf = &buf[0] if n else NULL
    r.n, r.pos, r.lineno, r.lf, r.cr = n, 0, 0, -1, -1
    cdef int kind = OK, k, j, i, q, nonblank
    cdef Py_ssize_t mol = 0, atom0 = 0, ptr0 = 0, ent0 = 0, kept, s, e, name_s = 0, name_e = 0
    cdef int64_t counts_line = 0, first_bond_line = 0, n_at = 0, n_bo = 0, v, v2, v3, count, atom
    cdef bint charged, got = True
    cdef double dx, dy, dz
    with nogil:
        while True:
            # ---- header block: three lines, then the counts line
            nonblank = 0
            for k in range(3):
                got = next_line(&r)
                if not got:
                    break
                if k == 0:
                    name_s, name_e = r.start, r.end
                nonblank += not is_blank(&r)
            if not got:
                kind = HEADER_EOF if nonblank else OK
                break
            got = next_line(&r)
            if not got or is_blank(&r):
                while nonblank == 0 and got and is_blank(&r):
                    got = next_line(&r)
                if not got and nonblank == 0:
                    break  # blank lines after the last molecule
                kind = NO_COUNTS if got else HEADER_EOF
                break
            counts_line = r.lineno
            if not int_field(&r, 0, 3, &n_at):
                kind = ATOM_COUNT
                break
            if not int_field(&r, 3, 6, &n_bo):
                kind = BOND_COUNT
                break
            if n_at < 0 or n_bo < 0:
                kind = NEGATIVE
                break
            field(&r, 34, 39, &s, &e)
            if e - s == 5 and (r.buf[s] | 32) == 118 and memcmp(r.buf + s + 1, b"3000", 4) == 0:
                kind = V3000
                break
            if e > s and not (e - s == 5 and (r.buf[s] | 32) == 118 and memcmp(r.buf + s + 1, b"2000", 4) == 0):
                kind = VERSION
                break
            # ---- atom block
            for k in range(n_at):
                if not next_line(&r):
                    kind = ATOM_EOF
                    break
                field(&r, 31, 34, &s, &e)
                if r.end - r.start < 34 or s == e:
                    kind = ATOM_LINE
                    break
                for j in range(3):
                    if not parse_float(&r, 10 * j, 10 * j + 10, &coords[atom0 + k, j]):
                        kind = COORD_X + j  # COORD_Y, COORD_Z follow
                        break
                if kind != OK:
                    break
                i = element_of(&r, &symbol_keys[0], &symbol_values[0], first_key)
                if i < 0:
                    kind = ELEMENT
                    break
                element_v[atom0 + k] = i
                field(&r, 36, 39, &s, &e)
                v = 0
                if s < e and not parse_int(r.buf, s, e, &v):
                    kind = CHARGE_NAN
                    break
                if not 0 <= v <= 7:
                    kind = CHARGE_CODE
                    break
                charge_v[atom0 + k] = charge_of_code(v)
            if kind != OK:
                break
            # ---- bond block
            first_bond_line = r.lineno + 1
            for k in range(n_at):
                first[k] = -1
            for k in range(n_bo):
                if not next_line(&r):
                    kind = BOND_EOF
                    break
                if not (int_field(&r, 0, 3, &v) and int_field(&r, 3, 6, &v2) and int_field(&r, 6, 9, &v3)):
                    kind = BOND_LINE
                    break
                if not 1 <= v <= n_at:
                    kind = BOND_ATOM_A
                    break
                if not 1 <= v2 <= n_at:
                    kind = BOND_ATOM_B
                    break
                if v == v2:
                    kind = BOND_SELF
                    break
                if not 1 <= v3 <= 8:
                    kind = BOND_TYPE
                    break
                bond_a[k], bond_b[k], bond_o[k] = <int32_t>min(v, v2) - 1, <int32_t>max(v, v2) - 1, <int32_t>v3
                j = first[bond_a[k]]
                while j >= 0 and bond_b[j] != bond_b[k]:
                    j = after[j]
                if j >= 0:
                    kind = BOND_REPEAT
                    break
                after[k], first[bond_a[k]] = first[bond_a[k]], k
            if kind != OK:
                break
            # ---- properties block, up to 'M  END'
            charged = False
            while True:
                if not next_line(&r):
                    kind = PROPS_EOF
                    break
                if starts(&r, b"M  END", 6):
                    break
                if starts(&r, b"$$$$", 4):
                    kind = NO_END
                    break
                if starts(&r, b"M  CHG", 6):
                    if not charged:
                        charged = True
                        for k in range(n_at):
                            charge_v[atom0 + k] = 0
                    # white-space separated fields after column 6: the count, then atom-charge pairs
                    p = r.start + 6
                    k = 0
                    while next_token(&r, &p, &s):
                        k += 1
                    p = r.start + 6
                    j = 0
                    while next_token(&r, &p, &s):
                        if j == 0:
                            if not parse_int(r.buf, s, p, &count):
                                kind = CHG_COUNT
                                break
                            if k != 1 + 2 * count:
                                kind = CHG_PAIRS
                                break
                        elif j % 2 == 1:
                            if not parse_int(r.buf, s, p, &atom):
                                kind = CHG_ATOM_NAN
                                break
                            if not 1 <= atom <= n_at:
                                kind = CHG_ATOM
                                break
                        else:
                            if not parse_int(r.buf, s, p, &v):
                                kind = CHG_NAN
                                break
                            charge_v[atom0 + atom - 1] = v
                        j += 1
                    if kind == OK and k == 0:
                        kind = CHG_COUNT
                    if kind != OK:
                        break
                elif starts(&r, b"M  V30", 6):
                    kind = V3000
                    break
                elif starts(&r, b"A  ", 3) or starts(&r, b"G  ", 3):
                    if not next_line(&r):
                        kind = AG_EOF
                        break
                elif starts(&r, b"S  SKP", 6):
                    if not int_field(&r, 6, 9, &count):
                        kind = SKP_NAN
                        break
                    while count > 0:
                        if not next_line(&r):
                            kind = SKP_EOF
                            break
                        count -= 1
                    if kind != OK:
                        break
                elif is_bond_line(&r):
                    kind = BOND_AFTER
                    break
            if kind != OK:
                break
            # ---- data items, up to '$$$$' or the end of the file
            spans[mol, 0], spans[mol, 1], spans[mol, 2] = name_s, name_e, r.pos
            got = next_line(&r)
            while got and not starts(&r, b"$$$$", 4):
                got = next_line(&r)
            spans[mol, 3] = r.start if got else r.n
            # ---- the molecule's graph: drop hydrogens, then a sorted symmetric CSR
            kept = 0
            for k in range(n_at):
                new_index[k] = -1
                if hydrogens or element_v[atom0 + k] != 1:
                    new_index[k] = <int32_t>kept
                    if kept != k:
                        element_v[atom0 + kept] = element_v[atom0 + k]
                        charge_v[atom0 + kept] = charge_v[atom0 + k]
                        for j in range(3):
                            coords[atom0 + kept, j] = coords[atom0 + k, j]
                    kept += 1
            for k in range(kept + 1):
                fill[k] = 0
            for k in range(n_bo):
                i, j = new_index[bond_a[k]], new_index[bond_b[k]]
                if i >= 0 and j >= 0:
                    fill[i + 1] += 1
                    fill[j + 1] += 1
            for k in range(kept):
                fill[k + 1] += fill[k]
            for k in range(kept + 1):
                indptr_v[ptr0 + k] = fill[k]
            for k in range(n_bo):
                i, j = new_index[bond_a[k]], new_index[bond_b[k]]
                if i >= 0 and j >= 0:
                    for q in range(2):
                        indices_v[ent0 + fill[i]] = j
                        order_v[ent0 + fill[i]] = bond_o[k]
                        if distance_weights:
                            dx = coords[atom0 + i, 0] - coords[atom0 + j, 0]
                            dy = coords[atom0 + i, 1] - coords[atom0 + j, 1]
                            dz = coords[atom0 + i, 2] - coords[atom0 + j, 2]
                            weights_v[ent0 + fill[i]] = sqrt(dx * dx + dy * dy + dz * dz)
                        fill[i] += 1
                        i, j = j, i
            # each row sorted by column (rows are short: insertion sort)
            for k in range(kept):
                for p in range(ent0 + indptr_v[ptr0 + k] + 1, ent0 + indptr_v[ptr0 + k + 1]):
                    s = p
                    while s > ent0 + indptr_v[ptr0 + k] and indices_v[s - 1] > indices_v[s]:
                        indices_v[s - 1], indices_v[s] = indices_v[s], indices_v[s - 1]
                        order_v[s - 1], order_v[s] = order_v[s], order_v[s - 1]
                        if distance_weights:
                            weights_v[s - 1], weights_v[s] = weights_v[s], weights_v[s - 1]
                        s -= 1
            n_atoms_v[mol] = <int32_t>kept
            nnz_v[mol] = indptr_v[ptr0 + kept]
            atom0 += kept
            ptr0 += kept + 1
            ent0 += indptr_v[ptr0 - 1]
            mol += 1
            if r.pos >= r.n:
                break
    for big in (n_atoms_a, nnz_a, spans_a, element_a, charge_a, coords_a, indptr_a, indices_a, order_a, weights_a):
        big.flags.writeable = False  # the Graphs take views of these, which nobody can write
    arrays = {"n_atoms": n_atoms_a[:mol], "nnz": nnz_a[:mol], "spans": spans_a[:mol], "element": element_a[:atom0],
              "charge": charge_a[:atom0], "coords": coords_a[:atom0], "indptr": indptr_a[:ptr0],
              "indices": indices_a[:ent0], "bond_order": order_a[:ent0],
              "weights": weights_a[:ent0] if distance_weights else None, "lines": r.lineno}
    problem = None if kind == OK else (PROBLEMS[kind], r.lineno, mol + 1, k, counts_line, first_bond_line)
    return arrays, problem


# ---------------------------------------------------------------- the Graphs of the parsed molecules

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # the reference to ``descr`` is stolen
    object PyArray_NewFromDescr(PyTypeObject *subtype, void *descr, int nd, cnp.npy_intp *dims,
                                cnp.npy_intp *strides, void *data, int flags, PyObject *obj)

cdef tuple NO_ARGS = ()


cdef object cut(cnp.ndarray whole, Py_ssize_t start, Py_ssize_t rows):
    """``whole[start:start + rows]`` as slicing makes it: a view with ``whole``'s strides and
    read-only flag, whose base is the array that owns the memory."""
    cdef cnp.npy_intp dims[2]
    cdef void *descr = <void *>cnp.PyArray_DESCR(whole)
    dims[0] = rows
    if cnp.PyArray_NDIM(whole) == 2:
        dims[1] = cnp.PyArray_DIMS(whole)[1]
    Py_INCREF(<object>descr)
    cdef cnp.ndarray view = PyArray_NewFromDescr(Py_TYPE(whole), descr, cnp.PyArray_NDIM(whole), dims,
                                                 cnp.PyArray_STRIDES(whole),
                                                 cnp.PyArray_BYTES(whole) + start * cnp.PyArray_STRIDES(whole)[0],
                                                 cnp.PyArray_FLAGS(whole) & cnp.NPY_ARRAY_WRITEABLE, NULL)
    cnp.set_array_base(view, whole)  # numpy stores the owner of whole's memory
    return view


cdef object name_of(const unsigned char *text, Py_ssize_t s, Py_ssize_t e):
    """``text[s:e].decode().strip() or None``: ASCII stripped of the white space of ``str.strip``
    (that of ``is_space``) before it is decoded, other text decoded first."""
    cdef Py_ssize_t p
    for p in range(s, e):
        if text[p] >= 128:
            return PyUnicode_DecodeUTF8(<const char *>text + s, e - s, NULL).strip() or None
    while s < e and is_space(text[s]):
        s += 1
    while e > s and is_space(text[e - 1]):
        e -= 1
    return PyUnicode_DecodeASCII(<const char *>text + s, e - s, NULL) if e > s else None


cdef cnp.ndarray read_only(arrays, key):
    """The parser's array ``key``: C-contiguous and read-only, as every array it returns."""
    cdef cnp.ndarray arr = arrays[key]
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or cnp.PyArray_FLAGS(arr) & cnp.NPY_ARRAY_WRITEABLE:
        raise ValueError(f"the parser's array {key!r} is not a read-only C-contiguous array")
    return arr


def make_graphs(type graph_type, type columns_type, const unsigned char[::1] text, Py_ssize_t text_start, arrays,
                Py_ssize_t start, Py_ssize_t stop, Py_ssize_t atom0, Py_ssize_t entry0, list out):
    """Append to ``out`` the Graphs of molecules ``start`` to ``stop`` of the arrays ``parse_sdf``
    returned for ``text[text_start:]``, whose atoms and entries begin at ``atom0`` and ``entry0``;
    returns the molecule it stopped at: ``stop``, or the first of them with a coordinate that is
    not finite (for the caller's label check to refuse).

    Each is what ``graph_type._trusted(..., views=True)`` makes of the molecule's slices of the
    arrays (node labels ``element``, ``charge``, ``coords``; edge label ``bond_order``), read-only
    views with the arrays' dtypes, in one loop here rather than a Python call per molecule: the
    same fields, a cache marking it valid, label columns of ``columns_type`` holding the views as
    they are.  Its name is the header line, stripped; None if blank.
    """
    cdef const int32_t[::1] n_atoms = arrays["n_atoms"]
    cdef const int64_t[::1] nnz = arrays["nnz"]
    cdef const int64_t[:, ::1] spans = arrays["spans"]
    cdef const double[:, ::1] xyz = arrays["coords"]
    cdef cnp.ndarray element = read_only(arrays, "element"), charge = read_only(arrays, "charge")
    cdef cnp.ndarray coords = read_only(arrays, "coords"), indptr = read_only(arrays, "indptr")
    cdef cnp.ndarray indices = read_only(arrays, "indices"), order = read_only(arrays, "bond_order")
    cdef cnp.ndarray weights = None if arrays["weights"] is None else read_only(arrays, "weights")
    cdef newfunc new_graph = (<PyTypeObject *>graph_type).tp_new
    cdef newfunc new_columns = (<PyTypeObject *>columns_type).tp_new
    cdef Py_ssize_t m, k, n, entries, atoms = element.shape[0], stored = indices.shape[0]
    cdef const unsigned char *chars = &text[0] if text.shape[0] else NULL
    # the views are cut without numpy's bounds checks: the arrays must hold every molecule asked for
    if not (0 <= start <= stop <= n_atoms.shape[0] == nnz.shape[0] == spans.shape[0] and spans.shape[1] == 4
            and charge.shape[0] == coords.shape[0] == xyz.shape[0] == atoms and indptr.shape[0] == atoms + nnz.shape[0]
            and order.shape[0] == stored and (weights is None or weights.shape[0] == stored)
            and xyz.shape[1] == 3 and 0 <= atom0 and 0 <= entry0 and 0 <= text_start):
        raise ValueError(f"molecules {start} to {stop} do not fit the parser's arrays")
    for m in range(start, stop):
        n, entries = n_atoms[m], nnz[m]
        if not (0 <= n and 0 <= entries and atom0 + n <= atoms and entry0 + entries <= stored
                and 0 <= spans[m, 0] <= spans[m, 1] <= text.shape[0] - text_start):
            raise ValueError(f"molecule {m} does not fit the parser's arrays")
        for k in range(atom0, atom0 + n):
            if not (isfinite(xyz[k, 0]) and isfinite(xyz[k, 1]) and isfinite(xyz[k, 2])):
                return m
        cache = {"valid": True}
        graph = new_graph(graph_type, <PyObject *>NO_ARGS, NULL)
        graph.name = name_of(chars, text_start + spans[m, 0], text_start + spans[m, 1])
        graph._cache = cache
        graph._n = n
        graph._indptr = cut(indptr, atom0 + m, n + 1)  # each molecule has n_atoms + 1 pointers
        graph._indices = cut(indices, entry0, entries)
        graph._weights = None if weights is None else cut(weights, entry0, entries)
        nodes = new_columns(columns_type, <PyObject *>NO_ARGS, NULL)
        # stored as dict items: the columns need none of the checks of LabelColumns.__setitem__
        PyDict_SetItem(nodes, "element", cut(element, atom0, n))
        PyDict_SetItem(nodes, "charge", cut(charge, atom0, n))
        PyDict_SetItem(nodes, "coords", cut(coords, atom0, n))
        nodes._what, nodes._length, nodes._owner_cache = "node", n, cache
        edges = new_columns(columns_type, <PyObject *>NO_ARGS, NULL)
        PyDict_SetItem(edges, "bond_order", cut(order, entry0, entries))
        edges._what, edges._length, edges._owner_cache = "edge", entries, cache
        graph._node_labels, graph._edge_labels = nodes, edges
        out.append(graph)
        atom0 += n
        entry0 += entries
    return stop
