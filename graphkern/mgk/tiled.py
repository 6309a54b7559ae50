"""The tiled GPU solver of the marginalized graph kernel: octiles built for it, options, launches, several GPUs.

The solver (``cuda_src/mgk_tiled.cu``) runs the core solver's preconditioned CG with the
techniques of the paper's Sections IV-V, each switchable through ``techniques=`` (a dict, or
a preset name: :data:`PRESETS`):

``tiles``       ``"sparse"``: only non-empty octiles are stored and streamed; ``"dense"``: every
                octile of the ``ceil(n/8)^2`` grid (the incremental figure's baseline).
``primitives``  ``"adaptive"``: per octile pair, sparse x sparse while both octiles have at most
                ``ss_max`` nonzeros, dense x sparse while the sparser has at most ``ds_max``,
                dense x dense otherwise; ``"dd"``, ``"ds"``, ``"ss"`` force one (the
                threshold microbenchmark uses them).
``storage``     ``"compact"``: an octile keeps only its nonzeros and a 64-bit bitmap; ``"full"``:
                64 values per channel, zeros included.
``team``        ``"block"``: a block per pair, its ``block_warps`` warps staging octiles into
                shared memory for one another (atomics accumulate the output); ``"warp"``: a
                warp per pair; ``"cluster"`` (compute capability 9.0+): a thread-block cluster
                of :data:`CLUSTER_BLOCKS` such blocks per pair, each block computing every
                CLUSTER_BLOCKS-th group of the XMV's G1 tile rows, the CG vectors split over
                the cluster and its reductions exchanged through distributed shared memory
                (so a few large pairs fill the GPU: beyond the paper); ``"auto"``:
                :func:`choose_team`.
``schedule``    ``"dynamic"``: teams take pairs from a global atomic counter, largest predicted
                cost first; ``"static"``: pair k goes to team k mod (number of teams).
``row_slots``, ``slab``  shared slots for octiles of G1 and values of the output slab per team
                (None: :func:`default_row_slots` / :data:`SLAB` of the team kind).

Reordering (``reorder="pbr"|"rcm"|None``) renumbers every graph's vertices with
:func:`graphkern.reorder.reorder_many` before its octiles are cut; the kernel's value does not
depend on it (the nodal matrices are returned in the input numbering).  Datasets built for the
solver are cached per packed dataset and per option set, and their device copies per device,
so a new call with other hyperparameters only ships the programs and the pairs.

Several devices (``device=[0, 1, ...]``), each run from its own host thread.  Where every device
reaches the first one's memory with native atomics (NVLink) and the schedule is dynamic, the
devices share one work queue (:func:`shared_queue_devices`): every device gets the whole list of
pairs, largest predicted cost first, and its teams claim the next pair from one counter in the
first device's memory, so a device that finishes its pairs early takes more instead of waiting.
Otherwise (PCIe, static schedule, nodal output) the pairs are grouped into tiles of the Gram
matrix, the tiles assigned to devices by predicted cost (octile pairs times expected CG
iterations, largest first to the least loaded device) (:func:`split_pairs`).

Thresholds of the adaptive choice (:data:`FORM_THRESHOLDS`) come from a cost model in warp
instructions per octile pair on sm_90, read off the loops of ``mgk_tiled_octile.cuh`` (both
octiles with k nonzeros; ``m`` the most nonzeros in one row of the sparser, k/8 to k/4; an SFU
instruction counts 8 issue slots: 4 SFUs per SM sub-partition; a shared-memory float atomic is a
compare-and-swap loop, ~8):

=========  =================  ===========================  ============================
form       dense x dense      dense x sparse               sparse x sparse
=========  =================  ===========================  ============================
constant   ~170 (W1 X W2^T)   20 + 28 ceil(k/4)            15 + ceil(k/4) (4 m + 12)
kronecker  ~560               20 + 52 ceil(k/4)            15 + ceil(k/4) (7 m + 12)
sqexp      ~1000 (SFU-bound)  20 + 100 ceil(k/4)           15 + ceil(k/4) (15 m + 12)
=========  =================  ===========================  ============================

Sparse x sparse then wins up to k ~ 16 (constant), 24-28 (kronecker), 28-32 (sqexp), dense x
sparse up to 20, 40, 40 (the sparse products' thresholds sit a little low: rows of octiles cut
from real graphs are less even than the model's).  The general interpreter costs tens of
instructions per term, which favours the sparse products: 32 and 56.  The paper found
sparse x sparse best up to 8-16 nonzeros.  ``graphkern-bench mgk-techniques --thresholds``
measures the crossovers on the GPU.
"""

from __future__ import annotations

import heapq
import math
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

from graphkern._backend import resolve_threads
from graphkern._cuda import runtime as rt
from graphkern.graph import Graph
from graphkern.mgk.core import (PairOutputs, align16, in_launch_order, in_pair_order, launch_order, nodal_blocks,
                                pair_job, scratch_units)
from graphkern.mgk.data import OCTILE, _nonempty, build_octiles, renumbered
from graphkern.mgk.results import Solved, empty_result
from graphkern.reorder import reorder_many

