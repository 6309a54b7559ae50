"""SD files (MDL molfile V2000, many molecules separated by ``$$$$``), parsed in compiled code.

Each molecule becomes a :class:`~graphkern.Graph` named after its header line, with
node labels ``element`` (atomic number, int64), ``charge`` (formal charge, int64) and
``coords`` (float64, shape ``(n, 3)``), and the edge label ``bond_order`` (the MDL
bond type: 1, 2, 3, 4 = aromatic, 5-8 the query types).  ``M  CHG`` lines, where a
molecule has any, replace the atom block's charges of every atom, as the format
prescribes.  V3000 molfiles are refused with a message saying so.

The file's bytes are parsed in one pass by ``graphkern._cpu.sdf_parse`` into flat arrays (the
graphs' CSR already sorted and checked), and the Graphs, made there too, are read-only views into
them; the whole file is held in memory while it is parsed.  Numeric fields are ASCII decimals (a
sign, digits, a point, an exponent; ``nan``/``inf`` for coordinates), as the format prescribes:
Python's other spellings (``1_000``, non-ASCII digits) are refused.  A problem stops the parse;
the line it names is read again here only to word the message.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._arrays import LabelColumns
from .._backend import resolve_threads
from .._cpu import sdf_parse
from ..graph import ATOMIC_NUMBER, Graph
from ._text import FileFormatError, _named_errors, read_bytes, source_name

__all__ = ["iter_sdf", "read_sdf"]

_LINE_END = re.compile(r"\r\n|\r|\n")
_SPACE = "[ \t\n\r\x0b\x0c\x1c-\x1f]*"  # the white space the parser strips from a field
_INTEGER = re.compile(f"{_SPACE}([+-]?[0-9]+){_SPACE}")
# element symbols as the parser looks them up: up to three bytes packed into one sorted key
_SYMBOL_KEYS = sorted((int.from_bytes(sym.encode().ljust(3, b"\0"), "big"), z) for sym, z in ATOMIC_NUMBER.items())
_KEYS = np.array([k for k, _ in _SYMBOL_KEYS], dtype=np.int64)
_NUMBERS = np.array([z for _, z in _SYMBOL_KEYS], dtype=np.int64)
# a file is cut into pieces of at least this many bytes for the threads, about this many a thread
# where it is large enough: the graphs of the first pieces are made while the threads parse the rest
_PIECE_BYTES = 1 << 22
_PIECES_PER_THREAD = 4
# iter_sdf makes the graphs of this many molecules at a time
_BATCH = 4096
_V3000 = "V3000 molfiles are not supported; convert the file to V2000 (RDKit and Open Babel can)"


def iter_sdf(source, *, hydrogens=True, distance_weights=False, properties=False, n_threads=None):
    """Yield the molecules of an SD file as graphs.

    Parameters
    ----------
    source : path or open file
        A ``.sdf``/``.mol`` file; a path ending in ``.gz`` is decompressed.
    hydrogens : bool
        Keep hydrogen atoms (including ``D`` and ``T``) as nodes; ``False`` drops them
        and their bonds.
    distance_weights : bool
        Weigh each bond by the Euclidean distance between its atoms.
    properties : bool
        Yield ``(graph, dict)`` pairs whose dict holds the molecule's data items
        (``> <NAME>`` blocks) as strings.
    n_threads : int or None
        Threads parsing pieces of a large file (cut after ``$$$$`` lines); None means all cores.

    Raises
    ------
    FileFormatError
        Naming the file and line: a block cut short, counts that disagree with the
        atom or bond lines, an unknown element, a field that is not a number, a bond
        to a missing atom.  The molecules before the faulty one are yielded first.
    """
    path = source_name(source)
    data = _read(source, path)
    pieces, problem = _pieces(data, bool(hydrogens), bool(distance_weights), resolve_threads(n_threads)), None
    for offset, arrays, problem in pieces:
        spans = arrays["spans"].tolist() if properties else None
        done = 0
        for graphs in _graphs(data, offset, arrays):
            if properties:
                for k, graph in enumerate(graphs, done):
                    yield graph, _data_items(data[offset + spans[k][2]:offset + spans[k][3]].decode())
                done += len(graphs)
            else:
                yield from graphs
    if problem is not None:
        raise _error(path, data, *problem)


def read_sdf(source, **options):
    """All molecules of an SD file as a list; the options are those of :func:`iter_sdf`.

    The garbage collector is paused while the graphs are made: they hold no reference cycles,
    and tens of thousands of new objects would set off collections that each walk every object
    the process holds (the graphs of earlier reads among them), several times the cost of the
    reading itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return list(iter_sdf(source, **options))
    finally:
        if enabled:
            gc.enable()


