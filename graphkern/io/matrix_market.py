"""Matrix Market coordinate files (real, integer or pattern; symmetric or general) as graphs.

Files are parsed by fast_matrix_market (SciPy's, parallel); only when something
is wrong -- or the source is a stream that cannot be handed over -- are the lines read by
this module, to name the one at fault.  The size line is checked before anything is
allocated.  Explicit zeros are kept as stored entries (edges of weight 0) and diagonal
entries as self-loops.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os

import numpy as np
import scipy.io
import scipy.sparse as sp

from .._backend import resolve_threads
from .._cpu import validate as _compiled
from ..graph import Graph, as_csr_matrix, require_memory
from ._text import FileFormatError, load_table, open_text, read_bytes, source_name

__all__ = ["read_matrix_market", "write_matrix_market"]

_FIELDS = ("real", "integer", "pattern")
_SYMMETRIES = ("general", "symmetric")


def _is_entry(line):
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("%")


class _Header:
    """The banner and size line, and where the entries start (to read them again)."""

    def __init__(self, f, path):
        banner = f.readline()
        words = banner.split()
        if not words or words[0].lower() != "%%matrixmarket":
            raise FileFormatError(path, 1, f"not a Matrix Market file: the first line is {banner.strip()[:60]!r}, "
                                  "expected '%%MatrixMarket matrix coordinate <field> <symmetry>'")
        if len(words) != 5 or words[1].lower() != "matrix":
            raise FileFormatError(path, 1, "the banner must read '%%MatrixMarket matrix <format> <field> <symmetry>'")
        layout, self.field, self.symmetry = (w.lower() for w in words[2:])
        if layout != "coordinate":
            raise FileFormatError(path, 1, f"{layout!r} (dense) files are not supported: "
                                  "a graph needs 'coordinate'")
        if self.field not in _FIELDS:
            raise FileFormatError(path, 1, f"field {self.field!r} is not supported "
                                  f"(expected one of {', '.join(_FIELDS)})")
        if self.symmetry not in _SYMMETRIES:
            raise FileFormatError(path, 1, f"symmetry {self.symmetry!r} is not supported "
                                  "(expected general or symmetric)")
        line, lineno = f.readline(), 2
        while line and not _is_entry(line):
            line, lineno = f.readline(), lineno + 1
        if not line:
            raise FileFormatError(path, lineno - 1, "file ends before the size line 'rows columns entries'")
        self.size_line = lineno
        fields = line.split()
        try:
            n_rows, n_cols, self.nnz = (int(x) for x in fields)
        except ValueError:
            raise FileFormatError(path, lineno, f"expected the size line 'rows columns entries' "
                                  f"(three integers), found {line.strip()!r}") from None
        if min(n_rows, n_cols, self.nnz) < 0:
            raise FileFormatError(path, lineno, f"negative count on the size line {line.strip()!r}")
        if n_rows != n_cols:
            raise FileFormatError(path, lineno,
                                  f"the matrix is {n_rows} x {n_cols}; an adjacency matrix is square")
        if n_rows > np.iinfo(np.int32).max:
            raise FileFormatError(path, lineno, f"the matrix has {n_rows} rows; at most 2**31 - 1 are supported")
        try:  # row pointers, and each entry and its mirror as coordinates and a value
            require_memory(8 * (n_rows + 1) + 2 * 24 * self.nnz, "the matrix this size line announces")
        except MemoryError as err:
            raise FileFormatError(path, lineno, str(err)) from None
        self.n = n_rows
        self.n_columns = 2 if self.field == "pattern" else 3
        try:
            self.entries_at = f.tell()
        except (OSError, io.UnsupportedOperation):
            self.entries_at = None  # a pipe: errors found later cannot name their line


def _entry_lines(source, header):
    """The entry lines again, numbered, or nothing when the source cannot be re-read."""
    if header.entries_at is None:
        return
    with open_text(source) as f:
        f.seek(header.entries_at)
        lineno = header.size_line
        for line in iter(f.readline, ""):
            lineno += 1
            if _is_entry(line):
                yield lineno, line


def _raise_entry_problem(source, path, header):
    """Find and raise the first malformed entry line (count, fields, numbers, indices)."""
    count = 0
    lineno = header.size_line
    said = f"the size line, line {header.size_line}, says {header.nnz} entries"
    for lineno, line in _entry_lines(source, header):
        count += 1
        if count > header.nnz:
            raise FileFormatError(path, lineno, f"more entries than {said}")
        fields = line.split()
        if len(fields) != header.n_columns:
            raise FileFormatError(path, lineno, f"expected {header.n_columns} fields for a {header.field} matrix, "
                                  f"found {len(fields)}")
        for k, token in enumerate(fields, 1):
            try:
                value = int(token) if k <= 2 else float(token)
            except ValueError:
                kind = "an integer index" if k <= 2 else "a number"
                raise FileFormatError(path, lineno, f"field {k} ({token!r}) is not {kind}") from None
            if k <= 2 and not 1 <= value <= header.n:
                raise FileFormatError(path, lineno, f"index {value} is out of range 1..{header.n}")
            if k == 3 and not np.isfinite(value):
                raise FileFormatError(path, lineno, f"value {token!r} is not finite")
    if count < header.nnz:
        raise FileFormatError(path, lineno, f"the file ends after {count} entries, but {said}")


def _line_of_entry(source, header, k):
    return next(itertools.islice((lineno for lineno, _ in _entry_lines(source, header)), k, None), None)


def read_matrix_market(source, *, weighted=None, symmetrize=False, as_csr=False, name=None, n_threads=None):
    """Read a Matrix Market coordinate file as an undirected graph.

    Parameters
    ----------
    source : path or open text file
        A ``.mtx`` file (``.mtx.gz`` is decompressed).
    weighted : bool or None
        Keep the values as edge weights; ``None`` keeps them unless all are 1.
        ``pattern`` files are unweighted.
    symmetrize : bool
        For a ``general`` matrix that is not symmetric, add the missing mirror
        entries instead of raising.
    as_csr : bool
        Return the symmetric adjacency as a ``scipy.sparse.csr_matrix`` (ones if
        unweighted) instead of a :class:`~graphkern.Graph`.
    n_threads : int or None
        Threads checking, parsing and converting the entry lines; None means all cores.

    Raises
    ------
    FileFormatError
        Naming the file and line: a bad banner or size line, a non-numeric field, an
        index out of range, a repeated entry, fewer or more entries than announced,
        a negative weight.
    """
    path = source_name(source)
    with open_text(source) as f:
        header = _Header(f, path)
        clean = isinstance(source, (str, os.PathLike))
        A, all_ones = _read_clean(path, header, weighted, resolve_threads(n_threads)) if clean else (None, None)
        if A is None:
            A = _read_locating_errors(source, f, path, header, weighted)
            all_ones = bool(np.all(A.data == 1))
    if weighted is None:
        weighted = header.field != "pattern" and not all_ones
    if not weighted and not all_ones:
        A.data[:] = 1.0
    if header.symmetry != "symmetric":
        try:
            as_csr_matrix(A, name="the matrix")
        except ValueError:
            try:
                graph = Graph.from_scipy(A, weighted=weighted, symmetrize=symmetrize, name=name)
            except ValueError as err:
                raise FileFormatError(path, None, f"the 'general' matrix is not a symmetric adjacency: {err}") from None
            return graph.to_scipy() if as_csr else graph
    if as_csr:
        return A
    return Graph(A.indptr, A.indices, A.data if weighted else None, name=name, validate=False)


def _read_clean(path, header, weighted, n_threads):
    """``(A, all_ones)``: the CSR matrix of a well-formed file through the library's parser and
    whether every value is 1; ``(None, None)`` if anything is off (the caller then reads the lines
    itself to name the one at fault).  The library's coordinates become a CSR in one compiled
    parallel pass, which mirrors a symmetric file's entries while placing them and counts the
    diagonal and finds non-finite, negative and repeated entries (SciPy mirrors them in NumPy and
    converts on one thread, summing repeats)."""
    data, source = _file_bytes(path)
    # the library reads "3 1.5 1" as (3, 1, 0.5) and ignores extra fields: refuse such lines first
    bad = _compiled.first_bad_coordinate_line(data, header.n_columns, n_threads)
    del data
    if bad:
        return None, None
    try:
        rows, cols, values, shape, mirrored = _parse_coordinates(source, n_threads)
    except (ValueError, OSError, OverflowError):
        return None, None
    if shape != (header.n, header.n) or header.n >= 2**31:  # the compiled pass reads int32 coordinates
        return None, None
    symmetric = header.symmetry == "symmetric"
    if values.dtype not in (np.float64, np.int64):
        values = np.asarray(values, dtype=np.float64)
    got = _compiled.coordinates_to_csr(np.asarray(rows, np.int32), np.asarray(cols, np.int32), values, header.n,
                                       n_threads, symmetric and not mirrored)
    if got is None:
        return None, None
    indptr, indices, data, figures = got
    if figures["duplicate"] or figures["nonfinite"] or (weighted is not False and figures["negative"]):
        return None, None
    given = (len(rows) + figures["diagonal"]) // 2 if symmetric and mirrored else len(rows)
    if given != header.nnz:  # entries are missing
        return None, None
    # int32 row pointers where they fit, as SciPy chooses them
    A = sp.csr_matrix((data, indices, indptr.astype(np.int32) if len(data) < 2**31 else indptr),
                      shape=(header.n, header.n))
    A.has_sorted_indices = True
    return A, figures["not_one"] == 0


def _parse_coordinates(source, n_threads):
    """``(rows, cols, values, shape, mirrored)``: the entries of a coordinate file as
    fast_matrix_market parses them on ``n_threads`` threads, zero-based.  Through its SciPy module's
    cursor the stored entries come as they are; ``scipy.io.mmread``, used where that module's
    layout differs, adds the mirror of each off-diagonal entry of a symmetric file (``mirrored``)."""
    library = _library_reader()
    if library is None:
        M = scipy.io.mmread(source, spmatrix=True)
        return M.row, M.col, M.data, M.shape, True
    _get_read_cursor, _read_body_coo = library
    cursor, stream = _get_read_cursor(source, n_threads)
    try:
        if cursor.header.format != "coordinate":
            raise ValueError("not a coordinate file")
        (values, (rows, cols)), shape = _read_body_coo(cursor, generalize_symmetry=False)
    finally:
        if stream is not None:
            stream.close()
    return rows, cols, values, tuple(shape), False


def _library_reader():
    """fast_matrix_market's cursor and coordinate reader in SciPy, or None where its module differs."""
    try:
        from scipy.io._fast_matrix_market import _get_read_cursor, _read_body_coo
    except ImportError:
        return None
    return _get_read_cursor, _read_body_coo


