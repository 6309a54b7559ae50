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
float64 gives ~1e-12.  CG scalars are accumulated in float64 in both.

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
for edge-kernel parameters, contracted on the fly like the XMV (graphkern/_mgk_gradient.py;
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

import inspect
import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from graphkern._backend import BACKENDS, resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._mgk_data import DatasetCache
from graphkern._mgk_gradient import GradientPlan, finite_difference_steps, hyperparameter_specs
from graphkern._mgk_tiled import check_reorder, resolve_techniques
from graphkern.basekernels import Kernel, bounds_key, check_bounds
from graphkern.errors import NotConvergedError
from graphkern.graph import as_graph_list

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
_EDGE_FORM_CODES = {"general": 0, "constant": 1, "kronecker": 2, "sqexp": 3}


@dataclass
class MGKInfo:
    """What the last call solved: one row per pair (indices into its two graph lists)."""

    backend: str
    dtype: np.dtype
    pairs: np.ndarray = field(repr=False)       # (m, 2) int64
    iterations: np.ndarray = field(repr=False)  # (m,) int32
    residuals: np.ndarray = field(repr=False)   # (m,) relative residual ||r|| / ||b||
    product_sizes: np.ndarray = field(repr=False)  # (m,) n1 * n2
    octile_pairs: np.ndarray = field(default=None, repr=False)  # (m,) GPU only: tiles1 * tiles2
    edge_form: str = "general"
    seconds: float = 0.0
    solve_seconds: float = 0.0
    # eval_gradient=True: iterations above count both solves of a pair, these the adjoint's alone
    adjoint_iterations: np.ndarray = field(default=None, repr=False)

    @property
    def total_iterations(self):
        return int(np.sum(self.iterations, dtype=np.int64))


@dataclass
class _Solved:
    K: np.ndarray
    iterations: np.ndarray
    residuals: np.ndarray
    nodal: list | None
    octile_pairs: np.ndarray | None
    seconds: float
    gradient: np.ndarray | None = None           # (m, plan.n_raw) raw derivatives (graphkern._mgk_gradient)
    adjoint_iterations: np.ndarray | None = None


def gradient_result(K, iterations, residuals, adjoint_iterations, adjoint_residuals, raw, octile_pairs, seconds):
    """A gradient solve as a :class:`_Solved`: a pair has converged when both of its solves have."""
    return _Solved(K=K, iterations=iterations + adjoint_iterations, residuals=np.maximum(residuals, adjoint_residuals),
                   nodal=None, octile_pairs=octile_pairs, seconds=seconds, gradient=raw,
                   adjoint_iterations=adjoint_iterations)


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
    techniques : "auto", "tiled", "csr", "gemm", "core", another preset name, or a dict
        The GPU solver.  ``"auto"``: on one GPU the dense-graph solver of cuda_src/mgk_gemm.cu
        for the pairs where it does less work (graphkern._mgk_gemm: constant or Kronecker edge
        kernels), the sparse solver of cuda_src/mgk_csr.cu for every other pair whose two
        graphs fit its shared memory and the tiled solver for the rest; on several GPUs the
        tiled solver.  ``"gemm"``: the dense-graph solver for every pair it can take, the CSR
        solver (then the core one) for the rest (one GPU).  ``"tiled"``: the tiled solver with
        every technique (graphkern._mgk_tiled: PRESETS and the keys of a dict); ``"csr"``: the sparse solver,
        the core one for pairs that do not fit (one GPU); ``"core"``: the untiled solver of
        cuda_src/mgk.cu.  ``eval_gradient=True`` runs the CSR solver's gradient where it
        runs K ("auto" on one GPU, "csr"; pairs too large for it: the core solver's), and the
        core solver's otherwise.

    Calling ``kernel(X, Y=None, eval_gradient=False, *, nodal=False, pairs=None)`` returns
    the Gram matrix (``Y=None``: X against itself, solving only the upper triangle), the
    node-by-node matrices with ``nodal=True`` (see the module docstring), or only the listed
    pairs; ``eval_gradient=True`` returns ``(K, dK)`` with the derivatives by the free
    hyperparameters' logarithms on a last axis.  Packing, octiles and device copies of a
    list of graphs are cached on the kernel and reused while the same graph objects are
    passed again.  scikit-learn's kernel attributes (``theta``, ``bounds``,
    ``hyperparameters``, ``n_dims``, ``clone_with_theta``, ``get_params``/``set_params``)
    are described in the module docstring.
    """

    def __init__(self, node_kernel, edge_kernel, *, p="uniform", q=0.05, tol=None, max_iter=None,
                 dtype=np.float32, backend="auto", device=None, n_threads=None, normalize=False,
                 q_bounds=(1e-3, 1 - 1e-3), p_bounds="fixed", reorder="pbr", techniques="auto"):
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
        self._settings()  # validate now so that a bad argument fails where it was written
        self._tables = {"node": {}, "edge": {}}
        self._datasets = DatasetCache()
        self.info_ = None
        self.last_engine_ = None

    # ------------------------------------------------------------------ validation
    def _settings(self):
        """Validated settings as a dict (read afresh on each call: attributes may be changed)."""
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
        if self.n_threads is not None:
            resolve_threads(self.n_threads)
        check_bounds(self.p_bounds, "p", "MarginalizedGraphKernel")
        check_bounds(self.q_bounds, "q", "MarginalizedGraphKernel", upper=1.0)
        if not isinstance(self.q_bounds, str) and not bounds_key(self.q_bounds)[1] < 1:
            raise ValueError(f"MarginalizedGraphKernel: q_bounds must lie below 1 (q is a stopping probability), "
                             f"got {self.q_bounds!r}")
        check_reorder(self.reorder)
        if not _is_csr(self.techniques) and not _is_gemm(self.techniques):
            resolve_techniques(self.techniques)
        return dict(node_program=node_program, edge_program=edge_program, p=p, q=q, tol=float(tol),
                    max_iter=int(max_iter), dtype=dtype)

    # ------------------------------------------------------------------ public API
    def __call__(self, X, Y=None, eval_gradient=False, *, nodal=False, pairs=None):
        """The Gram matrix ``K[i, j] = K(X[i], Y[j])`` (``Y=None``: ``Y = X``, symmetric).

        ``nodal=True``: the node-by-node matrix of shape ``(sum of X's sizes, sum of Y's
        sizes)`` whose block (i, j) is R of the pair (module docstring); with ``pairs``,
        a list of those blocks.  ``pairs``: an ``(m, 2)`` array of (index in X, index in
        Y or X) to compute only those pairs; returns an array of m values.
        ``eval_gradient=True``: ``(K, dK)``, dK with one more axis of length ``n_dims``
        holding ``dK / dlog(theta_k)`` (exact for K, finite differences with ``nodal``).
        """
        t0 = time.perf_counter()
        s = self._settings()
        X = _graph_list(X, "X")
        Y = None if Y is None else _graph_list(Y, "Y")
        symmetric = Y is None
        Yg = X if symmetric else Y
        if not isinstance(nodal, (bool, np.bool_)):
            raise TypeError(f"nodal must be True or False, got {nodal!r}")
        if not isinstance(eval_gradient, (bool, np.bool_)):
            raise TypeError(f"eval_gradient must be True or False, got {eval_gradient!r}")
        if eval_gradient and nodal:
            return self._nodal_gradient(X, Y, pairs, s)
        if pairs is not None:
            pair_arr = _pair_array(pairs, len(X), len(Yg), "Y" if Y is not None else "X")
        elif symmetric:
            i, j = np.triu_indices(len(X))
            pair_arr = np.stack([i, j], axis=1).astype(np.int64)
        else:
            i, j = np.indices((len(X), len(Yg)))
            pair_arr = np.stack([i.ravel(), j.ravel()], axis=1).astype(np.int64)

        engine = self._engine(s)
        if eval_gradient and not hasattr(engine, "solve_gradient"):
            engine = self._core_engine(s)
        #: the solver engine of the last call (its ``last_run`` says where the pairs ran; diagnostics)
        self.last_engine_ = engine
        dsX = self._dataset(X, s)
        dsY = dsX if symmetric else self._dataset(Yg, s)
        plan = self._gradient_plan(s, dsX, dsY) if eval_gradient else None
        solved = _solve(engine, dsX, dsY, pair_arr, nodal, plan)
        problems = [(pair_arr, solved)]
        grad = plan.derivatives(solved.K, solved.gradient) if eval_gradient else None

        if self.normalize:
            diag_x, diag_y, gdiag_x, gdiag_y, extra = self._diagonals(engine, X, Yg, dsX, dsY, pair_arr, solved,
                                                                      grad, plan, symmetric)
            problems += extra

        K = solved.K
        dK = None
        if pairs is None and not nodal:
            if symmetric:
                out = np.empty((len(X), len(X)))
                out[pair_arr[:, 0], pair_arr[:, 1]] = K
                out[pair_arr[:, 1], pair_arr[:, 0]] = K
                if eval_gradient:
                    dK = np.empty((len(X), len(X), plan.n_free))
                    dK[pair_arr[:, 0], pair_arr[:, 1]] = grad
                    dK[pair_arr[:, 1], pair_arr[:, 0]] = grad
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
            out = out.astype(s["dtype"], copy=False)

        self._record(engine, s, pair_arr, dsX, dsY, solved, t0)
        self._check_converged(problems, s, out)
        return (out, dK.astype(s["dtype"], copy=False)) if eval_gradient else out

    def diag(self, X):
        """``K(X[i], X[i])`` for every graph (ones when ``normalize=True``)."""
        t0 = time.perf_counter()
        s = self._settings()
        X = _graph_list(X, "X")
        if self.normalize:
            return np.ones(len(X), dtype=s["dtype"])
        engine = self._engine(s)
        ds = self._dataset(X, s)
        idx = np.arange(len(X), dtype=np.int64)
        pair_arr = np.stack([idx, idx], axis=1)
        solved = engine.solve(ds, ds, pair_arr, nodal=False)
        out = solved.K.astype(s["dtype"], copy=False)
        self._record(engine, s, pair_arr, ds, ds, solved, t0)
        self._check_converged([(pair_arr, solved)], s, out)
        return out

    # ------------------------------------------------------------------ scikit-learn kernel manners
    def _hyperparameter_specs(self):
        s = self._settings()
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
    def _gradient_plan(self, s, dsX, dsY):
        args = solver_arguments(dsX, dsY, s)
        specs = hyperparameter_specs(s["node_program"], s["edge_program"], s["p"], self.p_bounds, s["q"],
                                     self.q_bounds)
        return GradientPlan(specs, s, args, {"node": dsX.node_widths, "edge": dsX.edge_widths})

    def _nodal_gradient(self, X, Y, pairs, s):
        """Nodal matrices and their derivatives by finite differences in log(theta) (module docstring)."""
        R = self(X, Y, nodal=True, pairs=pairs)
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
                    value = self.clone_with_theta(shifted)(X, Y, nodal=True, pairs=pairs)
                term = [weight * v for v in value] if pairs is not None else weight * value
                total = term if total is None else (
                    [a + b for a, b in zip(total, term)] if pairs is not None else total + term)
            derivatives.append([t / (2 * step) for t in total] if pairs is not None else total / (2 * step))
        dtype = s["dtype"]
        if pairs is not None:
            shapes = [r.shape + (len(free),) for r in R]
            dR = [np.stack([d[m] for d in derivatives], axis=-1).astype(dtype) if free else np.zeros(shape, dtype)
                  for m, shape in enumerate(shapes)]
            return R, dR
        dR = np.stack(derivatives, axis=-1).astype(dtype) if free else np.zeros(R.shape + (0,), dtype)
        return R, dR

    # ------------------------------------------------------------------ helpers
    def _engine(self, s):
        if resolve_backend(self.backend) == "gpu":
            devices = resolve_devices(self.device)
            if _is_csr(self.techniques):
                from graphkern._mgk_csr import csr_engine
                return csr_engine(devices, s)
            if _is_gemm(self.techniques):
                from graphkern._mgk_gemm import gemm_engine
                return gemm_engine(devices, s)
            from graphkern._mgk_tiled import tiled_engine
            engine = tiled_engine(devices, s, techniques=self.techniques, reorder=self.reorder,
                                  n_threads=self.n_threads)
            if engine is None:  # techniques="core"
                return self._core_engine(s)
            if self.techniques in (None, "auto") and len(devices) == 1:
                # the GEMM solver for the pairs where it does less work (dense graphs), the CSR
                # solver where a pair fits its shared memory (5-9x the tiled one on the sparse
                # H200 sets), the tiled solver for the rest
                from graphkern._mgk_csr import CSRGPUEngine
                from graphkern._mgk_gemm import GEMMGPUEngine
                return GEMMGPUEngine(devices[0], s, fallback=CSRGPUEngine(devices[0], s, fallback=engine),
                                     by_cost=True)
            return engine
        return self._core_engine(s)

    def _core_engine(self, s):
        """The CG solvers: graphkern._cpu.mgk, or graphkern._mgk_gpu on one GPU (both compute gradients)."""
        backend = resolve_backend(self.backend)
        if backend == "gpu":
            devices = resolve_devices(self.device)
            if len(devices) != 1:
                raise ValueError(f"device: the core solver (techniques='core', and every eval_gradient=True call) "
                                 f"runs on one GPU; got {devices}")
            from graphkern._mgk_gpu import GPUEngine
            return GPUEngine(devices[0], s)
        return _CPUEngine(resolve_threads(self.n_threads), s)

    def _dataset(self, graphs, s):
        return self._datasets.get(graphs, s["node_program"], s["edge_program"], self._tables, s["dtype"])

    def _diagonals(self, engine, X, Yg, dsX, dsY, pair_arr, solved, grad, plan, symmetric):
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
                sol = _solve(engine, ds, ds, pa, False, plan)
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

    def _record(self, engine, s, pair_arr, dsX, dsY, solved, t0):
        self.info_ = MGKInfo(
            backend=engine.name, dtype=s["dtype"], pairs=pair_arr, iterations=solved.iterations,
            residuals=solved.residuals,
            product_sizes=dsX.n_nodes[pair_arr[:, 0]] * dsY.n_nodes[pair_arr[:, 1]],
            octile_pairs=solved.octile_pairs, edge_form=s["edge_program"].edge_form()[0],
            seconds=time.perf_counter() - t0, solve_seconds=solved.seconds,
            adjoint_iterations=solved.adjoint_iterations)

    @staticmethod
    def _check_converged(problems, s, result):
        bad_pairs, bad_res, bad_it = [], [], []
        for pair_arr, sol in problems:
            bad = ~(sol.residuals <= s["tol"])
            bad_pairs.append(pair_arr[bad])
            bad_res.append(sol.residuals[bad])
            bad_it.append(sol.iterations[bad])
        pairs = np.concatenate(bad_pairs)
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


class _CPUEngine:
    """Runs the Cython solver (graphkern._cpu.mgk) over a list of pairs."""

    name = "cpu"

    def __init__(self, n_threads, s):
        self.n_threads = n_threads
        self.s = s

    def _arguments(self, ds1, ds2, pair_arr):
        """``(g1, g2, arguments)``: the pairs' graph indices and the argument list both Cython entry
        points begin with (the two sets, the pairs, the programs, the hyperparameters)."""
        s = self.s
        dt = s["dtype"]
        args = solver_arguments(ds1, ds2, s)
        g1 = np.ascontiguousarray(pair_arr[:, 0], dtype=np.int64)
        g2 = np.ascontiguousarray(pair_arr[:, 1], dtype=np.int64)
        return g1, g2, (ds1.node_offsets, ds1.rowptr, ds1.indices, ds1.weights, ds1.degree, ds1.node_features,
                ds1.edge_features,
                ds2.node_offsets, ds2.rowptr, ds2.indices, ds2.weights, ds2.degree, ds2.node_features,
                ds2.edge_features,
                g1, g2, args["ncode"], args["nparam"].astype(dt), args["ecode"], args["eparam"].astype(dt),
                args["edge_form"], args["ek_scale"], args["ek_theta"], args["ek_aux"], args["ek_slot"],
                s["q"], s["tol"], s["max_iter"], s["p"])

    def solve(self, ds1, ds2, pair_arr, *, nodal):
        from graphkern._cpu import mgk as cpu_mgk

        dt = self.s["dtype"]
        m = len(pair_arr)
        g1, g2, arguments = self._arguments(ds1, ds2, pair_arr)
        sizes = ds1.n_nodes[g1] * ds2.n_nodes[g2]
        K = np.zeros(m)
        iters = np.zeros(m, dtype=np.int32)
        resid = np.zeros(m)
        if nodal:
            nodal_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            nodal_buf = np.zeros(max(int(nodal_off[-1]), 1), dtype=dt)
        else:
            nodal_off = np.zeros(1, dtype=np.int64)
            nodal_buf = np.zeros(1, dtype=dt)
        t0 = time.perf_counter()
        cpu_mgk.solve_pairs(*arguments, K, iters, resid, nodal_buf, nodal_off, bool(nodal),
                            self.n_threads)
        seconds = time.perf_counter() - t0
        blocks = None
        if nodal:
            blocks = [nodal_buf[nodal_off[k]:nodal_off[k + 1]].reshape(ds1.n_nodes[g1[k]], ds2.n_nodes[g2[k]]).copy()
                      for k in range(m)]
        return _Solved(K=K, iterations=iters, residuals=resid, nodal=blocks, octile_pairs=None, seconds=seconds)

    def solve_gradient(self, ds1, ds2, pair_arr, plan):
        """K and the raw derivatives of :class:`graphkern._mgk_gradient.GradientPlan` for each pair."""
        from graphkern._cpu import mgk as cpu_mgk

        dt = self.s["dtype"]
        m = len(pair_arr)
        _, _, arguments = self._arguments(ds1, ds2, pair_arr)
        K = np.zeros(m)
        iters, adj_iters = np.zeros(m, dtype=np.int32), np.zeros(m, dtype=np.int32)
        resid, adj_resid = np.zeros(m), np.zeros(m)
        raw = np.zeros((m, plan.n_raw))
        nd, ct = plan.node_programs, plan.contraction_programs
        t0 = time.perf_counter()
        cpu_mgk.solve_pairs_gradient(
            *arguments,
            nd.code, nd.params.astype(dt), nd.code_off, nd.param_off,
            plan.contraction_form, plan.contraction_theta, plan.contraction_aux, plan.contraction_slot,
            ct.code, ct.params.astype(dt), ct.code_off, ct.param_off, plan.contraction_free,
            K, iters, resid, adj_iters, adj_resid, raw, self.n_threads)
        return gradient_result(K, iters, resid, adj_iters, adj_resid, raw, None, time.perf_counter() - t0)


def _solve(engine, ds1, ds2, pair_arr, nodal, plan):
    if plan is None:
        return engine.solve(ds1, ds2, pair_arr, nodal=nodal)
    return engine.solve_gradient(ds1, ds2, pair_arr, plan)


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


def solver_arguments(ds1, ds2, s):
    """The encoded programs and the edge-kernel shortcut shared by both backends."""
    for what, w1, w2 in (("node", ds1.node_widths, ds2.node_widths), ("edge", ds1.edge_widths, ds2.edge_widths)):
        if w1 != w2:
            raise ValueError(f"X and Y disagree on the width of {what} label columns: {w1} vs {w2}")
    node_program, edge_program = s["node_program"], s["edge_program"]
    ncode, nparam = node_program.encode(ds1.node_widths)
    ecode, eparam = edge_program.encode(ds1.edge_widths)
    form = edge_program.edge_form()
    out = dict(ncode=ncode, nparam=nparam, ecode=ecode, eparam=eparam, edge_form=_EDGE_FORM_CODES["general"],
               ek_scale=1.0, ek_theta=0.0, ek_aux=0.0, ek_slot=0, form_name="general")
    if form[0] == "constant":
        out.update(edge_form=_EDGE_FORM_CODES["constant"], ek_scale=form[1], form_name="constant")
    elif form[0] in ("kronecker", "sqexp"):
        transform = "category" if form[0] == "kronecker" else "raw"
        slot, width = edge_program.slots(ds1.edge_widths)[(form[3], transform)]
        if width == 1:
            out.update(edge_form=_EDGE_FORM_CODES[form[0]], ek_scale=form[1],
                       ek_theta=form[2] if form[0] == "kronecker" else 0.0,
                       ek_aux=form[2] if form[0] == "sqexp" else 0.0, ek_slot=slot, form_name=form[0])
    return out


def _is_gemm(techniques):
    """``techniques="gemm"``: the GEMM solver of graphkern/_mgk_gemm.py (not a preset of the tiled solver)."""
    return isinstance(techniques, str) and techniques == "gemm"


def _is_csr(techniques):
    """``techniques="csr"``: the CSR solver of graphkern/_mgk_csr.py (not a preset of the tiled solver)."""
    return isinstance(techniques, str) and techniques == "csr"


def _positive_real(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _graph_list(graphs, name):
    graphs = as_graph_list(graphs, name)
    for k, g in enumerate(graphs):
        if g.n_nodes == 0:
            raise ValueError(f"{name}[{k}] has no vertices; the marginalized graph kernel needs at least one")
    return graphs


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
