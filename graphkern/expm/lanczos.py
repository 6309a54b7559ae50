"""The Lanczos engine behind graphkern.expm: one driver for the CPU, GPU and multi-GPU solvers.

A solver runs the three-term recurrence on its hardware and keeps the Lanczos vectors
unnormalised, ``w_k = beta_{k-1} q_k`` with ``q_k = rscale_k * w_k`` (``rscale_0 = 1/||x||``,
``rscale_k = 1/beta_{k-1}``), so that normalising never costs a pass over memory.  The host
(:func:`run_lanczos`) owns everything small: at check points it reads ``alpha``, ``beta`` and
``rscale``, takes the eigendecomposition ``T_m = V diag(theta) V^T`` of the tridiagonal matrix and
forms the coefficient vector ``c = V f(beta theta) V^T e_1`` (times ``||x||`` later), then stops
once successive coefficient vectors agree to ``tol``.  The solver finally returns
``sum_j c_j rscale_j w_j``.

Breakdown: a solver sets ``rscale_k = 0`` when ``beta_{k-1} <= breakdown`` (an invariant
subspace: x in a union of eigenspaces, a graph component exhausted); every later vector is then
exactly zero and the host truncates the Krylov space there, which gives the exact answer.

Overflow: ``f(beta theta)`` is evaluated shifted, ``f(z) = exp(shift) * f_shifted(z)`` with
``shift = max(z)`` for exp (``max|z|`` for cosh and sinh), so the coefficients stay finite and the
caller decides whether ``exp(shift)`` can be applied in the requested dtype.

Solver interface (see :class:`CpuLanczos` and ``graphkern.expm.gpu.GpuLanczos``)::

    lookahead        True when steps are queued asynchronously (run one check interval ahead)
    start(x, rscale0)  load the start vector (scaled to max |x| = 1, in the solver's dtype; None: ones)
    enqueue(k0, k1)  run (or queue) steps k0 .. k1-1; step k makes alpha_k, beta_k and w_{k+1}
    checkpoint(m)    snapshot alpha[:m], beta[:m-1], rscale[:m] as they stand after step m-1
    fetch(m)         those arrays (float64 copies), waiting for the snapshot
    stop_after(m)    the Krylov dimension is m: queued steps k >= m that have not started may be dropped
    result(m, g, scaling)  ``(y, log_scale)``: y = sum_{j<m} g_j w_j (float64), then scaled and cast
                     as ``scaling`` (an :class:`OutputScaling`) decides from max |y|
    timings()        {"spmv": s, "vector": s, ...} spent on the hardware
    n_spmv           SpMVs performed (including speculative steps that ran and a second pass)

Everything a solver derives from the matrix alone (values in the solver's dtype, row chunks, on the
GPU the device copy and SpMV plans) is cached on the :class:`CsrMatrix`, which graphkern.expm keeps
per user matrix, so a repeated call pays for none of it.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from graphkern._backend import resolve_threads

# Rounding alone leaves a residual of a few hundred ulps of ||A|| when x lies in an invariant subspace.
BREAKDOWN_ULPS = 256
# Columns per allocation of a stored basis.
COLUMN_CHUNK = 16
# A weighted matrix whose largest entry is outside [2^-SAFE_EXPONENT, 2^SAFE_EXPONENT] is solved as
# scale * A (scale a power of two, exact) with beta / scale: the squared norms of the Lanczos vectors
# of a matrix with entries near 1e155 overflow float64, and float32 holds even less.
SAFE_EXPONENT = 40


# ----------------------------------------------------------------------------- the matrix

class CsrMatrix:
    """A validated symmetric CSR matrix: ``indptr`` (int32/int64), ``indices`` (int32), ``weights``
    (float64, or None when every stored entry is 1), with what solvers derive from it cached:
    ``||scale A||_inf``, degree statistics, values per dtype, row chunks, and ``gpu`` (device copies,
    keyed by device tuple; see graphkern.expm.gpu).

    ``scale`` (a power of two, 1.0 unless the largest entry is huge or tiny, see SAFE_EXPONENT):
    the solvers run on ``scale * A`` -- :meth:`values_as` and :meth:`inf_norm` are of that matrix --
    with ``beta / scale``, so that no norm overflows or underflows."""

    __slots__ = ("indptr", "indices", "weights", "n", "scale", "magnitudes", "_anorm", "_degree_stats", "_values",
                 "_chunks", "gpu", "pending_check", "__weakref__")

    def __init__(self, indptr, indices, weights, magnitudes=None, pending_check=None):
        """``magnitudes``: ``(smallest nonzero |w|, largest |w|)`` of ``weights`` where the caller
        has them (graphkern._cpu.expm.magnitude_range), else computed here.  ``pending_check``: the
        host check of the column indices (it raises ValueError naming the entry) where it was left
        to the device after the upload (graphkern._cuda.csr_check); see :meth:`require_checked`."""
        self.pending_check = pending_check
        self.indptr = indptr
        self.indices = indices
        self.weights = weights
        self.n = len(indptr) - 1
        self.scale = 1.0
        self.magnitudes = (1.0, 1.0) if self.nnz else (math.inf, 0.0)
        if weights is not None:
            if magnitudes is None:
                from graphkern._cpu import expm as cpu
                magnitudes = cpu.magnitude_range(weights, 1)
            self.magnitudes = magnitudes
            peak = magnitudes[1]
            exponent = math.frexp(peak)[1] if peak > 0.0 else 0
            if abs(exponent) > SAFE_EXPONENT:
                self.scale = math.ldexp(1.0, -exponent)
        self._anorm = None
        self._degree_stats = None
        self._values = {}
        self._chunks = {}
        self.gpu = {}

    def require_checked(self):
        """Run the pending host check of the column indices (before host code reads them, or where
        the device check found a problem: it raises ValueError naming the entry)."""
        if self.pending_check is not None:
            self.pending_check()
            self.pending_check = None

    @property
    def nnz(self):
        return int(self.indptr[-1]) if self.n >= 0 else 0

    @property
    def weighted(self):
        return self.weights is not None

    def degree_stats(self):
        """(mean, max, coefficient of variation) of the stored entries per row."""
        if self._degree_stats is None:
            if self.n <= 0:
                self._degree_stats = (0.0, 0, 0.0)
            else:
                from graphkern._cpu import expm as cpu
                total, squares, top = cpu.degree_moments(np.ascontiguousarray(self.indptr), resolve_threads(None))
                mean = total / self.n
                spread = math.sqrt(max(squares / self.n - mean * mean, 0.0))
                self._degree_stats = (mean, top, spread / mean if mean > 0 else 0.0)
        return self._degree_stats

    def values_as(self, dtype):
        """The stored values of ``scale * A`` in ``dtype`` (an empty array when unweighted), converted once."""
        dtype = np.dtype(dtype)
        values = self._values.get(dtype)
        if values is None:
            if self.weights is None:
                values = np.empty(0, dtype=dtype)
            elif self.scale != 1.0:
                values = (self.weights * self.scale).astype(dtype)
            else:
                values = np.ascontiguousarray(self.weights, dtype=dtype)
            self._values[dtype] = values
        return values

    def chunks(self, parts):
        """:func:`row_chunks` of this matrix into ``parts`` parts, computed once."""
        bounds = self._chunks.get(parts)
        if bounds is None:
            bounds = self._chunks[parts] = row_chunks(self.indptr, parts)
        return bounds

    def inf_norm(self, n_threads):
        """``||scale A||_inf`` (max absolute row sum), an upper bound of its spectral radius."""
        if self._anorm is None:
            if self.n == 0:
                self._anorm = 0.0
            elif self.weights is None:
                self._anorm = float(self.degree_stats()[1])
            else:
                from graphkern._cpu import expm as cpu
                self._anorm = cpu.max_abs_row_sum(self.indptr, self.weights, self.scale, self.chunks(n_threads),
                                                  n_threads)
        return self._anorm


def dealt_bounds(n, parts):
    """The first row of each of ``parts`` blocks (and n) when n rows are dealt round robin to them."""
    counts = [len(range(p, n, parts)) for p in range(parts)]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def breakdown_threshold(anorm, dtype, tol, beta, fn):
    """The beta_k below which the Krylov space is taken as invariant and the run stops, exact.

    At least BREAKDOWN_ULPS ulps of ||A||_inf (rounding noise).  For exp, cosh and sinh, dropping a
    coupling delta changes f(beta T) e_1 by about |beta| delta relative to the answer, so any delta
    below ``tol / 100`` of that is accepted as well: near-degenerate eigenvalues, which leave more
    rounding noise, still end the run where they should.
    """
    threshold = BREAKDOWN_ULPS * float(np.finfo(dtype).eps) * anorm
    if fn.scalable:
        threshold = max(threshold, 0.01 * tol * anorm / max(1.0, abs(beta) * anorm))
    return threshold


def row_chunks(indptr, parts):
    """``parts + 1`` row boundaries splitting the rows so that each part has about the same
    ``nonzeros + rows`` (the cost of an SpMV pass); parts may be empty when rows are few."""
    n = len(indptr) - 1
    parts = max(1, int(parts))
    if n <= 0:
        return np.zeros(parts + 1, dtype=np.int64)
    cost = indptr[:-1].astype(np.int64) + np.arange(n, dtype=np.int64)
    total = int(indptr[-1]) + n
    targets = (np.arange(1, parts, dtype=np.int64) * total) // parts
    inner = np.searchsorted(cost, targets, side="left")
    return np.concatenate([[0], inner, [n]]).astype(np.int64)


def even_chunks(n, parts):
    """``parts + 1`` boundaries splitting ``range(n)`` into equal pieces."""
    parts = max(1, int(parts))
    return (np.arange(parts + 1, dtype=np.int64) * n) // parts


# ----------------------------------------------------------------------------- the function

class MatrixFunction:
    """f applied to the eigenvalues ``z = beta * theta`` of ``beta T``, evaluated shifted.

    ``name`` is "exp", "cosh", "sinh" or "callable".  :meth:`shifted` returns ``(values, shift)``
    with ``f(z) = exp(shift) * values``; the named functions are shifted so that the values are
    at most 1 in magnitude (hence the result can be returned scaled instead of overflowing);
    a callable is evaluated as given (shift 0).
    """

    NAMED = ("exp", "cosh", "sinh")

    def __init__(self, f):
        if isinstance(f, str):
            if f not in self.NAMED:
                raise ValueError(f"f must be one of {', '.join(map(repr, self.NAMED))} or a callable; got {f!r}")
            self.name, self.func = f, None
        elif callable(f):
            self.name, self.func = "callable", f
        else:
            raise TypeError(f"f must be 'exp', 'cosh', 'sinh' or a callable, got {type(f).__name__}")

    @property
    def scalable(self):
        return self.func is None

    def shifted(self, z):
        if self.name == "exp":
            shift = float(z.max())
            return np.exp(z - shift), shift
        if self.name in ("cosh", "sinh"):
            shift = float(np.abs(z).max())
            up, down = np.exp(z - shift), np.exp(-z - shift)
            if self.name == "cosh":
                return (up + down) / 2.0, shift
            values = (up - down) / 2.0
            # the difference cancels for small |z| (sinh(1e-20) would come out 0): sinh itself there
            small = np.abs(z) < 1.0
            values[small] = np.sinh(z[small]) * math.exp(-shift)
            return values, shift
        with np.errstate(all="ignore"):
            values = np.asarray(self.func(z.copy()), dtype=np.float64)
        if values.shape != z.shape:
            raise ValueError(f"f must return one value per eigenvalue: called with shape {z.shape}, "
                             f"it returned shape {values.shape}")
        if np.isnan(values).any():
            bad = z[np.isnan(values)][0]
            raise ValueError(f"f returned NaN at the eigenvalue {bad!r} of beta*T (f must be defined and finite on "
                             "the spectrum of beta*A)")
        if np.isinf(values).any():
            bad = z[np.isinf(values)][0]
            raise FloatingPointError(f"f overflows float64 at the eigenvalue {bad!r} of beta*T; a callable f gets no "
                                     "log scaling -- use f='exp' (scaled answers) or a smaller beta")
        return values, 0.0


# T's couplings below GRADED_COUPLING of its largest entry, with f spreading its values over more
# than GRADED_SPREAD in the exponent or the answer below GRADED_SMALL of f's largest value:
# f(beta T) e_1 also from the matrix exponential, where |beta| ||T|| is at most GRADED_NORM
# (squaring multiplies the relative rounding of the scaled exponential by about that norm:
# 2^16 * 2^-53, under 1e-11)
GRADED_COUPLING = 2.0 ** -26
GRADED_SPREAD = 10.0
GRADED_NORM = 2.0 ** 16
GRADED_SMALL = 1e-6
GRADED_AGREEMENT = 1e-10
EIGENVECTOR_ERROR = 1e-14


def krylov_coefficients(alpha, beta_off, beta, fn):
    """``(c, shift, theta)`` with ``f(beta T) e_1 = exp(shift) * c`` for the tridiagonal
    ``T = tridiag(beta_off, alpha, beta_off)`` with eigenvalues ``theta``.

    From the eigenvectors, whose entries are accurate to rounding of the largest: where T holds a
    coupling far below its other entries, an eigenvector's first entry can be the product of such
    couplings (1e-60, say), computed as noise, while f lifts its eigenvalue by e^500 above the rest,
    or while the whole answer lies that far below f's values; there the named functions are also
    evaluated by :func:`_exp_e1`, which keeps small entries, and its entries replace the
    eigenvectors' where the two disagree beyond their errors."""
    m = len(alpha)
    if m == 1:
        theta, vectors = alpha.copy(), np.ones((1, 1))
    else:
        # stev (QR) is quicker for the small matrices of most runs, stemr for the large ones
        driver = "stev" if m <= 64 else "stemr"
        theta, vectors = scipy.linalg.eigh_tridiagonal(alpha, beta_off, lapack_driver=driver)
    z = beta * theta
    values, shift = fn.shifted(z)
    c = vectors @ (values * vectors[0])
    if m > 1 and fn.scalable:
        top = max(float(np.abs(alpha).max()), float(beta_off.max()))
        spread = float(z.max() - z.min()) if fn.name == "exp" else float(np.abs(z).max() - np.abs(z).min())
        # the eigenvectors' answer is accurate to rounding of the largest f value: it fails where f
        # lifts a small entry far above the rest, or where the whole answer is far below that value
        reach = spread > GRADED_SPREAD or np.abs(c).max() < GRADED_SMALL * np.abs(values).max()
        if float(beta_off.min()) < GRADED_COUPLING * top and reach and abs(beta) * 3 * top <= GRADED_NORM:
            if fn.name == "exp":
                exact = _exp_e1(alpha, beta_off, beta, shift)
                size = np.abs(exact)
            elif abs(beta) * _tridiagonal_inf_norm(alpha, beta_off) <= 1.0:
                exact, size = _series_e1(alpha, beta_off, beta, fn.name == "sinh", shift)
            else:  # a half sum or difference, which can cancel where its terms are alike
                up, down = _exp_e1(alpha, beta_off, beta, shift), _exp_e1(alpha, beta_off, -beta, shift)
                exact = ((up + down) if fn.name == "cosh" else (up - down)) / 2.0
                size = (np.abs(up) + np.abs(down)) / 2.0
            # each entry from the exponential where the two disagree beyond both one's error (relative
            # to its terms) and the eigenvectors' (relative to the largest entry): the latter lost it
            lost = np.abs(c - exact) > GRADED_AGREEMENT * size + EIGENVECTOR_ERROR * np.abs(c).max()
            if lost.any():
                c = np.where(lost, exact, c)
    return c, shift, theta


