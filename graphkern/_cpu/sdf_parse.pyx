# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""V2000 SD files parsed in one compiled pass over the file's bytes into flat per-molecule arrays
(``graphkern.io.sdf`` documents the checks).  Lines end in ``\\n``, ``\\r\\n`` or ``\\r``, as
Python's universal newlines do; the first problem stops the parse, the molecules before it complete.
"""

import numpy as np

from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport strtod
from libc.string cimport memcmp

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
    int64_t lineno


cdef inline bint next_line(Reader *r) noexcept nogil:
    """Advance to the next line; False at the end of the buffer."""
    cdef Py_ssize_t p = r.pos
    if p >= r.n:
        return False
    r.start = p
    while p < r.n and r.buf[p] != 10 and r.buf[p] != 13:
        p += 1
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
    cdef char text[32]
    field(r, a, b, &s, &e)
    if e - s == 0 or e - s > 30:
        return False
    p = s + (1 if r.buf[s] == 43 or r.buf[s] == 45 else 0)
    if is_word(r.buf + p, e - p, b"inf") or is_word(r.buf + p, e - p, b"infinity") or \
            is_word(r.buf + p, e - p, b"nan"):
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
        out[0] = (-1.0 if r.buf[s] == 45 else 1.0) * (<double>mantissa / POWERS_OF_TEN[fraction])
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


cdef int element_of(Reader *r, const int64_t *keys, const int64_t *values, int n_keys) noexcept nogil:
    """The atomic number of the symbol in columns 32-34, or -1."""
    cdef Py_ssize_t s, e, p
    cdef int64_t key = 0
    cdef int lo = 0, hi = n_keys, mid
    field(r, 31, 34, &s, &e)
    for p in range(s, s + 3):
        key = key * 256 + (r.buf[p] if p < e else 0)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return <int>values[lo] if lo < n_keys and keys[lo] == key else -1


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
    cdef Py_ssize_t p
    for p in range(n):
        if buf[p] == 10 or buf[p] == 13:
            lines += 1
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
    cdef int32_t fill[1001]
    cdef Reader r
    r.buf = &buf[0] if n else NULL
    r.n, r.pos, r.lineno = n, 0, 0
    cdef int kind = OK, n_keys = symbol_keys.shape[0], k, j, i, q, nonblank
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
                i = element_of(&r, &symbol_keys[0], &symbol_values[0], n_keys)
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
                for j in range(k):
                    if bond_a[j] == bond_a[k] and bond_b[j] == bond_b[k]:
                        kind = BOND_REPEAT
                        break
                if kind != OK:
                    break
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
