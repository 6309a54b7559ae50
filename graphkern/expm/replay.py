"""What a Lanczos run may have dropped -- the residual of a breakdown before n steps, couplings below
the norms' floor -- told on the host.

A run stops where beta_k falls under a rounding-level threshold of ||A||.  Inside one connected
component that residual may instead be a real coupling far below ||A|| that f lifts into the answer
(sinh, whose value on the space found is sinh(0) = 0; exp or cosh lifting it by up to
e^{|beta| ||A||}).  :func:`breakdown_residual` replays the run in float64 and tells three cases
apart: rounding noise (the run is kept), a coupling the solvers can go on through, and one they
cannot hold.  The solvers run on ``scale * A`` (largest entry about 1) and sum the squares of their
vectors' entries unscaled, in float64 (CPU and GPU alike, float32 vectors included): below about
sqrt(tiny) of the largest entry that sum loses its digits and then becomes an exact zero, and float32
vectors lose entries below float32's tiny themselves.  No rescaling of A helps: the ratio of the
entries is what underflows.  Such a coupling is reported only where it can change the answer by more
than the tolerance, bounded by :func:`dropped_share`.  A run need not break down to lose one: where
|beta| ||A|| lowers the breakdown threshold it goes on, its vectors' share along the coupling lost;
:func:`small_entries_share` bounds what every coupling below the floor can add, in any run.
"""

import math
import time

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.special import logsumexp

from graphkern.expm.lanczos import HostSolver, finish_on_host

# The replay's work limit (operations), and how far above its own rounding bound a residual entry
# must stand to count as a real coupling.
REPLAY_WORK = 1e7
NOISE_RATIO = 64
# Reorthogonalisation passes of one step at most: each leaves about eps of the last projection, and
# graded entries (a coupling 1e-300 of a step's diagonal) need one per 16 decades.
MAX_REORTHOGONALISATIONS = 24
# The replay's ||A||: couplings down to about 1e-580 of the largest entry stay normal numbers.
REPLAY_EXPONENT = 900
# Points of [0, 1] at which the bound of :func:`dropped_share` is taken, and the most terms of its
# series (about 2 |beta| ||A||; beyond, no bound is given and a dropped coupling is taken to matter).
SHARE_GRID = 64
SHARE_TERMS = 4096
NOISE, COUPLING, UNDERFLOW = "noise", "coupling", "underflow"


def norm_floor(dtype):
    """The smallest residual norm, relative to the largest |a_ij|, that the solvers can go on through:
    the square root of float64's smallest normal number, or float32's smallest normal number for
    float32 vectors (their entries underflow first)."""
    return max(math.sqrt(float(np.finfo(np.float64).tiny)), float(np.finfo(dtype).tiny))


def held_floor(dtype, limit):
    """The smallest coupling, relative to the largest |a_ij|, whose share of a Lanczos vector the solvers
    keep to ``limit`` (relative): below :func:`norm_floor` a float64 square is subnormal, with
    log2(r^2 / smallest subnormal) bits left, and a float32 entry keeps log2(r / its smallest subnormal)."""
    floor = math.sqrt(float(np.finfo(np.float64).smallest_subnormal) / limit)
    if np.dtype(dtype) == np.float32:
        floor = max(floor, float(np.finfo(np.float32).smallest_subnormal) / limit)
    return min(floor, norm_floor(dtype))


