"""Graph lists as workers receive them: a few flat arrays instead of one pickle per Graph.

Pickling 4,000 molecules one Graph at a time (every array with its own header, every Graph
rebuilt through its constructor) takes a few hundred milliseconds each way, paid before a
worker's first tile on every ``gram`` call.  :func:`pack` lays the graphs end to end (row
pointers, columns, weights and each label column concatenated, with offsets) and :func:`unpack`
rebuilds them as read-only views into those arrays with ``Graph._trusted``: no copy and no check,
each graph keeping what had been checked of it (a graph built with ``validate=False`` arrives as
unchecked as it left).  Lists it cannot lay flat (a label column whose dtype or width differs
between graphs) travel as plain pickles.  Unlike ``graphkern.graph.pack_graphs`` this keeps each
graph as it was: its own label columns, weights or none, name and checks.
"""

from __future__ import annotations

import pickle

import numpy as np

from graphkern.graph import Graph


_CHECKS = ("valid", "indices_valid")  # Graph._cache entries that say what was checked


def pack(graphs, labels=None):
    """``graphs`` (a list of Graphs) as one byte string for :func:`unpack`; ``labels``: ``(node
    columns, edge columns)``, the only label columns that travel (None: all of them)."""
    graphs = list(graphs)
    flat = _flat(graphs, labels) if graphs and all(isinstance(g, Graph) for g in graphs) else None
    return pickle.dumps(("flat", flat) if flat is not None else ("graphs", graphs), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob):
    """The list of Graphs :func:`pack` wrote."""
    kind, content = pickle.loads(blob)
    return content if kind == "graphs" else _rebuild(content)


def _columns(dicts, keep):
    """``{key: (concatenated column, has)}`` of the label dicts (one per graph) for the keys of
    ``keep`` (None: every key), ``has`` the graphs holding the key; None when one key's dtype or
    width differs between graphs."""
    out = {}
    for key in dict.fromkeys(k for d in dicts for k in d if keep is None or k in keep):
        cols = [d[key] for d in dicts if key in d]
        if len({(c.dtype.str, c.shape[1:]) for c in cols}) != 1:
            return None
        has = np.fromiter((key in d for d in dicts), bool, len(dicts))
        out[key] = (np.concatenate(cols), has)
    return out


def _flat(graphs, labels):
    node = _columns([g._node_labels for g in graphs], None if labels is None else labels[0])
    edge = _columns([g._edge_labels for g in graphs], None if labels is None else labels[1])
    if node is None or edge is None:
        return None
    return {
        "n": np.fromiter((g.n_nodes for g in graphs), np.int64, len(graphs)),
        "nnz": np.fromiter((g.nnz for g in graphs), np.int64, len(graphs)),
        "indptr": np.concatenate([g._indptr for g in graphs]),  # in the graphs' dtype: no conversion per graph
        "indices": np.concatenate([g._indices for g in graphs]),
        "weighted": np.fromiter((g._weights is not None for g in graphs), bool, len(graphs)),
        "weights": np.concatenate([g._weights for g in graphs if g._weights is not None] or [np.zeros(0)]),
        "node": node, "edge": edge,
        "names": [g.name for g in graphs],
        "checked": [_travelling(g, labels is None) for g in graphs],
    }


def _travelling(g, whole):
    """What was checked of ``g`` and, when it travels ``whole`` (every label column), its content
    digest, which the kernels' dataset caches key on: the arrays arrive bit for bit, so it holds for
    the copy, and the caller's graph keeps it for the next call."""
    checked = {k: g._cache[k] for k in _CHECKS if k in g._cache}
    return checked | {"fingerprint": g.fingerprint} if whole else checked


def _pieces(flat, lengths):
    """``flat`` cut into consecutive pieces of ``lengths``: views of one read-only copy that owns its
    memory (not the pickle's buffer), which the Graphs keep as they are (graphkern._arrays.frozen
    copies views of anything else)."""
    flat = np.array(flat, copy=True)
    flat.flags.writeable = False
    ends = np.cumsum(lengths).tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _rebuild(f):
    n, nnz, weighted = f["n"], f["nnz"], f["weighted"]
    indptr, indices = _pieces(f["indptr"], n + 1), _pieces(f["indices"], nnz)
    weights = [w if has else None
               for w, has in zip(_pieces(f["weights"], np.where(weighted, nnz, 0)), weighted.tolist())]
    # per label key: each graph's rows (graphs without the key hold none)
    node = [(key, _pieces(col, np.where(has, n, 0)), has.tolist()) for key, (col, has) in f["node"].items()]
    edge = [(key, _pieces(col, np.where(has, nnz, 0)), has.tolist()) for key, (col, has) in f["edge"].items()]
    out = []
    for k, (name, checked) in enumerate(zip(f["names"], f["checked"])):
        g = Graph._trusted(indptr[k], indices[k], weights[k], [(key, cols[k]) for key, cols, has in node if has[k]],
                           [(key, cols[k]) for key, cols, has in edge if has[k]])
        g.name = name
        g._cache.clear()
        g._cache.update(checked)
        out.append(g)
    return out
