"""exp(beta A) x on the GPU's SpMV paths: every SpMV variant and launch plan against SciPy, several
GPUs and their exchanges, the host-side row-block and hybrid plans, and how the degree order deals
the hubs among the devices' row blocks (the order itself: test_expm_reorder.py)."""

import time

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg

import graphkern.expm.api as expm_module
from graphkern.expm import expm_multiply, total_communicability
from test_expm import TOL, _sym, grid_graph, random_graph, rel, skewed_graph
from test_expm_reliability import _degree_order_reference
from test_expm_reorder import _emulated_device_reorder, _reference_reordered
from conftest import SANITIZER

# ----------------------------------------------------------------------------- GPU: SpMV variants, devices

def _spmv_graphs(rng, weighted):
    # 30,000 vertices: degree-ordered, the gathers meet columns on both sides of hot_cols (12,288 in
    # float64, 24,576 in float32)
    return {
        "skewed": skewed_graph(rng, 30000, [9000, 5000, 1100, 700, 40], weighted),
        "regular": grid_graph(60, 70) if not weighted else skewed_graph(rng, 4200, [], weighted),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_gpu_spmv_variants_match_scipy(variant, dtype, weighted, reorder, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.plans import hot_columns
    from graphkern.expm.api import _matrix
    for kind, A in _spmv_graphs(rng, weighted).items():
        mat = _matrix(A)
        x = rng.standard_normal(A.shape[0])
        solver = GpuLanczos(mat, dtype, devices=[0], variant=variant, basis="device", max_krylov=4,
                            breakdown=0.0, n_threads=2, reorder=reorder)
        assert solver.shares[0].hot_cols == hot_columns(reorder, dtype)
        y = solver.spmv(x)
        ref = A @ x.astype(dtype).astype(np.float64)
        assert np.max(np.abs(y - ref)) <= TOL[dtype] * np.max(np.abs(ref)) * 10, (kind, variant)


@pytest.mark.gpu
@pytest.mark.parametrize("devices, exchange", [([0], "store"),
                                               pytest.param([0, 1], "store", marks=pytest.mark.multigpu),
                                               pytest.param([0, 1], "copy", marks=pytest.mark.multigpu)])
def test_split_alpha_sum_gives_the_same_bits(devices, exchange, rng, monkeypatch):
    """alpha's block partials added by lanczos_sum_partials (grids of more than
    SPLIT_SUM_BLOCKS_PER_SM blocks per SM) or by the SpMV's last block: the same sum in the same
    order, so the same bits, with long rows (their shares are added last), in both orders and, on
    two devices, with both exchanges."""
    import graphkern.expm.gpu as eg
    from graphkern.expm import clear_cache
    A = skewed_graph(rng, 12000, [9000, 5000, 1100, 40], weighted=True)
    x = rng.standard_normal(12000)
    for reorder in ("none", "degree"):
        out = {}
        for split in (False, True):
            monkeypatch.setattr(eg, "SPLIT_SUM_BLOCKS_PER_SM", 0 if split else 10**9)
            clear_cache()
            y, info = expm_multiply(A, x, beta=0.1, backend="gpu", device=devices, spmv="rowblock", reorder=reorder,
                                    exchange=exchange)
            out[split] = (y, info.krylov_dim)
        assert out[True][1] == out[False][1] and np.array_equal(out[True][0], out[False][0]), reorder
        assert rel(out[True][0], scipy.sparse.linalg.expm_multiply(0.1 * A, x)) <= 1e-10
    clear_cache()


def test_hot_columns_cover_96_kib_of_x_only_in_degree_order():
    from graphkern.expm.plans import hot_columns
    empty = 1 << 31  # no second range
    assert hot_columns("degree", np.float64) == (12288, empty)
    assert hot_columns("degree", np.float32) == (24576, empty)
    assert hot_columns("degree", np.float64, [0, 70000]) == (12288, empty)
    all_columns = (np.iinfo(np.int32).max, empty)
    assert hot_columns("none", np.float64) == hot_columns("none", np.float32) == all_columns
    assert hot_columns("none", np.float64, [0, 500, 1000]) == all_columns


def test_hot_columns_start_every_devices_block_in_degree_order():
    """Dealt round robin by degree, each device's block of rows begins with its share of the hubs:
    the hot columns are half the budget at the start of each of the first two blocks."""
    from graphkern.expm.plans import hot_columns
    assert hot_columns("degree", np.float64, [0, 35000, 70000]) == (6144, 35000)
    assert hot_columns("degree", np.float32, [0, 35000, 70000]) == (12288, 35000)
    assert hot_columns("degree", np.float64, [0, 25, 50, 75]) == (6144, 25)


# the degree order of reorder="degree" by the NumPy reference, and as the devices build it
ORDER_SOURCES = ["reference", pytest.param("device", marks=pytest.mark.gpu)]


def _dealt_order(indptr, parts, source):
    """``(order, inverse, row pointers of P A P^T, block bounds)`` of the rows by decreasing degree
    dealt to ``parts`` devices: by the NumPy reference with graphkern's block bounds (dealt_bounds),
    or built on device 0 by graphkern.expm.order.DeviceOrder, every block's row pointers joined."""
    from graphkern.expm.lanczos import dealt_bounds
    indptr = np.asarray(indptr, dtype=np.int64)
    if source == "reference":
        return (*_degree_order_reference(indptr, parts), dealt_bounds(len(indptr) - 1, parts))
    import graphkern.expm.device as device
    from graphkern._cuda import runtime as rt
    from graphkern.expm.lanczos import CsrMatrix
    from graphkern.expm.order import DeviceOrder
    dev = rt.get_device(0)
    mat = CsrMatrix(indptr, np.zeros(int(indptr[-1]), np.int32), None)
    upload = device._SourceUpload(dev, None, mat, mat.indices, False)
    blocks = [DeviceOrder(upload, mat, parts, p, device.reserver(dev, None)) for p in range(parts)]
    pointers, base = [np.zeros(1, np.int64)], 0
    for block in blocks:
        assert np.array_equal(block.order, blocks[0].order) and np.array_equal(block.bounds, blocks[0].bounds)
        pointers.append(block.local_indptr()[1:].astype(np.int64) + base)
        base += block.nnz
    return blocks[0].order, blocks[0].inverse, np.concatenate(pointers), blocks[0].bounds


@pytest.mark.parametrize("source", ORDER_SOURCES)
def test_degree_order_deals_the_hubs_to_the_start_of_every_block(source, rng):
    A = skewed_graph(rng, 3000, [900, 500, 110, 70], weighted=False)
    indptr = A.indptr.astype(np.int64)
    order, _, _, b = _dealt_order(indptr, 2, source)
    deg = np.diff(indptr)[order]
    top = np.sort(np.diff(indptr))[::-1]
    # the four largest degrees: the first two columns of each block
    assert sorted([deg[b[0]], deg[b[0] + 1], deg[b[1]], deg[b[1] + 1]], reverse=True) == list(top[:4])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_equals_cpu(variant, dtype, rng):
    A = skewed_graph(rng, 6000, [5000, 1200, 60], weighted=True)
    x = rng.standard_normal(6000)
    y_gpu, info = expm_multiply(A, x, beta=0.1, backend="gpu", spmv=variant, dtype=dtype)
    y_cpu, _ = expm_multiply(A, x, beta=0.1, backend="cpu", dtype=dtype)
    ref = scipy.sparse.linalg.expm_multiply(0.1 * A, x)
    # float32 (unit roundoff 6e-8): the hub rows sum up to 5000 products per SpMV, so each backend
    # lands within a few 1e-5 of the answer, in its own direction (H100 runs measured
    # 2.5e-5 against SciPy for the GPU, and 4.06e-5 between GPU and CPU, on fresh random graphs):
    # each within 5e-5, hence within 1e-4 of each other.  Rounding errors scale with
    # |e^(0.1 A)| |x|, not |y|: a draw whose x nearly misses the top eigenvector has a y that many
    # times smaller (cond = |e^(0.1 A)| |x| / |y| reached 1.1e4, with a CPU error of 6.2e-5, 0.1 u
    # cond; 40 draws stayed within 1.8 u cond), so the bound grows with cond past 50.  The 1e-5 of
    # small dense graphs is checked by test_matches_dense_expm (both backends).
    top = scipy.sparse.linalg.eigsh(A.astype(np.float64), k=1, which="LA", return_eigenvectors=False)[0]
    cond = np.exp(0.1 * top) * np.linalg.norm(x) / np.linalg.norm(ref)
    f32 = max(5e-5, 1e-6 * cond)
    assert rel(y_gpu, ref) <= (1e-10 if dtype == np.float64 else f32)
    assert rel(y_cpu, ref) <= (1e-10 if dtype == np.float64 else f32)
    assert rel(y_gpu, y_cpu) <= (1e-12 if dtype == np.float64 else 2 * f32)
    assert info.backend == "gpu" and info.devices == (0,) and info.spmv in ("scalar", "vector", "rowblock", "hybrid")
    assert info.times["spmv"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("devices", [[0], pytest.param([0, 1], marks=pytest.mark.multigpu)])
@pytest.mark.parametrize("basis", ["device", "auto", "host", "none"])
def test_gates_skip_the_lookahead_and_leave_the_answer_bit_for_bit(devices, basis, rng, monkeypatch):
    """Steps queued past the check point that fixes the Krylov dimension are skipped at their gates:
    a stream held at the start of every queued interval makes each interval's gates read the host's
    decision, so exactly m first-pass SpMVs run, and the answer is the same bits as with no gates
    (and stays so in the solves after a skipped one, which reuse the workspace and its counters)."""
    import graphkern.expm.gpu as eg
    from graphkern._cuda import runtime as rt
    from graphkern.expm import clear_cache
    clear_cache()
    A = skewed_graph(rng, 9000, [7000, 2000, 300], weighted=True)
    x = rng.standard_normal(9000)
    kw = dict(beta=0.1, backend="gpu", device=devices, spmv="rowblock", basis=basis, reorder="degree", check_every=4)
    enqueue = eg.GpuLanczos.enqueue

    hold = [0.03]

    def held(self, k0, k1):
        if k0 > 0:
            for s in self.shares:
                rt.hold_stream(s.stream, hold[0])
        enqueue(self, k0, k1)

    monkeypatch.setattr(eg, "CANCEL_LOOKAHEAD", False)
    t0 = time.perf_counter()
    y_ref, info_ref = expm_multiply(A, x, **kw)
    # each interval held longer than the whole unheld call took, so the host's decision is in
    # before the gates read it however slow the host is (a sanitizer slows it many times)
    hold[0] = max(0.03, time.perf_counter() - t0)
    monkeypatch.setattr(eg, "CANCEL_LOOKAHEAD", True)
    monkeypatch.setattr(eg.GpuLanczos, "enqueue", held)
    second = info_ref.n_spmv - (info_ref.krylov_dim + 4)  # basis "none": the second pass
    for _ in range(2):
        y, info = expm_multiply(A, x, **kw)
        assert info.krylov_dim == info_ref.krylov_dim
        assert np.array_equal(y, y_ref)
        if SANITIZER:  # the hold is a device wait, the decision host work that a sanitizer slows far more
            assert info.krylov_dim + second <= info.n_spmv <= info_ref.n_spmv
        else:
            assert info.n_spmv == info.krylov_dim + second < info_ref.n_spmv
    monkeypatch.setattr(eg.GpuLanczos, "enqueue", enqueue)
    y, info = expm_multiply(A, x, **kw)
    assert np.array_equal(y, y_ref) and info.krylov_dim <= info.n_spmv - second <= info.krylov_dim + 4
    assert rel(y_ref, scipy.sparse.linalg.expm_multiply(0.1 * A, x)) <= 1e-10
    clear_cache()


@pytest.mark.gpu
def test_gpu_bad_device_is_refused():
    with pytest.raises(ValueError, match="does not exist"):
        expm_multiply(_sym(), backend="gpu", device=999)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("basis", ["device", "host", "none"])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_two_gpus_equal_one(variant, basis, reorder, rng):
    A = skewed_graph(rng, 9000, [7000, 2000, 300], weighted=True)
    x = rng.standard_normal(9000)
    y1, info1 = expm_multiply(A, x, beta=0.1, backend="gpu", device=0, spmv=variant, basis=basis, reorder="none")
    y2, info2 = expm_multiply(A, x, beta=0.1, backend="gpu", device=[0, 1], spmv=variant, basis=basis,
                              reorder=reorder)
    y21, _ = expm_multiply(A, x, beta=0.1, backend="gpu", device=[1, 0], spmv=variant, basis=basis, reorder=reorder)
    # alpha and beta are summed in another order on two devices (and rows in another order when
    # degree-ordered): rounding-level differences only
    assert info2.devices == (0, 1) and info2.reorder == reorder and abs(info2.krylov_dim - info1.krylov_dim) <= 4
    assert rel(y2, y1) <= 1e-11 and rel(y21, y1) <= 1e-11


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("variant", ["scalar", "vector", "rowblock", "hybrid"])
@pytest.mark.parametrize("reorder", ["none", "degree"])
def test_two_gpu_spmv_matches_scipy(variant, reorder, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.api import _matrix
    A = skewed_graph(rng, 12000, [9000, 5000, 40], weighted=True)
    x = rng.standard_normal(12000)
    solver = GpuLanczos(_matrix(A), np.float64, devices=[0, 1], variant=variant, basis="none", max_krylov=4,
                        breakdown=0.0, n_threads=2, reorder=reorder)
    if reorder == "degree":  # the vertices dealt round robin by degree: equal rows, nonzeros within a hub
        assert abs(solver.shares[0].nrows - solver.shares[1].nrows) <= 1
        assert abs(solver.shares[0].rows.nnz - solver.shares[1].rows.nnz) <= 9000
    ref = A @ x
    assert np.max(np.abs(solver.spmv(x) - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("exchange", ["store", "copy"])
@pytest.mark.parametrize("basis", ["device", "none"])
def test_two_shares_of_one_device_agree_with_one(exchange, basis, rng, monkeypatch):
    """The solve over several devices (rows in shares, the exchanges, each device's slots, the
    kernels' share and row-peer parameters) run as two shares of one GPU: the answer of one share."""
    A = skewed_graph(rng, 9001, [7000, 2000, 300], weighted=True)
    x = rng.standard_normal(9001)
    y1, info1 = expm_multiply(A, x, beta=0.1, backend="gpu", device=0, basis=basis)
    monkeypatch.setattr(expm_module, "resolve_devices", lambda device: [0, 0])
    for variant in ("scalar", "rowblock", "hybrid"):
        for reorder in ("none", "degree"):
            y2, info2 = expm_multiply(A, x, beta=0.1, backend="gpu", device=[0, 0], basis=basis, spmv=variant,
                                      reorder=reorder, exchange=exchange)
            assert info2.devices == (0, 0) and info2.exchange == exchange
            assert abs(info2.krylov_dim - info1.krylov_dim) <= 4
            assert rel(y2, y1) <= 1e-11, (variant, reorder)


def mirrored_halves_graph(rng, half, weighted=False):
    """A graph whose two halves mirror each other (vertex v and v + half have the same neighbourhood
    up to the shift), so that two devices in A's order split it exactly at ``half``: a random graph
    on the first fifth of each half (rows whose columns are all local), a random bipartite graph
    between the second fifths of the two halves (all remote), a few vertices joined to both (mixed),
    and the rest isolated (empty rows)."""
    q = half // 5
    a = sp.triu(sp.random(q, q, density=6.0 / q, random_state=rng, format="coo"), k=1)
    local_r, local_c = a.row, a.col
    b = sp.random(q, q, density=5.0 / q, random_state=rng, format="coo")  # (u, v): u in half 0, v in half 1
    cross_r, cross_c = q + b.row, q + b.col
    mixed = rng.choice(q, 3, replace=False)  # local vertices that also reach the other half
    rows, cols = [local_r, local_r + half], [local_c, local_c + half]
    rows += [cross_r, cross_c]
    cols += [cross_c + half, cross_r + half]  # (u, v + half) and its mirror (v, u + half)
    for m in mixed:
        far = rng.choice(q, 40, replace=False)
        rows += [np.full(40, m), np.full(40, m + half)]
        cols += [far + half, far]
    r, c = np.concatenate(rows), np.concatenate(cols)
    values = rng.uniform(0.5, 2.0, len(r)) if weighted else np.ones(len(r))
    upper = sp.csr_matrix((values, (r, c)), shape=(2 * half, 2 * half))
    upper.sum_duplicates()
    upper.data[:] = np.minimum(upper.data, 2.0) if weighted else 1.0
    return (upper + upper.T).tocsr()


def test_mirrored_halves_graph_has_local_remote_and_empty_rows(rng):
    from graphkern.expm.lanczos import row_chunks
    half = 1500
    A = mirrored_halves_graph(rng, half)
    assert abs(A - A.T).max() == 0
    assert row_chunks(A.indptr, 2)[1] == half  # two devices split it between the halves
    owner = (np.arange(2 * half) >= half)
    deg = np.diff(A.indptr)
    row_of = np.repeat(np.arange(2 * half), deg)
    remote = owner[A.indices] != owner[row_of]
    remote_per_row = np.bincount(row_of, weights=remote, minlength=2 * half)
    assert np.any((deg > 0) & (remote_per_row == 0))      # all columns local
    assert np.any((deg > 0) & (remote_per_row == deg))    # all columns remote
    assert np.any((remote_per_row > 0) & (remote_per_row < deg))  # both
    assert np.any(deg == 0)                                # empty rows


@pytest.mark.parametrize("source", ORDER_SOURCES)
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_degree_order_is_dealt_round_robin_across_devices(parts, source, rng):
    A = skewed_graph(rng, 3001, [900, 400, 400, 60])
    deg = np.diff(A.indptr)
    by_degree = np.argsort(-deg, kind="stable")
    assert np.all(np.diff(deg[by_degree]) <= 0)
    order, inverse, indptr, bounds = _dealt_order(A.indptr, parts, source)
    assert np.array_equal(np.sort(order), np.arange(3001))
    assert np.array_equal(inverse[order], np.arange(3001))
    assert np.array_equal(indptr, np.concatenate([[0], np.cumsum(deg[order])]))
    assert bounds[0] == 0 and bounds[-1] == 3001 and len(bounds) == parts + 1
    assert np.all(np.abs(np.diff(bounds) - 3001 / parts) < 1)
    block_nnz = np.diff(indptr[bounds])
    assert block_nnz.max() - block_nnz.min() <= deg.max()  # each block gets every parts-th row by degree
    for p in range(parts):
        block = order[bounds[p]:bounds[p + 1]]
        assert np.array_equal(block, by_degree[p::parts])  # its hubs first, degrees decreasing
    # the device reorder of each block is that block of P A P^T
    B = _reference_reordered(A, order)
    for p in range(parts):
        part = _emulated_device_reorder(A, order, inverse, indptr, int(bounds[p]), int(bounds[p + 1]))
        assert (part != B[bounds[p]:bounds[p + 1]]).nnz == 0


def _devices_available():
    from graphkern._cuda import runtime
    return runtime.device_count() if runtime.unavailable_reason() is None else 0


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("exchange", ["store", "copy"])
@pytest.mark.parametrize("basis", ["device", "none", "host"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["mirrored halves", "skewed degree-ordered"])
def test_multi_gpu_exchanges_agree_with_one_gpu_and_scipy(exchange, basis, dtype, kind, rng):
    from graphkern.expm.api import _matrix
    from graphkern.expm.gpu import GpuLanczos
    if kind == "mirrored halves":
        A, reorder, beta = mirrored_halves_graph(rng, 1500, weighted=True), "none", 0.2
    else:
        A, reorder, beta = skewed_graph(rng, 9001, [7000, 2000, 300, 300], weighted=True), "degree", 0.1
    n = A.shape[0]
    x = rng.standard_normal(n)
    ref = scipy.sparse.linalg.expm_multiply(beta * A, x)
    y1, info1 = expm_multiply(A, x, beta=beta, backend="gpu", device=0, basis=basis, dtype=dtype, reorder=reorder)
    # float32: sums of up to 7000 terms in a different order on each device count; each answer is
    # held to the float64 one first (so a failure says which is off), two answers to twice that
    near = 1e-10 if dtype == np.float64 else 1e-4
    assert rel(y1, ref) <= near
    tol = 1e-11 if dtype == np.float64 else 2 * near
    counts = [2, 3] if _devices_available() >= 3 else [2]
    for count in counts:
        devices = list(range(count))
        solver = GpuLanczos(_matrix(A), dtype, devices=devices, variant="rowblock", basis=basis, max_krylov=8,
                            breakdown=0.0, n_threads=2, reorder=reorder, exchange=exchange)
        assert solver.exchange == ("copy" if exchange == "copy" or not solver.res.peer_access else "store")
        solver_exchange = solver.exchange
        if kind == "mirrored halves" and count == 2:
            assert solver.shares[0].row1 == 1500  # rows with all columns local, all remote, none
        del solver
        for variant in ("scalar", "rowblock", "hybrid"):
            y, info = expm_multiply(A, x, beta=beta, backend="gpu", device=devices, basis=basis, dtype=dtype,
                                    spmv=variant, reorder=reorder, exchange=exchange)
            assert info.devices == tuple(devices) and info.reorder == reorder
            assert info.exchange == solver_exchange
            assert abs(info.krylov_dim - info1.krylov_dim) <= 4
            assert rel(y, ref) <= near, (count, variant)
            assert rel(y, y1) <= tol, (count, variant)
        # the device list in another order: another lead device, the same answer
        y_rev, _ = expm_multiply(A, x, beta=beta, backend="gpu", device=devices[::-1], basis=basis, dtype=dtype,
                                 reorder=reorder, exchange=exchange)
        assert rel(y_rev, y1) <= tol


@pytest.mark.gpu
@pytest.mark.multigpu
def test_multi_gpu_exchanges_give_the_same_bits(rng):
    """Stores and copies move the same numbers: the two exchanges give bit-identical answers (and
    repeated runs too), with the default x, overflow scaling, and a device left without rows."""
    A = skewed_graph(rng, 6000, [4000, 900], weighted=True)
    x = rng.standard_normal(6000)
    out = {}
    _, probe = expm_multiply(A, x, beta=0.1, backend="cpu")
    beta_big = 800.0 / probe.lambda_max  # e^800 overflows float64: a scaled answer
    for exchange in ("store", "copy", "store"):
        kw = dict(backend="gpu", device=[0, 1], exchange=exchange)
        for reorder in ("none", "degree"):
            y, info = expm_multiply(A, x, beta=0.1, reorder=reorder, **kw)
            tc, _ = total_communicability(A, beta=0.1, reorder=reorder, **kw)
            big, big_info = expm_multiply(A, x, beta=beta_big, reorder=reorder, **kw)
            assert big_info.log_scale > 0 and np.all(np.isfinite(big))
            key = (exchange, reorder)
            if key in out:
                assert all(np.array_equal(a, b) for a, b in zip(out[key], (y, tc, big)))
            out[key] = (y, tc, big)
    for reorder in ("none", "degree"):
        assert all(np.array_equal(a, b) for a, b in zip(out[("store", reorder)], out[("copy", reorder)]))
    y_one, _ = expm_multiply(A, x, beta=0.1, backend="gpu", device=0, reorder="none")
    assert rel(out[("store", "none")][0], y_one) <= 1e-11
    # fewer rows than devices leave one device with none
    tiny = sp.csr_matrix(np.array([[0.0]]))
    y_tiny, _ = expm_multiply(tiny, np.array([2.0]), beta=1.0, backend="gpu", device=[0, 1])
    assert np.allclose(y_tiny, [2.0], rtol=1e-15)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("kind", ["mirrored halves", "grid"])
def test_peer_masks_mark_the_rows_other_devices_read(kind, rng):
    from graphkern.expm.gpu import GpuLanczos
    from graphkern.expm.api import _matrix
    A = mirrored_halves_graph(rng, 1500) if kind == "mirrored halves" else grid_graph(80, 75)
    n = A.shape[0]
    solver = GpuLanczos(_matrix(A), np.float64, devices=[0, 1], variant="scalar", basis="none", max_krylov=4,
                        breakdown=0.0, n_threads=2, reorder="none")
    if not solver.res.peer_access:
        pytest.skip("no peer access between devices 0 and 1: the copy exchange sends every row")
    for r, other in ((solver.res.rows[0], solver.res.rows[1]), (solver.res.rows[1], solver.res.rows[0])):
        read = np.zeros(n, dtype=bool)
        read[A[other.row0:other.row1].indices] = True
        assert np.array_equal(r.peer_mask.to_host()[:r.nrows] != 0, read[r.row0:r.row1])
    if kind == "grid":  # only the rows along the cut cross: one grid row of 75 (and a neighbour when cut mid-row)
        assert int(np.count_nonzero(solver.res.rows[0].peer_mask.to_host()[:solver.res.rows[0].nrows])) <= 76
    x = rng.standard_normal(n)
    y, _ = expm_multiply(A, x, beta=0.3, backend="gpu", device=[0, 1], spmv="scalar", reorder="none")
    assert rel(y, scipy.sparse.linalg.expm_multiply(0.3 * A, x)) <= 1e-10


@pytest.mark.gpu
@pytest.mark.multigpu
def test_bad_exchange_is_refused():
    with pytest.raises(ValueError, match="exchange"):
        expm_multiply(_sym(), backend="gpu", device=[0, 1], exchange="teleport")

# ----------------------------------------------------------------------------- SpMV plans (host side)

def _plan_graphs(rng):
    return {
        "skewed": skewed_graph(rng, 30000, [25000, 9000, 4097, 4096, 1025, 1024, 600, 17, 16]),
        "empty rows": sp.block_diag([sp.csr_matrix((5000, 5000)), skewed_graph(rng, 3000, [2000])]).tocsr(),
        "grid": grid_graph(80, 90),
    }


@pytest.mark.parametrize("kind", ["skewed", "empty rows", "grid"])
def test_rowblock_plan_covers_every_row_once_within_the_kernel_limits(kind, rng):
    from graphkern.expm import plans as g
    A = _plan_graphs(rng)[kind]
    indptr = A.indptr.astype(np.int64)
    n = A.shape[0]
    plan = g.SpmvPlan("rowblock", indptr, 1.0)
    tasks = plan.tasks
    covered = np.zeros(n, dtype=np.int64)
    segments = {}
    last_row = -1
    for t in tasks:
        if t[0] == g.TASK_STREAM:
            r0, r1, e0, e1 = t[1:5]
            assert r0 > last_row and r0 < r1 <= n
            assert r1 - r0 <= g.STREAM_ROWS and e1 - e0 <= g.STREAM_CAPACITY
            assert e0 == indptr[r0] and e1 == indptr[r1]
            assert np.all(np.diff(indptr[r0:r1 + 1]) <= g.LONG_ROW)
            covered[r0:r1] += 1
            last_row = r1 - 1
        else:
            assert t[0] == g.TASK_LONG
            row, e0, e1, seg_base, seg_index, n_seg, long_index = t[1:]
            assert indptr[row + 1] - indptr[row] > g.LONG_ROW and 0 < e1 - e0 <= g.LONG_SEGMENT
            segments.setdefault(row, []).append((seg_index, e0, e1, seg_base, n_seg, long_index))
            last_row = row
    for row, segs in segments.items():
        segs.sort()
        assert [s[0] for s in segs] == list(range(segs[0][4]))
        assert segs[0][1] == indptr[row] and segs[-1][2] == indptr[row + 1]
        assert all(a[2] == b[1] for a, b in zip(segs, segs[1:]))
        assert len({s[3] for s in segs}) == 1 and len({s[5] for s in segs}) == 1
        covered[row] += 1
    assert np.all(covered == 1)
    bases = sorted({s[0][3] for s in segments.values()})
    assert plan.n_long == len(segments) and plan.n_segments == sum(len(s) for s in segments.values())
    assert sorted({s[0][5] for s in segments.values()}) == list(range(plan.n_long))
    assert bases == sorted(set(bases)) and (not bases or bases[0] == 0)


def _rowblock_reference(indptr):
    """The row-block task table by NumPy: cuts at 0 and n, at the first row reaching each multiple
    of the block cost (searchsorted over ``indptr + row``) and around every long row; each long
    row's block replaced by its segments."""
    from graphkern.expm import plans as g

    n = len(indptr) - 1
    if n == 0:
        return np.zeros((1, g.TASK_WIDTH), dtype=np.int64), 0, 0
    cost = indptr[:-1].astype(np.int64) + np.arange(n)
    targets = np.arange(g.ROWBLOCK_COST, int(indptr[-1]) + n, g.ROWBLOCK_COST)
    long_rows = np.flatnonzero(np.diff(indptr) > g.LONG_ROW)
    cuts = np.unique(np.concatenate([[0, n], np.searchsorted(cost, targets), long_rows, long_rows + 1]))
    rows = []
    segments = 0
    for long_index, (r0, r1) in enumerate((int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        if r1 - r0 == 1 and e1 - e0 > g.LONG_ROW:
            k = -(-(e1 - e0) // g.LONG_SEGMENT)
            rows += [[g.TASK_LONG, r0, e0 + j * g.LONG_SEGMENT, min(e0 + (j + 1) * g.LONG_SEGMENT, e1), segments, j, k,
                      int(np.searchsorted(long_rows, r0))] for j in range(k)]
            segments += k
        else:
            rows.append([g.TASK_STREAM, r0, r1, e0, e1, 0, 0, 0])
    return np.array(rows, dtype=np.int64), segments, len(long_rows)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_rowblock_tasks_match_their_numpy_definition(dtype, rng):
    """The compiled two-pass plan gives the NumPy task table bit for bit, with any number of threads
    (ranges of rows that hold no cut, long rows at range edges, empty rows, one row)."""
    from graphkern._cpu.expm import rowblock_tasks
    from graphkern.expm import plans as g

    draws = [lambda n: rng.integers(0, 5, n), lambda n: rng.zipf(1.5, n).clip(0, 50_000),
             lambda n: rng.integers(0, 3000, n), lambda n: np.eye(1, n, int(rng.integers(n)), dtype=int)[0] * 10**5,
             lambda n: np.zeros(n, dtype=int), lambda n: np.full(n, g.LONG_ROW + 1)]
    for draw in draws:
        for n in (1, 2, int(rng.integers(3, 4000)), int(rng.integers(40_000, 70_000))):
            indptr = np.concatenate([[0], np.cumsum(draw(n))]).astype(dtype)
            tasks, segments, longs = _rowblock_reference(indptr)
            for threads in (1, 2, 5):
                got = rowblock_tasks(indptr, g.ROWBLOCK_COST, g.LONG_ROW, g.LONG_SEGMENT, g.TASK_STREAM, g.TASK_LONG,
                                     threads)
                np.testing.assert_array_equal(got[0], tasks)
                assert got[1:] == (segments, longs)
    plan = g.SpmvPlan("rowblock", np.zeros(1, dtype=dtype), 0.0)
    np.testing.assert_array_equal(plan.tasks, np.zeros((1, g.TASK_WIDTH)))  # one empty block keeps the grid valid


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_rebased_indptr_is_the_shifted_slice(dtype, rng):
    from graphkern._cpu.expm import rebased_indptr
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 9, 100_000))]).astype(dtype)
    for row0, row1 in ((0, 100_000), (37, 37), (500, 99_000)):
        for wide in (False, True):
            got = rebased_indptr(indptr, row0, row1, int(indptr[row0]), wide, 3)
            assert got.dtype == (np.int64 if wide else np.int32)
            np.testing.assert_array_equal(got, indptr[row0:row1 + 1] - indptr[row0])


@pytest.mark.gpu
def test_gpu_timeline_has_each_devices_kernel_seconds():
    """info.timeline: per device its rows, SpMV, update and waiting seconds over the counted steps;
    the lead device's SpMV seconds are info.times["spmv"]."""
    A = skewed_graph(np.random.default_rng(3), 20000, [3000, 500])
    _, info = expm_multiply(A, beta=0.1, backend="gpu", device=0)
    (lead,) = info.timeline
    assert lead["device"] == 0 and lead["rows"] == A.shape[0] and 0 < lead["steps"] <= info.n_spmv
    assert lead["spmv"] == info.times["spmv"] and lead["vector"] > 0 and lead["wait"] >= 0
    _, cpu = expm_multiply(A, beta=0.1, backend="cpu")
    assert cpu.timeline == ()


@pytest.mark.parametrize("kind", ["skewed", "empty rows", "grid"])
def test_hybrid_plan_covers_every_row_once(kind, rng):
    from graphkern.expm import plans as g
    A = _plan_graphs(rng)[kind]
    indptr = A.indptr.astype(np.int64)
    n = A.shape[0]
    deg = np.diff(indptr)
    plan = g.SpmvPlan("hybrid", indptr, 1.0)
    covered = np.zeros(n, dtype=np.int64)
    for t in plan.tasks:
        if t[0] == g.TASK_LONG:
            if t[5] == 0:
                covered[t[1]] += 1
            continue
        rows = plan.rowlist[t[1]:t[2]]
        if t[0] == g.TASK_THREAD_LIST:
            assert t[2] - t[1] <= g.BLOCK and np.all(deg[rows] <= g.HYBRID_SHORT)
        else:
            assert t[0] == g.TASK_WARP_LIST and t[2] - t[1] <= g.HYBRID_ROWS_PER_WARP_BLOCK
            assert np.all((deg[rows] > g.HYBRID_SHORT) & (deg[rows] <= g.LONG_ROW))
        covered[rows] += 1
    assert np.all(covered == 1)


def test_auto_variant_from_degree_statistics(rng):
    from graphkern.expm.plans import choose_variant
    assert choose_variant(expm_module._matrix(grid_graph(30, 40))) == "scalar"
    assert choose_variant(expm_module._matrix(skewed_graph(rng, 3000, [1500]))) == "rowblock"
    assert choose_variant(expm_module._matrix(random_graph(rng, 400, 0.1))) == "rowblock"


def test_vector_lanes_round_the_mean_degree_on_a_log_scale():
    from graphkern.expm.plans import sub_warp_size
    assert [sub_warp_size(m) for m in (1.0, 3.9, 5.9, 10.0, 12.0, 40.0, 300.0)] == [2, 4, 8, 8, 16, 32, 32]
