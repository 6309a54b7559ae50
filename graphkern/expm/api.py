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
FloatingPointError: no NaN or inf is ever returned silently (float32 included).  Underflow is
treated the same way: an answer whose largest entry is below the dtype's smallest normal number
is returned scaled to a largest entry of 1, with a negative ``info.log_scale``.

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
skewed graphs -- at least 10^6 nonzeros and a largest degree of at least 1000 times the mean --
and "none" otherwise and on the CPU, whose SpMV is not limited by L2 gathers; ``reorder="degree"``
with the CPU backend is refused.

Caching.  Validating A (symmetry, finiteness), converting it, and on the GPU uploading it and
building the SpMV plan cost more than a Lanczos run on a warm device.  So the validated matrix is
cached per user matrix (a Graph or a scipy.sparse matrix in csr, csc, coo, bsr or dia format), and
on the GPU so is its device-resident operator: A's rows on each device, the SpMV plans, the work
vectors and streams.  A later call with the same, unchanged object finds them (``info.cached``;
``info.times["setup"]`` is then near zero).  Entries hold only a weak reference to the object: a
matrix that is deleted frees its device memory.  Every call checks the content: a full 64-bit hash
of the backing arrays, computed in parallel compiled code at memory speed (a Graph, whose arrays
are read-only and its own, is known by its identity and costs nothing), so any in-place edit of A
is seen.  :func:`clear_cache` drops the entries (of A, or all of them).  At most MAX_RESIDENT matrices
keep device memory (least recently used go first), and a GPU allocation that would not fit first
evicts other matrices.  GPU calls from several threads run one at a time.

Checks.  Column indices out of range, row pointers that are not a CSR and non-finite values are
refused with a ValueError naming the entry, also for a Graph built with ``validate=False`` (on the
GPU its indices are checked on the device after the upload, on the host where that finds a problem).
A weighted A whose largest entry is huge or tiny is solved as ``scale * A`` with ``beta / scale``
(scale a power of two), so that no norm overflows or underflows; when ``beta * A`` itself overflows
float64 a FloatingPointError says so.