def breakdown_residual(mat, x_unit, m, dtype, fn, beta):
    """``(kind, share)``: what the Lanczos residual at step ``m`` of a run on ``mat`` (scale * A, as the
    solvers see it, with ``beta`` of those units) is -- NOISE (rounding noise of an invariant subspace,
    or not replayed), COUPLING (a real coupling the solvers can go on through) or UNDERFLOW (a real
    coupling below :func:`norm_floor`, which they cannot) -- and for UNDERFLOW, :func:`dropped_share`:
    the logs of a bound on what it can add to the answer and of the answer, for a unit x (else None).

    The run is replayed in float64 with full reorthogonalisation, on A scaled to a norm near
    2^REPLAY_EXPONENT and with norms taken as max|w| ||w / max|w|||, so that neither a tiny coupling
    nor its square underflows.  The residual is compared entry by entry with its own rounding bound,
    ``(deg_i + 4) eps (|A| |v| + |alpha| |v| + beta |v_prev|)_i``: an invariant subspace leaves only
    noise; a coupling of 1e-24 ||A|| stands far above it.  NOISE where the replay would cost more than
    REPLAY_WORK operations (the run is then kept as it is)."""
    n = mat.n
    if m < 1 or m * (mat.nnz + m * n) > REPLAY_WORK:
        return NOISE, None
    # up: the replay's units over the solvers'; ldexp scales A's own weights exactly, without the 2^k
    # of a huge or tiny A overflowing on the way
    shift = 0 if mat.weights is None else REPLAY_EXPONENT - math.frexp(mat.inf_norm(1))[1]
    up = math.ldexp(1.0, shift)
    values = np.ones(mat.nnz) if mat.weights is None else np.ldexp(mat.weights, shift + math.frexp(mat.scale)[1] - 1)
    A = sp.csr_matrix((values, mat.indices, mat.indptr), shape=(n, n))
    absolute = abs(A)
    slack = _slack(mat)
    v = np.ones(n) if x_unit is None else np.asarray(x_unit, dtype=np.float64)
    v = v / np.linalg.norm(v)
    basis, alphas, betas, v_prev, beta_prev = [v], [], [], np.zeros(n), 0.0
    for step in range(m):
        u = A @ v
        alphas.append(float(v @ u))
        w = u - alphas[-1] * v - beta_prev * v_prev
        noise = _rounding_bound(absolute, slack, v, alphas[-1], v_prev, beta_prev)
        Q = np.array(basis)
        for _ in range(2):
            w -= Q.T @ (Q @ w)
        norm = _norm(w)
        if norm == 0.0:  # an exact invariant subspace
            return NOISE, None
        if step == m - 1:
            if not np.any(np.abs(w) > NOISE_RATIO * noise):
                return NOISE, None
            if norm >= norm_floor(dtype) * up:
                return COUPLING, None
            return UNDERFLOW, dropped_share(A, w, beta / up, fn, np.array(alphas), np.array(betas))
        betas.append(norm)
        v_prev, v, beta_prev = v, w / norm, norm
        basis.append(v)
    return NOISE, None


def _slack(mat):
    """Per row, the rounding of one Lanczos step's entry in units of its terms: (deg_i + 4) eps."""
    return (np.diff(mat.indptr) + 4) * float(np.finfo(np.float64).eps)


def _rounding_bound(absolute, slack, v, alpha, v_prev, beta_prev):
    """The residual's entry-by-entry rounding bound of the step from ``v``:
    ``slack_i (|A| |v| + |alpha| |v| + beta_prev |v_prev|)_i``."""
    return slack * (absolute @ np.abs(v) + abs(alpha) * np.abs(v) + beta_prev * np.abs(v_prev))


def _norm(v):
    """||v||, scaled by max |v| so that no square underflows."""
    peak = float(np.abs(v).max())
    return peak * float(np.linalg.norm(v / peak)) if peak > 0.0 else 0.0


def dropped_share(A, r, beta, fn, alpha, off):
    """``(log E, log Y)``: of a bound E on ``||f(beta A) q_1 - Q_m f(beta T_m) e_1||``, how much the
    residual ``r`` (A Q_m = Q_m T_m + r e_m^T, T_m with diagonal ``alpha`` and off-diagonal ``off``)
    that a run dropped can change its answer, and of that answer's norm ``Y = ||f(beta T_m) e_1||``.
    E is inf where it cannot be bounded (see :func:`_lifted`), and for a callable f.

    For exp, ``E = beta int_0^1 exp((1 - s) beta A) r e_m^T exp(s beta T_m) e_1 ds``; cosh and sinh are
    half sums of two such terms, for beta and -beta; ``|e_m^T exp(s beta T_m) e_1| <= sum_j |V_mj V_1j|
    e^{s z_j}``."""
    theta, V = scipy.linalg.eigh_tridiagonal(alpha, off) if len(alpha) > 1 else (alpha, np.ones((1, 1)))
    values, shift = fn.shifted(beta * theta)
    size = _norm(V @ (values * V[0]))
    answer = math.log(size) + shift if size > 0.0 else -math.inf
    u = np.abs(r)
    peak = _norm(u)
    with np.errstate(divide="ignore"):
        log_w = np.log(np.abs(V[-1] * V[0]))[None, :]
    return _lifted(A, beta, fn, (u / peak)[:, None], np.array([math.log(peak)]), theta, log_w), answer