def _tridiagonal_inf_norm(alpha, beta_off):
    """||T||_inf of ``tridiag(beta_off, alpha, beta_off)``."""
    rows = np.abs(alpha).copy()
    rows[:-1] += beta_off
    rows[1:] += beta_off
    return float(rows.max())


def _series_e1(alpha, beta_off, s, odd, shift):
    """``(sinh or cosh(s T) e_1 * e^-shift, the sums of its terms' magnitudes)`` for
    ``|s| ||T||_inf <= 1`` by the series of the odd (sinh) or even (cosh) powers of s T applied to
    e_1: each entry is its own sum of products of T's entries, so an entry far below the others keeps
    its relative accuracy, where exp(s T) - exp(-s T) would leave it rounding of the exponentials'
    entries near 1.  Entry i is first reached by the power i; past it every term is at most
    1 / (k + 1) of the one before, so m + 40 powers reach float64's rounding of every entry."""
    m = len(alpha)

    def times(v, a, b):  # (s T) v for the tridiagonal (a, b) scaled by s
        out = a * v
        out[:-1] += b * v[1:]
        out[1:] += b * v[:-1]
        return out

    a, b = s * alpha, s * beta_off
    term, bound = np.zeros(m), np.zeros(m)
    term[0] = bound[0] = 1.0
    total, size = np.zeros(m), np.zeros(m)
    if not odd:
        total[0] = size[0] = 1.0
    with np.errstate(under="ignore"):
        for k in range(1, m + 41):
            term = times(term, a, b) / k
            bound = times(bound, np.abs(a), np.abs(b)) / k
            if k % 2 == int(odd):
                total += term
                size += bound
    factor = math.exp(-shift)
    return total * factor, size * factor