def _read(source, path):
    """The bytes of ``source`` (a path, ``.gz`` decompressed, or an open file), checked to be UTF-8."""
    if isinstance(source, (str, os.PathLike)):
        data = read_bytes(path)
    elif isinstance(source, io.TextIOBase):
        data = source.read().encode("utf-8", "surrogatepass")
    elif hasattr(source, "read"):
        data = source.read()
    else:
        raise TypeError(f"expected a path or an open file, got {type(source).__name__}")
    if not data.isascii():
        with _named_errors(path):
            data.decode("utf-8")
    return data


def _pieces(data, hydrogens, distance_weights, threads):
    """Parse ``data`` in pieces cut after ``$$$$`` lines on ``threads`` threads (the parser runs
    without the GIL), yielding ``(offset, arrays, problem)`` for each piece in turn as soon as it
    is parsed: where in ``data`` it starts (its byte spans count from there), its arrays, and None
    or, for the last piece yielded, the problem that stopped the parse, its line and molecule
    counted in the whole file.  The caller makes a piece's graphs while the threads parse the
    pieces after it.

    A piece parsed without a problem ended on a molecule's last line, so the next one starts a
    molecule; from the first piece with a problem (maybe cut inside a molecule) on, one thread parses.
    """
    view, cuts = memoryview(data), [0]
    step = max(_PIECE_BYTES, len(data) // (_PIECES_PER_THREAD * threads) + 1)
    while threads > 1 and cuts[-1] + step < len(data):
        at = data.find(b"\n$$$$", cuts[-1] + step)
        end = data.find(b"\n", at + 1) if at >= 0 else -1
        if end < 0:
            break
        cuts.append(end + 1)
    cuts.append(len(data))

    def parse(k, stop):
        return sdf_parse.parse_sdf(view[cuts[k]:stop], _KEYS, _NUMBERS, hydrogens, distance_weights)

    if len(cuts) == 2:
        yield (0, *parse(0, len(data)))
        return
    lines = molecules = 0  # in the pieces yielded
    pool = ThreadPoolExecutor(min(threads, len(cuts) - 1))
    try:
        parsing = [pool.submit(parse, k, cuts[k + 1]) for k in range(len(cuts) - 1)]
        for k, piece in enumerate(parsing):
            arrays, problem = piece.result()
            if problem is not None and k < len(parsing) - 1:
                pool.shutdown(wait=False, cancel_futures=True)
                arrays, problem = parse(k, len(data))
            if problem is not None:
                kind, lineno, index, at, counts_line, first_bond_line = problem
                problem = kind, lineno + lines, index + molecules, at, counts_line + lines, first_bond_line + lines
            yield cuts[k], arrays, problem
            if problem is not None:
                return
            lines += arrays["lines"]
            molecules += len(arrays["n_atoms"])
    finally:  # also when the caller stops early: the pieces not begun are dropped
        pool.shutdown(wait=True, cancel_futures=True)


def _graphs(data, offset, arrays):
    """The Graphs of one piece's molecules (parsed from ``data[offset:]``), in lists of up to
    ``_BATCH``: read-only views into the parser's arrays, valid by construction, named after their
    header lines, made in compiled code (``sdf_parse.make_graphs``).  A molecule with a coordinate
    that is not finite goes through the label check, which names it."""
    count = len(arrays["n_atoms"])
    # where each molecule's atoms and stored entries begin
    atoms = np.concatenate([[0], np.cumsum(arrays["n_atoms"], dtype=np.int64)]).tolist()
    entries = np.concatenate([[0], np.cumsum(arrays["nnz"], dtype=np.int64)]).tolist()
    start = 0
    while start < count:
        graphs, stop = [], min(start + _BATCH, count)
        start = sdf_parse.make_graphs(Graph, LabelColumns, data, offset, arrays, start, stop, atoms[start],
                                      entries[start], graphs)
        if graphs:
            yield graphs
        if start < stop:
            yield [_checked_graph(data, offset, arrays, start, atoms[start:start + 2], entries[start:start + 2])]
            start += 1


def _checked_graph(data, offset, arrays, m, atoms, entries):
    """Molecule ``m``'s Graph (atoms ``atoms[0]`` to ``atoms[1]``, stored entries ``entries[0]`` to
    ``entries[1]``) as ``make_graphs`` makes it, its coordinates set through the label check (which
    refuses a value that is not finite)."""
    (a0, a1), (e0, e1), weights = atoms, entries, arrays["weights"]
    graph = Graph._trusted(arrays["indptr"][a0 + m:a1 + m + 1], arrays["indices"][e0:e1],
                           None if weights is None else weights[e0:e1],
                           [("element", arrays["element"][a0:a1]), ("charge", arrays["charge"][a0:a1])],
                           [("bond_order", arrays["bond_order"][e0:e1])], views=True)
    graph.node_labels["coords"] = arrays["coords"][a0:a1]
    span = arrays["spans"][m].tolist()
    graph.name = data[offset + span[0]:offset + span[1]].decode().strip() or None
    return graph


def _data_items(text):
    """The ``> <NAME>`` data items of the lines after ``M  END``, as {name: value}."""
    data = {}
    lines = iter(_LINE_END.split(text))
    for line in lines:
        if line.startswith(">"):
            found = re.search(r"<([^>]*)>", line)
            name = found.group(1) if found else line[1:].strip()
            data[name] = "\n".join(itertools.takewhile(str.strip, lines))  # the value ends at a blank line
    return data


def _error(path, data, kind, lineno, index, k, counts_line, first_bond_line):
    """The FileFormatError for problem ``kind`` that the parser found on line ``lineno``."""
    lines = _LINE_END.split(data.decode())
    line = lines[lineno - 1] if lineno >= 1 else ""
    counts = lines[counts_line - 1] if counts_line >= 1 else ""
    said = f"the counts line, line {counts_line}, says {_int(counts[0:3])} atoms and {_int(counts[3:6])} bonds"

    def number(text, what):
        return f"{what} is not a number: {text.strip()!r}"

    def bond(line):
        return _int(line[0:3]), _int(line[3:6]), _int(line[6:9])

    if kind.startswith("chg"):  # the count of 'M  CHG' does not match its fields, or one is not a number
        fields = line[6:].split()
        count = _int(fields[0] if fields else "")
        if count is None:
            return FileFormatError(path, lineno, number(fields[0] if fields else "", "the entry count of 'M  CHG'"))
        if len(fields) != 1 + 2 * count:
            reason = f"'M  CHG' announces {count} atom-charge pairs but holds {(len(fields) - 1) / 2:g}"
            return FileFormatError(path, lineno, reason)
        for atom_text, charge_text in zip(fields[1::2], fields[2::2]):
            atom = _int(atom_text)
            if atom is None:
                return FileFormatError(path, lineno, number(atom_text, "an atom number of 'M  CHG'"))
            if not 1 <= atom <= _int(counts[0:3]):
                return FileFormatError(path, lineno, f"'M  CHG' names atom {atom}, but molecule {index} has "
                                                     f"{_int(counts[0:3])} atoms")
            if _int(charge_text) is None:
                return FileFormatError(path, lineno, number(charge_text, f"the charge of atom {atom} in 'M  CHG'"))
    a, b, order = bond(line)
    if kind == "bond_repeat":  # a repeated bond: name the line of its first mention
        pair = {a, b}
        first = next(n for n in range(first_bond_line, lineno) if set(bond(lines[n - 1])[:2]) == pair)
    reasons = {
        "header_eof": lambda: f"file ends inside the header block of molecule {index}",
        "no_counts": lambda: f"molecule {index} has no counts line (expected after its three header lines)",
        "atom_count": lambda: number(line[0:3], "the atom count (columns 1-3 of the counts line)"),
        "bond_count": lambda: number(line[3:6], "the bond count (columns 4-6 of the counts line)"),
        "negative": lambda: f"negative count on the counts line of molecule {index}: {a} atoms, {b} bonds",
        "v3000": lambda: _V3000,
        "version": lambda: f"unknown molfile version {line[34:39].strip().upper()!r} on the counts line "
                           "(expected V2000)",
        "atom_eof": lambda: f"file ends inside the atom block of molecule {index} ({k} atoms read; {said})",
        "atom_line": lambda: f"expected atom {k + 1} of molecule {index} ({said}), found {line!r}",
        "coord_x": lambda: number(line[0:10], f"atom {k + 1}: the x coordinate"),
        "coord_y": lambda: number(line[10:20], f"atom {k + 1}: the y coordinate"),
        "coord_z": lambda: number(line[20:30], f"atom {k + 1}: the z coordinate"),
        "element": lambda: f"atom {k + 1}: unknown element {line[31:34].strip()!r}",
        "charge_nan": lambda: number(line[36:39], f"atom {k + 1}: the charge code (columns 37-39)"),
        "charge_code": lambda: f"atom {k + 1}: unknown charge code {_int(line[36:39])} (expected 0-7)",
        "bond_eof": lambda: f"file ends inside the bond block of molecule {index} ({k} bonds read; {said})",
        "bond_repeat": lambda: f"bond {k + 1} repeats the bond between atoms {a} and {b} of line {first}",
        "bond_line": lambda: f"expected bond {k + 1} of molecule {index} ({said}), found {line!r}",
        "bond_atom_a": lambda: f"bond {k + 1} names atom {a}, but molecule {index} has {_int(counts[0:3])} atoms",
        "bond_atom_b": lambda: f"bond {k + 1} names atom {b}, but molecule {index} has {_int(counts[0:3])} atoms",
        "bond_self": lambda: f"bond {k + 1} joins atom {a} to itself",
        "bond_type": lambda: f"bond {k + 1}: unknown bond type {order} (expected 1-8)",
        "props_eof": lambda: f"file ends inside the properties block of molecule {index} (no 'M  END' line)",
        "no_end": lambda: f"molecule {index} ends before its 'M  END' line",
        "ag_eof": lambda: f"file ends inside the properties block of molecule {index} (the line after {line[:1]!r})",
        "skp_nan": lambda: number(line[6:9], "the line count of 'S  SKP'"),
        "skp_eof": lambda: f"file ends inside the lines skipped by 'S  SKP' in molecule {index}",
        "bond_after": lambda: f"found a bond line after the bond block: the counts line, line {counts_line}, "
                    f"says {_int(counts[3:6])} bonds",
    }
    return FileFormatError(path, lineno, reasons[kind]())


def _int(text):
    """``text`` as an integer, or None where the parser refuses it (not ASCII digits, or 10**18 and more)."""
    found = _INTEGER.fullmatch(text)
    return int(found.group(1)) if found and abs(int(found.group(1))) // 10 < 10**17 else None
