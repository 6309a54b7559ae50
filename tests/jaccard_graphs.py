"""Shared by the Jaccard tests: a plain Python set reference, test graphs, and device runs."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from graphkern.similarity import VARIANTS, jaccard, overlap, sorensen
from graphkern.similarity.api import METRICS as METRIC_CODES, symmetric_pattern
from graphkern.similarity.gpu import DeviceSimilarity
from graphkern.similarity.plan import hash_table_rows

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


GPU_VARIANTS = [v for v in VARIANTS if v != "auto"]


METRICS = {"jaccard": jaccard, "sorensen": sorensen, "overlap": overlap}
# every metric x weighted x self-loop convention x output type


CONVENTIONS = pytest.mark.parametrize(
    "metric,weighted,self_loops,dtype",
    list(itertools.product(METRICS, [False, True], [False, True], [np.float32, np.float64])))


def neighbour_sets(A, *, weighted, self_loops):
    """{k: weight} per vertex, from the stored entries of A (weight 1 when unweighted)."""
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    sets = []
    for i in range(A.shape[0]):
        lo, hi = A.indptr[i], A.indptr[i + 1]
        row = {int(k): (float(v) if weighted else 1.0) for k, v in zip(A.indices[lo:hi], A.data[lo:hi])}
        if self_loops:
            row.setdefault(i, 1.0)
        else:
            row.pop(i, None)
        sets.append(row)
    return sets


def reference(A, metric, *, weighted=False, self_loops=False):
    """The similarity of every stored entry of A, in CSR order, by Python set arithmetic."""
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    sets = neighbour_sets(A, weighted=weighted, self_loops=self_loops)
    out = np.zeros(A.nnz)
    for i in range(A.shape[0]):
        for k in range(A.indptr[i], A.indptr[i + 1]):
            j = int(A.indices[k])
            if i == j:
                out[k] = 1.0
                continue
            a, b = sets[i], sets[j]
            inter = sum(min(a[x], b[x]) for x in a.keys() & b.keys())
            wa, wb = sum(a.values()), sum(b.values())
            num, den = {"jaccard": (inter, wa + wb - inter), "sorensen": (2 * inter, wa + wb),
                        "overlap": (inter, min(wa, wb))}[metric]
            out[k] = num / den if den > 0 else 0.0
    return out


def random_graph(rng, n, density, *, loops=0.2, isolated=0.1):
    """A random symmetric matrix with random positive weights, some self-loops and isolated nodes."""
    A = sp.random(n, n, density=density, random_state=rng, format="coo")
    A = sp.csr_matrix((A.data, (A.row, A.col)), shape=(n, n))
    A = A + A.T
    A.setdiag(np.where(rng.random(n) < loops, rng.random(n) + 0.1, 0.0))
    alone = rng.random(n) < isolated
    keep = sp.diags((~alone).astype(float))
    A = (keep @ A @ keep).tocsr()
    A.eliminate_zeros()
    A.data = rng.random(A.nnz) + 0.05
    A = sp.csr_matrix((A + A.T) / 2)
    A.sort_indices()
    return A


def hub_graph(rng, n, hubs, hub_degree, extra_edges):
    """Sparse random edges plus a few hubs each joined to about hub_degree random nodes."""
    r = rng.integers(0, n, extra_edges)
    c = rng.integers(0, n, extra_edges)
    centres = rng.choice(n, hubs, replace=False)
    hr = np.repeat(centres, hub_degree)
    hc = rng.integers(0, n, hr.size)
    rows, cols = np.concatenate([r, hr]), np.concatenate([c, hc])
    keep = rows != cols
    A = sp.csr_matrix((rng.random(keep.sum()) + 0.1, (rows[keep], cols[keep])), shape=(n, n))
    A = A.maximum(A.T).tocsr()
    A.sort_indices()
    return A


def bounded_degree_graph(rng, n, max_degree, *, loops=0.3, isolated=0.1):
    """Random weighted graph whose rows have at most max_degree entries (many exactly that many).

    Some vertices are isolated; the others (an even number m of them) get max_degree - 1
    distinct neighbours from as many random rounds of a round-robin schedule on m players (each
    round a perfect matching, no pair met twice), and some get a self-loop.
    """
    alive = rng.permutation(np.flatnonzero(rng.random(n) >= isolated))
    alive = alive[: alive.size - alive.size % 2]
    m = alive.size
    rows, cols = [], []
    if m >= 2:
        for r in rng.choice(m - 1, min(max_degree - 1, m - 1), replace=False):
            k = np.arange(1, m // 2)
            a = np.r_[r, (r + k) % (m - 1)]
            b = np.r_[m - 1, (r - k) % (m - 1)]
            rows += [alive[a], alive[b]]
            cols += [alive[b], alive[a]]
    looped = alive[rng.random(m) < loops] if max_degree > 0 else alive[:0]
    rows, cols = np.concatenate(rows + [looped]), np.concatenate(cols + [looped])
    A = sp.csr_matrix((rng.random(rows.size) + 0.05, (rows, cols)), shape=(n, n))
    A = sp.csr_matrix((A + A.T) / 2)
    A.sort_indices()
    assert np.diff(A.indptr).max() <= max_degree
    return A


def gpu_test_graph(rng, variant, n, density):
    """A random graph for a GPU variant; "shortrow" needs rows of at most 32 entries."""
    if variant == "shortrow":
        return bounded_degree_graph(rng, n, int(rng.integers(2, 33)))
    return random_graph(rng, n, density)


def device_values(dev, A, metric, *, weighted=False, self_loops=False, dtype=np.float64, **options):
    """DeviceSimilarity run directly (for options the public functions do not expose)."""
    run = DeviceSimilarity(dev, symmetric_pattern(A, weighted=weighted), metric=METRIC_CODES[metric],
                           self_loops=self_loops, dtype=dtype, **options)
    run.upload()
    run.compute()
    return run.download(np.empty(run.pattern.nnz, dtype=dtype)), run


def assert_same_pattern(R, A):
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    assert isinstance(R, sp.csr_matrix)
    assert R.shape == A.shape
    np.testing.assert_array_equal(R.indptr, A.indptr)
    np.testing.assert_array_equal(R.indices, A.indices)


def tolerance(dtype, weighted):
    if dtype == np.float64:
        return 1e-12
    return 2e-6 if weighted else 1e-7


def skewed_graph(rng):
    # hubs of degree ~2000 on 6000 nodes: hub-to-hub entries need ~2000 searches each,
    # and the ~70k entries span many prefix-sum tiles of the balanced variant
    return hub_graph(rng, 6000, hubs=4, hub_degree=2100, extra_edges=24000)


def high_hub_graph(rng, n=6000, extra_edges=24000, loops=0.2):
    """Four hubs at the highest indices n-1..n-4, each joined to ~2000 random vertices of the
    lowest 60%, plus random edges among the other vertices, which get self-loops at random.

    Hubs n-1 and n-2 are joined (a pair whose work spans many chunks); hub n-3 stores a self-loop;
    hub n-4 stores neither, so its largest neighbour lies below 0.6 n: its pair with a vertex j
    that also has a neighbour in [0.6 n, n-4) is galloped to the end of the hub's row before the
    short row j reaches n-4 (the gallop stops there).  About 55k entries: many prefix-sum tiles.
    """
    hubs = np.arange(n - 4, n)[::-1]
    low = int(0.6 * n)
    hr = np.repeat(hubs, 2000)
    hc = rng.integers(0, low, hr.size)
    r = rng.integers(0, n - 4, extra_edges)
    c = rng.integers(0, n - 4, extra_edges)
    looped = np.flatnonzero(rng.random(n - 4) < loops)
    rows = np.concatenate([hr, r, looped, [hubs[0], hubs[2]]])
    cols = np.concatenate([hc, c, looped, [hubs[1], hubs[2]]])
    A = sp.csr_matrix((rng.random(rows.size) + 0.1, (rows, cols)), shape=(n, n))
    A = A.maximum(A.T).tocsr()
    A.sort_indices()
    return A


def assert_matches_cpu(values, A, metric="jaccard", *, weighted=False, self_loops=False, dtype=np.float64):
    """GPU values against the CPU backend: identical when unweighted, to rounding when weighted."""
    assert not np.isnan(values).any(), "an entry was not written (outputs are poisoned with NaN)"
    cpu = METRICS[metric](A, backend="cpu", weighted=weighted, self_loops=self_loops, dtype=dtype).data
    if weighted:
        np.testing.assert_allclose(values, cpu, rtol=0, atol=tolerance(dtype, True))
    else:
        np.testing.assert_array_equal(values, cpu)


def owner_entries(pattern, variant, hubs):
    """Whether each stored entry carries its pair's work in the balanced, hub or longrow variant
    (owner_row of cuda_src/jaccard.cu): the long side for longrow or where that vertex is one of
    ``hubs``, else the smaller index; never a diagonal entry."""
    d = pattern.degrees
    rows = np.repeat(np.arange(pattern.n), d)
    cols = pattern.indices
    long_is_row = (d[rows] > d[cols]) | ((d[rows] == d[cols]) & (rows > cols))
    if variant == "longrow":
        owner = long_is_row
    else:
        has_bitmap = np.zeros(pattern.n, dtype=bool)
        has_bitmap[hubs] = True
        owner = np.where(has_bitmap[np.where(long_is_row, rows, cols)], long_is_row, rows < cols)
    return owner & (rows != cols)


def expected_hash_rows(degrees, hubs, min_degree):
    """The rows with a hash table: degree >= min_degree (0: none), not a hub."""
    chosen = (degrees >= max(min_degree, 1)) & (min_degree > 0)
    chosen[hubs] = False
    return np.flatnonzero(chosen)


def assert_hash_tables(run):
    """The tables row_hashes built, against a model of cuda_src/jaccard_search.cuh: each listed
    row's table holds its columns and empty slots (-1) only, each bucket of 4 slots fills from its
    first slot, and the walk of hash_contains (the buckets from that of the column's Fibonacci-hash
    home slot on, stopping at the first whose last slot is empty) reaches each column;
    hash_off points at each listed row's table, -1 elsewhere."""
    p = run.pattern
    rows, slots = hash_table_rows(p.degrees, run.hubs, min_degree=run.hash_min_degree)
    np.testing.assert_array_equal(run.hash_rows, rows)
    hash_off = run.hash_off.to_host()
    expected_off = np.full(p.n, -1, dtype=np.int64)
    expected_off[rows] = slots[:-1]
    np.testing.assert_array_equal(hash_off, expected_off)
    keys = run.hash_keys.to_host()
    assert keys.size == slots[-1]
    for w, v in enumerate(rows):
        table = keys[slots[w]:slots[w + 1]]
        cols = p.indices[p.indptr[v]:p.indptr[v + 1]]  # sorted
        bits = max(2, (2 * cols.size - 1).bit_length())  # hash_shift's size: load factor <= 1/2
        assert table.size == 1 << bits
        filled = table != -1
        np.testing.assert_array_equal(np.sort(table[filled]), cols)
        buckets = filled.reshape(-1, 4)
        assert (buckets[:, :-1] >= buckets[:, 1:]).all()  # no empty slot before a filled one
        n_buckets = buckets.shape[0]
        home = (((cols.astype(np.uint64) * 0x9E3779B1) & 0xFFFFFFFF) >> np.uint64(32 - bits)).astype(np.int64)
        home //= 4  # the home slot's bucket
        at = np.flatnonzero(filled)[np.argsort(table[filled], kind="stable")] // 4  # each column's bucket
        steps = (at - home) % n_buckets
        open_before = np.r_[0, np.cumsum(np.r_[~buckets[:, -1], ~buckets[:, -1]])]  # of two laps
        assert (open_before[home + steps] == open_before[home]).all()  # no stop before the column's bucket


