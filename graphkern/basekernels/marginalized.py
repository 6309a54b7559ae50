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

The shortest-path kernel's counterparts are listed in :mod:`graphkern.basekernels`.

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

Hyperparameters (scikit-learn conventions): each base kernel has one, ``c``, ``h`` or
``length_scale``, with bounds given as ``c_bounds=``/``h_bounds=``/``length_scale_bounds=``
(a ``(low, high)`` pair of positive numbers, or ``"fixed"`` to keep it out of an
optimization).  ``get_params()``/``set_params()`` reach into compositions with
``column__name`` keys (``TensorProduct(element=KroneckerDelta(0.5))`` has ``element__h``).
The derivative of a kernel with respect to one term's hyperparameter is itself a program
(:meth:`KernelProgram.derivative`), written with two more kinds:
:data:`KIND_KRONECKER_DELTA_DERIVATIVE` (0 where the labels are equal, 1 where they
differ) and :data:`KIND_SQUARE_EXPONENTIAL_DERIVATIVE` (``exp(aux d^2) d^2 / theta^3``,
the derivative of the square exponential by its length scale); a Constant's derivative is
the Constant 1.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from graphkern._backend import finite_real

__all__ = ["Kernel", "BaseKernel", "Constant", "KroneckerDelta", "SquareExponential", "TensorProduct",
           "Additive", "KernelProgram", "KIND_CONSTANT", "KIND_KRONECKER_DELTA", "KIND_SQUARE_EXPONENTIAL",
           "KIND_KRONECKER_DELTA_DERIVATIVE", "KIND_SQUARE_EXPONENTIAL_DERIVATIVE"]

KIND_CONSTANT = 0
KIND_KRONECKER_DELTA = 1
KIND_SQUARE_EXPONENTIAL = 2
KIND_KRONECKER_DELTA_DERIVATIVE = 3
KIND_SQUARE_EXPONENTIAL_DERIVATIVE = 4

#: the most terms one program may have; the GPU solver keeps programs in shared memory
MAX_TERMS = 24

# Category codes are stored in the solver's float type: float32 is exact up to 2^24.
_MAX_CATEGORIES = 1 << 24


def check_bounds(bounds, name, owner, *, upper=math.inf):
    """Validate ``"fixed"`` or a ``(low, high)`` pair with ``0 < low <= high <= upper``; return it as given.

    Bounds are on the hyperparameter itself; optimizers search its logarithm, hence ``low > 0``.
    The object is kept as given (scikit-learn's ``clone`` checks that constructors store their
    arguments unchanged); :func:`bounds_key` gives the comparable form.
    """
    if isinstance(bounds, str):
        if bounds != "fixed":
            raise ValueError(f"{owner}: {name}_bounds must be 'fixed' or a (low, high) pair, got {bounds!r}")
        return bounds
    try:
        low, high = bounds
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: {name}_bounds must be 'fixed' or a (low, high) pair, got {bounds!r}") from None
    low = finite_real(low, f"{owner}: {name}_bounds[0]")
    high = finite_real(high, f"{owner}: {name}_bounds[1]")
    if not 0 < low <= high <= upper:
        limit = f" <= {upper:g}" if math.isfinite(upper) else ""
        raise ValueError(f"{owner}: {name}_bounds must satisfy 0 < low <= high{limit} (the search runs over "
                         f"log({name})), got ({low:g}, {high:g})")
    return bounds


def bounds_key(bounds):
    """``"fixed"`` or the bounds as a tuple of two floats (for comparisons and arrays)."""
    return bounds if isinstance(bounds, str) else (float(bounds[0]), float(bounds[1]))


class Kernel:
    """A vertex or edge kernel: callable on labels, compilable into a :class:`KernelProgram`.

    Every kernel has ``compile()`` (the numeric program the solvers interpret),
    ``is_strictly_positive()`` (> 0 for every pair of finite labels), ``get_params(deep=True)``
    (the constructor's arguments; ``deep``: also the base kernels', as ``column__name``),
    ``set_params(**params)`` (returns self) and ``clone()`` (an independent copy).
    """

    @property
    def columns(self):
        """The label columns this kernel reads (Constant terms read none)."""
        return self.compile().columns


