"""The graph model: constructors agree with SciPy/networkx, validation names the problem."""

import pickle

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from graphkern import Graph, pack_graphs
from graphkern.graph import as_csr_matrix


def random_edges(rng, n, m):
    e = rng.integers(0, n, size=(m, 2))
    e = e[e[:, 0] != e[:, 1]]
    e = np.unique(np.sort(e, axis=1), axis=0)
    return e


def test_from_edges_matches_scipy(rng):
    n = 60
    e = random_edges(rng, n, 300)
    w = rng.uniform(0.1, 2.0, len(e))
    G = Graph.from_edges(e, n, weights=w)
    ref = sp.coo_matrix((np.r_[w, w], (np.r_[e[:, 0], e[:, 1]], np.r_[e[:, 1], e[:, 0]])), shape=(n, n)).tocsr()
    ref.sort_indices()
    assert G.n_nodes == n and G.n_edges == len(e) and G.nnz == 2 * len(e)
    np.testing.assert_array_equal(G.indptr, ref.indptr)
    np.testing.assert_array_equal(G.indices, ref.indices)
    np.testing.assert_allclose(G.weights, ref.data)
    assert G.indices.dtype == np.int32


def test_edge_labels_follow_their_edge(rng):
    n = 30
    e = random_edges(rng, n, 80)
    lab = rng.integers(0, 5, len(e))
    vec = rng.normal(size=(len(e), 3))
    G = Graph.from_edges(e, n, edge_labels={"order": lab, "v": vec})
    A = G.to_scipy()
    rows = np.repeat(np.arange(n), np.diff(G.indptr))
    lookup = {(min(a, b), max(a, b)): k for k, (a, b) in enumerate(e)}
    for k, (r, c) in enumerate(zip(rows, G.indices)):
        src = lookup[(min(r, c), max(r, c))]
        assert G.edge_labels["order"][k] == lab[src]
        np.testing.assert_array_equal(G.edge_labels["v"][k], vec[src])
    assert A.nnz == G.nnz


def test_self_loops_stored_once():
    G = Graph.from_edges([(0, 0), (0, 1), (2, 2)], 3)
    assert G.nnz == 4 and G.n_edges == 3 and G.n_self_loops == 2
    np.testing.assert_array_equal(G.to_scipy().toarray(), [[1, 1, 0], [1, 0, 0], [0, 0, 1]])


def test_from_scipy_sums_duplicates_and_detects_unweighted(rng):
    A = sp.coo_matrix((np.ones(4), ([0, 1, 0, 1], [1, 0, 1, 0])), shape=(3, 3))
    G = Graph.from_scipy(A)
    assert G.is_weighted  # duplicates summed to 2
    np.testing.assert_allclose(G.weights, [2.0, 2.0])
    B = sp.csr_matrix(np.array([[0, 1], [1, 0]]))
    assert not Graph.from_scipy(B).is_weighted


def test_from_networkx_roundtrip(rng):
    g = nx.gnm_random_graph(40, 90, seed=int(rng.integers(1 << 30)))
    for v in g.nodes:
        g.nodes[v]["element"] = ["C", "N", "O"][v % 3]
        g.nodes[v]["charge"] = float(v % 2)
    for u, v in g.edges:
        g.edges[u, v]["order"] = (u + v) % 3
        g.edges[u, v]["weight"] = 0.5 + (u * v) % 4
    G = Graph.from_networkx(g)
    assert G.n_nodes == 40 and G.n_edges == 90 and G.is_weighted
    assert G.node_labels["element"].dtype == np.int64
    assert G.node_labels["element"][0] == 6  # element symbols become atomic numbers, as in SD files
    np.testing.assert_allclose(G.to_scipy().toarray(), nx.to_numpy_array(g, weight="weight"))
    back = Graph.from_networkx(G.to_networkx())
    np.testing.assert_array_equal(back.edge_labels["order"], G.edge_labels["order"])


def test_permute_is_an_isomorphism(rng):
    n = 25
    G = Graph.from_edges(random_edges(rng, n, 60), n, node_labels={"x": rng.normal(size=n)})
    perm = rng.permutation(n)
    H = G.permute(perm)
    P = sp.csr_matrix((np.ones(n), (np.arange(n), perm)), shape=(n, n))
    np.testing.assert_array_equal(H.to_scipy().toarray(), (P @ G.to_scipy() @ P.T).toarray())
    np.testing.assert_array_equal(H.node_labels["x"], G.node_labels["x"][perm])


