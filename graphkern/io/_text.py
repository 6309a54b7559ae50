"""Shared plumbing of the readers: opening files, line numbers in errors, numeric tables.

Every reader raises :class:`FileFormatError`, which names the file and, where one
line is to blame, its 1-based line number.  Numeric tables take a fast path through
``numpy.loadtxt``; only when that fails are the lines walked one by one, to say
which line is wrong and why.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import warnings
import zlib

import numpy as np

__all__ = ["FileFormatError", "open_text", "read_bytes", "read_numeric_table", "data_line_number", "load_table"]


class FileFormatError(ValueError):
    """A file does not follow its format.

    ``path`` is the file's name, ``line`` the 1-based line to blame (``None`` when
    the whole file is at fault) and ``reason`` the message without the location.
    """

    def __init__(self, path, line, reason):
        self.path = str(path)
        self.line = line
        self.reason = str(reason)
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {self.reason}")

    def __reduce__(self):
        return (FileFormatError, (self.path, self.line, self.reason))


def source_name(source):
    """The name errors use for ``source``: the path, or a file object's ``name`` (a pipe or other
    descriptor opened without a path is named by its descriptor number, said as such)."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    if isinstance(name, int):
        return f"<file descriptor {name}>"
    return "<stream>" if name is None else str(name)


@contextlib.contextmanager
def _named_errors(path):
    """Turn the decoding and decompression errors of reading ``path`` into one FileFormatError."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise FileFormatError(path, None, f"is not UTF-8 text (a binary or UTF-16 file?): byte "
                              f"{err.object[err.start:err.start + 1]!r} at offset {err.start} of a chunk") from None
    except gzip.BadGzipFile:
        raise FileFormatError(path, None, "its name ends in .gz but it is not gzip-compressed") from None
    except (EOFError, zlib.error) as err:
        raise FileFormatError(path, None, f"the gzip stream is damaged or cut short ({err})") from None


@contextlib.contextmanager
def open_text(source):
    """Yield a text file for ``source``: a path (``.gz`` is decompressed) or an open file.

    An open file is left open; a binary one is wrapped as UTF-8 text.  Undecodable bytes and
    damaged gzip data raise :class:`FileFormatError` naming the file.
    """
    path = source_name(source)
    if isinstance(source, (str, os.PathLike)):
        opener = gzip.open if path.endswith(".gz") else open
        with _named_errors(path), opener(path, "rt", encoding="utf-8", newline=None) as f:
            yield f
    elif isinstance(source, io.TextIOBase):
        with _named_errors(path):
            yield source
    elif hasattr(source, "read"):
        text = io.TextIOWrapper(source, encoding="utf-8")
        try:
            with _named_errors(path):
                yield text
        finally:
            text.detach()  # a collected wrapper would close the caller's binary file
    else:
        raise TypeError(f"expected a path or an open file, got {type(source).__name__}")


def read_bytes(path):
    """The bytes of the file ``path`` (``.gz`` decompressed), errors naming the file."""
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with _named_errors(path), opener(path, "rb") as f:
        return f.read()


def data_line_number(path, row):
    """The 1-based line of data row ``row`` (0-based; blank lines skipped)."""
    with open_text(path) as f:
        k = -1
        for lineno, line in enumerate(f, 1):
            if line.strip():
                k += 1
                if k == row:
                    return lineno
    return None


def load_table(f, **options):
    """``numpy.loadtxt(f, ndmin=2, **options)``, without its warning on a file of no rows (a valid table)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
        return np.loadtxt(f, ndmin=2, **options)


def _locate_table_error(path, *, integer, n_columns):
    """Walk the lines of a table that numpy refused; raise the first problem found."""
    kind = "an integer" if integer else "a number"
    parse = int if integer else float
    first_width = None
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            fields = [t.strip() for t in line.split(",")]
            for k, token in enumerate(fields, 1):
                try:
                    parse(token)
                except ValueError:
                    raise FileFormatError(path, lineno, f"field {k} ({token!r}) is not {kind}") from None
            expected = n_columns if n_columns is not None else first_width
            if expected is not None and len(fields) != expected:
                raise FileFormatError(path, lineno, f"expected {expected} fields, found {len(fields)}")
            first_width = len(fields)


def read_numeric_table(path, *, integer=None, n_columns=None):
    """Read a comma-separated text table of numbers, one row a line, into a 2-D array.

    ``integer=True`` demands integers (int64), ``False`` reads float64 and ``None``
    gives int64 when every field is an integer and float64 otherwise.  Blank lines
    are skipped.  An empty file gives shape ``(0, n_columns or 0)``.
    """
    dtypes = {True: [np.int64], False: [np.float64], None: [np.int64, np.float64]}[integer]
    table = None
    for dtype in dtypes:
        try:
            with open_text(path) as f:
                table = load_table(f, dtype=dtype, delimiter=",", comments=None)
            break
        except ValueError as err:
            failure = err
    if table is None:
        _locate_table_error(path, integer=bool(integer), n_columns=n_columns)
        raise FileFormatError(path, None, str(failure))
    if table.size == 0:
        return table.reshape(0, n_columns or table.shape[1])
    if n_columns is not None and table.shape[1] != n_columns:
        _locate_table_error(path, integer=bool(integer), n_columns=n_columns)
    if table.dtype.kind == "f" and not np.all(np.isfinite(table)):
        row = int(np.flatnonzero(~np.all(np.isfinite(table), axis=1))[0])
        raise FileFormatError(path, data_line_number(path, row), "value is NaN or infinite")
    return table