def _file_bytes(path):
    """The bytes of the file ``path`` as an array, and what scipy.io.mmread should read: an
    uncompressed file ending in a newline is mapped (no copy) and read again by the library from
    its path; otherwise its bytes (``.gz`` decompressed) with a final newline added, the library
    reading those (it can crash on a last line without its newline)."""
    if not os.fspath(path).endswith(".gz") and os.path.getsize(path):
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        if mapped[-1] == 10:
            return mapped, os.fspath(path)
        del mapped
    raw = read_bytes(path)
    if not raw.endswith(b"\n"):
        raw += b"\n"
    return np.frombuffer(raw, dtype=np.uint8), io.BytesIO(raw)


def _read_locating_errors(source, f, path, header, weighted):
    """Parse the entries with this module's own pass; raise naming the line of any problem."""
    try:
        table = load_table(f, dtype=np.float64, comments="%")
    except ValueError:
        table = None
    if table is None or not _entries_ok(table, header):
        _raise_entry_problem(source, path, header)
        raise FileFormatError(path, None, "the entries are malformed (the source cannot be read again to say where)")
    table = table.reshape(header.nnz, header.n_columns)
    index = table[:, :2].astype(np.int64)
    rows, cols = index[:, 0] - 1, index[:, 1] - 1
    values = table[:, 2] if header.n_columns == 3 else np.ones(header.nnz)
    if np.any(values < 0) and weighted is not False:
        k = int(np.flatnonzero(values < 0)[0])
        raise FileFormatError(path, _line_of_entry(source, header, k),
                              f"negative value {values[k]:g}: edge weights must be non-negative "
                              "(pass weighted=False to ignore the values)")
    symmetric = header.symmetry == "symmetric"
    n_given = len(rows)
    if symmetric:
        off = rows != cols
        rows, cols, values = (np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]]),
                              np.concatenate([values, values[off]]))
    # the conversion sums repeated entries, so a shortfall in stored entries reveals a repeat
    A = sp.csr_matrix((values, (rows, cols)), shape=(header.n, header.n))
    if A.nnz != len(rows):
        k = _first_repeat(rows[:n_given], cols[:n_given], header.n, symmetric)
        raise FileFormatError(path, _line_of_entry(source, header, k),
                              f"entry ({rows[k] + 1}, {cols[k] + 1}) is given twice"
                              + (" (counting its mirror, as the matrix is symmetric)" if symmetric else ""))
    A.sort_indices()
    return A