Scales.  The Ritz values of one Krylov space resolve each other to about eps * max|theta| only, so
the answer holds to about ``|beta| max|theta| eps`` (eps of dtype).  When that exceeds
``max(tol, RESOLVE_ULPS * eps)`` -- e.g. diag(2, 0, 4e300) with beta = -1, whose exp(-2) merges with
exp(0) -- A is split into its connected components: single vertices get the exact f(beta a_ii) x_i,
the components small enough for one space are solved together, each of the others in a space of its
own (``info.parts`` counts the pieces).  A component that is itself beyond that resolution is
returned with ``converged=False``, a RuntimeWarning and its vertices in ``info.unresolved``; it does
not set the scale of the others' values.  Ordinary matrices never pay for the split: the check reads
the Ritz values the solve already has.  A run that broke down before n steps can also have dropped,
inside one component, a part of x below rounding level next to the rest (entries under
BREAKDOWN_ULPS * eps of max|x|) that f makes the whole answer (sinh where the rest gives
sinh(0) = 0): then x is split by magnitude and f(beta A) x_big + f(beta A) x_small solved apart, each in a
Krylov space of its own scale (linearity: the sum is the answer).  And a residual below the
breakdown threshold may be a real coupling far below ||A|| (1e-24 of it, say) that f lifts into the
answer: on small problems the run is replayed on the host in float64 and, where the residual stands
above its own rounding, solved again going on through it and once more by a float64 recurrence
reorthogonalised to rounding; where the two differ beyond 100 times the resolution, the answer is
flagged.  A coupling below about sqrt(tiny) of the largest entry (1.5e-154; float32 vectors:
1.2e-38) cannot be gone through in any run, whatever A's scale (the solvers' sums of squares
underflow); what couplings below sqrt(smallest subnormal / tol) of it can add to the answer is
bounded (they are found in one compiled pass over A's values, once per matrix), and where the bound
exceeds the tolerance the answer comes with ``converged=False``, a RuntimeWarning and its vertices
in ``info.unresolved`` (graphkern.expm.replay).

sinh where beta times entries of A falls below float64's normal range (graphkern.expm.tiny): a
single vertex's sinh(beta a_ii) x_i is taken in logarithms, and where |beta| ||A||_inf <= 2^-60 the
answer is beta A x (one SpMV on the host, ``info.spmv == "host"``; the next term is below its
rounding) with |beta|, A's scale and max|x| joined in logarithms, where beta / scale itself may be
subnormal.

Every function returns ``(y, info)`` with ``info`` an :class:`ExpmInfo`.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from graphkern._backend import finite_real, resolve_backend, resolve_devices, resolve_dtype, resolve_threads
from graphkern._progress import Progress
from graphkern.expm.cache import MatrixCache, already_checked
from graphkern.expm.lanczos import (BREAKDOWN_ULPS, CsrMatrix, MatrixFunction, OutputScaling, breakdown_threshold,
                                    finish_on_host, run_lanczos)
from graphkern.expm.plans import EXCHANGES, TASK_GRIDS, VARIANTS, choose_reorder, choose_variant
from graphkern.expm.replay import (COUPLING, NOISE, UNDERFLOW, ReorthogonalLanczos, breakdown_residual,
                                   norm_floor, small_entries_share)
from graphkern.expm.tiny import linear_sinh, sinh_of_products
from graphkern._arrays import indptr_problem
from graphkern.graph import Graph, as_csr_matrix

__all__ = ["expm_multiply", "funm_multiply", "total_communicability", "ExpmInfo", "clear_cache", "cache_info"]

REORDERS = ("auto", "degree", "none")
BASIS_MODES = ("auto", "device", "host", "none")
DEFAULT_MAX_KRYLOV = 1000
NORMALIZE = (None, "n", "lambda_max")
RESOLVE_ULPS = 4096  # an answer resolved worse than max(tol, RESOLVE_ULPS * eps) is not trusted (see Scales)
DISAGREEMENT = 100.0  # how far (times the resolution) plain and reorthogonalised runs may differ
# Components beyond one Krylov space's resolution are solved one by one, up to this many solves.
MAX_SEPARATE_COMPONENTS = 64

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
        vectors; near zero when ``cached``), of which validate (the content check of A and, when not
        cached, its validation) and on the GPU upload (A's upload and device check, reordering, the
        work vectors, and the SpMV plans built while A crosses) and plan (the others); spmv (the fused
        SpMV kernels), vector (updates, basis combination), host (tridiagonal eigenproblems and
        checks), output (combining the basis, scaling y and copying it back), reorder (building the
        vertex order and the reordered operator in this call, part of setup; 0 when they were cached
        or not used), total.
    spmv: SpMV variant used ("cpu" on the CPU).  backend: "cpu" or "gpu".  devices: GPU ordinals.
    basis: basis storage mode used.  n_spmv: SpMVs run (speculative steps and a second pass included).
    reorder: vertex order the solve ran in ("degree" or "none"; see the module documentation).
    cached: the validated A (and on the GPU its device copy for these devices) came from the cache
        (see the module documentation); the SpMV plan and work vectors may still have been built.
    exchange: how several GPUs exchanged their shares ("store" or "copy"; None on one device or the CPU).
    task_grid: the grid sizing of the GPU task kernels ("tasks" or "resident"; None on the CPU).
    timeline: on the GPU, per device: its ordinal, rows, seconds in its SpMVs, in its updates, and
        waiting between its steps for the other devices (or the host), and the steps counted.
    parts: 1, or the number of pieces solved apart (each single vertex exactly, the connected components
        in Krylov spaces of their own scale) because A's scales were too far apart for one (see Scales).
    unresolved: None when every value is trusted (``converged``), else the sorted vertex indices whose
        values are not: every vertex when A was solved whole, only those of the failing components when
        it was split, so the rest of ``y`` can still be used.
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
    exchange: str | None = None
    task_grid: str | None = None
    timeline: tuple = ()
    parts: int = 1
    unresolved: np.ndarray | None = None


def expm_multiply(A, x=None, *, beta=1.0, tol=1e-10, max_krylov=None, dtype=np.float64, backend="auto",
                  device=None, n_threads=None, basis="auto", spmv="auto", check_every=4, reorder="auto",
                  exchange="auto", task_grid="tasks", verbose=False):
    """``y ~ exp(beta A) x`` for a symmetric sparse A; returns ``(y, info)``.

    Parameters
    ----------
    A : Graph, scipy.sparse matrix or networkx graph
        Symmetric, finite (NaN/inf or asymmetric input raises ValueError).  A networkx graph is
        converted on each call (:meth:`graphkern.Graph.from_networkx`: rows in ``G.nodes`` order,
        the ``weight`` attribute as weights), so nothing of it is cached between calls.
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
    exchange : "auto", "store" or "copy"
        Several GPUs: how the devices exchange their shares each step ("store": the kernels store
        into the other devices' memory, needs peer access; "copy": the host queues copies; "auto":
        "store" where possible).  ``info.exchange`` says which ran (None on one device or the CPU).
    task_grid : "tasks" or "resident"
        GPU task-driven SpMVs (rowblock, hybrid): a block per task, or at most the resident blocks
        each walking the task table.  Recorded as ``info.task_grid``.
    verbose : bool or callable
        Progress of the Lanczos steps (graphkern._progress.Progress: a bar or text line with
        True, or a callable ``(done, total)``); shown on long runs only.

    The answer is ``y * exp(info.log_scale)``; log_scale is 0 unless the answer overflows dtype.
    """
    return _run(A, x, "exp", beta=beta, tol=tol, max_krylov=max_krylov, dtype=dtype, backend=backend,
                device=device, n_threads=n_threads, basis=basis, spmv=spmv, check_every=check_every,
                reorder=reorder, exchange=exchange, task_grid=task_grid, verbose=verbose, caller="expm_multiply")


