"""What ended a Lanczos run that broke down before n steps, told on the host.

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
than the tolerance, bounded by :func:`dropped_share`.
"""

import math

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import logsumexp

# The replay's work limit (operations), and how far above its own rounding bound a residual entry
# must stand to count as a real coupling.
REPLAY_WORK = 1e7
NOISE_RATIO = 64
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
    slack = (np.diff(mat.indptr) + 4) * float(np.finfo(np.float64).eps)
    v = np.ones(n) if x_unit is None else np.asarray(x_unit, dtype=np.float64)
    v = v / np.linalg.norm(v)
    basis, alphas, betas, v_prev, beta_prev = [v], [], [], np.zeros(n), 0.0
    for step in range(m):
        u = A @ v
        alphas.append(float(v @ u))
        w = u - alphas[-1] * v - beta_prev * v_prev
        noise = slack * (absolute @ np.abs(v) + abs(alphas[-1]) * np.abs(v) + beta_prev * np.abs(v_prev))
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


def _norm(v):
    """||v||, scaled by max |v| so that no square underflows."""
    peak = float(np.abs(v).max())
    return peak * float(np.linalg.norm(v / peak)) if peak > 0.0 else 0.0


def dropped_share(A, r, beta, fn, alpha, off):
    """``(log E, log Y)``: of a bound E on ``||f(beta A) q_1 - Q_m f(beta T_m) e_1||``, how much the
    residual ``r`` (A Q_m = Q_m T_m + r e_m^T, T_m with diagonal ``alpha`` and off-diagonal ``off``)
    that a run dropped can change its answer, and of that answer's norm ``Y = ||f(beta T_m) e_1||``.
    E is inf where it cannot be bounded within SHARE_TERMS terms and REPLAY_WORK operations, and for a
    callable f.

    For exp, ``E = beta int_0^1 exp((1 - s) beta A) r e_m^T exp(s beta T_m) e_1 ds``; cosh and sinh are
    half sums of two such terms, for beta and -beta.  Entrywise ``|exp(t beta A)| <= exp(t M)`` with M
    the diagonal of beta A plus the absolute values of its off-diagonal entries (for cosh and sinh,
    ``|beta| |A|``), and ``exp(t M) |r| <= e^{-t sigma} sum_k t^k ||(M + sigma I)^k |r| / k!||``, a
    series of non-negative terms (sigma makes M + sigma I non-negative); ``|e_m^T exp(s beta T_m) e_1|
    <= sum_j |V_mj V_1j| e^{s z_j}``.  Each factor is bounded on each interval of a grid of [0, 1] by
    its values at the ends.  Nothing is amplified beyond what the coupling graph allows: a residual
    far from the large entries stays small."""
    theta, V = scipy.linalg.eigh_tridiagonal(alpha, off) if len(alpha) > 1 else (alpha, np.ones((1, 1)))
    values, shift = fn.shifted(beta * theta)
    size = _norm(V @ (values * V[0]))
    answer = math.log(size) + shift if size > 0.0 else -math.inf
    if fn.name not in ("exp", "cosh", "sinh"):
        return math.inf, answer
    if beta == 0.0:
        return -math.inf, answer
    diagonal = A.diagonal() * beta
    # for exp the diagonal keeps its sign (a decaying entry lifts nothing); M + sigma I, non-negative:
    kept = diagonal if fn.name == "exp" else np.abs(diagonal)
    sigma = max(0.0, -float(kept.min()))
    M = (abs(A) * abs(beta) + sp.diags(kept - np.abs(diagonal) + sigma)).tocsr()
    reach = float(abs(M).sum(axis=1).max())  # ||M||_2 <= ||M||_inf: the terms halve past 2 reach
    terms = int(2 * reach) + 2
    if terms > SHARE_TERMS or terms * (M.nnz + A.shape[0]) > REPLAY_WORK:
        return math.inf, answer
    u = np.abs(r)
    log_c = [math.log(_norm(u))]
    u = u / _norm(u)
    for k in range(1, terms + 1):
        u = M @ u
        size = _norm(u)
        if size == 0.0:
            break
        log_c.append(log_c[-1] + math.log(size) - math.log(k))
        u /= size
    log_c = np.array(log_c)
    log_c[-1] += math.log(2.0)  # the tail past the last term is at most that term
    z = beta * theta if fn.name == "exp" else np.abs(beta * theta)
    weight = np.abs(V[-1] * V[0])
    live = weight > 0
    log_w, z = np.log(weight[live]), z[live]
    if not live.any():
        return -math.inf, answer
    s = np.linspace(0.0, 1.0, SHARE_GRID + 1)
    k = np.arange(len(log_c))
    bound = -math.inf
    for left, right in zip(s[:-1], s[1:]):
        series = logsumexp(k * math.log(1.0 - left) + log_c)  # decreasing in s: its left end
        ends = logsumexp(log_w + np.maximum(left * z, right * z))
        bound = max(bound, series - sigma * (1.0 - right) + ends)
    return math.log(abs(beta)) + bound, answer