def _hyperparameter_property(name):
    """The attribute ``name`` of a base kernel: its hyperparameter, validated whenever it is set."""

    def get(self):
        return self._value

    def set(self, value):
        value = finite_real(value, f"{type(self).__name__}: {name}")
        if not (value > 0 if self.upper is None else 0.0 <= value <= self.upper):
            need = "be > 0" if self.upper is None else f"lie in [0, {self.upper:g}]"
            raise ValueError(f"{type(self).__name__}: {name} must {need}{self.range_reason}, got {value}")
        if self.magnitude is not None and value and not self.magnitude[0] <= value <= self.magnitude[1]:
            raise ValueError(f"{type(self).__name__}: {name} must lie in [{self.magnitude[0]:g}, "
                             f"{self.magnitude[1]:g}] ({self.magnitude[2]}), got {value}")
        self._value = value

    return property(get, set, doc=f"The hyperparameter {name}.")


class BaseKernel(Kernel):
    """A kernel on one label value per item; :class:`TensorProduct`/:class:`Additive` name the column.

    Subclasses name their hyperparameter in ``hyperparameter`` (an attribute made by
    :func:`_hyperparameter_property`, checked against ``upper``); its bounds are the
    constructor argument ``<hyperparameter>_bounds``.
    """

    kind = None
    #: the label transform the solvers need: None (no label), "category" or "raw"
    transform = None
    #: the name of the hyperparameter ("c", "h", "length_scale")
    hyperparameter = None
    #: valid values: [0, upper], or > 0 when None
    upper = None
    #: (low, high, why): the magnitudes a nonzero value may take, or None for any
    magnitude = None
    range_reason = ""

    @property
    def theta(self):
        """The raw hyperparameter carried into the program."""
        return self._value

    @property
    def bounds(self):
        """``"fixed"`` or the ``(low, high)`` bounds of the hyperparameter."""
        return self._bounds

    @bounds.setter
    def bounds(self, bounds):
        self._bounds = check_bounds(bounds, self.hyperparameter, type(self).__name__,
                                    upper=math.inf if self.upper is None else self.upper)

    def aux(self):
        return 0.0

    def derivative(self):
        """The base kernel of the derivative with respect to the hyperparameter (a program term)."""
        raise NotImplementedError

    def compile(self):
        if self.transform is not None:
            raise ValueError(f"{self!r} compares labels, so it needs a label column: wrap it as "
                             f"TensorProduct(<column>={self!r})")
        return KernelProgram([(1.0, [(self, None)])])

    def get_params(self, deep=True):
        return {self.hyperparameter: self._value, f"{self.hyperparameter}_bounds": self._bounds}

    def set_params(self, **params):
        for key, value in params.items():
            if key not in (self.hyperparameter, f"{self.hyperparameter}_bounds"):
                raise ValueError(f"{type(self).__name__} has no parameter {key!r}; it has "
                                 f"{self.hyperparameter!r} and '{self.hyperparameter}_bounds'")
            setattr(self, key, value)
        return self

    def clone(self):
        return type(self)(**self.get_params(deep=False))

    def is_strictly_positive(self):
        """> 0 for every pair of finite labels, where the hyperparameter (c, h) is the smallest value."""
        return self._value > 0

    def __eq__(self, other):
        return (type(self) is type(other) and self.theta == other.theta
                and bounds_key(self._bounds) == bounds_key(other._bounds))

    def __hash__(self):
        return hash((type(self).__name__, self.theta))

    def __repr__(self):
        return f"{type(self).__name__}({self._value!r}{_bounds_repr(self)})"


class Constant(BaseKernel):
    """``c`` for every pair of labels, with ``0 <= c <= 1``; reads no label column.

    ``c_bounds``: ``(low, high)`` with ``0 < low <= high <= 1``, or ``"fixed"``.
    """

    kind = KIND_CONSTANT
    hyperparameter = "c"
    upper = 1.0
    range_reason = " (graph kernel values are similarities)"

    def __init__(self, c=1.0, *, c_bounds=(1e-3, 1.0)):
        self.c = c
        self.c_bounds = c_bounds

    c = _hyperparameter_property("c")
    c_bounds = BaseKernel.bounds

    def derivative(self):
        return Constant(1.0)

    def __call__(self, x, y, *, vector=False):
        shape = np.broadcast_shapes(np.shape(x), np.shape(y))
        return np.full(shape[:-1] if vector else shape, self.c)