def _exp_e1(alpha, beta_off, s, shift):
    """``exp(s T - shift) e_1`` by scaling and squaring (scipy.linalg.expm) of a matrix with
    non-negative off-diagonal entries: ``s T`` itself for s >= 0 (the Lanczos couplings are
    norms), else ``s D T D`` with D = diag(1, -1, 1, ...), which is T up to the signs of its
    couplings (exp(s T) = D exp(s D T D) D).  Sums of products of non-negative couplings lose no
    small entry to cancellation, so each entry keeps its own relative accuracy."""
    sign = 1.0 if s >= 0 else -1.0
    M = np.diag(s * alpha - shift) + np.diag(sign * s * beta_off, 1) + np.diag(sign * s * beta_off, -1)
    column = scipy.linalg.expm(M)[:, 0].copy()
    if s < 0:
        column[1::2] = -column[1::2]
    return column


def relative_change(c, shift, prev, prev_shift):
    """``||c e^shift - prev e^prev_shift|| / ||c e^shift||`` with ``prev`` padded with zeros."""
    padded = np.zeros_like(c)
    factor = math.exp(min(prev_shift - shift, 700.0))
    padded[:len(prev)] = prev * factor
    norm = float(np.linalg.norm(c))
    diff = float(np.linalg.norm(c - padded))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


