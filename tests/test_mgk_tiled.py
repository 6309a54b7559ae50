"""The tiled GPU solver of the marginalized graph kernel: octiles built for it, options, the
multi-GPU split on the host; on a GPU, every combination of techniques against the core solver
and the dense float64 reference."""

import itertools

import numpy as np
import pytest

from graphkern import NotConvergedError
from graphkern.mgk.dense import dense_mgk, dense_mgk_pair
from graphkern.mgk.tiled import (BLOCK_SHARED_BUDGET, CLUSTER_BLOCKS, FORM_THRESHOLDS, INCREMENTAL_STEPS, PRESETS,
                                  ROW_SLOTS, ROW_SLOTS_MIN, SLAB, TiledData, bitmap_mask, choose_team,
                                  default_row_slots, expected_iterations, lpt_makespan, resolve_techniques, shared_bytes,
                                  split_pairs, supports_clusters, thresholds, tiled_data)
from graphkern.basekernels import Additive, Constant, KroneckerDelta, SquareExponential, TensorProduct
from graphkern.graph import Graph
from graphkern.mgk import MarginalizedGraphKernel
from graphkern.mgk.results import solver_arguments

from conftest import SANITIZER, sanitized

# One kernel pair per edge-kernel form of the solver: constant, the two shortcuts, the interpreter.
KERNELS = {
    "constant": (Constant(1.0), Constant(0.9)),
    "kronecker": (TensorProduct(element=KroneckerDelta(0.4)), TensorProduct(order=KroneckerDelta(0.3))),
    "sqexp": (TensorProduct(element=KroneckerDelta(0.5), charge=SquareExponential(1.2)),
              TensorProduct(length=SquareExponential(0.6), k=Constant(0.8))),
    "general": (Additive(element=KroneckerDelta(0.3), coords=SquareExponential(1.5)),
                TensorProduct(order=KroneckerDelta(0.5), length=SquareExponential(0.9))),
}
TECHNIQUE_GRID = dict(tiles=("sparse", "dense"), primitives=("adaptive", "dd", "ds", "ss"), storage=("compact", "full"),
                      team=("warp", "block", "cluster"), schedule=("dynamic", "static"))
H100_SHARED_LIMIT = 227 * 1024
# vertices of a graph of mean degree 3 whose octiles (pbr, sparse tiles) pass CLUSTER_MIN_OCTILES by
# far (155 or more in 200 draws, 188 in the median): "auto" gives its pair with itself a cluster team
RACE_CLUSTER_N = 240


def labeled_graph(rng, n, density=0.3, *, self_loops=True, weighted=True, components=1, edges=None):
    """A labeled, weighted graph; ``components`` > 1 splits the vertices into unconnected blocks."""
    if edges is None:
        block = rng.integers(0, components, n) if components > 1 else np.zeros(n, dtype=int)
        edges = [(i, j) for i in range(n) for j in range(i if self_loops else i + 1, n)
                 if block[i] == block[j] and rng.random() < density]
    m = len(edges)
    edge_labels = {"order": rng.integers(1, 4, m), "length": rng.uniform(1.0, 2.0, m)}
    G = Graph.from_edges(np.array(edges, dtype=np.int64).reshape(-1, 2), n,
                         weights=rng.uniform(0.5, 2.0, m) if weighted and m else None,
                         node_labels={"element": rng.integers(0, 3, n), "charge": rng.normal(size=n),
                                      "coords": rng.normal(size=(n, 3))},
                         edge_labels=edge_labels if m else None)
    if not m:  # Graph cannot check empty label columns against an empty CSR: attach them afterwards
        G.edge_labels.update(edge_labels)
    return G


def star_graph(rng, n):
    """Vertex 0 joined to every other vertex: its tile row holds ceil(n / 8) octiles."""
    return labeled_graph(rng, n, edges=[(0, j) for j in range(1, n)] + [(j, j + 1) for j in range(1, n - 1, 3)])


def spread_row_graph(rng, n, fan_out=4):
    """Vertices 0-7 each joined to ``fan_out`` random others, the rest a path: the first tile row
    touches most octile columns while every degree stays small (float32 stays well conditioned)."""
    edges = {(i, int(j)) for i in range(8) for j in rng.choice(np.arange(8, n), fan_out, replace=False)}
    edges |= {(j, j + 1) for j in range(8, n - 1)}
    return labeled_graph(rng, n, edges=sorted(edges))


def edge_case_set(rng):
    """n < 8, n not a multiple of 8, a single vertex, no edges, disconnected parts, a long tile row
    (under a sanitizer 5 octile columns instead of 9; under racecheck 3, and without the 17- and
    26-vertex graphs: every kind above stays)."""
    X = [labeled_graph(rng, 1), labeled_graph(rng, 5, 0.6), labeled_graph(rng, 9, components=3),
         labeled_graph(rng, 12, weighted=False), labeled_graph(rng, 6, 0.0), labeled_graph(rng, 17, 0.25),
         labeled_graph(rng, 26, 0.15, components=2), spread_row_graph(rng, sanitized(70, 40, race=24))]
    return sanitized(X, X, race=X[:5] + X[7:])