def funm_multiply(A, x, f, *, beta=1.0, tol=1e-10, max_krylov=None, dtype=np.float64, backend="auto",
                  device=None, n_threads=None, basis="auto", spmv="auto", check_every=4, reorder="auto",
                  exchange="auto", task_grid="tasks", verbose=False):
    """``y ~ f(beta A) x`` for f in {"exp", "cosh", "sinh"} or a callable; returns ``(y, info)``.

    A callable receives the eigenvalues ``z = beta * theta`` of ``beta T_m`` (float64 array) and
    must return ``f(z)``, finite, of the same shape.  Other parameters as :func:`expm_multiply`.
    """
    return _run(A, x, f, beta=beta, tol=tol, max_krylov=max_krylov, dtype=dtype, backend=backend,
                device=device, n_threads=n_threads, basis=basis, spmv=spmv, check_every=check_every,
                reorder=reorder, exchange=exchange, task_grid=task_grid, verbose=verbose, caller="funm_multiply")


def total_communicability(G, *, beta=1.0, normalize=None, tol=1e-10, max_krylov=None, dtype=np.float64,
                          backend="auto", device=None, n_threads=None, basis="auto", spmv="auto",
                          check_every=4, reorder="auto", exchange="auto", task_grid="tasks", verbose=False):
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
                reorder=reorder, exchange=exchange, task_grid=task_grid, verbose=verbose,
                caller="total_communicability", normalize=normalize)


def clear_cache(A=None):
    """Drop the cached validated matrix and device-resident operator of ``A`` (of every matrix when
    None), freeing the device memory they hold; a deleted matrix frees its entry itself."""
    from graphkern.expm.device import release_all
    with _gpu_lock:
        if A is None:
            for mat in _matrices.clear():
                mat.gpu.clear()
            release_all()
        else:
            mat = _matrices.discard(A)
            if mat is not None:
                mat.gpu.clear()


def cache_info():
    """What the cache holds: ``matrices`` (validated), ``hits``/``misses`` (lookups), ``resident``
    (device-resident operators), ``device_bytes`` (their device memory), ``uploads`` (matrix uploads
    to a device so far) and ``plans`` (SpMV plans built so far)."""
    from graphkern.expm.device import residency_info
    return {"matrices": len(_matrices), "hits": _matrices.hits, "misses": _matrices.misses, **residency_info()}


# ----------------------------------------------------------------------------- implementation

def _validate(A, n_threads, device_check=False):
    """The validated CSR of a Graph (as stored) or a scipy.sparse matrix (checked symmetric, finite).

    A Graph's own check of its column indices (``Graph.require_valid``, a host pass over them) is
    left, with ``device_check``, to the device after the upload (graphkern._cuda.csr_check; the
    host check runs only where the device finds a problem, or before host code reads the indices:
    :meth:`CsrMatrix.require_checked`); its row pointers, which the host reads to plan, are checked
    here."""
    pending = None
    if isinstance(A, Graph):
        indptr, indices, weights, n = A.indptr, A.indices, A.weights, A.n_nodes
        if device_check:
            problem = indptr_problem(indptr, len(indices))
            if problem:
                A.require_valid()  # raises, naming the graph
            pending = weakref.WeakMethod(A.require_valid)
        else:
            A.require_valid()  # the Graph's own compiled check, once per Graph
    else:  # checked whole (row pointers, indices, symmetry, values) in compiled passes
        csr, weighted = as_csr_matrix(A, name="A")
        indptr, indices, n = csr.indptr, csr.indices, csr.shape[0]
        weights = np.ascontiguousarray(csr.data, dtype=np.float64) if weighted else None
    if n > np.iinfo(np.int32).max:
        raise ValueError(f"A has {n} rows; at most 2**31 - 1 are supported (column indices are int32)")
    magnitudes = None
    if weights is not None:
        from graphkern._cpu import expm as cpu
        magnitudes = cpu.magnitude_range(weights, n_threads)
        if not math.isfinite(magnitudes[1]):
            bad = int(np.flatnonzero(~np.isfinite(weights))[0])
            raise ValueError(f"A has a non-finite value ({weights[bad]}) at stored entry {bad}")
    check = None if pending is None else (lambda: (pending() or already_checked)())
    return CsrMatrix(indptr, np.ascontiguousarray(indices, dtype=np.int32), weights, magnitudes, check)


