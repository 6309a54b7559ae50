"""Base kernels on vertex and edge labels, and their composition over named label columns.

The marginalized graph kernel compares two vertices (two edges) with a *vertex kernel*
(an *edge kernel*): a function of their labels with values in [0, 1].  Build one from

* :class:`Constant` ``(c)``: ``c`` whatever the labels (an unlabeled graph: ``Constant(1.0)``);
* :class:`KroneckerDelta` ``(h)``: 1 where the labels are equal, ``h`` where they differ;
* :class:`SquareExponential` ``(length_scale)``: ``exp(-|x - y|^2 / (2 length_scale^2))``,
  with the squared Euclidean distance for vector-valued labels;

each applied to one named label column by

* :class:`TensorProduct` ``(element=KroneckerDelta(0.5), charge=SquareExponential(1.0))``:
  the product of its terms;
* :class:`Additive` ``(...)``: the normalized sum, the mean of its terms (weights 1/n that
  sum to 1), so that values stay in [0, 1].

Every kernel is callable on label arrays (``kernel(x, y)``, elementwise and broadcasting;
a composition takes two mappings from column name to array), which is how the dense
reference solver evaluates it.  The solvers do not call Python per label pair: a
composition is *compiled* (:meth:`Kernel.compile`) into a small numeric program that the
Cython and CUDA solvers interpret, so a user's composition runs on both backends without
a compiler on the user's machine.

The program is a sum of products: ``value = sum_g weight_g * prod_{t in g} base_t(x, y)``.
Two arrays encode it:

``code`` (int32)
    ``[n_groups, then per group: n_terms, then per term: kind, slot, width]``
``params`` (float64)
    ``[per group: weight, then per term: theta, aux]``

``kind`` is one of :data:`KIND_CONSTANT`, :data:`KIND_KRONECKER_DELTA`,
:data:`KIND_SQUARE_EXPONENTIAL`; ``slot``/``width`` locate the term's label values in the
per-vertex (per-edge) feature row built by :meth:`KernelProgram.features`; ``theta`` is
the term's raw hyperparameter (c, h or the length scale) and ``aux`` a value derived from
it (``-1 / (2 length_scale^2)``).  Carrying ``theta`` itself lets the solvers evaluate
derivatives with respect to it as well.

Labels compared by a Kronecker delta are replaced by small integer category codes (equal
labels, equal codes) before they reach a solver, so that float32 features compare exactly;
labels of a square exponential are passed as they are.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["Kernel", "BaseKernel", "Constant", "KroneckerDelta", "SquareExponential", "TensorProduct",
           "Additive", "KernelProgram", "KIND_CONSTANT", "KIND_KRONECKER_DELTA", "KIND_SQUARE_EXPONENTIAL"]

KIND_CONSTANT = 0
KIND_KRONECKER_DELTA = 1
KIND_SQUARE_EXPONENTIAL = 2

#: the most terms one program may have; the GPU solver keeps programs in shared memory
MAX_TERMS = 24

# Category codes are stored in the solver's float type: float32 is exact up to 2^24.
_MAX_CATEGORIES = 1 << 24


def _real(value, name, owner):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value}")
    return value


class Kernel:
    """A vertex or edge kernel: callable on labels, compilable into a :class:`KernelProgram`."""

    def compile(self):
        """The numeric program that the CPU and GPU solvers interpret."""
        raise NotImplementedError

    @property
    def columns(self):
        """The label columns this kernel reads (Constant terms read none)."""
        return self.compile().columns

    def is_strictly_positive(self):
        """True when the kernel's value is > 0 for every pair of finite labels."""
        raise NotImplementedError


class BaseKernel(Kernel):
    """A kernel on one label value per item; :class:`TensorProduct`/:class:`Additive` name the column."""

    kind = None
    #: the label transform the solvers need: None (no label), "category" or "raw"
    transform = None

    @property
    def theta(self):
        """The raw hyperparameter carried into the program."""
        raise NotImplementedError

    def aux(self):
        return 0.0

    def compile(self):
        if self.transform is not None:
            raise ValueError(f"{self!r} compares labels, so it needs a label column: wrap it as "
                             f"TensorProduct(<column>={self!r})")
        return KernelProgram._from_groups([(1.0, [(self, None)])])

    def __eq__(self, other):
        return type(self) is type(other) and self.theta == other.theta

    def __hash__(self):
        return hash((type(self).__name__, self.theta))


