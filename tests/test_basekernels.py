"""Base kernels: values against their formulas, validation, and the numeric program the solvers interpret."""

import math

import numpy as np
import pytest

from graphkern.basekernels import (KIND_CONSTANT, KIND_KRONECKER_DELTA, KIND_SQUARE_EXPONENTIAL, Additive,
                                   Constant, KroneckerDelta, SquareExponential, TensorProduct)


def interpret(code, params, a, b):
    """An independent reading of the documented program format (what the C and CUDA loops do)."""
    pos, pp, total = 1, 0, 0.0
    for _ in range(code[0]):
        n_terms = code[pos]
        pos += 1
        prod = params[pp]
        pp += 1
        for _ in range(n_terms):
            kind, slot, width = code[pos:pos + 3]
            pos += 3
            theta, aux = params[pp:pp + 2]
            pp += 2
            if kind == KIND_CONSTANT:
                prod *= theta
            elif kind == KIND_KRONECKER_DELTA:
                prod *= 1.0 if a[slot] == b[slot] else theta
            else:
                d2 = sum((a[slot + c] - b[slot + c]) ** 2 for c in range(width))
                prod *= math.exp(aux * d2)
        total += prod
    assert pos == len(code) and pp == len(params)
    return total


def _assert_exp_close(got, exponent):
    """``got`` equals exp(exponent) to a few ulps of the exponent: an exponent computed in another
    order differs by rounding, which exp turns into a relative error of |exponent| times as much."""
    want = np.exp(exponent)
    assert np.all(np.abs(got - want) <= 8 * np.finfo(np.float64).eps * (1 + np.abs(exponent)) * want)


def test_base_kernel_values(rng):
    x = rng.integers(0, 3, 50)
    y = rng.integers(0, 3, 50)
    h = rng.uniform(0, 1)
    np.testing.assert_array_equal(KroneckerDelta(h)(x, y), np.where(x == y, 1.0, h))
    u, v = rng.normal(size=50), rng.normal(size=50)
    ell = rng.uniform(0.3, 2)
    _assert_exp_close(SquareExponential(ell)(u, v), -(u - v) ** 2 / (2 * ell ** 2))
    U, V = rng.normal(size=(50, 3)), rng.normal(size=(50, 3))
    _assert_exp_close(SquareExponential(ell)(U, V, vector=True), -np.sum((U - V) ** 2, axis=1) / (2 * ell ** 2))
    P, Q = rng.integers(0, 2, (50, 2)), rng.integers(0, 2, (50, 2))
    np.testing.assert_array_equal(KroneckerDelta(h)(P, Q, vector=True), np.where((P == Q).all(axis=1), 1.0, h))
    np.testing.assert_array_equal(Constant(0.25)(u[:, None], v[None, :]), np.full((50, 50), 0.25))


def test_compositions_product_and_mean(rng):
    a = {"el": rng.integers(0, 4, 30), "x": rng.normal(size=30), "c": rng.normal(size=(30, 2))}
    b = {"el": rng.integers(0, 4, 30), "x": rng.normal(size=30), "c": rng.normal(size=(30, 2))}
    kd, se, sev = KroneckerDelta(0.3), SquareExponential(0.8), SquareExponential(1.7)
    prod = TensorProduct(el=kd, x=se, c=sev, k=Constant(0.5))
    want = kd(a["el"], b["el"]) * se(a["x"], b["x"]) * sev(a["c"], b["c"], vector=True) * 0.5
    np.testing.assert_allclose(prod(a, b, vector_columns={"c"}), want, rtol=1e-14)
    mean = Additive(el=kd, x=se, c=sev)
    want = (kd(a["el"], b["el"]) + se(a["x"], b["x"]) + sev(a["c"], b["c"], vector=True)) / 3
    np.testing.assert_allclose(mean(a, b, vector_columns={"c"}), want, rtol=1e-14)
    assert prod.columns == ("el", "x", "c")  # Constant reads no column