def _lookup(A, n_threads=1):
    """``(CsrMatrix, cached)`` for A: validated once per matrix while its content is unchanged."""
    mat, cached = _matrices.get(A, lambda A: _validate(A, n_threads), n_threads)
    mat.require_checked()
    return mat, cached


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
         reorder, exchange, task_grid, verbose, caller, normalize=None, split=True, continue_breakdowns=False,
         reorthogonalise=False, dropped=None):
    options = dict(locals())
    t_start = time.perf_counter()
    fn = MatrixFunction(f)
    beta = finite_real(beta, "beta")
    tol = finite_real(tol, "tol")
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    if max_krylov is not None:
        max_krylov = _positive_int(max_krylov, "max_krylov")
    check_every = _positive_int(check_every, "check_every")
    if spmv != "auto" and spmv not in VARIANTS:
        raise ValueError(f"spmv must be 'auto' or one of {', '.join(map(repr, VARIANTS))}; got {spmv!r}")
    for name, value, allowed in (("basis", basis, BASIS_MODES), ("reorder", reorder, REORDERS),
                                 ("exchange", exchange, EXCHANGES), ("task_grid", task_grid, TASK_GRIDS)):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    dtype = resolve_dtype(dtype)
    n_threads = resolve_threads(n_threads)
    backend = resolve_backend(backend)
    if backend == "cpu" and reorder == "degree":
        raise ValueError("reorder='degree' applies to the GPU backend only (the CPU SpMV is not limited by "
                         "gathers from a small cache); use reorder='auto' or 'none' with backend='cpu'")
    devices = tuple(resolve_devices(device)) if backend == "gpu" else ()
    if backend == "gpu":  # a cached A's content is hashed on the host while the device solves
        mat, cached, unchanged = _matrices.get_speculative(A, lambda A: _validate(A, n_threads, True), n_threads)
    else:
        (mat, cached), unchanged = _lookup(A, n_threads), already_checked
    validate_seconds = time.perf_counter() - t_start
    n = mat.n
    x_unit, peak, unit_norm = _start_vector(x, n)
    # in floating point the Lanczos vectors lose their orthogonality, so a Krylov space of A's full
    # dimension is not yet the exact answer: the steps may go on past n until the estimate converges
    k_max = min(2 * n + 8, max_krylov if max_krylov is not None else DEFAULT_MAX_KRYLOV)
    if backend == "cpu":
        variant, reorder, exchange, task_grid = "cpu", "none", None, None
    else:
        variant = choose_variant(mat) if spmv == "auto" else spmv
        reorder = choose_reorder(mat) if reorder == "auto" else reorder
    linear = None
    if fn.name == "sinh" and normalize is None:
        mat.require_checked()  # the host may read A's indices (graphkern.expm.tiny)
        linear = linear_sinh(mat, beta, x_unit, peak, n_threads)
    if linear is not None:  # beta A x, one SpMV on the host (graphkern.expm.tiny)
        y, log_scale = finish_on_host(linear[0], OutputScaling(linear[1], 0.0, dtype, True, caller))
        total = time.perf_counter() - t_start
        times = {"total": total, "validate": validate_seconds, "setup": total, "spmv": 0.0, "vector": 0.0}
        return y, ExpmInfo(1, 0.0, True, False, log_scale, float("nan"), times=times, spmv="host", backend=backend,
                           devices=devices, basis="none", dtype=np.dtype(dtype).name, n_spmv=1, cached=cached,
                           reorder="none")
    call = _Call(mat, cached, fn, beta, tol, k_max, check_every, dtype, n_threads, basis, variant, reorder, backend,
                 devices, exchange, task_grid, caller, normalize, verbose, t_start)
    call.validate_seconds = validate_seconds
    if continue_breakdowns:  # only an exact zero ends the run (1 / beta_k stays finite)
        call.breakdown = 2.0 / float(np.finfo(dtype).max)
    call.reorthogonalise = reorthogonalise
    try:
        solved = _solve_once(call, x_unit, peak, unit_norm)
    except Exception:
        if unchanged():
            raise
        return _run(**options)  # A was edited in place since it was cached: the error may be the old content's
    t_wait = time.perf_counter()
    if not unchanged():  # A was edited in place since it was cached: the solve ran on its old content
        return _run(**options)
    y, info, floor = solved
    info = replace(info, times=dict(info.times, validate=info.times.get("validate", 0.0)
                                    + time.perf_counter() - t_wait))
    if floor is None:  # x = 0
        return y, info
    eps = float(np.finfo(dtype).eps)
    limit = max(tol, RESOLVE_ULPS * eps)
    # a breakdown before n steps may also have dropped a part of x below rounding level next to the
    # rest, on another component, that f makes dominant (exp of a far larger eigenvalue; sinh where the
    # rest gives 0): components carrying x are then solved apart too
    dropped_part = info.breakdown and info.krylov_dim < n
    pieces = _scale_pieces(mat, abs(beta), limit / eps) if split and (floor > limit or dropped_part) else None
    if pieces is not None:
        return _solve_pieces(mat, pieces, fn, beta, options, info, OutputScaling(0.0, 0.0, dtype, fn.scalable, caller),
                             t_start)
    small = _sub_rounding_part(x, dtype) if dropped_part else None
    if small is not None:
        return _solve_by_magnitude(small, options, info, OutputScaling(0.0, 0.0, dtype, fn.scalable, caller),
                                   mat.n, t_start)
    # a residual under rounding level of ||A|| ||x|| is taken as a breakdown; where it is a real (tiny)
    # coupling that f may amplify into the answer, the run goes on through it, unless the solvers' norm
    # of it underflows: then nothing can go on, and the answer is flagged where the coupling can change it
    # (a part of a split answer lists its bound in ``dropped``: it is judged beside the other parts)
    residual, share = breakdown_residual(mat, x_unit, info.krylov_dim, dtype, fn, call.beta) if dropped_part else (
        NOISE, None)
    if residual == COUPLING and not continue_breakdowns:
        y, again = _run(**{**options, "continue_breakdowns": True})
        # and by the host's reorthogonalised recurrence: where the two disagree, rounding decided one
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y_check, check = _run(**{**options, "continue_breakdowns": True, "reorthogonalise": True,
                                         "verbose": False, "dropped": []})
        except (FloatingPointError, OverflowError):  # no second opinion: the answer stands as it is
            y_check, check = y, again
        gap = _disagreement(y, again.log_scale, y_check, check.log_scale)
        again = replace(again, n_spmv=info.n_spmv + again.n_spmv + (check.n_spmv if check is not again else 0),
                        times=dict(again.times, total=time.perf_counter() - t_start))
        if gap > DISAGREEMENT * limit and again.converged:
            warnings.warn(f"{caller}: A couples vertices by an entry far below the rounding of the Lanczos step "
                          f"that meets it (entries of very different magnitudes): the plain and the "
                          f"reorthogonalised recurrence through it disagree by {gap:.1e} of the answer's largest "
                          f"entry; converged=False", RuntimeWarning, stacklevel=3)
            again = replace(again, converged=False, error_estimate=max(again.error_estimate, gap),
                            unresolved=np.arange(n, dtype=np.int64))
        return y, again
    # couplings below the norms' floor are dropped in any run, broken down or not: bounded the same way
    # (a run not converged or not resolved has its vertices unresolved already, those the couplings reach
    # among them)
    resolved = info.converged and floor <= limit
    small = small_entries_share(mat, x_unit, beta, fn, dtype, limit) if resolved else None
    rest = _log_normalization(normalize, n, beta * info.lambda_max)
    lifted = small is not None and _dropped_matters(options, [small + math.log(peak)], y, info.log_scale + rest)
    if residual == UNDERFLOW and dropped is not None:
        dropped.append(share[0] + math.log(peak * unit_norm))
    if residual == UNDERFLOW and dropped is None and share[0] - share[1] > math.log(limit) or lifted:
        info = _flag_underflow(info, caller, dtype)
    elif not info.converged:
        warnings.warn(f"{caller}: not converged after {info.krylov_dim} Lanczos steps (estimated relative "
                      f"error {info.error_estimate:.2e} > tol {tol:g}); raise max_krylov", RuntimeWarning, stacklevel=3)
    if floor > limit:
        warnings.warn(f"{caller}: |beta| * |lambda| reaches {floor / eps:.3g}, beyond what one Krylov space resolves "
                      f"in {dtype.name}: eigenvalues closer than {eps:.1e} of the largest merge, so the result may be "
                      f"wrong by about {floor:.1e} (relative); converged=False", RuntimeWarning, stacklevel=3)
        info = replace(info, converged=False, error_estimate=max(info.error_estimate, floor))
    if not info.converged:
        info = replace(info, unresolved=np.arange(n, dtype=np.int64))
    return y, info


