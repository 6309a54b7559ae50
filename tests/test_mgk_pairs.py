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


@pytest.mark.parametrize("m", [3_000, 50_000])  # a sort of the keys below 8192 pairs, counting above
@pytest.mark.parametrize("kind", ["products", "ties", "zeros", "one", "empty", "huge"])
def test_launch_order_is_numpys_stable_argsort(kind, m, rng):
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
    for width in (1, 3):  # a row per pair: a gradient's derivatives
        G = rng.standard_normal((len(p), width))
        expect = np.zeros((n, n, width))
        expect[i, j] = G
        expect[j, i] = G
        np.testing.assert_array_equal(pairs.symmetric_fill_rows(G, np.zeros((n, n, width))), expect)
    with pytest.raises(ValueError, match="do not fill the upper triangle"):
        pairs.symmetric_fill_rows(np.zeros((len(p) + 1, 2)), np.zeros((n, n, 2)))


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (1, 1), (3, 7), (301, 17)])
def test_grid_pairs_are_every_pair_row_by_row(shape):
    from graphkern.mgk.kernel import _grid_pairs

    got = _grid_pairs(*shape)
    i, j = np.indices(shape)
    np.testing.assert_array_equal(got, np.stack([i.ravel(), j.ravel()], axis=1))
    assert got.dtype == np.int64 and got.shape == (shape[0] * shape[1], 2) and got.flags.c_contiguous


@pytest.mark.parametrize("m", [0, 1, 7, 200_003])
@pytest.mark.parametrize("same", [True, False])
def test_pair_plan_is_the_numpy_launch(m, same, rng):
    """Launch order, graphs in launch order, largest and total size and footprint as NumPy computes
    them (the order exactly that of the stable argsort of the NumPy costs)."""
    n_first, n_second = 41, 41 if same else 29
    n1, w1, f1 = rng.integers(1, 60, n_first), rng.integers(0, 400, n_first), rng.integers(0, 9000, n_first)
    n2, w2, f2 = (n1, w1, f1) if same else (rng.integers(1, 60, n_second), rng.integers(0, 400, n_second),
                                            rng.integers(0, 9000, n_second))
    pair_arr = np.stack([rng.integers(0, n_first, m), rng.integers(0, n_second, m)], axis=1)
    order, g1, g2, largest, total, footprint = pairs.pair_plan(pair_arr, n1, n2, w1, w2, f1, f2, 16)
    a, b = pair_arr[:, 0], pair_arr[:, 1]
    sizes = n1[a] * n2[b]
    want = _numpy_launch_order(w1[a].astype(np.float64) * w2[b] + sizes)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(g1, a[want])
    np.testing.assert_array_equal(g2, b[want])
    want_footprint = (f1[a] + f2[b] + 16 * sizes).max(initial=0)
    assert (largest, total, footprint) == (sizes.max(initial=0), sizes.sum(), want_footprint)
    np.testing.assert_array_equal(pairs.pair_costs(pair_arr, n1, n2, w1, w2), w1[a].astype(np.float64) * w2[b] + sizes)


@pytest.mark.parametrize("m", [0, 1, 7, 65_536, 65_537, 300_001])
def test_balanced_cuts_equal_a_numpy_prefix_sum(rng, m):
    """The cuts of the pairs into runs of equal cost, computed block by block over threads, are the
    ones NumPy's prefix sum and search give (whole-number costs: exact sums), for 1 to 9 runs; with
    no cost at all, runs of equal length."""
    n, w = rng.integers(0, 60, 50), rng.integers(0, 3, 50) * rng.integers(0, 400, 50)
    pair_arr = rng.integers(0, 50, (m, 2)).astype(np.int64)
    a, b = pair_arr[:, 0], pair_arr[:, 1]
    total = np.cumsum(w[a].astype(np.float64) * w[b] + n[a] * n[b])  # each pair's cost, in NumPy
    for parts in range(1, 10):
        got = pairs.balanced_cuts(pair_arr, n, n, w, w, parts)
        if m and total[-1] > 0:
            want = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts, side="left")
            want = np.concatenate([[0], want, [m]])
        else:
            want = np.linspace(0, m, parts + 1).astype(np.int64)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    zero = np.zeros(50, np.int64)
    np.testing.assert_array_equal(pairs.balanced_cuts(pair_arr, zero, zero, zero, zero, 4),
                                  np.linspace(0, m, 5).astype(np.int64))
    with pytest.raises(ValueError, match="at least one run"):
        pairs.balanced_cuts(pair_arr, n, n, w, w, 0)


