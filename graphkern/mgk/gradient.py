"""Hyperparameters of the marginalized graph kernel and the exact gradient of K with respect to them.

With ``M = D V^-1 - A (.) E`` (symmetric), ``b = D q^2`` and ``K = p^2 1^T x`` where ``M x = b``,
the adjoint ``y`` of ``M y = 1`` gives, for any hyperparameter theta,

    dK/dtheta = p^2 (y^T db/dtheta - y^T (dM/dtheta) x),

so one extra solve per pair serves every hyperparameter.  The solvers return the *raw*
derivatives of a pair, in this column order:

* one per free vertex-kernel term: ``p^2 sum_k y_k x_k D_k V_k^-2 dV_k/dtheta``, with
  ``dV/dtheta`` the term's derivative program (:meth:`KernelProgram.derivative`);
* ``dK/dq``: D = (d + q) (x) (d' + q) and b = D q^2 (mgk.py);
* one per *edge contraction* ``p^2 y^T (A1 (x) A2 (.) dE) x``: the XMV with the derivative of
  the edge kernel, dotted with y.

A contraction with a multiple of the edge kernel itself is free: ``M x = b - r`` (r the
forward solve's residual) gives ``(A1 (x) A2 (.) E) x = D V^-1 x - b + r``, so
``y^T (A1 (x) A2 (.) E) x = y^T (D V^-1 x - b) + y^T r``, a diagonal sum whose error ``y^T r``
is K's own error (``K - 1^T M^-1 b = -y^T r``).  Such contractions are the shortcut forms'
"base" one (a Constant factor of the edge kernel: ``kappa = scale base``, so the base
contraction is ``1/scale`` times the full one; not where scale = 0, which leaves M without
the edge kernel) and, for a general edge kernel of one product group, each Constant term c
(``dkappa/dc = kappa / c``).  ``contraction_free[c]`` holds that factor (0: contract by an XMV);
the GPU solvers use it, and the contraction's form and program stay valid for any solver that
contracts by XMV.

:class:`GradientPlan` builds the derivative programs and contractions and maps the raw
columns to ``dK/dlog(theta)`` (scikit-learn's log-scale theta): a term of a product that
multiplies the edge kernel by a constant shares one contraction with every other such
term (each scaled by the product of the others), the derivatives of the common edge-kernel
shortcuts (a Kronecker delta or a square exponential of one scalar column, times
constants) use shortcut XMVs, and any other edge kernel contracts its derivative programs
through the general interpreter.  ``dK/dp = 2 K / p``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["HyperparameterSpec", "hyperparameter_specs", "GradientPlan", "EDGE_FORMS", "ProgramTable",
           "finite_difference_steps"]

#: the XMV's edge-kernel forms, as cuda_src/common/kernel_program.cuh (EDGE_*) and graphkern/_cpu/mgk.pyx number them
EDGE_FORMS = {"general": 0, "constant": 1, "kronecker": 2, "sqexp": 3, "kronecker_derivative": 4,
              "sqexp_derivative": 5}


@dataclass(frozen=True)
class HyperparameterSpec:
    """One hyperparameter: its scikit-learn name, where it lives, its value and bounds."""

    name: str            # "node_kernel__element__h", "edge_kernel__c", "p", "q"
    owner: str           # "node", "edge", "p" or "q"
    term: tuple | None   # (group, index in group) of a base-kernel term of the owner's program
    value: float
    bounds: object       # "fixed" or (low, high)
    upper: float         # the largest valid value (1 for c, h; just below 1 for q)
    upper_open: bool = False

    @property
    def fixed(self):
        return isinstance(self.bounds, str)


def hyperparameter_specs(node_program, edge_program, p, p_bounds, q, q_bounds):
    """Every hyperparameter in theta order: vertex-kernel terms, edge-kernel terms, p, q."""
    specs = []
    for owner, program in (("node", node_program), ("edge", edge_program)):
        for g, t, k, col in program.terms():
            prefix = f"{owner}_kernel__" + (f"{col}__" if col is not None else "")
            upper = math.inf if k.upper is None else k.upper
            specs.append(HyperparameterSpec(prefix + k.hyperparameter, owner, (g, t), k.theta, k.bounds, upper))
    specs.append(HyperparameterSpec("p", "p", None, p, p_bounds, math.inf))
    specs.append(HyperparameterSpec("q", "q", None, q, q_bounds, 1.0, upper_open=True))
    return specs


@dataclass
class ProgramTable:
    """Programs back to back: program j is ``code[code_off[j]:code_off[j+1]]`` and likewise params."""

    code: np.ndarray      # int32, never empty (solvers take element 0's address)
    params: np.ndarray    # float64, never empty
    code_off: np.ndarray  # int64 (n + 1,)
    param_off: np.ndarray  # int64 (n + 1,)

    @classmethod
    def of(cls, encoded):
        codes = [c for c, _ in encoded]
        params = [p for _, p in encoded]
        return cls(np.concatenate(codes + [np.zeros(1, np.int32)]).astype(np.int32),
                   np.concatenate(params + [np.zeros(1)]).astype(np.float64),
                   np.cumsum([0] + [len(c) for c in codes], dtype=np.int64),
                   np.cumsum([0] + [len(p) for p in params], dtype=np.int64))

    def __len__(self):
        return len(self.code_off) - 1


class GradientPlan:
    """What the solvers compute per pair for ``eval_gradient=True``, and how it becomes dK/dlog(theta).

    Built per call from the validated settings and the encoded programs of
    :func:`graphkern.mgk.solver_arguments`; ``free`` lists the free hyperparameters in theta
    order.  Attributes the solvers read: ``node_programs`` (a :class:`ProgramTable` of
    vertex-kernel derivative programs), and per edge contraction ``contraction_form``,
    ``contraction_theta``, ``contraction_aux``, ``contraction_slot`` and
    ``contraction_programs`` (the general form's programs; empty ones for shortcuts) and
    ``contraction_free`` (the module docstring: nonzero where the contraction is that factor
    times ``y^T (D V^-1 x - b)``).
    """

    def __init__(self, specs, s, args, widths):
        self.free = [spec for spec in specs if not spec.fixed]
        self.device_terms = {}  # the GPU solvers' GradientTerms arguments, by device, module and type
        for spec in self.free:
            if not spec.value > 0:
                raise ValueError(f"hyperparameter {spec.name} = {spec.value:g} is free, but theta is its logarithm: "
                                 f"give it a positive value or fix it ({spec.name.rsplit('__', 1)[-1]}_bounds='fixed')")
        node_program, edge_program = s["node_program"], s["edge_program"]
        node_slots = node_program.slots(widths["node"])
        node_terms = [spec for spec in self.free if spec.owner == "node"]
        self.node_programs = ProgramTable.of([node_program.derivative(*spec.term).encode(widths["node"], node_slots)
                                              for spec in node_terms])
        edge_terms = [spec for spec in self.free if spec.owner == "edge"]
        contractions, uses = _edge_contractions(edge_program, args, [spec.term for spec in edge_terms],
                                                widths["edge"])
        self.contraction_form = np.array([c["form"] for c in contractions], dtype=np.int32)
        self.contraction_theta = np.array([c.get("theta", 0.0) for c in contractions], dtype=np.float64)
        self.contraction_aux = np.array([c.get("aux", 0.0) for c in contractions], dtype=np.float64)
        self.contraction_slot = np.array([c.get("slot", 0) for c in contractions], dtype=np.int32)
        self.contraction_programs = ProgramTable.of(
            [(c.get("code", np.zeros(0, np.int32)), c.get("params", np.zeros(0))) for c in contractions])
        self.contraction_free = np.array([c.get("free", 0.0) for c in contractions], dtype=np.float64)

        n_node = len(node_terms)
        self.n_raw = n_node + 1 + len(contractions)
        self.combine = np.zeros((self.n_raw, len(self.free)))
        self.p_column = None
        node_k = edge_k = 0
        for j, spec in enumerate(self.free):
            if spec.owner == "node":
                self.combine[node_k, j] = 1.0
                node_k += 1
            elif spec.owner == "q":
                self.combine[n_node, j] = 1.0
            elif spec.owner == "edge":
                c, multiplier = uses[edge_k]
                self.combine[n_node + 1 + c, j] = multiplier
                edge_k += 1
            else:
                self.p_column = j
        self.values = np.array([spec.value for spec in self.free], dtype=np.float64)
        self.p = s["p"]

    @property
    def n_free(self):
        return len(self.free)

    @property
    def n_contractions(self):
        return len(self.contraction_form)

    def derivatives(self, K, raw):
        """``dK/dlog(theta)`` of each pair, shape ``(m, n_free)``, from K and the raw columns."""
        dK = np.asarray(raw, dtype=np.float64) @ self.combine
        if self.p_column is not None:
            dK[:, self.p_column] = 2.0 * np.asarray(K, dtype=np.float64) / self.p
        return dK * self.values


def _edge_contractions(edge_program, args, free_terms, widths):
    """The distinct edge contractions and, per free edge term, ``(contraction index, multiplier)``."""
    contractions, index, uses = [], {}, []

    def contraction(key, **kw):
        if key not in index:
            index[key] = len(contractions)
            contractions.append(kw)
        return index[key]

    form = args["form_name"]
    slot = args["ek_slot"]
    # the base contraction is the full one over kappa = scale * base (module docstring)
    base_free = 1.0 / args["ek_scale"] if args["ek_scale"] != 0 else 0.0
    if form == "constant":
        # every term is a Constant: d(kappa)/dc = (product of the other factors of its group)
        for g, t in free_terms:
            weight, terms = edge_program.groups[g]
            uses.append((contraction("base", form=EDGE_FORMS["constant"], free=base_free),
                         weight * _other_factors(terms, t)))
    elif form in ("kronecker", "sqexp"):
        # kappa = scale * base(labeled term), scale = weight * product of the Constants
        weight, terms = edge_program.groups[0]
        labeled = next(i for i, (k, _) in enumerate(terms) if k.transform is not None)
        scale = weight * _other_factors(terms, labeled)
        for g, t in free_terms:
            if t != labeled:
                base = contraction("base", form=EDGE_FORMS[form], theta=args["ek_theta"], aux=args["ek_aux"],
                                   slot=slot, free=base_free)
                uses.append((base, weight * _other_factors(terms, t)))
            elif form == "kronecker":
                uses.append((contraction("derivative", form=EDGE_FORMS["kronecker_derivative"], slot=slot), scale))
            else:  # d/dl of exp(aux d^2) is exp(aux d^2) d^2 / l^3
                uses.append((contraction("derivative", form=EDGE_FORMS["sqexp_derivative"], aux=args["ek_aux"],
                                         slot=slot), scale / terms[labeled][0].theta ** 3))
    else:
        slots = edge_program.slots(widths)
        for g, t in free_terms:
            code, params = edge_program.derivative(g, t).encode(widths, slots)
            # one product group: a Constant term c (> 0, being free) gives dkappa/dc = kappa / c
            k = edge_program.groups[g][1][t][0]
            free = 1.0 / k.theta if len(edge_program.groups) == 1 and k.transform is None else 0.0
            uses.append((contraction((g, t), form=EDGE_FORMS["general"], code=code, params=params, free=free), 1.0))
    return contractions, uses


def _other_factors(terms, skip):
    """The product of the Constant terms' values other than term ``skip`` (labeled terms excluded)."""
    out = 1.0
    for i, (k, _) in enumerate(terms):
        if i != skip and k.transform is None:
            out *= k.theta
    return out


def finite_difference_steps(spec, step):
    """Log-scale offsets for the derivative of one hyperparameter: central where both sides are
    valid, else one-sided backward (second order), as ``[(offset, weight), ...]`` over ``2 step``."""
    if spec.value * math.exp(step) < spec.upper or (not spec.upper_open and spec.value * math.exp(step) == spec.upper):
        return [(step, 1.0), (-step, -1.0)]
    return [(0.0, 3.0), (-step, -4.0), (-2 * step, 1.0)]
