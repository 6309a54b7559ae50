"""Graph lists as workers receive them: a few flat arrays instead of one pickle per Graph.

Pickling 4,000 molecules one Graph at a time (every array with its own header, every Graph
rebuilt through its constructor) takes a few hundred milliseconds each way, paid before a
worker's first tile on every ``gram`` call.  :func:`pack` lays the graphs end to end (row
pointers, columns, weights and each label column concatenated, with offsets) and :func:`unpack`
rebuilds them as read-only views into those arrays with ``Graph._trusted``: no copy and no check,
each graph keeping what had been checked of it (a graph built with ``validate=False`` arrives as
unchecked as it left).  Lists it cannot lay flat (a label column whose dtype or width differs
between graphs) travel as plain pickles.  ``graphkern.graph.pack_graphs`` packs for the kernels
(named label columns every graph must hold, weights made explicit); this keeps each graph as it
was: its own label columns, unweighted or weighted, its name and what was checked of it.
"""

from __future__ import annotations

import pickle

import numpy as np

from graphkern.graph import Graph


_CHECKS = ("valid", "indices_valid")  # Graph._cache entries that say what was checked


def pack(graphs):
    """``graphs`` (a list of Graphs) as one byte string for :func:`unpack`."""
    graphs = list(graphs)
    flat = _flat(graphs) if graphs and all(isinstance(g, Graph) for g in graphs) else None
    return pickle.dumps(("flat", flat) if flat is not None else ("graphs", graphs), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob):
    """The list of Graphs :func:`pack` wrote."""
    kind, content = pickle.loads(blob)
    return content if kind == "graphs" else _rebuild(content)


def _columns(dicts):
    """``{key: (concatenated column, has)}`` of the label dicts (one per graph), ``has`` the graphs
    holding the key; None when one key's dtype or width differs between graphs."""
    out = {}
    for key in dict.fromkeys(k for d in dicts for k in d):
        cols = [d[key] for d in dicts if key in d]
        if len({(c.dtype.str, c.shape[1:]) for c in cols}) != 1:
            return None
        has = np.fromiter((key in d for d in dicts), bool, len(dicts))
        out[key] = (np.concatenate(cols), has)
    return out


def _flat(graphs):
    n = np.fromiter((g.n_nodes for g in graphs), np.int64, len(graphs))
    nnz = np.fromiter((g.nnz for g in graphs), np.int64, len(graphs))
    node = _columns([g._node_labels for g in graphs])
    edge = _columns([g._edge_labels for g in graphs])
    if node is None or edge is None:
        return None
    weighted = np.fromiter((g._weights is not None for g in graphs), bool, len(graphs))
    return {
        "n": n, "nnz": nnz,
        "indptr": np.concatenate([g._indptr.astype(np.int64, copy=False) for g in graphs]),
        "indices": np.concatenate([g._indices for g in graphs]),
        "weighted": weighted,
        "weights": np.concatenate([g._weights for g in graphs if g._weights is not None] or [np.zeros(0)]),
        "node": node, "edge": edge,
        "names": [g.name for g in graphs],
        # what was checked of each graph travels with it (a graph built with validate=False stays unchecked)
        "checked": [{k: g._cache[k] for k in _CHECKS if k in g._cache} for g in graphs],
    }


def _readonly(a):
    """``a`` owning its memory (not a view of the pickle's buffer) and read-only: the Graphs' slices
    of it are then kept as they are (graphkern._arrays.frozen copies views of anything else)."""
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _rebuild(f):
    n, nnz, weighted = f["n"], f["nnz"], f["weighted"]
    G = len(n)
    row0 = np.concatenate([[0], np.cumsum(n + 1)])
    e0 = np.concatenate([[0], np.cumsum(nnz)])
    w0 = np.concatenate([[0], np.cumsum(np.where(weighted, nnz, 0))])
    indptr, indices, weights = _readonly(f["indptr"]), _readonly(f["indices"]), _readonly(f["weights"])

    def starts(columns, length):  # per key: where each graph's rows begin (graphs without the key hold none)
        return {key: (_readonly(col), has, np.concatenate([[0], np.cumsum(np.where(has, length, 0))]))
                for key, (col, has) in columns.items()}

    node, edge = starts(f["node"], n), starts(f["edge"], nnz)
    out = []
    for k in range(G):
        node_items = [(key, col[s[k]:s[k + 1]]) for key, (col, has, s) in node.items() if has[k]]
        edge_items = [(key, col[s[k]:s[k + 1]]) for key, (col, has, s) in edge.items() if has[k]]
        g = Graph._trusted(indptr[row0[k]:row0[k + 1]], indices[e0[k]:e0[k + 1]],
                           weights[w0[k]:w0[k + 1]] if weighted[k] else None, node_items, edge_items)
        g.name = f["names"][k]
        g._cache.clear()
        g._cache.update(f["checked"][k])
        out.append(g)
    return out