def _lifted(A, beta, fn, R, log_r, theta, log_w):
    """The log of a bound on ``|| beta int_0^1 exp((1 - s) beta A) sum_k r_k g_k(s) ds ||`` (for cosh and
    sinh: of the half sum of it for beta and -beta), where ``|g_k(s)| <= sum_j w_kj e^{s z_j}`` with
    ``z_j = beta theta_j`` (for cosh and sinh ``|beta theta_j|``) and the columns of ``R`` (entries of
    at most 1) times ``e^{log_r}`` bound ``|r_k|``; ``log_w`` holds the logs of w (-inf for none).
    inf where it cannot be bounded within SHARE_TERMS terms and REPLAY_WORK operations, and for a
    callable f.

    Entrywise ``|exp(t beta A)| <= exp(t M)`` with M the diagonal of beta A plus the absolute values of
    its off-diagonal entries (for cosh and sinh, ``|beta| |A|``), and ``exp(t M) |r| <= e^{-t sigma}
    sum_k t^k ||(M + sigma I)^k |r| / k!||``, a series of non-negative terms (sigma makes M + sigma I
    non-negative).  Each factor is bounded on each interval of a grid of [0, 1] by its values at the
    ends.  Nothing is amplified beyond what the coupling graph allows: a residual far from the large
    entries stays small."""
    if fn.name not in ("exp", "cosh", "sinh"):
        return math.inf
    if beta == 0.0 or not R.shape[1]:
        return -math.inf
    diagonal = A.diagonal() * beta
    # for exp the diagonal keeps its sign (a decaying entry lifts nothing); M + sigma I, non-negative:
    kept = diagonal if fn.name == "exp" else np.abs(diagonal)
    sigma = max(0.0, -float(kept.min()))
    M = (abs(A) * abs(beta) + sp.diags(kept - np.abs(diagonal) + sigma)).tocsr()
    reach = float(abs(M).sum(axis=1).max())  # ||M||_2 <= ||M||_inf: the terms halve past 2 reach
    terms = int(2 * reach) + 2
    if terms > SHARE_TERMS or terms * R.shape[1] * (M.nnz + A.shape[0]) > REPLAY_WORK:
        return math.inf
    u = R.copy()
    log_c = [np.asarray(log_r, dtype=np.float64)]
    for k in range(1, terms + 1):
        u = M @ u
        peak = np.abs(u).max(axis=0)
        live = peak > 0.0
        size = np.zeros_like(peak)
        size[live] = peak[live] * np.linalg.norm(u[:, live] / peak[live], axis=0)
        with np.errstate(divide="ignore"):
            log_c.append(log_c[-1] + np.log(size) - math.log(k))
        u[:, live] /= size[live]
        if not live.any():
            break
    log_c = np.array(log_c)  # (terms, columns)
    log_c[-1] += math.log(2.0)  # the tail past the last term is at most that term
    z = beta * theta if fn.name == "exp" else np.abs(beta * theta)
    s = np.linspace(0.0, 1.0, SHARE_GRID + 1)
    k = np.arange(len(log_c))[:, None]
    bound = -math.inf
    with np.errstate(divide="ignore"):  # logsumexp of terms that are all -inf (no weight)
        for left, right in zip(s[:-1], s[1:]):
            series = logsumexp(k * math.log(1.0 - left) + log_c, axis=0)  # decreasing in s: its left end
            ends = logsumexp(log_w + np.maximum(left * z, right * z), axis=1)
            bound = max(bound, float(logsumexp(series + ends)) - sigma * (1.0 - right))
    return math.log(abs(beta)) + bound


