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
"""

from cython.parallel cimport parallel, prange
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

cdef enum:
    EDGE_GENERAL = 0
    EDGE_CONSTANT = 1
    EDGE_KRONECKER = 2
    EDGE_SQEXP = 3

# vectors of the per-thread work buffer
cdef enum:
    VEC_X = 0
    VEC_R = 1
    VEC_P = 2
    VEC_AP = 3
    VEC_DIAG = 4
    VEC_TMP = 5
    N_VECTORS = 6

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
            else:
                d2 = 0
                for c in range(width):
                    diff = a[slot + c] - b[slot + c]
                    d2 = d2 + diff * diff
                prod = prod * fexp(par[pp + 1] * d2)
            pp += 2
        total = total + prod
    return total


cdef struct EdgeForm:
    int form
    double scale
    double theta
    double aux
    int slot


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
    if ek.form == EDGE_KRONECKER or ek.form == EDGE_SQEXP:
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
    """The XMV for an edge kernel ``scale * base(e1[slot], e2[slot])`` (Kronecker delta or square exponential)."""
    cdef int i1, i2, slot = ek.slot
    cdef int64_t k1, k2
    cdef floating acc, wa, e1, diff
    cdef floating hit = <floating>ek.scale, miss = <floating>(ek.scale * ek.theta), aux = <floating>ek.aux
    cdef bint kronecker = ek.form == EDGE_KRONECKER
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
            else:
                for i2 in range(n2):
                    acc = 0
                    for k2 in range(rp2[i2], rp2[i2 + 1]):
                        diff = e1 - ef2[k2 * fe2 + slot]
                        acc = acc + w2[k2] * (hit * fexp(aux * diff * diff)) * xrow[ind2[k2]]
                    yrow[i2] = yrow[i2] + wa * acc


cdef void solve_pair(floating* work, int64_t stride,
                     int n1, const int64_t* rp1, const int32_t* ind1, const floating* w1, const floating* deg1,
                     const floating* nf1, int fv1, const floating* ef1, int fe1,
                     int n2, const int64_t* rp2, const int32_t* ind2, const floating* w2, const floating* deg2,
                     const floating* nf2, int fv2, const floating* ef2, int fe2,
                     const int32_t* ncode, const floating* npar, const EdgeForm* ek, const int32_t* ecode,
                     const floating* epar, floating q, double tol, int max_iter, double p2,
                     double* k_out, int32_t* it_out, double* res_out, floating* nodal) noexcept nogil:
    cdef int64_t N = <int64_t>n1 * n2, i
    cdef int i1, i2, it = 0
    cdef floating* x = work + VEC_X * stride
    cdef floating* r = work + VEC_R * stride
    cdef floating* p = work + VEC_P * stride
    cdef floating* Ap = work + VEC_AP * stride
    cdef floating* m = work + VEC_DIAG * stride
    cdef floating* tmp = work + VEC_TMP * stride
    cdef floating d, v, bi, z, a, bt, ri
    cdef double rz = 0, bb = 0, pAp, rr, rzn, alpha, beta, bnorm, rnorm, total
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
    bnorm = sqrt(bb)
    rnorm = bnorm
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
    total = 0
    for i in range(N):
        total += x[i]
    if nodal != NULL:
        for i in range(N):
            nodal[i] = <floating>(p2 * x[i])
    k_out[0] = p2 * total
    it_out[0] = it
    res_out[0] = rnorm / bnorm if bnorm > 0 else 0.0


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

    Sets are packed as in graphkern._mgk_data: ``node_off`` graph -> first vertex,
    ``rowptr`` global row pointers into the entries (``len = n_vertices + 1``),
    ``indices`` local column indices, feature rows per vertex / per entry.
    Writes ``k_out[k]``, ``iters_out[k]``, ``resid_out[k]`` and, when ``want_nodal``,
    ``p^2 x`` of pair k at ``nodal_out[nodal_off[k]:]``.
    """
    cdef int64_t n_pairs = pair_g1.shape[0]
    cdef int64_t k, g1, g2, o1, o2, stride = 1
    cdef int fv1 = nfeat1.shape[1], fv2 = nfeat2.shape[1], fe1 = efeat1.shape[1], fe2 = efeat2.shape[1]
    cdef int n1, n2
    cdef double p2 = p_scale * p_scale
    cdef EdgeForm ek
    cdef floating* work
    cdef floating* nodal_ptr
    cdef int failed = 0
    cdef int* failed_flag = &failed  # written through a pointer: a plain assignment would be thread-private
    ek.form = edge_form
    ek.scale = ek_scale
    ek.theta = ek_theta
    ek.aux = ek_aux
    ek.slot = ek_slot
    for k in range(n_pairs):
        n1 = <int>(node_off1[pair_g1[k] + 1] - node_off1[pair_g1[k]])
        n2 = <int>(node_off2[pair_g2[k] + 1] - node_off2[pair_g2[k]])
        if <int64_t>n1 * n2 > stride:
            stride = <int64_t>n1 * n2
    if n_pairs == 0:
        return
    with nogil, parallel(num_threads=n_threads):
        work = <floating*>malloc(N_VECTORS * stride * sizeof(floating))
        if work == NULL:
            failed_flag[0] = 1
        else:
            for k in prange(n_pairs, schedule="dynamic"):
                g1 = pair_g1[k]
                g2 = pair_g2[k]
                o1 = node_off1[g1]
                o2 = node_off2[g2]
                nodal_ptr = &nodal_out[nodal_off[k]] if want_nodal else NULL
                solve_pair(work, stride,
                           <int>(node_off1[g1 + 1] - o1), &rowptr1[o1], &indices1[0], &weights1[0], &degree1[o1],
                           &nfeat1[o1, 0], fv1, &efeat1[0, 0], fe1,
                           <int>(node_off2[g2 + 1] - o2), &rowptr2[o2], &indices2[0], &weights2[0], &degree2[o2],
                           &nfeat2[o2, 0], fv2, &efeat2[0, 0], fe2,
                           &ncode[0], &nparam[0], &ek, &ecode[0], &eparam[0], <floating>q, tol, max_iter, p2,
                           &k_out[k], &iters_out[k], &resid_out[k], nodal_ptr)
            free(work)
    if failed:
        raise MemoryError(f"could not allocate the CG work vectors ({N_VECTORS} x {stride} values per thread)")