def _solve_once(call, x_unit, peak, unit_norm):
    """``(y, info, floor)`` of one Lanczos run (floor None for x = 0, answered without a run)."""
    if peak == 0.0:
        return np.zeros(call.mat.n, dtype=call.dtype), call.info(None, None, 0.0, {
            "total": time.perf_counter() - call.t_start, "validate": call.validate_seconds}), None
    # the solvers run on scale * A (see CsrMatrix): beta / scale keeps beta * A
    beta, call.beta = call.beta, call.beta / call.mat.scale
    if not math.isfinite(call.beta):
        raise FloatingPointError(
            f"{call.caller}: beta * A overflows float64 (|beta| = {abs(beta):g}, largest |a_ij| about "
            f"{1.0 / call.mat.scale:.3g}): the logarithm of the answer is not representable; use a smaller beta")
    if call.backend == "cpu":
        return call.solve(x_unit, peak, unit_norm)
    with _gpu_lock:
        return call.solve(x_unit, peak, unit_norm)


def _disagreement(y, log_scale, y_other, log_scale_other):
    """``max |y e^log_scale - y_other e^log_scale_other|`` over the larger answer's largest entry (0
    where both are 0)."""
    top = max(log_scale, log_scale_other)
    with np.errstate(under="ignore", over="ignore"):
        a = np.asarray(y, dtype=np.float64) * math.exp(log_scale - top)
        b = np.asarray(y_other, dtype=np.float64) * math.exp(log_scale_other - top)
    peak = max(float(np.abs(a).max(initial=0.0)), float(np.abs(b).max(initial=0.0)))
    return float(np.abs(a - b).max()) / peak if peak > 0.0 else 0.0