class Constant(BaseKernel):
    """``c`` for every pair of labels, with ``0 <= c <= 1``; reads no label column."""

    kind = KIND_CONSTANT
    transform = None

    def __init__(self, c=1.0):
        c = _real(c, "c", "Constant")
        if not 0.0 <= c <= 1.0:
            raise ValueError(f"Constant: c must lie in [0, 1] (graph kernel values are similarities), got {c}")
        self.c = c

    @property
    def theta(self):
        return self.c

    def __call__(self, x, y, *, vector=False):
        shape = np.broadcast_shapes(np.shape(x), np.shape(y))
        return np.full(shape[:-1] if vector else shape, self.c)

    def is_strictly_positive(self):
        return self.c > 0

    def __repr__(self):
        return f"Constant({self.c!r})"


class KroneckerDelta(BaseKernel):
    """1 where two labels are equal, ``h`` where they differ, with ``0 <= h <= 1``.

    Vector labels are equal when every component is.  As a vertex kernel, ``h`` must be
    > 0 (vertex kernel values lie in (0, 1]).
    """

    kind = KIND_KRONECKER_DELTA
    transform = "category"

    def __init__(self, h):
        h = _real(h, "h", "KroneckerDelta")
        if not 0.0 <= h <= 1.0:
            raise ValueError(f"KroneckerDelta: h must lie in [0, 1], got {h}")
        self.h = h

    @property
    def theta(self):
        return self.h

    def __call__(self, x, y, *, vector=False):
        x = np.asarray(x)
        y = np.asarray(y)
        equal = x == y
        if vector:
            equal = np.all(equal, axis=-1)
        return np.where(equal, 1.0, self.h)

    def is_strictly_positive(self):
        return self.h > 0

    def __repr__(self):
        return f"KroneckerDelta({self.h!r})"


class SquareExponential(BaseKernel):
    """``exp(-|x - y|^2 / (2 length_scale^2))``; for vector labels ``|.|`` is Euclidean."""

    kind = KIND_SQUARE_EXPONENTIAL
    transform = "raw"

    def __init__(self, length_scale):
        ell = _real(length_scale, "length_scale", "SquareExponential")
        if not ell > 0:
            raise ValueError(f"SquareExponential: length_scale must be > 0, got {ell}")
        self.length_scale = ell

    @property
    def theta(self):
        return self.length_scale

    def aux(self):
        return -0.5 / self.length_scale ** 2

    def __call__(self, x, y, *, vector=False):
        d2 = (np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)) ** 2
        if vector:
            d2 = d2.sum(axis=-1)
        return np.exp(self.aux() * d2)

    def is_strictly_positive(self):
        # exp of a finite argument; the solvers floor values that underflow (see mgk.py)
        return True

    def __repr__(self):
        return f"SquareExponential({self.length_scale!r})"


class _Composition(Kernel):
    """Base kernels applied to named label columns."""

    _name = None

    def __init__(self, **columns):
        if not columns:
            raise ValueError(f"{self._name} needs at least one column=kernel argument")
        if len(columns) > MAX_TERMS:
            raise ValueError(f"{self._name}: at most {MAX_TERMS} columns, got {len(columns)}")
        for col, k in columns.items():
            if not isinstance(k, BaseKernel):
                raise TypeError(f"{self._name}: column {col!r} must be given a base kernel "
                                f"(Constant, KroneckerDelta, SquareExponential), got {k!r}")
        self.kernels = dict(columns)

    def __eq__(self, other):
        return type(self) is type(other) and self.kernels == other.kernels

    def __hash__(self):
        return hash((self._name, tuple(sorted(self.kernels.items()))))

    def __repr__(self):
        inner = ", ".join(f"{c}={k!r}" for c, k in self.kernels.items())
        return f"{self._name}({inner})"


