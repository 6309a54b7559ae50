"""Datasets packed once for the marginalized graph kernel's solvers, and the cache that keeps them.

A :class:`MGKDataset` holds one list of graphs in the layout both solvers read:

* CSR over all graphs (``rowptr`` global row pointers into the entries, ``indices`` local
  column indices, ``weights``), per-vertex ``degree`` (row sums of the weights, without q:
  q is a hyperparameter, added by the solvers);
* ``node_features`` ``(n_vertices, Fv)`` and ``edge_features`` ``(n_entries, Fe)`` built by
  the compiled kernels (:meth:`graphkern.basekernels.KernelProgram.features`);
* on demand, the graphs cut into octiles (:class:`Octiles`) and copies of everything on a
  device.

Packing depends on the graphs, the label columns the kernels read and how (the programs'
structure), and the float type, never on the hyperparameter values, so a dataset is built
once and reused by every call that changes only hyperparameters.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from graphkern.graph import content_digest, content_tokens, label_arrays, pack_graphs

__all__ = ["MGKDataset", "Octiles", "build_octiles", "renumbered", "DatasetCache", "OCTILE"]

#: octile edge length: the adjacency is cut into OCTILE x OCTILE tiles
OCTILE = 8


def _check_columns(graphs, columns, what):
    """Check that every graph has each column (:func:`graphkern.graph.label_arrays`), one row per
    item, with one trailing shape."""
    for col in columns:
        first = None
        for k, (g, arr) in enumerate(zip(graphs, label_arrays(graphs, what, col))):
            need = g.n_nodes if what == "node" else g.nnz
            if len(arr) != need:
                raise ValueError(f"graph {k}: {what} label {col!r} has {len(arr)} rows but the graph has {need} "
                                 f"{'vertices' if what == 'node' else 'stored entries'}")
            trailing = arr.shape[1:]
            if first is None:
                first = (k, trailing)
            elif trailing != first[1]:
                raise ValueError(f"{what} label {col!r} has shape (n,{','.join(map(str, trailing))}) in graph {k} "
                                 f"but (n,{','.join(map(str, first[1]))}) in graph {first[0]}")


class MGKDataset:
    """One list of graphs packed for the solvers (see the module docstring)."""

    def __init__(self, graphs, node_program, edge_program, tables, dtype):
        self.dtype = np.dtype(dtype)
        self.n_graphs = len(graphs)
        _check_columns(graphs, node_program.columns, "node")
        _check_columns(graphs, edge_program.columns, "edge")
        packed = pack_graphs(graphs, node_label_columns=node_program.columns,
                             edge_label_columns=edge_program.columns)
        self.node_offsets = packed.node_offsets.astype(np.int64)
        self.entry_offsets = packed.entry_offsets.astype(np.int64)
        self.n_nodes = np.diff(self.node_offsets)
        self.n_entries = np.diff(self.entry_offsets)
        # each graph's rows: the packed row pointers' differences but those across two graphs
        row_lengths = np.delete(np.diff(packed.indptr.astype(np.int64)),
                                self.node_offsets[1:-1] + np.arange(self.n_graphs - 1)) if graphs else \
            np.zeros(0, np.int64)
        self.rowptr = np.concatenate([[0], np.cumsum(row_lengths, dtype=np.int64)]).astype(np.int64)
        _check_structure(self, packed.indices, row_lengths)
        self.indices = _nonempty(packed.indices.astype(np.int32, copy=False))
        weights64 = packed.weights.astype(np.float64, copy=False)
        self.weights = _nonempty(weights64.astype(self.dtype))
        n_vertices = int(self.node_offsets[-1])
        row_of_entry = np.repeat(np.arange(n_vertices, dtype=np.int64), row_lengths)
        self.degree = _nonempty(np.bincount(row_of_entry, weights=weights64, minlength=n_vertices).astype(self.dtype))
        self.node_widths = node_program.widths(packed.node_labels)
        self.edge_widths = edge_program.widths(packed.edge_labels)
        self.node_features = _features(node_program, packed.node_labels, tables["node"], self.dtype, n_vertices,
                                       "node")
        self.edge_features = _features(edge_program, packed.edge_labels, tables["edge"], self.dtype,
                                       int(self.entry_offsets[-1]), "edge")
        self._octiles = None
        self.device_copies = {}

    @property
    def octiles(self):
        if self._octiles is None:
            self._octiles = build_octiles(self)
        return self._octiles


def _check_structure(ds, indices, row_lengths):
    """Row pointers and column indices the solvers can trust, checked where they are used (a Graph
    built with validate=False, or whose arrays were edited, may hold anything)."""
    ends = ds.rowptr[ds.node_offsets[1:]] - ds.rowptr[ds.node_offsets[:-1]]
    bad_rows = (row_lengths < 0) if len(row_lengths) else np.zeros(0, dtype=bool)
    if bad_rows.any() or np.any(ends != ds.n_entries):
        g = int(np.searchsorted(ds.node_offsets, np.flatnonzero(bad_rows)[0], side="right") - 1) if bad_rows.any() \
            else int(np.flatnonzero(ends != ds.n_entries)[0])
        raise ValueError(f"graph {g}: indptr is not a valid row-pointer array for its {int(ds.n_entries[g])} entries")
    n_of_entry = np.repeat(ds.n_nodes, ds.n_entries)
    bad = (indices < 0) | (indices >= n_of_entry)
    if bad.any():
        e = int(np.flatnonzero(bad)[0])
        g = int(np.searchsorted(ds.entry_offsets, e, side="right") - 1)
        raise ValueError(f"graph {g}: column index {int(indices[e])} at entry {e - int(ds.entry_offsets[g])} is out "
                         f"of range for its {int(ds.n_nodes[g])} vertices")


def _nonempty(arr):
    """Solvers take the address of element 0: give empty arrays one (unused) element."""
    if len(arr):
        return np.ascontiguousarray(arr)
    return np.zeros((1,) + arr.shape[1:], dtype=arr.dtype)


def _features(program, columns, tables, dtype, n_items, what):
    """The program's feature rows (one zero column where it reads no label), never empty."""
    feats = program.features(columns, tables, dtype, what=what)
    return _nonempty(np.zeros((n_items, 1), dtype=dtype) if feats is None else feats)