def test_pair_plan_rejects_graphs_out_of_range(rng):
    n = np.ones(5, dtype=np.int64)
    with pytest.raises(ValueError, match=r"pair_arr\[2\] = \(1, 5\) names a graph out of range"):
        pairs.pair_plan(np.array([[0, 0], [1, 1], [1, 5]]), n, n, n, n, n, n, 1)
    with pytest.raises(ValueError, match="one entry per graph"):
        pairs.pair_plan(np.array([[0, 0]]), n, n, n[:3], n, n, n, 1)


def test_pair_outputs_share_one_poisoned_block_and_land_in_pair_order(monkeypatch, rng):
    """A launch's outputs of mixed types in one device block (each part at an 8-byte boundary), every
    byte poisoned before the launch, read back in one copy and gathered as ``out[order] = launched``."""
    from graphkern._cuda import runtime as rt
    from graphkern.mgk import core

    class Block:  # a device buffer over host bytes
        def __init__(self, data, dtype=None, shape=None):
            self.data, self.nbytes, self.dtype, self.shape = data, data.nbytes, dtype, shape

        def memset32(self, value, stream=None):
            self.data.view(np.uint32)[:] = value

        def view(self, offset, nbytes, *, dtype, shape):
            return Block(self.data[offset:offset + nbytes], dtype, shape)

    copies = []
    monkeypatch.setattr(rt, "alloc", lambda dev, n, dtype: Block(np.zeros(n, np.uint8)))
    monkeypatch.setattr(rt, "copy_to_pageable", lambda buf, out: copies.append(buf) or np.copyto(out, buf.data) or out)
    m = 10_007
    order = rng.permutation(m)
    launched = [rng.standard_normal(m), rng.integers(-5, 100, m).astype(np.int32), rng.random(m)]
    outputs = core.PairOutputs(None, [(m, a.dtype) for a in launched] + [(3, np.int32)])
    assert [at % 8 for at, _, _ in outputs.parts] == [0] * 4 and outputs.nbytes == outputs.block.nbytes
    for view, (_, count, dtype) in zip(outputs.views, outputs.parts):
        assert view.shape == (count,) and view.dtype == dtype
        poisoned = view.data.view(dtype)
        assert np.isnan(poisoned).all() if dtype.kind == "f" else (poisoned == -1).all()
    for view, a in zip(outputs.views, launched):
        view.data.view(a.dtype)[:] = a
    *per_pair, untouched = outputs.read()
    assert len(copies) == 1 and (untouched == -1).all()
    for got, a in zip(core.in_pair_order(per_pair, order), launched):
        want = np.empty_like(a)
        want[order] = a
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "zero", "iteration", None])
def test_output_checks_find_every_bad_value(bad, rng):
    """The reductions that clear a launch's outputs let no unwritten, infinite, zero or unconverged
    value through."""
    from types import SimpleNamespace

    from graphkern.errors import NotConvergedError
    from graphkern.mgk.core import _check_written
    from graphkern.mgk.kernel import MarginalizedGraphKernel, _check_range

    m = 1000
    K, iters, resid = rng.random(m) + 0.5, rng.integers(1, 9, m).astype(np.int32), rng.random(m) * 1e-7
    at = int(rng.integers(m))
    if bad == "iteration":
        iters[at] = -1
    elif bad is not None:
        K[at] = resid[at] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "zero": 0.0}[bad]
    pair_arr = np.stack([np.arange(m), np.arange(m)], axis=1)
    s = {"dtype": np.dtype(np.float64), "p": 1.0, "q": 0.1, "tol": 1e-6, "max_iter": 9}
    written = bad in (None, "zero")
    if written:
        _check_written(K, iters, m)
    else:
        with pytest.raises(RuntimeError, match="unwritten"):
            _check_written(K, iters, m)
    if bad in ("nan", "inf", "-inf", "zero"):
        with pytest.raises(FloatingPointError, match=rf"\({at}, {at}\)"):
            _check_range([(pair_arr, K)], s)
    else:
        _check_range([(pair_arr, K)], s)
    sol = SimpleNamespace(residuals=resid, iterations=iters)
    if bad in ("nan", "inf"):  # residuals above tol (a NaN compares false)
        with pytest.raises(NotConvergedError) as info:
            MarginalizedGraphKernel._check_converged([(pair_arr, sol)], s, K)
        np.testing.assert_array_equal(info.value.pairs, [[at, at]])
    else:
        MarginalizedGraphKernel._check_converged([(pair_arr, sol)], s, K)
