"""SD files (MDL molfile V2000, many molecules separated by ``$$$$``), read one molecule at a time.

Each molecule becomes a :class:`~graphkern.Graph` named after its header line, with
node labels ``element`` (atomic number, int64), ``charge`` (formal charge, int64) and
``coords`` (float64, shape ``(n, 3)``), and the edge label ``bond_order`` (the MDL
bond type: 1, 2, 3, 4 = aromatic, 5-8 the query types).  ``M  CHG`` lines, where a
molecule has any, replace the atom block's charges of every atom, as the format
prescribes.  V3000 molfiles are refused with a message saying so.
"""

from __future__ import annotations

import re

import numpy as np

from ._molecule import ATOMIC_NUMBER, HYDROGEN, molecule_graph
from ._text import FileFormatError, open_text, source_name

__all__ = ["iter_sdf", "read_sdf"]

# atom-block charge codes of the V2000 format; 4 is a doublet radical, which has no charge
_CHARGE_CODE = {0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 5: -1, 6: -2, 7: -3}
_BOND_TYPES = range(1, 9)
_BOND_LINE = re.compile(r"^\s*\d+\s+\d+\s+\d+(\s+\d+)*\s*$")
_MOLECULE_END = "$$$$"


class _Lines:
    """The lines of an open file, numbered from 1; ``next`` gives None at the end."""

    def __init__(self, f, path):
        self._lines = iter(f)
        self.path = path
        self.lineno = 0

    def next(self):
        line = next(self._lines, None)
        if line is None:
            return None
        self.lineno += 1
        return line.rstrip("\r\n")

    def require(self, what):
        line = self.next()
        if line is None:
            raise FileFormatError(self.path, self.lineno, f"file ends inside {what}")
        return line

    def error(self, reason):
        return FileFormatError(self.path, self.lineno, reason)


def _number(lines, text, parse, what):
    try:
        return parse(text)
    except ValueError:
        raise lines.error(f"{what} is not a number: {text.strip()!r}") from None


def iter_sdf(source, *, hydrogens=True, distance_weights=False, properties=False):
    """Yield the molecules of an SD file as graphs, reading one molecule at a time.

    Parameters
    ----------
    source : path or open text file
        A ``.sdf``/``.mol`` file; a path ending in ``.gz`` is decompressed.
    hydrogens : bool
        Keep hydrogen atoms (including ``D`` and ``T``) as nodes; ``False`` drops them
        and their bonds.
    distance_weights : bool
        Weigh each bond by the Euclidean distance between its atoms.
    properties : bool
        Yield ``(graph, dict)`` pairs whose dict holds the molecule's data items
        (``> <NAME>`` blocks) as strings.

    Raises
    ------
    FileFormatError
        Naming the file and line: a block cut short, counts that disagree with the
        atom or bond lines, an unknown element, a field that is not a number, a bond
        to a missing atom.
    """
    path = source_name(source)
    with open_text(source) as f:
        lines = _Lines(f, path)
        index = 0
        while True:
            index += 1
            molecule = _read_molecule(lines, index, hydrogens=hydrogens, distance_weights=distance_weights,
                                      properties=properties)
            if molecule is None:
                return
            yield molecule if properties else molecule[0]


def read_sdf(source, **options):
    """All molecules of an SD file as a list; the options are those of :func:`iter_sdf`."""
    return list(iter_sdf(source, **options))