@dataclass
class Octiles:
    """Every graph's adjacency cut into 8x8 tiles; only non-empty tiles are stored.

    Tiles of one graph are consecutive, sorted by tile row then tile column.
    ``tile_rowptr[rowptr_offset[g] + R]`` is the global index of graph g's first tile in
    tile row R (``n_tile_rows[g] + 1`` entries per graph).  ``values[t, c, 8 r + s]`` is
    channel c of the element (8 R + r, 8 C + s) of tile t: channel 0 the edge weight,
    channel 1 + f edge feature f; elements without an edge hold 0 in every channel.
    ``bitmap[t]`` has bit ``8 r + s`` set where tile t stores an edge.
    """

    tile_row: np.ndarray      # int32 (n_tiles,)
    tile_col: np.ndarray      # int32 (n_tiles,)
    bitmap: np.ndarray        # uint64 (n_tiles,)
    values: np.ndarray        # dtype (n_tiles, channels, 64)
    tile_offsets: np.ndarray  # int64 (n_graphs + 1,)
    tile_rowptr: np.ndarray   # int32, sum over graphs of n_tile_rows + 1
    rowptr_offset: np.ndarray  # int64 (n_graphs,)

    @property
    def channels(self):
        return self.values.shape[1]

    def tiles_per_graph(self):
        return np.diff(self.tile_offsets)


def build_octiles(ds):
    """Cut every graph of ``ds`` into octiles (vectorized over the whole dataset)."""
    n_graphs = ds.n_graphs
    n_entries = int(ds.entry_offsets[-1])
    graph_of_entry = np.repeat(np.arange(n_graphs, dtype=np.int64), ds.n_entries)
    node_graph = np.repeat(np.arange(n_graphs, dtype=np.int64), ds.n_nodes)
    row_global = np.repeat(np.arange(int(ds.node_offsets[-1]), dtype=np.int64), np.diff(ds.rowptr))
    rows = row_global - ds.node_offsets[node_graph[row_global]]
    cols = ds.indices[:n_entries].astype(np.int64)
    tr, tc = rows // OCTILE, cols // OCTILE
    elem = (rows % OCTILE) * OCTILE + cols % OCTILE
    order = np.lexsort((tc, tr, graph_of_entry))
    g_s, tr_s, tc_s, el_s = graph_of_entry[order], tr[order], tc[order], elem[order]
    new_tile = np.ones(n_entries, dtype=bool)
    if n_entries:
        new_tile[1:] = (g_s[1:] != g_s[:-1]) | (tr_s[1:] != tr_s[:-1]) | (tc_s[1:] != tc_s[:-1])
    starts = np.flatnonzero(new_tile)
    tile_of_entry = np.cumsum(new_tile) - 1
    n_tiles = len(starts)
    if n_tiles >= np.iinfo(np.int32).max:
        raise ValueError(f"{n_tiles} octiles exceed the int32 tile index of the GPU solver")
    tile_graph = g_s[starts]
    channels = 1 + ds.edge_features.shape[1]
    values = np.zeros((n_tiles, channels, OCTILE * OCTILE), dtype=ds.dtype)
    values[tile_of_entry, 0, el_s] = ds.weights[:n_entries][order]
    if n_entries:
        feats = ds.edge_features[:n_entries][order]
        for f in range(channels - 1):
            values[tile_of_entry, 1 + f, el_s] = feats[:, f]
    bitmap = np.zeros(n_tiles, dtype=np.uint64)
    np.bitwise_or.at(bitmap, tile_of_entry, np.left_shift(np.uint64(1), el_s.astype(np.uint64)))
    tile_offsets = np.concatenate([[0], np.cumsum(np.bincount(tile_graph, minlength=n_graphs))]).astype(np.int64)
    n_tile_rows = (ds.n_nodes + OCTILE - 1) // OCTILE
    rowptr_offset = np.concatenate([[0], np.cumsum(n_tile_rows + 1)[:-1]]).astype(np.int64)
    tile_rowptr = np.empty(int(np.sum(n_tile_rows + 1)), dtype=np.int64)
    tile_rows = tr_s[starts]
    for g in range(n_graphs):
        t0, t1 = tile_offsets[g], tile_offsets[g + 1]
        nb = int(n_tile_rows[g])
        counts = np.bincount(tile_rows[t0:t1], minlength=nb)
        tile_rowptr[rowptr_offset[g]: rowptr_offset[g] + nb + 1] = t0 + np.concatenate([[0], np.cumsum(counts)])
    return Octiles(tile_row=tile_rows.astype(np.int32), tile_col=tc_s[starts].astype(np.int32), bitmap=bitmap,
                   values=values, tile_offsets=tile_offsets, tile_rowptr=_nonempty(tile_rowptr.astype(np.int32)),
                   rowptr_offset=rowptr_offset)