__all__ = ["PRESETS", "TECHNIQUE_OPTIONS", "INCREMENTAL_STEPS", "resolve_techniques", "check_reorder",
           "TiledData", "tiled_data", "TiledGPUEngine", "split_pairs", "predicted_cost",
           "choose_team", "supports_clusters", "CLUSTER_BLOCKS", "default_row_slots", "shared_bytes", "slot_bytes", "FORM_THRESHOLDS"]

OCTILE_SIZE = OCTILE * OCTILE
WARP = 32
# What the planning of teams, slots and shared memory holds (it runs, and is tested, without a
# device); the kernel module exports the same values, checked when it loads (graphkern._cuda.runtime.exports).
MAX_PARAMS = 96            # parameters per program
MAX_CODE = 256             # code words of both programs
MAX_WARPS = 32             # per block
CLUSTER_BLOCKS = 8         # blocks per cluster team
MAX_BLOCK_WARPS = 16       # the block teams' launch bound
WARP_TEAMS_PER_BLOCK = 4
SLOT_META_INTS = 8         # an octile slot's header
_PLANNED = {"max_params": MAX_PARAMS, "max_code": MAX_CODE, "max_warps": MAX_WARPS, "cluster_blocks": CLUSTER_BLOCKS,
            "max_block_warps": MAX_BLOCK_WARPS, "warp_teams_per_block": WARP_TEAMS_PER_BLOCK,
            "slot_meta_ints": SLOT_META_INTS, "octile_size": OCTILE_SIZE}
REORDER_METHODS = ("pbr", "rcm", None)

#: (ss_max, ds_max) per edge-kernel form: the largest nonzeros per octile at which the sparse
#: primitive beats dense x dense (``graphkern-bench mgk-techniques --thresholds``; the dense
#: product costs about the same whatever the fill, so they sit well below the cost model's).
#: 'general' evaluates the edge kernel by interpretation: a little above sqexp's.
FORM_THRESHOLDS = {"constant": (2, 2), "kronecker": (4, 8), "sqexp": (6, 20), "general": (8, 24)}
#: octile slots for G1 and output-slab values per team, by team kind
ROW_SLOTS = {"warp": 8, "block": 32, "cluster": 32}
# block teams: slots up to this much shared memory per block (two blocks of 8 warps per SM, as
# their 128 registers per thread allow), at least ROW_SLOTS_MIN
BLOCK_SHARED_BUDGET = 96 * 1024
ROW_SLOTS_MIN = 8
# warp teams: 4 teams of (8 slots + own slot and slice + a slab of 1024 values) = 57 KB in float32
# with the shortcut forms, so 3 blocks fit an SM as their 164 registers allow (12 warps)
SLAB = {"warp": 1024, "block": 4096, "cluster": 4096}
# choose_team: warp teams once every SM gets this many pairs, if pairs are this small (octile pairs)
WARP_TEAM_MIN_PAIRS_PER_SM = 64
WARP_TEAM_MAX_OCTILE_PAIRS = 4096
# choose_team: clusters are considered where G1 has this many octiles (enough groups of tile rows
# to share among the cluster's blocks), then chosen where the predicted makespan of the pairs on
# the cluster teams (largest first) beats that on block teams (two blocks of 8 warps per SM).
CLUSTER_MIN_OCTILES = 128
BLOCK_TEAMS_PER_SM = 2
# A cluster's speed against CLUSTER_BLOCKS block teams (protein-like graphs of 500-1000
# vertices, graphkern-bench mgk-techniques): its blocks wait for each other at every reduction
# and share a pair's groups of tile rows unevenly.
CLUSTER_EFFICIENCY = 0.74

_FORM_INDEX = {"general": 0, "constant": 1, "kronecker": 2, "sqexp": 3}

TECHNIQUE_OPTIONS = {
    "tiles": ("sparse", "dense"),
    "primitives": ("adaptive", "dd", "ds", "ss"),
    "storage": ("compact", "full"),
    "team": ("auto", "warp", "block", "cluster"),
    "schedule": ("dynamic", "static"),
}
_INT_OPTIONS = {"block_warps": (1, MAX_BLOCK_WARPS), "ss_max": (-1, 64), "ds_max": (-1, 64),
                "row_slots": (1, 64), "slab": (OCTILE_SIZE, 1 << 16)}

_ALL = dict(tiles="sparse", primitives="adaptive", storage="compact", team="auto", schedule="dynamic",
            block_warps=8, ss_max=None, ds_max=None, row_slots=None, slab=None)
# The incremental figure: each step adds one technique to the one before (reorder is the
# kernel's own option; these are the (name, techniques, reorder) of the benchmark's rows).
INCREMENTAL_STEPS = (
    ("Dense", dict(_ALL, tiles="dense", primitives="dd", storage="full", team="warp", schedule="static"), None),
    ("+Sparse", dict(_ALL, primitives="dd", storage="full", team="warp", schedule="static"), None),
    ("+Reorder", dict(_ALL, primitives="dd", storage="full", team="warp", schedule="static"), "pbr"),
    ("+Adaptive", dict(_ALL, storage="full", team="warp", schedule="static"), "pbr"),
    ("+Compact", dict(_ALL, team="warp", schedule="static"), "pbr"),
    ("+Block", dict(_ALL, team="block", schedule="static"), "pbr"),
    ("+DynSched", dict(_ALL, team="block"), "pbr"),
)
#: preset names for ``techniques=``: "auto" and "tiled" (every technique, team chosen per call;
#: under "auto" graphkern.mgk.router gives the tiled solver the pairs the GEMM and CSR solvers do
#: not take), "core" (the untiled solver, cuda_src/mgk.cu), and the rows of the incremental
#: benchmark by name ("dense", "sparse", "adaptive", "compact", "block", "dynsched")
PRESETS = {"auto": dict(_ALL), "tiled": dict(_ALL), "core": None}
PRESETS.update({name.lstrip("+").lower(): tech for name, tech, _ in INCREMENTAL_STEPS if name != "+Reorder"})