def _sub_rounding_part(x, dtype):
    """The nonzero entries of ``x`` below ``BREAKDOWN_ULPS * eps`` of its largest (a bool mask), which
    a breakdown at rounding level can drop; None when there are none."""
    if x is None:
        return None
    x = np.abs(np.asarray(x, dtype=np.float64))
    small = (x > 0) & (x < BREAKDOWN_ULPS * float(np.finfo(dtype).eps) * x.max())
    return small if small.any() else None


def _solve_by_magnitude(small, options, first, scaling, n, t_start):
    """f(beta A) x as f(beta A) x_big + f(beta A) x_small (``small`` marks x_small's entries), each
    solved in its own Krylov space and summed under one log scale: a breakdown at rounding level of
    x_big's run cannot drop x_small then.  x_small's own smaller parts split again the same way."""
    x = np.asarray(options["x"], dtype=np.float64)
    bounds = []
    runs = [_run(**{**options, "x": np.where(mask, x, 0.0), "normalize": None, "dropped": bounds})
            for mask in (~small, small)]
    top = max((info.log_scale for y_part, info in runs if np.any(y_part)), default=0.0)
    y = np.zeros(n)
    for y_part, info in runs:
        if np.any(y_part):
            y += y_part.astype(np.float64) * math.exp(info.log_scale - top)
    infos = [info for _, info in runs]
    bad = [i.unresolved for i in infos if i.unresolved is not None]
    lambda_max = float(np.nanmax([i.lambda_max for i in infos]))
    flag = _dropped_matters(options, bounds, y, top)
    # x is given (the default ones has no parts to split), so there is no normalisation to apply
    y, log_scale = finish_on_host(y, OutputScaling(top, 0.0, scaling.dtype, scaling.scalable, scaling.caller))
    info = _combined_info(first, infos, t_start, log_scale=log_scale, lambda_max=lambda_max,
                          parts=max(i.parts for i in infos),
                          unresolved=np.unique(np.concatenate(bad)).astype(np.int64) if bad else None)
    return y, _flag_underflow(info, scaling.caller, scaling.dtype, n) if flag else info


def _log_normalization(normalize, n, beta_theta):
    """The log of what ``normalize`` divides the answer by (see :func:`total_communicability`), with
    ``beta_theta`` beta times the largest Ritz value."""
    return math.log(n) if normalize == "n" else beta_theta if normalize == "lambda_max" else 0.0


def _dropped_matters(options, bounds, y, top):
    """Whether a coupling that the runs of a split answer could not hold (``bounds``: logs of what each
    can add, see graphkern.expm.replay) can change ``y * exp(top)``, the answer they make together,
    beyond the tolerance.  Inside a split that is itself a part, the bounds go up to be judged there."""
    if not bounds:
        return False
    if options["dropped"] is not None:
        options["dropped"].extend(bounds)
        return False
    with np.errstate(divide="ignore"):
        size = float(np.log(np.abs(y).max())) + top if y.size else -math.inf
    eps = float(np.finfo(resolve_dtype(options["dtype"])).eps)
    return max(bounds) - size > math.log(max(options["tol"], RESOLVE_ULPS * eps))


def _flag_underflow(info, caller, dtype, n=None):
    """``info`` with ``converged=False`` and its vertices unresolved, warned: a coupling that the solvers'
    norms cannot hold can change the answer."""
    warnings.warn(f"{caller}: A couples vertices by an entry below about {norm_floor(dtype):.1e} of its largest "
                  f"|a_ij| (the square root of the smallest normal number the Lanczos norms hold): its squares "
                  f"underflow in the solvers' norms, and rescaling A does not help; the answer may be wrong (f lifts "
                  f"that coupling into it beyond the tolerance); converged=False", RuntimeWarning, stacklevel=4)
    unresolved = None if n is None else np.arange(n, dtype=np.int64)
    return replace(info, converged=False, error_estimate=max(info.error_estimate, 1.0), unresolved=unresolved)


def _combined_info(first, infos, t_start, **fields):
    """The :class:`ExpmInfo` of an answer put together from the runs ``infos`` after ``first``: the
    largest Krylov space and error estimate, converged and broken down only if every run was, the
    SpMVs of all of them; ``fields`` set the rest (scale, pieces, unresolved vertices)."""
    return replace(first, krylov_dim=max((i.krylov_dim for i in infos), default=0),
                   error_estimate=max((i.error_estimate for i in infos), default=0.0),
                   converged=all(i.converged for i in infos), breakdown=all(i.breakdown for i in infos),
                   n_spmv=first.n_spmv + sum(i.n_spmv for i in infos),
                   times=dict(first.times, total=time.perf_counter() - t_start), **fields)