def gpu_teams(device=0):
    """The team kinds device ``device`` runs: clusters need compute capability 9.0."""
    from graphkern._cuda import runtime as rt

    return ("warp", "block", "cluster") if supports_clusters(rt.get_device(device)) else ("warp", "block")


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.abs(b)))


def dataset(graphs, name="general", dtype=np.float64):
    kern = MarginalizedGraphKernel(*KERNELS[name], dtype=dtype, backend="cpu")
    return kern._dataset(graphs, kern._settings())


# ---------------------------------------------------------------------------- options


def test_presets_and_technique_validation():
    assert resolve_techniques("core") is None
    assert resolve_techniques(None) == resolve_techniques("auto")
    for name, tech, reorder in INCREMENTAL_STEPS:
        assert set(tech) == set(resolve_techniques("auto"))
    # each incremental step adds exactly one technique to the one before
    for (_, before, r0), (name, after, r1) in zip(INCREMENTAL_STEPS, INCREMENTAL_STEPS[1:]):
        changed = {k for k in after if after[k] != before[k]} | ({"reorder"} if r0 != r1 else set())
        assert len(changed) == 1, (name, changed)
    assert PRESETS["dynsched"]["schedule"] == "dynamic" and PRESETS["dense"]["tiles"] == "dense"
    tech = resolve_techniques({"storage": "full", "ss_max": 4, "block_warps": np.int64(4)})
    assert tech["storage"] == "full" and tech["ss_max"] == 4 and tech["block_warps"] == 4
    for bad, match in [({"tiles": "some"}, r"techniques\['tiles'\] must be one of"),
                       ({"ss_max": 65}, r"techniques\['ss_max'\] must be an int in \[-1, 64\]"),
                       ({"block_warps": None}, "block_warps"), ({"block_warps": 17}, "block_warps"),
                       ({"slab": 32}, "slab"), ({"rows": 3}, "unknown key 'rows'"), ("fastest", "unknown preset")]:
        with pytest.raises(ValueError, match=match):
            resolve_techniques(bad)
    with pytest.raises(TypeError, match="preset name or a dict"):
        resolve_techniques(3)
    nk, ek = KERNELS["constant"]
    with pytest.raises(ValueError, match="reorder must be one of"):
        MarginalizedGraphKernel(nk, ek, reorder="metis")
    with pytest.raises(ValueError, match="unknown key"):
        MarginalizedGraphKernel(nk, ek, techniques={"team": "block", "colour": 1})
    kern = MarginalizedGraphKernel(nk, ek, reorder=None, techniques={"team": "warp"})
    assert kern.get_params()["reorder"] is None and kern.get_params()["techniques"] == {"team": "warp"}


def test_thresholds_by_form_and_forced_primitives():
    base = resolve_techniques("auto")
    for form, (ss, ds) in FORM_THRESHOLDS.items():
        assert thresholds(base, form) == (ss, ds) and -1 <= ss <= ds <= 64
    assert thresholds(dict(base, primitives="dd"), "sqexp") == (-1, -1)
    assert thresholds(dict(base, primitives="ds"), "sqexp") == (-1, 64)
    assert thresholds(dict(base, primitives="ss"), "sqexp") == (64, 64)
    assert thresholds(dict(base, ss_max=3, ds_max=None), "kronecker") == (3, FORM_THRESHOLDS["kronecker"][1])


def test_cpu_results_do_not_depend_on_gpu_options(rng):
    X = [labeled_graph(rng, n) for n in (4, 11)]
    nk, ek = KERNELS["kronecker"]
    a = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu")(X)
    b = MarginalizedGraphKernel(nk, ek, dtype=np.float64, backend="cpu", reorder=None, techniques="dense")(X)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------- octiles for the solver