def renumbered(ds, perms):
    """``ds``'s CSR, degrees and vertex features with graph g's vertex ``perms[g][k]`` renumbered k.

    Returns a namespace with the fields :func:`build_octiles` reads, plus
    ``degree``, ``node_features`` and ``perm_global`` (new global vertex -> old global vertex).
    """
    n_vertices = int(ds.node_offsets[-1])
    n_entries = int(ds.entry_offsets[-1])
    graph_of_vertex = np.repeat(np.arange(ds.n_graphs, dtype=np.int64), ds.n_nodes)
    if perms is None:
        perm_global = np.arange(n_vertices, dtype=np.int64)
    else:
        perm_global = np.concatenate([np.asarray(p, dtype=np.int64) for p in perms]) + ds.node_offsets[graph_of_vertex]
    new_of_old = np.empty(n_vertices, dtype=np.int64)
    new_of_old[perm_global] = np.arange(n_vertices, dtype=np.int64)
    row_old = np.repeat(np.arange(n_vertices, dtype=np.int64), np.diff(ds.rowptr))
    first_vertex = ds.node_offsets[graph_of_vertex[row_old]]
    row_new = new_of_old[row_old]
    col_new = new_of_old[ds.indices[:n_entries].astype(np.int64) + first_vertex] - first_vertex
    order = np.argsort(row_new, kind="stable")
    rowptr = np.concatenate([[0], np.cumsum(np.bincount(row_new, minlength=n_vertices))]).astype(np.int64)
    return SimpleNamespace(
        n_graphs=ds.n_graphs, dtype=ds.dtype, node_offsets=ds.node_offsets, entry_offsets=ds.entry_offsets,
        n_nodes=ds.n_nodes, n_entries=ds.n_entries, rowptr=rowptr,
        indices=_nonempty(col_new[order].astype(np.int32)),
        weights=_nonempty(ds.weights[:n_entries][order]),
        edge_features=_nonempty(ds.edge_features[:n_entries][order]),
        degree=_nonempty(ds.degree[:n_vertices][perm_global]),
        node_features=_nonempty(ds.node_features[:n_vertices][perm_global]),
        perm_global=perm_global)


class DatasetCache:
    """Packed datasets keyed by the content of a list's graphs and what the packing depends on.

    The key is a hash of every array the packing reads (structure, weights, the label columns
    the programs use), taken on every lookup, so a graph edited in place, or replaced by an equal
    copy, is looked up by what it holds.  The least recently used dataset is dropped beyond ``capacity``.
    """

    def __init__(self, capacity=8):
        self.capacity = capacity
        self._entries = OrderedDict()
        self._last_digest = None  # (graph tokens, label columns, digest) of the last lookup

    def content_key(self, graphs, node_cols, edge_cols):
        """A digest of what the packing reads from the graphs (graphkern.graph.content_digest); the
        last one again while the same graphs hold the same content (graphkern.graph.content_tokens:
        an unchanged list is not hashed again)."""
        tokens, cols = content_tokens(graphs), (tuple(node_cols), tuple(edge_cols))
        last = self._last_digest
        if last is not None and last[0] == tokens and last[1] == cols:
            return last[2]
        digest = content_digest(graphs, *cols)
        self._last_digest = (tokens, cols, digest)
        return digest

    def get(self, graphs, node_program, edge_program, tables, dtype):
        graphs = list(graphs)
        key = (self.content_key(graphs, node_program.columns, edge_program.columns), node_program.feature_spec,
               edge_program.feature_spec, np.dtype(dtype).str)
        ds = self._entries.get(key)
        if ds is not None:
            self._entries.move_to_end(key)
            return ds
        ds = MGKDataset(graphs, node_program, edge_program, tables, dtype)
        self._entries[key] = ds
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return ds