@dataclass
class LanczosOutcome:
    """What :func:`run_lanczos` found: ``f(beta A) x_unit = exp(shift) * sum_{j<m} g_j w_j`` where
    ``x_unit`` is the start vector the solver was given and w_j its (unnormalised) Lanczos vectors."""

    g: np.ndarray
    shift: float
    theta_max: float
    krylov_dim: int
    error_estimate: float
    converged: bool
    breakdown: bool
    host_seconds: float
    rho: float = 0.0  # max |theta|: the Ritz values resolve each other to about eps * rho only


class HostSolver:
    """The solver interface's check points for solvers that run each step when it is enqueued and
    keep ``alpha``, ``beta``, ``rscale`` and the seconds ``_t`` in host memory: no step is ever
    ahead of the host, so there is nothing to snapshot, wait for or drop."""

    lookahead = False
    setup_times = {}

    def checkpoint(self, m):
        pass

    def fetch(self, m):
        return self.alpha[:m].copy(), self.beta[:max(m - 1, 0)].copy(), self.rscale[:m].copy()

    def stop_after(self, m):
        pass

    def timings(self):
        return dict(self._t)


def run_lanczos(solver, fn, beta, *, tol, max_krylov, check_every, progress=None):
    """Drive ``solver`` until the coefficients converge, break down, or ``max_krylov`` steps are
    done (past A's dimension, only while the estimate has not converged: finite precision loses
    the Lanczos vectors' orthogonality, so m = n is not exact in itself); ``progress`` (a
    graphkern._progress.Progress) counts the steps checked."""
    host = 0.0
    check = min(check_every, max_krylov)
    solver.enqueue(0, check)
    solver.checkpoint(check)
    prev = prev_shift = None
    error = math.inf
    converged = breakdown = False
    while True:
        # check intervals grow with m so that the O(m^2) host work stays small next to the SpMVs
        nxt = min(check + max(check_every, check // 8), max_krylov)
        if solver.lookahead and nxt > check:
            solver.enqueue(check, nxt)
            solver.checkpoint(nxt)
        alpha, beta_off, rscale = solver.fetch(check)
        if progress is not None:
            progress.update(check - progress.done)
        t0 = time.perf_counter()
        zero = np.flatnonzero(rscale[1:check] == 0.0)
        m = int(zero[0]) + 1 if zero.size else check
        alpha, beta_off, rscale = alpha[:m], beta_off[:m - 1], rscale[:m]
        if not (np.all(np.isfinite(alpha)) and np.all(np.isfinite(beta_off))):
            raise FloatingPointError(
                "the Lanczos recurrence produced a non-finite coefficient (the matrix or x has values "
                "too large for the requested dtype); use dtype=np.float64 or rescale A")
        c, shift, theta = krylov_coefficients(alpha, beta_off, beta, fn)
        if m < check:
            breakdown = converged = True
            error = 0.0 if prev is None else min(error, relative_change(c, shift, prev, prev_shift))
        elif prev is not None:
            error = relative_change(c, shift, prev, prev_shift)
            converged = error <= tol
        host += time.perf_counter() - t0
        if converged or check >= max_krylov:
            break
        if not solver.lookahead:
            solver.enqueue(check, nxt)
            solver.checkpoint(nxt)
        prev, prev_shift = c, shift
        check = nxt
    solver.stop_after(m)
    return LanczosOutcome(c * rscale, shift, float(theta.max()), m, error, converged, breakdown, host,
                          float(np.abs(theta).max()))


# ----------------------------------------------------------------------------- the answer's scale

# The answer's scale is applied in factors of at most e^600 (each finite in float64), as few as needed.
_FACTOR_STEP = 600.0
# Below this log factor every finite float64 scaled to it underflows to zero (log(max) + 745 < 1465).
_LOG_FACTOR_FLOOR = -1465.0


class OutputScaling:
    """How ``y_scaled * exp(shift + rest)`` is returned finite in ``dtype`` (see graphkern.expm: Overflow).

    :meth:`decide` takes ``peak = max |y_scaled|`` and returns ``(log_factor, log_scale, ok)``: y is
    ``y_scaled * exp(log_factor)`` cast to dtype and the true answer is ``y * exp(log_scale)``;
    ``ok`` is False when y would have a non-finite entry (then :meth:`error` says where).  A callable
    f gets no log scaling: an answer that overflows raises FloatingPointError at once.
    """

    def __init__(self, shift, rest, dtype, scalable, caller):
        self.shift, self.rest = float(shift), float(rest)
        self.dtype = np.dtype(dtype)
        self.scalable = scalable
        self.caller = caller

    def decide(self, peak):
        if peak == 0.0:
            return 0.0, 0.0, True
        if not math.isfinite(peak):
            return 0.0, 0.0, False
        log_max = math.log(float(np.finfo(self.dtype).max))
        limit = log_max - 1.0
        log_peak = math.log(peak)
        shift, rest = self.shift, self.rest
        total = log_peak + shift + rest
        if total < math.log(float(np.finfo(self.dtype).tiny)):
            # the whole answer underflows: scaled to a largest entry of 1 (a callable f: as it is, warned)
            if self.scalable:
                return -log_peak, total, True
            warnings.warn(f"{self.caller}: the result underflows {self.dtype.name} (its largest entry is about "
                          f"e^{total:.1f}); a callable f gets no log scaling, so its entries are zero or "
                          "subnormal", RuntimeWarning, stacklevel=5)
        if total < limit:
            log_factor, log_scale = shift + rest, 0.0
        elif not self.scalable:
            raise FloatingPointError(
                f"{self.caller}: the result overflows {self.dtype.name} (its largest entry is about "
                f"e^{log_peak + shift + rest:.1f}); a callable f gets no log scaling -- use dtype=np.float64 "
                "or a smaller beta")
        elif log_peak + rest < limit:
            log_factor, log_scale = rest, shift
        else:
            log_factor, log_scale = 0.0, shift + rest
        return max(log_factor, _LOG_FACTOR_FLOOR), log_scale, log_peak + log_factor < log_max

    @staticmethod
    def factors(log_factor):
        """Three finite float64 factors whose product, applied left to right, is ``exp(log_factor)``."""
        steps = []
        while abs(log_factor) > _FACTOR_STEP:
            step = math.copysign(_FACTOR_STEP, log_factor)
            steps.append(math.exp(step))
            log_factor -= step
        if len(steps) > 2:  # pragma: no cover - decide() keeps |log_factor| below 3 steps
            raise AssertionError(f"log factor {log_factor} needs {len(steps) + 1} steps")
        return [1.0] * (2 - len(steps)) + steps + [math.exp(log_factor)]

    def error(self, y_scaled, log_factor):
        """The FloatingPointError for a y_scaled (float64, host) whose result is not finite."""
        y = y_scaled.copy()
        with np.errstate(over="ignore", invalid="ignore"):
            for f in self.factors(log_factor):
                y *= f
            y = y.astype(self.dtype)
        bad = np.flatnonzero(~np.isfinite(y))
        where = f"first at index {int(bad[0])}" if bad.size else "overflow"
        return FloatingPointError(
            f"{self.caller}: the {self.dtype.name} result has non-finite entries ({where}); the matrix values "
            "or x are too large for this dtype")


def finish_on_host(y, scaling):
    """``(y * exp(log_factor) in the output dtype, log_scale)`` for a float64 host y (modified in place)."""
    peak = float(np.maximum(y.max(), -y.min())) if y.size else 0.0
    log_factor, log_scale, ok = scaling.decide(peak)
    if not ok:
        raise scaling.error(y, log_factor)
    for f in scaling.factors(log_factor):
        if f != 1.0:
            y *= f
    return y.astype(scaling.dtype, copy=False), log_scale