def _decode(td, g):
    """Graph g of a TiledData as dense (n, n, channels) values and an (n, n) stored-entry mask."""
    n = int(td.n_nodes[g])
    side = -(-n // 8)
    vals = np.zeros((side * 8, side * 8, td.channels))
    seen = np.zeros((side * 8, side * 8), dtype=bool)
    rp = td.tile_rowptr[td.rowptr_offset[g]: td.rowptr_offset[g] + side + 1]
    assert rp[0] == td.tile_offsets[g] and rp[-1] == td.tile_offsets[g + 1]
    mask = bitmap_mask(td.bitmap[:len(td.tile_row)])
    for R in range(side):
        cols = td.tile_col[rp[R]:rp[R + 1]]
        assert np.all(np.diff(cols) > 0) and np.all(td.tile_row[rp[R]:rp[R + 1]] == R)
        for t in range(rp[R], rp[R + 1]):
            C = td.tile_col[t]
            if td.storage == "compact":
                block = np.zeros((64, td.channels))
                block[mask[t]] = td.values[td.nz_offsets[t]: td.nz_offsets[t] + mask[t].sum()]
            else:
                block = td.values[t].T
            assert td.nnz_per_tile[t] == mask[t].sum()
            vals[R * 8:R * 8 + 8, C * 8:C * 8 + 8] = block.reshape(8, 8, -1)
            seen[R * 8:R * 8 + 8, C * 8:C * 8 + 8] = mask[t].reshape(8, 8)
    assert not vals[n:].any() and not vals[:, n:].any() and not seen[n:].any() and not seen[:, n:].any()
    return vals[:n, :n], seen[:n, :n]


@pytest.mark.parametrize("reorder", [None, "rcm", "pbr"])
@pytest.mark.parametrize("tiles, storage", [("sparse", "compact"), ("sparse", "full"), ("dense", "compact"),
                                            ("dense", "full")])
def test_tiled_data_holds_the_reordered_graphs(rng, reorder, tiles, storage):
    X = edge_case_set(rng)
    ds = dataset(X)
    length_column = 1 + 1  # channel 0 is the weight; the features are (order code, length)
    td = tiled_data(ds, reorder=reorder, tiles=tiles, storage=storage, channels=(0, length_column), n_threads=2)
    assert td is tiled_data(ds, reorder=reorder, tiles=tiles, storage=storage, channels=(0, length_column))
    for g, G in enumerate(X):
        perm = np.arange(G.n_nodes) if td.perms is None else td.perms[g]
        np.testing.assert_array_equal(np.sort(perm), np.arange(G.n_nodes))
        H = G.permute(perm)
        vals, seen = _decode(td, g)
        A = H.to_scipy().toarray()
        np.testing.assert_array_equal(seen, A != 0)
        np.testing.assert_allclose(vals[..., 0], A, rtol=1e-15)
        rows = np.repeat(np.arange(H.n_nodes), np.diff(H.indptr))
        np.testing.assert_allclose(vals[rows, H.indices, 1], H.edge_labels["length"], rtol=1e-15)
        side = -(-G.n_nodes // 8)
        if tiles == "dense":
            assert td.tiles_per_graph[g] == side * side
        else:
            assert td.tiles_per_graph[g] == len(np.unique((rows // 8) * side + H.indices // 8))
        lo = ds.node_offsets[g]
        np.testing.assert_allclose(td.degree[lo:lo + G.n_nodes], A.sum(axis=1), rtol=1e-12)
        np.testing.assert_array_equal(td.node_features[lo:lo + G.n_nodes], ds.node_features[lo + perm])
        assert td.max_degree[g] == pytest.approx(A.sum(axis=1).max() if G.n_nodes else 0.0)


def test_reordering_never_adds_octiles(rng):
    X = [labeled_graph(rng, n, 0.1) for n in (30, 45, 64)] + [star_graph(rng, 50)]
    ds = dataset(X, "constant")
    natural = tiled_data(ds, reorder=None, tiles="sparse", storage="compact", channels=(0,))
    pbr = tiled_data(ds, reorder="pbr", tiles="sparse", storage="compact", channels=(0,))
    assert np.all(pbr.tiles_per_graph <= natural.tiles_per_graph)
    assert pbr.values.shape == natural.values.shape  # the same nonzeros, in fewer octiles


def test_unpermute_puts_nodal_blocks_back(rng):
    X = [labeled_graph(rng, n) for n in (7, 13)]
    ds = dataset(X)
    td = tiled_data(ds, reorder="pbr", tiles="sparse", storage="compact", channels=(0,))
    R = rng.normal(size=(7, 13))
    permuted = R[np.ix_(td.perms[0], td.perms[1])]  # what the solver computes in its numbering
    np.testing.assert_array_equal(td.unpermute(0, permuted, td, 1), R)
    natural = tiled_data(ds, reorder=None, tiles="sparse", storage="compact", channels=(0,))
    assert natural.unpermute(0, R, natural, 1) is R


# ---------------------------------------------------------------------------- planning on the host


@pytest.mark.parametrize("n_devices", [1, 2, 3])
def test_split_pairs_covers_every_pair_once_and_balances(rng, n_devices):
    n = 60
    i, j = np.triu_indices(n)
    pairs = np.stack([i, j], axis=1)
    cost = rng.lognormal(0.0, 1.0, len(pairs))
    shares = split_pairs(pairs, cost, n_devices)
    assert len(shares) == n_devices
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(len(pairs)))
    loads = np.array([cost[s].sum() for s in shares])
    assert loads.max() <= 1.1 * loads.mean()
    assert [len(s) for s in split_pairs(np.zeros((0, 2), np.int64), np.zeros(0), 2)] == [0, 0]


def test_predicted_cost_model():
    # denser graphs and smaller q need more CG iterations
    assert expected_iterations(np.array([6.0]), np.array([6.0]), 0.05) > expected_iterations(np.array([2.0]),
                                                                                             np.array([2.0]), 0.05)
    assert expected_iterations(np.array(3.0), np.array(3.0), 0.001) > expected_iterations(np.array(3.0),
                                                                                          np.array(3.0), 0.1)
    assert expected_iterations(np.array(0.0), np.array(5.0), 0.05) == pytest.approx(1.0)
    assert choose_team(200_000, np.full(10, 120), 132) == "warp"
    assert choose_team(500, np.full(10, 120), 132) == "block"
    assert choose_team(200_000, np.full(10, 700_000), 132) == "block"
    # few large pairs: a cluster of blocks each, where the device has clusters and G1 is large
    big = dict(g1_octiles=np.full(21, 600))
    assert choose_team(21, np.full(21, 360_000), 132, clusters=True, **big) == "cluster"
    assert choose_team(21, np.full(21, 360_000), 132, clusters=False, **big) == "block"
    assert choose_team(21, np.full(21, 360_000), 132, clusters=True, g1_octiles=np.full(21, 20)) == "block"
    # by predicted makespan: costs of pairs of 500-1000-vertex graphs (4x apart), one wave of
    # block teams or a pair past it -> clusters; two even waves or many pairs -> blocks
    sizes = np.linspace(500, 1000, 2000)
    for m, team in ((136, "cluster"), (264, "cluster"), (265, "cluster"), (528, "block"), (2000, "block")):
        cost = (sizes[np.linspace(0, 1999, m).astype(int)]) ** 2
        assert choose_team(m, cost, 132, clusters=True, g1_octiles=np.full(m, 600), cost=cost) == team, m
    assert lpt_makespan([5.0, 1.0, 1.0, 1.0], 2) == 5.0
    assert lpt_makespan([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0
    assert lpt_makespan([4.0, 1.0], 8) == 4.0


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("planes", [1, 2, 4])
def test_default_launch_fits_shared_memory(itemsize, planes):
    for team, warps, teams in (("warp", 1, 4), ("block", 8, 1), ("block", 16, 1), ("cluster", 8, 1)):
        slots = default_row_slots(team, itemsize, planes, SLAB[team], warps)
        assert ROW_SLOTS_MIN <= slots <= ROW_SLOTS[team]
        nbytes = shared_bytes(itemsize, planes, slots, SLAB[team], warps, teams)
        assert nbytes <= H100_SHARED_LIMIT, (team, warps)
        if team != "warp" and slots > ROW_SLOTS_MIN:
            assert nbytes <= BLOCK_SHARED_BUDGET
    assert default_row_slots("block", 4, 2, SLAB["block"], 8) == 32  # the shortcut forms in float32
    # three blocks of warp teams per SM with the shortcut forms in float32 (1 KB per block is reserved)
    assert 3 * (shared_bytes(4, 2, ROW_SLOTS["warp"], SLAB["warp"], 1, 4) + 1024) <= 228 * 1024


# ---------------------------------------------------------------------------- on the GPU


def _all_combinations():
    keys = list(TECHNIQUE_GRID)
    for values in itertools.product(*TECHNIQUE_GRID.values()):
        yield dict(zip(keys, values))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KERNELS))
def test_every_combination_matches_core_and_dense_reference(rng, combinations, name):
    X = edge_case_set(rng) + sanitized([labeled_graph(rng, 40, 0.1)], [])
    nk, ek = KERNELS[name]
    # the condition number grows like max degree / q: q = 0.1 and degrees below ~10 keep it near 100,
    # where float32 CG to tol 1e-6 matches the dense solve to a few 1e-6, as in the core suite
    ref = dense_mgk(X, None, nk.compile(), ek.compile(), q=0.1)
    core = MarginalizedGraphKernel(nk, ek, q=0.1, backend="gpu", techniques="core")(X)
    assert rel_err(core, ref) < 3e-5
    kern = MarginalizedGraphKernel(nk, ek, q=0.1, backend="gpu")
    failures = []
    teams = gpu_teams()
    cases = [(reorder, tech) for reorder in (None, "rcm", "pbr") for tech in _all_combinations()
             if tech["team"] in teams]
    for reorder, tech in combinations(cases, race=1):  # under racecheck one drawn from the share
        kern.reorder, kern.techniques = reorder, tech
        K = kern(X)
        assert K.dtype == np.float32
        err_ref, err_core = rel_err(K, ref), rel_err(K, core)
        np.testing.assert_array_equal(K, K.T)
        if not (err_ref < 3e-5 and err_core < 3e-5):
            failures.append((reorder, tech, err_ref, err_core))
    assert not failures, failures[:5]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KERNELS))
def test_float64_every_primitive_and_team(rng, combinations, name):
    X = edge_case_set(rng)
    nk, ek = KERNELS[name]
    q = sanitized(0.05, 0.05, race=0.2)  # under racecheck fewer CG iterations (the reference's q too)
    ref = dense_mgk(X, None, nk.compile(), ek.compile(), q=q)
    kern = MarginalizedGraphKernel(nk, ek, q=q, tol=1e-13, dtype=np.float64, backend="gpu")
    grid = itertools.product(("adaptive", "dd", "ds", "ss"), ("compact", "full"), gpu_teams())
    for primitives, storage, team in combinations(grid, race=1):
        kern.techniques = dict(primitives=primitives, storage=storage, team=team)
        assert rel_err(kern(X), ref) < 1e-10, (primitives, storage, team)


@pytest.mark.gpu
def test_windows_chunks_and_block_sizes(rng):
    """Slabs smaller than a pair's output and fewer slots than a tile row's octiles: the XMV is
    taken in windows of G2 and chunks of G1; every block size gives the same matrix."""
    # under a sanitizer: a star of 40 (5 octiles in its row, more than 3 slots; 1,600 outputs a pair,
    # more than a 192 slab), one block size per team kind, the smallest and the largest windows
    X = [star_graph(rng, sanitized(90, 40)), labeled_graph(rng, sanitized(75, 30), 0.2)]
    X += sanitized([labeled_graph(rng, 33, 0.3)], []) + [labeled_graph(rng, 3)]
    nk, ek = KERNELS["kronecker"]
    ref = dense_mgk(X, None, nk.compile(), ek.compile(), q=0.05)
    kern = MarginalizedGraphKernel(nk, ek, q=0.05, tol=1e-13, dtype=np.float64, backend="gpu")
    teams = sanitized([("warp", 1), ("block", 1), ("block", 2), ("block", 5), ("block", 16)],
                      [("warp", 1), ("block", 5)])
    if "cluster" in gpu_teams():
        teams += sanitized([("cluster", 1), ("cluster", 3), ("cluster", 8)], [("cluster", 3)])
    windows = sanitized(((1, 64), (2, 128), (3, 192), (None, None)), ((1, 64), (3, 192), (None, None)))
    for team, warps in teams:
        for row_slots, slab in windows:
            kern.techniques = dict(team=team, block_warps=warps, row_slots=row_slots, slab=slab)
            assert rel_err(kern(X), ref) < 1e-10, (team, warps, row_slots, slab)


@pytest.mark.gpu
@pytest.mark.parametrize("reorder", [None, "pbr"])
@pytest.mark.parametrize("team", ["warp", "block", "cluster"])
def test_nodal_rectangular_pairs_and_normalize(rng, reorder, team):
    if team not in gpu_teams():
        pytest.skip("thread-block clusters need compute capability 9.0")
    X = [labeled_graph(rng, n) for n in (1, 6, 11, 20)]
    Y = [labeled_graph(rng, n) for n in (4, 9, 17)]
    nk, ek = KERNELS["sqexp"]
    node_p, edge_p = nk.compile(), ek.compile()
    kw = dict(q=0.05, p=0.8, tol=1e-13, dtype=np.float64, reorder=reorder, techniques={"team": team})
    kern = MarginalizedGraphKernel(nk, ek, backend="gpu", **kw)
    R = kern(X, Y, nodal=True)
    K = kern(X, Y)
    offx = np.cumsum([0] + [g.n_nodes for g in X])
    offy = np.cumsum([0] + [g.n_nodes for g in Y])
    for a, G1 in enumerate(X):
        for b, G2 in enumerate(Y):
            ref = dense_mgk_pair(G1, G2, node_p, edge_p, p=0.8, q=0.05, nodal=True)
            np.testing.assert_allclose(R[offx[a]:offx[a + 1], offy[b]:offy[b + 1]], ref, rtol=1e-9)
            assert abs(ref.sum() - K[a, b]) <= 1e-10 * K[a, b]
    pairs = np.array([[3, 2], [0, 1], [3, 2]])
    np.testing.assert_allclose(kern(X, Y, pairs=pairs), K[pairs[:, 0], pairs[:, 1]], rtol=1e-12)
    cpu = MarginalizedGraphKernel(nk, ek, backend="cpu", normalize=True, **kw)
    gpu = MarginalizedGraphKernel(nk, ek, backend="gpu", normalize=True, **kw)
    assert rel_err(gpu(X, Y), cpu(X, Y)) < 1e-10
    np.testing.assert_allclose(gpu.diag(X), np.ones(len(X)))


def _teams_run(kern, X):
    """The team kind each device ran when ``kern``'s tiled engine solves the upper triangle of X
    (under racecheck, where a cluster launch costs tens of seconds: in ``kern``'s last call, which
    was that solve)."""
    if SANITIZER == "racecheck":
        return [r[3] for r in kern.last_engine_.engines["tiled"].last_run]
    s = kern._settings()
    engine = kern._router(s).engines["tiled"]
    ds = kern._dataset(X, s)
    engine.solve(ds, ds, np.stack(np.triu_indices(len(X)), axis=1).astype(np.int64), solver_arguments(ds, ds, s),
                 nodal=False)
    return [r[3] for r in engine.last_run]


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_cluster_teams_on_large_pairs(rng, schedule):
    """A cluster of blocks per pair on graphs with many groups of tile rows (every block of the
    cluster gets groups) and on small ones (some blocks get none), more pairs than clusters fit
    at once in float64, the same matrix as block teams and the CPU."""
    if "cluster" not in gpu_teams():
        pytest.skip("thread-block clusters need compute capability 9.0")
    # under racecheck one large G1, a path of 133 vertices (17 tile rows: groups for every block of a
    # cluster, in few octiles), and q = 0.9 (fewer CG iterations; every reference uses it too); the
    # block teams, racechecked in the tests above, are then left out
    X = [labeled_graph(rng, int(n), 6.0 / n) for n in (260, 190, 133)]
    X = sanitized(X, X, race=[labeled_graph(rng, 133, edges=[(k, k + 1) for k in range(132)])])
    X += [labeled_graph(rng, 7), star_graph(rng, sanitized(70, 70, race=40))]
    nk, ek = KERNELS["sqexp"]
    kw = dict(q=sanitized(0.05, 0.05, race=0.9), tol=1e-12, dtype=np.float64, reorder="pbr")
    cpu = MarginalizedGraphKernel(nk, ek, backend="cpu", **kw)(X)
    for warps, row_slots in sanitized(((8, None), (4, 2), (16, 1)), ((4, 2),)):
        tech = dict(team="cluster", schedule=schedule, block_warps=warps, row_slots=row_slots)
        kern = MarginalizedGraphKernel(nk, ek, backend="gpu", techniques=tech, **kw)
        K = kern(X)
        assert rel_err(K, cpu) < 1e-10, (warps, row_slots)
        assert _teams_run(kern, X) == ["cluster"]
    if SANITIZER != "racecheck":
        block = MarginalizedGraphKernel(nk, ek, backend="gpu", techniques=dict(team="block", schedule=schedule), **kw)
        assert rel_err(block(X), cpu) < 1e-10
    assert CLUSTER_BLOCKS == 8


@pytest.mark.gpu
def test_auto_gives_few_large_pairs_cluster_teams(rng):
    """float32 and the default techniques: a few pairs of large graphs go to clusters, with the
    matrix of block teams (of the CPU under racecheck)."""
    if "cluster" not in gpu_teams():
        pytest.skip("thread-block clusters need compute capability 9.0")
    nk, ek = KERNELS["sqexp"]
    q = sanitized(0.05, 0.05, race=0.9)
    big = [labeled_graph(rng, int(n), 3.0 / n) for n in (600, 560)]
    # under a sanitizer one pair of 600-vertex graphs, not three pairs; under racecheck the one pair
    # of a RACE_CLUSTER_N-vertex graph, whose octiles pass CLUSTER_MIN_OCTILES, with a 7-vertex one
    # (K(X, Y): the large graph is each pair's first), against the CPU: a cluster's reductions and
    # shared tiles as with any pair, over a hundredth of the octile pairs of the large one with itself
    X = sanitized(big, big[:1], race=[labeled_graph(rng, RACE_CLUSTER_N, 3.0 / RACE_CLUSTER_N)])
    Y = sanitized(None, None, race=[labeled_graph(rng, 7)])
    auto = MarginalizedGraphKernel(nk, ek, q=q, backend="gpu", techniques="tiled")
    K = auto(X, Y)
    assert _teams_run(auto, X) == ["cluster"]
    on_blocks = dict(backend="gpu", techniques=dict(team="block"))
    ref = MarginalizedGraphKernel(nk, ek, q=q, **sanitized(on_blocks, on_blocks, race=dict(backend="cpu")))(X, Y)
    assert rel_err(K, ref) < 3e-5


@pytest.mark.gpu
def test_small_stopping_probability_and_non_convergence(rng):
    X = [labeled_graph(rng, n, 0.2, weighted=False) for n in (6, 15, 24)]
    nk, ek = KERNELS["constant"]
    ref = dense_mgk(X, None, nk.compile(), ek.compile(), q=5e-4)
    K = MarginalizedGraphKernel(nk, ek, q=5e-4, tol=1e-13, dtype=np.float64, backend="gpu")(X)
    assert rel_err(K, ref) < 1e-9
    kern = MarginalizedGraphKernel(nk, ek, q=0.01, max_iter=2, backend="gpu")
    with pytest.raises(NotConvergedError, match="max_iter=2") as info:
        kern(X)
    # the 15- and 24-vertex graphs need more than two steps; the 6-vertex one may have so few edges
    # (a fresh random graph each run) that its pairs converge within two
    listed = {tuple(p) for p in info.value.pairs.tolist()}
    assert {(1, 1), (1, 2), (2, 2)} <= listed and np.all(info.value.iterations == 2)
    assert np.all(info.value.residuals > 1e-6) and np.all(kern.info_.iterations <= 2)


@pytest.mark.gpu
def test_dataset_and_device_copies_are_reused(rng):
    X = [labeled_graph(rng, n) for n in (5, 19, 30)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, dtype=np.float64, tol=1e-13, backend="gpu", techniques="tiled")
    kern(X)
    ds = next(iter(kern._datasets._entries.values()))
    s = kern._settings()
    td, _ = kern._router(s).engines["tiled"].datasets(ds, ds, solver_arguments(ds, ds, s))
    assert isinstance(td, TiledData)
    # the tiled octiles' device copies are kept with the dataset's, one per option set and device
    copies = {k: v for k, v in ds.device_copies.items() if k[0] == "tiled"}
    assert list(copies) == [("tiled", "pbr", "sparse", "compact", (0, 1), 0)]
    kern.q = 0.3
    K = kern(X)
    assert all(ds.device_copies[k] is v for k, v in copies.items())
    assert rel_err(K, dense_mgk(X, None, nk.compile(), ek.compile(), q=0.3)) < 1e-10
    assert kern.info_.octile_pairs is not None and np.all(kern.info_.octile_pairs >= 0)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("team", ["warp", "block", "cluster"])
@pytest.mark.parametrize("queue", ["shared", "split", "static"])
def test_two_gpus_equal_one(rng, monkeypatch, team, queue):
    """Two devices sharing one work queue (NVLink), splitting the Gram matrix's tiles (the shared
    queue turned off, or a static schedule): the same K as one device, every pair solved once."""
    from graphkern._cuda import runtime as rt
    from graphkern.mgk import tiled as _mgk_tiled

    if team not in gpu_teams(0) or team not in gpu_teams(1):
        pytest.skip("thread-block clusters need compute capability 9.0")
    if queue == "shared" and not _mgk_tiled.shared_queue_devices([rt.get_device(0), rt.get_device(1)]):
        pytest.skip("device 1 has no native atomics on device 0's memory (no NVLink)")
    # under racecheck graphs of 5-29 vertices and q = 0.3 (fewer CG iterations, on both sides), and
    # the tiled engine's record of the two-device call itself instead of another solve
    X = [labeled_graph(rng, int(n), 0.15) for n in rng.integers(5, sanitized(60, 60, race=30), sanitized(24, 8))]
    nk, ek = KERNELS["sqexp"]
    kw = dict(q=sanitized(0.05, 0.05, race=0.3), tol=1e-13, dtype=np.float64, backend="gpu",
              shared_queue=queue == "shared",
              techniques={"team": team, "schedule": "static" if queue == "static" else "dynamic"})
    one = MarginalizedGraphKernel(nk, ek, device=0, **kw)(X)
    kern = MarginalizedGraphKernel(nk, ek, device=[0, 1], **kw)
    two = kern(X)
    assert rel_err(two, one) < 1e-11 and kern.info_.options["shared_queue"] == (queue == "shared")
    if SANITIZER == "racecheck":
        engine = kern.last_engine_.engines["tiled"]
    else:
        s = kern._settings()
        engine = kern._router(s).engines["tiled"]
        ds = next(iter(kern._datasets._entries.values()))
        engine.solve(ds, ds, np.stack(np.triu_indices(len(X)), axis=1).astype(np.int64), solver_arguments(ds, ds, s),
                     nodal=False)
    assert engine.last_shared_queue == (queue == "shared")
    assert sorted(r[0] for r in engine.last_run) == [0, 1]
    # every pair once (with a shared queue the device that starts first may take all 300 small pairs)
    assert sum(r[1] for r in engine.last_run) == len(X) * (len(X) + 1) // 2
    swapped = MarginalizedGraphKernel(nk, ek, device=[1, 0], **kw)
    assert rel_err(swapped(X), one) < 1e-11
    Y = X[:5]
    np.testing.assert_allclose(kern(X, Y, nodal=True), MarginalizedGraphKernel(nk, ek, device=0, **kw)(X, Y, nodal=True),
                               rtol=1e-10)


def test_shared_queue_needs_native_peer_atomics_to_the_first_device():
    from graphkern.mgk import tiled as _mgk_tiled

    class FakeDevice:
        def __init__(self, peer, atomics):
            self.peer, self.atomics, self.enabled = peer, atomics, []

        def can_access_peer(self, other):
            return self.peer

        def native_peer_atomics(self, other):
            return self.atomics

        def enable_peer_access(self, other):
            self.enabled.append(other)

    home, nvlink, pcie = FakeDevice(True, True), FakeDevice(True, True), FakeDevice(True, False)
    assert _mgk_tiled.shared_queue_devices([home, nvlink]) and nvlink.enabled == [home]
    assert not _mgk_tiled.shared_queue_devices([home, nvlink, pcie])
    assert not _mgk_tiled.shared_queue_devices([home, FakeDevice(False, False)])
    assert not _mgk_tiled.shared_queue_devices([home])
    assert not _mgk_tiled.shared_queue_devices([home, home])  # one device listed twice
    with pytest.raises(TypeError, match="shared_queue must be True or False"):
        MarginalizedGraphKernel(*KERNELS["kronecker"], shared_queue="no")


# ---------------------------------------------------------------------------- the benchmark suite


def test_threshold_graphs_have_k_nonzeros_per_octile(rng):
    from graphkern.bench.suites.mgk_techniques import banded_octile_graph
    from graphkern.reorder import octile_count

    for k in (1, 5, 8, 29, 63, 64):
        G = banded_octile_graph(k, rng, n_tiles=4)
        stats = octile_count(G)
        assert stats["nonempty_tiles"] == 4 + 2 * 3
        assert stats["nnz_per_tile_min"] == stats["nnz_per_tile_max"] == k


def test_a_row_whose_largest_pair_alone_passes_the_budget_is_a_lower_bound(monkeypatch, rng):
    """run_variant probes the largest pair first; over the budget, the row is that probe (estimated,
    a lower bound) and the whole set never runs; under it, the set runs."""
    import argparse
    from types import SimpleNamespace

    import graphkern.mgk as mgk_module
    from graphkern.bench.suites import mgk_techniques

    calls = []

    class FakeKernel:
        def __init__(self, *args, **kwargs):
            self.info_ = None

        def __call__(self, graphs, pairs=None):
            n = len(graphs)
            pairs = np.stack(np.triu_indices(n), axis=1) if pairs is None else np.asarray(pairs)
            calls.append(len(pairs))
            seconds = sum(graphs[a].n_nodes * graphs[b].n_nodes for a, b in pairs) * 1e-3
            self.info_ = SimpleNamespace(solve_seconds=seconds, iterations=np.full(len(pairs), 5))
            return np.ones((n, n))

    monkeypatch.setattr(mgk_module, "MarginalizedGraphKernel", FakeKernel)
    graphs = [labeled_graph(rng, n, 0.1) for n in (10, 40, 20)]
    args = argparse.Namespace(dtype="float32", q=0.05)
    row, info = mgk_techniques.run_variant("+Compact", graphs, None, None, args, 1, 1.5, techniques="x",
                                           reorder=None, octiles=False)
    assert row["estimated"] and row["kernel_s"] == 1.6 and "lower bound" in row["estimated_from"]
    assert calls == [1, 1] and info is None  # the smallest pair (set-up), the largest alone; never the set
    calls.clear()
    row, info = mgk_techniques.run_variant("+Compact", graphs, None, None, args, 1, 10.0, techniques="x",
                                           reorder=None, octiles=False)
    assert not row["estimated"] and calls[:2] == [1, 1] and 6 in calls[2:]


def test_suite_runs_quick_without_gpu(capsys):
    from graphkern.bench import cli

    suites = cli.discover_suites()
    parser = cli.build_parser(suites)
    args = parser.parse_args(["mgk-techniques", "--sets", "molecules,protein", "--graphs", "12",
                              "--protein-graphs", "2"])
    ctx = cli.Context(quick=True, progress=cli.Progress(False), system={"gpus": []}, repeat=1)
    rows = suites["mgk-techniques"].run(args, ctx)
    counts = {r["set"]: r for r in rows if "pbr_tiles" in r}
    assert set(counts) == {"molecules", "protein"}
    assert counts["protein"]["pbr_tiles"] < counts["protein"]["rcm_tiles"]
    assert any(r.get("kind") == "target" and "core solver" in r["target"] and r["verdict"] == "n/a" for r in rows)
    delegated = suites["mgk"].run(parser.parse_args(["mgk", "--techniques", "--graphs", "6", "--sets", "molecules"]),
                                  ctx)
    assert [r["set"] for r in delegated if "pbr_tiles" in r] == ["molecules"]
    out = capsys.readouterr().out
    assert "non-empty octiles summed over each set" in out and "targets (set for H100-class GPUs" in out


def test_multi_gpu_only_runs_nothing_else_and_says_why_without_two_gpus(capsys):
    from graphkern.bench import cli

    suites = cli.discover_suites()
    parser = cli.build_parser(suites)
    args = parser.parse_args(["mgk-techniques", "--sets", "protein", "--protein-graphs", "2", "--multi-gpu-only"])
    ctx = cli.Context(quick=True, progress=cli.Progress(False), system={"gpus": []}, repeat=1)
    rows = suites["mgk-techniques"].run(args, ctx)
    assert [(r["kind"], r["verdict"], r["why"]) for r in rows] == [("target", "n/a", "0 GPU here")]  # nothing else
    out = capsys.readouterr().out
    assert "non-empty octiles" not in out and "two GPUs ≥ 1.8x one GPU" in out


def test_last_engine_is_the_engine_of_the_last_call(rng):
    X = [labeled_graph(rng, n, 0.3) for n in (5, 9)]
    nk, ek = KERNELS["kronecker"]
    kern = MarginalizedGraphKernel(nk, ek, q=0.1, backend="cpu")
    assert not hasattr(kern, "last_engine_")  # appears with the first call
    kern(X)
    first = kern.last_engine_
    assert first is not None and first.name == "cpu"
    kern(X, eval_gradient=True)
    assert kern.last_engine_ is not first  # each call builds its engine


@pytest.mark.multigpu
def test_two_gpus_default_solvers(rng):
    """The default solvers on two devices: the pairs of small graphs are split between the devices'
    own solver chains (CSR, GEMM), those of large graphs go to the shared-queue tiled solver; K, the
    nodal matrices and the gradients equal one device's."""
    from graphkern.mgk.router import DeviceRouter

    X = [labeled_graph(rng, int(n), 0.15) for n in rng.integers(5, 40, 30)]
    X += [labeled_graph(rng, n, 0.03) for n in (300, 360)]
    nk, ek = KERNELS["sqexp"]
    kw = dict(q=0.05, tol=1e-13, dtype=np.float64, backend="gpu")
    one = MarginalizedGraphKernel(nk, ek, device=0, **kw)
    kern = MarginalizedGraphKernel(nk, ek, device=[0, 1], **kw)
    assert rel_err(kern(X), one(X)) < 1e-11
    router = kern.last_engine_
    assert isinstance(router, DeviceRouter)
    assert sum(router.last_run.values()) == len(X) * (len(X) + 1) // 2 and router.last_run.get("tiled", 0) >= 3
    assert sorted(r[0] for r in router.device_runs) == [0, 1] and all(r[1] > 0 for r in router.device_runs)
    Y = X[:4] + X[-1:]
    np.testing.assert_allclose(kern(X[:8], Y, nodal=True), one(X[:8], Y, nodal=True), rtol=1e-10)
    K2, dK2 = kern(X[:10], eval_gradient=True)
    K1, dK1 = one(X[:10], eval_gradient=True)
    np.testing.assert_allclose(K2, K1, rtol=1e-10)
    np.testing.assert_allclose(dK2, dK1, rtol=1e-8, atol=1e-12)
