"""The compiled CSR checks against a NumPy/SciPy reference, on fresh random matrices."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph
from graphkern._arrays import scan
from graphkern._cpu import validate
from graphkern.graph import as_csr_matrix


def reference_verdict(A):
    """What the checks must say about a square csr_matrix ``A``, from SciPy arithmetic."""
    A = A.copy()
    A.sum_duplicates()
    if not np.all(np.isfinite(A.data)):
        return "nonfinite"
    diff = A - A.T
    diff.eliminate_zeros()
    P = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    pattern = P - P.T
    pattern.eliminate_zeros()
    if diff.nnz or pattern.nnz:
        return "asymmetric"
    return "ok"


def fast_verdict(A):
    try:
        as_csr_matrix(A, name="A")
    except ValueError as err:
        return "nonfinite" if "NaN or infinite" in str(err) else "asymmetric" if "not symmetric" in str(err) else str(err)
    return "ok"


def random_matrix(rng, kind):
    n = int(rng.integers(1, 40))
    A = sp.random(n, n, density=float(rng.uniform(0.02, 0.4)), random_state=rng, format="csr")
    A.data = rng.integers(1, 4, A.nnz).astype(float)
    S = (A + A.T).tocsr()
    if kind == "symmetric" or S.nnz == 0:
        return S
    k = int(rng.integers(S.nnz))
    if kind == "value":
        S.data[k] += 1.0
    elif kind == "nan":
        S.data[k] = np.nan
    elif kind == "explicit_zero":  # a stored zero without its mirror is an asymmetric edge
        S = S.tolil()
        i, j = int(rng.integers(n)), int(rng.integers(n))
        if i != j and S[i, j] == 0 and S[j, i] == 0:
            S = S.tocsr()
            S = sp.csr_matrix((np.append(S.data, 0.0), np.append(S.indices, j),
                               np.append(S.indptr[:i + 1], S.indptr[i + 1:] + 1)), shape=S.shape)
        else:
            S = S.tocsr()
    elif kind == "drop":
        S = S.tolil()
        i = int(np.repeat(np.arange(n), np.diff(S.tocsr().indptr))[k])
        j = int(S.tocsr().indices[k])
        S[i, j] = 0
        S = S.tocsr()
        S.eliminate_zeros()
    elif kind == "duplicates":  # an unsorted COO with duplicates that sum to a symmetric matrix
        C = S.tocoo()
        half = C.data / 2
        S = sp.coo_matrix((np.concatenate([half, half])[::-1], (np.concatenate([C.row, C.row])[::-1],
                                                                  np.concatenate([C.col, C.col])[::-1])),
                          shape=S.shape).tocsr(copy=False)
        S = sp.csr_matrix((S.data, S.indices, S.indptr), shape=S.shape)
    return S


@pytest.mark.parametrize("kind", ["symmetric", "value", "nan", "explicit_zero", "drop", "duplicates"])
def test_fast_check_agrees_with_scipy_reference(rng, kind):
    for _ in range(40):
        A = random_matrix(rng, kind)
        assert fast_verdict(A) == reference_verdict(A), (kind, A.toarray())


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("value_dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_scan_finds_the_first_entry_of_each_problem(rng, index_dtype, value_dtype):
    for _ in range(20):
        n = int(rng.integers(1, 30))
        nnz = int(rng.integers(0, 4 * n))
        rows = np.sort(rng.integers(0, n, nnz))
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        indices = rng.integers(-1, n + 1, nnz).astype(index_dtype)
        values = rng.integers(-1, 3, nnz).astype(value_dtype)
        got = scan(indptr, indices, values, symmetric=True, signed=True)
        # reference: first positions from NumPy, entry by entry
        r = np.repeat(np.arange(n), np.diff(indptr))
        same_row = np.concatenate([[False], r[1:] == r[:-1]]) if nnz else np.zeros(0, bool)
        prev = np.concatenate([[0], indices[:-1]]) if nnz else indices
        in_range = (indices >= 0) & (indices < n)
        v = values.astype(np.float64) if values.dtype.kind == "f" else values.astype(np.int64)

        def first(mask):
            hit = np.flatnonzero(mask)
            return hit[0] if hit.size else nnz

        assert got[validate.KINDS.index("range")] == first(~in_range)
        prev_in = same_row & in_range
        assert got[validate.KINDS.index("unsorted")] == first(prev_in & (indices < prev))
        assert got[validate.KINDS.index("duplicate")] == first(prev_in & (indices == prev))
        assert got[validate.KINDS.index("negative")] == first(in_range & (v < 0))
        assert got[validate.KINDS.index("not_one")] == first(in_range & (v != 1))
        if min(got[validate.KINDS.index(k)] for k in ("unsorted", "range", "duplicate")) == nnz:
            stored = {(int(a), int(b)): val for a, b, val in zip(r, indices, v)}
            missing = [(int(b), int(a)) not in stored for a, b in zip(r, indices)]
            differs = [not m and stored[(int(b), int(a))] != val for m, a, b, val in zip(missing, r, indices, v)]
            assert got[validate.KINDS.index("mirror_missing")] == first(np.array(missing, bool))
            assert got[validate.KINDS.index("mirror_differs")] == first(np.array(differs, bool))


def test_mirror_positions_match_a_dictionary(rng):
    G = Graph.from_scipy(random_matrix(rng, "symmetric"))
    mirror = validate.mirror_positions(G.indptr.astype(np.int64), G.indices, 2)
    r = np.repeat(np.arange(G.n_nodes), np.diff(G.indptr))
    pos = {(int(a), int(b)): k for k, (a, b) in enumerate(zip(r, G.indices))}
    assert [pos[(int(b), int(a))] for a, b in zip(r, G.indices)] == mirror.tolist()


def test_graph_messages_name_the_entry():
    with pytest.raises(ValueError, match=r"entry \(0, 1\) is stored but \(1, 0\) is not"):
        Graph([0, 1, 1], [1])
    with pytest.raises(ValueError, match=r"duplicate entry \(0, 1\)"):
        Graph([0, 2, 2], [1, 1])
    with pytest.raises(ValueError, match=r"edge index 5 out of range for a graph of 2 nodes"):
        Graph([0, 1, 2], [5, 0])
    with pytest.raises(ValueError, match=r"negative edge weight -1.0 on edge \(0, 1\)"):
        Graph([0, 1, 2], [1, 0], [-1.0, -1.0])
    with pytest.raises(ValueError, match=r"weight of \(0, 1\) differs from its mirror"):
        Graph([0, 1, 2], [1, 0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"not finite"):
        Graph([0, 1, 2], [1, 0], [np.nan, np.nan])
    with pytest.raises(ValueError, match=r"indptr must start at 0 and never decrease"):
        Graph([0, 2, 1, 2], [1, 0], validate=True)


def test_unsorted_rows_are_sorted_with_their_values():
    G = Graph([0, 2, 3, 4], [2, 1, 0, 0], [5.0, 7.0, 7.0, 5.0])
    assert G.indices.tolist() == [1, 2, 0, 0] and G.weights.tolist() == [7.0, 5.0, 7.0, 5.0]


def test_symmetrize_keeps_the_upper_value():
    G = Graph([0, 1, 2], [1, 0], [1.0, 2.0], symmetrize=True)
    assert G.weights.tolist() == [1.0, 1.0]
    H = Graph([0, 1, 1], [1], [3.0], symmetrize=True)
    assert H.indices.tolist() == [1, 0] and H.weights.tolist() == [3.0, 3.0]


def test_canonical_scipy_input_is_neither_copied_nor_its_flags_changed(rng):
    A = random_matrix(rng, "symmetric")
    A.has_sorted_indices = False  # the caller's flags are left as they are
    M, _ = as_csr_matrix(A)
    assert M.has_canonical_format and not A.has_sorted_indices
    # an empty matrix's arrays hold no memory to share (about 2% of the draws have no entries)
    assert A.nnz == 0 or (np.shares_memory(M.indices, A.indices) and np.shares_memory(M.data, A.data))


def test_content_hash_blocks_depend_on_every_word(rng):
    words = rng.integers(0, 2**63, 100_000, dtype=np.uint64)
    base = validate.content_hash_blocks(words, 1 << 12, 2)
    for k in rng.integers(0, len(words), 20):
        w = words.copy()
        w[k] ^= np.uint64(1) << np.uint64(int(rng.integers(64)))
        assert not np.array_equal(validate.content_hash_blocks(w, 1 << 12, 2), base)
    assert np.array_equal(validate.content_hash_blocks(words, 1 << 12, 1), base)  # threads do not matter


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_mirror_walk_agrees_with_binary_searches(rng, n_threads):
    for _ in range(300):
        n = int(rng.integers(1, 30))
        rows, cols = rng.integers(0, n, (2, int(rng.integers(0, 4 * n))))
        M = np.zeros((n, n), bool)
        M[rows, cols] = True
        if rng.random() < 0.7:
            M |= M.T
        r, c = np.nonzero(M)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))]).astype(np.int64)
        c = np.ascontiguousarray(c)
        values = rng.integers(0, 2, len(c)).astype(np.float64)
        walk = validate.is_symmetric(indptr, c, values, has_values=True, n_threads=n_threads)
        exact = validate.scan_csr(indptr, c, values, has_values=True, symmetric=True, signed=False, n_threads=2)
        symmetric = exact[validate.KINDS.index("mirror_missing")] == exact[validate.KINDS.index("mirror_differs")] \
            == len(c)
        assert (walk == 0) == symmetric


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("value_dtype", [np.float64, np.float32, np.int64, None])
def test_mirror_sums_agree_with_the_exact_walk(rng, n_threads, value_dtype):
    """Symmetric matrices (values mirrored, -0.0 against 0.0 included) give equal sums; one entry
    moved, dropped or changed by one unit in its last place gives unequal ones."""
    key = int(rng.integers(0, 2**63))
    for _ in range(200):
        n = int(rng.integers(1, 30))
        A = sp.random(n, n, density=float(rng.uniform(0.05, 0.5)), random_state=rng, format="csr")
        A = (A + A.T).tocsr()
        if value_dtype is not None and value_dtype != np.int64:
            A.data = (A.data * 10).astype(value_dtype)
        else:
            A.data = rng.integers(-3, 4, A.nnz).astype(np.float64)
            A = (sp.triu(A) + sp.triu(A, 1).T).tocsr()  # keep it symmetric after the redraw
            if value_dtype is not None:
                A.data = A.data.astype(np.int64)
        A.sort_indices()
        change = rng.integers(0, 4) if A.nnz else 0
        B = A.copy()
        if change == 1:  # a value one ulp (or one unit) off
            k = int(rng.integers(B.nnz))
            B.data[k] = np.nextafter(B.data[k], np.inf) if B.dtype.kind == "f" else B.data[k] + 1
        elif change == 2:  # an entry dropped
            B = sp.csr_matrix(B.toarray() * (rng.random((n, n)) > 0.05))
            B.sort_indices()
        elif change == 3:  # an entry moved within its row
            B = B.tolil()
            i = int(rng.integers(n))
            B[i, int(rng.integers(n))] = 1
            B = B.tocsr()
            B.sort_indices()
        ptr = B.indptr.astype(np.int64)
        vals = np.ones(1) if value_dtype is None else np.ascontiguousarray(B.data)
        fwd, bwd = validate.mirror_sums(ptr, B.indices, vals, has_values=value_dtype is not None, key=key,
                                        n_threads=n_threads)
        exact = validate.is_symmetric(ptr, B.indices, vals, has_values=value_dtype is not None, n_threads=1)
        assert (fwd == bwd) == (exact == 0), (change, value_dtype)
    if value_dtype in (np.float64, np.float32):  # 0.0 mirrored by -0.0: equal, as the exact walk says
        ptr, idx = np.array([0, 1, 2], np.int64), np.array([1, 0], np.int32)
        vals = np.array([0.0, -0.0], value_dtype)
        fwd, bwd = validate.mirror_sums(ptr, idx, vals, has_values=True, key=key, n_threads=n_threads)
        assert fwd == bwd and validate.is_symmetric(ptr, idx, vals, has_values=True, n_threads=1) == 0


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_row_pointer_check_finds_the_first_bad_row(dtype, rng):
    n = 20_000  # several parallel blocks
    ptr = np.concatenate([[0], np.cumsum(rng.integers(0, 4, n))]).astype(dtype)
    nnz = int(ptr[-1])
    for threads in (1, 2):
        assert validate.check_indptr(ptr, nnz, threads) == -1
        assert validate.check_indptr(ptr, nnz + 1, threads) == n
        bad = ptr.copy()
        bad[[15_000, 7_001]] = -1  # rows 7_000 and 14_999 are the first to decrease in their blocks
        assert validate.check_indptr(bad, nnz, threads) == 7_000
        bad = ptr.copy()
        bad[0] = 1
        assert validate.check_indptr(bad, nnz, threads) == 0
    assert validate.check_indptr(np.zeros(1, dtype), 0, 2) == -1
    assert validate.check_indptr(np.zeros(1, dtype), 3, 2) == 0


def reference_flags(indptr, indices, values, n_cols, *, check_negative, check_symmetry):
    """(flags, first) that cuda_src/common/csr_check.cuh must report, from NumPy (sorted rows for symmetry)."""
    from graphkern._cuda.csr_check import ASYMMETRIC, INDPTR, NEGATIVE, NONFINITE, RANGE, UNSORTED
    n, nnz = len(indptr) - 1, len(indices)
    if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
        return INDPTR, None  # the other flags are meaningless then
    rows = np.repeat(np.arange(n), np.diff(indptr))
    bad = {}
    bad[RANGE] = (indices < 0) | (indices >= n_cols)
    starts = np.zeros(nnz, bool)
    starts[indptr[:-1][np.diff(indptr) > 0]] = True
    prev = np.concatenate([[np.iinfo(np.int64).min], indices[:-1]])
    bad[UNSORTED] = ~starts & (prev >= indices)
    if values is not None and values.dtype.kind == "f":
        bad[NONFINITE] = ~np.isfinite(values)
    if values is not None and check_negative and values.dtype.kind in "fi":
        bad[NEGATIVE] = np.signbit(values)
    if check_symmetry:
        D = {(int(r), int(c)): (None if values is None else values[k].tobytes())
             for k, (r, c) in enumerate(zip(rows, indices))}
        bad[ASYMMETRIC] = np.array([not (0 <= c < n_cols) or D.get((int(c), int(r)), 0) != D[(int(r), int(c))]
                                    for r, c in zip(rows, indices)], bool) & ~bad[RANGE]
    flags = sum(f for f, b in bad.items() if b.any())
    found = [np.flatnonzero(b)[0] for b in bad.values() if b.any()]
    return flags, int(min(found)) if found else nnz


@pytest.mark.gpu
@pytest.mark.parametrize("pointer", [np.int32, np.int64])
def test_device_csr_check_flags_what_numpy_finds(pointer, rng, gpu_device):
    """The shared device check (graphkern._cuda.csr_check, instantiated in cuda_src/expm.cu) on fresh
    random matrices with one problem planted each: the flags and the first entry NumPy finds."""
    from graphkern._cuda import runtime as rt
    from graphkern._cuda.csr_check import check_csr

    for trial in range(40):
        n = int(rng.integers(2, 300))
        A = sp.random(n, n, density=float(rng.uniform(0.01, 0.3)), random_state=rng, format="csr")
        A = (A + A.T).tocsr()
        A.sort_indices()
        if A.nnz == 0:
            continue
        ptr, idx = A.indptr.astype(pointer), A.indices.astype(np.int32)
        vals = A.data.astype([np.float64, np.float32][int(rng.integers(2))])
        k = int(rng.integers(A.nnz))
        kind = trial % 6
        if kind == 1:
            idx[k] = (-1, n, n + 7)[int(rng.integers(3))]
        elif kind == 2:
            vals[k] = (np.nan, np.inf, -np.inf)[int(rng.integers(3))]
        elif kind == 3:
            vals[k] = -vals[k]
        elif kind == 4 and len(idx) > 1:
            k = max(k, 1)
            idx[k - 1], idx[k] = idx[k], idx[k - 1]
        elif kind == 5:
            ptr[int(rng.integers(1, n))] = ptr[-1] + 1
        symmetric = kind in (0, 2, 3) and (trial // 6) % 2 == 0  # rows stay sorted: mirrors are found
        want = reference_flags(ptr.astype(np.int64), idx, vals, n, check_negative=True, check_symmetry=symmetric)
        got = check_csr("expm", rt.to_device(gpu_device, ptr), rt.to_device(gpu_device, idx), n_cols=n, nnz=A.nnz,
                        values=rt.to_device(gpu_device, vals), check_negative=True, check_symmetry=symmetric)
        if want[1] is None:  # row pointers wrong: only their flag is promised
            assert got[0] & want[0], (trial, got, want)
        else:
            assert got == want, (trial, kind, got, want)
        no_values = check_csr("expm", rt.to_device(gpu_device, ptr), rt.to_device(gpu_device, idx), n_cols=n,
                              nnz=A.nnz)
        assert no_values[0] & ~0b111 == 0  # without values only the structure is read


def _first_bad_line_reference(text, n_fields):
    """The rule of validate.first_bad_coordinate_line, line by line in Python."""
    import re

    lines = text.split(b"\n")
    if text.endswith(b"\n"):
        lines.pop()
    size_line = True
    for k, line in enumerate(lines, start=1):
        body = line.lstrip(b" \t")
        if not body or body[:1] in (b"\r", b"%"):
            continue
        fields = [f for f in re.split(rb"[ \t]+", body.split(b"\r")[0]) if f]
        want = 3 if size_line else n_fields
        for i, f in enumerate(fields):
            digits = f.isdigit()
            number = all(c in b"0123456789+-.eEnNaAiIfFtTyY" for c in f)
            if not number or ((i < 2 or size_line) and not digits):
                return k
        if len(fields) != want:
            return k
        size_line = False
    return 0


@pytest.mark.parametrize("n_fields", [2, 3])
def test_first_bad_coordinate_line_over_threads_is_the_rule(n_fields, rng):
    """The entries checked in runs of whole lines on several threads name the same first bad line
    as the rule read line by line, wherever the runs start."""
    good = [b"12 7", b"3 4 1.5e-3", b"  8\t9  -2 ", b"%c 1 2", b"", b"\t", b"5 6 7\r", b"1 2 nan", b"4 4 +.5"]
    bad = [b"1 x 2", b"1.5 2 3", b"1 2 3 4", b"1V 2", b"7", b"2 2 1V", b"a", b"1 2\r 3", b"1 \x00 2", b"\xff1 2 3"]
    for _ in range(300):
        lines = [b"%%MatrixMarket matrix coordinate real general", b"% comment"] * int(rng.integers(0, 2))
        lines.append(b"9 9 9" if rng.random() < 0.9 else b"9 9.0 9")
        for _ in range(int(rng.integers(0, 60))):
            pool = bad if rng.random() < 0.03 else good
            lines.append(pool[int(rng.integers(len(pool)))])
        text = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
        want = _first_bad_line_reference(text, n_fields)
        data = np.frombuffer(text, dtype=np.uint8)
        for threads, chunk in ((1, 1 << 20), (3, 1), (4, 7), (16, 16)):
            assert validate.first_bad_coordinate_line(data, n_fields, threads, chunk) == want, (text, threads, chunk)


@pytest.mark.parametrize("n_threads", [1, 2, 4, 16])
def test_coordinates_to_csr_matches_scipy(n_threads):
    """The compiled COO -> CSR of the Matrix Market reader against SciPy's conversion (rows sorted)
    on shuffled random entries, with the figures it counts, and what it refuses."""
    from graphkern._cpu import validate as V

    rng = np.random.default_rng(n_threads)
    for n, m in ((1, 0), (5, 3), (100, 2000), (3000, 200000), (70, 4000)):
        A = sp.random(n, n, density=min(1, m / max(n * n, 1)), random_state=rng, format="coo")
        A = (A + A.T).tocoo()
        A.data = np.round(A.data * 5) - 1
        perm = rng.permutation(A.nnz)
        r, c, d = A.row[perm].astype(np.int32), A.col[perm].astype(np.int32), A.data[perm]
        for values in (d, d.astype(np.int64)):
            indptr, indices, data, f = V.coordinates_to_csr(r, c, values, n, n_threads)
            B = sp.csr_matrix((d, (r, c)), shape=(n, n))
            B.sort_indices()
            assert np.array_equal(indptr, B.indptr) and np.array_equal(indices, B.indices)
            assert data.dtype == np.float64 and np.array_equal(data, B.data)
            assert f == dict(diagonal=np.count_nonzero(r == c), duplicate=False, nonfinite=0,
                             negative=np.count_nonzero(d < 0), not_one=np.count_nonzero(d != 1))
        if A.nnz:
            k = len(c) // 2
            assert V.coordinates_to_csr(r, np.where(np.arange(len(c)) == k, n, c).astype(np.int32), d, n,
                                        n_threads) is None
            assert V.coordinates_to_csr(np.where(np.arange(len(r)) == k, -1, r).astype(np.int32), c, d, n,
                                        n_threads) is None
            twice = V.coordinates_to_csr(np.append(r, r[k]), np.append(c, c[k]), np.append(d, d[k]), n, n_threads)
            assert twice[3]["duplicate"]
            d2 = d.copy()
            d2[k] = np.nan
            assert V.coordinates_to_csr(r, c, d2, n, n_threads)[3]["nonfinite"] == 1


@pytest.mark.parametrize("n_threads", [1, 3, 16])
def test_coordinates_to_csr_mirrors_a_stored_triangle(n_threads):
    """With ``mirror`` the stored lower triangle of a symmetric matrix gives the CSR of the whole
    matrix, as SciPy's conversion of both triangles does, in file order (rows already sorted) and
    shuffled; a pair stored in both triangles is a repeat; the figures count the given entries."""
    from graphkern._cpu import validate as V

    rng = np.random.default_rng(10 + n_threads)
    for n, m in ((1, 1), (6, 10), (200, 3000), (2000, 100000)):
        A = sp.random(n, n, density=min(1, m / (n * n)), random_state=rng, format="csr")
        A.data = np.round(A.data * 5) - 1
        L = sp.tril(A + A.T).tocoo()  # row by row, columns in order: a written file's order
        full = sp.csr_matrix(L + sp.triu(L.T, 1))
        full.sort_indices()
        for perm in (np.arange(L.nnz), rng.permutation(L.nnz)):
            r, c, d = L.row[perm].astype(np.int32), L.col[perm].astype(np.int32), L.data[perm]
            indptr, indices, data, f = V.coordinates_to_csr(r, c, d, n, n_threads, True)
            assert np.array_equal(indptr, full.indptr) and np.array_equal(indices, full.indices)
            assert np.array_equal(data, full.data)
            assert f == dict(diagonal=np.count_nonzero(r == c), duplicate=False, nonfinite=0,
                             negative=np.count_nonzero(d < 0), not_one=np.count_nonzero(d != 1))
            off = np.flatnonzero(r != c)
            if len(off):
                k = off[len(off) // 2]  # its mirror given as well
                both = V.coordinates_to_csr(np.append(r, c[k]), np.append(c, r[k]), np.append(d, d[k]), n,
                                            n_threads, True)
                assert both[3]["duplicate"]
                assert V.coordinates_to_csr(r, np.where(np.arange(len(c)) == k, n, c).astype(np.int32), d, n,
                                            n_threads, True) is None
