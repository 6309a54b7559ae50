"""The marginalized graph kernel (Kashima et al. 2003; Tang & de Jong 2019).

For graphs G (n vertices) and G' (n' vertices) the kernel is

    K(G, G') = p_x^T (D_x V_x^-1 - A_x (.) E_x)^-1 D_x q_x

over the n n' vertex pairs of the product graph, with

* ``A_x = A (x) A'`` the Kronecker product of the weighted adjacency matrices (self-loops
  included; an unweighted graph has weights 1);
* ``E_x[(i,i'), (j,j')] = edge_kernel(e_ij, e'_i'j')`` and
  ``V_x = diag(node_kernel(v_i, v'_i'))``;
* ``D_x = diag(d (x) d')`` with ``d_i = sum_j A_ij + q``: adding the stopping probability
  q keeps the system well posed for isolated vertices and single-vertex graphs;
* ``q_x = q 1`` (q the same at every vertex) and ``p_x = p (x) p'`` with p the same at
  every vertex: ``p="uniform"`` means ``p_i = 1`` (GraphDot's ``Uniform(1.0)``); a positive
  number ``c`` means ``p_i = c``.  With uniform p, K grows with the graphs' sizes; pass
  ``normalize=True`` for ``K_ij / sqrt(K_ii K_jj)``.

Unlabeled graphs (``Constant(1.0)`` for both kernels) give the geometric random-walk kernel.
For valid hyperparameters (vertex kernel values in (0, 1], edge kernel values in [0, 1],
0 < q < 1) the system matrix is symmetric and strictly diagonally dominant with a positive
diagonal, hence positive definite; both backends solve it by conjugate gradients
preconditioned with ``D_x V_x^-1`` (Algorithm 1 of Tang et al., SC 2019), forming the
product matrix on the fly.  Vertex-kernel values below 1e-20 (a square exponential of
distant labels that underflows) are raised to 1e-20 to keep the diagonal finite.

``nodal=True`` returns, for a pair, the ``n x n'`` matrix ``R[i, i'] = p_i x[i, i'] p'_i'``
where ``x`` solves the system above: the marginalized similarity of the walks that start
at the vertex pair (i, i').  Its sum is the graph-level value: ``K = p^T X p' = sum(R)``.

Convergence: CG stops when ``||r||_2 <= tol ||D_x q_x||_2``.  A pair that has not converged
after ``max_iter`` iterations raises :class:`~graphkern.errors.NotConvergedError`, whose
``pairs``, ``residuals`` and ``iterations`` name the pairs, and whose ``result`` holds
what was computed (never returned as if it had converged).  Per-call statistics are kept
in ``kernel.info_``.

Precision: float32 (the default) stores the system in single precision, so K carries a
relative error of about ``1e-7 * deg / q`` from rounding (about 1e-5 at q = 5e-4);
float64 gives ~1e-12.  CG scalars are accumulated in float64 in both.  Gradients
(``eval_gradient=True``, which is what a Gaussian process fit asks for) are computed in
float64 whatever ``dtype`` says (``gradient_dtype=None`` keeps ``dtype``, and then a result
that is not finite raises a warning): a float32 likelihood surface is too rough for L-BFGS-B.

Hyperparameters and gradients (scikit-learn's kernel conventions): the hyperparameters are
every base-kernel term of the vertex and edge kernels (``node_kernel__element__h``,
``edge_kernel__order__h``, ...), then ``p`` and ``q``; those whose bounds are ``"fixed"``
are left out of ``theta``, the logarithms of the free ones (``p`` is fixed by default: it
only scales K by p^2, and ``normalize=True`` cancels it).  ``kernel(X, Y,
eval_gradient=True)`` returns ``(K, dK)`` with ``dK[i, j, k] = dK_ij / dlog(theta_k)``,
exact up to the solver's tolerance: with ``M = D_x V_x^-1 - A_x (.) E_x`` each pair also
solves the adjoint ``M y = 1`` (one more CG solve; the GPU runs it in lockstep with the
forward one, both directions sharing each Kronecker product) and

    dK/dtheta = p^2 (y^T d(D_x q_x)/dtheta - y^T (dM/dtheta) x),

where dM/dtheta is diagonal for vertex-kernel parameters and q, and ``-A_x (.) dE_x/dtheta``
for edge-kernel parameters, contracted on the fly like the XMV (graphkern/mgk/gradient.py;
on the GPU a constant factor of the edge kernel costs no XMV: ``M x = b`` gives its
contraction as a diagonal sum).
``normalize=True`` differentiates ``K_ij / sqrt(K_ii K_jj)``.  With ``nodal=True`` the
derivatives of the node-by-node matrices are central finite differences in log(theta) (one
sided where a step would leave the valid range) with step ``max(tol, 1e-15)^(1/3)``, so
their error is of order ``tol^(2/3)``.  When scikit-learn is installed the kernel is one of
its ``Kernel``s: ``GaussianProcessRegressor(kernel=MarginalizedGraphKernel(...))`` takes a
list (or object array) of graphs as X, and the kernel combines with sklearn's kernels
(``ConstantKernel() * kernel + WhiteKernel()``).  ``clone_with_theta`` shares the packed
datasets (and device copies) with the original, so an optimizer's trials pack once.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
import time
import warnings

import numpy as np

from graphkern._backend import BACKENDS, resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._cpu import pairs as _pairs
from graphkern._progress import Progress
from graphkern.basekernels.marginalized import Kernel, bounds_key, check_bounds
from graphkern.errors import NotConvergedError
from graphkern.convert import as_graphs
from graphkern.mgk.csr import CSR_TECHNIQUE, GRADIENT_ENTRIES
from graphkern.mgk.data import DatasetCache
from graphkern.mgk.gemm import GEMM_TECHNIQUE
from graphkern.mgk.gradient import GradientPlan, finite_difference_steps, hyperparameter_specs
from graphkern.mgk.results import MGKInfo, solver_arguments
from graphkern.mgk.router import make_router
from graphkern.mgk.tiled import check_reorder, resolve_techniques

try:  # with scikit-learn the kernel is one of its Kernels (kernel algebra, isinstance checks)
    from sklearn.gaussian_process.kernels import Hyperparameter
    from sklearn.gaussian_process.kernels import Kernel as _KernelBase
except ImportError:  # pragma: no cover - exercised where scikit-learn is absent
    from collections import namedtuple

    _KernelBase = object

    class Hyperparameter(namedtuple("Hyperparameter", ("name", "value_type", "bounds", "n_elements", "fixed"))):
        """scikit-learn's hyperparameter specification, for when scikit-learn is not installed."""

        __slots__ = ()

        def __new__(cls, name, value_type, bounds, n_elements=1, fixed=None):
            if not isinstance(bounds, str) or bounds != "fixed":
                bounds = np.atleast_2d(bounds)
            if fixed is None:
                fixed = isinstance(bounds, str) and bounds == "fixed"
            return super().__new__(cls, name, value_type, bounds, n_elements, fixed)

