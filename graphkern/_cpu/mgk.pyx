# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""Marginalized graph kernel on the CPU: diagonally preconditioned CG per pair of graphs.

OpenMP runs over pairs (``schedule(dynamic)``: pair costs differ by orders of magnitude);
every thread owns one work buffer of six vectors of the largest product size.  The
Kronecker matrix-vector product ``(A1 (x) A2 (.) E) p`` is formed on the fly from the two
CSR graphs and their edge features; the product matrix is never stored.  With an edge
kernel that ignores labels it factorizes as ``A1 P A2^T`` (``P`` the vector as an
``n1 x n2`` matrix), which costs ``n1 nnz2 + nnz1 n2`` instead of ``nnz1 nnz2``.

Vertex and edge kernels arrive as the numeric programs of graphkern.basekernels
(``code``/``params``), interpreted by :func:`eval_program`.  The CG scalars (dot
products, alpha, beta, norms) are accumulated in double in both precisions.

:func:`solve_pairs_gradient` also solves the adjoint system ``M y = 1`` of each pair (M is
symmetric) and contracts it with the solution x of ``M x = b`` into the derivatives of K:
``dK/dtheta = p^2 (y^T db/dtheta - y^T (dM/dtheta) x)``; graphkern.mgk.gradient says
which derivative programs and edge contractions it is given.
"""

from cython.parallel cimport parallel, prange, threadid
from libc.math cimport exp, expf, sqrt
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from cython cimport floating

import numpy as np

cdef enum:
    KIND_CONSTANT = 0
    KIND_KRONECKER_DELTA = 1
    KIND_SQUARE_EXPONENTIAL = 2
    KIND_KRONECKER_DELTA_DERIVATIVE = 3
    KIND_SQUARE_EXPONENTIAL_DERIVATIVE = 4

# Edge-kernel shortcuts (graphkern.mgk.gradient: EDGE_FORMS); the derivative forms are
# d/dh of the Kronecker delta (1 where the labels differ) and d^2 exp(aux d^2), the square
# exponential's derivative by its length scale up to the factor 1/length_scale^3.
cdef enum:
    EDGE_GENERAL = 0
    EDGE_CONSTANT = 1
    EDGE_KRONECKER = 2
    EDGE_SQEXP = 3
    EDGE_KRONECKER_DERIVATIVE = 4
    EDGE_SQEXP_DERIVATIVE = 5

# vectors of the per-thread work buffer
cdef enum:
    VEC_X = 0
    VEC_R = 1
    VEC_P = 2
    VEC_AP = 3
    VEC_DIAG = 4
    VEC_TMP = 5
    N_VECTORS = 6
    VEC_ADJOINT = 6       # gradient solves only: y of M y = 1
    N_GRADIENT_VECTORS = 7

# A vertex kernel that underflows (a square exponential of distant labels) would make the
# diagonal D/V infinite; flooring it keeps the system finite and changes K by < 1e-20 relative.
cdef double VERTEX_KERNEL_FLOOR = 1e-20


cdef inline floating fexp(floating v) noexcept nogil:
    if floating is float:
        return expf(v)
    else:
        return exp(v)


cdef inline floating eval_program(const int32_t* code, const floating* par, const floating* a,
                                  const floating* b) noexcept nogil:
    """The kernel value of feature rows ``a`` and ``b`` (see graphkern.basekernels for the format)."""
    cdef int n_groups = code[0]
    cdef int pos = 1, pp = 0, g, t, n_terms, kind, slot, width, c
    cdef floating total = 0, prod, d2, diff
    for g in range(n_groups):
        n_terms = code[pos]
        pos += 1
        prod = par[pp]
        pp += 1
        for t in range(n_terms):
            kind = code[pos]
            slot = code[pos + 1]
            width = code[pos + 2]
            pos += 3
            if kind == KIND_CONSTANT:
                prod = prod * par[pp]
            elif kind == KIND_KRONECKER_DELTA:
                if a[slot] != b[slot]:
                    prod = prod * par[pp]
            elif kind == KIND_KRONECKER_DELTA_DERIVATIVE:
                if a[slot] == b[slot]:
                    prod = 0
            else:
                d2 = 0
                for c in range(width):
                    diff = a[slot + c] - b[slot + c]
                    d2 = d2 + diff * diff
                if kind == KIND_SQUARE_EXPONENTIAL:
                    prod = prod * fexp(par[pp + 1] * d2)
                else:
                    prod = prod * (fexp(par[pp + 1] * d2) * d2 / (par[pp] * par[pp] * par[pp]))
            pp += 2
        total = total + prod
    return total


cdef struct EdgeForm:
    int form
    double scale
    double theta
    double aux
    int slot


cdef int64_t largest_product(const int64_t[::1] node_off1, const int64_t[::1] node_off2,
                             const int64_t[::1] pair_g1, const int64_t[::1] pair_g2) noexcept:
    """The largest ``n1 * n2`` among the pairs (at least 1): the length of each work vector."""
    cdef int64_t k, size, largest = 1
    for k in range(pair_g1.shape[0]):
        size = ((node_off1[pair_g1[k] + 1] - node_off1[pair_g1[k]])
                * (node_off2[pair_g2[k] + 1] - node_off2[pair_g2[k]]))
        if size > largest:
            largest = size
    return largest


cdef void xmv_offdiag(floating* y, const floating* x, floating* tmp,
                      int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* ef1, int fe1,
                      int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2, const floating* ef2, int fe2,
                      const EdgeForm* ek, const int32_t* ecode, const floating* epar) noexcept nogil:
    """``y = (A1 (x) A2 (.) E) x`` for vectors indexed ``i1 * n2 + i2``; ``tmp`` has ``n1 n2`` entries."""
    cdef int i1, i2, j1
    cdef int64_t k1, k2
    cdef floating acc, wa, scale
    cdef const floating* xrow
    cdef floating* yrow
    cdef floating* trow
    cdef const floating* e1
    if ek.form == EDGE_CONSTANT:
        scale = <floating>ek.scale
        # tmp[j1, i2] = sum_{j2 in N(i2)} w2 x[j1, j2]
        for j1 in range(n1):
            xrow = x + <int64_t>j1 * n2
            trow = tmp + <int64_t>j1 * n2
            for i2 in range(n2):
                acc = 0
                for k2 in range(rp2[i2], rp2[i2 + 1]):
                    acc = acc + w2[k2] * xrow[ind2[k2]]
                trow[i2] = acc
        # y[i1, i2] = scale * sum_{j1 in N(i1)} w1 tmp[j1, i2]
        for i1 in range(n1):
            yrow = y + <int64_t>i1 * n2
            memset(yrow, 0, n2 * sizeof(floating))
            for k1 in range(rp1[i1], rp1[i1 + 1]):
                wa = w1[k1] * scale
                trow = tmp + <int64_t>ind1[k1] * n2
                for i2 in range(n2):
                    yrow[i2] = yrow[i2] + wa * trow[i2]
        return
    if ek.form != EDGE_GENERAL:
        xmv_single_feature(y, x, n1, rp1, ind1, w1, ef1, fe1, n2, rp2, ind2, w2, ef2, fe2, ek)
        return
    for i1 in range(n1):
        yrow = y + <int64_t>i1 * n2
        memset(yrow, 0, n2 * sizeof(floating))
        for k1 in range(rp1[i1], rp1[i1 + 1]):
            xrow = x + <int64_t>ind1[k1] * n2
            e1 = ef1 + k1 * fe1
            wa = w1[k1]
            for i2 in range(n2):
                acc = 0
                for k2 in range(rp2[i2], rp2[i2 + 1]):
                    acc = acc + w2[k2] * eval_program(ecode, epar, e1, ef2 + k2 * fe2) * xrow[ind2[k2]]
                yrow[i2] = yrow[i2] + wa * acc


cdef void xmv_single_feature(floating* y, const floating* x,
                             int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* ef1,
                             int fe1, int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2,
                             const floating* ef2, int fe2, const EdgeForm* ek) noexcept nogil:
    """The XMV for an edge kernel ``scale * base(e1[slot], e2[slot])``: a Kronecker delta, a square
    exponential, or the derivative of either (the EDGE_* forms)."""
    cdef int i1, i2, slot = ek.slot
    cdef int64_t k1, k2
    cdef floating acc, wa, e1, diff
    cdef floating hit = <floating>ek.scale, miss = <floating>(ek.scale * ek.theta), aux = <floating>ek.aux
    cdef bint kronecker = ek.form == EDGE_KRONECKER or ek.form == EDGE_KRONECKER_DERIVATIVE
    cdef bint sqexp_derivative = ek.form == EDGE_SQEXP_DERIVATIVE
    if ek.form == EDGE_KRONECKER_DERIVATIVE:
        hit = 0
        miss = <floating>ek.scale
    cdef const floating* xrow
    cdef floating* yrow
    for i1 in range(n1):
        yrow = y + <int64_t>i1 * n2
        memset(yrow, 0, n2 * sizeof(floating))
        for k1 in range(rp1[i1], rp1[i1 + 1]):
            xrow = x + <int64_t>ind1[k1] * n2
            e1 = ef1[k1 * fe1 + slot]
            wa = w1[k1]
            if kronecker:
                for i2 in range(n2):
                    acc = 0
                    for k2 in range(rp2[i2], rp2[i2 + 1]):
                        acc = acc + w2[k2] * (hit if ef2[k2 * fe2 + slot] == e1 else miss) * xrow[ind2[k2]]
                    yrow[i2] = yrow[i2] + wa * acc
            elif sqexp_derivative:
                for i2 in range(n2):
                    acc = 0
                    for k2 in range(rp2[i2], rp2[i2 + 1]):
                        diff = e1 - ef2[k2 * fe2 + slot]
                        acc = acc + w2[k2] * (hit * fexp(aux * diff * diff) * diff * diff) * xrow[ind2[k2]]
                    yrow[i2] = yrow[i2] + wa * acc
            else:
                for i2 in range(n2):
                    acc = 0
                    for k2 in range(rp2[i2], rp2[i2 + 1]):
                        diff = e1 - ef2[k2 * fe2 + slot]
                        acc = acc + w2[k2] * (hit * fexp(aux * diff * diff)) * xrow[ind2[k2]]
                    yrow[i2] = yrow[i2] + wa * acc


cdef int conjugate_gradient(floating* work, int64_t stride, floating* x, double rz, double bnorm,
                            int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* ef1,
                            int fe1, int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2,
                            const floating* ef2, int fe2, const EdgeForm* ek, const int32_t* ecode,
                            const floating* epar, double tol, int max_iter, double* res_out) noexcept nogil:
    """CG iterations on ``M x = b`` from the state the caller set up: ``x``, the residual ``r``, the
    search direction ``p = r / m`` and ``rz = r^T p``; ``bnorm = ||b||``.  Returns the iterations."""
    cdef int64_t N = <int64_t>n1 * n2, i
    cdef int it = 0
    cdef floating* r = work + VEC_R * stride
    cdef floating* p = work + VEC_P * stride
    cdef floating* Ap = work + VEC_AP * stride
    cdef floating* m = work + VEC_DIAG * stride
    cdef floating* tmp = work + VEC_TMP * stride
    cdef floating a, bt, ri
    cdef double pAp, rr, rzn, alpha, beta, rnorm = bnorm
    while it < max_iter:
        xmv_offdiag(Ap, p, tmp, n1, rp1, ind1, w1, ef1, fe1, n2, rp2, ind2, w2, ef2, fe2, ek, ecode, epar)
        pAp = 0
        for i in range(N):
            Ap[i] = m[i] * p[i] - Ap[i]
            pAp += <double>p[i] * Ap[i]
        if not pAp > 0:  # only an exactly zero residual gets here
            break
        alpha = rz / pAp
        a = <floating>alpha
        rr = 0
        rzn = 0
        for i in range(N):
            x[i] = x[i] + a * p[i]
            ri = r[i] - a * Ap[i]
            r[i] = ri
            rr += <double>ri * ri
            rzn += <double>ri * (ri / m[i])
        it += 1
        rnorm = sqrt(rr)
        if rnorm <= tol * bnorm:
            break
        beta = rzn / rz
        rz = rzn
        bt = <floating>beta
        for i in range(N):
            p[i] = r[i] / m[i] + bt * p[i]
    res_out[0] = rnorm / bnorm if bnorm > 0 else 0.0
    return it


cdef double solve_forward(floating* work, int64_t stride,
                          int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* deg1,
                          const floating* nf1, int fv1, const floating* ef1, int fe1,
                          int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2, const floating* deg2,
                          const floating* nf2, int fv2, const floating* ef2, int fe2,
                          const int32_t* ncode, const floating* npar, const EdgeForm* ek, const int32_t* ecode,
                          const floating* epar, floating q, double tol, int max_iter,
                          int32_t* it_out, double* res_out, double p2, floating* nodal) noexcept nogil:
    """Set up the pair's system (diagonal ``m = D / V``, ``b = D q^2``) and solve ``M x = b``; returns
    ``K = p2 sum(x)``, with x left in the work buffer (and ``p2 x`` in ``nodal`` unless NULL)."""
    cdef int64_t N = <int64_t>n1 * n2, i
    cdef int i1, i2
    cdef floating* x = work + VEC_X * stride
    cdef floating* r = work + VEC_R * stride
    cdef floating* p = work + VEC_P * stride
    cdef floating* m = work + VEC_DIAG * stride
    cdef floating d, v, bi, z
    cdef double rz = 0, bb = 0, total = 0
    cdef floating floor_v = <floating>VERTEX_KERNEL_FLOOR
    for i1 in range(n1):
        for i2 in range(n2):
            i = <int64_t>i1 * n2 + i2
            d = (deg1[i1] + q) * (deg2[i2] + q)
            v = eval_program(ncode, npar, nf1 + <int64_t>i1 * fv1, nf2 + <int64_t>i2 * fv2)
            if v < floor_v:
                v = floor_v
            m[i] = d / v
            bi = d * q * q
            x[i] = 0
            r[i] = bi
            z = bi / m[i]
            p[i] = z
            rz += <double>bi * z
            bb += <double>bi * bi
    it_out[0] = conjugate_gradient(work, stride, x, rz, sqrt(bb), n1, rp1, ind1, w1, ef1, fe1,
                                   n2, rp2, ind2, w2, ef2, fe2, ek, ecode, epar, tol, max_iter, res_out)
    for i in range(N):
        total += x[i]
        if nodal != NULL:
            nodal[i] = <floating>(p2 * x[i])
    return p2 * total


cdef void gradient_pair(floating* work, int64_t stride,
                        int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* deg1,
                        const floating* nf1, int fv1, const floating* ef1, int fe1,
                        int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2, const floating* deg2,
                        const floating* nf2, int fv2, const floating* ef2, int fe2,
                        const int32_t* ncode, const floating* npar, const EdgeForm* ek, const int32_t* ecode,
                        const floating* epar, floating q, double tol, int max_iter, double p2,
                        int n_node_derivatives, const int32_t* dcode, const floating* dpar, const int64_t* dcode_off,
                        const int64_t* dpar_off,
                        int n_contractions, const EdgeForm* cforms, const int32_t* ccode, const floating* cpar,
                        const int64_t* ccode_off, const int64_t* cpar_off, const double* cfree,
                        double* k_out, int32_t* it_out, double* res_out, int32_t* adj_it_out, double* adj_res_out,
                        double* grad) noexcept nogil:
    """K of one pair and its raw derivatives ``grad = [dK/dtheta of each node derivative program,
    dK/dq, y^T (A1 (x) A2 (.) E_c) x of each edge contraction c]``, all times p^2.  A contraction
    with ``cfree[c] != 0`` is ``cfree[c] y^T (D V^-1 x - b)`` (M x = b: no XMV; see
    graphkern.mgk.gradient)."""
    cdef int64_t N = <int64_t>n1 * n2, i
    cdef int i1, i2, j
    cdef floating* x = work + VEC_X * stride
    cdef floating* r = work + VEC_R * stride
    cdef floating* p = work + VEC_P * stride
    cdef floating* u = work + VEC_AP * stride
    cdef floating* m = work + VEC_DIAG * stride
    cdef floating* tmp = work + VEC_TMP * stride
    cdef floating* y = work + VEC_ADJOINT * stride
    cdef floating z, v, dv, d1, d2, d
    cdef double rz = 0, acc, free_sum, qq = <double>q * q
    cdef floating floor_v = <floating>VERTEX_KERNEL_FLOOR
    k_out[0] = solve_forward(work, stride, n1, rp1, ind1, w1, deg1, nf1, fv1, ef1, fe1,
                             n2, rp2, ind2, w2, deg2, nf2, fv2, ef2, fe2, ncode, npar, ek, ecode, epar,
                             q, tol, max_iter, it_out, res_out, p2, NULL)
    # the adjoint M y = 1 (M is symmetric), same preconditioner
    for i in range(N):
        y[i] = 0
        r[i] = 1
        z = 1 / m[i]
        p[i] = z
        rz += <double>z
    adj_it_out[0] = conjugate_gradient(work, stride, y, rz, sqrt(<double>N), n1, rp1, ind1, w1, ef1, fe1,
                                       n2, rp2, ind2, w2, ef2, fe2, ek, ecode, epar, tol, max_iter, adj_res_out)
    # vertex-kernel hyperparameters: dM/dtheta = -D V^-2 dV/dtheta (V floored: no derivative there)
    for j in range(n_node_derivatives):
        acc = 0
        for i1 in range(n1):
            for i2 in range(n2):
                i = <int64_t>i1 * n2 + i2
                v = eval_program(ncode, npar, nf1 + <int64_t>i1 * fv1, nf2 + <int64_t>i2 * fv2)
                if v < floor_v:
                    continue
                dv = eval_program(dcode + dcode_off[j], dpar + dpar_off[j], nf1 + <int64_t>i1 * fv1,
                                  nf2 + <int64_t>i2 * fv2)
                acc += <double>y[i] * x[i] * (<double>m[i] / v) * dv
        grad[j] = p2 * acc
    # q: D = (deg1 + q)(deg2 + q) and b = D q^2, so dD/dq = d1 + d2 and db/dq = q^2 dD/dq + 2 q D;
    # in the same pass y^T (D V^-1 x - b), the free contractions' sum
    acc = 0
    free_sum = 0
    for i1 in range(n1):
        d1 = deg1[i1] + q
        for i2 in range(n2):
            i = <int64_t>i1 * n2 + i2
            d2 = deg2[i2] + q
            d = d1 * d2
            acc += <double>y[i] * ((qq * (d1 + d2) + 2 * <double>q * d) - <double>x[i] * (d1 + d2) * m[i] / d)
            free_sum += <double>y[i] * (<double>m[i] * x[i] - <double>d * qq)
    grad[n_node_derivatives] = p2 * acc
    # edge-kernel hyperparameters: y^T (A1 (x) A2 (.) dE) x
    for j in range(n_contractions):
        if cfree[j] != 0:
            grad[n_node_derivatives + 1 + j] = p2 * cfree[j] * free_sum
            continue
        xmv_offdiag(u, x, tmp, n1, rp1, ind1, w1, ef1, fe1, n2, rp2, ind2, w2, ef2, fe2, &cforms[j],
                    ccode + ccode_off[j], cpar + cpar_off[j])
        acc = 0
        for i in range(N):
            acc += <double>y[i] * u[i]
        grad[n_node_derivatives + 1 + j] = p2 * acc


cdef void* work_vectors(int n_threads, int n_vectors, int64_t stride, size_t itemsize) except NULL:
    """The CG work vectors of every thread, allocated before the parallel region so that a failed
    allocation raises MemoryError here instead of leaving one thread out of the team."""
    cdef double total = <double>n_threads * n_vectors * stride * itemsize
    cdef void* buf = NULL
    if total < 9.0e18:
        buf = malloc(<size_t>n_threads * n_vectors * stride * itemsize)
    if buf == NULL:
        raise MemoryError(f"could not allocate the CG work vectors: {n_threads} threads x {n_vectors} vectors x "
                          f"{stride} vertex pairs ({total / 2**30:.2f} GiB); use fewer threads (n_threads) or "
                          "smaller graphs")
    return buf


def solve_pairs(
        const int64_t[::1] node_off1, const int64_t[::1] rowptr1, const int32_t[::1] indices1,
        const floating[::1] weights1, const floating[::1] degree1, const floating[:, ::1] nfeat1,
        const floating[:, ::1] efeat1,
        const int64_t[::1] node_off2, const int64_t[::1] rowptr2, const int32_t[::1] indices2,
        const floating[::1] weights2, const floating[::1] degree2, const floating[:, ::1] nfeat2,
        const floating[:, ::1] efeat2,
        const int64_t[::1] pair_g1, const int64_t[::1] pair_g2,
        const int32_t[::1] ncode, const floating[::1] nparam, const int32_t[::1] ecode, const floating[::1] eparam,
        int edge_form, double ek_scale, double ek_theta, double ek_aux, int ek_slot,
        double q, double tol, int max_iter, double p_scale,
        double[::1] k_out, int32_t[::1] iters_out, double[::1] resid_out,
        floating[::1] nodal_out, const int64_t[::1] nodal_off, bint want_nodal, int n_threads):
    """Solve every listed pair ``(pair_g1[k] of set 1, pair_g2[k] of set 2)``.

    Sets are packed as in graphkern.mgk.data: ``node_off`` graph -> first vertex,
    ``rowptr`` global row pointers into the entries (``len = n_vertices + 1``),
    ``indices`` local column indices, feature rows per vertex / per entry.
    Writes ``k_out[k]``, ``iters_out[k]``, ``resid_out[k]`` and, when ``want_nodal``,
    ``p^2 x`` of pair k at ``nodal_out[nodal_off[k]:]``.
    """
    cdef int64_t n_pairs = pair_g1.shape[0]
    cdef int64_t k, g1, g2, o1, o2
    cdef int fv1 = nfeat1.shape[1], fv2 = nfeat2.shape[1], fe1 = efeat1.shape[1], fe2 = efeat2.shape[1]
    cdef double p2 = p_scale * p_scale
    cdef floating* work
    cdef floating* nodal_ptr
    cdef EdgeForm ek = EdgeForm(edge_form, ek_scale, ek_theta, ek_aux, ek_slot)
    cdef int64_t stride = largest_product(node_off1, node_off2, pair_g1, pair_g2)
    if n_pairs == 0:
        return
    n_threads = <int>min(max(n_threads, 1), n_pairs)
    cdef floating* scratch = <floating*>work_vectors(n_threads, N_VECTORS, stride, sizeof(floating))
    try:
        with nogil, parallel(num_threads=n_threads):
            work = &scratch[threadid() * N_VECTORS * stride]
            for k in prange(n_pairs, schedule="dynamic"):
                g1 = pair_g1[k]
                g2 = pair_g2[k]
                o1 = node_off1[g1]
                o2 = node_off2[g2]
                nodal_ptr = &nodal_out[nodal_off[k]] if want_nodal else NULL
                k_out[k] = solve_forward(
                    work, stride, <int>(node_off1[g1 + 1] - o1), &rowptr1[o1], &indices1[0], &weights1[0],
                    &degree1[o1], &nfeat1[o1, 0], fv1, &efeat1[0, 0], fe1,
                    <int>(node_off2[g2 + 1] - o2), &rowptr2[o2], &indices2[0], &weights2[0], &degree2[o2],
                    &nfeat2[o2, 0], fv2, &efeat2[0, 0], fe2, &ncode[0], &nparam[0], &ek, &ecode[0], &eparam[0],
                    <floating>q, tol, max_iter, &iters_out[k], &resid_out[k], p2, nodal_ptr)
    finally:
        free(scratch)


def solve_pairs_gradient(
        const int64_t[::1] node_off1, const int64_t[::1] rowptr1, const int32_t[::1] indices1,
        const floating[::1] weights1, const floating[::1] degree1, const floating[:, ::1] nfeat1,
        const floating[:, ::1] efeat1,
        const int64_t[::1] node_off2, const int64_t[::1] rowptr2, const int32_t[::1] indices2,
        const floating[::1] weights2, const floating[::1] degree2, const floating[:, ::1] nfeat2,
        const floating[:, ::1] efeat2,
        const int64_t[::1] pair_g1, const int64_t[::1] pair_g2,
        const int32_t[::1] ncode, const floating[::1] nparam, const int32_t[::1] ecode, const floating[::1] eparam,
        int edge_form, double ek_scale, double ek_theta, double ek_aux, int ek_slot,
        double q, double tol, int max_iter, double p_scale,
        const int32_t[::1] dcode, const floating[::1] dparam, const int64_t[::1] dcode_off,
        const int64_t[::1] dparam_off,
        const int32_t[::1] cform, const double[::1] ctheta, const double[::1] caux, const int32_t[::1] cslot,
        const int32_t[::1] ccode, const floating[::1] cparam, const int64_t[::1] ccode_off,
        const int64_t[::1] cparam_off, const double[::1] cfree,
        double[::1] k_out, int32_t[::1] iters_out, double[::1] resid_out, int32_t[::1] adj_iters_out,
        double[::1] adj_resid_out, double[:, ::1] grad_out, int n_threads):
    """K and its raw derivatives for every listed pair (arguments as :func:`solve_pairs`).

    ``dcode``/``dparam`` hold the derivative programs of the vertex kernel back to back
    (program j at ``dcode_off[j]``/``dparam_off[j]``, ``len(dcode_off) - 1`` of them); edge
    contraction c is the XMV of form ``cform[c]`` (scale 1, ``ctheta``/``caux`` its
    shortcut's parameters, ``cslot`` its feature) or of the program at ``ccode_off[c]``; where
    ``cfree[c]`` is not 0 the contraction is that factor times y^T (D V^-1 x - b), no XMV.
    Row k of ``grad_out`` receives ``[node derivatives, dK/dq, contractions]`` (see
    :func:`gradient_pair`); ``adj_iters_out``/``adj_resid_out`` describe the adjoint solves.
    """
    cdef int64_t n_pairs = pair_g1.shape[0]
    cdef int64_t k, g1, g2, o1, o2
    cdef int fv1 = nfeat1.shape[1], fv2 = nfeat2.shape[1], fe1 = efeat1.shape[1], fe2 = efeat2.shape[1]
    cdef int n_node_derivatives = dcode_off.shape[0] - 1, n_contractions = cform.shape[0], c
    cdef double p2 = p_scale * p_scale
    cdef EdgeForm* cforms
    cdef floating* work
    cdef floating* scratch = NULL
    cdef EdgeForm ek = EdgeForm(edge_form, ek_scale, ek_theta, ek_aux, ek_slot)
    cdef int64_t stride = largest_product(node_off1, node_off2, pair_g1, pair_g2)
    if grad_out.shape[0] != n_pairs or grad_out.shape[1] != n_node_derivatives + 1 + n_contractions:
        raise ValueError(f"grad_out must have shape ({n_pairs}, {n_node_derivatives + 1 + n_contractions})")
    if cfree.shape[0] != n_contractions:
        raise ValueError(f"cfree must have one factor per contraction ({n_contractions}), got {cfree.shape[0]}")
    if n_pairs == 0:
        return
    cforms = <EdgeForm*>malloc((n_contractions + 1) * sizeof(EdgeForm))
    if cforms == NULL:
        raise MemoryError("could not allocate the edge contractions")
    for c in range(n_contractions):
        cforms[c] = EdgeForm(cform[c], 1.0, ctheta[c], caux[c], cslot[c])
    cdef const double* cfree_ptr = &cfree[0] if n_contractions else NULL
    n_threads = <int>min(max(n_threads, 1), n_pairs)
    try:
        scratch = <floating*>work_vectors(n_threads, N_GRADIENT_VECTORS, stride, sizeof(floating))
        with nogil, parallel(num_threads=n_threads):
            work = &scratch[threadid() * N_GRADIENT_VECTORS * stride]
            for k in prange(n_pairs, schedule="dynamic"):
                g1 = pair_g1[k]
                g2 = pair_g2[k]
                o1 = node_off1[g1]
                o2 = node_off2[g2]
                gradient_pair(work, stride,
                              <int>(node_off1[g1 + 1] - o1), &rowptr1[o1], &indices1[0], &weights1[0],
                              &degree1[o1], &nfeat1[o1, 0], fv1, &efeat1[0, 0], fe1,
                              <int>(node_off2[g2 + 1] - o2), &rowptr2[o2], &indices2[0], &weights2[0],
                              &degree2[o2], &nfeat2[o2, 0], fv2, &efeat2[0, 0], fe2,
                              &ncode[0], &nparam[0], &ek, &ecode[0], &eparam[0], <floating>q, tol, max_iter, p2,
                              n_node_derivatives, &dcode[0], &dparam[0], &dcode_off[0], &dparam_off[0],
                              n_contractions, cforms, &ccode[0], &cparam[0], &ccode_off[0], &cparam_off[0],
                              cfree_ptr, &k_out[k], &iters_out[k], &resid_out[k], &adj_iters_out[k],
                              &adj_resid_out[k], &grad_out[k, 0])
    finally:
        free(scratch)
        free(cforms)
