"""exp(beta A) x and the other matrix functions where the scales of A's parts, of x and of the answer
lie far apart: components solved apart, couplings and parts of x below rounding, sinh of tiny
products, underflow in the solvers' norms (CPU, and GPU where marked)."""

import math
import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

from graphkern.expm import expm_multiply, funm_multiply, total_communicability
from test_expm_reliability import BACKENDS, random_graph, rel


def block_diagonal(rng, blocks):
    """The blocks (dense) on the diagonal of one matrix, its vertices shuffled; returns (A, order)
    with A's vertex i the block-order vertex order[i]."""
    order = rng.permutation(sum(len(b) for b in blocks))
    A = sp.block_diag([sp.csr_matrix(b) for b in blocks], format="csr")
    return A[order][:, order].tocsr(), order


def log_frame_reference(blocks, x, beta, order):
    """``(exp(beta A) x / e^L, L)`` from each block's eigendecomposition, L the largest exponent met."""
    parts, start = [], 0
    for b in blocks:
        lam, V = np.linalg.eigh(b)
        parts.append((V, beta * lam, V.T @ x[start:start + len(b)]))
        start += len(b)
    top = max(z[c != 0].max() for _, z, c in parts if np.any(c != 0))
    y = np.concatenate([V @ (np.exp(z - top) * c) for V, z, c in parts])
    return y[order], top


def scale_blocks(rng, huge_component, beta=1e-150):
    small = random_graph(rng, 12, 0.4).toarray()
    medium = (10.0 / abs(beta)) * random_graph(rng, 6, 0.6).toarray()  # beta * A of order 10
    blocks = [small, medium] + [np.array([[d]]) for d in (2.0, 0.0, 4e300, -3.0, 1e-300)]
    if huge_component:  # positive definite: with beta < 0 it vanishes beside the others
        H = random_graph(rng, 5, 0.8).toarray()
        blocks.append(1e300 * (H + (np.abs(H).sum(axis=1).max() + 1.0) * np.eye(5)))
    return blocks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta", [-1.0, 1.0, -1e-300, 1e-300, -1e-150])