__all__ = ["MarginalizedGraphKernel", "MGKInfo"]

_DEFAULT_TOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-10}
_DEFAULT_MAX_ITER = 2000
# a kernel keeps its pair list (16 bytes a pair), and a thread the launch plan made of it (about 48 more
# on the host and 16 on the device), up to this many pairs: a Gram matrix of 2,896 graphs, a Dask tile
# of 2,048 x 2,048; larger calls make both afresh rather than hold gigabytes between calls
_PAIRS_KEPT = 1 << 22


class MarginalizedGraphKernel(_KernelBase):
    """The marginalized graph kernel between lists of :class:`graphkern.Graph`.

    Parameters
    ----------
    node_kernel, edge_kernel : graphkern.basekernels kernel
        Vertex kernel (values in (0, 1]) and edge kernel (values in [0, 1]), e.g.
        ``TensorProduct(element=KroneckerDelta(0.5))``; ``Constant(1.0)`` ignores labels.
    p : "uniform" or float > 0
        Starting probability at every vertex (``"uniform"``: 1, as GraphDot).
    q : float in (0, 1)
        Stopping probability.  Values down to 5e-4 converge.
    tol : float or None
        CG stops at ``||r|| <= tol ||b||``; None: 1e-6 in float32, 1e-10 in float64.
    max_iter : int or None
        Most CG iterations per pair (None: 2000).
    dtype : np.float32 or np.float64
        Working precision of the solver and the type of the result.
    backend : "auto", "cpu" or "gpu"
    device : int, list of int, or None
        The GPU, or several: the tiled solver splits the Gram matrix between them.
    n_threads : int or None
        OpenMP threads of the CPU solver (None: all cores, honouring OMP_NUM_THREADS).
    normalize : bool
        Return ``K_ij / sqrt(K_ii K_jj)``.
    q_bounds, p_bounds : (low, high) or "fixed"
        Bounds of q and p for hyperparameter optimization (``theta`` holds their logarithms);
        ``"fixed"`` keeps one out of ``theta``.  Default: q in (1e-3, 1 - 1e-3) (smaller q
        means longer walks and slower solves), p fixed.
    reorder : "pbr", "rcm" or None
        Vertex order in which the GPU solver cuts graphs into octiles (graphkern.reorder);
        results do not depend on it.
    techniques : "auto", "tiled", "csr", "gemm", "core", a tiled preset name, or a dict
        The GPU solvers (graphkern.mgk.router partitions the pairs between them once per call).
        ``"auto"``: on one GPU the dense-graph GEMM solver (graphkern.mgk.gemm; constant or
        Kronecker edge kernels) for the pairs where it does less work, the CSR solver
        (graphkern.mgk.csr) for every other pair whose two graphs fit its shared memory, and
        the tiled solver (graphkern.mgk.tiled) for the rest; on several GPUs the tiled solver.
        ``"gemm"``: the GEMM solver for every pair it can take, then CSR, then core (one GPU).
        ``"csr"``: the CSR solver, the core one for pairs that do not fit (one GPU).
        ``"tiled"``: the tiled solver with every technique; a dict of tiled options
        (graphkern.mgk.tiled.TECHNIQUE_OPTIONS) or a preset of graphkern.mgk.tiled.PRESETS
        ("dense", "sparse", "adaptive", "compact", "block", "dynsched": the tiled solver with
        only some of its techniques, for benchmarks) picks them.  ``"core"``: the untiled solver
        (graphkern.mgk.core).  ``eval_gradient=True`` runs the GEMM (see ``gemm_gradients``)
        and CSR solvers' gradients where they run K ("auto" on one GPU, "gemm", "csr") and the
        core solver's for every other pair.
    gemm_gradients : bool
        Under ``techniques="auto"``, compute gradients on the GEMM solver for the pairs it takes
        (else the CSR and core solvers take them).
    gradient_solves : "sequential" or "lockstep"
        How the CSR and GEMM gradient kernels run a pair's forward and adjoint solves: one after
        the other (the adjoint from a warm start, with K's shared-memory footprint) or both at
        once (both search directions in shared memory).  Results agree within the tolerance.
    shared_queue : bool
        On several GPUs that reach each other's memory with native atomics, let them take pairs
        from one work queue (else a static split of the Gram matrix by predicted cost).
    gradient_dtype : np.float64 or None
        Working precision of ``eval_gradient=True`` calls (None: ``dtype``; then a likelihood
        surface that is not finite gives a warning).
    verbose : bool or callable
        Progress of long Gram matrices (pairs done, pairs/s, ETA; graphkern._progress): True
        shows a bar, a callable receives ``(done, total)``.

    The options above (from ``techniques`` on) are recorded in ``info_.options`` and the pairs
    each solver ran in ``info_.solvers``.

    Calling the kernel (:meth:`__call__`) returns the Gram matrix, the node-by-node matrices or
    the listed pairs, and their gradient on request.  Packing, octiles and device copies of a
    list of graphs are cached on the kernel and reused while the same graph objects are
    passed again (a content hash notices arrays edited in place).  As a scikit-learn
    transformer, ``fit(X)`` keeps the training graphs and ``transform(Y)`` returns
    ``K(Y, X_fit_)``, so the kernel drops into ``Pipeline([("mgk", kernel), ("svc",
    SVC(kernel="precomputed"))])``.  scikit-learn's kernel attributes (``theta``, ``bounds``,
    ``hyperparameters``, ``n_dims``, ``clone_with_theta``, ``get_params``/``set_params``)
    are described in the module docstring.
    """

    def __init__(self, node_kernel, edge_kernel, *, p="uniform", q=0.05, tol=None, max_iter=None,
                 dtype=np.float32, backend="auto", device=None, n_threads=None, normalize=False,
                 q_bounds=(1e-3, 1 - 1e-3), p_bounds="fixed", reorder="pbr", techniques="auto",
                 gemm_gradients=True, gradient_solves="sequential", shared_queue=True, gradient_dtype=np.float64,
                 verbose=False):
        self.node_kernel = node_kernel
        self.edge_kernel = edge_kernel
        self.p = p
        self.q = q
        self.tol = tol
        self.max_iter = max_iter
        self.dtype = dtype
        self.backend = backend
        self.device = device
        self.n_threads = n_threads
        self.normalize = normalize
        self.q_bounds = q_bounds
        self.p_bounds = p_bounds
        self.reorder = reorder
        self.techniques = techniques
        self.gemm_gradients = gemm_gradients
        self.gradient_solves = gradient_solves
        self.shared_queue = shared_queue
        self.gradient_dtype = gradient_dtype
        self.verbose = verbose
        self._settings()  # validate now so that a bad argument fails where it was written
        self.__setstate__({})  # info_ and last_engine_ appear with the first call (scikit-learn manners)

    def __getstate__(self):
        """Parameters, the label-code tables and the last call's statistics; the packed datasets
        (and their device copies) and the solver engines are rebuilt on use."""
        state = self.__dict__.copy()
        for name in ("_datasets", "_kept_pairs", "last_engine_"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_tables", {"node": {}, "edge": {}})
        self._datasets = DatasetCache()
        self._kept_pairs = None

    # ------------------------------------------------------------------ validation
    def _settings(self, gradient=False):
        """Validated settings as a dict (read afresh on each call: attributes may be changed);
        ``gradient``: of an eval_gradient=True call (its working precision)."""
        if not isinstance(self.node_kernel, Kernel):
            raise TypeError(f"node_kernel must be a graphkern.basekernels kernel, got {self.node_kernel!r}")
        if not isinstance(self.edge_kernel, Kernel):
            raise TypeError(f"edge_kernel must be a graphkern.basekernels kernel, got {self.edge_kernel!r}")
        node_program = self.node_kernel.compile()
        edge_program = self.edge_kernel.compile()
        if not node_program.is_strictly_positive():
            raise ValueError(f"node_kernel {self.node_kernel!r} can be 0 ({node_program.describe_zero()}): vertex "
                             "kernel values must lie in (0, 1] because the solver divides by them")
        if isinstance(self.p, str):
            if self.p != "uniform":
                raise ValueError(f"p must be 'uniform' or a positive number, got {self.p!r}")
            p = 1.0
        else:
            p = _positive_real(self.p, "p")
        q = _positive_real(self.q, "q")
        if not q < 1:
            raise ValueError(f"q is a stopping probability and must lie in (0, 1), got {q}")
        dtype = resolve_dtype(self.dtype)
        gradient_dtype = dtype if self.gradient_dtype is None else resolve_dtype(self.gradient_dtype)
        promoted = gradient and gradient_dtype != dtype
        if gradient:
            dtype = gradient_dtype
        tol = _DEFAULT_TOL[dtype] if self.tol is None else self.tol
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not (tol >= 0 and math.isfinite(tol)):
            raise ValueError(f"tol must be a finite number >= 0, got {self.tol!r}")
        max_iter = _DEFAULT_MAX_ITER if self.max_iter is None else self.max_iter
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive int, got {self.max_iter!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {self.backend!r}")
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True or False, got {self.normalize!r}")
        n_threads = resolve_threads(self.n_threads)
        check_bounds(self.p_bounds, "p", "MarginalizedGraphKernel")
        check_bounds(self.q_bounds, "q", "MarginalizedGraphKernel", upper=1.0)
        if not isinstance(self.q_bounds, str) and not bounds_key(self.q_bounds)[1] < 1:
            raise ValueError(f"MarginalizedGraphKernel: q_bounds must lie below 1 (q is a stopping probability), "
                             f"got {self.q_bounds!r}")
        check_reorder(self.reorder)
        if self.techniques not in (CSR_TECHNIQUE, GEMM_TECHNIQUE):
            resolve_techniques(self.techniques)
        for name in ("gemm_gradients", "shared_queue"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.gradient_solves not in GRADIENT_ENTRIES:
            raise ValueError(f"gradient_solves must be 'sequential' or 'lockstep', got {self.gradient_solves!r}")
        if not (isinstance(self.verbose, (bool, np.bool_)) or callable(self.verbose)):
            raise TypeError(f"verbose must be True, False or a callable (done, total), got {self.verbose!r}")
        options = dict(techniques=self.techniques, reorder=self.reorder, gemm_gradients=bool(self.gemm_gradients),
                       gradient_solves=self.gradient_solves, shared_queue=bool(self.shared_queue),
                       gradient_dtype=None if self.gradient_dtype is None else gradient_dtype.name)
        return dict(node_program=node_program, edge_program=edge_program, p=p, q=q, tol=float(tol),
                    max_iter=int(max_iter), dtype=dtype, n_threads=n_threads, promoted=promoted, options=options,
                    **{k: options[k] for k in ("gemm_gradients", "gradient_solves", "shared_queue")})

    # ------------------------------------------------------------------ public API
    def __call__(self, X, Y=None, eval_gradient=False, *, nodal=False, pairs=None):
        """The Gram matrix ``K[i, j] = K(X[i], Y[j])`` (``Y=None``: ``Y = X``, its upper triangle solved).

        ``nodal=True``: the node-by-node matrix of shape ``(sum of X's sizes, sum of Y's
        sizes)`` whose block (i, j) is R of the pair (module docstring); with ``pairs``,
        a list of those blocks.  ``pairs``: an ``(m, 2)`` array of (index in X, index in
        Y or X) to compute only those pairs; returns an array of m values.
        ``eval_gradient=True``: ``(K, dK)``, dK with one more axis of length ``n_dims``
        holding ``dK / dlog(theta_k)`` (exact for K, finite differences with ``nodal``).
        """
        t0 = time.perf_counter()
        if not isinstance(eval_gradient, (bool, np.bool_)):
            raise TypeError(f"eval_gradient must be True or False, got {eval_gradient!r}")
        if not isinstance(nodal, (bool, np.bool_)):
            raise TypeError(f"nodal must be True or False, got {nodal!r}")
        s = self._settings(gradient=bool(eval_gradient))
        X = _graph_list(X, "X")
        return self._evaluate(X, None if Y is None else _graph_list(Y, "Y"), eval_gradient, nodal, pairs, s, t0)

    def _evaluate(self, X, Y, eval_gradient, nodal, pairs, s, t0):
        """:meth:`__call__` on validated graph lists and settings (``t0``: when the call began)."""
        symmetric = Y is None
        Yg = X if symmetric else Y
        if eval_gradient and nodal:
            return self._nodal_gradient(X, Y, pairs, s)
        if pairs is not None:
            pair_arr = _pair_array(pairs, len(X), len(Yg), "Y" if Y is not None else "X")
        else:
            pair_arr = self._pair_list(len(X), None if symmetric else len(Yg))

        router = self._router(s)
        dsX = self._dataset(X, s)
        dsY = dsX if symmetric else self._dataset(Yg, s)
        args = solver_arguments(dsX, dsY, s)
        plan = self._gradient_plan(s, dsX, args) if eval_gradient else None
        with self._progress(len(pair_arr) + (len(X) + (0 if symmetric else len(Yg)) if self.normalize else 0)) \
                as progress:
            solved = router.solve(dsX, dsY, pair_arr, args, nodal=nodal, plan=plan, progress=progress)
            solvers = router.last_run
            problems = [(pair_arr, solved)]
            grad = plan.derivatives(solved.K, solved.gradient) if eval_gradient else None
            if self.normalize:
                diag_x, diag_y, gdiag_x, gdiag_y, extra = self._diagonals(router, args, X, Yg, dsX, dsY, pair_arr,
                                                                          solved, grad, plan, symmetric, progress)
                problems += extra
        _check_range([(pa, sol.K) for pa, sol in problems], s)

        K = solved.K
        dK = None
        if pairs is None and not nodal:
            if symmetric:
                out = _pairs.symmetric_fill(np.ascontiguousarray(K, dtype=np.float64),  # K's upper triangle
                                            np.empty((len(X),) * 2, s["dtype"] if not self.normalize else np.float64))
                if eval_gradient:
                    dK = _pairs.symmetric_fill_rows(np.ascontiguousarray(grad, dtype=np.float64),
                                                    np.empty((len(X), len(X), plan.n_free)))
            else:
                out = K.reshape(len(X), len(Yg))
                if eval_gradient:
                    dK = grad.reshape(len(X), len(Yg), plan.n_free)
            if self.normalize:
                out, dK = _normalized(out, dK, diag_x[:, None], diag_y[None, :],
                                      gdiag_x[:, None, :], gdiag_y[None, :, :])
        elif pairs is None:
            out = self._assemble_nodal(X, Yg, pair_arr, solved.nodal, symmetric, s["dtype"],
                                       (diag_x, diag_y) if self.normalize else None)
        elif nodal:
            out = [R / math.sqrt(diag_x[a] * diag_y[b]) if self.normalize else R
                   for (a, b), R in zip(pair_arr.tolist(), solved.nodal)]
        else:
            out, dK = K, grad
            if self.normalize:
                a, b = pair_arr[:, 0], pair_arr[:, 1]
                out, dK = _normalized(out, dK, diag_x[a], diag_y[b], gdiag_x[a], gdiag_y[b])
        if not nodal:
            with np.errstate(over="ignore", under="ignore"):
                out = out.astype(s["dtype"], copy=False)
            _check_range([(pair_arr if out.ndim == 1 else None, out)], s, rounded=True)

        self._record(router, s, pair_arr, dsX, dsY, solved, t0, solvers)
        self._check_converged(problems, s, out)
        if not eval_gradient:
            return out
        with np.errstate(over="ignore", under="ignore"):
            dK = dK.astype(s["dtype"], copy=False)
        if not s["promoted"] and s["dtype"] != np.float64 and not (np.all(np.isfinite(out))
                                                                   and np.all(np.isfinite(dK))):
            warnings.warn(f"MarginalizedGraphKernel: K or its gradient is not finite in {s['dtype'].name}; "
                          "leave gradient_dtype=np.float64 (the default) for gradient-based fits",
                          RuntimeWarning, stacklevel=2)
        return out, dK

    def diag(self, X):
        """``K(X[i], X[i])`` for every graph (ones when ``normalize=True``)."""
        t0 = time.perf_counter()
        s = self._settings()
        X = _graph_list(X, "X")
        if self.normalize:
            return np.ones(len(X), dtype=s["dtype"])
        idx = np.arange(len(X), dtype=np.int64)
        return self._evaluate(X, None, False, False, np.stack([idx, idx], axis=1), s, t0)

    # ------------------------------------------------------------------ scikit-learn transformer manners
    def fit(self, X, y=None):
        """Keep the graphs ``X`` (``X_fit_``); :meth:`transform` compares new graphs with them."""
        self.X_fit_ = _graph_list(X, "X")
        return self

    def transform(self, Y):
        """``K(Y, X_fit_)``, shape ``(len(Y), len(X_fit_))``."""
        if not hasattr(self, "X_fit_"):
            raise AttributeError("this MarginalizedGraphKernel is not fitted yet: call fit(X) first")
        return self(Y, self.X_fit_)

    def fit_transform(self, X, y=None):
        """``fit(X)`` then ``K(X, X)`` (the upper triangle solved once)."""
        return self.fit(X)(self.X_fit_)

    # ------------------------------------------------------------------ scikit-learn kernel manners
    def _hyperparameter_specs(self, s=None):
        s = self._settings() if s is None else s
        return hyperparameter_specs(s["node_program"], s["edge_program"], s["p"], self.p_bounds, s["q"],
                                    self.q_bounds)

    def _free_specs(self):
        return [spec for spec in self._hyperparameter_specs() if not spec.fixed]

    @property
    def hyperparameters(self):
        """Every hyperparameter (free or fixed) as scikit-learn's ``Hyperparameter``, in theta order."""
        return [Hyperparameter(spec.name, "numeric", spec.bounds if spec.fixed else np.array(bounds_key(spec.bounds)))
                for spec in self._hyperparameter_specs()]

    @property
    def theta(self):
        """The logarithms of the free hyperparameters (setting it sets them)."""
        return np.log(np.array([spec.value for spec in self._free_specs()], dtype=np.float64))

    @theta.setter
    def theta(self, theta):
        free = self._free_specs()
        theta = np.asarray(theta, dtype=np.float64).reshape(-1)
        if len(theta) != len(free):
            raise ValueError(f"theta has {len(theta)} values but the kernel has {len(free)} free hyperparameters "
                             f"({', '.join(spec.name for spec in free) or 'none'})")
        values = {}
        for spec, t in zip(free, theta.tolist()):
            value = math.exp(t)
            # exp(log(1)) may round past a hyperparameter's closed upper limit of 1
            if not spec.upper_open and spec.upper < value <= spec.upper * (1 + 1e-12):
                value = spec.upper
            values[spec.name] = value
        self.set_params(**values)

    @property
    def bounds(self):
        """The log-bounds of the free hyperparameters, shape ``(n_dims, 2)``."""
        free = self._free_specs()
        if not free:
            return np.empty((0, 2))
        return np.log(np.array([bounds_key(spec.bounds) for spec in free], dtype=np.float64))

    @property
    def n_dims(self):
        """The number of free hyperparameters (the length of theta and of dK's last axis)."""
        return len(self._free_specs())

    @property
    def requires_vector_input(self):
        """False: X is a sequence of graphs, not a feature matrix."""
        return False

    def is_stationary(self):
        """False: the kernel is not a function of a difference of feature vectors."""
        return False

    def __sklearn_tags__(self):
        """scikit-learn tags: a transformer of lists of graphs (not 2-D arrays) that ignores ``y``."""
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags
        return Tags(estimator_type=None, target_tags=TargetTags(required=False), transformer_tags=TransformerTags(),
                    input_tags=InputTags(two_d_array=False))

    def get_params(self, deep=True):
        """The constructor's arguments; ``deep``: also the base kernels' (``node_kernel__element__h``)."""
        params = {name: getattr(self, name) for name in _init_parameter_names(type(self))}
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Kernel):
                    params.update({f"{name}__{key}": v for key, v in value.get_params(deep=True).items()})
        return params

    def set_params(self, **params):
        """Set constructor arguments or, with ``name__key``, a base kernel's; returns self."""
        valid = _init_parameter_names(type(self))
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"MarginalizedGraphKernel has no parameter {name!r}; it has {', '.join(valid)}")
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        return self

    def clone_with_theta(self, theta):
        """A copy with the free hyperparameters set to ``exp(theta)``.

        The copy shares this kernel's cache of packed datasets (and their device copies), so
        an optimizer that clones the kernel for every trial packs and uploads the graphs once.
        """
        params = {name: value.clone() if isinstance(value, Kernel) else value
                  for name, value in self.get_params(deep=False).items()}
        clone = type(self)(**params)
        clone._datasets = self._datasets
        clone._kept_pairs = self._kept_pairs
        clone._tables = self._tables
        clone.theta = theta
        return clone

    def __repr__(self):
        shown = []
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or param.kind == param.VAR_KEYWORD:
                continue
            value = getattr(self, name)
            if param.default is param.empty:
                shown.append(repr(value))
            elif name in ("p", "q") or not _same(value, param.default):
                shown.append(f"{name}={np.dtype(value).name if name == 'dtype' else repr(value)}")
        return f"{type(self).__name__}({', '.join(shown)})"

    # ------------------------------------------------------------------ gradients
    def _gradient_plan(self, s, dsX, args):
        return GradientPlan(self._hyperparameter_specs(s), s, args, {"node": dsX.node_widths, "edge": dsX.edge_widths})

    def _nodal_gradient(self, X, Y, pairs, s):
        """Nodal matrices and their derivatives by finite differences in log(theta) (module docstring)."""
        def blocks(kernel):  # the nodal matrices as a list (of one matrix without ``pairs``)
            R = kernel(X, Y, nodal=True, pairs=pairs)
            return R if pairs is not None else [R]

        R = blocks(self)
        free = self._free_specs()
        theta = self.theta
        step = max(s["tol"], 1e-15) ** (1 / 3)
        derivatives = []
        for k, spec in enumerate(free):
            total = None
            for offset, weight in finite_difference_steps(spec, step):
                if offset == 0:
                    value = R
                else:
                    shifted = theta.copy()
                    shifted[k] += offset
                    value = blocks(self.clone_with_theta(shifted))
                term = [weight * v for v in value]
                total = term if total is None else [a + b for a, b in zip(total, term)]
            derivatives.append([t / (2 * step) for t in total])
        dR = [np.stack([d[m] for d in derivatives], axis=-1).astype(s["dtype"]) if free
              else np.zeros(r.shape + (0,), s["dtype"]) for m, r in enumerate(R)]
        return (R, dR) if pairs is not None else (R[0], dR[0])

    # ------------------------------------------------------------------ helpers
    def _router(self, s):
        """The solver chains of this call (graphkern.mgk.router), kept as ``last_engine_`` (diagnostics)."""
        backend = resolve_backend(self.backend)
        devices = resolve_devices(self.device) if backend == "gpu" else None
        router = make_router(s, backend=backend, devices=devices, techniques=self.techniques, reorder=self.reorder,
                             n_threads=s["n_threads"])
        self.last_engine_ = router
        return router

    def _progress(self, total):
        """A progress report of ``total`` pairs when ``verbose`` asks for one (else no reporting)."""
        if not self.verbose:
            return contextlib.nullcontext()
        return Progress(total, self.verbose, "pairs", "MarginalizedGraphKernel")

    def _pair_list(self, n1, n2):
        """The pairs i <= j < n1 row by row (``n2`` None) or :func:`_grid_pairs`, read-only and kept for
        the next call of the same shape (the solvers keep their launch plans of such an array) up to
        ``_PAIRS_KEPT`` pairs; a larger list is made afresh (writable: no plan is kept of it)."""
        if self._kept_pairs is None or self._kept_pairs[0] != (n1, n2):
            arr = _pairs.upper_pairs(n1) if n2 is None else _grid_pairs(n1, n2)
            if len(arr) > _PAIRS_KEPT:
                self._kept_pairs = None
                return arr
            arr.flags.writeable = False
            self._kept_pairs = ((n1, n2), arr)
        return self._kept_pairs[1]

    def _dataset(self, graphs, s):
        return self._datasets.get(graphs, s["node_program"], s["edge_program"], self._tables, s["dtype"])

    def _diagonals(self, router, args, X, Yg, dsX, dsY, pair_arr, solved, grad, plan, symmetric, progress):
        """K(X[i], X[i]) and K(Y[j], Y[j]), with their dK/dlog(theta) rows when ``plan`` is given
        (zero-width otherwise), reusing the diagonal pairs already solved."""
        extra = []
        n_free = 0 if plan is None else plan.n_free

        def diagonal(ds, n, known):
            d = np.full(n, np.nan)
            gd = np.zeros((n, n_free))
            d[pair_arr[known, 0]] = solved.K[known]
            if plan is not None:
                gd[pair_arr[known, 0]] = grad[known]
            need = np.flatnonzero(np.isnan(d))
            if len(need):
                pa = np.stack([need, need], axis=1).astype(np.int64)
                sol = router.solve(ds, ds, pa, args, plan=plan, progress=progress)
                d[need] = sol.K
                if plan is not None:
                    gd[need] = plan.derivatives(sol.K, sol.gradient)
                extra.append((pa, sol))
            return d, gd

        known = np.flatnonzero(pair_arr[:, 0] == pair_arr[:, 1]) if symmetric else np.zeros(0, dtype=np.int64)
        diag_x, gdiag_x = diagonal(dsX, len(X), known)
        if symmetric:
            return diag_x, diag_x, gdiag_x, gdiag_x, extra
        diag_y, gdiag_y = diagonal(dsY, len(Yg), np.zeros(0, dtype=np.int64))
        return diag_x, diag_y, gdiag_x, gdiag_y, extra

    @staticmethod
    def _assemble_nodal(X, Yg, pair_arr, blocks, symmetric, dtype, diags):
        offx = np.concatenate([[0], np.cumsum([g.n_nodes for g in X])])
        offy = np.concatenate([[0], np.cumsum([g.n_nodes for g in Yg])])
        out = np.zeros((offx[-1], offy[-1]), dtype=dtype)
        for (a, b), R in zip(pair_arr.tolist(), blocks):
            if diags is not None:
                R = R / math.sqrt(diags[0][a] * diags[1][b])
            out[offx[a]:offx[a + 1], offy[b]:offy[b + 1]] = R
            if symmetric and a != b:
                out[offx[b]:offx[b + 1], offy[a]:offy[a + 1]] = R.T
        return out

    def _record(self, router, s, pair_arr, dsX, dsY, solved, t0, solvers):
        self.info_ = MGKInfo(
            backend=router.name, dtype=s["dtype"], pairs=pair_arr, iterations=solved.iterations,
            residuals=solved.residuals,
            graph_sizes=(dsX.n_nodes, dsY.n_nodes),
            octile_pairs=solved.octile_pairs, edge_form=s["edge_program"].edge_form()[0],
            seconds=time.perf_counter() - t0, solve_seconds=solved.seconds,
            adjoint_iterations=solved.adjoint_iterations, solvers=dict(solvers), options=dict(s["options"]),
            dtype_promoted=s["promoted"])

    @staticmethod
    def _check_converged(problems, s, result):
        bad_pairs, bad_res, bad_it = [], [], []
        for pair_arr, sol in problems:
            if not len(sol.residuals) or sol.residuals.max() <= s["tol"]:  # a NaN makes the max NaN
                continue
            bad = ~(sol.residuals <= s["tol"])
            bad_pairs.append(pair_arr[bad])
            bad_res.append(sol.residuals[bad])
            bad_it.append(sol.iterations[bad])
        pairs = np.concatenate(bad_pairs) if bad_pairs else ()
        if not len(pairs):
            return
        res = np.concatenate(bad_res)
        listed = ", ".join(f"({a}, {b}): {r:.2e}" for (a, b), r in zip(pairs[:8].tolist(), res[:8].tolist()))
        more = f" and {len(pairs) - 8} more" if len(pairs) > 8 else ""
        err = NotConvergedError(
            f"{len(pairs)} graph pair(s) did not converge within max_iter={s['max_iter']} CG iterations to "
            f"tol={s['tol']:g} (pair: relative residual): {listed}{more}; raise max_iter, or use "
            "dtype=np.float64 if the residual stalls near float32 precision")
        err.pairs = pairs
        err.residuals = res
        err.iterations = np.concatenate(bad_it)
        err.result = result
        raise err


def _check_range(problems, s, rounded=False):
    """K is positive and finite for every valid input: zeros are an underflow, inf or NaN an
    overflow of the working precision (``rounded``: of the result's dtype), told apart from
    non-convergence (graphkern.errors.NotConvergedError).  ``problems``: (pairs, K) where pairs
    is an (m, 2) array for m values, or None for a Gram matrix K (its indices are listed)."""
    for pairs, K in problems:
        K = np.asarray(K)
        if K.size == 0 or (K.min() > 0 and K.max() < np.inf):  # two reductions, no per-pair masks
            continue
        over, under = ~np.isfinite(K), K == 0
        if not (over.any() or under.any()):
            continue
        bad = over if over.any() else under
        at = np.argwhere(bad) if pairs is None else pairs[bad]
        listed = ", ".join(f"({a}, {b})" for a, b in at[:8].tolist())
        where = f" for {int(bad.sum())} pair(s) {listed}{' ...' if len(at) > 8 else ''}"
        name = f"{s['dtype'].name}{' when rounded to the result' if rounded else ''}"
        if over.any():
            raise FloatingPointError(f"K overflowed{where} in {name}: it scales with p^2 = {s['p'] * s['p']:g}; use a "
                                     "smaller p, normalize=True, or dtype=np.float64")
        raise FloatingPointError(
            f"K underflowed to 0{where} in {name}: K scales with p^2 = {s['p'] * s['p']:g} and about q (q = {s['q']:g} "
            f"shrinks the system's right-hand side D q); use a larger q or p, or dtype=np.float64")


def _normalized(K, dK, diag_x, diag_y, gdiag_x, gdiag_y):
    """``K / sqrt(K_ii K_jj)`` and its derivative ``dK / s - K~ / 2 (dK_ii / K_ii + dK_jj / K_jj)``."""
    scale = np.sqrt(diag_x * diag_y)
    Kn = K / scale
    if dK is None:
        return Kn, None
    dKn = dK / scale[..., None] - 0.5 * Kn[..., None] * (gdiag_x / diag_x[..., None] + gdiag_y / diag_y[..., None])
    return Kn, dKn


def _init_parameter_names(cls):
    """The constructor's parameter names (scikit-learn's get_params convention)."""
    return [name for name, param in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and param.kind != param.VAR_KEYWORD]


def _same(value, default):
    try:
        return value is default or bool(value == default)
    except (TypeError, ValueError):
        return False


def _positive_real(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _graph_list(graphs, name):
    """``graphs`` as a list of :class:`graphkern.Graph` (networkx and igraph graphs, RDKit
    molecules, SMILES strings converted by :func:`graphkern.convert.as_graphs`), each with at
    least one vertex."""
    graphs = as_graphs(graphs, name)
    for k, g in enumerate(graphs):
        if g.n_nodes == 0:
            raise ValueError(f"{name}[{k}] has no vertices; the marginalized graph kernel needs at least one")
    return graphs


def _grid_pairs(n1, n2):
    """Every pair (i, j), i < n1, j < n2, row by row, as one (n1 n2, 2) int64 array written in place
    (no index grids, stacking or cast: one pass over the pairs)."""
    out = np.empty((n1, n2, 2), dtype=np.int64)
    out[:, :, 0] = np.arange(n1)[:, None]
    out[:, :, 1] = np.arange(n2)
    return out.reshape(-1, 2)


def _pair_array(pairs, n_first, n_second, second_name):
    arr = np.asarray(pairs)
    if arr.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"pairs must have shape (m, 2), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"pairs must hold integer indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    for col, n, name in ((0, n_first, "X"), (1, n_second, second_name)):
        bad = (arr[:, col] < 0) | (arr[:, col] >= n)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(f"pairs[{k}] = {tuple(arr[k].tolist())}: index {arr[k, col]} is out of range for "
                             f"{name}, which has {n} graphs")
    return arr