class KroneckerDelta(BaseKernel):
    """1 where two labels are equal, ``h`` where they differ, with ``0 <= h <= 1``.

    Vector labels are equal when every component is.  As a vertex kernel, ``h`` must be
    > 0 (vertex kernel values lie in (0, 1]).  ``h_bounds``: ``(low, high)`` with
    ``0 < low <= high <= 1``, or ``"fixed"``.
    """

    kind = KIND_KRONECKER_DELTA
    transform = "category"
    hyperparameter = "h"
    upper = 1.0

    def __init__(self, h, *, h_bounds=(1e-3, 1.0)):
        self.h = h
        self.h_bounds = h_bounds

    h = _hyperparameter_property("h")
    h_bounds = BaseKernel.bounds

    def derivative(self):
        return _KroneckerDeltaDerivative(self)

    def __call__(self, x, y, *, vector=False):
        equal = np.asarray(x) == np.asarray(y)
        if vector:
            equal = np.all(equal, axis=-1)
        return np.where(equal, 1.0, self.h)


class SquareExponential(BaseKernel):
    """``exp(-|x - y|^2 / (2 length_scale^2))``; for vector labels ``|.|`` is Euclidean.

    ``length_scale_bounds``: ``(low, high)`` with ``0 < low <= high``, or ``"fixed"``.
    """

    kind = KIND_SQUARE_EXPONENTIAL
    transform = "raw"
    hyperparameter = "length_scale"
    magnitude = (1e-150, 1e150, "its square divides the squared label distance and must stay a finite, "
                 "nonzero float64")

    def __init__(self, length_scale, *, length_scale_bounds=(1e-2, 1e2)):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds

    length_scale = _hyperparameter_property("length_scale")
    length_scale_bounds = BaseKernel.bounds

    def aux(self):
        return -0.5 / self.length_scale ** 2

    def derivative(self):
        return _SquareExponentialDerivative(self)

    def __call__(self, x, y, *, vector=False):
        return np.exp(self.aux() * _squared_distance(x, y, vector))

    def is_strictly_positive(self):
        # exp of a finite argument; the solvers floor values that underflow (see mgk.py)
        return True


def _squared_distance(x, y, vector):
    d2 = (np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)) ** 2
    return d2.sum(axis=-1) if vector else d2


def _bounds_repr(k):
    default = inspect.signature(type(k).__init__).parameters[f"{k.hyperparameter}_bounds"].default
    return "" if bounds_key(k.bounds) == default else f", {k.hyperparameter}_bounds={k.bounds!r}"


class _Derivative(BaseKernel):
    """The derivative of a base kernel by its hyperparameter: a program term, not a user kernel."""

    def __init__(self, of):
        self.of = of
        self._value = of.theta
        self._bounds = "fixed"

    def aux(self):
        return self.of.aux()

    def is_strictly_positive(self):
        return False

    def __repr__(self):
        return f"d{self.of!r}/d{self.of.hyperparameter}"


class _KroneckerDeltaDerivative(_Derivative):
    """``d/dh KroneckerDelta(h)``: 0 where the labels are equal, 1 where they differ."""

    kind = KIND_KRONECKER_DELTA_DERIVATIVE
    transform = "category"

    def __call__(self, x, y, *, vector=False):
        return 1.0 - KroneckerDelta(0.0)(x, y, vector=vector)


class _SquareExponentialDerivative(_Derivative):
    """``d/dl exp(-d^2 / (2 l^2)) = exp(-d^2 / (2 l^2)) d^2 / l^3``."""

    kind = KIND_SQUARE_EXPONENTIAL_DERIVATIVE
    transform = "raw"

    def __call__(self, x, y, *, vector=False):
        d2 = _squared_distance(x, y, vector)
        return np.exp(self.aux() * d2) * d2 / self.theta ** 3


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

    def get_params(self, deep=True):
        params = dict(self.kernels)
        if deep:
            for col, k in self.kernels.items():
                params.update({f"{col}__{key}": v for key, v in k.get_params().items()})
        return params

    def set_params(self, **params):
        for key, value in params.items():
            col, _, sub = key.partition("__")
            if col not in self.kernels:
                raise ValueError(f"{self._name} has no column {col!r}; it has {', '.join(map(repr, self.kernels))}")
            if sub:
                self.kernels[col].set_params(**{sub: value})
            elif not isinstance(value, BaseKernel):
                raise TypeError(f"{self._name}: column {col!r} must be given a base kernel, got {value!r}")
            else:
                self.kernels[col] = value
        return self

    def clone(self):
        return type(self)(**{col: k.clone() for col, k in self.kernels.items()})

    def __call__(self, labels_x, labels_y, *, vector_columns=()):
        return self.compile().evaluate(labels_x, labels_y, vector_columns)

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
        return KernelProgram([(1.0, [(k, col) for col, k in self.kernels.items()])])

    def is_strictly_positive(self):
        return all(k.is_strictly_positive() for k in self.kernels.values())


