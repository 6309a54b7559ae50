"""TU Dortmund graph-kernel benchmark folders (``DS_A.txt``, ``DS_graph_indicator.txt``, ...).

A dataset ``DS`` is a folder of comma-separated text files, one row a line, with
1-based node and graph numbers running over the whole dataset:

=========================  ====================================================  =========
file                       one row per                                           required
=========================  ====================================================  =========
``DS_A.txt``               stored adjacency entry ``node, node``                 yes
``DS_graph_indicator.txt`` node: its graph                                       yes
``DS_graph_labels.txt``    graph: class label (the targets)                      no
``DS_graph_attributes.txt`` graph: regression values (targets when no labels)    no
``DS_node_labels.txt``     node: integer label(s)             -> ``label``       no
``DS_node_attributes.txt`` node: float vector                 -> ``attributes``  no
``DS_edge_labels.txt``     line of ``DS_A.txt``: label(s)     -> ``label``       no
``DS_edge_attributes.txt`` line of ``DS_A.txt``: float vector -> ``attributes``  no
=========================  ====================================================  =========

A label file with several columns gives ``label_0``, ``label_1``, ...; attributes are
always float vectors of shape ``(n, d)``.  Edges listed in one direction only are
mirrored.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..graph import Graph, _indptr_of
from ._text import FileFormatError, data_line_number, read_numeric_table

__all__ = ["TUDataset", "read_tudataset", "write_tudataset"]


class TUDataset(NamedTuple):
    """The graphs of a dataset and their targets (None when the folder has none)."""

    graphs: list
    targets: np.ndarray | None


def _path(folder, name, part):
    return os.path.join(folder, f"{name}_{part}.txt")


def _rows(path, n_rows, counted_by, **table_options):
    """Read an optional per-row file; None if absent.  Its row count must be ``n_rows``.

    ``counted_by`` says where the count comes from ("X_graph_indicator.txt has 8 nodes").
    """
    if not os.path.exists(path):
        return None
    table = read_numeric_table(path, **table_options)
    if len(table) > n_rows:
        raise FileFormatError(path, data_line_number(path, n_rows), f"one row too many: {counted_by}")
    if len(table) < n_rows:
        raise FileFormatError(path, data_line_number(path, len(table) - 1) if len(table) else None,
                              f"the file ends after {len(table)} rows, but {counted_by}")
    return table


def _label_columns(table, stem):
    """Named label columns from a per-row table: ``label`` or ``label_0, label_1, ...``; attributes stay 2-D."""
    if table is None:
        return {}
    if stem == "attributes":
        return {stem: table.astype(np.float64)}
    if table.shape[1] == 1:
        return {stem: table[:, 0]}
    return {f"{stem}_{k}": table[:, k] for k in range(table.shape[1])}


def read_tudataset(folder, name=None):
    """Read a TU Dortmund dataset folder.

    Parameters
    ----------
    folder : path
        The folder holding ``{name}_A.txt`` and the other files.
    name : str, optional
        The dataset's file prefix; by default the folder's base name.

    Returns
    -------
    TUDataset
        ``(graphs, targets)``: a list of :class:`~graphkern.Graph` (named
        ``"{name}/{k}"``, k from 1) and the graph labels (int64 when all are integers,
        float64 otherwise), or the graph attributes when there are no labels, or None.

    Raises
    ------
    FileFormatError
        Naming the file and line: a non-numeric field, a node number out of range, an
        edge whose endpoints lie in different graphs, a repeated edge, files whose
        row counts disagree.
    """
    folder = os.fspath(folder)
    name = name or os.path.basename(os.path.normpath(folder))
    adjacency_path = _path(folder, name, "A")
    indicator_path = _path(folder, name, "graph_indicator")
    for required in (adjacency_path, indicator_path):
        if not os.path.exists(required):
            raise FileNotFoundError(f"TU dataset {name!r}: {required} is missing")

    graph_of = read_numeric_table(indicator_path, integer=True, n_columns=1)[:, 0]
    n_nodes = len(graph_of)
    if n_nodes and graph_of.min() < 1:
        row = int(np.flatnonzero(graph_of < 1)[0])
        raise FileFormatError(indicator_path, data_line_number(indicator_path, row),
                              f"graph number {graph_of[row]} (graphs are numbered from 1)")
    n_graphs = int(graph_of.max()) if n_nodes else 0
    if n_graphs > n_nodes:  # every graph has a node; more graphs than nodes is a damaged file
        row = int(np.argmax(graph_of))
        raise FileFormatError(indicator_path, data_line_number(indicator_path, row),
                              f"graph number {n_graphs}, but the file has only {n_nodes} nodes "
                              "(graphs are numbered 1, 2, ... and each has a node)")
    per_graph = f"{os.path.basename(indicator_path)} numbers graphs up to {n_graphs}"
    graph_labels = _rows(_path(folder, name, "graph_labels"), n_graphs, per_graph)
    graph_attributes = _rows(_path(folder, name, "graph_attributes"), n_graphs, per_graph, integer=False)

    entries = read_numeric_table(adjacency_path, integer=True, n_columns=2) - 1
    n_entries = len(entries)
    if n_entries:
        outside = (entries < 0) | (entries >= n_nodes)
        if outside.any():
            row = int(np.flatnonzero(outside.any(axis=1))[0])
            raise FileFormatError(adjacency_path, data_line_number(adjacency_path, row),
                                  f"node {int(entries[row][outside[row]][0]) + 1} does not exist: "
                                  f"{os.path.basename(indicator_path)} has {n_nodes} nodes")
        apart = graph_of[entries[:, 0]] != graph_of[entries[:, 1]]
        if apart.any():
            row = int(np.flatnonzero(apart)[0])
            u, v = entries[row]
            raise FileFormatError(adjacency_path, data_line_number(adjacency_path, row),
                                  f"edge ({u + 1}, {v + 1}) joins node {u + 1} of graph {graph_of[u]} "
                                  f"and node {v + 1} of graph {graph_of[v]}")

    def columns(what, n, counted_by):
        labels = _rows(_path(folder, name, f"{what}_labels"), n, counted_by)
        attributes = _rows(_path(folder, name, f"{what}_attributes"), n, counted_by, integer=False)
        return _label_columns(labels, "label") | _label_columns(attributes, "attributes")

    graphs = _split_graphs(graph_of, n_graphs, entries,
                           columns("node", n_nodes, f"{os.path.basename(indicator_path)} has {n_nodes} nodes"),
                           columns("edge", n_entries, f"{os.path.basename(adjacency_path)} has {n_entries} entries"),
                           adjacency_path, name)
    targets = graph_labels if graph_labels is not None else graph_attributes
    if targets is not None and targets.shape[1] == 1:
        targets = targets[:, 0]
    return TUDataset(graphs, targets)


def _split_graphs(graph_of, n_graphs, entries, node_columns, edge_columns, adjacency_path, name):
    """Cut the dataset-wide arrays into one Graph per graph number."""
    # rank: each node's position once nodes are grouped by graph, so a graph's nodes are contiguous
    node_order = np.argsort(graph_of, kind="stable")
    rank = np.empty(len(graph_of), dtype=np.int64)
    rank[node_order] = np.arange(len(graph_of))
    node_start = _indptr_of(graph_of - 1, n_graphs)

    rows, cols = rank[entries[:, 0]], rank[entries[:, 1]]
    key = rows * max(len(graph_of), 1) + cols
    entry_order = np.argsort(key, kind="stable")
    repeated = np.flatnonzero(key[entry_order][1:] == key[entry_order][:-1])
    if len(repeated):
        row = int(max(entry_order[repeated[0]], entry_order[repeated[0] + 1]))
        u, v = entries[row]
        raise FileFormatError(adjacency_path, data_line_number(adjacency_path, row),
                              f"edge ({u + 1}, {v + 1}) is listed twice")
    rows, cols = rows[entry_order], cols[entry_order]
    edge_columns = {k: v[entry_order] for k, v in edge_columns.items()}
    node_columns = {k: v[node_order] for k, v in node_columns.items()}
    entry_start = np.searchsorted(rows, node_start)

    graphs = []
    for g in range(n_graphs):
        first, last = node_start[g], node_start[g + 1]
        lo, hi = entry_start[g], entry_start[g + 1]
        graphs.append(Graph(_indptr_of(rows[lo:hi] - first, last - first), cols[lo:hi] - first, None,
                            node_labels={k: v[first:last] for k, v in node_columns.items()},
                            edge_labels={k: v[lo:hi] for k, v in edge_columns.items()},
                            symmetrize=True, name=f"{name}/{g + 1}"))
    return graphs


def write_tudataset(folder, name, graphs, targets=None):
    """Write graphs (and targets) as a TU Dortmund dataset folder that :func:`read_tudataset` reads back.

    Label columns must be named as the reader names them (``label``, ``label_0``, ...,
    ``attributes``) and be present on every graph; weights are not part of the format
    and are refused.
    """
    graphs = list(graphs)
    os.makedirs(folder, exist_ok=True)
    for k, g in enumerate(graphs):
        if g.weights is not None:
            raise ValueError(f"graph {k} is weighted; the TU Dortmund format has no edge weights "
                             "(store them as an edge attribute)")
    node_offsets = np.concatenate([[0], np.cumsum([g.n_nodes for g in graphs])]).astype(np.int64)
    entries = [np.stack([g._rows(), g.indices], axis=1) + node_offsets[k] + 1 for k, g in enumerate(graphs)]
    _write_rows(_path(folder, name, "A"), np.concatenate(entries) if graphs else np.zeros((0, 2), np.int64))
    _write_rows(_path(folder, name, "graph_indicator"),
                np.repeat(np.arange(1, len(graphs) + 1), [g.n_nodes for g in graphs]))
    if targets is not None:
        targets = np.asarray(targets)
        part = "graph_labels" if np.issubdtype(targets.dtype, np.integer) else "graph_attributes"
        _write_rows(_path(folder, name, part), targets)
    for what in ("node", "edge"):
        _write_label_files(folder, name, what, graphs)


def _write_label_files(folder, name, what, graphs):
    """Write the ``{what}_labels``/``{what}_attributes`` files from the columns of the first graph."""
    columns = sorted(getattr(graphs[0], f"{what}_labels")) if graphs else []
    labels = sorted((c for c in columns if c == "label" or (c.startswith("label_") and c[len("label_"):].isdigit())),
                    key=lambda c: -1 if c == "label" else int(c[len("label_"):]))
    unknown = set(columns) - set(labels) - {"attributes"}
    if unknown:
        raise ValueError(f"{what} label {sorted(unknown)[0]!r} has no place in the TU Dortmund format "
                         "(name it 'label', 'label_<k>' or 'attributes')")
    attributes = ["attributes"] if "attributes" in columns else []
    for part, names in ((f"{what}_labels", labels), (f"{what}_attributes", attributes)):
        if names:
            lookups = [getattr(g, f"require_{what}_label") for g in graphs]
            table = np.concatenate([np.column_stack([get(c) for c in names]) for get in lookups])
            _write_rows(_path(folder, name, part), table)


def _write_rows(path, table):
    table = table.reshape(len(table), -1)
    fmt = "%d" if np.issubdtype(table.dtype, np.integer) else "%.17g"
    np.savetxt(path, table, fmt=fmt, delimiter=", ")