@pytest.mark.parametrize("fn", ["expm_multiply", "total_communicability"])
def test_components_of_scales_far_apart_are_solved_apart(backend, beta, fn, rng):
    blocks = scale_blocks(rng, huge_component=False, beta=beta)
    A, order = block_diagonal(rng, blocks)
    x = rng.standard_normal(A.shape[0]) if fn == "expm_multiply" else np.ones(A.shape[0])
    if fn == "expm_multiply":
        y, info = expm_multiply(A, x, beta=beta, backend=backend)
    else:
        y, info = total_communicability(A, beta=beta, backend=backend)
    x_blocks = np.empty_like(x)
    x_blocks[order] = x
    want, top = log_frame_reference(blocks, x_blocks, beta, order)
    got = np.asarray(y, dtype=np.float64) * np.exp(info.log_scale - top)
    assert info.converged and rel(got, want) < 1e-9, (rel(got, want), info)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("diagonal, x", [
    ([0.0, 0.5, 1e300 + 2000.0, 1e-300, 0.0], [1e-300, -2.0, 1e-300, 0.0, 1.0]),
    ([1e-300 - 1.0, 1e300 + 1000.0, 1000.0 + 1e-300, 0.0, 3.5], [1e100, 1e-300, -2.0, 1e100, -2.0]),
])
def test_a_space_of_tiny_ritz_values_next_to_a_huge_entry_is_not_taken_as_exact(backend, diagonal, x):
    """Scaled for its 1e300 entry, A's other entries and x's products with them fall below 1e-154,
    where a vector norm's squares underflow to an exact zero, which looks like an invariant
    subspace after one step (exp(-A) x would be one constant times x): A is split and solved exactly."""
    A = sp.diags(diagonal).tocsr()
    y, info = expm_multiply(A, np.array(x), beta=-1.0, backend=backend)
    want = np.exp(-np.array(diagonal)) * np.array(x)
    got = np.asarray(y, dtype=np.float64) * np.exp(info.log_scale)
    assert info.converged
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def sinh_reference(A, x, beta, log_scale):
    """sinh(beta A) x / e^log_scale from 700 digits (mpmath's symmetric eigendecomposition), in float64:
    couplings 1e-600 of the largest entry still resolved."""
    import mpmath

    n = len(x)
    with mpmath.workdps(700):
        M = mpmath.matrix([[mpmath.mpf(float(v)) * mpmath.mpf(beta) for v in row] for row in A])
        E, Q = mpmath.eigsy(M)
        c = Q.T * mpmath.matrix([mpmath.mpf(float(v)) for v in x])
        F = Q * mpmath.matrix([mpmath.sinh(E[k]) * c[k] for k in range(n)])
        return np.array([float(F[i] * mpmath.exp(-log_scale)) for i in range(n)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("A, x, beta", [
    # x an eigenvector beside a huge entry: the zero coupling is exact, and the answer stays x
    (np.array([[1e150, 0.0], [0.0, 0.0]]), [0.0, 1.0], 0.5),
    # single vertices whose x is 0 where a_ii is largest: their scale is not the others'
    (np.diag([4e300, 2.0, 1e300]), [0.0, 1.0, 1e-300], 1.0),
    # a component coupled by 1e-150 beside a 1e300 vertex whose x is 0
    (np.array([[0.0, 1e-150, 0.0, 3.0], [1e-150, 0.0, 0.0, 1e-150], [0.0, 0.0, 1e300, 0.0],
               [3.0, 1e-150, 0.0, 0.0]]), [1e-300, 1e-300, 0.0, -2.0], 1.0),
])
def test_zero_norms_and_zero_x_beside_huge_entries(backend, A, x, beta):
    """A norm computed as zero in a matrix scaled for a huge entry says nothing about the coupling it
    stands for (its squares may have underflowed): the solve is checked, and split where it cannot
    resolve; single vertices take their common scale from those whose x is not 0."""
    x = np.array(x)
    y, info = expm_multiply(sp.csr_matrix(A), x, beta=beta, backend=backend)
    y = np.asarray(y, dtype=np.float64)
    # the answer in the returned frame, exp(beta A) x * exp(-log_scale): block by block, in float64
    want = np.zeros(len(x))
    blocks = [[0, 1, 3], [2]] if len(x) == 4 else [[i] for i in range(len(x))]
    for b in blocks:
        if len(b) == 1:
            i = b[0]
            want[i] = 0.0 if x[i] == 0 else x[i] * np.exp(beta * A[i, i] - info.log_scale)
        else:
            want[b] = scipy.linalg.expm(beta * A[np.ix_(b, b)]) @ x[b] * np.exp(-info.log_scale)
    assert info.converged and np.abs(y).max() > 0
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())  # normwise, as Krylov


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta", [1e-3, 1e-20, 1e-150, -1e-200])
def test_sinh_of_a_small_beta_is_not_cancelled_to_zero(backend, beta):
    """sinh(beta A) x for small |beta| is about beta A x: the shifted evaluation (e^(z-s) - e^(-z-s)) / 2
    cancelled to exactly 0 for |z| below about 1e-16."""
    A = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 2.0, 0.0]]))
    x = np.array([1.0, -0.5, 0.25])
    y, info = funm_multiply(A, x, "sinh", beta=beta, backend=backend)
    want = scipy.linalg.sinhm(beta * A.toarray()) @ x
    got = np.asarray(y, dtype=np.float64) * np.exp(info.log_scale)
    assert info.converged
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_component_that_a_breakdown_dropped_is_solved_apart(backend):
    """x's part on the 1e20-coupled pair is 1e-100 of the rest, below rounding level, so the Lanczos
    run from x breaks down before reaching it, yet exp(5e19) makes it the answer.  The components
    carrying x are then solved apart: the pair's answer cannot be resolved in float64 (its eigenvalues
    are known to about 1e4, exp(0.5 lambda) to a factor e^5000), so it is flagged, not a converged
    wrong answer; the others are exact."""
    A = np.array([[0.0, 0.0, 0.5, 0.0, 0.0], [0.0] * 5, [0.5, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1e20],
                  [0.0, 0.0, 0.0, 1e20, 0.0]])
    x = np.array([1e-300, 1e100, 1.0, 0.0, -2.0])
    with pytest.warns(RuntimeWarning, match="beyond what one Krylov space resolves"):
        y, info = expm_multiply(sp.csr_matrix(A), x, beta=0.5, backend=backend)
    assert not info.converged and {3, 4} <= set(info.unresolved.tolist()) and info.parts > 1
    got = np.asarray(y, dtype=np.float64)
    want = scipy.linalg.expm(0.5 * A[np.ix_([0, 2], [0, 2])]) @ x[[0, 2]] * np.exp(-info.log_scale)
    np.testing.assert_allclose(got[[0, 2]], want, rtol=1e-9)
    assert got[1] == pytest.approx(1e100 * np.exp(-info.log_scale), rel=1e-12, abs=0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_part_of_x_below_rounding_on_another_component_is_not_dropped(backend):
    """sinh(beta A) x with x = 1e100 on an isolated vertex (sinh(0) = 0 there) and 1 on a coupled
    pair: the run from x sees the isolated vertex only and breaks down at once, though the whole
    answer is the pair's; the components carrying x are solved apart."""
    A = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    x = np.array([1.0, 0.0, 1e100])
    y, info = funm_multiply(A, x, "sinh", beta=1e-3, backend=backend)
    want = scipy.linalg.sinhm(1e-3 * A.toarray()) @ x
    assert info.converged and info.parts > 1
    np.testing.assert_allclose(np.asarray(y, np.float64) * np.exp(info.log_scale), want, rtol=1e-9, atol=1e-12 * 1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_breakdown_short_of_the_largest_eigenvalue_is_flagged_where_f_amplifies(backend):
    """cosh(-A) x with a 1e20 coupling that x reaches only through 1e-20: the run breaks down before
    the eigenvalues near 1e20, whose cosh (about e^(1e20)) float64 cannot resolve; that component is
    flagged instead of returned as converged, the isolated vertices are exact."""
    A = np.zeros((6, 6))
    A[0, 2] = A[2, 0] = 1e-20
    A[1, 2] = A[2, 1] = 1e20
    A[2, 2] = 0.5
    x = np.array([1e100, -1e-100, -2.0, -1e-100, 1e100, 1e100])
    with pytest.warns(RuntimeWarning):
        y, info = funm_multiply(sp.csr_matrix(A), x, "cosh", beta=-1.0, backend=backend)
    assert not info.converged and set(info.unresolved.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(np.asarray(y, np.float64)[3:] * np.exp(info.log_scale), x[3:], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("f, beta, A, x, index, want", [
    # sinh: vertex 1 (x = 1) gives sinh(0) = 0, so the 1e-100 part of x on vertex 0 (beta a_00 = 1) is
    # the whole answer; scaled for the 1e300 entry, the 1e-150 coupling that joins them underflows
    ("sinh", -1e-300, [[-1e300, 0.0, 1e20], [0.0, 0.0, 1e-150], [1e20, 1e-150, 0.0]], [-1e-100, 1.0, -1e-100], 0,
     np.sinh(1.0) * -1e-100),
    # exp: e^700 lifts the 1e-290 part of x on vertex 0 to 1e14, far above vertex 1's exp(0) * 1
    ("exp", 7e-298, [[1e300, 1e-150], [1e-150, 0.0]], [1e-290, 1.0], 0, math.exp(700.0) * 1e-290),
])
def test_a_part_of_x_below_rounding_inside_one_component(backend, f, beta, A, x, index, want):
    """Inside one connected component, a part of x below rounding level next to the rest that f makes
    the whole answer: the first run breaks down at rounding level and drops it, so x is solved in
    parts by magnitude; the answer is exact and converged."""
    y, info = funm_multiply(sp.csr_matrix(np.array(A)), np.array(x), f, beta=beta, backend=backend)
    got = float(np.asarray(y, dtype=np.float64)[index]) * np.exp(info.log_scale)
    assert info.converged and info.unresolved is None
    assert got == pytest.approx(want, rel=1e-9, abs=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a00", [1.291692769449475e-25, -3.1e-30, 7.0e-12])
def test_sinh_of_a_product_below_the_normal_range(backend, a00):
    """sinh(beta a_00) x_0 where beta * a_00 is subnormal (about 5e-322: three digits) although the answer,
    x_0 beta a_00, is a normal number: the product is taken in logarithms.  The other vertex's entry
    (2e295) sets the matrix's scale; x is 0 there.  Reference: (x_0 beta) a_00, normal at every step."""
    A = sp.csr_matrix(np.array([[a00, 0.0], [0.0, -2.1927237883828255e+295]]))
    x = np.array([3.852601186930581e+191, 0.0])
    beta = 3.625625191663627e-297
    y, info = funm_multiply(A, x, "sinh", beta=beta, backend=backend)
    got = np.asarray(y, np.float64) * np.exp(info.log_scale)
    assert info.converged and got[1] == 0.0
    assert got[0] == pytest.approx((x[0] * beta) * a00, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_coupling_below_rounding_that_f_amplifies(backend):
    """cosh(beta A) x with beta a_00 = -308 and a coupling of 2.7e-22 to the vertex x lives on: the
    first step's residual is 1e-24 of ||A||, below the breakdown threshold, but far above its own
    rounding level, so the run goes on through it (stopping there returns x, converged, where
    cosh(308) lifts the coupling's share to 1e129).  Reference: the 2 x 2 eigen-decomposition in closed form."""
    A = np.array([[1.3501285893892092e+264, -1.1903832814766808e+240], [-1.1903832814766808e+240, 0.0]])
    x1, beta = -3.5920389248506554e+20, -2.28e-262
    d, c = beta * A[0, 0], beta * A[0, 1]
    t = c / d  # the eigenvector of d is about (1, t), that of about 0 about (-t, 1)
    want = np.array([(math.cosh(d) - 1.0) * t, math.cosh(d) * t * t + 1.0]) * x1 / (1.0 + t * t)
    y, info = funm_multiply(sp.csr_matrix(A), np.array([0.0, x1]), "cosh", beta=beta, backend=backend)
    got = np.asarray(y, np.float64) * np.exp(info.log_scale)
    assert info.converged
    # Lanczos answers to the tolerance relative to the whole answer: entry 1 is 1e-24 of entry 0, so it
    # holds rounding of entry 0's size (what the fault made of entry 0 was x itself)
    assert np.max(np.abs(got - want)) <= 1e-9 * np.max(np.abs(want))
    assert abs(got[0] - want[0]) <= 1e-9 * abs(want[0])


def test_the_replay_tells_a_real_coupling_from_rounding_noise(monkeypatch):
    """The breakdown replay: rounding noise of an invariant subspace (a star with x = ones, three
    distinct eigenvalues, irrational ones among them) is not taken for a coupling, and runs no
    second solve; the 1e-24 coupling of the 2 x 2 case is."""
    import graphkern.expm.api as expm_api

    seen = []
    replay = expm_api.breakdown_residual

    def spy(*args):
        seen.append(replay(*args))
        return seen[-1]

    monkeypatch.setattr(expm_api, "breakdown_residual", spy)
    n = 400
    star = sp.csr_matrix((np.ones(2 * (n - 1)), (np.r_[np.zeros(n - 1, int), np.arange(1, n)],
                                                 np.r_[np.arange(1, n), np.zeros(n - 1, int)])), shape=(n, n))
    y, info = expm_multiply(star, np.ones(n), beta=0.7, backend="cpu")
    assert info.breakdown and info.krylov_dim < n and seen == [(expm_api.NOISE, None)]
    s = math.sqrt(n - 1)  # exp(0.7 A) 1 of a star, in closed form: the hub and a leaf
    hub = math.cosh(0.7 * s) + s * math.sinh(0.7 * s)
    leaf = 1.0 + (math.cosh(0.7 * s) - 1.0) + math.sinh(0.7 * s) / s
    np.testing.assert_allclose(np.asarray(y) * np.exp(info.log_scale), [hub] + [leaf] * (n - 1), rtol=1e-12)
    A = sp.csr_matrix(np.array([[1.3501285893892092e+264, -1.1903832814766808e+240], [-1.1903832814766808e+240, 0.0]]))
    funm_multiply(A, np.array([0.0, 1.0]), "cosh", beta=-2.28e-262, backend="cpu")
    assert seen[1:2] == [(expm_api.COUPLING, None)]


def sinh_through_a_coupling(c, beta):
    """``sinh(beta A) e_0`` for the path A = [[0, c, 0], [c, 0, 1], [0, 1, 0]], in closed form: with
    s = sqrt(1 + c^2), A^(2k+1) e_0 = c s^(2k) e_1, so the answer is (c / s) sinh(beta s) e_1 -- it comes
    only through the coupling c (the first Lanczos step's residual is c e_1)."""
    A = sp.csr_matrix(np.array([[0.0, c, 0.0], [c, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    s = math.sqrt(1.0 + c * c)
    return A, np.array([0.0, c / s * math.sinh(beta * s), 0.0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, c", [(np.float64, 1e-170), (np.float64, 1e-156), (np.float32, 1e-156),
                                      (np.float32, 1e-40)])
def test_a_coupling_whose_squares_underflow_is_flagged(backend, dtype, c):
    """sinh(beta A) e_0 comes only through a coupling c below sqrt(float64's smallest normal) of the
    largest entry (in float32 below float32's smallest normal): the solvers' norm of the residual c e_1
    (float64 squares of the dtype's entries, summed unscaled) underflows, the run cannot go on through
    it and its answer, 0, is wrong.  It is flagged, not returned as converged."""
    A, _ = sinh_through_a_coupling(c, 0.7)
    with pytest.warns(RuntimeWarning, match="underflow in the solvers' norms, and rescaling A does not help"):
        y, info = funm_multiply(A, np.array([1.0, 0.0, 0.0]), "sinh", beta=0.7, backend=backend, dtype=dtype)
    assert not info.converged and info.error_estimate >= 1.0
    assert info.unresolved.tolist() == [0, 1, 2]
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_coupling_below_the_norms_that_exp_lifts_is_flagged(backend):
    """exp(600 A) e_0 for A = [[0, c], [c, 1]], c = 1e-170: the run stops at T = [0] (answer e_0) but
    e^600 lifts the dropped coupling to about c e^600 = 4e90 on vertex 1, far past it: flagged."""
    A = sp.csr_matrix(np.array([[0.0, 1e-170], [1e-170, 1.0]]))
    with pytest.warns(RuntimeWarning, match="underflow in the solvers' norms"):
        y, info = expm_multiply(A, np.array([1.0, 0.0]), beta=600.0, backend=backend)
    assert not info.converged and info.unresolved.tolist() == [0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_answer_is_judged_whole(backend):
    """sinh(beta A) x, A = [[d, c], [c, 0]] with c 1e-167 of d and x = (1.6e-245, 4.3e99): x is split by
    magnitude, and the 4.3e99 part's run (sinh(0) = 0) drops the coupling, which carries the whole
    answer, x_1 c sinh(beta d) / d = 8.6e-69 to first order in c, beside the other part's 4e-246: the
    bound it leaves is judged against the answer of both parts together, and flags it."""
    d, c, beta = -6.035596796442898e-104, -4.3358581767867973e-271, -4.59245230698496e+102
    x = np.array([-1.5725822323655763e-245, 4.259190899743753e+99])
    with pytest.warns(RuntimeWarning, match="underflow in the solvers' norms"):
        y, info = funm_multiply(sp.csr_matrix(np.array([[d, c], [c, 0.0]])), x, "sinh", beta=beta, backend=backend)
    assert not info.converged and info.unresolved.tolist() == [0, 1]
    assert abs(y[0] * np.exp(info.log_scale)) < 1e-3 * abs(x[1] * c * math.sinh(beta * d) / d)  # what it dropped


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_coupling_below_the_norms_that_cannot_matter_keeps_the_run(backend):
    """exp(0.7 A) e_0 on the path of :func:`sinh_through_a_coupling` with c = 1e-170: the run stops at
    T = [0] and drops the coupling, whose share of the answer (about c) is far below the tolerance: the
    answer stands, converged, without a warning.  Closed form: with s = sqrt(1 + c^2),
    exp(beta A) e_0 = ((1 + c^2 cosh(beta s)) / s^2, (c / s) sinh(beta s), c (cosh(beta s) - 1) / s^2)."""
    c, beta = 1e-170, 0.7
    A, _ = sinh_through_a_coupling(c, beta)
    s = math.sqrt(1.0 + c * c)
    cosh, sinh = math.cosh(beta * s), math.sinh(beta * s)
    want = [(1.0 + c * c * cosh) / s ** 2, c / s * sinh, c * (cosh - 1.0) / s ** 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, info = expm_multiply(A, np.array([1.0, 0.0, 0.0]), beta=beta, backend=backend)
    assert info.converged and info.unresolved is None
    np.testing.assert_allclose(np.asarray(y) * np.exp(info.log_scale), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, c", [(np.float64, 1e-150), (np.float64, 1e-140), (np.float64, 1e-100),
                                      (np.float32, 1e-37), (np.float32, 1e-20)])
def test_a_coupling_the_norms_hold_is_gone_through(backend, dtype, c):
    """The same sinh with a coupling just above the underflow of the norms: the replay tells it from
    rounding noise, the run goes on through it and the answer (c / s) sinh(0.7 s) e_1 is right."""
    A, want = sinh_through_a_coupling(c, 0.7)
    y, info = funm_multiply(A, np.array([1.0, 0.0, 0.0]), "sinh", beta=0.7, backend=backend, dtype=dtype)
    assert info.converged and info.unresolved is None
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(np.asarray(y, np.float64) * np.exp(info.log_scale), want, rtol=rtol,
                               atol=rtol * abs(want[1]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_magnitude_split_keeps_the_large_part_beside_the_small_one(backend):
    """The parts of a split by magnitude are summed under one scale: the large part's values, 1e14
    times smaller than the answer's largest, are kept to the tolerance."""
    A = sp.csr_matrix(np.array([[1e300, 1e-150, 0.0], [1e-150, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    x = np.array([1e-290, 1.0, 0.5])
    y, info = expm_multiply(A, x, beta=7e-298, backend=backend)
    got = np.asarray(y, np.float64) * np.exp(info.log_scale)
    # vertices 1 and 2 form exp(beta B) with B = [[0, 1], [1, 0]] scaled by beta ~ 0: x itself there
    np.testing.assert_allclose(got, [math.exp(700.0) * 1e-290, 1.0, 0.5], rtol=1e-9)
    assert info.converged


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_diagonal_reproducer_is_exact(backend):
    y, info = total_communicability(sp.diags([2.0, 0.0, 4e300]).tocsr(), beta=-1.0, backend=backend)
    assert info.converged and info.parts == 3
    np.testing.assert_allclose(y * np.exp(info.log_scale), [np.exp(-2.0), 1.0, 0.0], rtol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_component_beyond_one_krylov_space_is_flagged(backend, rng):
    # connected: 2 and 4e300 in one component cannot be resolved; the lone vertex still is exact
    A = sp.csr_matrix(np.array([[2.0, 1.0, 0.0], [1.0, 4e300, 0.0], [0.0, 0.0, 1.0]]))
    with pytest.warns(RuntimeWarning, match="beyond what one Krylov space resolves"):
        y, info = expm_multiply(A, np.array([1.0, 2.0, 3.0]), beta=-1.0, backend=backend)
    assert not info.converged and info.error_estimate > 1.0 and info.parts == 2
    assert y[2] * np.exp(info.log_scale) == pytest.approx(3 * np.exp(-1.0), rel=1e-14)
    assert info.unresolved.tolist() == [0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unresolved_components_leave_the_others_exact(backend, rng):
    """The components no Krylov space resolves (a 1e151 and a 1e300 block with beta = -1) are solved
    one by one, flagged in ``info.unresolved``, and set neither the scale nor the values of the rest."""
    from scipy.linalg import expm

    blocks = scale_blocks(rng, huge_component=True)
    for b in (0, 1, -1):  # each block one component: a path through its vertices
        path = np.eye(len(blocks[b]), k=1) + np.eye(len(blocks[b]), k=-1)
        blocks[b] = np.where(path > 0, np.abs(blocks[b]).max(), blocks[b])
    B, order = block_diagonal(rng, blocks)
    with pytest.warns(RuntimeWarning, match="beyond what one Krylov space resolves"):
        y, info = total_communicability(B, beta=-1.0, backend=backend)
    assert not info.converged and info.parts == 8  # 12 vertices, the 5 single ones, the two large apart
    position = np.argsort(order)  # block-order vertex -> its index in B
    starts = np.cumsum([0] + [len(b) for b in blocks])
    flagged = np.r_[starts[1]:starts[2], starts[-2]:starts[-1]]  # the 1e151 block and the 1e300 block
    assert info.unresolved.tolist() == sorted(position[flagged].tolist())
    want = np.concatenate([expm(-blocks[0]) @ np.ones(12)] + [np.exp(-b.ravel()) for b in blocks[2:-1]])
    trusted = position[np.r_[starts[0]:starts[1], starts[2]:starts[-2]]]
    got = np.asarray(y, dtype=np.float64)[trusted] * np.exp(info.log_scale)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ordinary_matrices_are_not_split(backend, rng):
    A = sp.block_diag([random_graph(rng, 30, 0.2), sp.csr_matrix((3, 3)), 1e3 * random_graph(rng, 8, 0.5)]).tocsr()
    for beta in (-1.0, 1.0):
        y, info = expm_multiply(A, rng.standard_normal(41), beta=beta, backend=backend)
        assert info.parts == 1 and info.converged


def lifted_through_a_coupling(f, beta, d, g, c):
    """f(beta A) e_0 for A = [[0, g, c], [g, 0, 0], [c, 0, d]] to first order in c (the next order is
    c^2 e^{|beta d|}, far below float64's resolution here): vertices 0 and 1 give f(beta g sigma_x) e_0,
    and the coupling c lifts vertex 0's part into vertex 2 by the divided differences of f between d
    and +-g."""
    F = {"exp": math.exp, "cosh": math.cosh, "sinh": math.sinh}[f]
    A = sp.csr_matrix(np.array([[0.0, g, c], [g, 0.0, 0.0], [c, 0.0, d]]))
    even, odd = (F(beta * g) + F(-beta * g)) / 2, (F(beta * g) - F(-beta * g)) / 2
    lifted = c / 2 * sum((F(beta * d) - F(s * beta * g)) / (d - s * g) for s in (1.0, -1.0))
    return A, np.array([even, odd, lifted])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("f, beta, dtype, c", [
    ("cosh", -500.0, np.float64, 1e-200), ("exp", 500.0, np.float64, 1e-200), ("sinh", 500.0, np.float64, 1e-200),
    ("cosh", -500.0, np.float64, 1e-158), ("cosh", -200.0, np.float32, 1e-60)])
def test_a_coupling_below_the_norms_that_f_lifts_is_flagged_without_a_breakdown(backend, f, beta, dtype, c):
    """f(beta A) e_0 on the path 1 - 0 - 2, a_01 = 1e-30 and a_02 = c below the norms' floor of a_22 = 1:
    the run goes on past n steps without a breakdown (|beta| ||A|| lowers the breakdown threshold), but
    c's part of each Lanczos vector is lost in the unscaled sums of squares, and f(beta a_22) lifts it
    into y_2, which carries the whole answer.  Flagged, with every vertex unresolved."""
    d = math.copysign(1.0, beta) * (1.0 if f != "cosh" else -1.0)
    A, want = lifted_through_a_coupling(f, beta, d, 1e-30, c)
    assert abs(want[2]) > 1e6 * np.abs(want[:2]).max()  # the lifted part is the answer
    with pytest.warns(RuntimeWarning, match="underflow in the solvers' norms, and rescaling A does not help"):
        y, info = funm_multiply(A, np.array([1.0, 0.0, 0.0]), f, beta=beta, dtype=dtype, backend=backend)
    assert not info.converged and info.error_estimate >= 1.0
    assert info.unresolved.tolist() == [0, 1, 2]
    got = np.asarray(y, np.float64) * np.exp(info.log_scale)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("f, beta", [("cosh", -5.0), ("exp", 300.0), ("sinh", -5.0)])
def test_a_coupling_below_the_norms_that_f_cannot_lift_is_left_alone(backend, f, beta):
    """The same path where f(beta a_22) lifts c = 1e-200 to at most about 1e-27 of the answer: the
    bound of what c can add stays within the tolerance, and the answer is returned converged, unwarned."""
    A, want = lifted_through_a_coupling(f, beta, math.copysign(1.0, beta), 1e-30, 1e-200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, info = funm_multiply(A, np.array([1.0, 0.0, 0.0]), f, beta=beta, backend=backend)
    assert info.converged and info.unresolved is None
    got = np.asarray(y, np.float64) * np.exp(info.log_scale)
    peak = np.abs(want).max()
    assert got == pytest.approx(want, rel=0, abs=1e-12 * peak)
    assert abs(want[2]) < 1e-20 * peak  # the dropped coupling's share, far below the tolerance


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_extreme_search_cosh_case_is_flagged(backend):
    """The 4-vertex case of tools/expm_extreme_search.py (seed 2, draw 44): cosh(517) lifts
    x_3 = 6.7e194 through a_23 = 1.5e-234 (1.3e-231 of the largest entry) into y_2 = 2.1e188, 3e-7 of
    the answer; the run sees none of it.  Flagged, not converged and wrong."""
    A = np.array([[-5.448442863865751e-185, 0.0, 0.0, 2.3598359636412248e-82],
                  [0.0, 0.0, -6.0943900088383005e-139, 0.0],
                  [0.0, -6.0943900088383005e-139, -0.0011250686930556533, -1.46780632536834e-234],
                  [2.3598359636412248e-82, 0.0, -1.46780632536834e-234, 1.1260418457164109e-167]])
    x = np.array([0.0, -2.3427480992847442e+87, 4.77769197944146e-52, 6.736606251505525e+194])
    with pytest.warns(RuntimeWarning, match="underflow in the solvers' norms"):
        y, info = funm_multiply(sp.csr_matrix(A), x, "cosh", beta=-459846.3330972949, backend=backend)
    assert not info.converged and info.unresolved.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("f, beta", [("cosh", -500.0), ("exp", -500.0), ("sinh", 400.0), ("sinh", -450.0)])
@pytest.mark.parametrize("c", [1e-60, 1e-100, 1e-155])
def test_a_coupling_whose_krylov_coefficients_fall_below_rounding_is_kept(backend, f, beta, c):
    """f(beta A) e_0 for A = [[0, 1e-30, c], [1e-30, 0, 0], [c, 0, -1]]: vertex 2 is reached through c
    and lifted by about e^500, so it is the whole answer; in T_m it sits behind a product of couplings
    (1e-60 and less) that the eigenvectors of T_m hold only as rounding noise.  Against 400-digit
    mpmath: exact to the answer's largest entry and converged."""
    import mpmath

    A = np.array([[0.0, 1e-30, c], [1e-30, 0.0, 0.0], [c, 0.0, -1.0]])
    y, info = funm_multiply(sp.csr_matrix(A), np.array([1.0, 0.0, 0.0]), f, beta=beta, backend=backend)
    with mpmath.workdps(400):
        M = mpmath.matrix(A.tolist()) * beta
        up, down = mpmath.expm(M), mpmath.expm(-M)
        F = {"exp": up, "cosh": (up + down) / 2, "sinh": (up - down) / 2}[f]
        want = np.array([float(F[i, 0] * mpmath.exp(-info.log_scale)) for i in range(3)])
    got = np.asarray(y, dtype=np.float64)
    assert info.converged and np.abs(got - want).max() <= 1e-9 * np.abs(want).max()
    assert abs(want[2]) == np.abs(want).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_answer_far_below_the_function_values_is_kept(backend):
    """sinh(beta A) x where beta ||A|| is 1.3e-3 and the answer's largest entry (vertex 1, reached
    from the 6e296 on vertex 0 through a coupling 5.7e-20 of A's largest) lies far below sinh's
    values on T_m: the eigenvectors of T_m hold it only as rounding of those values.
    A draw of tools/expm_extreme_search.py (seed 6, draw 91), against 700-digit mpmath."""
    import mpmath

    A = np.array([[-3.197238832018622e-150, -2.585586833211198e-12, 0.0],
                  [-2.585586833211198e-12, 0.0, -45547047.89277892],
                  [0.0, -45547047.89277892, 4.1314678902743874e-151]])
    x = np.array([-6.408749479885521e+296, -1.2875604679060505e-239, -3.999747304143863e-34])
    beta = 2.957116780388829e-11
    y, info = funm_multiply(sp.csr_matrix(A), x, "sinh", beta=beta, backend=backend)
    with mpmath.workdps(700):
        M = mpmath.matrix([[mpmath.mpf(float(v)) for v in row] for row in A]) * mpmath.mpf(beta)
        F = (mpmath.expm(M) - mpmath.expm(-M)) / 2
        X = [mpmath.mpf(float(v)) for v in x]
        want = np.array([float(sum(F[i, j] * X[j] for j in range(3)) * mpmath.exp(-info.log_scale))
                         for i in range(3)])
    got = np.asarray(y, dtype=np.float64)
    assert info.converged and np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("A, x, beta", [
    # two single vertices: beta * a_00 = 8e-333 is below float64's range, x_0 = 4.7e286 lifts it to 3.8e-46
    ([[-1.3669305089664734e-188, 0.0], [0.0, 1.1636691934178678e+144]],
     [-4.7240974385052985e+286, -1.7836424181932434e-88], -5.933449345559435e-145),
    # vertices 1 and 2 joined by a coupling whose product with beta is 3e-318 (subnormal): the answer
    # 5.1e-242 on vertex 1 is that product times x_2
    ([[-1.1683095265731983e+163, 0.0, 0.0, 0.0], [0.0, 4.512368404549721e-96, 7.714620811244452e-157, 0.0],
      [0.0, 7.714620811244452e-157, 0.0, 0.0], [0.0, 0.0, 0.0, 3.119686009620846e-247]],
     [0.0, 0.0, 1.5904349548169178e+76, 0.0], 4.146035631427299e-162),
    # vertices 0 and 3 joined by a coupling whose product with beta is 5e-324, the smallest subnormal
    ([[0.0, 0.0, 0.0, 9.298300000896546e-171], [0.0, -5.511097098257886e+152, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
      [9.298300000896546e-171, 0.0, 0.0, 0.0]],
     [-1.144117393289317e-170, 2.733960132912867e-226, 1.21076200528375e+252, 2.972311946934485e+230],
     5.837924181923304e-154),
])
def test_sinh_of_products_below_float64s_range(backend, A, x, beta):
    """sinh(beta A) x where beta times an entry of A is below float64's normal range (sinh(t) = t there)
    while the answer, that product times a huge x_i, is a normal number: the products are taken in
    logarithms (single vertices) or as beta A x joined in logarithms (|beta| ||A|| far below rounding),
    not lost to underflow.  Draws of tools/expm_extreme_search.py (seeds 18, 12, 20), against
    700-digit mpmath."""
    A, x = np.array(A), np.array(x)
    y, info = funm_multiply(sp.csr_matrix(A), x, "sinh", beta=beta, backend=backend)
    want = sinh_reference(A, x, beta, info.log_scale)
    got = np.asarray(y, dtype=np.float64)
    assert info.converged and np.abs(want).max() > 0
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_sinh_entry_far_below_the_exponentials_is_summed_as_a_series(backend):
    """sinh(beta A) x with |beta| ||A|| about 0.54 and x_0 = 1.8e175: y_0 = 1.3e154 is the third-order
    term beta^3 a_02^2 a_22 x_0 / 6, 1e-21 of x_0, so sinh(beta T) e_1 from exp(beta T) - exp(-beta T)
    (entries near 1) or from T's eigenvectors leaves it rounding (y_0 came out 4.5e159, 2.7e-6 of the
    answer's largest entry).  A draw of tools/expm_extreme_search.py (seed 18, draw 128), against
    700-digit mpmath."""
    A = np.array([[0.004421960950324045, 0.0, -1.688066858270312e+74],
                  [0.0, 7.96513997773017e-18, -1.520645102777273e+81],
                  [-1.688066858270312e+74, -1.520645102777273e+81, -1.009627710187747e+84]])
    x = np.array([1.8003093501867536e+175, 2.3012527928757475e+79, 2.592629445970541e-234])
    beta = -5.331948595093679e-85
    y, info = funm_multiply(sp.csr_matrix(A), x, "sinh", beta=beta, backend=backend)
    want = sinh_reference(A, x, beta, info.log_scale)
    got = np.asarray(y, dtype=np.float64)
    assert info.converged and np.abs(got - want).max() <= 1e-10 * np.abs(want).max()
    assert abs(got[0] - want[0]) <= 1e-8 * abs(want[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_coupling_below_its_steps_rounding_is_never_answered_wrong_and_converged(backend):
    """sinh(beta A) x where x's part on vertex 3 reaches vertex 2 through a coupling 5e-70 of A's largest
    entry, and vertex 2's next coupling (to vertex 1) is 3e-63 of its own diagonal, below the rounding
    of the Lanczos step that meets it.  Gone through as the plain recurrence does, that rounding became
    the next vector and the answer was off by 5e49 of its largest entry, reported converged; the
    reorthogonalised recurrence disagrees with it, so it is flagged.  A draw of
    tools/expm_extreme_search.py (seed 8, draw 14), against 700-digit mpmath."""
    A = np.array([[0.0, 0.0, 1.3433774379668663e-102, 0.0],
                  [0.0, -3.1565999582943644e-203, 5.1190691649284085e+106, -1.7528344030153653e-80],
                  [1.3433774379668663e-102, 5.1190691649284085e+106, -1.5878968159828004e+169, -7.756394583065661e+99],
                  [0.0, -1.7528344030153653e-80, -7.756394583065661e+99, -1.156036709750634e+61]])
    x = np.array([-4.964541457750757e+169, 9.179065751066974e-180, -7.10391399583494e-37, -3.979133762745583e+143])
    beta = 7.068704685640687e-169
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, info = funm_multiply(sp.csr_matrix(A), x, "sinh", beta=beta, backend=backend)
    want = sinh_reference(A, x, beta, info.log_scale)
    got = np.asarray(y, dtype=np.float64)
    assert not info.converged or np.abs(got - want).max() <= 1e-9 * np.abs(want).max()
    if not info.converged:
        assert info.unresolved.tolist() == [0, 1, 2, 3]
