"""Edge lists as SNAP, KONECT and networkx write them: one edge a line, ``u v`` or ``u v w``.

Lines that start with a comment character (``#`` and ``%`` by default) and blank lines are
skipped; fields are separated by whitespace (or ``delimiter``); the vertex ids are non-negative
integers.  The list is read as an undirected graph: an edge given in both directions, or more than
once, is one edge (the repeats of a weighted edge must carry its weight).  Lines of two or three
unsigned integers are parsed in compiled code on every core (graphkern/_cpu/validate.pyx); a file
with other lines goes to ``numpy.loadtxt``, and one numpy refuses is walked line by line, to name
the line at fault.
"""

from __future__ import annotations

import io
import os

import numpy as np

from .._backend import resolve_threads
from .._cpu import validate as _compiled
from ..graph import Graph
from ._text import FileFormatError, _named_errors, load_table, open_text, read_bytes, source_name

__all__ = ["read_edgelist"]

_INT32_MAX = 2**31 - 1


def read_edgelist(source, *, weighted=None, renumber=False, comments="#%", delimiter=None, name=None,
                  n_threads=None):
    """Read an edge list as an undirected :class:`~graphkern.Graph`.

    Parameters
    ----------
    source : path or open text file
        One edge a line: two vertex ids, then optionally a weight (further fields, such as
        KONECT's timestamps, are not read).  ``.gz`` is decompressed.
    weighted : bool or None
        Keep the third field as the edge weight; ``None`` keeps it where the lines have one and
        not every weight is 1.
    renumber : bool
        Number the vertices 0..k-1 in the order of their ids, the ids kept as the node label
        ``id``; by default vertex ``i`` is id ``i`` and the graph has ``max id + 1`` vertices (an
        id no line names is an isolated vertex).
    comments : str
        The characters that start a comment line.
    delimiter : str or None
        The field separator; None means runs of whitespace.
    n_threads : int or None
        Threads parsing the lines and placing the edges; None means all cores.

    Raises
    ------
    FileFormatError
        Naming the file and line: a field that is not a number, fewer than two fields, a vertex id
        that is negative or not whole, a repeated edge with another weight, a bad weight.
    """
    path = source_name(source)
    n_threads = resolve_threads(n_threads)
    text = _Text(source)
    table = _table(text, path, comments, delimiter, n_threads)
    if table.shape[1] < 2:
        raise FileFormatError(path, _line_of_row(text, comments, 0), "an edge needs two vertex ids")
    ends = table[:, :2]
    if ends.dtype != np.int64:
        whole = (ends >= 0) & (ends == np.floor(ends)) & (ends <= 2**53)
    else:
        whole = ends >= 0
    bad = np.flatnonzero(~np.all(whole, axis=1))
    if bad.size:
        row = int(bad[0])
        raise FileFormatError(path, _line_of_row(text, comments, row),
                              f"vertex ids must be non-negative whole numbers, got {ends[row, 0]} {ends[row, 1]}")
    ends = ends.astype(np.int64, copy=False)
    weights = table[:, 2].astype(np.float64) if table.shape[1] > 2 else None
    if weighted is None:
        weighted = weights is not None and not np.all(weights == 1.0)
    elif weighted and weights is None:
        raise FileFormatError(path, None, "weighted=True but the lines have no third field (the weight)")
    ids = None
    if renumber:
        ids, local = np.unique(ends, return_inverse=True)
        ends, n = local.reshape(ends.shape), len(ids)
    else:
        n = int(ends.max()) + 1 if len(ends) else 0
    if n > _INT32_MAX:
        raise FileFormatError(path, None, f"a vertex id reaches {n - 1}; at most {_INT32_MAX} vertices are supported "
                              "(renumber=True numbers the ids that occur)")
    lo, hi = ends.min(axis=1).astype(np.int32), ends.max(axis=1).astype(np.int32)
    values = weights if weighted else np.ones(len(lo))
    # each edge and its mirror placed in one compiled pass (every row sorted where the list has no repeat)
    indptr, indices, data, figures = _compiled.coordinates_to_csr(lo, hi, values, n, n_threads, True)
    if figures["duplicate"]:
        indptr, indices, data = _merge_repeats(text, path, comments, indptr, indices, data, lo, hi)
    try:
        return Graph(indptr, indices, data if weighted else None, name=name,
                     node_labels=None if ids is None else {"id": ids})
    except ValueError as err:
        raise FileFormatError(path, None, str(err)) from None