class TensorProduct(_Composition):
    """The product of base kernels on named columns: ``TensorProduct(element=KroneckerDelta(0.5), ...)``.

    Calling it takes two mappings from column name to label array (broadcast against each
    other); ``vector_columns`` names the columns whose arrays carry a vector on the last axis.
    """

    _name = "TensorProduct"

    def compile(self):
        return KernelProgram._from_groups([(1.0, [(k, col) for col, k in self.kernels.items()])])

    def is_strictly_positive(self):
        return all(k.is_strictly_positive() for k in self.kernels.values())

    def __call__(self, labels_x, labels_y, *, vector_columns=()):
        return self.compile().evaluate(labels_x, labels_y, vector_columns)


class Additive(_Composition):
    """The normalized sum (mean) of base kernels on named columns; values stay in [0, 1]."""

    _name = "Additive"

    def compile(self):
        w = 1.0 / len(self.kernels)
        return KernelProgram._from_groups([(w, [(k, col)]) for col, k in self.kernels.items()])

    def is_strictly_positive(self):
        return any(k.is_strictly_positive() for k in self.kernels.values())

    def __call__(self, labels_x, labels_y, *, vector_columns=()):
        return self.compile().evaluate(labels_x, labels_y, vector_columns)


class KernelProgram:
    """A compiled kernel: the ``code``/``params`` arrays and the label columns they read.

    ``terms`` lists ``(group, base_kernel, column)``; ``columns`` the distinct columns in
    first-use order; ``slots`` maps ``(column, transform)`` to ``(slot, width)`` once
    :meth:`bind` has seen the columns' widths.
    """

    def __init__(self, groups):
        self.groups = groups  # [(weight, [(base_kernel, column or None), ...]), ...]
        n_terms = sum(len(t) for _, t in groups)
        if n_terms > MAX_TERMS:
            raise ValueError(f"a kernel may have at most {MAX_TERMS} terms, got {n_terms}")
        cols = []
        for _, terms in groups:
            for k, col in terms:
                if col is not None and k.transform is not None and col not in cols:
                    cols.append(col)
        self.columns = tuple(cols)

    @classmethod
    def _from_groups(cls, groups):
        return cls(groups)

    # ------------------------------------------------------------------ structure
    @property
    def feature_spec(self):
        """The distinct (column, transform) pairs, in slot order."""
        spec = []
        for _, terms in self.groups:
            for k, col in terms:
                if k.transform is not None and (col, k.transform) not in spec:
                    spec.append((col, k.transform))
        return tuple(spec)

    def structure_key(self):
        """What the packed features depend on (not the hyperparameter values)."""
        return self.feature_spec

    def is_strictly_positive(self):
        return any(all(k.is_strictly_positive() for k, _ in terms) for w, terms in self.groups if w > 0)

    def describe_zero(self):
        """A term that can make the kernel 0 (for error messages)."""
        for _, terms in self.groups:
            for k, col in terms:
                if not k.is_strictly_positive():
                    return f"{k!r}" + (f" on column {col!r}" if col is not None else "")
        return None

    # ------------------------------------------------------------------ encoding
    def slots(self, widths):
        """``{(column, transform): (slot, width)}``: where each label sits in a feature row."""
        slots = {}
        offset = 0
        for key in self.feature_spec:
            slots[key] = (offset, widths[key])
            offset += widths[key]
        return slots

    def encode(self, widths):
        """``(code, params)``: int32 and float64 arrays; ``widths`` maps (column, transform) -> width."""
        slots = self.slots(widths)
        code = [len(self.groups)]
        params = []
        for weight, terms in self.groups:
            code.append(len(terms))
            params.append(weight)
            for k, col in terms:
                slot, width = slots.get((col, k.transform), (0, 0)) if k.transform is not None else (0, 0)
                code += [k.kind, slot, width]
                params += [k.theta, k.aux()]
        return np.array(code, dtype=np.int32), np.array(params, dtype=np.float64)

    def edge_form(self):
        """A solver shortcut for the edge kernel's common shapes.

        ``("constant", c)``: the value is ``c`` whatever the labels;
        ``("kronecker", scale, h, column)`` / ``("sqexp", scale, aux, column)``: ``scale``
        times one base kernel of a scalar column; otherwise ``("general",)``.
        """
        if len(self.groups) != 1:
            if all(k.transform is None for _, terms in self.groups for k, _c in terms):
                return ("constant", float(sum(w * np.prod([k.theta for k, _c in terms])
                                              for w, terms in self.groups)))
            return ("general",)
        weight, terms = self.groups[0]
        scale = weight
        labeled = []
        for k, col in terms:
            if k.transform is None:
                scale *= k.theta
            else:
                labeled.append((k, col))
        if not labeled:
            return ("constant", scale)
        if len(labeled) == 1:
            k, col = labeled[0]
            if k.kind == KIND_KRONECKER_DELTA:
                return ("kronecker", scale, k.theta, col)
            if k.kind == KIND_SQUARE_EXPONENTIAL:
                return ("sqexp", scale, k.aux(), col)
        return ("general",)

    # ------------------------------------------------------------------ features
    def features(self, columns, tables, dtype, *, what="node"):
        """The per-item feature matrix the solvers read: shape ``(n_items, n_features)``.

        ``columns`` maps a column name to its concatenated label array; ``tables`` maps
        a column name to a dict of category codes that grows as new labels are seen
        (shared across datasets so that codes agree between them).
        """
        n = None
        blocks = []
        for col, transform in self.feature_spec:
            arr = np.asarray(columns[col])
            n = len(arr) if n is None else n
            if transform == "category":
                blocks.append(_category_codes(arr, tables.setdefault(col, {}), what, col)[:, None])
            else:
                blocks.append(arr.reshape(len(arr), -1).astype(np.float64))
        if not blocks:
            return None
        return np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=dtype)

    def widths(self, columns):
        """Feature width of each (column, transform): 1 for categories, d for raw vectors."""
        out = {}
        for col, transform in self.feature_spec:
            arr = np.asarray(columns[col])
            out[(col, transform)] = 1 if transform == "category" else (1 if arr.ndim == 1 else arr.shape[1])
        return out

    # ------------------------------------------------------------------ reference evaluation
    def evaluate(self, labels_x, labels_y, vector_columns=()):
        """The kernel's value on label arrays (NumPy broadcasting), for references and tests.

        ``vector_columns`` names the columns whose arrays carry a vector on their last axis.
        """
        total = 0.0
        for weight, terms in self.groups:
            prod = 1.0
            for k, col in terms:
                if k.transform is None:
                    prod = prod * k.theta
                    continue
                for side, labels in (("first", labels_x), ("second", labels_y)):
                    if col not in labels:
                        raise KeyError(f"the {side} labels have no column {col!r}")
                prod = prod * k(labels_x[col], labels_y[col], vector=col in vector_columns)
            total = total + weight * prod
        return total

    def __repr__(self):
        return f"KernelProgram(groups={self.groups!r})"


def _category_codes(arr, table, what, col):
    """Small integer codes for the labels in ``arr``, extending ``table`` with unseen ones."""
    if arr.ndim == 1:
        uniq, inverse = np.unique(arr, return_inverse=True)
        keys = uniq.tolist()
    else:
        uniq, inverse = np.unique(arr, axis=0, return_inverse=True)
        keys = [tuple(row) for row in uniq.tolist()]
    codes = np.empty(len(keys), dtype=np.float64)
    for i, key in enumerate(keys):
        code = table.get(key)
        if code is None:
            code = len(table)
            if code >= _MAX_CATEGORIES:
                raise ValueError(f"{what} label {col!r} has more than {_MAX_CATEGORIES} distinct values; "
                                 "a KroneckerDelta cannot tell them apart in float32")
            table[key] = code
        codes[i] = code
    return codes[np.asarray(inverse).reshape(-1)] if len(arr) else np.zeros(0)
