"""The GPU variants of Jaccard against the CPU and the set reference, and the host plan that
chooses them (variant, launch shapes, bitmaps, hash tables) against NumPy; the work line on the device."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph, GraphTooLargeError
from graphkern.similarity import choose_variant, jaccard
from graphkern.similarity.api import SymmetricPattern, symmetric_pattern
from graphkern.similarity.gpu import PIECE_MIN_BYTES, PIECE_VARIANTS, DeviceSimilarity
from graphkern.similarity.plan import (HASH_MIN_DEGREE, LONGROW_MIN_ENTRIES, SCAN_TILE, WARP_MAX_MEAN, DegreeFigures,
                                       DeviceOptions, auto_variant, hash_table_rows, hub_vertices, pair_rows_per_block,
                                       plan_similarity, row_locality, shortrow_group_size, staged_rows_per_block,
                                       window_locality, window_rows_per_block)
from jaccard_graphs import (CONVENTIONS, GPU_VARIANTS, METRICS, assert_hash_tables, assert_matches_cpu,
                            assert_same_pattern, band_graph, bounded_degree_graph, device_values, expected_hash_rows,
                            gpu_test_graph, hash_test_graph, high_hub_graph, hub_graph, owner_entries, random_graph,
                            reference, skewed_graph, tolerance)

@pytest.mark.gpu
@pytest.mark.parametrize("variant", GPU_VARIANTS)
@CONVENTIONS
def test_gpu_variant_matches_reference_and_cpu(rng, variant, metric, weighted, self_loops, dtype):
    A = gpu_test_graph(rng, variant, int(rng.integers(60, 120)), 0.1)
    opts = dict(weighted=weighted, self_loops=self_loops, dtype=dtype)
    gpu = METRICS[metric](A, backend="gpu", variant=variant, **opts)
    cpu = METRICS[metric](A, backend="cpu", **opts)
    assert_same_pattern(gpu, A)
    assert not np.isnan(gpu.data).any(), "an entry was not written (outputs are poisoned with NaN)"
    np.testing.assert_allclose(gpu.data, reference(A, metric, weighted=weighted, self_loops=self_loops),
                               rtol=0, atol=tolerance(dtype, weighted))
    if weighted:
        np.testing.assert_allclose(gpu.data, cpu.data, rtol=0, atol=tolerance(dtype, True))
    else:  # exact counts divided in double on both sides
        np.testing.assert_array_equal(gpu.data, cpu.data)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", GPU_VARIANTS + ["auto"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_skewed_graph(rng, variant, weighted):
    A = skewed_graph(rng)
    if variant == "shortrow":
        with pytest.raises(ValueError, match="at most 32 stored entries; G has a row of"):
            jaccard(A, weighted=weighted, backend="gpu", variant=variant)
        return
    gpu = jaccard(A, weighted=weighted, backend="gpu", variant=variant, dtype=np.float64)
    cpu = jaccard(A, weighted=weighted, backend="cpu", dtype=np.float64)
    assert not np.isnan(gpu.data).any()
    if weighted:
        np.testing.assert_allclose(gpu.data, cpu.data, rtol=0, atol=1e-12)
    else:
        np.testing.assert_array_equal(gpu.data, cpu.data)
    sample = rng.choice(A.nnz, 300, replace=False)  # the reference is slow on 2000-degree hubs
    np.testing.assert_allclose(gpu.data[sample], reference(A, "jaccard", weighted=weighted)[sample], atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["hub", "longrow"])
@CONVENTIONS
def test_gpu_hub_bitmaps_on_small_graphs(rng, gpu_device, variant, metric, weighted, self_loops, dtype):
    # every vertex of degree >= 1 may get a bitmap, but only as many as fit in the cap: the long
    # rows of some pairs have bitmaps and others not, in one run
    A = random_graph(rng, int(rng.integers(60, 120)), 0.1)
    n = A.shape[0]
    n_hubs = int(rng.integers(1, n // 2))
    values, run = device_values(gpu_device, A, metric, weighted=weighted, self_loops=self_loops, dtype=dtype,
                                variant=variant, hub_min_degree=1, hub_max_bytes=n_hubs * 4 * -(-n // 32))
    assert run.hubs.size == (0 if weighted else n_hubs)
    assert not np.isnan(values).any()
    np.testing.assert_allclose(values, reference(A, metric, weighted=weighted, self_loops=self_loops),
                               rtol=0, atol=tolerance(dtype, weighted))
    cpu = METRICS[metric](A, backend="cpu", weighted=weighted, self_loops=self_loops, dtype=dtype)
    if not weighted:
        np.testing.assert_array_equal(values, cpu.data)
    # a second compute on the same buffers clears and rebuilds the bitmaps: the same result (to
    # the last bit when unweighted; weighted sums are added by float atomics, in any order)
    run.compute()
    again = run.download(np.empty_like(values))
    if weighted:
        np.testing.assert_allclose(again, values, rtol=0, atol=tolerance(dtype, weighted))
    else:
        np.testing.assert_array_equal(again, values)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["hub", "longrow"])
@pytest.mark.parametrize("n_hubs", [0, 1, 3, 40])
def test_gpu_hub_bitmaps_with_tied_degrees(gpu_device, variant, n_hubs):
    # a complete graph: every degree ties, so the owner of each pair is decided by the index rule,
    # and with some hubs the owner is sometimes the lower entry
    n = 40
    A = sp.csr_matrix(np.ones((n, n)) - np.eye(n))
    values, run = device_values(gpu_device, A, "jaccard", variant=variant, hub_min_degree=1,
                                hub_max_bytes=n_hubs * 4 * -(-n // 32))
    assert run.hubs.size == n_hubs
    np.testing.assert_allclose(values, (n - 2) / n)


@pytest.mark.gpu
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_hub_bitmaps_on_a_wide_graph(rng, gpu_device, self_loops):
    # n well past one bitmap word per hub and hubs past the default threshold of 64
    A = hub_graph(rng, 5000, hubs=6, hub_degree=400, extra_edges=15000)
    A.setdiag(np.where(rng.random(5000) < 0.2, 1.0, 0.0))
    A.eliminate_zeros()
    A = sp.csr_matrix(A)
    values, run = device_values(gpu_device, A, "jaccard", self_loops=self_loops, variant="hub")
    assert run.hubs.size >= 6
    cpu = jaccard(A, backend="cpu", self_loops=self_loops, dtype=np.float64)
    np.testing.assert_array_equal(values, cpu.data)


@pytest.mark.gpu
@pytest.mark.parametrize("max_degree", [1, 2, 3, 8, 9, 16, 17, 31, 32])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_shortrow_group_sizes(rng, max_degree, weighted):
    A = bounded_degree_graph(rng, int(rng.integers(300, 700)), max_degree)
    gpu = jaccard(A, weighted=weighted, backend="gpu", variant="shortrow", dtype=np.float64)
    assert not np.isnan(gpu.data).any()
    np.testing.assert_allclose(gpu.data, reference(A, "jaccard", weighted=weighted), rtol=0, atol=1e-12)
    if not weighted:
        np.testing.assert_array_equal(gpu.data, jaccard(A, backend="cpu", dtype=np.float64).data)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_per_block", [1, 8, 37, 64, 256])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_pair_rows_per_block(rng, gpu_device, rows_per_block, weighted, self_loops):
    # many blocks, each listing the upper entries of its rows; self-loops and isolated vertices
    A = random_graph(rng, int(rng.integers(300, 700)), 0.02, loops=0.3, isolated=0.15)
    values, run = device_values(gpu_device, A, "jaccard", weighted=weighted, self_loops=self_loops,
                                variant="pair", rows_per_block=rows_per_block)
    assert run.rows_per_block == rows_per_block
    np.testing.assert_allclose(values, reference(A, "jaccard", weighted=weighted, self_loops=self_loops),
                               rtol=0, atol=1e-12)
    assert_matches_cpu(values, A, weighted=weighted, self_loops=self_loops)


@pytest.mark.gpu
@pytest.mark.parametrize("pair_width", [1, 2, 4])
@pytest.mark.parametrize("rows_per_block", [1, 48, 192])
@pytest.mark.parametrize("metric", ["jaccard", "overlap"])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_pair_widths(rng, gpu_device, pair_width, rows_per_block, metric, self_loops):
    # rows of 0 to ~20 entries start at every offset modulo 4 and end anywhere in their last
    # aligned block; nnz is rarely a multiple of 4, so the last row's block reads the padding
    A = random_graph(rng, int(rng.integers(300, 700)), 0.015, loops=0.3, isolated=0.1)
    values, run = device_values(gpu_device, A, metric, self_loops=self_loops, variant="pair",
                                rows_per_block=rows_per_block, pair_width=pair_width)
    assert run.pair_width == pair_width
    assert len(set(A.indptr[:-1] % 4)) == 4
    np.testing.assert_allclose(values, reference(A, metric, self_loops=self_loops), rtol=0, atol=1e-12)
    assert_matches_cpu(values, A, metric, self_loops=self_loops)


@pytest.mark.gpu
@pytest.mark.parametrize("pair_width", [2, 4])
def test_gpu_pair_vector_merge_on_long_and_dense_rows(rng, gpu_device, pair_width):
    # long rows (a star centre, a dense block) and rows of 1 entry: many blocks per row, and pairs
    # whose last blocks meet with either one ahead
    star = hub_graph(rng, 3000, hubs=2, hub_degree=1500, extra_edges=3000)
    dense = sp.csr_matrix(np.triu(rng.random((120, 120)) < 0.7, 1).astype(float))
    for B in (star, dense + dense.T):
        B = sp.csr_matrix(B)
        values, run = device_values(gpu_device, B, "jaccard", variant="pair", pair_width=pair_width)
        assert run.pair_width == pair_width
        assert_matches_cpu(values, B)


@pytest.mark.gpu
def test_gpu_weighted_pair_merges_by_element(rng, gpu_device):
    A = random_graph(rng, 300, 0.03)
    values, run = device_values(gpu_device, A, "jaccard", weighted=True, variant="pair", pair_width=4)
    assert run.pair_width == 1  # the vector merge counts; weights need the merge by element
    assert_matches_cpu(values, A, weighted=True)


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_pair_entries_past_the_shared_list(rng, gpu_device, weighted):
    # 256 rows of ~60 upper entries each: ~15000 per block, listed 2048 at a time in several
    # passes; a star centre with 3000 upper entries needs two passes on its own
    A = random_graph(rng, 1500, 0.04, loops=0.2, isolated=0.05)
    star = sp.csr_matrix((np.ones(3000), (np.zeros(3000, dtype=int), np.arange(1, 3001))), shape=(3001, 3001))
    for B in (A, star + star.T):
        B = sp.csr_matrix(B)
        assert np.diff(B.indptr).max() * 256 > 2 * 2048
        values, _ = device_values(gpu_device, B, "sorensen", weighted=weighted, variant="pair", rows_per_block=256)
        assert_matches_cpu(values, B, "sorensen", weighted=weighted)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["pair", "longrow"])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_star_and_isolated_vertices(rng, variant, self_loops):
    # a star whose centre is the highest index, plus isolated vertices before and after it
    m = int(rng.integers(50, 400))
    n = m + 20
    centre = m + 9
    leaves = np.r_[np.arange(0, 5), np.arange(5, m + 4) + 5][:m]
    edges = np.stack([np.full(m, centre), leaves], axis=1)
    G = Graph.from_edges(edges, n)
    A = G.to_scipy()
    J = jaccard(G, backend="gpu", variant=variant, self_loops=self_loops, dtype=np.float64)
    assert_same_pattern(J, A)
    np.testing.assert_allclose(J.data, 2 / (m + 1) if self_loops else 0.0)
    assert_matches_cpu(J.data, A, self_loops=self_loops)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [1, 2, 4, 7, 32, 64])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_longrow_chunks_and_bitmaps(rng, gpu_device, chunk, weighted):
    # skewed: hub-to-hub pairs span many chunks and threads; some hubs have bitmaps, some hash
    # tables (unweighted), some neither
    A = skewed_graph(rng)
    n = A.shape[0]
    for n_hubs, hash_min_degree in ((0, 0), (0, 32), (2, 0), (2, 8), (40, 2)):
        values, run = device_values(gpu_device, A, "jaccard", weighted=weighted, variant="longrow",
                                    balanced_chunk=chunk, hub_min_degree=1, hub_max_bytes=n_hubs * 4 * -(-n // 32),
                                    hash_min_degree=hash_min_degree)
        assert run.hubs.size == (0 if weighted else n_hubs)
        assert (run.hash_rows.size > 0) == (not weighted and hash_min_degree > 0)
        assert_matches_cpu(values, A, weighted=weighted)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [1, 3, 8])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_longrow_mirror_offsets(rng, gpu_device, chunk, weighted, self_loops):
    # the balanced pass records, for each owner entry (i, j) in a long row i, where row j stores i;
    # a gallop that reaches the end of row i first records nothing and the finalize pass searches
    # row j: both kinds of entry, with and without bitmaps, over many prefix-sum tiles
    A = high_hub_graph(rng)
    n = A.shape[0]
    sample = rng.choice(A.nnz, 300, replace=False)  # the reference is slow on 2000-degree hubs
    expected = reference(A, "jaccard", weighted=weighted, self_loops=self_loops)[sample]
    for n_hubs, hash_min_degree in ((0, 0), (4, 0), (0, 1000)):  # gallops, bitmaps, tables (unweighted)
        values, run = device_values(gpu_device, A, "jaccard", weighted=weighted, self_loops=self_loops,
                                    variant="longrow", balanced_chunk=chunk, hub_min_degree=1000,
                                    hub_max_bytes=n_hubs * 4 * -(-n // 32), hash_min_degree=hash_min_degree)
        assert run.hubs.size == (0 if weighted else n_hubs)
        assert run.hash_rows.size == (0 if weighted or hash_min_degree == 0 else 4)
        assert run.n_tiles > 8
        assert_matches_cpu(values, A, weighted=weighted, self_loops=self_loops)
        np.testing.assert_allclose(values[sample], expected, rtol=0, atol=1e-12)
        p = run.pattern
        owner = owner_entries(p, "longrow", run.hubs)
        mirror_off = run.mirror_off.to_host()
        assert (mirror_off[~owner] == -1).all()
        recorded = owner & (mirror_off >= 0)
        rows = np.repeat(np.arange(n), p.degrees)[recorded]
        j = p.indices[recorded]
        at = p.indptr[j] + mirror_off[recorded]
        assert (at < p.indptr[j + 1]).all()
        np.testing.assert_array_equal(p.indices[at], rows)
        assert recorded.any()
        # hub n-4's gallops stop before most of its mirrors (its lookups, where it has a table, do not)
        if chunk > 1 and run.hubs.size == 0 and run.hash_rows.size == 0:
            assert (owner & (mirror_off < 0)).any()
        has_table = np.zeros(n, dtype=bool)
        has_table[run.hash_rows] = True
        in_table_row = owner & has_table[np.repeat(np.arange(n), p.degrees)]
        assert (mirror_off[in_table_row] >= 0).all()  # the lookups never stop early
        # compute() resets the offsets itself: a wrong offset left from before would misplace entries
        run.mirror_off.memset32(0)
        run.compute()
        again = run.download(np.empty_like(values))
        if weighted:
            np.testing.assert_allclose(again, values, rtol=0, atol=tolerance(np.float64, True))
        else:
            np.testing.assert_array_equal(again, values)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["balanced", "hub", "longrow"])
@pytest.mark.parametrize("chunk", [1, 8])
def test_gpu_work_line_buffers(rng, gpu_device, variant, chunk):
    # the work line's buffers against NumPy: each entry's row (balanced_work), the exclusive
    # offsets of the entries' work and each tile's first offset (scan_tiles, scan_tile_sums), and
    # the entry holding the first item of each warp's group of chunks (scan_tiles); the last tile
    # is partial
    A = high_hub_graph(rng)
    values, run = device_values(gpu_device, A, "jaccard", variant=variant, balanced_chunk=chunk)
    assert_matches_cpu(values, A)
    p = run.pattern
    assert run.n_tiles > 8
    assert variant == "balanced" or run.hubs.size == 4
    d = p.degrees
    rows = np.repeat(np.arange(p.n), d)
    np.testing.assert_array_equal(run.rows.to_host(), rows)
    work = np.where(owner_entries(p, variant, run.hubs), np.minimum(d[rows], d[p.indices]), 0)
    offsets = np.r_[0, np.cumsum(work)]
    assert offsets[-1] == run.work_items
    np.testing.assert_array_equal(run.offsets.to_host(), offsets)
    np.testing.assert_array_equal(run.tile_sums.to_host(), offsets[np.arange(run.n_tiles) * SCAN_TILE])
    starts = np.arange(-(-offsets[-1] // run.group_items)) * run.group_items
    group_entry = np.searchsorted(offsets, starts, side="right") - 1
    np.testing.assert_array_equal(run.group_entry.to_host()[:starts.size], group_entry)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["balanced", "hub"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 8])
def test_gpu_work_line_chunks(rng, gpu_device, variant, chunk):
    # a warp's 32 chunks find their entries between two group starts written by the prefix sum:
    # small chunks put many group starts inside one hub-to-hub entry, and entries without work
    # (lower triangle, diagonal) between others
    A = skewed_graph(rng)
    A.setdiag(np.where(rng.random(A.shape[0]) < 0.1, 1.0, 0.0))
    A.eliminate_zeros()
    A = sp.csr_matrix(A)
    values, run = device_values(gpu_device, A, "jaccard", variant=variant, balanced_chunk=chunk)
    assert run.group_items == 32 * chunk
    assert_matches_cpu(values, A)


@pytest.mark.gpu
@pytest.mark.parametrize("hash_min_degree", [2, 8])
@CONVENTIONS
def test_gpu_longrow_hash_tables_on_small_graphs(rng, gpu_device, hash_min_degree, metric, weighted, self_loops,
                                                 dtype):
    # rows of a few to ~20 entries: most long rows of a pair have a table, a few a bitmap
    A = random_graph(rng, int(rng.integers(60, 120)), 0.1)
    n = A.shape[0]
    values, run = device_values(gpu_device, A, metric, weighted=weighted, self_loops=self_loops, dtype=dtype,
                                variant="longrow", hub_min_degree=1, hub_max_bytes=2 * 4 * -(-n // 32),
                                hash_min_degree=hash_min_degree)
    if weighted:
        assert run.hash_rows.size == 0 and run.hash_keys is None
    else:
        np.testing.assert_array_equal(run.hash_rows, expected_hash_rows(run.pattern.degrees, run.hubs,
                                                                        hash_min_degree))
        assert run.hash_rows.size > 0
        assert_hash_tables(run)
    np.testing.assert_allclose(values, reference(A, metric, weighted=weighted, self_loops=self_loops),
                               rtol=0, atol=tolerance(dtype, weighted))
    assert_matches_cpu(values, A, metric, weighted=weighted, self_loops=self_loops, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["star", "hubs", "high_hubs", "power_law"])
@pytest.mark.parametrize("hash_min_degree", [2, 8])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_longrow_hash_tables_on_skewed_graphs(rng, gpu_device, kind, hash_min_degree, self_loops):
    # long rows of every length, with and without bitmaps for the longest; owner entries whose
    # long row has a table record every mirror; a second compute clears and rebuilds the tables
    A = hash_test_graph(rng, kind)
    n = A.shape[0]
    assert (np.diff(A.indptr) == 0).any()
    for n_hubs, chunk in ((0, 8), (3, 1), (3, 5)):
        values, run = device_values(gpu_device, A, "jaccard", self_loops=self_loops, variant="longrow",
                                    balanced_chunk=chunk, hub_min_degree=1, hub_max_bytes=n_hubs * 4 * -(-n // 32),
                                    hash_min_degree=hash_min_degree)
        assert run.hubs.size == n_hubs
        np.testing.assert_array_equal(run.hash_rows, expected_hash_rows(run.pattern.degrees, run.hubs,
                                                                        hash_min_degree))
        assert_matches_cpu(values, A, self_loops=self_loops)
        assert_hash_tables(run)
        p = run.pattern
        rows = np.repeat(np.arange(n), p.degrees)
        has_table = np.zeros(n, dtype=bool)
        has_table[run.hash_rows] = True
        in_table_row = owner_entries(p, "longrow", run.hubs) & has_table[rows]
        assert in_table_row.any()
        mirror_off = run.mirror_off.to_host()[in_table_row]
        j = p.indices[in_table_row]
        assert (mirror_off >= 0).all()
        np.testing.assert_array_equal(p.indices[p.indptr[j] + mirror_off], rows[in_table_row])
        run.compute()
        np.testing.assert_array_equal(run.download(np.empty_like(values)), values)


@pytest.mark.gpu
def test_gpu_hash_min_degree_keyword(rng, gpu_device):
    # the skewed graph's 4 hubs (~2000 entries) have bitmaps; the other rows have ~10 entries
    A = skewed_graph(rng)
    cpu = jaccard(A, backend="cpu", dtype=np.float64)
    for min_degree in (0, 4, 12, HASH_MIN_DEGREE):
        R, info = jaccard(A, backend="gpu", variant="longrow", dtype=np.float64, hash_min_degree=min_degree,
                          return_info=True)
        np.testing.assert_array_equal(R.data, cpu.data)
        assert info.options["hash_min_degree"] == min_degree and info.variant == "longrow"
        _, run = device_values(gpu_device, A, "jaccard", variant="longrow", hash_min_degree=min_degree)
        assert run.hubs.size >= 4 and run.hash_min_degree == min_degree
        assert info.plan["hash_rows"] == run.hash_rows.size and info.plan["hubs"] == run.hubs.size
        np.testing.assert_array_equal(run.hash_rows, expected_hash_rows(run.pattern.degrees, run.hubs, min_degree))
        assert (run.hash_keys is not None) == (run.hash_rows.size > 0) == (0 < min_degree <= 12)
    for variant in ("balanced", "hub"):  # no tables outside longrow
        _, run = device_values(gpu_device, A, "jaccard", variant=variant, hash_min_degree=2)
        assert run.hash_rows.size == 0 and run.hash_keys is None


@pytest.mark.gpu
def test_gpu_pair_and_longrow_agree_with_element_on_a_power_law_graph(rng, gpu_device):
    # Chung-Lu-like degrees (a few hubs of thousands, most rows short) at a test's size
    from graphkern.generators import chung_lu
    A = sp.csr_matrix(chung_lu(n=20_000, gamma=2.3, avg_degree=16, max_degree=19_999,
                               seed=int(rng.integers(1 << 30)), as_csr=True))
    element, _ = device_values(gpu_device, A, "jaccard", variant="element")
    for variant, options in (("pair", {}), ("pair", dict(pair_width=2)), ("pair", dict(pair_width=1)),
                             ("longrow", {}), ("longrow", dict(balanced_chunk=2)),
                             ("longrow", dict(balanced_chunk=32, hub_max_bytes=0)),
                             ("longrow", dict(hash_min_degree=0)), ("longrow", dict(hash_min_degree=2)),
                             ("longrow", dict(hash_min_degree=8, hub_max_bytes=0, balanced_chunk=3))):
        values, _ = device_values(gpu_device, A, "jaccard", variant=variant, **options)
        np.testing.assert_array_equal(values, element, err_msg=f"{variant} {options}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["staged", "window"])
@pytest.mark.parametrize("rows_per_block", [None, 1, 7, 64, 256])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gpu_staged_on_local_and_hub_rows(rng, gpu_device, variant, rows_per_block, self_loops):
    """The staged and window variants where nearly every pair lies inside a block (a ring lattice
    with a few random shortcuts and self-loops), and where a hub's block holds too many entries to
    stage (those blocks read global memory; the hub's list lies mostly outside its window): equal
    to element, bit for bit, and to the CPU."""
    from graphkern.generators import watts_strogatz
    A = sp.csr_matrix(watts_strogatz(n=3000, k=10, p=0.1, seed=int(rng.integers(1 << 30)), as_csr=True))
    A = sp.lil_matrix(A)
    loops = rng.random(A.shape[0]) < 0.2
    A.setdiag(loops.astype(np.float64))
    hub = int(rng.integers(A.shape[0]))
    far = rng.choice(A.shape[0], 2500, replace=False)
    A[hub, far] = 1.0
    A[far, hub] = 1.0
    A[hub, hub] = 0.0
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    for metric in ("jaccard", "overlap"):
        element, _ = device_values(gpu_device, A, metric, self_loops=self_loops, variant="element")
        values, run = device_values(gpu_device, A, metric, self_loops=self_loops, variant=variant,
                                    rows_per_block=rows_per_block)
        assert run.variant == variant
        np.testing.assert_array_equal(values, element, err_msg=f"{metric} rows/block {rows_per_block}")
        assert_matches_cpu(values, A, metric=metric, self_loops=self_loops)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["staged", "window"])
def test_gpu_weighted_staged_runs_as_pair(rng, gpu_device, variant):
    A = random_graph(rng, 300, 0.05)
    values, run = device_values(gpu_device, A, "jaccard", weighted=True, variant=variant)
    assert run.variant == "pair"
    assert_matches_cpu(values, A, weighted=True)


@pytest.mark.gpu
@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("offsets, extra", [([1, 2, 30, 31, 32], 300),  # mostly the masks' fast path
                                            ([1, 31, 32, 33, 63, 64, 100], 800)])  # rows past 4 far entries
def test_gpu_window_at_its_edges(rng, gpu_device, self_loops, offsets, extra):
    """Neighbours on both sides of the window's edges (31, 32, 33 either side of a row), random
    long edges and stored self-loops: the window variant's mask popcounts, far-entry lookups and
    merges of incomplete rows agree with element, bit for bit, and with the CPU."""
    A = sp.lil_matrix(band_graph(rng, 3000, offsets, extra=extra))
    A.setdiag((rng.random(3000) < 0.3).astype(np.float64))
    A = sp.csr_matrix(A)
    A.eliminate_zeros()
    for metric in ("jaccard", "sorensen"):
        element, _ = device_values(gpu_device, A, metric, self_loops=self_loops, variant="element")
        for rows_per_block in (None, 1, 13, 256):
            values, run = device_values(gpu_device, A, metric, self_loops=self_loops, variant="window",
                                        rows_per_block=rows_per_block)
            np.testing.assert_array_equal(values, element, err_msg=f"{metric} rows/block {rows_per_block}")
        assert_matches_cpu(values, A, metric=metric, self_loops=self_loops)


def test_window_locality(rng):
    from graphkern.generators import watts_strogatz
    ring = symmetric_pattern(sp.csr_matrix(watts_strogatz(n=5000, k=10, p=0.0, seed=1, as_csr=True)))
    # neighbours within 5, except the 15 pairs (30 entries) that wrap around the ring; rows 0 and
    # 4999 have 5 such entries each (more than 4), so their 2 x 5 near pairs (20 entries) merge too
    assert window_locality(ring) == pytest.approx(1 - 50 / ring.nnz, abs=1e-12)
    wide = symmetric_pattern(band_graph(rng, 2000, [32, 100], extra=0))
    assert window_locality(wide) == 0.0
    # rows 100..1899 have 6 entries 32 or more away (offsets 32, 33, 40 both sides): no fast pair
    # there; the first and last 40 rows have at most 3 and keep their offset-1 pairs
    mixed = symmetric_pattern(band_graph(rng, 2000, [1, 32, 33, 40], extra=0))
    assert 0 < window_locality(mixed) < 0.05
    assert window_locality(symmetric_pattern(sp.csr_matrix(np.eye(4)))) == 0.0


def test_row_locality_and_the_auto_choice_between_pair_and_staged(rng):
    from graphkern.generators import watts_strogatz
    ring = sp.csr_matrix(watts_strogatz(n=5000, k=10, p=0.0, seed=1, as_csr=True))
    pattern = symmetric_pattern(ring)
    rows = staged_rows_per_block(pattern.degrees)
    # a ring lattice (neighbours within 5) leaves its block only in the 1 + 2 + .. + 5 = 15 pairs,
    # 30 entries, that cross each block boundary and the wrap
    expected = 1 - 30 * (5000 // rows + 1) / ring.nnz
    assert row_locality(pattern, rows) == pytest.approx(expected, abs=1e-12)
    assert auto_variant(pattern) == "window"  # neighbours within 5: the row masks
    perm = rng.permutation(5000)
    shuffled = symmetric_pattern(sp.csr_matrix(ring[perm][:, perm]))
    assert row_locality(shuffled, rows) < 0.1
    assert auto_variant(shuffled) == "pair"
    assert choose_variant(pattern.degrees) == "pair"  # locality unknown
    assert choose_variant(pattern.degrees, 0.5) == "staged"
    assert choose_variant(pattern.degrees, 0.5, 0.49) == "staged"
    assert choose_variant(pattern.degrees, 0.0, 0.5) == "window"
    wide = symmetric_pattern(band_graph(rng, 5000, [1, 40, 41, 42, 43, 44], extra=0))  # staged, not window
    assert window_locality(wide) < 0.5 <= row_locality(wide, staged_rows_per_block(wide.degrees))
    assert auto_variant(wide) == "staged"


def test_window_rows_per_block():
    assert window_rows_per_block(100_000, 528) == 192  # 190 rows fill the 528 slots once
    assert window_rows_per_block(1_000, 528) == 96  # at least 96
    assert window_rows_per_block(10**7, 528) == 256  # several waves of the most rows
    assert window_rows_per_block(2001, 10) == 208  # 201 to a multiple of 8
    assert row_locality(symmetric_pattern(sp.csr_matrix(np.eye(4))), 8) == 0.0  # no off-diagonal entry


def test_staged_rows_per_block():
    assert staged_rows_per_block(np.full(1000, 10)) == 160  # 0.8 x 2048 entries at 10 per row: 163 -> 160
    assert staged_rows_per_block(np.full(1000, 2)) == 256  # one block of threads at most
    assert staged_rows_per_block(np.full(1000, 500)) == 8  # at least 8
    assert staged_rows_per_block(np.zeros(3, dtype=np.int64)) == 256


def test_pair_rows_per_block():
    assert pair_rows_per_block(np.full(1000, 10)) == 192  # 960 upper entries at 5 per row
    assert pair_rows_per_block(np.full(1000, 14)) == 136  # 137, to a multiple of 8
    assert pair_rows_per_block(np.full(1000, 2)) == 256  # one block of threads at most
    assert pair_rows_per_block(np.full(1000, 400)) == 8  # at least 8
    assert pair_rows_per_block(np.zeros(3, dtype=np.int64)) == 256
    assert pair_rows_per_block(np.full(10, 10), entries=1000) == 200


def test_device_options_are_checked_before_the_device_is_used():
    pattern = symmetric_pattern(sp.csr_matrix(np.ones((3, 3)) - np.eye(3)))
    for options, message in ((dict(rows_per_block=0), "rows_per_block must be 1 to 256"),
                             (dict(rows_per_block=257), "rows_per_block must be 1 to 256"),
                             (dict(balanced_chunk=0), "balanced_chunk must be 1 to 65536"),
                             (dict(pair_width=3), r"pair_width must be one of \(1, 2, 4\)"),
                             (dict(hash_min_degree=-1), "hash_min_degree must be an integer >= 0"),
                             (dict(hash_min_degree=2.5), "hash_min_degree must be an integer >= 0")):
        with pytest.raises(ValueError, match=message):
            DeviceSimilarity(None, pattern, metric=0, self_loops=False, dtype=np.float32, variant="pair", **options)


@pytest.mark.gpu
def test_gpu_work_line_is_the_sum_of_shorter_degrees_and_sizes_the_groups(rng, gpu_device):
    A = random_graph(rng, 200, 0.05, loops=0.3, isolated=0.1)
    values, run = device_values(gpu_device, A, "jaccard", variant="balanced", balanced_chunk=1)
    assert_matches_cpu(values, A)
    pattern = run.pattern
    d = pattern.degrees
    expected = sum(min(d[i], d[j]) for i in range(pattern.n)
                   for j in pattern.indices[pattern.indptr[i]:pattern.indptr[i + 1]] if i < j)
    assert run.work_items == expected
    assert run.group_entry.shape[0] == max(1, -(-expected // run.group_items))


def test_shortrow_group_size_and_limit():
    assert shortrow_group_size(np.array([0, 1, 1])) == 1
    assert shortrow_group_size(np.array([3, 5, 0])) == 8
    assert shortrow_group_size(np.array([16])) == 16
    assert shortrow_group_size(np.array([17, 2])) == 32
    assert shortrow_group_size(np.array([32])) == 32
    with pytest.raises(ValueError, match="at most 32 stored entries; G has a row of 33"):
        shortrow_group_size(np.array([33, 1]))


def test_hub_vertices_are_the_highest_degrees_that_fit(rng):
    n = 1000
    d = rng.integers(0, 300, n)
    words = -(-n // 32)
    hubs = hub_vertices(d, min_degree=64, max_bytes=10 * 4 * words + 3)
    assert hubs.dtype == np.int32 and hubs.size == 10
    assert np.all(np.diff(d[hubs]) <= 0)  # highest degree first
    assert d[hubs].min() >= np.sort(d)[-10]  # no vertex outside has a higher degree
    everything = hub_vertices(d, min_degree=64, max_bytes=1 << 40)
    np.testing.assert_array_equal(np.sort(everything), np.flatnonzero(d >= 64))
    assert hub_vertices(d, min_degree=64, max_bytes=4 * words - 1).size == 0
    assert hub_vertices(np.zeros(5, dtype=np.int64), min_degree=0, max_bytes=1 << 20).size == 0


def test_hash_table_rows(rng):
    d = np.array([0, 1, 2, 3, 4, 31, 32, 33, 64, 100, 1000])
    rows, slots = hash_table_rows(d, np.array([9], dtype=np.int32), min_degree=1)
    assert rows.dtype == np.int32 and slots.dtype == np.int64
    np.testing.assert_array_equal(rows, [1, 2, 3, 4, 5, 6, 7, 8, 10])  # not the hub 9, not degree 0
    np.testing.assert_array_equal(np.diff(slots), [4, 4, 8, 8, 64, 64, 128, 128, 2048])  # a bucket at least
    assert slots[0] == 0
    for min_degree in (0, 1, 2, 8, 32, 200):
        d = rng.integers(0, 300, 500)
        hubs = rng.choice(500, 20, replace=False).astype(np.int32)
        rows, slots = hash_table_rows(d, hubs, min_degree=min_degree)
        np.testing.assert_array_equal(rows, expected_hash_rows(d, hubs, min_degree))
        sizes = np.diff(slots)
        assert slots.size == rows.size + 1 and slots[0] == 0
        assert ((sizes & (sizes - 1)) == 0).all() and (slots % 4 == 0).all()  # aligned buckets of 4
        assert ((2 * d[rows] <= sizes) & ((sizes < 4 * d[rows]) | (sizes == 4))).all()  # load in (1/4, 1/2]
        # the size cuda_src/jaccard_search.cuh's hash_shift gives: 2^(32 - min(clz(2 d - 1), 30))
        assert all(int(size) == 1 << max(2, int(2 * k - 1).bit_length()) for size, k in zip(sizes, d[rows]))
    assert hash_table_rows(np.zeros(4, dtype=np.int64), [], min_degree=1)[0].size == 0


def test_auto_variant_follows_the_degree_distribution():
    ring = sp.diags([np.ones(999), np.ones(999)], [1, -1], shape=(1000, 1000)).tocsr()
    assert choose_variant(np.diff(ring.indptr)) == "pair"  # short lists everywhere
    ba_like = np.r_[np.full(10_000, 10), [1000, 700, 400]]
    assert choose_variant(ba_like) == "warp"  # a small graph of low mean degree
    assert choose_variant(np.r_[np.full(10_000, 16), [1000, 700, 400]]) == "longrow"  # a higher mean
    assert choose_variant(np.full(500, 200)) == "longrow"  # long lists everywhere
    chung_lu_like = np.r_[np.full(100_000, 8), [180_000]]
    assert choose_variant(chung_lu_like) == "longrow"  # a hub that dwarfs a low mean
    large = np.r_[np.full(LONGROW_MIN_ENTRIES // 8, 8), np.full(30, 500)]
    assert choose_variant(large) == "longrow"  # a low mean on a large graph: the work line pays
    assert choose_variant(large[-(LONGROW_MIN_ENTRIES // 16):]) == "warp"  # the same, half its entries
    assert WARP_MAX_MEAN < 16
    assert choose_variant(np.zeros(10, dtype=np.int64)) == "element"
    for d in (np.diff(ring.indptr), ba_like, chung_lu_like, np.zeros(10, dtype=np.int64)):
        assert choose_variant(DegreeFigures.of(d)) == choose_variant(d)  # the figures alone choose it


@pytest.mark.gpu
@pytest.mark.parametrize("variant", PIECE_VARIANTS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_pieces_give_the_whole_launchs_values(rng, gpu_device, variant, weighted):
    """The entry-parallel variants in pieces of consecutive rows: every piece's entries final at
    its event, and the values those of one launch, bit for bit."""
    A = skewed_graph(rng)
    whole, run = device_values(gpu_device, A, "jaccard", weighted=weighted, dtype=np.float32, variant=variant)
    p = run.pattern
    for pieces in (2, 7, 300):
        run.out.memset32(0x7FC00000, run.stream)  # NaN again: an entry copied before it is final shows
        done = run.compute(pieces=pieces)
        starts, ends = [d[0] for d in done], [d[1] for d in done]
        assert starts == [0] + ends[:-1] and ends[-1] == p.nnz and len(done) <= pieces
        assert np.isin(ends, p.indptr).all()  # every piece ends at a row's start
        out = np.full(p.nnz, np.nan, dtype=np.float32)
        for piece in done:
            run.download(out, [piece])
            assert not np.isnan(out[:piece[1]]).any()
        np.testing.assert_array_equal(out, whole)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["warp", "binary"])
def test_gpu_large_call_is_copied_out_in_pieces(rng, variant):
    """A call whose output passes PIECE_MIN_BYTES runs in pieces (and a uniform-valued input is
    checked without uploading its values): the CPU's values, bit for bit."""
    n = 200_000
    B = sp.random(n, n, density=16 / n, random_state=rng, format="csr")
    A = ((B + B.T) > 0).astype(np.float64).tocsr()
    assert A.nnz * 4 > 2 * PIECE_MIN_BYTES
    R, info = jaccard(A, backend="gpu", variant=variant, return_info=True)
    assert info.variant == variant and "validate_device" in info.times
    C = jaccard(A, backend="cpu")
    assert R.indptr.dtype == C.indptr.dtype == np.int32 and np.array_equal(R.indptr, C.indptr)
    assert np.array_equal(R.indices, C.indices) and not np.shares_memory(R.indices, A.indices)
    assert R.data.tobytes() == C.data.tobytes()


@pytest.mark.gpu
def test_graph_too_large_for_the_device_names_the_size(gpu_device):
    # 2e10 stored entries (no host memory: the index array is a broadcast view); over 160 GB on the card
    n, per_row = 100_000, 200_000
    indptr = np.arange(n + 1, dtype=np.int64) * per_row
    indices = np.broadcast_to(np.int32(0), (n * per_row,))
    pattern = SymmetricPattern(n, indptr, indices, None)
    with pytest.raises(GraphTooLargeError, match=r"similarity \(element variant\) of a graph with 100000 nodes.*GiB"):
        DeviceSimilarity(gpu_device, pattern, metric=0, self_loops=False, dtype=np.float32, variant="element")


def numpy_plan(pattern, variant, *, weighted, free_bytes, hash_min_degree=HASH_MIN_DEGREE):
    """The plan by independent NumPy passes over the entries: variant, launch shapes, bitmap and
    table rows."""
    d = pattern.degrees
    n = pattern.n
    rows = np.repeat(np.arange(n, dtype=np.int64), d)
    cols = pattern.indices.astype(np.int64)
    off = rows != cols
    positive = d[d > 0]
    if variant == "auto":
        top, mean = (int(positive.max()), float(positive.mean())) if positive.size else (0, 0.0)
        if not positive.size:
            variant = "element"
        elif top <= 32:
            gap = np.abs(cols - rows)
            complete = np.bincount(rows[gap >= 32], minlength=n) <= 4
            near = (gap < 32) & complete[rows] & complete[cols]
            block = staged_rows_per_block(d)
            window = float(np.mean(near[off])) if off.any() else 0.0
            local = float(np.mean(cols[off] // block == rows[off] // block)) if off.any() else 0.0
            variant = "window" if window >= 0.5 else "staged" if local >= 0.5 else "pair"
        else:
            small = int(d.sum()) < LONGROW_MIN_ENTRIES and mean <= WARP_MAX_MEAN
            variant = "warp" if small and not (top >= 8192 and top > 64 * mean) else "longrow"
    if weighted and variant in ("staged", "window"):
        variant = "pair"
    hubs = np.zeros(0, dtype=np.int32)
    tables = variant == "longrow" and not weighted and hash_min_degree > 0
    if variant in ("hub", "longrow") and not weighted:
        cap = min((1 << 25) if tables else (1 << 28), int(0.1 * free_bytes)) // (4 * -(-n // 32))
        order = np.lexsort((np.arange(n), -d))  # by degree, then index
        hubs = order[d[order] >= 64][:cap].astype(np.int32)
    hash_rows = expected_hash_rows(d, hubs, hash_min_degree) if tables else np.zeros(0, dtype=np.int64)
    sizes = np.array([max(4, 1 << int(2 * k - 1).bit_length()) for k in d[hash_rows]], dtype=np.int64)
    return dict(variant=variant, hubs=hubs, hash_rows=hash_rows, hash_slots=np.r_[0, np.cumsum(sizes)],
                hash_items=np.r_[0, np.cumsum(d[hash_rows])],
                group=int(min(32, max(4, 1 << int(np.ceil(np.log2(max(positive.mean() / 2, 1)))))))
                if positive.size else 4)


def plan_test_graphs(rng):
    from graphkern.generators import chung_lu
    yield random_graph(rng, 300, 0.04)
    yield skewed_graph(rng)
    yield high_hub_graph(rng)
    yield bounded_degree_graph(rng, 500, 20)
    yield band_graph(rng, 400, [1, 2, 3], 10)
    yield sp.csr_matrix(chung_lu(n=30_000, gamma=2.1, avg_degree=12, max_degree=20_000,
                                 seed=int(rng.integers(1 << 30)), as_csr=True))
    star = sp.lil_matrix((9000, 9000))
    star[0, 1:] = 1
    star[1:, 0] = 1
    yield sp.csr_matrix(star)  # a hub past 8192 that dwarfs the mean: "longrow"


@pytest.mark.parametrize("weighted", [False, True])
def test_plan_matches_numpy(rng, weighted):
    free = 64 << 30
    for A in plan_test_graphs(rng):
        pattern = symmetric_pattern(A, weighted=weighted)
        for variant in ("auto", "warp", "balanced", "hub", "longrow", "pair", "staged"):
            expected = numpy_plan(pattern, variant, weighted=weighted, free_bytes=free)
            plan = plan_similarity(pattern, DeviceOptions(variant=variant), weighted=weighted, dtype=np.float32,
                                   free_bytes=free, n_threads=2)
            assert plan.variant == expected["variant"], variant
            assert plan.group == expected["group"]
            for name in ("hubs", "hash_rows", "hash_slots", "hash_items"):
                np.testing.assert_array_equal(getattr(plan, name), expected[name], err_msg=f"{variant} {name}")
            assert "group_entry" not in plan.sizes  # the device sizes it from the work line it sums


def test_plan_variety_of_choices(rng):
    # the graphs above reach every choice auto makes, so the comparison covers each branch
    chosen = {plan_similarity(symmetric_pattern(A), DeviceOptions(), weighted=False, dtype=np.float32,
                              free_bytes=1 << 34).variant for A in plan_test_graphs(rng)}
    assert {"warp", "longrow", "pair", "window"} <= chosen


def test_plan_drops_tables_that_do_not_fit(rng):
    pattern = symmetric_pattern(high_hub_graph(rng))
    options = DeviceOptions(variant="longrow", hash_min_degree=2, hub_max_bytes=0)
    full = plan_similarity(pattern, options, weighted=False, dtype=np.float32, free_bytes=1 << 34)
    assert full.hash_rows.size > 0
    tight = plan_similarity(pattern, options, weighted=False, dtype=np.float32, free_bytes=full.nbytes - 1)
    assert tight.hash_rows.size == 0 and "hash_keys" not in tight.sizes and tight.hash_slots.tolist() == [0]


def test_auto_runs_warp_where_the_work_line_does_not_fit(rng):
    pattern = symmetric_pattern(high_hub_graph(rng, n=3000, extra_edges=40_000))  # mean degree about 30
    auto = DeviceOptions(hub_max_bytes=0, hash_min_degree=0)  # the work line alone
    roomy = plan_similarity(pattern, auto, weighted=False, dtype=np.float32, free_bytes=1 << 34)
    warp = plan_similarity(pattern, DeviceOptions(variant="warp"), weighted=False, dtype=np.float32,
                           free_bytes=1 << 34)
    assert roomy.variant == "longrow" and warp.nbytes < roomy.nbytes
    tight = plan_similarity(pattern, auto, weighted=False, dtype=np.float32, free_bytes=roomy.nbytes - 1)
    assert tight.variant == "warp" and tight.sizes == warp.sizes
    # asked for by name, it stays (the device's check then names what does not fit)
    asked = DeviceOptions(variant="longrow", hub_max_bytes=0, hash_min_degree=0)
    assert plan_similarity(pattern, asked, weighted=False, dtype=np.float32,
                           free_bytes=roomy.nbytes - 1).variant == "longrow"
    # nor does it fall back where warp does not fit either
    assert plan_similarity(pattern, auto, weighted=False, dtype=np.float32,
                           free_bytes=warp.nbytes - 1).variant == "longrow"


def test_plan_counts_reject_out_of_range_indices():
    A = sp.csr_matrix(np.ones((4, 4)) - np.eye(4))
    pattern = symmetric_pattern(A)
    pattern.indices[0] = 7
    with pytest.raises(ValueError, match="G has 1 column indices outside"):
        row_locality(pattern, 8)