def _first_repeat(rows, cols, n, symmetric):
    """The position of the first entry that repeats an earlier one."""
    key = np.minimum(rows, cols) * n + np.maximum(rows, cols) if symmetric else rows * n + cols
    order = np.argsort(key, kind="stable")
    repeats = np.flatnonzero(key[order][1:] == key[order][:-1])
    return int(order[repeats[0] + 1])


def _entries_ok(table, header):
    if table.size == 0:
        return header.nnz == 0
    index = table[:, :2]
    return (table.shape == (header.nnz, header.n_columns) and bool(np.all(np.isfinite(table)))
            and index.min() >= 1 and index.max() <= header.n and np.array_equal(index, np.round(index)))


def write_matrix_market(target, graph, *, comment=None):
    """Write a graph (or symmetric scipy.sparse matrix) as a symmetric coordinate file.

    Unweighted graphs are written as ``pattern``, weighted ones as ``real`` with 17
    significant digits, so that :func:`read_matrix_market` gives the same graph back.
    """
    if isinstance(graph, Graph):
        edges, positions = graph.edge_list()
        values = None if graph.weights is None else graph.weights[positions]
        n = graph.n_nodes
    else:
        A = sp.coo_matrix(graph)
        n = A.shape[0]
        upper = A.row <= A.col
        edges = np.stack([A.row[upper], A.col[upper]], axis=1).astype(np.int64)
        values = A.data[upper].astype(np.float64)
    field = "pattern" if values is None else "real"
    # the format stores the lower triangle: row >= column
    table = np.column_stack([edges[:, 1] + 1, edges[:, 0] + 1] + ([] if values is None else [values]))
    lines = [f"%%MatrixMarket matrix coordinate {field} symmetric"]
    lines += [f"% {text}" for text in (comment or "").splitlines()]
    lines.append(f"{n} {n} {len(edges)}")
    fmt = "%d %d" if values is None else "%d %d %.17g"
    path = isinstance(target, (str, os.PathLike))
    with open(target, "w", encoding="utf-8") if path else contextlib.nullcontext(target) as f:
        f.write("\n".join(lines) + "\n")
        np.savetxt(f, table, fmt=fmt)