def _read_molecule(lines, index, *, hydrogens, distance_weights, properties):
    """Parse one molfile and its data items; None at a clean end of file."""
    header = []
    for _ in range(3):
        line = lines.next()
        if line is None:
            if any(h.strip() for h in header):
                raise lines.error(f"file ends inside the header block of molecule {index}")
            return None
        header.append(line)
    counts = lines.next()
    if counts is None or not counts.strip():
        only_blank = not any(h.strip() for h in header)
        while only_blank and counts is not None and not counts.strip():
            counts = lines.next()
        if counts is None and only_blank:
            return None  # blank lines after the last molecule
        if counts is None:
            raise lines.error(f"file ends inside the header block of molecule {index}")
        raise lines.error(f"molecule {index} has no counts line (expected after its three header lines)")
    counts_line = lines.lineno
    n_atoms = _number(lines, counts[0:3], int, "the atom count (columns 1-3 of the counts line)")
    n_bonds = _number(lines, counts[3:6], int, "the bond count (columns 4-6 of the counts line)")
    if n_atoms < 0 or n_bonds < 0:
        raise lines.error(f"negative count on the counts line of molecule {index}: {n_atoms} atoms, {n_bonds} bonds")
    version = counts[34:39].strip().upper()
    if version == "V3000":
        raise lines.error("V3000 molfiles are not supported; convert the file to V2000 (RDKit and Open Babel can)")
    if version not in ("", "V2000"):
        raise lines.error(f"unknown molfile version {version!r} on the counts line (expected V2000)")
    said = f"the counts line, line {counts_line}, says {n_atoms} atoms and {n_bonds} bonds"

    elements = np.empty(n_atoms, dtype=np.int64)
    charges = np.empty(n_atoms, dtype=np.int64)
    coords = np.empty((n_atoms, 3), dtype=np.float64)
    for k in range(n_atoms):
        line = lines.require(f"the atom block of molecule {index} ({k} atoms read; {said})")
        if len(line) < 34 or not line[31:34].strip():
            raise lines.error(f"expected atom {k + 1} of molecule {index} ({said}), found {line!r}")
        for axis, name in enumerate("xyz"):
            field = line[10 * axis:10 * axis + 10]
            coords[k, axis] = _number(lines, field, float, f"atom {k + 1}: the {name} coordinate")
        symbol = line[31:34].strip()
        if symbol not in ATOMIC_NUMBER:
            raise lines.error(f"atom {k + 1}: unknown element {symbol!r}")
        elements[k] = ATOMIC_NUMBER[symbol]
        code = line[36:39].strip()
        code = _number(lines, code, int, f"atom {k + 1}: the charge code (columns 37-39)") if code else 0
        if code not in _CHARGE_CODE:
            raise lines.error(f"atom {k + 1}: unknown charge code {code} (expected 0-7)")
        charges[k] = _CHARGE_CODE[code]

    bonds = np.empty((n_bonds, 2), dtype=np.int64)
    orders = np.empty(n_bonds, dtype=np.int64)
    seen = {}
    for k in range(n_bonds):
        line = lines.require(f"the bond block of molecule {index} ({k} bonds read; {said})")
        try:
            a, b, kind = int(line[0:3]), int(line[3:6]), int(line[6:9])
        except ValueError:
            raise lines.error(f"expected bond {k + 1} of molecule {index} ({said}), found {line!r}") from None
        for atom in (a, b):
            if not 1 <= atom <= n_atoms:
                raise lines.error(f"bond {k + 1} names atom {atom}, but molecule {index} has {n_atoms} atoms")
        if a == b:
            raise lines.error(f"bond {k + 1} joins atom {a} to itself")
        if kind not in _BOND_TYPES:
            raise lines.error(f"bond {k + 1}: unknown bond type {kind} (expected 1-8)")
        pair = (min(a, b), max(a, b))
        if pair in seen:
            raise lines.error(f"bond {k + 1} repeats the bond between atoms {a} and {b} of line {seen[pair]}")
        seen[pair] = lines.lineno
        bonds[k] = a - 1, b - 1
        orders[k] = kind

    block_charges = _read_properties(lines, index, n_atoms, n_bonds, counts_line)
    if block_charges is not None:
        charges[:] = 0
        for atom, charge in block_charges.items():
            charges[atom] = charge
    data = _read_data_items(lines, properties)

    if not hydrogens:
        keep = elements != HYDROGEN
        new_index = np.cumsum(keep) - 1
        heavy = keep[bonds[:, 0]] & keep[bonds[:, 1]]
        elements, charges, coords = elements[keep], charges[keep], coords[keep]
        bonds, orders = new_index[bonds[heavy]], orders[heavy]
    weights = np.linalg.norm(coords[bonds[:, 0]] - coords[bonds[:, 1]], axis=1) if distance_weights else None
    graph = molecule_graph(bonds, orders, {"element": elements, "charge": charges, "coords": coords},
                           weights=weights, name=header[0].strip() or None)
    return graph, data


def _read_properties(lines, index, n_atoms, n_bonds, counts_line):
    """Read up to ``M  END``; return the ``M  CHG`` charges ({atom: charge}) or None if there are none."""
    charges = None
    while True:
        line = lines.require(f"the properties block of molecule {index} (no 'M  END' line)")
        if line.startswith("M  END"):
            return charges
        if line.startswith(_MOLECULE_END):
            raise lines.error(f"molecule {index} ends before its 'M  END' line")
        if line.startswith("M  CHG"):
            charges = {} if charges is None else charges
            fields = line[6:].split()
            count = _number(lines, fields[0] if fields else "", int, "the entry count of 'M  CHG'")
            if len(fields) != 1 + 2 * count:
                raise lines.error(f"'M  CHG' announces {count} atom-charge pairs but holds {(len(fields) - 1) / 2:g}")
            for atom_text, charge_text in zip(fields[1::2], fields[2::2]):
                atom = _number(lines, atom_text, int, "an atom number of 'M  CHG'")
                if not 1 <= atom <= n_atoms:
                    raise lines.error(f"'M  CHG' names atom {atom}, but molecule {index} has {n_atoms} atoms")
                charges[atom - 1] = _number(lines, charge_text, int, f"the charge of atom {atom} in 'M  CHG'")
        elif line.startswith("M  V30"):
            raise lines.error("V3000 molfiles are not supported; convert the file to V2000 (RDKit and Open Babel can)")
        elif line[:3] in ("A  ", "G  "):
            lines.require(f"the properties block of molecule {index} (the line after {line[:1]!r})")
        elif line.startswith("S  SKP"):
            for _ in range(_number(lines, line[6:9], int, "the line count of 'S  SKP'")):
                lines.require(f"the lines skipped by 'S  SKP' in molecule {index}")
        elif _BOND_LINE.match(line):
            raise lines.error(f"found a bond line after the bond block: the counts line, line {counts_line}, "
                              f"says {n_bonds} bonds")


def _read_data_items(lines, properties):
    """Read the ``> <NAME>`` data items up to ``$$$$`` or the end of file."""
    data = {}
    line = lines.next()
    while line is not None and not line.startswith(_MOLECULE_END):
        if properties and line.startswith(">"):
            found = re.search(r"<([^>]*)>", line)
            name = found.group(1) if found else line[1:].strip()
            values = []
            line = lines.next()
            while line is not None and line.strip() and not line.startswith(_MOLECULE_END):
                values.append(line)
                line = lines.next()
            data[name] = "\n".join(values)
            continue
        line = lines.next()
    return data