def test_pickle_roundtrip(rng):
    G = Graph.from_edges(random_edges(rng, 10, 20), 10, node_labels={"a": np.arange(10)})
    # __slots__ classes pickle through copyreg; graphs must travel to worker processes
    assert pickle.loads(pickle.dumps(G)) == G


def test_pack_graphs_offsets(rng):
    gs = [Graph.from_edges(random_edges(rng, n, 3 * n), n, node_labels={"t": rng.integers(0, 3, n)})
          for n in (5, 1, 12)]
    p = pack_graphs(gs, node_label_columns=["t"])
    assert p.n_graphs == 3
    np.testing.assert_array_equal(p.node_offsets, [0, 5, 6, 18])
    for k, g in enumerate(gs):
        np.testing.assert_array_equal(p.indptr[p.node_offsets[k] + k:p.node_offsets[k + 1] + k + 1], g.indptr)
        s, e = p.entry_offsets[k], p.entry_offsets[k + 1]
        np.testing.assert_array_equal(p.indices[s:e], g.indices)
        np.testing.assert_array_equal(p.node_labels["t"][p.node_offsets[k]:p.node_offsets[k + 1]], g.node_labels["t"])


def test_symmetrize_adds_missing_direction():
    A = sp.csr_matrix(([1.0, 2.0], ([0, 1], [1, 2])), shape=(3, 3))
    G = Graph.from_scipy(A, symmetrize=True)
    np.testing.assert_array_equal(G.to_scipy().toarray(), [[0, 1, 0], [1, 0, 2], [0, 2, 0]])