def _merge_repeats(text, path, comments, indptr, indices, data, lo, hi):
    """The CSR without its repeated entries (an edge listed twice, or in both directions), whose
    weights must agree (the compiled placement leaves rows with repeats unsorted: sorted here)."""
    n = len(indptr) - 1
    key = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr)) * n + indices
    order = np.argsort(key, kind="stable")
    key, data = key[order], data[order]
    again = np.flatnonzero(key[1:] == key[:-1]) + 1
    differs = again[data[again] != data[again - 1]]
    if differs.size:
        i, j = sorted(divmod(int(key[differs[0]]), n))
        lines = [_line_of_row(text, comments, int(k)) for k in np.flatnonzero((lo == i) & (hi == j))[:2]]
        raise FileFormatError(path, lines[1], f"the edge ({i}, {j}) of line {lines[0]} again, with another weight")
    keep = np.ones(len(key), bool)
    keep[again] = False
    key, data = key[keep], data[keep]
    counts = np.bincount(key // max(n, 1), minlength=n)
    return np.concatenate([[0], np.cumsum(counts)]), (key % max(n, 1)).astype(np.int32), data


class _Text:
    """The lines of ``source`` for numpy (a path goes to numpy as it is: it reads a file several
    times faster than a string) and, read when first asked for, as text (:meth:`text`)."""

    def __init__(self, source):
        self.source, self._text = source, None
        if not isinstance(source, (str, os.PathLike)):
            self.text()

    def text(self):
        if self._text is None:
            with open_text(self.source) as f:
                self._text = f.read()
        return self._text

    def for_numpy(self):
        return io.StringIO(self._text) if self._text is not None else os.fspath(self.source)

    def bytes(self):
        """The file's bytes as a uint8 array (mapped where it is a plain file)."""
        if self._text is not None:
            return np.frombuffer(self._text.encode(), np.uint8)
        path = os.fspath(self.source)
        if not path.endswith(".gz") and os.path.getsize(path):
            return np.memmap(path, dtype=np.uint8, mode="r")
        return np.frombuffer(read_bytes(path), np.uint8)

    def head(self):
        """The first character that is not whitespace (in the first 4096)."""
        with open_text(io.StringIO(self._text) if self._text is not None else self.source) as f:
            return f.read(4096).lstrip()[:1]


def _table(text, path, comments, delimiter, n_threads):
    """The numeric fields of the data lines (``text``, a :class:`_Text`) as a table: int64 where
    every field is an integer, else float64.  The common file -- two or three unsigned integers a
    line, blank-separated, comment lines -- is parsed in compiled code on ``n_threads`` threads;
    other files by numpy, which reads one comment character fast (the one the file starts with, else
    the first of ``comments``), several slowly; a file numpy refuses is walked to name the line."""
    if delimiter is None and comments.isascii():
        with _named_errors(path):
            table = _compiled.parse_edge_lines(text.bytes(), np.frombuffer(comments.encode(), np.uint8), n_threads)
        if table is not None:
            return table
    head = text.head()
    mark = head if head and head in comments else (comments[:1] or None)
    attempts = [(np.int64, mark), (np.float64, mark)]
    if len(comments) > 1:
        attempts.append((np.float64, list(comments)))
    for dtype, marks in attempts:
        try:
            with _named_errors(path):
                table = load_table(text.for_numpy(), dtype=dtype, delimiter=delimiter, comments=marks)
        except FileFormatError:
            raise
        except ValueError:
            continue
        if table.size == 0:
            return np.zeros((0, 2), np.int64)
        if np.all(np.isfinite(table)):
            return table
        break
    width = None
    for lineno, line in _data_lines(text.text(), comments):
        fields = line.split(delimiter)
        for k, token in enumerate(fields, 1):
            try:
                value = float(token)
            except ValueError:
                raise FileFormatError(path, lineno, f"field {k} ({token.strip()!r}) is not a number") from None
            if not np.isfinite(value):
                raise FileFormatError(path, lineno, f"field {k} ({token.strip()!r}) is not finite")
        if width is not None and len(fields) != width:
            raise FileFormatError(path, lineno, f"expected {width} fields as on the lines before, found {len(fields)}")
        width = len(fields)
    raise FileFormatError(path, None, "numpy.loadtxt cannot read the lines")


def _data_lines(text, comments):
    """``[(line number, line)]`` of the lines that are neither blank nor comments."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and stripped[0] not in comments:
            out.append((lineno, stripped))
    return out


def _line_of_row(text, comments, row):
    lines = _data_lines(text.text(), comments)
    return lines[row][0] if row < len(lines) else None
