"""The shortest-path graph kernel on multicore CPUs and NVIDIA GPUs (FCSP).

Definition
----------
For a graph ``G`` let ``P(G)`` be its shortest-path graph: every *ordered* pair
``(a, b)`` of *distinct* vertices with ``b`` reachable from ``a``, carrying the
shortest-path length ``l_ab`` (hop count for an unweighted graph, the sum of edge
weights otherwise).  Then

    K(G, G') = sum_{(a,b) in P(G)} sum_{(c,d) in P(G')} k_v(a, c) * k_v(b, d) * k_e(l_ab, l_cd)

with a vertex kernel ``k_v`` (:class:`DiracNode`, :class:`GaussianNode`, products of
them) and a path-length kernel ``k_e`` (:class:`DiracEdge`, :class:`GaussianEdge`,
:class:`BrownianBridgeEdge`).  This is the counting of Algorithm 1 of the FCSP paper
and of Borgwardt and Kriegel's kernel on the shortest-path graph with both directions
of every path.  Unreachable pairs and ``a == b`` never count, so a graph with one
vertex or no edges has ``K(G, .) = 0``.

Relation to GraKeL (checked against grakel 0.1.11's source and by the tests):

* ``grakel.ShortestPath(with_labels=True)`` builds, for each graph, the histogram of
  ``(label_a, label_b, l_ab)`` over the same ordered pairs ``a != b`` with ``l_ab``
  finite, and takes the dot product of histograms.  That is exactly ``K`` above with
  ``node_kernel=DiracNode(label)`` and ``edge_kernel=DiracEdge()``: no factor of 2
  and no other correction.  ``with_labels=False`` is ``node_kernel=None``.
* ``grakel.ShortestPathAttr(metric=f)`` sums ``f(x_a, x_c) f(x_b, x_d) [l_ab == l_cd]``
  over the same ordered pairs: ``K`` with ``edge_kernel=DiracEdge()`` and
  ``k_v = f``; with ``f`` the Gaussian ``exp(-||x - y||^2 / (2 sigma^2))`` it equals
  ``GaussianNode(col, sigma=sigma)`` (its default ``f`` is the dot product, which is
  not one of our vertex kernels).
* GraKeL reads weights from an adjacency matrix in which 0 means "no edge"; a
  graphkern edge of weight 0 is an edge of length 0.
* A definition over *unordered* paths ``{a, b}`` with an orientation-symmetrised
  walk kernel ``k(a,c)k(b,d) + k(a,d)k(b,c)`` gives exactly ``K / 2``.

How it is computed
------------------
Shortest paths of a whole list of graphs come from one compiled pass, parallel over the graphs
(graphkern/_cpu/spgk_paths.pyx): breadth-first search for unweighted graphs, Dijkstra
otherwise, each pair's length taken from the search of its smaller endpoint.  Negative weights
are an error.  They are stored as unordered paths ``a < b`` in the packed batch of the last few
lists of graphs (vertex features and path arrays, with their GPU copies), kept on the kernel
object and keyed on the graphs' identity and the label columns the vertex kernel reads (a
Graph's arrays are read-only; a column changes by replacement): a repeated call on the same
graphs packs and uploads nothing.

With Dirac kernels only (``DiracNode`` factors or none, ``DiracEdge``), ``method="auto"`` uses
the explicit feature map instead (:mod:`graphkern.spgk.features`): ``K`` is a product of
triplet-count matrices, the same numbers exactly, at a cost growing with N P + N^2 F rather
than N^2 P^2.

``K`` is evaluated from the unordered paths as
``2 * sum_{a<b} sum_{c<d} k_e * (V[a,c] V[b,d] + V[a,d] V[b,c])`` with the vertex-kernel
matrix ``V`` computed once per pair of graphs (the FCSP scheme), which is the
definition above regrouped.  ``method`` picks the algorithm:

=================== ===== ========================================================
``"naive"``         CPU   Algorithm 1: four loops over vertices, ``k_v`` inside
``"fcsp"``          CPU   ``V`` once per pair, then the walk over both path arrays;
                          one thread (the sequential reference for speed-ups)
``"openmp_in"``     CPU   FCSP, the threads share one pair (outer paths split)
``"openmp_out"``    CPU   FCSP, the threads share the pairs (dynamic schedule)
``"gpu_1d"``        GPU   per pair: vertex kernel, walk with a thread per path of
                          the larger graph, reduction, copy back
``"gpu_2d"``        GPU   as gpu_1d with a thread per pair of paths
``"gpu_1d_overlap"``GPU   gpu_1d on several streams: one pair's reduction and
``"gpu_2d_overlap"``      copy overlap the next pairs' kernels
``"gpu_batched"``   GPU   many pairs per launch, a block per pair, ``V`` in shared
                          memory; the fastest for many small graphs
``"features"``      both  the explicit feature map (Dirac kernels only, see below)
``"auto"``                features for Dirac kernels; otherwise openmp_out on
                          the CPU (fcsp with one thread), gpu_batched on the
                          GPU, the hybrid split for "hybrid"
=================== ===== ========================================================

``cpu_walk`` picks how fcsp and openmp_out walk a pair: over both path arrays (``"edges"``, the
paper's loop, two gathers of ``V`` per path pair), or with one graph's lengths as a dense matrix
(``"dense"``: ``sum_c V[a,c] sum_d k_e(l_ab, L[c,d]) V[b,d]`` over whole rows, +inf where there is
no path, run 8 doubles wide with AVX-512 and 4 with AVX2, with the rows of ``V`` exponentiated in
vector registers too; Dirac and Brownian bridge length kernels, graphs of up to 256 vertices);
``"auto"`` (the default) takes the dense walk, on a CPU with AVX2 or AVX-512, where its entries
cost less than the path pairs (without AVX2 the dense walk runs, correctly, but no faster than the
edge walk, so auto keeps the edges).  Its speed per core is what lets the hybrid's CPU side take
a useful share.

``backend="hybrid"`` launches gpu_batched on every pair, heaviest first, and while it runs the
calling thread takes pairs from the light end with all cores but one (openmp_out, ``cpu_walk``), in steps of
up to ~1 ms, each first lowering a limit in device memory (copied on a side stream) that the
kernel's blocks read before each pair; the blocks report their progress to mapped host memory,
and the two sides meet where that progress reaches the CPU's claim
(:func:`share_from_both_ends`).  The meeting point is thus measured in every call, on the
pairs being computed, with no threshold or rate carried between calls: light pairs are where a
GPU is least efficient per unit of work (each block pays a fixed cost per pair), so the CPU's
share saves the GPU more time than its share of the work, and where the CPU is too slow to help
it simply takes little.  The GPU needs no host thread while it runs, so the calling thread is
one of the CPU's workers.

Precision: sums are accumulated in float64 everywhere.  With ``dtype=float32`` the
vertex-kernel matrix, the continuous labels and the products are float32 (path lengths
stay float64, so ``DiracEdge`` compares exact lengths).  Backends and methods agree to
rounding (a relative 1e-12 or so in float64), not bit for bit: they sum in different
orders.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np

from graphkern._backend import resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._progress import Progress
from graphkern.convert import as_graphs
from graphkern.graph import require_valid_all
from graphkern.spgk import features
from graphkern.spgk.batch import BATCH_CACHE_SIZE, Batch, BatchCache, pair_work
from graphkern.spgk.cpu import CPU_METHODS, CPU_WALKS, run_cpu
from graphkern.spgk.gpu import GPU_METHODS, GpuRunner
from graphkern.spgk.hybrid import run_hybrid
from graphkern.basekernels.shortest_path import DiracEdge, EdgeKernel, NodeKernel

# the explicit feature map of Dirac kernels (graphkern.spgk.features), on the CPU or the GPU
FEATURES = "features"
METHODS = ("auto", FEATURES) + CPU_METHODS + GPU_METHODS
BACKENDS = ("auto", "cpu", "gpu", "hybrid")


# --------------------------------------------------------------------------- the kernel

class ShortestPathKernel:
    """The shortest-path graph kernel ``K(G, G')`` (see the module docstring for the definition).

    Parameters (keyword-only, stored as given, checked when the kernel is used)
    ----------
    node_kernel : NodeKernel or None
        Vertex kernel: :class:`DiracNode`, :class:`GaussianNode` or a product of them
        (``DiracNode('element') * GaussianNode('charge', sigma=1)``).  ``None``: every
        vertex pair scores 1 (unlabeled graphs).
    edge_kernel : EdgeKernel or None
        Kernel on path lengths: :class:`DiracEdge` (``None`` means this),
        :class:`GaussianEdge`, :class:`BrownianBridgeEdge`.
    normalize : bool
        Return ``K_ij / sqrt(K_ii K_jj)`` (0 where a graph has no paths).
    backend : "auto", "cpu", "gpu" or "hybrid"
        ``"auto"``: the GPU when one is usable (or when ``method`` is a GPU method), else the CPU.
    device : int or None
        The GPU to use (one device).
    n_threads : int or None
        CPU threads (None: all cores, honouring OMP_NUM_THREADS).
    method : str
        The algorithm (module docstring table); ``"auto"`` picks the feature map for Dirac kernels
        (on the CPU or the GPU by ``backend``; "hybrid" runs it on the GPU), else openmp_out /
        gpu_batched / the hybrid split.
    dtype : float64 or float32
        Precision of the vertex-kernel matrix and its products; sums are float64.  The feature
        map is exact in float64 whatever ``dtype`` says.
    cpu_walk : "auto", "edges" or "dense"
        How ``fcsp`` and ``openmp_out`` (and the hybrid's CPU side) walk a pair (module docstring):
        over both graphs' path arrays, or over one graph's lengths as a dense matrix (no gathers).
        Same values to rounding.
    verbose : bool or callable
        Progress of long Gram matrices (:class:`graphkern._progress.Progress`): a bar of pairs
        (entries with the feature map) done, their rate and the ETA; a callable gets
        ``(done, total)`` instead.

    A pair of huge graphs is slow on the pairwise methods (the walk is O(n^4) in the vertices):
    a call whose heaviest pair visits ``LONG_PAIR_WORK`` (1e11) path pairs or more warns first
    (RuntimeWarning); with Dirac kernels the feature map, O(n^2 log n) per graph, serves it.

    Attributes
    ----------
    X_fit_ : list of Graph
        The graphs given to :meth:`fit`.
    method_, backend_ : str
        What the last call ran.
    hybrid_split_ : dict
        The last hybrid call's split: pairs and work on each side, the CPU's steps and busy
        seconds, the GPU kernel's seconds (CUDA events), the whole call's, and the lightest
        pair's work left to the GPU.

    Between calls the object keeps the packed batches (shortest paths, labels, or triplet counts)
    of the last few lists of graphs, with their GPU copies (device memory); they go with their
    graphs, and ``set_params`` drops them.

    Examples
    --------
    >>> k = ShortestPathKernel(node_kernel=DiracNode("element"), edge_kernel=BrownianBridgeEdge(c=3))
    >>> K = k(graphs)                     # Gram matrix, only the upper triangle computed
    >>> K_test = k.fit(train).transform(test)
    """

    _PARAMS = ("node_kernel", "edge_kernel", "normalize", "backend", "device", "n_threads", "method", "dtype",
               "cpu_walk", "verbose")

    def __init__(self, *, node_kernel=None, edge_kernel=None, normalize=False, backend="auto", device=None,
                 n_threads=None, method="auto", dtype=np.float64, cpu_walk="auto", verbose=False):
        self.node_kernel = node_kernel
        self.edge_kernel = edge_kernel
        self.normalize = normalize
        self.backend = backend
        self.device = device
        self.n_threads = n_threads
        self.method = method
        self.dtype = dtype
        self.cpu_walk = cpu_walk
        self.verbose = verbose
        self.__setstate__({})

    # ---- scikit-learn manners
    def get_params(self, deep=True):
        return {name: getattr(self, name) for name in self._PARAMS}

    def set_params(self, **params):
        for name, value in params.items():
            if name not in self._PARAMS:
                raise ValueError(f"invalid parameter {name!r} for ShortestPathKernel; "
                                 f"valid parameters: {', '.join(self._PARAMS)}")
            setattr(self, name, value)
        self._drop_batches()
        return self

    def __sklearn_tags__(self):
        """scikit-learn tags: a transformer of lists of graphs (not 2-D arrays) that ignores ``y``."""
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags
        return Tags(estimator_type=None, target_tags=TargetTags(required=False), transformer_tags=TransformerTags(),
                    input_tags=InputTags(two_d_array=False))

    def __repr__(self):
        defaults = inspect.signature(ShortestPathKernel.__init__).parameters
        changed = [f"{k}={getattr(self, k)!r}" for k in self._PARAMS
                   if getattr(self, k) is not defaults[k].default and getattr(self, k) != defaults[k].default]
        return f"ShortestPathKernel({', '.join(changed)})"

    def __getstate__(self):
        state = self.__dict__.copy()
        # weakrefs and device memory do not pickle; the caches are rebuilt on use
        for cache in ("_batches", "_gpu", "_counts"):
            state.pop(cache, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._batches = BatchCache(BATCH_CACHE_SIZE)
        self._counts = BatchCache(BATCH_CACHE_SIZE)  # TripletCounts of the last lists of graphs
        self._gpu = None  # (key, _GpuRunner) of the last GPU call

    def _drop_batches(self):
        """Forget the packed batches (and their device copies) and the GPU runner."""
        self._batches.clear()
        self._counts.clear()
        self._gpu = None
        self.__dict__.pop("_fitted", None)

    def fit(self, X, y=None):
        """Remember the graphs ``X`` (validated); ``transform`` compares new graphs with them.

        With the feature map (Dirac kernels, ``method`` "auto" or "features") their features and
        the vocabulary of triplets are made here, once."""
        self.X_fit_ = _graphs(X, "X")
        self.__dict__.pop("_fitted", None)
        cfg = self._config()
        if cfg["method"] == FEATURES:
            counts = self._triplets(self.X_fit_, "X", cfg)
            self._fitted = (counts, _vocabulary(counts, cfg))
        else:
            require_valid_all(self.X_fit_)
        return self

    def transform(self, Y, *, out=None):
        """``K(Y, X_fit_)``, shape ``(len(Y), len(X_fit_))`` (written into ``out`` when given)."""
        if not hasattr(self, "X_fit_"):
            raise AttributeError("this ShortestPathKernel is not fitted yet: call fit(X) first")
        return self._gram(_graphs(Y, "Y"), self.X_fit_, out, fitted=True)

    def fit_transform(self, X, y=None):
        return self.fit(X)(self.X_fit_)

    def __call__(self, X, Y=None, *, out=None):
        """The kernel matrix ``K(X, Y)``, ``(len(X), len(Y))``; ``Y=None`` computes only the upper
        triangle of ``K(X, X)``.  ``out``: a float64 array (or memory-mapped file) of that shape to
        write ``K`` into, returned."""
        X = _graphs(X, "X")
        return self._gram(X, None if Y is None else _graphs(Y, "Y"), out)

    def diag(self, X):
        """``K(x, x)`` for each graph of ``X`` (never normalised)."""
        X = _graphs(X, "X")
        cfg = self._config()
        if cfg["method"] == FEATURES:
            return self._triplets(X, "X", cfg).self_dot.copy()
        A = self._batch(X, "X", cfg)
        idx = np.arange(len(X), dtype=np.int64)
        return self._execute(cfg, A, A, idx, idx)

    def features(self, X):
        """The explicit features of ``X``: a scipy.sparse CSR matrix (int64 counts), one row per
        graph, one column per triplet of the fitted graphs (:attr:`feature_names_`); ``K(X, Y) =
        features(X) @ features(Y).T`` over the fitted vocabulary.  Triplets the fitted graphs lack
        are not columns.  An unfitted kernel is fitted on ``X`` first.  Needs Dirac kernels."""
        X = _graphs(X, "X")
        cfg = self._config()
        if cfg["method"] != FEATURES:
            raise ValueError(f"features() needs DiracNode factors (or no node kernel), DiracEdge and method 'auto' or "
                             f"'features'; this kernel has node_kernel={self.node_kernel!r}, "
                             f"edge_kernel={self.edge_kernel!r}, method={self.method!r}")
        if getattr(self, "_fitted", None) is None:
            self.fit(X)
        return self._fitted[1].matrix(self._triplets(X, "X", cfg)).copy()

    @property
    def feature_names_(self):
        """The columns of :meth:`features`: one ``(labels of a, labels of b, length)`` each, where a
        label tuple holds the vertex's values of the DiracNode columns (``feature_label_columns_``)."""
        if getattr(self, "_fitted", None) is None:
            raise AttributeError("feature_names_ exists after fit() with Dirac kernels")
        return self._fitted[1].names()

    @property
    def feature_label_columns_(self):
        if getattr(self, "_fitted", None) is None:
            raise AttributeError("feature_label_columns_ exists after fit() with Dirac kernels")
        return self._fitted[1].columns

    # ---- configuration
    def _config(self):
        node_kernel, edge_kernel = self.node_kernel, self.edge_kernel
        if node_kernel is not None and not isinstance(node_kernel, NodeKernel):
            raise TypeError(f"node_kernel must be DiracNode, GaussianNode, ProductNode or None, got {node_kernel!r}")
        if edge_kernel is None:
            edge_kernel = DiracEdge()
        if not isinstance(edge_kernel, EdgeKernel):
            raise TypeError(f"edge_kernel must be DiracEdge, GaussianEdge, BrownianBridgeEdge or None, "
                            f"got {edge_kernel!r}")
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {self.normalize!r}")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {self.backend!r}")
        if not isinstance(self.cpu_walk, str) or self.cpu_walk not in CPU_WALKS:
            raise ValueError(f"cpu_walk must be one of {', '.join(map(repr, CPU_WALKS))}; got {self.cpu_walk!r}")
        dtype = resolve_dtype(self.dtype)
        n_threads = resolve_threads(self.n_threads)
        method, backend = self.method, self.backend
        if method == FEATURES or (method == "auto" and features.applies(node_kernel, edge_kernel)):
            if not features.applies(node_kernel, edge_kernel):
                raise ValueError(f"method 'features' needs DiracNode factors (or no node kernel) and DiracEdge; got "
                                 f"node_kernel={node_kernel!r}, edge_kernel={edge_kernel!r}")
            # the feature map on the GPU also serves "hybrid": the CPU has no share worth taking
            backend = resolve_backend("gpu" if backend == "hybrid" else backend, allowed=BACKENDS)
            device = resolve_devices(self.device)[0] if backend == "gpu" else None
            return dict(node_kernel=node_kernel, edge_kernel=edge_kernel, dtype=dtype, n_threads=n_threads,
                        method=FEATURES, backend=backend, device=device, cpu_walk=self.cpu_walk)
        if backend == "auto":
            if method in GPU_METHODS:
                backend = "gpu"
            elif method in CPU_METHODS:
                backend = "cpu"
        backend = resolve_backend(backend, allowed=BACKENDS)
        if backend == "cpu":
            if method in GPU_METHODS:
                raise ValueError(f"method {method!r} runs on the GPU but backend='cpu'; CPU methods: "
                                 f"{', '.join(CPU_METHODS)}")
            if method == "auto":
                method = "fcsp" if n_threads == 1 else "openmp_out"
        elif backend == "gpu":
            if method in CPU_METHODS:
                raise ValueError(f"method {method!r} runs on the CPU but backend='gpu'; GPU methods: "
                                 f"{', '.join(GPU_METHODS)}")
            if method == "auto":
                method = "gpu_batched"
        else:
            if method not in ("auto", "gpu_batched"):
                raise ValueError(f"backend='hybrid' splits pairs between openmp_out and gpu_batched; "
                                 f"method must be 'auto', got {method!r}")
            method = "hybrid"
        device = None
        if backend in ("gpu", "hybrid"):
            devices = resolve_devices(self.device)
            if len(devices) != 1:
                raise ValueError(f"ShortestPathKernel uses one GPU; got device={self.device!r}")
            device = devices[0]
        return dict(node_kernel=node_kernel, edge_kernel=edge_kernel, dtype=dtype, n_threads=n_threads,
                    method=method, backend=backend, device=device, cpu_walk=self.cpu_walk)

    def _batch(self, graphs, name, cfg):
        """The packed batch of ``graphs``: the last calls' one when nothing it depends on changed."""
        node_kernel = cfg["node_kernel"]

        def build():
            return Batch(graphs, node_kernel, lambda k: _graph_name(graphs, name, k), cfg["n_threads"])

        return self._batches.get(graphs, node_kernel, build)

    def _triplets(self, graphs, name, cfg):
        """The :class:`features.TripletCounts` of ``graphs``: the last calls' when unchanged."""
        def build():
            return features.TripletCounts(graphs, cfg["node_kernel"], cfg["n_threads"],
                                          lambda k: _graph_name(graphs, name, k),
                                          device=cfg["device"] if cfg["backend"] == "gpu" else None)

        return self._counts.get(graphs, cfg["node_kernel"], build)

    # ---- evaluation
    def _gram(self, X, Y, out=None, fitted=False):
        cfg = self._config()
        out = _check_out(out, len(X), len(X) if Y is None else len(Y))
        if cfg["method"] == FEATURES:
            return self._gram_features(cfg, X, Y, out, fitted)
        if out is not None:
            out[...] = self._gram(X, Y)
            return out
        A = self._batch(X, "X", cfg)
        B = A if Y is None else self._batch(Y, "Y", cfg)
        pa, pb = A.pairs(None if Y is None else B)
        _warn_if_long(A, B, pa, pb, X if Y is None else Y)
        with Progress(len(pa), self.verbose, "pairs", "ShortestPathKernel") as bar:
            if self.verbose and cfg["method"] in CPU_METHODS:  # in chunks of pairs, to report on
                values = np.empty(len(pa))
                for i in range(0, len(pa), _PROGRESS_CHUNK):
                    values[i:i + _PROGRESS_CHUNK] = self._execute(cfg, A, B, pa[i:i + _PROGRESS_CHUNK],
                                                                  pb[i:i + _PROGRESS_CHUNK])
                    bar.update(len(values[i:i + _PROGRESS_CHUNK]))
            else:  # the batch's own pair arrays: a GPU launch plan made of them is kept
                values = self._execute(cfg, A, B, pa, pb)
                bar.update(len(pa))
        K = np.zeros((len(X), len(B)))
        K[pa, pb] = values
        if Y is None:
            K[pb, pa] = values
        self.method_, self.backend_ = cfg["method"], cfg["backend"]
        if not self.normalize:
            return K
        if Y is None:
            dx = dy = np.diag(K).copy()
        else:
            ix, iy = np.arange(len(X), dtype=np.int64), np.arange(len(Y), dtype=np.int64)
            dx = self._execute(cfg, A, A, ix, ix)
            dy = self._execute(cfg, B, B, iy, iy)
        features.scale_tile(K, dx, dy)
        return K

    def _gram_features(self, cfg, X, Y, out, fitted):
        """``K(X, Y)`` (``Y`` None: ``K(X, X)``) as a product of feature matrices; ``fitted``: ``Y``
        is ``X_fit_``, whose vocabulary and features :meth:`fit` made."""
        if fitted and getattr(self, "_fitted", None) is not None:
            cy, vocab = self._fitted
        else:
            cy = self._triplets(X if Y is None else Y, "X" if Y is None else "Y", cfg)
            vocab = _vocabulary(cy, cfg)
        if fitted:  # transform: the rows are the new graphs, the columns the fitted ones
            cx = self._triplets(X, "Y", cfg)
        else:
            cx, cy = (cy, cy) if Y is None else (self._triplets(X, "X", cfg), cy)
        on_device = cfg["backend"] == "gpu"
        A, B = (vocab.matrix(c, cfg["device"] if on_device else None) for c in (cx, cy))
        shape = (A.shape[0], B.shape[0])
        out = np.empty(shape) if out is None else out
        scale = (cx.self_dot, cy.self_dot) if self.normalize else None
        symmetric = Y is None and not fitted
        self.method_, self.backend_ = FEATURES, cfg["backend"]
        with Progress(shape[0] * shape[1], self.verbose, "entries", "ShortestPathKernel") as bar:
            if on_device:
                from graphkern.spgk.features_gpu import features_gram

                return features_gram(cfg["device"], A, B, out, symmetric=symmetric, scale=scale, progress=bar,
                                     n_threads=cfg["n_threads"])
            return features.gram_cpu(A, B, out, symmetric=symmetric, n_threads=cfg["n_threads"], scale=scale,
                                     progress=bar)

    def _runner(self, cfg):
        """The GPU runner for this call's device, dtype and edge kernel: the last call's if they match."""
        edge = cfg["edge_kernel"]
        key = (cfg["device"], cfg["dtype"].str, edge.code, edge.parameter)
        if self._gpu is None or self._gpu[0] != key:
            self._gpu = (key, GpuRunner(cfg["device"], cfg["dtype"], edge))
        return self._gpu[1]

    def _execute(self, cfg, A, B, pa, pb):
        method = cfg["method"]
        if method in CPU_METHODS:
            return run_cpu(method, A, B, pa, pb, cfg["edge_kernel"], cfg["n_threads"], cfg["dtype"], cfg["cpu_walk"])
        if method in GPU_METHODS:
            return self._runner(cfg).run(method, A, B, pa, pb)
        out, self.hybrid_split_ = run_hybrid(self._runner(cfg), cfg, A, B, pa, pb)
        return out


# verbose CPU calls report after each this many pairs
_PROGRESS_CHUNK = 4096
# a pair of graphs whose walk visits this many path pairs takes minutes on one core: the walk is
# O(P^2) = O(n^4) for graphs of n vertices (5,000 vertices: 1.6e14 path pairs, hours)
LONG_PAIR_WORK = 1e11


def _warn_if_long(A, B, pa, pb, graphs):
    """Warn before a call whose heaviest pair alone visits LONG_PAIR_WORK path pairs or more."""
    if len(pa) == 0:
        return
    work = pair_work(A, B, pa, pb)
    k = int(np.argmax(work))
    if work[k] < LONG_PAIR_WORK:
        return
    g = int(pa[k])
    warnings.warn(f"ShortestPathKernel: the pairwise walk of graph {g} ({int(A.n_nodes[g])} vertices, "
                  f"{int(A.n_paths[g])} shortest paths) with graph {int(pb[k])} visits {work[k]:.2g} path pairs "
                  f"(O(n^4) in the vertices; total {work.sum():.2g}): expect minutes to hours.  With DiracNode "
                  "factors and DiracEdge the feature map (method='auto') costs O(n^2 log n) per graph instead",
                  RuntimeWarning, stacklevel=4)


def _graphs(X, name):
    """``X`` as a list of Graph (:func:`as_graphs`) without its structure check: every route reads
    the graphs' row pointers and column indices only after :func:`features.pack`'s compiled pass
    has checked them, and a second pass, in NumPy, would cost more than the packing."""
    return as_graphs(X, name, validate=False)


def _vocabulary(counts, cfg):
    """The vocabulary learned from ``counts`` (made once; the device's counting numbers it on the way)."""
    vocab = counts.cache.get("vocabulary")
    if vocab is None:
        vocab = counts.cache["vocabulary"] = features.Vocabulary(counts, features.label_columns(cfg["node_kernel"]))
    return vocab


def _graph_name(graphs, name, k):
    g = graphs[k]
    return f"{name}[{k}]" + (f" ({g.name!r})" if g.name is not None else "")


def _check_out(out, rows, cols):
    """``out`` when it can hold the ``(rows, cols)`` float64 kernel matrix (None stays None)."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy array or memory map, got {type(out).__name__}")
    if out.shape != (rows, cols) or out.dtype != np.float64 or not out.flags.writeable:
        raise ValueError(f"out must be a writeable float64 array of shape {(rows, cols)}; got {out.dtype} "
                         f"{out.shape}{'' if out.flags.writeable else ', read-only'}")
    return out


