"""exp(beta A) x, f(beta A) x and total communicability by Lanczos, on the CPU or one or more GPUs.

For a symmetric sparse A (a :class:`graphkern.Graph` or a square scipy.sparse matrix)::

    y, info = graphkern.expm_multiply(A, x, beta=1.0)          # y ~ exp(beta A) x
    y, info = graphkern.funm_multiply(A, x, "cosh", beta=2.0)  # y ~ cosh(beta A) x
    tc, info = graphkern.total_communicability(G, beta=1.0)    # tc = exp(beta A) 1

Method.  The Lanczos three-term recurrence builds an orthonormal basis Q_m of the Krylov space of
A and x and the tridiagonal T_m = Q_m^T A Q_m; then ``f(beta A) x ~ ||x|| Q_m f(beta T_m) e_1``,
with ``f(beta T_m) e_1 = V f(beta Theta) V^T e_1`` from the eigendecomposition of T_m on the host.
Every vector operation runs on the chosen hardware; only alpha_k, beta_k and the small coefficient
vector cross to the host, every few steps.  Stopping is a-posteriori: the run ends when successive
coefficient vectors (checked every ``check_every`` steps, less often as m grows) differ by at most
``tol`` relative to their norm (``info.error_estimate``).  A breakdown (beta_k ~ 0 relative to
||A||: x in an invariant subspace, e.g. a graph component or a sum of a few eigenvectors) ends the
run early with the exact answer (``info.breakdown``).  No reorthogonalisation is done (the result
of exp is insensitive to the loss of orthogonality that Ritz values converging cause).

Overflow.  exp(beta A) x grows like e^{beta lambda_1}, which overflows float64 beyond
beta lambda_1 ~ 709 and float32 beyond ~ 88.  The coefficients are computed shifted by the largest
Ritz value theta_1 (exp(beta T) = e^{beta theta_1} exp(beta (T - theta_1 I))).  When the answer
fits the requested dtype, ``info.log_scale == 0`` and y is the answer.  Otherwise y is the
finite scaled vector and ``info.log_scale = beta theta_1``, so that::

    y_true = y * exp(info.log_scale)       # compare or rank in log space: log y + log_scale

(for x itself near the dtype's overflow threshold, log_scale also absorbs log ||x||).  cosh and
sinh are shifted by ``max |beta theta|``.  A result that is still not finite raises
FloatingPointError: no NaN or inf is ever returned silently (float32 included).

f for :func:`funm_multiply`: "exp", "cosh", "sinh", or a callable applied elementwise to the
eigenvalues of ``beta T_m`` -- it receives ``z = beta * theta`` (a float64 array) and returns
``f(z)``, so ``funm_multiply(A, x, f, beta=b)`` computes ``f(b A) x`` for every f; a callable gets
no overflow scaling (log_scale is always 0 for it).

Backends.  ``backend="cpu"``: OpenMP SpMV and fused vector kernels (``n_threads``).
``backend="gpu"``: ``device`` (an ordinal or a list of them) -- with several devices the rows of A
are split among them by equal nonzeros and the vector is exchanged every step.  ``spmv`` picks the
GPU SpMV: "scalar" (a thread per row), "vector" (a sub-warp per row sized from the mean degree),
"rowblock" (row blocks of equal nonzeros staged in shared memory; the longest rows split over
several thread blocks), "hybrid" (rows split by degree: short ones a thread each, medium ones a
warp each, long ones whole blocks) or "auto" (from the degree statistics); the CPU has one SpMV
and ignores it.  ``basis`` chooses where the Lanczos vectors live on the GPU: "device", "host"
(streamed to pinned host memory), "none" (a second pass regenerates them; O(n) memory besides A)
or "auto" (on the device while it fits, the rest regenerated); on the CPU "none" regenerates and
the others keep them in memory.  float32 vectors accumulate dot products and norms in float64.

Vertex order (GPU only).  ``reorder="degree"`` runs the GPU solve on A' = P A P^T with the
vertices relabelled by decreasing degree (ties keep their order): on a power-law graph most
nonzeros point at a few hubs, whose entries of x then share a few cache lines that stay in L1/L2,
instead of each gather moving its own L2 sector.  Since exp(beta P A P^T) P x = P exp(beta A) x,
the answer is the same up to rounding (Lanczos on A' and Px makes the same coefficients); x is
permuted on the device on entry and y on exit, so the caller sees A's order.  The order and the
reordered operator are built once (the nonzeros are moved on the device) and cached with the
device-resident operator; ``info.reorder`` says which order ran and ``info.times["reorder"]`` what
building it cost in this call.  "none" keeps A's order; "auto" (default) takes "degree" for large
skewed graphs -- at least 10^6 nonzeros and a largest degree of at least 1000 times the mean
(on an H200 it cut R-MAT's SpMV by 10-25% and left Barabasi-Albert's unchanged) -- and "none"
otherwise and on the
CPU, whose SpMV is not limited by L2 gathers; ``reorder="degree"`` with the CPU backend is refused.

Caching.  Validating A (symmetry, finiteness), converting it, and on the GPU uploading it and
building the SpMV plan cost more than a Lanczos run on a warm device (A - A.T alone is several
passes over the nonzeros).  So the validated matrix is cached per user matrix (a Graph or a
scipy.sparse matrix in csr, csc, coo, bsr or dia format), and on the GPU so is its device-resident
operator: A's rows on each device (row pointers, column indices, values in the dtype used), the
SpMV plans, and the work vectors (basis blocks included) and streams.  A later call with the same
object finds them (``info.cached``; ``info.times["setup"]`` is then near zero).  Entries are keyed
on the object's identity and hold only a weak reference to it: a matrix that is deleted frees its
device memory.  Each call checks a fingerprint (format, shape, dtypes, the identity of every backing
array, and a strided sample of their contents), so a new matrix, replaced arrays or an in-place
edit like ``A.data *= 2`` are seen; an in-place edit that touches none of the sampled entries is
not -- call :func:`clear_cache` (with A, or with nothing to drop everything) after one.  At most
MAX_RESIDENT matrices keep device memory (least recently used go first), and a GPU allocation
that would not fit first evicts other matrices.  GPU calls from several threads run one at a time.

Every function returns ``(y, info)`` with ``info`` an :class:`ExpmInfo`.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from graphkern._backend import finite_real, resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._expm_cache import MatrixCache
from graphkern._expm_lanczos import (CpuLanczos, CsrMatrix, MatrixFunction, OutputScaling, breakdown_threshold,
                                     run_lanczos)
from graphkern.graph import Graph, as_csr_matrix

__all__ = ["expm_multiply", "funm_multiply", "total_communicability", "ExpmInfo", "clear_cache", "cache_info"]

SPMV_VARIANTS = ("scalar", "vector", "rowblock", "hybrid")
REORDERS = ("auto", "degree", "none")
BASIS_MODES = ("auto", "device", "host", "none")
DEFAULT_MAX_KRYLOV = 1000
NORMALIZE = (None, "n", "lambda_max")

_matrices = MatrixCache()
_gpu_lock = threading.RLock()  # one GPU solve at a time: they share the cached device work vectors


@dataclass(frozen=True)
class ExpmInfo:
    """What a Lanczos run did.

    krylov_dim: dimension m of the Krylov space used (after a breakdown, where it stopped).
    error_estimate: relative change of the coefficient vector over the last check interval
        (0.0 when a breakdown made the answer exact).
    converged: the estimate reached ``tol``, or a breakdown / the full space made it exact.
    breakdown: the recurrence found an invariant subspace (beta_m ~ 0) and stopped there.
    log_scale: 0.0, or the shift ``max_j beta theta_j`` (beta theta_1 for beta > 0; max |beta theta_j| for
        cosh and sinh) when the answer overflows the dtype: y_true = y * exp(log_scale).
    lambda_max: the largest Ritz value theta_1 (an estimate, from below, of A's largest eigenvalue).
    times: seconds -- setup (everything before the first Lanczos step: checking the arguments and x,
        validating A, and on the GPU uploading it, building the SpMV plan and allocating the work
        vectors; near zero when ``cached``), spmv (the fused SpMV kernels), vector (updates, basis
        combination), host (tridiagonal eigenproblems and checks), output (combining the basis,
        scaling y and copying it back), reorder (building the vertex order and the reordered operator
        in this call, part of setup; 0 when they were cached or not used), total.
    spmv: SpMV variant used ("cpu" on the CPU).  backend: "cpu" or "gpu".  devices: GPU ordinals.
    basis: basis storage mode used.  n_spmv: SpMVs run (speculative steps and a second pass included).
    reorder: vertex order the solve ran in ("degree" or "none"; see the module documentation).
    cached: the validated A (and on the GPU its device copy for these devices) came from the cache
        (see the module documentation); the SpMV plan and work vectors may still have been built.
    """

    krylov_dim: int
    error_estimate: float
    converged: bool
    breakdown: bool
    log_scale: float
    lambda_max: float
    times: dict = field(default_factory=dict)
    spmv: str = "cpu"
    backend: str = "cpu"
    devices: tuple = ()
    basis: str = "auto"
    dtype: str = "float64"
    n_spmv: int = 0
    cached: bool = False
    reorder: str = "none"


def expm_multiply(A, x=None, *, beta=1.0, tol=1e-10, max_krylov=None, dtype=np.float64, backend="auto",
                  device=None, n_threads=None, basis="auto", spmv="auto", check_every=4, reorder="auto"):
    """``y ~ exp(beta A) x`` for a symmetric sparse A; returns ``(y, info)``.

    Parameters
    ----------
    A : Graph or scipy.sparse matrix
        Symmetric, finite (NaN/inf or asymmetric input raises ValueError).
    x : array_like of length n, optional
        Start vector (default: ones).  Must be finite and not empty.
    beta : float
        Finite real scale (negative allowed).
    tol : float in (0, 1)
        A-posteriori tolerance on the relative change of the Krylov coefficients.
    max_krylov : int >= 1, optional
        Most Lanczos steps (default ``min(n, 1000)``); not converging by then warns (RuntimeWarning)
        and sets ``info.converged = False``.
    dtype : float32 or float64
        Precision of the vectors and of y.
    backend, device, n_threads, basis, spmv, check_every, reorder
        See the module documentation (reorder: "auto", "degree" or "none"; "degree" is GPU-only).

    The answer is ``y * exp(info.log_scale)``; log_scale is 0 unless the answer overflows dtype.
    """
    return _run(A, x, "exp", beta=beta, tol=tol, max_krylov=max_krylov, dtype=dtype, backend=backend,
                device=device, n_threads=n_threads, basis=basis, spmv=spmv, check_every=check_every,
                reorder=reorder, caller="expm_multiply")


def funm_multiply(A, x, f, *, beta=1.0, tol=1e-10, max_krylov=None, dtype=np.float64, backend="auto",
                  device=None, n_threads=None, basis="auto", spmv="auto", check_every=4, reorder="auto"):
    """``y ~ f(beta A) x`` for f in {"exp", "cosh", "sinh"} or a callable; returns ``(y, info)``.

    A callable receives the eigenvalues ``z = beta * theta`` of ``beta T_m`` (float64 array) and
    must return ``f(z)``, finite, of the same shape.  Other parameters as :func:`expm_multiply`.
    """
    return _run(A, x, f, beta=beta, tol=tol, max_krylov=max_krylov, dtype=dtype, backend=backend,
                device=device, n_threads=n_threads, basis=basis, spmv=spmv, check_every=check_every,
                reorder=reorder, caller="funm_multiply")


def total_communicability(G, *, beta=1.0, normalize=None, tol=1e-10, max_krylov=None, dtype=np.float64,
                          backend="auto", device=None, n_threads=None, basis="auto", spmv="auto",
                          check_every=4, reorder="auto"):
    """Total communicability ``TC = exp(beta A) 1`` of every vertex; returns ``(tc, info)``.

    normalize: None (TC itself), "n" (TC / n), or "lambda_max" (``exp(beta (A - theta_1 I)) 1``,
    TC divided by ``e^{beta theta_1}`` with theta_1 = ``info.lambda_max``, the largest Ritz value:
    bounded by ``sqrt(n)`` for beta >= 0 and never overflowing, it ranks vertices like TC).
    Other parameters as :func:`expm_multiply`.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be None, 'n' or 'lambda_max'; got {normalize!r}")
    return _run(G, None, "exp", beta=beta, tol=tol, max_krylov=max_krylov, dtype=dtype, backend=backend,
                device=device, n_threads=n_threads, basis=basis, spmv=spmv, check_every=check_every,
                reorder=reorder, caller="total_communicability", normalize=normalize)


def clear_cache(A=None):
    """Drop the cached validated matrix and device-resident operator of ``A`` (of every matrix when
    None), freeing the device memory they hold.  Needed only after an in-place edit of A that the
    fingerprint may miss (see the module documentation); a deleted matrix frees its entry itself."""
    from graphkern._expm_gpu import release_all
    with _gpu_lock:
        if A is None:
            for mat in _matrices.values():
                mat.gpu.clear()
            _matrices.clear()
            release_all()
        else:
            mat = _matrices.peek(A)
            if mat is not None:
                mat.gpu.clear()
            _matrices.discard(A)


def cache_info():
    """What the cache holds: ``matrices`` (validated), ``hits``/``misses`` (lookups), ``resident``
    (device-resident operators), ``device_bytes`` (their device memory), ``uploads`` (matrix uploads
    to a device so far) and ``plans`` (SpMV plans built so far)."""
    from graphkern._expm_gpu import residency_info
    return {"matrices": len(_matrices), "hits": _matrices.hits, "misses": _matrices.misses, **residency_info()}


# ----------------------------------------------------------------------------- implementation

def _validate(A):
    """The validated CSR of a Graph (as stored) or a scipy.sparse matrix (checked symmetric, finite)."""
    if isinstance(A, Graph):
        indptr, indices, weights, n = A.indptr, A.indices, A.weights, A.n_nodes
    else:
        csr, weighted = as_csr_matrix(A, name="A")
        indptr, indices, n = csr.indptr, csr.indices, csr.shape[0]
        weights = np.ascontiguousarray(csr.data, dtype=np.float64) if weighted else None
    if n > np.iinfo(np.int32).max:
        raise ValueError(f"A has {n} rows; at most 2**31 - 1 are supported (column indices are int32)")
    return CsrMatrix(indptr, np.ascontiguousarray(indices, dtype=np.int32), weights)


def _lookup(A):
    """``(CsrMatrix, cached)`` for A: validated once per matrix while it is unchanged."""
    return _matrices.get(A, _validate)


def _matrix(A):
    return _lookup(A)[0]


def _start_vector(x, n):
    """``(x_unit, peak, unit_norm)``: x / max|x| in float64 (None for the default x = ones, which the
    solvers make themselves), max|x| and ||x_unit||."""
    if x is None:
        if n == 0:
            raise ValueError("x is empty: A has no rows")
        return None, 1.0, math.sqrt(n)
    x = np.asarray(x)
    if x.dtype.kind == "c":
        raise TypeError("x must be real; complex vectors are not supported")
    if x.dtype.kind not in "fiub":
        raise TypeError(f"x must be a real numeric vector, got dtype {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"x must be a 1-D vector of length {n}, got shape {x.shape}")
    if x.size == 0:
        raise ValueError("x is empty: it must have one entry per row of A")
    if len(x) != n:
        raise ValueError(f"x has length {len(x)} but A has {n} rows")
    x = np.ascontiguousarray(x, dtype=np.float64)
    peak = float(np.maximum(x.max(), -x.min()))  # NaN propagates, inf shows
    if not math.isfinite(peak):
        bad = ~np.isfinite(x)
        raise ValueError(f"x contains a non-finite value ({x[bad][0]}) at index {int(np.flatnonzero(bad)[0])}")
    if peak == 0.0:
        return None, 0.0, 0.0
    x_unit = x / peak
    return x_unit, peak, float(np.linalg.norm(x_unit))


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _run(A, x, f, *, beta, tol, max_krylov, dtype, backend, device, n_threads, basis, spmv, check_every,
         reorder, caller, normalize=None):
    t_start = time.perf_counter()
    fn = MatrixFunction(f)
    beta = finite_real(beta, "beta")
    tol = finite_real(tol, "tol")
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    if max_krylov is not None:
        max_krylov = _positive_int(max_krylov, "max_krylov")
    check_every = _positive_int(check_every, "check_every")
    if basis not in BASIS_MODES:
        raise ValueError(f"basis must be one of {', '.join(map(repr, BASIS_MODES))}; got {basis!r}")
    if spmv != "auto" and spmv not in SPMV_VARIANTS:
        raise ValueError(f"spmv must be 'auto' or one of {', '.join(map(repr, SPMV_VARIANTS))}; got {spmv!r}")
    if not isinstance(reorder, str) or reorder not in REORDERS:
        raise ValueError(f"reorder must be one of {', '.join(map(repr, REORDERS))}; got {reorder!r}")
    dtype = resolve_dtype(dtype)
    n_threads = resolve_threads(n_threads)
    backend = resolve_backend(backend)
    if backend == "cpu" and reorder == "degree":
        raise ValueError("reorder='degree' applies to the GPU backend only (the CPU SpMV is not limited by "
                         "gathers from a small cache); use reorder='auto' or 'none' with backend='cpu'")
    devices = tuple(resolve_devices(device)) if backend == "gpu" else ()
    mat, cached = _lookup(A)
    n = mat.n
    x_unit, peak, unit_norm = _start_vector(x, n)
    k_max = min(n, max_krylov if max_krylov is not None else DEFAULT_MAX_KRYLOV)
    if peak == 0.0:
        times = {"total": time.perf_counter() - t_start, "reorder": 0.0}
        info = ExpmInfo(0, 0.0, True, True, 0.0, float("nan"), times, "none", backend, devices, basis, dtype.name, 0,
                        cached)
        return np.zeros(n, dtype=dtype), info
    breakdown = breakdown_threshold(mat.inf_norm(n_threads), dtype, tol, beta, fn)
    if backend == "cpu":
        return _solve(mat, cached, x_unit, peak, unit_norm, fn, beta, tol, k_max, check_every, dtype, n_threads,
                      basis, "cpu", "none", backend, devices, breakdown, caller, normalize, t_start)
    from graphkern._expm_gpu import choose_reorder, choose_variant
    variant = choose_variant(mat) if spmv == "auto" else spmv
    if reorder == "auto":
        reorder = choose_reorder(mat)
    with _gpu_lock:
        return _solve(mat, cached, x_unit, peak, unit_norm, fn, beta, tol, k_max, check_every, dtype, n_threads,
                      basis, variant, reorder, backend, devices, breakdown, caller, normalize, t_start)


def _solve(mat, cached, x_unit, peak, unit_norm, fn, beta, tol, k_max, check_every, dtype, n_threads, basis,
           variant, reorder, backend, devices, breakdown, caller, normalize, t_start):
    t0 = time.perf_counter()
    reorder_seconds = 0.0
    if backend == "cpu":
        solver = CpuLanczos(mat, dtype, n_threads=n_threads, store_basis=basis != "none", max_krylov=k_max,
                            breakdown=breakdown)
    else:
        from graphkern._expm_gpu import GpuLanczos
        solver = GpuLanczos(mat, dtype, devices=devices, variant=variant, basis=basis, max_krylov=k_max,
                            breakdown=breakdown, n_threads=n_threads, reorder=reorder)
        cached = cached and solver.reused
        reorder_seconds = solver.reorder_seconds
    solver.start(None if x_unit is None else x_unit.astype(dtype, copy=False), 1.0 / unit_norm)
    setup = t0 - t_start + time.perf_counter() - t0
    out = run_lanczos(solver, fn, beta, tol=tol, max_krylov=k_max, check_every=check_every, full_dim=mat.n)
    t_out = time.perf_counter()
    rest = math.log(peak * unit_norm)
    if normalize == "n":
        rest -= math.log(mat.n)
    elif normalize == "lambda_max":
        rest -= beta * out.theta_max
    scaling = OutputScaling(out.shift, rest, dtype, fn.scalable, caller)
    y, log_scale = solver.result(out.krylov_dim, out.g, scaling)
    times = solver.timings()
    end = time.perf_counter()
    times.update(host=out.host_seconds, setup=setup, reorder=reorder_seconds, output=end - t_out, total=end - t_start)
    info = ExpmInfo(out.krylov_dim, out.error_estimate, out.converged, out.breakdown, log_scale,
                    out.theta_max, times, variant, backend, devices, basis, dtype.name, solver.n_spmv, cached,
                    reorder)
    if not out.converged:
        warnings.warn(f"{caller}: not converged after {out.krylov_dim} Lanczos steps (estimated relative error "
                      f"{out.error_estimate:.2e} > tol {tol:g}); raise max_krylov", RuntimeWarning, stacklevel=4)
    return y, info