@pytest.mark.parametrize("make, message", [
    (lambda: Graph.from_scipy(sp.csr_matrix(([1.0], ([0], [1])), shape=(2, 2))), "not symmetric"),
    (lambda: Graph.from_scipy(sp.csr_matrix(([1.0, 2.0], ([0, 1], [1, 0])), shape=(2, 2))), "differs from its mirror"),
    (lambda: Graph.from_edges([(0, 1)], weights=[-1.0]), "negative edge weight"),
    (lambda: Graph.from_edges([(0, 1)], weights=[np.inf]), "not finite"),
    (lambda: Graph.from_edges([(0, 1)], weights=[np.nan]), "not finite"),
    (lambda: Graph.from_edges([(0, 3)], 2), "out of range"),
    (lambda: Graph.from_edges([(0, 1), (1, 0)]), "more than once"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"x": [1.0, np.nan]}), "NaN"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"x": [1.0]}), "has 1 rows but the graph has 2 nodes"),
    (lambda: Graph.from_edges([(0, 1)], edge_labels={"x": [1, 2]}), "2 rows but 1 edges"),
    (lambda: Graph([0, 1], [5]), "out of range"),
    (lambda: Graph.from_scipy(sp.csr_matrix((2, 3))), "square"),
    (lambda: Graph.from_networkx(nx.DiGraph([(0, 1)])), "directed"),
])
def test_bad_input_messages(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_missing_label_column_is_named():
    G = Graph.from_edges([(0, 1)], node_labels={"element": [1, 2]}, name="water")
    with pytest.raises(KeyError, match="'water' has no node label 'charge'.*'element'"):
        G.require_node_label("charge")


def test_as_csr_matrix_checks(rng):
    A = sp.random(20, 20, density=0.2, random_state=int(rng.integers(1 << 30)), format="csr")
    with pytest.raises(ValueError, match="A is not symmetric"):
        as_csr_matrix(A, name="A")
    S = A + A.T
    M, weighted = as_csr_matrix(S)
    assert weighted and M.has_sorted_indices
    S = S.tolil()
    S[0, 1] = S[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        as_csr_matrix(S.tocsr())
    with pytest.raises(TypeError, match="scipy.sparse"):
        as_csr_matrix(np.eye(3))


def test_edgeless_graph_with_weights_and_edge_labels():
    G = Graph.from_edges(np.zeros((0, 2), dtype=int), 3, weights=[], edge_labels={"order": []},
                         node_labels={"x": [1, 2, 3]})
    assert G.nnz == 0 and G.n_edges == 0 and G.is_weighted


def test_as_graphs_names_the_bad_item():
    from graphkern.convert import as_graphs
    G = Graph.from_edges([(0, 1)])
    assert as_graphs((G, G)) == [G, G]
    with pytest.raises(TypeError, match=r"wrap it in a list: \[X\]"):
        as_graphs(G)
    with pytest.raises(TypeError, match=r"Y\[1\] is a int"):
        as_graphs([G, 3], "Y")
    with pytest.raises(TypeError, match="sequence of graphkern.Graph .*, got int"):
        as_graphs(5)


def test_as_csr_matrix_sees_an_unmirrored_explicit_zero():
    A = sp.csr_matrix((np.array([1.0, 1.0, 0.0]), np.array([1, 0, 2]), np.array([0, 1, 3, 3])), shape=(3, 3))
    assert A.nnz == 3  # (1, 2) stored as an explicit zero, (2, 1) absent
    with pytest.raises(ValueError, match="not symmetric"):
        as_csr_matrix(A)


@pytest.mark.parametrize("asked", [100_000, 10_000, 2**31, np.int64(2**40)])
def test_thread_counts_are_clamped_with_a_warning(monkeypatch, asked):
    from graphkern._backend import MAX_THREADS_PER_CORE, available_cores, resolve_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # None means all cores only without it
    limit = MAX_THREADS_PER_CORE * available_cores()
    with pytest.warns(RuntimeWarning, match=f"lowered to {limit}"):
        assert resolve_threads(asked) == limit
    assert resolve_threads(1) == 1 and resolve_threads(None) == available_cores()
    with pytest.raises(ValueError, match="n_threads must be >= 1"):
        resolve_threads(0)
    with pytest.raises(TypeError, match="n_threads must be a positive int"):
        resolve_threads(2.0)


def test_graph_arrays_are_read_only_and_its_own():
    indices = np.array([1, 0], dtype=np.int32)
    weights = np.array([2.0, 2.0])
    labels = np.array([5, 6])
    G = Graph([0, 1, 2], indices, weights, node_labels={"x": labels})
    indices[0], weights[0], labels[0] = 7, 9.0, 0  # the caller's arrays stay the caller's
    assert G.indices.tolist() == [1, 0] and G.weights.tolist() == [2.0, 2.0] and G.node_labels["x"][0] == 5
    for arr in (G.indptr, G.indices, G.weights, G.node_labels["x"], G.degrees):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1
    with pytest.raises(AttributeError):
        G.indices = np.array([0, 0])


def test_label_columns_set_later_are_validated_and_change_the_fingerprint():
    G = Graph.from_edges([(0, 1), (1, 2)], node_labels={"x": [1, 2, 3]})
    before = G.fingerprint
    with pytest.raises(ValueError, match="node label 'x' has 2 rows but the graph has 3 nodes"):
        G.node_labels["x"] = [1, 2]
    with pytest.raises(ValueError, match="edge label 'b' has 1 rows but the graph has 4 stored edge entries"):
        G.edge_labels["b"] = [1]
    assert G.fingerprint == before
    G.node_labels["x"] = [1, 2, 4]
    assert G.fingerprint != before
    G.node_labels["x"] = [1, 2, 3]
    assert G.fingerprint == before == Graph.from_edges([(1, 2), (0, 1)], node_labels={"x": [1, 2, 3]}).fingerprint


def test_fingerprint_of_a_large_graph_sees_every_entry(rng):
    A = sp.random(3000, 3000, density=0.05, random_state=int(rng.integers(1 << 30)), format="csr")
    G = Graph.from_scipy(A + A.T)
    assert G.weights.nbytes > (1 << 20)  # hashed in parallel blocks
    k = int(rng.integers(G.nnz))
    w = G.weights.copy()
    w[k] = np.nextafter(w[k], 2)
    H = Graph(G.indptr, G.indices, w, validate=False)
    assert H.fingerprint != G.fingerprint
    assert Graph(G.indptr, G.indices, G.weights).fingerprint == G.fingerprint


def test_fingerprint_tells_apart_every_dtype_shape_name_and_byte(rng):
    """The digest covers each array's element type, shape and bytes and each column's name: graphs
    that differ in any one of them differ, equal content in fresh arrays (or a strided copy) agrees."""
    from graphkern._arrays import content_fingerprint

    base = rng.integers(0, 5, 12)
    cases = {
        "int64": [("c", base)],
        "int32": [("c", base.astype(np.int32))],
        "float64": [("c", base.astype(np.float64))],
        "2-D": [("c", base.reshape(6, 2))],
        "other 2-D": [("c", base.reshape(4, 3))],
        "renamed": [("d", base)],
        "absent": [("c", None)],
        "empty": [("c", base[:0])],
        "split": [("c", base[:6]), ("e", base[6:])],
        "split elsewhere": [("c", base[:5]), ("e", base[5:])],
    }
    for k in range(12):
        edited = base.copy()
        edited[k] += 1
        cases[f"byte {k}"] = [("c", edited)]
    digests = {name: content_fingerprint("h", named) for name, named in cases.items()}
    assert len(set(digests.values())) == len(cases)
    assert content_fingerprint("h", [("c", base.copy())]) == digests["int64"]
    strided = np.repeat(base, 2)[::2]
    assert not strided.flags.c_contiguous and content_fingerprint("h", [("c", strided)]) == digests["int64"]
    assert content_fingerprint("other head", cases["int64"]) != digests["int64"]


def test_unvalidated_graph_is_checked_before_use():
    G = Graph([0, 1, 2], [1, 10**6], validate=False)
    with pytest.raises(ValueError, match="edge index 1000000 out of range for a graph of 2 nodes"):
        G.require_valid()
    with pytest.raises(ValueError, match="out of range"):
        as_csr_matrix(G)
    with pytest.raises(ValueError, match="out of range"):
        pack_graphs([G])
    with pytest.raises(ValueError, match="indptr must start at 0 and never decrease"):
        Graph([0, 2, 1, 2], [1, 0], validate=False).require_valid()


@pytest.mark.parametrize("fault", ["none", "index", "negative", "indptr", "first"])
def test_graph_lists_are_checked_together_as_one_by_one(rng, fault):
    """The vectorised check of a graph list accepts and rejects what each graph's own check does,
    with its message, and marks the graphs it passed."""
    from graphkern.graph import require_valid_all

    def random_graph():
        n = int(rng.integers(0, 9))
        A = sp.random(n, n, density=0.4, random_state=int(rng.integers(1 << 30)), format="csr")
        A = (A + A.T).tocsr()
        return A.indptr.copy(), A.indices.copy(), n

    parts = [random_graph() for _ in range(40)]
    k = int(rng.integers(len(parts)))
    ptr, idx, n = parts[k]
    if fault == "index" or (fault == "negative" and n == 0):
        ptr, idx = np.array([0] * n + [1]), np.array([n + int(rng.integers(0, 5))])
    elif fault == "negative":
        ptr, idx = np.array([0] * n + [1]), np.array([-1])
    elif fault == "indptr":
        ptr, idx = np.array([0, 2, 1, 2]), np.array([1, 0])
    elif fault == "first":
        ptr, idx = np.array([1, 1, 1]), np.array([0])
    parts[k] = (ptr, idx, len(ptr) - 1)
    graphs = [Graph(p, i, validate=False) for p, i, _ in parts]
    if fault == "none":
        require_valid_all(graphs)
        assert all(g._cache.get("indices_valid") for g in graphs)
        return
    one = Graph(ptr, idx, validate=False)
    with pytest.raises(ValueError) as own:
        one.require_valid()
    with pytest.raises(ValueError) as together:
        require_valid_all(graphs)
    assert str(together.value) == str(own.value)


def test_pickle_keeps_content_and_validity():
    G = Graph.from_edges([(0, 1), (1, 2)], weights=[1.0, 2.0], node_labels={"e": ["C", "N", "O"]},
                         edge_labels={"b": [1, 2]}, name="m")
    H = pickle.loads(pickle.dumps(G))
    assert H == G and H.name == "m" and H.fingerprint == G.fingerprint and not H.indices.flags.writeable


def test_bsr_padding_is_no_edge():
    path = sp.diags([np.ones(3), np.ones(3)], [-1, 1], shape=(4, 4), format="csr")
    B = sp.bsr_matrix(path, blocksize=(2, 2))
    assert B.nnz > path.nnz  # the blocks store zeros
    M, _ = as_csr_matrix(B)
    assert M.nnz == 6 and Graph.from_scipy(B).n_edges == 3


@pytest.mark.parametrize("make, message", [
    (lambda: Graph.from_edges([(0.9, 1.9)], 3), "edges .* must hold integers, got 0.9"),
    (lambda: Graph.from_edges([(0, 1)], 3.9), "n_nodes must be an int"),
    (lambda: Graph.from_edges(None), "edges .* is None"),
    (lambda: Graph.from_edges([(0, 1)], weights=["1", "2"][:1]), "weights must hold numbers"),
    (lambda: Graph.from_edges([(0, 1)], weights=[1 + 2j]), "weights is complex"),
    (lambda: Graph.from_networkx(None), "G must be a networkx graph, got NoneType"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"v": [[1.0, 2.0], [3.0]]}), "node label 'v' is ragged"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"u": np.array([2**64 - 1, 0], dtype=np.uint64)}),
     "beyond the int64 range"),
    (lambda: Graph.from_edges([(0, 1)], node_labels={"element": ["C", "Qq"]}), "'Qq' at node 1 is not an element"),
    (lambda: Graph.from_scipy(sp.csr_matrix(np.array([[0, 1j], [1j, 0]]))), "complex"),
    (lambda: as_csr_matrix(sp.coo_matrix(([1.0, 1.0], ([0, 1], [1, 0])), shape=(2**31 + 5, 2**31 + 5))),
     "at most 2\\*\\*31 - 1"),
])
def test_silent_coercions_are_errors(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_networkx_weight_missing_on_one_edge_is_named():
    g = nx.path_graph(4)
    g.edges[0, 1]["weight"] = 2.0
    g.edges[2, 3]["weight"] = 1.0
    with pytest.raises(ValueError, match=r"edge \(1, 2\) has no 'weight' attribute"):
        Graph.from_networkx(g)
    assert not Graph.from_networkx(g, weight=None).is_weighted


def test_capability_packages_are_public_and_imported_on_first_use():
    from conftest import run_python
    code = ("import sys, graphkern; print('graphkern.distributed' in sys.modules, 'distributed' in dir(graphkern)); "
            "from graphkern.distributed import gram; print(graphkern.distributed.gram is gram)")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_combination_share_of_the_sanitizer_runs():
    """``--combination-share``: one in N of a looped grid, every item once over the N offsets."""
    from conftest import one_in

    items = list(range(23))
    assert one_in(items, 1, 5) == items
    picked = [one_in(items, 4, k) for k in range(4)]
    assert sorted(x for part in picked for x in part) == items and all(len(p) in (5, 6) for p in picked)
    assert one_in([7], 4, 3) == [7] and one_in([], 4, 1) == []


def test_frozen_keeps_only_what_no_caller_can_write():
    """graphkern._arrays.frozen: a read-only view of a read-only owner (a graph cut from one shipped
    buffer) comes back as it is; a read-only view of an owner its caller can still write, a writeable
    array, or one in another dtype come back as read-only copies that the caller's writes do not reach."""
    from graphkern._arrays import frozen

    owner = np.arange(10, dtype=np.int64)
    owner.flags.writeable = False
    view = owner[2:6]
    assert frozen(view, np.int64) is view and frozen(view, None) is view
    writable_owner = np.arange(10, dtype=np.int64)
    for src in (writable_owner[2:6].view(), writable_owner, owner[2:6].astype(np.int32)):
        if src.base is writable_owner:
            src.flags.writeable = False
        out = frozen(src, np.int64)
        assert not out.flags.writeable and not np.shares_memory(out, writable_owner)
        assert np.array_equal(out, np.asarray(src, dtype=np.int64))
    writable_owner[3] = -1  # the caller's write reaches no frozen array
    assert frozen(owner[2:6], np.int64)[1] == 3


def test_content_digest_reads_what_packing_reads():
    """The digest changes with structure, weights, the named columns and how the arrays split into
    graphs, and not with a column packing does not read."""
    from graphkern.graph import content_digest

    def path(n, label):
        edges = [(i, i + 1) for i in range(n - 1)]
        return Graph.from_edges(edges, n, node_labels={"a": np.full(n, label), "b": np.arange(n)},
                                edge_labels={"o": np.ones(n - 1, dtype=np.int64)})

    graphs = [path(3, 1), path(4, 2)]
    key = content_digest(graphs, ["a"], ["o"])
    assert content_digest([path(3, 1), path(4, 2)], ["a"], ["o"]) == key  # equal copies
    other = [path(3, 1), path(4, 2)]
    other[1].node_labels["b"] = np.zeros(4, dtype=np.int64)  # a column not read
    assert content_digest(other, ["a"], ["o"]) == key
    other[1].node_labels["a"] = np.full(4, 3)
    assert content_digest(other, ["a"], ["o"]) != key
    assert content_digest(graphs, ["a", "b"], ["o"]) != key
    assert content_digest(graphs[::-1], ["a"], ["o"]) != key
    assert content_digest([path(4, 1), path(3, 2)], ["a"], ["o"]) != key
    weighted = [Graph.from_edges([(0, 1), (1, 2)], 3, weights=[1.0, 2.0], node_labels={"a": np.ones(3)},
                                 edge_labels={"o": np.ones(2, dtype=np.int64)}), graphs[1]]
    assert content_digest(weighted, ["a"], ["o"]) != key
    with pytest.raises(TypeError, match="item 1"):
        content_digest([graphs[0], "C"], ["a"], ["o"])


def test_content_tokens_change_with_every_label_edit():
    """A graph's token stays while its content does and goes with any change of a label column."""
    from graphkern.graph import content_tokens

    g = Graph.from_edges([(0, 1), (1, 2)], 3, node_labels={"a": [1, 2, 3]}, edge_labels={"o": [1, 1]})
    (first,) = content_tokens([g])
    assert content_tokens([g]) == (first,) and content_tokens([g, g]) == (first, first)
    edits = [lambda: g.node_labels.__setitem__("b", [0, 0, 0]), lambda: g.node_labels.pop("b"),
             lambda: g.edge_labels.update({"w": [2, 3, 3, 2]}), lambda: g.edge_labels.__delitem__("w"),
             lambda: g.node_labels.setdefault("c", [4, 5, 6]), lambda: g.node_labels.popitem(),
             lambda: g.edge_labels.clear()]
    seen = [first]  # kept alive, so that no later token can take an earlier one's place
    for edit in edits:
        edit()
        (after,) = content_tokens([g])
        assert all(after is not token for token in seen)
        seen.append(after)
    other = Graph.from_edges([(0, 1), (1, 2)], 3)
    assert content_tokens([other]) != content_tokens([g])  # another graph, another token
    with pytest.raises(TypeError, match="item 0"):
        content_tokens(["C"])


def multigraph(G):
    """The igraph graph ``G`` with its first edge doubled."""
    H = G.copy()
    H.add_edge(*G.get_edgelist()[0])
    return H


def as_igraph(g):
    """The networkx graph ``g`` as an igraph graph, vertices in ``g.nodes`` order (the node names in
    igraph's ``name``), attributes kept."""
    ig = pytest.importorskip("igraph")
    return ig.Graph.from_networkx(g, vertex_attr_hashable="name")


@pytest.mark.parametrize("library", ["networkx", "igraph"])
@pytest.mark.parametrize("weighted", [False, True])
def test_matrix_functions_take_networkx_and_igraph_graphs(rng, weighted, library):
    """jaccard, sorensen, expm_multiply, total_communicability and reorder read a networkx (igraph)
    graph as the SciPy matrix of its vertices in the library's order (weights from ``weight``); a
    directed graph, a multigraph and partly weighted edges are refused naming the input."""
    import graphkern as gk
    from graphkern.reorder import reorder

    n = 40
    e = random_edges(rng, n, 120)
    labels = [f"v{k}" for k in rng.permutation(n)]  # node names, in an order unlike their numbers
    g = nx.Graph()
    g.add_nodes_from(labels)
    g.add_edges_from((labels[a], labels[b], {"weight": float(rng.uniform(0.5, 2.0))} if weighted else {})
                     for a, b in e)
    A = nx.to_scipy_sparse_array(g, nodelist=list(g.nodes), format="csr")
    convert = (lambda h: h) if library == "networkx" else as_igraph
    G = convert(g)
    got, want = as_csr_matrix(G), as_csr_matrix(A)
    assert got[1] == weighted and (got[0] != want[0]).nnz == 0
    for fn in (gk.jaccard, gk.sorensen):
        assert (fn(G, weighted=weighted) != fn(A, weighted=weighted)).nnz == 0
    np.testing.assert_array_equal(gk.expm_multiply(G, beta=0.2)[0], gk.expm_multiply(A, beta=0.2)[0])
    np.testing.assert_array_equal(gk.total_communicability(G, beta=0.2)[0], gk.total_communicability(A, beta=0.2)[0])
    np.testing.assert_array_equal(reorder(G, "rcm"), reorder(A, "rcm"))
    with pytest.raises(ValueError, match=f"G: {library} graph is directed"):
        gk.jaccard(convert(nx.DiGraph(g)))
    with pytest.raises(ValueError, match=f"A: {library} multigraphs"):
        gk.expm_multiply(convert(nx.MultiGraph(g)) if library == "networkx" else multigraph(G))
    partly = nx.Graph(g)
    u, v = next(iter(partly.edges))
    partly.edges[u, v]["weight"] = 3.0
    partly.add_edge("x", "y")
    with pytest.raises(ValueError, match=f"no 'weight' attribute.*Graph.from_{library}"):
        gk.jaccard(convert(partly))
    with pytest.raises(TypeError, match="a scipy.sparse matrix or a networkx or igraph graph, got ndarray"):
        gk.jaccard(A.toarray())


def test_from_igraph_equals_from_networkx(rng):
    """An igraph graph gives the Graph of the same networkx graph: vertex order, weights, label
    columns (element symbols as atomic numbers), the vertex name left out; graph kernels take it
    in their lists."""
    import graphkern as gk
    from graphkern.spgk import DiracNode
    from graphkern.basekernels import KroneckerDelta, TensorProduct

    graphs = []
    for k in range(6):
        g = nx.relabel_nodes(nx.gnm_random_graph(12, 15 + k, seed=int(rng.integers(1 << 30))), lambda v: f"a{v}")
        for v in g.nodes:
            g.nodes[v]["element"] = ["C", "N", "O"][int(rng.integers(3))]
        for u, v in g.edges:
            g.edges[u, v]["order"] = int(rng.integers(1, 3))
            g.edges[u, v]["weight"] = float(rng.uniform(0.5, 2.0))
        graphs.append(g)
    single = nx.Graph()
    single.add_node("Cl", element="Cl")  # one atom, no bond to carry a bond order
    graphs.append(single)
    for g in graphs:
        assert Graph.from_igraph(as_igraph(g)) == Graph.from_networkx(g)
    chosen = Graph.from_igraph(as_igraph(graphs[0]), weight=None, node_attrs=["element"], edge_attrs=[])
    assert not chosen.is_weighted and list(chosen.node_labels) == ["element"] and not chosen.edge_labels
    with pytest.raises(ValueError, match="node attribute 'charge' is missing"):
        Graph.from_igraph(as_igraph(graphs[0]), node_attrs=["charge"])
    mgk = gk.MarginalizedGraphKernel(TensorProduct(element=KroneckerDelta(0.5)),
                                     TensorProduct(order=KroneckerDelta(0.5)), q=0.05, backend="cpu", dtype=np.float64)
    np.testing.assert_array_equal(mgk([as_igraph(g) for g in graphs]), mgk(graphs))
    spk = gk.ShortestPathKernel(node_kernel=DiracNode("element"), backend="cpu")
    np.testing.assert_array_equal(spk([as_igraph(g) for g in graphs]), spk(graphs))
    with pytest.raises(TypeError, match="single Graph"):
        spk(as_igraph(graphs[0]))


def test_label_arrays_fill_in_columns_of_graphs_without_items():
    """label_arrays gives a graph without vertices (edges) that lacks a column an empty one typed and
    shaped like the others'; a graph with vertices (edges) that lacks it raises, naming it."""
    from graphkern.graph import label_arrays

    path = Graph.from_edges([(0, 1), (1, 2)], 3, node_labels={"x": np.ones((3, 2), np.float32)},
                            edge_labels={"order": np.array([1, 2], np.int8)})
    atom = Graph.from_edges(np.zeros((0, 2), np.int64), 1, node_labels={"x": np.zeros((1, 2), np.float32)})
    empty = Graph.from_edges(np.zeros((0, 2), np.int64), 0)
    got = label_arrays([atom, path, empty], "edge", "order")
    order, x = path.edge_labels["order"], path.node_labels["x"]
    assert [a.dtype for a in got] == [order.dtype] * 3 and [len(a) for a in got] == [0, 4, 0] and got[1] is order
    got = label_arrays([empty, path], "node", "x")
    assert got[0].shape == (0, 2) and got[0].dtype == x.dtype and got[1] is x
    assert label_arrays([atom, empty], "edge", "order")[0].shape == (0,)
    with pytest.raises(KeyError, match=r"graph <3 nodes> has no node label 'y'"):
        label_arrays([empty, path], "node", "y")
    with pytest.raises(KeyError, match=r"graph <1 nodes> has no node label 'x'"):
        label_arrays([Graph.from_edges(np.zeros((0, 2), np.int64), 1)], "node", "x")