def small_entries_share(mat, x_unit, beta, fn, dtype, limit):
    """None when no off-diagonal entry of A is below :func:`held_floor` of its largest ``|a_ij|`` (one
    compiled pass, once per matrix); else the log of a bound on what those couplings, E, can add to the answer:
    ``||f(beta A) x - f(beta (A - E)) x||`` for ``x = x_unit`` (ones when None).  The solvers' norms
    cannot hold E's couplings, in any run: they are treated as a perturbation dropped from A.

    For exp, ``f(beta A) x - f(beta A_0) x = beta int_0^1 exp((1 - s) beta A) E exp(s beta A_0) x ds``
    with ``A_0 = A - E`` (cosh and sinh: half sums for beta and -beta).  On each connected component C
    of A_0, ``exp(s beta A_0) x = sum_k V_k c_k e^{s beta theta_k}`` from its eigendecomposition, so
    ``|E exp(s beta A_0) x| <= sum_k |E V_k| |c_k| e^{s beta theta_k}``, lifted by :func:`_lifted`.  Where
    that costs more than REPLAY_WORK operations or cannot be bounded so: ``|beta| ||E||_inf e^{mu} ||x||``
    with mu >= 0 a Gershgorin bound of the largest eigenvalue of beta A (for cosh and sinh of |beta A|)."""
    if mat.weights is None or not mat.nnz:
        return None
    span = mat.magnitudes
    floor = held_floor(dtype, limit) * span[1]
    if not span[0] < floor:
        return None
    n, weights = mat.n, mat.weights
    rows = np.repeat(np.arange(n), np.diff(mat.indptr))
    # couplings only: a diagonal entry enters the run's alpha_k, a dot product that holds it
    small = (np.abs(weights) < floor) & (mat.indices != rows)
    if not small.any():
        return None
    if fn.name not in ("exp", "cosh", "sinh"):
        return math.inf
    top = math.frexp(span[1])[1]  # A 2^-top: largest entry near 1, beta 2^top
    tiny = math.frexp(float(np.abs(weights[small]).max()))[1]  # E 2^-tiny, its largest near 1
    offset = (tiny - top) * math.log(2.0)  # log of E's unit over A 2^-top's
    beta = math.ldexp(beta, top)
    # what underflows in E 2^-tiny is raised to the smallest normal number: the bound stays a bound
    e_values = np.maximum(np.ldexp(np.abs(weights[small]), -tiny), np.finfo(np.float64).tiny)
    E = sp.csr_matrix((e_values, (rows[small], mat.indices[small])), shape=(n, n))
    A = sp.csr_matrix((np.ldexp(weights, -top), mat.indices, mat.indptr), shape=(n, n))
    A0 = A.copy()  # its own index arrays: dropping E's entries must not edit the caller's
    A0.data[small] = 0.0
    A0.eliminate_zeros()
    x = np.ones(n) if x_unit is None else np.asarray(x_unit, dtype=np.float64)
    # ||exp(t beta A)||_2 <= e^{t growth}: Gershgorin's bound of the largest eigenvalue of beta A (for
    # cosh and sinh, of |beta A|)
    absolute = abs(A) * abs(beta)
    sums = np.asarray(absolute.sum(axis=1)).ravel()
    diagonal = A.diagonal() * beta if fn.name == "exp" else np.abs(A.diagonal() * beta)
    growth = max(0.0, float(np.max(sums - np.abs(A.diagonal() * beta) + diagonal)))
    reach = float(sums.max())
    with np.errstate(divide="ignore"):
        crude = (math.log(abs(beta)) + math.log(float(E.sum(axis=1).max())) + offset + growth
                 + math.log(_norm(x))) if beta != 0.0 else -math.inf
    count, labels = connected_components(A0, directed=False)
    sizes = np.bincount(labels, minlength=count)
    touched = np.zeros(count, dtype=bool)
    touched[labels[E.indices]] = True  # components that E's columns reach
    carried = np.zeros(count, dtype=bool)
    carried[labels[x != 0]] = True
    live = np.flatnonzero(touched & carried)
    if float(np.sum(sizes[live].astype(np.float64) ** 3)) + 2.0 * reach * sizes[live].sum() * (A.nnz + n) \
            > REPLAY_WORK:
        return crude
    columns, log_r, theta = [], [], []
    for c in live:
        idx = np.flatnonzero(labels == c)
        xc = x[idx]
        xm = float(np.abs(xc).max())
        lam, V = np.linalg.eigh(A0[idx][:, idx].toarray())
        coef = np.abs(V.T @ (xc / xm))
        R = abs(E[:, idx]) @ np.abs(V)
        peak = np.abs(R).max(axis=0)
        keep = (coef > 0.0) & (peak > 0.0)
        columns.append(R[:, keep] / peak[keep])
        log_r.append(np.log(peak[keep]) + np.log(coef[keep]) + math.log(xm) + offset)
        theta.append(lam[keep])
    theta = np.concatenate(theta) if theta else np.zeros(0)
    log_w = np.full((len(theta), len(theta)), -math.inf)
    np.fill_diagonal(log_w, 0.0)
    bound = _lifted(A, beta, fn, np.hstack(columns) if columns else np.zeros((n, 0)),
                    np.concatenate(log_r) if log_r else np.zeros(0), theta, log_w)
    return min(bound, crude)