class Additive(_Composition):
    """The normalized sum (mean) of base kernels on named columns; values stay in [0, 1]."""

    _name = "Additive"

    def compile(self):
        w = 1.0 / len(self.kernels)
        return KernelProgram([(w, [(k, col)]) for col, k in self.kernels.items()])

    def is_strictly_positive(self):
        return any(k.is_strictly_positive() for k in self.kernels.values())


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
        self.columns = tuple(dict.fromkeys(col for col, _ in self.feature_spec if col is not None))

    # ------------------------------------------------------------------ structure
    @property
    def feature_spec(self):
        """The distinct (column, transform) pairs, in slot order."""
        return tuple(dict.fromkeys((col, k.transform) for _, terms in self.groups for k, col in terms
                                   if k.transform is not None))

    def is_strictly_positive(self):
        return any(all(k.is_strictly_positive() for k, _ in terms) for w, terms in self.groups if w > 0)

    def terms(self):
        """``(group, index in group, base kernel, column)`` of every term, in program order."""
        return [(g, t, k, col) for g, (_, terms) in enumerate(self.groups) for t, (k, col) in enumerate(terms)]

    def derivative(self, group, term):
        """The program of ``d value / d theta`` of one term: only its group, the term differentiated."""
        weight, terms = self.groups[group]
        return KernelProgram([(weight, [(k.derivative() if t == term else k, col)
                                        for t, (k, col) in enumerate(terms)])])

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

    def encode(self, widths, slots=None):
        """``(code, params)``: int32 and float64 arrays; ``widths`` maps (column, transform) -> width.

        ``slots``: the feature layout to address (default this program's own); a derivative
        program is encoded with its kernel's layout, since it reads the same feature rows.
        """
        slots = self.slots(widths) if slots is None else slots
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
        blocks = []
        for col, transform in self.feature_spec:
            arr = np.asarray(columns[col])
            if transform == "category":
                blocks.append(_category_codes(arr, tables.setdefault(col, {}), what, col)[:, None])
            else:
                # a column of no rows (a graph without edges) still has its width: one value a row
                width = arr[0].size if len(arr) else int(np.prod(arr.shape[1:]))
                blocks.append(arr.reshape(len(arr), width).astype(np.float64))
        if not blocks:
            return None
        return np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=dtype)

    def widths(self, columns):
        """Feature width of each (column, transform): 1 for categories, d for raw vectors."""
        out = {}
        for col, transform in self.feature_spec:
            arr = np.asarray(columns[col])
            out[(col, transform)] = 1 if transform == "category" or arr.ndim == 1 else arr.shape[1]
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


def _unique_inverse(arr):
    """``np.unique(arr, return_inverse=True)`` of a 1-D array; integers of a range at most a few
    times their count (atom and bond types, small categories) by a table of the range instead of a
    sort, in linear time."""
    if arr.dtype.kind in "iu" and len(arr):
        lo, hi = int(arr.min()), int(arr.max())
        if hi - lo <= 4 * len(arr) + 1024 and hi < 2**63:
            offset = arr.astype(np.int64) - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[offset] = True
            rank = np.cumsum(present) - 1
            return (np.flatnonzero(present) + lo).astype(arr.dtype), rank[offset]
    return np.unique(arr, return_inverse=True)


def _category_codes(arr, table, what, col):
    """Small integer codes for the labels in ``arr``, extending ``table`` with unseen ones."""
    if arr.ndim == 1:
        uniq, inverse = _unique_inverse(arr)
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