# ----------------------------------------------------------------------------- options


def resolve_techniques(techniques):
    """The full technique dict for ``techniques`` (None or a preset name or a dict), or None for "core".

    A dict overrides the "auto" preset key by key; unknown keys and values raise ValueError.
    """
    if techniques is None:
        return dict(_ALL)
    if isinstance(techniques, str):
        if techniques not in PRESETS:
            raise ValueError(f"techniques: unknown preset {techniques!r}; choose from {', '.join(PRESETS)} "
                             "or pass a dict")
        preset = PRESETS[techniques]
        return None if preset is None else dict(preset)
    if not isinstance(techniques, dict):
        raise TypeError(f"techniques must be a preset name or a dict, got {type(techniques).__name__}")
    out = dict(_ALL)
    for key, value in techniques.items():
        if key in TECHNIQUE_OPTIONS:
            if value not in TECHNIQUE_OPTIONS[key]:
                raise ValueError(f"techniques[{key!r}] must be one of {', '.join(map(repr, TECHNIQUE_OPTIONS[key]))}; "
                                 f"got {value!r}")
        elif key in _INT_OPTIONS:
            lo, hi = _INT_OPTIONS[key]
            nullable = key != "block_warps"
            if value is None and nullable:
                pass
            elif isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise ValueError(f"techniques[{key!r}] must be an int in [{lo}, {hi}]"
                                 f"{' or None' if nullable else ''}; got {value!r}")
            else:
                value = int(value)
        else:
            raise ValueError(f"techniques: unknown key {key!r}; known: "
                             f"{', '.join(list(TECHNIQUE_OPTIONS) + list(_INT_OPTIONS))}")
        out[key] = value
    return out


def check_reorder(reorder):
    if reorder not in REORDER_METHODS:
        raise ValueError(f"reorder must be one of {', '.join(map(repr, REORDER_METHODS))}; got {reorder!r}")
    return reorder


def thresholds(tech, form):
    """(ss_max, ds_max) the kernel gets for the technique dict and the edge-kernel form."""
    primitives = tech["primitives"]
    if primitives == "dd":
        return -1, -1
    if primitives == "ds":
        return -1, OCTILE_SIZE
    if primitives == "ss":
        return OCTILE_SIZE, OCTILE_SIZE
    ss_default, ds_default = FORM_THRESHOLDS[form]
    ss = ss_default if tech["ss_max"] is None else tech["ss_max"]
    ds = ds_default if tech["ds_max"] is None else tech["ds_max"]
    return ss, ds


# ----------------------------------------------------------------------------- octiles for the solver


def _graph_orders(ds, method, n_threads):
    """One vertex order per graph of ``ds`` (``None``: every order is the identity)."""
    if method is None:
        return None
    graphs = []
    for g in range(ds.n_graphs):
        v0, v1 = int(ds.node_offsets[g]), int(ds.node_offsets[g + 1])
        e0, e1 = int(ds.entry_offsets[g]), int(ds.entry_offsets[g + 1])
        indptr = ds.rowptr[v0:v1 + 1] - ds.rowptr[v0]
        graphs.append(Graph(indptr, ds.indices[e0:e1], validate=False))
    return reorder_many(graphs, method, n_threads=n_threads)


