"""The compiled per-pair passes of the MGK GPU solvers against their NumPy definitions."""

import numpy as np
import pytest

from graphkern._cpu import pairs


def _numpy_launch_order(cost):
    cost = np.asarray(cost, dtype=np.float64)
    top = float(cost.max(initial=0.0))
    key = cost * (-65535.0 / top) if top > 0 else np.zeros(len(cost))
    key += 65535.0
    return np.argsort(key.astype(np.uint16), kind="stable")


@pytest.mark.parametrize("kind", ["products", "ties", "zeros", "one", "empty", "huge"])
def test_launch_order_is_numpys_stable_argsort(kind, rng):
    m = 50_000
    cost = {"products": lambda: rng.integers(1, 400, m).astype(float) * rng.integers(1, 400, m),
            "ties": lambda: rng.integers(0, 5, m).astype(float),
            "zeros": lambda: np.zeros(m),
            "one": lambda: np.array([3.0]),
            "empty": lambda: np.zeros(0),
            "huge": lambda: rng.random(m) * 1e300}[kind]()
    np.testing.assert_array_equal(pairs.launch_order(cost), _numpy_launch_order(cost))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_take_and_scatter(dtype, rng):
    values = rng.integers(-1000, 1000, 10_001).astype(dtype)
    order = rng.permutation(len(values))
    np.testing.assert_array_equal(pairs.take(values, order), values[order])
    out = np.zeros_like(values)
    pairs.scatter(out, order, values)
    expect = np.zeros_like(values)
    expect[order] = values
    np.testing.assert_array_equal(out, expect)
    with pytest.raises(ValueError, match="scatter"):
        pairs.scatter(out[:10], order, values)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 300])
def test_upper_pairs_and_symmetric_fill(n, rng):
    p = pairs.upper_pairs(n)
    i, j = np.triu_indices(n)
    np.testing.assert_array_equal(p, np.stack([i, j], axis=1).reshape(-1, 2))
    K = rng.standard_normal(len(p)) * 1e40  # float32 overflows to inf, as a cast does
    for dtype in (np.float64, np.float32):
        expect = np.zeros((n, n), dtype=dtype)
        with np.errstate(over="ignore"):
            expect[i, j] = K
            expect[j, i] = K
        np.testing.assert_array_equal(pairs.symmetric_fill(K, np.zeros((n, n), dtype=dtype)), expect)