def _scale_pieces(mat, beta_abs, amplification):
    """``[(kind, vertices)]`` solving A apart where one Krylov space cannot: kind 0 the single vertices
    (exact), 1 the connected components with ``|beta| ||A_c||_inf <= amplification`` (resolved in one
    space), 2 the others; None when that leaves A whole.  Only run when a solve was not resolved."""
    from scipy.sparse.csgraph import connected_components
    values = np.ones(mat.nnz) if mat.weights is None else np.abs(mat.weights)
    absolute = sp.csr_matrix((values, mat.indices, mat.indptr), shape=(mat.n, mat.n))
    count, labels = connected_components(absolute, directed=False)
    norms = np.zeros(count)
    np.maximum.at(norms, labels, np.asarray(absolute.sum(axis=1)).ravel())
    kind = np.where(norms[labels] * beta_abs <= amplification, 1, 2)
    kind[np.bincount(labels, minlength=count)[labels] == 1] = 0
    pieces = [(k, np.flatnonzero(kind == k)) for k in (0, 1)]
    # each large component in a space of its own: together, the largest would set every one's resolution
    large = np.flatnonzero(kind == 2)
    order = np.argsort(labels[large], kind="stable")
    comps = np.split(large[order], np.flatnonzero(np.diff(labels[large][order])) + 1) if large.size else []
    if len(comps) > MAX_SEPARATE_COMPONENTS:  # past that many solves, the smallest share one space
        comps.sort(key=len)
        keep = len(comps) - MAX_SEPARATE_COMPONENTS + 1
        comps = [np.sort(np.concatenate(comps[:keep]))] + comps[keep:]
    pieces = [(k, v) for k, v in pieces if v.size] + [(2, c) for c in comps]
    return None if len(pieces) == 1 and pieces[0][0] != 0 else pieces


def _solve_pieces(mat, pieces, fn, beta, options, first, scaling, t_start):
    """f(beta A) x of a block-diagonal A, each piece of :func:`_scale_pieces` on its own, combined
    under one log scale."""
    x, normalize = options["x"], options["normalize"]
    x = None if x is None else np.asarray(x, dtype=np.float64)
    data = np.ones(mat.nnz) if mat.weights is None else mat.weights
    whole = sp.csr_matrix((data, mat.indices, mat.indptr), shape=(mat.n, mat.n))
    parts, infos, bounds = [], [], []  # (vertices, y, log scale, largest eigenvalue seen, resolved)
    for kind, idx in pieces:
        xs = None if x is None else x[idx]
        if kind == 0:  # a vertex alone (no entry or a diagonal one): f(beta a_ii) x_i
            start = mat.indptr[idx]
            diag = np.zeros(len(idx))
            held = mat.indptr[idx + 1] > start
            diag[held] = 1.0 if mat.weights is None else mat.weights[start[held]]
            # the shift from the vertices whose x is not 0: a zero x_i beside a huge a_ii would set
            # the scale of every other single vertex's value and flush it to 0
            live = np.ones(len(idx), dtype=bool) if xs is None else xs != 0
            y_single, shift = np.zeros(len(idx)), 0.0
            if live.any():
                if fn.name == "sinh":
                    y_single[live], shift = sinh_of_products(beta, diag[live], None if xs is None else xs[live])
                else:
                    values, shift = fn.shifted(beta * diag[live])
                    y_single[live] = values if xs is None else values * xs[live]
            parts.append((idx, y_single, shift, float(diag.max()), True))
        else:
            y, info = _run(**{**options, "A": whole[idx][:, idx], "x": xs, "normalize": None, "split": False,
                              "dropped": bounds})
            parts.append((idx, y.astype(np.float64), info.log_scale, info.lambda_max, info.converged))
            infos.append(info)
    # log scales of 1e300 hold no O(1) part: the parts keep their magnitudes and only the shifts combine.
    # The common scale comes from the trusted parts: an unresolved one's shift may be far off.
    top = max((ls for _, y, ls, _, ok in parts if ok and np.any(y)),
              default=max((ls for _, y, ls, _, _ in parts if np.any(y)), default=0.0))
    y = np.zeros(mat.n)
    ceiling = np.inf  # an unresolved value is held to the largest trusted magnitude (it is flagged anyway)
    with np.errstate(divide="ignore"):
        exponents = [np.log(np.abs(part)) + (ls - top) for _, part, ls, _, _ in parts]
        trusted = [e.max() for e, (_, _, _, _, ok) in zip(exponents, parts) if ok and e.size]
        if trusted and max(trusted) > -np.inf:
            ceiling = max(trusted)
        for e, (idx, part, _, _, ok) in zip(exponents, parts):
            y[idx] = np.sign(part) * np.exp(e if ok else np.minimum(e, ceiling))
    bad = [idx for idx, _, _, _, ok in parts if not ok]
    unresolved = np.sort(np.concatenate(bad)).astype(np.int64) if bad else None
    lambda_max = float(np.nanmax([lam for _, _, _, lam, _ in parts]))
    rest = -_log_normalization(normalize, mat.n, beta * lambda_max)
    flag = _dropped_matters(options, bounds, y, top)
    y, log_scale = finish_on_host(y, OutputScaling(top, rest, scaling.dtype, scaling.scalable, scaling.caller))
    info = _combined_info(first, infos, t_start, log_scale=log_scale, lambda_max=lambda_max,
                          parts=sum(len(v) if k == 0 else 1 for k, v in pieces), unresolved=unresolved)
    return y, _flag_underflow(info, scaling.caller, scaling.dtype, mat.n) if flag else info