@pytest.mark.parametrize("make, match", [
    (lambda: KroneckerDelta(1.5), "h must lie in"),
    (lambda: KroneckerDelta(-0.1), "h must lie in"),
    (lambda: KroneckerDelta(float("nan")), "finite"),
    (lambda: SquareExponential(0.0), "length_scale must be > 0"),
    (lambda: SquareExponential(-2.0), "length_scale must be > 0"),
    (lambda: SquareExponential(float("inf")), "finite"),
    (lambda: Constant(1.5), "c must lie in"),
    (lambda: Constant(-1.0), "c must lie in"),
    (lambda: TensorProduct(), "at least one"),
    (lambda: Additive(), "at least one"),
])
def test_hyperparameter_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_type_validation():
    with pytest.raises(TypeError, match="h must be a real number"):
        KroneckerDelta("0.5")
    with pytest.raises(TypeError, match="real number"):
        SquareExponential(True)
    with pytest.raises(TypeError, match="column 'el' must be given a base kernel"):
        TensorProduct(el=0.5)
    with pytest.raises(TypeError, match="base kernel"):
        Additive(el=TensorProduct(x=Constant()))


def test_labeled_kernel_needs_a_column():
    with pytest.raises(ValueError, match="needs a label column"):
        KroneckerDelta(0.5).compile()
    assert Constant(0.5).compile().columns == ()


def test_strict_positivity():
    assert not TensorProduct(el=KroneckerDelta(0.0)).compile().is_strictly_positive()
    assert TensorProduct(el=KroneckerDelta(0.1), x=SquareExponential(1.0)).compile().is_strictly_positive()
    # a mean is positive as soon as one term is
    assert Additive(el=KroneckerDelta(0.0), x=SquareExponential(1.0)).compile().is_strictly_positive()
    assert not Additive(el=KroneckerDelta(0.0), k=Constant(0.0)).compile().is_strictly_positive()
    assert "KroneckerDelta(0.0) on column 'el'" in TensorProduct(el=KroneckerDelta(0.0)).compile().describe_zero()


def test_program_encoding_matches_python_evaluation(rng):
    """The encoded program, read by an independent interpreter, equals the kernel's own value."""
    n = 40
    cols = {"el": rng.integers(0, 3, n), "x": rng.normal(size=n), "c": rng.normal(size=(n, 3)),
            "s": np.array(["C", "N", "O"])[rng.integers(0, 3, n)]}
    for kernel in [TensorProduct(el=KroneckerDelta(0.3), x=SquareExponential(0.7), c=SquareExponential(1.4),
                                 k=Constant(0.9)),
                   Additive(el=KroneckerDelta(0.2), c=SquareExponential(0.5), s=KroneckerDelta(0.6)),
                   Constant(0.7)]:
        prog = kernel.compile()
        tables = {}
        feats = prog.features(cols, tables, np.float64)
        widths = prog.widths(cols)
        code, params = prog.encode(widths)
        assert code.dtype == np.int32 and params.dtype == np.float64
        i, j = rng.integers(0, n, 60), rng.integers(0, n, 60)
        want = prog.evaluate({k: v[i] for k, v in cols.items()}, {k: v[j] for k, v in cols.items()}, {"c"})
        fa = feats if feats is not None else np.zeros((n, 1))
        got = [interpret(code, params, fa[a], fa[b]) for a, b in zip(i, j)]
        np.testing.assert_allclose(got, np.broadcast_to(want, (60,)), rtol=1e-13)


