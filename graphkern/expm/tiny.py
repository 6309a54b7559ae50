"""Closed forms of sinh where beta times entries of A falls below float64's normal range while the
answer does not (graphkern.expm.api: sinh of tiny products): the magnitudes joined in logarithms."""

import math

import numpy as np
import scipy.sparse as sp

from graphkern.expm.lanczos import MatrixFunction

# |beta| ||A||_inf at most 2^-LINEAR_SINH_EXPONENT: sinh(beta A) x = beta A x to float64 rounding.
LINEAR_SINH_EXPONENT = 60


def linear_sinh(mat, beta, x_unit, peak, n_threads):
    """``(y, log_factor)`` with ``y * exp(log_factor) = sinh(beta A) x`` computed as beta A x, where
    |beta| ||A|| is so small that the next term, (beta A)^3 x / 6 = (beta A)^2 (beta A x) / 6, is below
    float64's rounding of the first; None otherwise, or where x = 0.  One SpMV on the host (``mat``:
    scale * A, ``x_unit``: x / ``peak``, None for ones), the factors |beta|, 1/scale and max|x| joined
    in logarithms: their product may be far outside float64's range (beta / scale subnormal) while
    the answer is not, which a Krylov run on beta / scale would lose."""
    anorm = mat.inf_norm(n_threads)
    if anorm == 0.0 or peak == 0.0:
        return None
    log_beta = math.log(abs(beta)) - math.log(mat.scale)  # beta of A, in the units of scale * A
    if log_beta + math.log(anorm) > -LINEAR_SINH_EXPONENT * math.log(2.0):
        return None
    values = np.ones(mat.nnz) if mat.weights is None else mat.values_as(np.float64)
    A = sp.csr_matrix((values, mat.indices, mat.indptr), shape=(mat.n, mat.n))
    y = A @ (np.ones(mat.n) if x_unit is None else x_unit)
    return (-y if beta < 0 else y), log_beta + math.log(peak)


def sinh_of_products(beta, a, x):
    """``(values, shift)`` with ``values * e^shift = sinh(beta * a) * x`` (x None: ones), the small
    products taken in logarithms: beta * a_ii below float64's normal range keeps few digits or none
    (sinh(t) = t there), its logarithm all of them, and a tiny sinh(t_i) times a huge x_i may be a
    normal number.  The shift is that of the large |t| (``MatrixFunction.shifted``), so a log scale
    far beyond float64's exponents keeps its digits."""
    t = beta * a
    big = np.abs(t) >= 1.0
    logs = np.full(len(a), -np.inf)
    signs = math.copysign(1.0, beta) * np.sign(a)
    shift = 0.0
    with np.errstate(divide="ignore", under="ignore"):
        if big.any():
            values, shift = MatrixFunction("sinh").shifted(t[big])
            logs[big] = np.log(np.abs(values))
        small = ~big & (a != 0)
        ratio = np.ones(int(small.sum()))  # sinh(t) / t, exactly 1 in float64 below 1e-8
        ts = t[small]
        moderate = np.abs(ts) > 1e-8
        ratio[moderate] = np.sinh(ts[moderate]) / ts[moderate]
        logs[small] = math.log(abs(beta)) + np.log(np.abs(a[small])) + np.log(ratio) - shift
        if x is not None:
            logs, signs = logs + np.log(np.abs(x)), signs * np.sign(x)
    top = float(logs.max()) if len(a) else -math.inf
    delta = top if -math.inf < top < -600.0 else 0.0  # all of it below float64's range: rescaled
    return signs * np.exp(logs - delta), shift + delta