class _Call:
    """One call's resolved options, its solve and its :class:`ExpmInfo`."""

    def __init__(self, mat, cached, fn, beta, tol, k_max, check_every, dtype, n_threads, basis, variant, reorder,
                 backend, devices, exchange, task_grid, caller, normalize, verbose, t_start):
        self.mat, self.cached, self.fn, self.beta, self.tol = mat, cached, fn, beta, tol
        self.k_max, self.check_every, self.dtype, self.n_threads = k_max, check_every, dtype, n_threads
        self.basis, self.variant, self.reorder, self.backend = basis, variant, reorder, backend
        self.devices, self.exchange, self.task_grid = devices, exchange, task_grid
        self.caller, self.normalize, self.verbose, self.t_start = caller, normalize, verbose, t_start
        self.breakdown = None  # the solvers' breakdown threshold: breakdown_threshold() unless set
        self.reorthogonalise = False  # solved by graphkern.expm.replay.ReorthogonalLanczos

    def solve(self, x_unit, peak, unit_norm):
        mat, dtype = self.mat, self.dtype
        anorm = mat.inf_norm(self.n_threads)
        breakdown = self.breakdown if self.breakdown is not None else breakdown_threshold(anorm, dtype, self.tol,
                                                                                          self.beta, self.fn)
        reorder_seconds = 0.0
        if self.reorthogonalise:
            mat.require_checked()
            solver = ReorthogonalLanczos(mat, self.k_max)
        elif self.backend == "cpu":
            from graphkern.expm.cpu import CpuLanczos
            solver = CpuLanczos(mat, dtype, n_threads=self.n_threads, store_basis=self.basis != "none",
                                max_krylov=self.k_max, breakdown=breakdown)
        else:
            from graphkern.expm.gpu import GpuLanczos
            solver = GpuLanczos(mat, dtype, devices=self.devices, variant=self.variant, basis=self.basis,
                                max_krylov=self.k_max, breakdown=breakdown, n_threads=self.n_threads,
                                reorder=self.reorder, exchange=self.exchange, task_grid=self.task_grid)
            self.cached = self.cached and solver.reused
            self.exchange = solver.exchange
            reorder_seconds = solver.reorder_seconds
        solver.start(None if x_unit is None else x_unit.astype(dtype, copy=False), 1.0 / unit_norm)
        setup = time.perf_counter() - self.t_start
        with Progress(self.k_max, self.verbose, "steps", self.caller) as progress:
            out = run_lanczos(solver, self.fn, self.beta, tol=self.tol, max_krylov=self.k_max,
                              check_every=self.check_every, progress=progress)
        t_out = time.perf_counter()
        rest = math.log(peak * unit_norm) - _log_normalization(self.normalize, mat.n, self.beta * out.theta_max)
        scaling = OutputScaling(out.shift, rest, dtype, self.fn.scalable, self.caller)
        y, log_scale = solver.result(out.krylov_dim, out.g, scaling)
        times = solver.timings()
        end = time.perf_counter()
        times.update(host=out.host_seconds, setup=setup, reorder=reorder_seconds, output=end - t_out,
                     total=end - self.t_start, validate=self.validate_seconds, **solver.setup_times)
        # how far the answer is resolved: the Ritz values resolve each other to about eps * rho; a space
        # that broke down before n steps knows x's part along eigenvalues it never reached only to
        # rounding, which f may amplify as far as ||A|| allows (a norm of entries near 1e-301 in a
        # matrix scaled for a 1e300 entry even squares to an exact zero)
        reach = anorm if out.breakdown and out.krylov_dim < mat.n else out.rho
        floor = abs(self.beta) * reach * float(np.finfo(dtype).eps)
        return y, self.info(out, solver, log_scale, times), floor

    def info(self, out, solver, log_scale, times):
        times.setdefault("reorder", 0.0)
        common = dict(times=times, backend=self.backend, devices=self.devices, basis=self.basis,
                      dtype=self.dtype.name, cached=self.cached, exchange=self.exchange, task_grid=self.task_grid,
                      timeline=getattr(solver, "timeline", ()))
        if out is None:  # x = 0: y = 0, exact, no step run
            return ExpmInfo(0, 0.0, True, True, 0.0, float("nan"), spmv="none", n_spmv=0, reorder="none", **common)
        return ExpmInfo(out.krylov_dim, out.error_estimate, out.converged, out.breakdown, log_scale,
                        out.theta_max / self.mat.scale, spmv=self.variant, n_spmv=solver.n_spmv,
                        reorder=self.reorder, **common)