def test_encoding_layout():
    prog = TensorProduct(el=KroneckerDelta(0.3), x=SquareExponential(2.0)).compile()
    code, params = prog.encode({("el", "category"): 1, ("x", "raw"): 1})
    assert code.tolist() == [1, 2, KIND_KRONECKER_DELTA, 0, 1, KIND_SQUARE_EXPONENTIAL, 1, 1]
    assert params.tolist() == [1.0, 0.3, 0.0, 2.0, -0.125]
    prog = Additive(a=KroneckerDelta(0.5), b=KroneckerDelta(0.25)).compile()
    code, params = prog.encode({("a", "category"): 1, ("b", "category"): 1})
    assert code.tolist() == [2, 1, KIND_KRONECKER_DELTA, 0, 1, 1, KIND_KRONECKER_DELTA, 1, 1]
    assert params.tolist() == [0.5, 0.5, 0.0, 0.5, 0.25, 0.0]


def test_category_codes_agree_across_datasets(rng):
    prog = TensorProduct(el=KroneckerDelta(0.5), v=KroneckerDelta(0.5)).compile()
    tables = {}
    a = {"el": np.array([7, 3, 7, 2 ** 62]), "v": np.array([[0.5, 1.0], [0.5, 1.0], [0.5, 2.0], [0.1, 0.1]])}
    b = {"el": np.array([2 ** 62, 3, 99]), "v": np.array([[0.5, 2.0], [9.0, 9.0], [0.5, 1.0]])}
    fa = prog.features(a, tables, np.float32)
    fb = prog.features(b, tables, np.float32)
    for i in range(4):
        for j in range(3):
            assert (fa[i, 0] == fb[j, 0]) == (a["el"][i] == b["el"][j])
            assert (fa[i, 1] == fb[j, 1]) == bool(np.all(a["v"][i] == b["v"][j]))
    # codes are small integers, exact in float32 (large int64 labels would not be)
    assert fa.max() < 8 and fb.max() < 8


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("spread", [1, 40, 10_000, 2 ** 40])
def test_unique_inverse_is_numpys(dtype, spread, rng):
    """Category codes come from np.unique's values and inverse, by a table where the range is small."""
    from graphkern.basekernels.marginalized import _unique_inverse

    info = np.iinfo(dtype)
    span = min(spread, int(info.max) - int(info.min))
    for size in (0, 1, 5, 3000):
        lo = int(info.min) + int(rng.integers(0, 2 ** 62)) % (int(info.max) - int(info.min) - span + 1)
        arr = np.array([lo + int(v) for v in rng.integers(0, span + 1, size)], dtype=object).astype(dtype)
        values, inverse = _unique_inverse(arr)
        want_values, want_inverse = np.unique(arr, return_inverse=True)
        assert values.dtype == want_values.dtype
        np.testing.assert_array_equal(values, want_values)
        np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))


@pytest.mark.parametrize("kernel, form", [
    (Constant(0.5), ("constant", 0.5)),
    (TensorProduct(a=Constant(0.5), b=Constant(0.5)), ("constant", 0.25)),
    (Additive(a=Constant(0.5), b=Constant(1.0)), ("constant", 0.75)),
    (TensorProduct(bo=KroneckerDelta(0.2)), ("kronecker", 1.0, 0.2, "bo")),
    (TensorProduct(bo=KroneckerDelta(0.2), k=Constant(0.5)), ("kronecker", 0.5, 0.2, "bo")),
    (TensorProduct(d=SquareExponential(2.0)), ("sqexp", 1.0, -0.125, "d")),
    (TensorProduct(bo=KroneckerDelta(0.2), d=SquareExponential(2.0)), ("general",)),
    (Additive(bo=KroneckerDelta(0.2), d=Constant(1.0)), ("general",)),
])
def test_edge_form(kernel, form):
    assert kernel.compile().edge_form() == form


@pytest.mark.parametrize("length_scale", [1e-300, 1e-160, 1e160, 1e200])
def test_square_exponential_length_scale_out_of_float_range_is_refused(length_scale):
    with pytest.raises(ValueError, match=r"SquareExponential: length_scale must lie in \[1e-150, 1e\+150\]"):
        SquareExponential(length_scale)
    k = SquareExponential(1.0)
    with pytest.raises(ValueError, match="length_scale must lie in"):
        k.length_scale = length_scale
    assert k.length_scale == 1.0