def _every_octile(oc, n_nodes):
    """The octiles of ``oc`` placed in the full ``ceil(n/8)^2`` grid of every graph (empty ones zero)."""
    side = (n_nodes + OCTILE - 1) // OCTILE
    per_graph = side * side
    offsets = np.concatenate([[0], np.cumsum(per_graph)]).astype(np.int64)
    total = int(offsets[-1])
    if total >= np.iinfo(np.int32).max:
        raise ValueError(f"{total} octiles exceed the int32 tile index of the GPU solver")
    graph_of_tile = np.repeat(np.arange(len(side), dtype=np.int64), oc.tiles_per_graph())
    where = offsets[graph_of_tile] + oc.tile_row.astype(np.int64) * side[graph_of_tile] + oc.tile_col
    graph_of_slot = np.repeat(np.arange(len(side), dtype=np.int64), per_graph)
    local = np.arange(total, dtype=np.int64) - offsets[graph_of_slot]
    values = np.zeros((total,) + oc.values.shape[1:], dtype=oc.values.dtype)
    values[where] = oc.values
    bitmap = np.zeros(total, dtype=np.uint64)
    bitmap[where] = oc.bitmap
    rowptr_offset = np.concatenate([[0], np.cumsum(side + 1)[:-1]]).astype(np.int64)
    rowptr = np.concatenate([offsets[g] + side[g] * np.arange(side[g] + 1) for g in range(len(side))]) \
        if len(side) else np.zeros(0, dtype=np.int64)
    return SimpleNamespace(tile_row=(local // np.maximum(side[graph_of_slot], 1)).astype(np.int32),
                           tile_col=(local % np.maximum(side[graph_of_slot], 1)).astype(np.int32),
                           bitmap=bitmap, values=values, tile_offsets=offsets,
                           tile_rowptr=_nonempty(rowptr.astype(np.int32)), rowptr_offset=rowptr_offset)


def _popcount64(words):
    words = np.ascontiguousarray(words, dtype=np.uint64)
    return np.unpackbits(words.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1).astype(np.int64)


def bitmap_mask(bitmap):
    """``(n_tiles, 64)`` bools: element ``8 r + s`` of tile t is stored."""
    shifts = np.arange(OCTILE_SIZE, dtype=np.uint64)
    return ((np.asarray(bitmap, dtype=np.uint64)[:, None] >> shifts) & np.uint64(1)).astype(bool)


class TiledData:
    """One packed dataset (:class:`graphkern.mgk.data.MGKDataset`) cut into octiles for the tiled solver.

    ``perms[g]`` is graph g's vertex order (None: natural).  Tiles of a graph are consecutive,
    sorted by tile row then column (``tile_offsets``, ``tile_rowptr`` from ``rowptr_offset[g]``,
    global tile indices).  ``values`` holds ``channels`` values per element: the weight and the
    edge-feature columns ``channels_used[1:] - 1`` of the dataset; compact storage keeps
    the stored elements only, element-major (``values[nz_offsets[t] + k, c]`` for the k-th set
    bit of ``bitmap[t]``), full storage ``values[t, c, 8 r + s]``.
    """

    def __init__(self, ds, *, reorder, tiles, storage, channels, n_threads):
        self.reorder = reorder
        self.tiles = tiles
        self.storage = storage
        self.channels_used = tuple(channels)
        self.dtype = ds.dtype
        self.n_graphs = ds.n_graphs
        self.node_offsets = ds.node_offsets
        self.n_nodes = ds.n_nodes
        self.perms = _graph_orders(ds, reorder, n_threads)
        view = renumbered(ds, self.perms)
        self.degree = view.degree
        self.node_features = view.node_features
        oc = build_octiles(view)
        if tiles == "dense":
            oc = _every_octile(oc, ds.n_nodes)
        self.tile_row = _nonempty(oc.tile_row.astype(np.int32))
        self.tile_col = _nonempty(oc.tile_col.astype(np.int32))
        self.bitmap = _nonempty(oc.bitmap)
        self.tile_offsets = oc.tile_offsets.astype(np.int64)
        self.tile_rowptr = oc.tile_rowptr
        self.rowptr_offset = _nonempty(oc.rowptr_offset)
        values = oc.values[:, list(self.channels_used), :]
        self.nnz_per_tile = _popcount64(oc.bitmap)
        if storage == "compact":
            mask = bitmap_mask(oc.bitmap)
            self.values = _nonempty(np.ascontiguousarray(values.transpose(0, 2, 1)[mask]))
            self.nz_offsets = _nonempty(np.concatenate([[0], np.cumsum(self.nnz_per_tile)[:-1]]).astype(np.int64)
                                        if len(mask) else np.zeros(0, np.int64))
        else:
            self.values = _nonempty(np.ascontiguousarray(values))
            self.nz_offsets = np.zeros(1, dtype=np.int64)
        self.tiles_per_graph = np.diff(self.tile_offsets)
        # the largest weighted degree of each graph, for predicted_cost
        self.max_degree = np.zeros(ds.n_graphs)
        nonempty = ds.n_nodes > 0
        if nonempty.any():
            self.max_degree[nonempty] = np.maximum.reduceat(ds.degree[:int(ds.node_offsets[-1])].astype(np.float64),
                                                            ds.node_offsets[:-1][nonempty])
        # device copies live with the dataset's others (MGKDataset.device_copies), keyed by these options
        self._device = ds.device_copies
        self._key = ("tiled", reorder, tiles, storage, self.channels_used)
        self._lock = threading.Lock()

    @property
    def channels(self):
        return len(self.channels_used)

    def host_arrays(self):
        """The arrays of the device layout, in the order of ``TiledSet`` (mgk_tiled_octile.cuh)."""
        return {"node_off": self.node_offsets, "tile_off": self.tile_offsets, "rowptr_off": self.rowptr_offset,
                "tile_rowptr": self.tile_rowptr, "tile_row": self.tile_row, "tile_col": self.tile_col,
                "bitmap": self.bitmap, "nz_off": self.nz_offsets, "values": self.values, "degree": self.degree,
                "node_feat": self.node_features}

    def on_device(self, dev, stream):
        """The arrays and the TiledSet descriptor on ``dev`` (uploaded once per device)."""
        key = self._key + (dev.ordinal,)
        with self._lock:
            copy = self._device.get(key)
        if copy is not None:
            return copy
        host = self.host_arrays()
        rt.check_fits(dev, sum(a.nbytes for a in host.values()), f"the octiles of {self.n_graphs} graphs")
        bufs = {k: rt.to_device(dev, np.ascontiguousarray(v), stream) for k, v in host.items()}
        fields = [bufs[k].ptr for k in host] + [self.node_features.shape[1], self.channels]
        bufs["descriptor"] = rt.to_device(dev, np.array(fields, dtype=np.uint64), stream)
        stream.synchronize()
        with self._lock:
            self._device[key] = bufs
        return bufs

    def unpermute(self, g, R_block, other, g_other):
        """A nodal block computed in the solver's numbering, back in the input numbering."""
        p1 = None if self.perms is None else self.perms[g]
        p2 = None if other.perms is None else other.perms[g_other]
        if p1 is None and p2 is None:
            return R_block
        out = np.empty_like(R_block)
        rows = np.arange(R_block.shape[0]) if p1 is None else p1
        cols = np.arange(R_block.shape[1]) if p2 is None else p2
        out[np.ix_(rows, cols)] = R_block
        return out


_TILED_CACHE = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def tiled_data(ds, *, reorder, tiles, storage, channels, n_threads=None):
    """The :class:`TiledData` of ``ds`` for these options, built once and kept while ``ds`` lives."""
    key = (reorder, tiles, storage, tuple(channels))
    with _CACHE_LOCK:
        per_ds = _TILED_CACHE.setdefault(ds, {})
        td = per_ds.get(key)
    if td is None:
        td = TiledData(ds, reorder=reorder, tiles=tiles, storage=storage, channels=channels,
                       n_threads=resolve_threads(n_threads))
        with _CACHE_LOCK:
            per_ds[key] = td
    return td


def edge_channels(form, args, edge_feature_width):
    """The dataset channels the edge kernel's form reads: the weight, then its feature columns."""
    if form == "constant":
        return (0,)
    if form in ("kronecker", "sqexp"):
        return (0, 1 + int(args["ek_slot"]))
    return tuple(range(1 + edge_feature_width))


# ----------------------------------------------------------------------------- launch planning


def slot_bytes(planes, itemsize):
    """Bytes of a shared octile slot (mgk_tiled_octile.cuh: slot_bytes)."""
    return align16(2 * planes * OCTILE_SIZE * itemsize + SLOT_META_INTS * 4 + OCTILE_SIZE)


def shared_bytes(itemsize, planes, row_slots, slab, warps_per_team, teams_per_block):
    """Dynamic shared memory of one block (cuda_src/mgk_tiled.cu: tiled_solve's layout)."""
    header = 256 + align16(2 * MAX_PARAMS * itemsize) + MAX_CODE * 4 + 2 * MAX_WARPS * 8 + 32
    sb = slot_bytes(planes, itemsize)
    team = row_slots * sb + warps_per_team * (sb + OCTILE_SIZE * itemsize) + align16(slab * itemsize)
    return header + teams_per_block * team


def default_row_slots(team, itemsize, planes, slab, warps_per_team):
    """G1 octile slots per team: 8 for warp teams; for a block, as many as the shared budget leaves
    after its warps' own slots and the slab, at most 32 (more slots: fewer groups of G1 tile rows,
    so each octile of G2 is staged fewer times per XMV)."""
    if team == "warp":
        return ROW_SLOTS["warp"]
    rest = BLOCK_SHARED_BUDGET - shared_bytes(itemsize, planes, 0, slab, warps_per_team, 1)
    return int(min(ROW_SLOTS["block"], max(ROW_SLOTS_MIN, rest // slot_bytes(planes, itemsize))))


def expected_iterations(max_deg1, max_deg2, q):
    """A relative guess of the CG iterations of a pair, from its diagonally dominant structure.

    With vertex and edge kernels at most 1, the preconditioned system ``I - V D^-1 (A (.) E)``
    has spectral radius at most ``rho = d1 d2 / ((d1 + q)(d2 + q))`` (d the largest weighted
    degrees), so its condition number is at most ``(1 + rho) / (1 - rho)`` and CG needs about
    its square root.
    """
    rho = (max_deg1 / (max_deg1 + q)) * (max_deg2 / (max_deg2 + q))
    return np.sqrt((1 + rho) / np.maximum(1 - rho, 1e-12))


def predicted_cost(td1, td2, g1, g2, q):
    """Relative cost of each pair: (octile pairs + vector work) per CG iteration times expected iterations."""
    octile_pairs = td1.tiles_per_graph[g1].astype(np.float64) * td2.tiles_per_graph[g2]
    vector_work = td1.n_nodes[g1].astype(np.float64) * td2.n_nodes[g2] / 16.0
    return (octile_pairs + vector_work + 1.0) * expected_iterations(td1.max_degree[g1], td2.max_degree[g2], q)


def lpt_makespan(cost, slots):
    """The finishing time of ``cost`` (per pair) on ``slots`` equal teams that take the pairs
    largest first, each the next pair when free (the kernel's dynamic schedule)."""
    cost = np.sort(np.asarray(cost, dtype=np.float64))[::-1]
    slots = max(1, int(slots))
    if len(cost) <= slots:
        return float(cost[0]) if len(cost) else 0.0
    load = [0.0] * slots
    for c in cost:
        heapq.heapreplace(load, load[0] + c)
    return max(load)


def choose_team(n_pairs, octile_pairs, sms, *, g1_octiles=None, clusters=False, cost=None):
    """Warp teams when the pairs are many and small enough to fill every SM's warps on their own.
    Otherwise block teams, or cluster teams where the device has ``clusters``, the pairs are
    large enough to split (``g1_octiles``, the octiles of each pair's first graph) and the
    predicted makespan (``cost`` per pair, :func:`lpt_makespan`) on ``sms`` x BLOCK_TEAMS_PER_SM /
    CLUSTER_BLOCKS cluster teams, each CLUSTER_BLOCKS x CLUSTER_EFFICIENCY times as fast as a
    block, is shorter than on as many block teams as the SMs hold: few pairs, or a count just
    past a whole number of waves, leave block teams idle while the largest pairs finish."""
    if n_pairs >= WARP_TEAM_MIN_PAIRS_PER_SM * sms and np.median(octile_pairs) <= WARP_TEAM_MAX_OCTILE_PAIRS:
        return "warp"
    if not clusters or g1_octiles is None or np.median(g1_octiles) < CLUSTER_MIN_OCTILES:
        return "block"
    cost = np.asarray(octile_pairs if cost is None else cost, dtype=np.float64)
    blocks = sms * BLOCK_TEAMS_PER_SM
    on_blocks = lpt_makespan(cost, blocks)
    on_clusters = lpt_makespan(cost, blocks // CLUSTER_BLOCKS) / (CLUSTER_BLOCKS * CLUSTER_EFFICIENCY)
    return "cluster" if on_clusters < on_blocks else "block"


def supports_clusters(dev):
    """Thread-block clusters: compute capability 9.0 and newer."""
    return tuple(dev.properties["compute_capability"]) >= (9, 0)


def shared_queue_devices(devs):
    """Whether ``devs`` (two or more) can share one work counter in ``devs[0]``'s memory: every
    other device has peer access to it with native atomics.  Enables the peer access it needs."""
    if len(devs) < 2:
        return False
    home = devs[0]
    for dev in devs[1:]:
        if dev is home or not (dev.can_access_peer(home) and dev.native_peer_atomics(home)):
            return False
    for dev in devs[1:]:
        dev.enable_peer_access(home)
    return True


def split_pairs(pair_arr, cost, n_devices, *, tiles_per_device=128):
    """Indices of the pairs each device solves: Gram-matrix tiles, largest predicted cost first to
    the least loaded device.

    The pairs are grouped by ``(g1 // B1, g2 // B2)`` with the tile sides chosen so that about
    ``tiles_per_device * n_devices`` tiles cover the index range.  Returns a list of int64 arrays.
    Fine tiles keep few large pairs balanced; on large sets a tile still holds many pairs.
    """
    m = len(pair_arr)
    if n_devices == 1 or m == 0:
        return [np.arange(m, dtype=np.int64)] + [np.zeros(0, dtype=np.int64)] * (n_devices - 1)
    per_side = max(1, math.ceil(math.sqrt(tiles_per_device * n_devices)))
    span1 = int(pair_arr[:, 0].max()) + 1
    span2 = int(pair_arr[:, 1].max()) + 1
    side1 = max(1, math.ceil(span1 / per_side))
    side2 = max(1, math.ceil(span2 / per_side))
    tile = (pair_arr[:, 0] // side1) * per_side + pair_arr[:, 1] // side2
    tiles, tile_of_pair = np.unique(tile, return_inverse=True)
    tile_cost = np.bincount(tile_of_pair, weights=cost, minlength=len(tiles))
    load = np.zeros(n_devices)
    owner = np.empty(len(tiles), dtype=np.int64)
    for t in np.argsort(-tile_cost, kind="stable"):
        d = int(np.argmin(load))
        owner[t] = d
        load[d] += tile_cost[t]
    device_of_pair = owner[tile_of_pair]
    return [np.flatnonzero(device_of_pair == d).astype(np.int64) for d in range(n_devices)]


# ----------------------------------------------------------------------------- the engine


class TiledGPUEngine:
    """Runs cuda_src/mgk_tiled.cu over a list of pairs on one or more devices (the GPU backend of
    :class:`graphkern.MarginalizedGraphKernel` unless ``techniques="core"``)."""

    name = "gpu"

    def __init__(self, ordinals, s, techniques, reorder, n_threads=None):
        self.ordinals = list(ordinals)
        self.s = s
        self.tech = techniques
        self.reorder = reorder
        self.n_threads = n_threads
        #: per device of the last solve: (ordinal, pairs, kernel seconds, team kind)
        self.last_run = []
        #: whether the devices of the last solve shared one work queue (else: split_pairs)
        self.last_shared_queue = False

    def accepts(self, ds1, ds2, pair_arr, args, *, gradient=None):
        """Every pair (of K; gradients run on the core solver)."""
        return np.ones(len(pair_arr), dtype=bool)

    def datasets(self, ds1, ds2, args):
        """The TiledData of both sides for the current settings."""
        form = args["form_name"]
        channels = edge_channels(form, args, ds1.edge_features.shape[1])
        opts = dict(reorder=self.reorder, tiles=self.tech["tiles"], storage=self.tech["storage"], channels=channels,
                    n_threads=self.n_threads)
        td1 = tiled_data(ds1, **opts)
        td2 = td1 if ds2 is ds1 else tiled_data(ds2, **opts)
        return td1, td2

    def solve(self, ds1, ds2, pair_arr, args, *, nodal):
        td1, td2 = self.datasets(ds1, ds2, args)
        m = len(pair_arr)
        g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
        g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
        octile_pairs = td1.tiles_per_graph[g1] * td2.tiles_per_graph[g2]
        if m == 0:
            self.last_run = []
            return empty_result(nodal, octile_pairs)
        if len(args["nparam"]) > MAX_PARAMS or len(args["eparam"]) > MAX_PARAMS \
                or len(args["ncode"]) + len(args["ecode"]) > MAX_CODE:
            raise ValueError(f"a kernel program is too long for the GPU solver (at most {MAX_PARAMS} parameters "
                             f"per program and {MAX_CODE} code words in all)")
        cost = predicted_cost(td1, td2, g1, g2, self.s["q"])
        K = np.full(m, np.nan)
        iters = np.full(m, -1, dtype=np.int32)
        resid = np.full(m, np.nan)
        blocks = [None] * m if nodal else None
        devs = [rt.get_device(ordinal) for ordinal in self.ordinals]
        queue = None
        if (len(devs) > 1 and not nodal and self.tech["schedule"] == "dynamic" and self.s["shared_queue"]
                and shared_queue_devices(devs)):
            queue = rt.alloc(devs[0], 1, np.uint64)
            queue.zero()
            devs[0].synchronize()
            everything = np.arange(m, dtype=np.int64)
            jobs = [(ordinal, everything) for ordinal in self.ordinals]
        else:
            shares = split_pairs(pair_arr, cost, len(self.ordinals))
            jobs = [(ordinal, idx) for ordinal, idx in zip(self.ordinals, shares) if len(idx)]

        self.last_shared_queue = queue is not None

        def run(job):
            ordinal, idx = job
            return ordinal, idx, self._solve_on(rt.get_device(ordinal), td1, td2, args, g1[idx], g2[idx],
                                                octile_pairs[idx], cost[idx], nodal, queue=queue,
                                                n_devices=len(jobs))

        if len(jobs) == 1:
            results = [run(jobs[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                results = list(pool.map(run, jobs))
        self.last_run = []
        solved_by = np.zeros(m, dtype=np.int64)
        for ordinal, idx, (k, it, res, nod, seconds, team) in results:
            mine = it >= 0  # with a shared queue, the pairs this device claimed
            solved_by[idx[mine]] += 1
            K[idx[mine]] = k[mine]
            iters[idx[mine]] = it[mine]
            resid[idx[mine]] = res[mine]
            if nodal:
                for j, block in zip(idx.tolist(), nod):
                    blocks[j] = td1.unpermute(int(g1[j]), block, td2, int(g2[j]))
            self.last_run.append((ordinal, int(np.count_nonzero(mine)), seconds, team))
        if not np.all(solved_by == 1):
            raise RuntimeError(f"the tiled GPU solver on devices {self.ordinals} left {int(np.sum(solved_by == 0))} of "
                               f"{m} pairs unsolved and solved {int(np.sum(solved_by > 1))} twice")
        return Solved(K=K, iterations=iters, residuals=resid, nodal=blocks, octile_pairs=octile_pairs,
                      seconds=max(r[2] for r in self.last_run))

    def _solve_on(self, dev, td1, td2, args, g1, g2, octile_pairs, cost, nodal, *, queue=None, n_devices=1):
        """Solve the pairs (g1[k], g2[k]) on ``dev``: (K, iterations, residuals, nodal blocks, seconds, team).

        ``queue``: a counter shared with other devices (in another device's memory, reached by
        peer access), which then solve the same list: this device solves the pairs its teams
        claim, and the others come back with iterations -1 and K NaN.  ``n_devices``: how many
        devices share the pairs (the team choice predicts this device's share)."""
        s, tech = self.s, self.tech
        dt = s["dtype"]
        m = len(g1)
        dev.activate()
        n_vectors = rt.exports(dev, "mgk_tiled", agree=_PLANNED).vectors  # and the layout planned here checked
        stream = rt.Stream(dev)
        d1 = td1.on_device(dev, stream)
        d2 = d1 if td2 is td1 else td2.on_device(dev, stream)

        sms = dev.properties["multiprocessor_count"]
        clusters = supports_clusters(dev)
        # with a shared queue the devices take the list together, like one device of all their SMs
        shared_sms = sms * n_devices if queue is not None else sms
        team = tech["team"] if tech["team"] != "auto" else choose_team(
            m, octile_pairs, shared_sms, g1_octiles=td1.tiles_per_graph[g1], clusters=clusters, cost=cost)
        if team == "cluster" and not clusters:
            raise ValueError(f"techniques['team']='cluster' needs thread-block clusters (compute capability 9.0+); "
                             f"device {dev.ordinal} has {'.'.join(map(str, dev.properties['compute_capability']))}")
        warps_per_team = 1 if team == "warp" else tech["block_warps"]
        teams_per_block = WARP_TEAMS_PER_BLOCK if team == "warp" else 1
        blocks_per_team = CLUSTER_BLOCKS if team == "cluster" else 1
        threads = WARP * warps_per_team * teams_per_block
        n1 = td1.n_nodes[g1]
        n2 = td2.n_nodes[g2]
        padded = int(np.max(-(-n1 // OCTILE) * -(-n2 // OCTILE))) * OCTILE_SIZE
        slab = min(tech["slab"] or SLAB[team], max(padded, OCTILE_SIZE))
        planes = td1.channels
        row_slots = tech["row_slots"] or default_row_slots(team, dt.itemsize, planes, slab, warps_per_team)
        shared = shared_bytes(dt.itemsize, planes, row_slots, slab, warps_per_team, teams_per_block)
        limit = dev.properties.get("max_shared_memory_per_block_optin", 48 * 1024)
        if shared > limit:
            raise ValueError(f"the tiled solver needs {shared} bytes of shared memory per block ({planes} values per "
                             f"edge, {row_slots} octile slots, a slab of {slab} values); device {dev.ordinal} allows "
                             f"{limit}: lower techniques['row_slots'] / ['slab'] or block_warps")
        form = args["form_name"]
        variant = f"{tech['storage']}_{rt.precision(dt)}"
        fn = rt.kernel(dev, "mgk_tiled", f"mgk_tiled_{form}_{team}_{variant}")
        # a cluster kernel's blocks are its block twin's: that one answers the occupancy query
        twin = rt.kernel(dev, "mgk_tiled", f"mgk_tiled_{form}_block_{variant}") if team == "cluster" else fn
        if shared > 48 * 1024:
            fn.set_max_dynamic_shared_memory(shared)
            twin.set_max_dynamic_shared_memory(shared)
        ss_max, ds_max = thresholds(tech, form)

        sizes = n1.astype(np.int64) * n2
        order = launch_order(cost) if tech["schedule"] == "dynamic" else np.arange(m)
        stride = int(-(-int(sizes.max()) // 32) * 32)
        nodal_off = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int64) if nodal else None
        out_bytes = m * (8 + 4 + 8 + 16) + (int(nodal_off[-1]) * dt.itemsize if nodal else 0)
        per_team = n_vectors * stride * dt.itemsize
        resident_blocks = sms * max(1, twin.max_active_blocks_per_sm(threads, shared))
        # units: a block of warp teams, a block team, or a cluster of blocks (one team each)
        units = scratch_units(dev, min(-(-m // teams_per_block), max(1, resident_blocks // blocks_per_team)),
                              per_team * teams_per_block, out_bytes, sizes)
        blocks = units * blocks_per_team

        code = np.concatenate([args["ncode"], args["ecode"]]).astype(np.int32)
        params = np.concatenate([args["nparam"], args["eparam"]]).astype(dt)
        scratch = rt.alloc(dev, units * teams_per_block * n_vectors * stride, dt)
        d_g1 = rt.to_device(dev, in_launch_order(g1, order), stream)
        d_g2 = rt.to_device(dev, in_launch_order(g2, order), stream)
        d_code = rt.to_device(dev, code, stream)
        d_params = rt.to_device(dev, params, stream)
        outputs = PairOutputs(dev, [(m, np.float64), (m, np.int32), (m, np.float64)]
                              + ([(max(int(nodal_off[-1]), 1), dt)] if nodal else []), stream)
        d_k, d_it, d_res, *d_nodal = outputs.views
        if queue is None:
            counter = rt.alloc(dev, 1, np.uint64)
            counter.zero(stream)
        else:
            counter = queue
        d_nodal_off = rt.to_device(dev, nodal_off, stream) if nodal else None

        start, end = rt.Event(dev), rt.Event(dev)
        start.record(stream)
        job = pair_job(dev, "mgk_tiled", s, args, d_g1, d_g2, d_code, d_params, 0, scratch, stride)
        schedule = rt.layout(dev, "mgk_tiled", "schedule").pack(
            ss_max=ss_max, ds_max=ds_max, row_slots=row_slots, slab_cap=slab,
            dynamic=2 if queue is not None else int(tech["schedule"] == "dynamic"), counter=counter)
        out = rt.layout(dev, "mgk_tiled", f"out_{rt.precision(dt)}").pack(
            k=d_k, iterations=d_it, residuals=d_res, nodal=d_nodal[0] if nodal else None, nodal_off=d_nodal_off)
        rt.launch(fn, blocks, threads, (d1["descriptor"], d2["descriptor"], job, schedule, out), shared_mem=shared,
                  stream=stream)
        end.record(stream)
        stream.synchronize()
        seconds = start.elapsed_ms(end) / 1e3

        K, iters, resid, *flat = outputs.read()
        K, iters, resid = in_pair_order((K, iters, resid), order)
        if queue is None and not (np.all(np.isfinite(K)) and np.all(iters >= 0)):
            raise RuntimeError(f"the tiled GPU solver left {int(np.sum(~np.isfinite(K) | (iters < 0)))} of {m} pairs "
                               f"unwritten on device {dev.ordinal}")
        blocks_out = nodal_blocks(flat[0], nodal_off, order, n1, n2) if nodal else None
        return K, iters, resid, blocks_out, seconds, team