class ReorthogonalLanczos(HostSolver):
    """The Lanczos recurrence on the host in float64, each vector reorthogonalised against all earlier
    ones until its projection on them is below rounding, stopped where no entry of the residual
    stands above its own rounding bound (as in :func:`breakdown_residual`).  The second opinion on a
    run that goes on through a coupling far below ||A|| (small problems only: one that
    :func:`breakdown_residual` replayed): where a step's diagonal term is so much larger than the
    coupling that the step's rounding along its own vector outweighs it (graded entries), the plain
    recurrence takes that rounding for its next vector, while this one removes it; where the answer
    lies far below ||x|| max|f|, this one can be the one that is off.  Neither is right in every such
    case, so graphkern.expm.api flags the answer where the two disagree.  Implements the solver
    interface of graphkern.expm.lanczos; vectors are kept normalised (``rscale`` 1 where a step went
    on, 0 where it stopped)."""

    def __init__(self, mat, max_krylov):
        values = np.ones(mat.nnz) if mat.weights is None else mat.values_as(np.float64)
        self.A = sp.csr_matrix((values, mat.indices, mat.indptr), shape=(mat.n, mat.n))
        self.absolute = abs(self.A)
        self.slack = _slack(mat)
        self.alpha, self.beta = np.zeros(max_krylov), np.zeros(max_krylov)
        self.rscale = np.zeros(max_krylov + 1)
        self.basis, self.stopped, self.n_spmv = [], False, 0
        self._t = {"spmv": 0.0, "vector": 0.0}

    def start(self, x, rscale0):
        v = np.ones(self.A.shape[0]) if x is None else np.asarray(x, dtype=np.float64)
        self.basis = [v / _norm(v)]
        self.rscale[0] = 1.0

    def enqueue(self, k0, k1):
        eps = float(np.finfo(np.float64).eps)
        for k in range(k0, k1):
            if self.stopped:
                return
            t0 = time.perf_counter()
            v = self.basis[k]
            u = self.A @ v
            self.n_spmv += 1
            t1 = time.perf_counter()
            self.alpha[k] = float(v @ u)
            prev = self.basis[k - 1] if k > 0 else np.zeros_like(v)
            beta_prev = self.beta[k - 1] if k > 0 else 0.0
            w = u - self.alpha[k] * v - beta_prev * prev
            noise = _rounding_bound(self.absolute, self.slack, v, self.alpha[k], prev, beta_prev)
            Q = np.array(self.basis)
            for _ in range(MAX_REORTHOGONALISATIONS):
                projection = Q @ w
                w -= Q.T @ projection
                if _norm(projection) <= eps * _norm(w):
                    break
            norm = _norm(w)
            self.beta[k] = norm
            if norm == 0.0 or not np.any(np.abs(w) > NOISE_RATIO * noise) or len(self.basis) == self.A.shape[0]:
                self.stopped = True  # an invariant subspace (to rounding), or the whole space
                self.rscale[k + 1] = 0.0
            else:
                self.basis.append(w / norm)
                self.rscale[k + 1] = 1.0
            self._t["vector"] += time.perf_counter() - t1
            self._t["spmv"] += t1 - t0

    def result(self, m, g, scaling):
        y = np.array(self.basis[:m]).T @ np.asarray(g[:m], dtype=np.float64)
        return finish_on_host(y, scaling)
