"""A search for wrong exp(beta A) x answers on extreme input, beyond the seeded fuzz suite.

Random small symmetric matrices (2-4 vertices) with entries from 1e-300 to 1e300, x over as wide a
range, f one of exp, cosh, sinh and beta scaled so that |beta| max|a_ij| lies in 1e-3..630; each
answer of ``funm_multiply(..., backend="cpu")`` is compared with a 700-digit mpmath reference.  A
draw is bad when it is reported converged but an entry is off by more than 1e-8 of the answer's
largest entry.  Answers float64 cannot hold (largest entry under 1e-290) are left out.

Usage: python tools/expm_extreme_search.py [SEED] [DRAWS] [--draw K] [--verbose]   (needs mpmath)
"""

import argparse
import math
import warnings

import mpmath
import numpy as np
import scipy.sparse as sp

from graphkern.expm import funm_multiply

mpmath.mp.dps = 700  # couplings 1e-600 of the largest entry still resolved
F = {"exp": mpmath.exp, "cosh": mpmath.cosh, "sinh": mpmath.sinh}


def draw(rng):
    n = int(rng.integers(2, 5))
    A = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            if rng.random() < 0.6:
                A[i, j] = A[j, i] = rng.choice([-1, 1]) * 10.0 ** rng.uniform(-300, 300)
    x = np.array([rng.choice([-1, 1]) * 10.0 ** rng.uniform(-300, 300) if rng.random() < 0.8 else 0.0
                  for _ in range(n)])
    f = str(rng.choice(list(F)))
    beta = rng.choice([-1, 1]) * 10.0 ** rng.uniform(-3, 2.8) / max(np.abs(A).max(), 1e-300)
    return A, x, f, beta


def reference(A, x, f, beta):
    n = len(x)
    M = mpmath.matrix(n, n)
    for i in range(n):
        for j in range(n):
            M[i, j] = mpmath.mpf(A[i, j]) * mpmath.mpf(beta)
    E, Q = mpmath.eigsy(M)
    c = Q.T * mpmath.matrix([mpmath.mpf(v) for v in x])
    return Q * mpmath.matrix([F[f](E[k]) * c[k] for k in range(n)])


def main(seed=0, draws=150, only=None, verbose=False):
    rng = np.random.default_rng(seed)
    tried = bad = flagged = right = 0
    for trial in range(draws):
        A, x, f, beta = draw(rng)
        if only is not None and trial != only:
            continue
        if not A.any() or not x.any() or not math.isfinite(beta) or beta == 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                y, info = funm_multiply(sp.csr_matrix(A), x, f, beta=beta, backend="cpu")
            except (FloatingPointError, OverflowError, ValueError):
                continue  # refused with a message: not a wrong answer
        tried += 1
        ref = reference(A, x, f, beta)
        scale = mpmath.exp(mpmath.mpf(info.log_scale))
        peak = max(abs(r) for r in ref)
        if peak < mpmath.mpf("1e-290") or peak > mpmath.mpf("1e300") * scale:
            continue
        got = [mpmath.mpf(float(v)) * scale for v in np.asarray(y, np.float64)]
        worst = max(abs(g - r) / peak for g, r in zip(got, ref))
        if not info.converged:
            flagged += 1
            right += worst <= 1e-8
            if worst <= 1e-8 and verbose:
                print(f"flagged though right, draw {trial}: f={f} beta={beta!r} error {float(worst):.2e}")
        elif worst > 1e-8:
            bad += 1
            print(f"bad draw {trial}: f={f} beta={beta!r} error {float(worst):.2e} of max|y|\n"
                  f"  A={A.tolist()}\n  x={x.tolist()}")
    print(f"seed {seed}: {tried} answered, {bad} converged and wrong, {flagged} flagged ({right} of them within "
          f"1e-8 of the reference)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seed", nargs="?", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("draws", nargs="?", type=int, default=150, help="draws per seed (default 150)")
    parser.add_argument("--draw", type=int, default=None, metavar="K",
                        help="try draw K of the seed alone (the draws before it are made, not tried)")
    parser.add_argument("--verbose", action="store_true", help="also list the flagged answers that are right")
    args = parser.parse_args()
    main(args.seed, max(args.draws, (args.draw or 0) + 1), args.draw, args.verbose)
