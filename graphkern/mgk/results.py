"""What every MGK solver returns and reads: the per-pair result, the call's statistics, the solver arguments.

The engines (cpu, core, csr, gemm, tiled) and the router import this module; the public kernel
(graphkern.mgk.kernel) shapes their results.  Nothing here imports a solver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["MGKInfo", "Solved", "gradient_result", "empty_result", "merge_parts", "Merged", "solver_arguments",
           "EDGE_FORM_CODES"]

#: the edge-kernel forms the device solvers specialize on (their entry points' ``_<form>`` suffix)
EDGE_FORM_CODES = {"general": 0, "constant": 1, "kronecker": 2, "sqexp": 3}


@dataclass
class MGKInfo:
    """What the last call solved: one row per pair (indices into its two graph lists).

    ``solvers`` counts the pairs each solver ran (``{"gemm": 12, "csr": 300, ...}``) and
    ``options`` records the solver options of the call (:class:`graphkern.mgk.MGKOptions`).
    """

    backend: str
    dtype: np.dtype
    pairs: np.ndarray = field(repr=False)       # (m, 2) int64
    iterations: np.ndarray = field(repr=False)  # (m,) int32
    residuals: np.ndarray = field(repr=False)   # (m,) relative residual ||r|| / ||b||
    graph_sizes: tuple = field(repr=False)      # the vertex counts of both graph lists
    octile_pairs: np.ndarray = field(default=None, repr=False)  # (m,) GPU only: tiles1 * tiles2
    edge_form: str = "general"
    seconds: float = 0.0
    solve_seconds: float = 0.0
    # eval_gradient=True: iterations above count both solves of a pair, these the adjoint's alone
    adjoint_iterations: np.ndarray = field(default=None, repr=False)
    solvers: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    dtype_promoted: bool = False  # eval_gradient=True solved in float64 although dtype was float32

    @property
    def product_sizes(self):
        """``n1 * n2`` of every pair (the size of its product graph)."""
        return self.graph_sizes[0][self.pairs[:, 0]] * self.graph_sizes[1][self.pairs[:, 1]]

    @property
    def total_iterations(self):
        return int(np.sum(self.iterations, dtype=np.int64))


@dataclass
class Solved:
    """One solver's answer for a list of pairs, in the order of that list.

    ``declined``: indices of pairs the solver left for another (not enough device memory for
    its layout); their entries are NaN / -1 and the router gives them to the next solver.
    """

    K: np.ndarray
    iterations: np.ndarray
    residuals: np.ndarray
    nodal: list | None
    octile_pairs: np.ndarray | None
    seconds: float
    gradient: np.ndarray | None = None           # (m, plan.n_raw) raw derivatives (graphkern.mgk.gradient)
    adjoint_iterations: np.ndarray | None = None
    declined: np.ndarray | None = None


def gradient_result(K, iterations, residuals, adjoint_iterations, adjoint_residuals, raw, octile_pairs, seconds,
                    declined=None):
    """A gradient solve as a :class:`Solved`: a pair has converged when both of its solves have."""
    return Solved(K=K, iterations=iterations + adjoint_iterations, residuals=np.maximum(residuals, adjoint_residuals),
                  nodal=None, octile_pairs=octile_pairs, seconds=seconds, gradient=raw,
                  adjoint_iterations=adjoint_iterations, declined=declined)


def empty_result(nodal, octile_pairs=None, n_raw=None):
    """The answer for no pairs (``n_raw``: of a gradient solve with that many raw derivatives)."""
    if n_raw is not None:
        empty = np.zeros(0)
        return gradient_result(empty, np.zeros(0, np.int32), empty, np.zeros(0, np.int32), empty,
                               np.zeros((0, n_raw)), octile_pairs, 0.0)
    return Solved(K=np.zeros(0), iterations=np.zeros(0, np.int32), residuals=np.zeros(0),
                  nodal=[] if nodal else None, octile_pairs=octile_pairs, seconds=0.0)


def solver_arguments(ds1, ds2, s):
    """The encoded programs and the edge-kernel shortcut shared by every solver (computed once per call)."""
    for what, w1, w2 in (("node", ds1.node_widths, ds2.node_widths), ("edge", ds1.edge_widths, ds2.edge_widths)):
        if w1 != w2:
            raise ValueError(f"X and Y disagree on the width of {what} label columns: {w1} vs {w2}")
    node_program, edge_program = s["node_program"], s["edge_program"]
    ncode, nparam = node_program.encode(ds1.node_widths)
    ecode, eparam = edge_program.encode(ds1.edge_widths)
    form = edge_program.edge_form()
    out = dict(ncode=ncode, nparam=nparam, ecode=ecode, eparam=eparam, edge_form=EDGE_FORM_CODES["general"],
               ek_scale=1.0, ek_theta=0.0, ek_aux=0.0, ek_slot=0, form_name="general")
    if form[0] == "constant":
        out.update(edge_form=EDGE_FORM_CODES["constant"], ek_scale=form[1], form_name="constant")
    elif form[0] in ("kronecker", "sqexp"):
        transform = "category" if form[0] == "kronecker" else "raw"
        slot, width = edge_program.slots(ds1.edge_widths)[(form[3], transform)]
        if width == 1:
            out.update(edge_form=EDGE_FORM_CODES[form[0]], ek_scale=form[1],
                       ek_theta=form[2] if form[0] == "kronecker" else 0.0,
                       ek_aux=form[2] if form[0] == "sqexp" else 0.0, ek_slot=slot, form_name=form[0])
    return out


def merge_parts(parts, m, nodal, plan):
    """One answer for ``m`` pairs from the parts ``[(name, pair indices, Solved), ...]`` (``plan``: of a
    gradient solve, else None), pairs no part ran NaN / -1; a part's indices are an index array or a
    slice (a contiguous run of the pairs, copied without a gather), and no two parts share a pair.
    A single part that ran every pair (its indices None or all of them) is returned as it is (with
    its octile statistics)."""
    counts = [len(range(m)[idx]) if isinstance(idx, slice) else (m if idx is None else len(idx))
              for _, idx, _ in parts]
    if len(parts) == 1 and counts[0] == m:
        return parts[0][2]
    # contiguous runs that cover every pair leave nothing to mark as not run
    merged = Merged(m, nodal, plan, covered=all(isinstance(idx, slice) for _, idx, _ in parts) and sum(counts) == m)
    for _, idx, sol in parts:
        merged.place(idx, sol)
    return merged.solved()


class Merged:
    """The arrays of one answer for ``m`` pairs, filled part by part (:meth:`place`, from any thread:
    parts share no pair) and then taken as a :class:`Solved` (:meth:`solved`).  ``covered``: the
    parts will cover every pair, so the arrays start uninitialised instead of NaN / -1."""

    def __init__(self, m, nodal, plan, covered=False):
        def make(shape, dtype, fill):
            return np.empty(shape, dtype) if covered else np.full(shape, fill, dtype)

        self.m = m
        self.K, self.iterations, self.residuals = make(m, np.float64, np.nan), make(m, np.int32, -1), \
            make(m, np.float64, np.nan)
        self.nodal = [None] * m if nodal else None
        self.gradient = None if plan is None else make((m, plan.n_raw), np.float64, np.nan)
        self.adjoint_iterations = None if plan is None else make(m, np.int32, -1)
        self._seconds = []  # appended to: atomic where threads place parts at once

    def place(self, idx, sol):
        """The answer ``sol`` of the pairs ``idx`` (an index array or a slice) at their places."""
        self.K[idx], self.iterations[idx], self.residuals[idx] = sol.K, sol.iterations, sol.residuals
        self._seconds.append(sol.seconds)
        if self.nodal is not None:
            for j, block in zip(range(self.m)[idx] if isinstance(idx, slice) else idx.tolist(), sol.nodal):
                self.nodal[j] = block
        if self.gradient is not None:
            self.gradient[idx], self.adjoint_iterations[idx] = sol.gradient, sol.adjoint_iterations

    def solved(self):
        return Solved(K=self.K, iterations=self.iterations, residuals=self.residuals, nodal=self.nodal,
                      octile_pairs=None, seconds=sum(self._seconds), gradient=self.gradient,
                      adjoint_iterations=self.adjoint_iterations)