def star_graph_with_loops(rng, m):
    """A star of m leaves whose centre sits mid-range, sparse edges among the leaves, self-loops
    on some vertices (the centre included) and isolated vertices before and after."""
    n = m + 40
    centre = n // 2
    leaves = rng.choice(np.r_[10:centre, centre + 1:n - 10], m, replace=False)
    r = rng.choice(leaves, 3 * m)
    c = rng.choice(leaves, 3 * m)
    looped = np.r_[centre, leaves[rng.random(m) < 0.3]]
    rows = np.r_[np.full(m, centre), r, looped]
    cols = np.r_[leaves, c, looped]
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    A = sp.csr_matrix(A.maximum(A.T))
    A.sort_indices()
    return A


def hash_test_graph(rng, kind):
    """A skewed graph of the given kind, with isolated vertices and self-loops."""
    if kind == "star":
        return star_graph_with_loops(rng, int(rng.integers(200, 600)))
    if kind == "hubs":
        A = skewed_graph(rng)
    elif kind == "high_hubs":
        A = high_hub_graph(rng)  # self-loops already
    else:
        from graphkern.generators import chung_lu
        A = sp.csr_matrix(chung_lu(n=5000, gamma=2.3, avg_degree=16, max_degree=4999,
                                   seed=int(rng.integers(1 << 30)), as_csr=True))
    if kind != "high_hubs":
        A.setdiag(np.where(rng.random(A.shape[0]) < 0.1, 1.0, 0.0))  # self-loops, some on hubs
        A.eliminate_zeros()
    A = sp.csr_matrix(sp.block_diag([sp.csr_matrix((7, 7)), A]))  # isolated vertices first: hubs keep their order
    A.sort_indices()
    return A


def band_graph(rng, n, offsets, extra):
    """Edges i -- i + d for every offset d, plus ``extra`` random edges, symmetric, no self-loops."""
    rows = np.concatenate([np.arange(n - d) for d in offsets] + [rng.integers(0, n, extra)])
    cols = np.concatenate([np.arange(d, n) for d in offsets] + [rng.integers(0, n, extra)])
    A = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)).tocsr()
    A = ((A + A.T) > 0).astype(np.float64)
    A.setdiag(0)
    A.eliminate_zeros()
    return sp.csr_matrix(A)
