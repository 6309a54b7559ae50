// One instruction set's copy of the dense walk (included by spgk_dense.h once per target, inside
// #pragma GCC target, with GK_NS naming its namespace, GK_WIDE_REGISTERS and GK_VECTOR4 its code
// paths; it undefines the three at its end, ready for the next copy; no include guard on purpose).
//
// For one pair, with the outer graph's paths (a, b, w) and the inner graph's lengths as a dense
// n2 x ld matrix L (+inf on the diagonal, where no path exists and in the padding columns), and V
// the n1 x ld vertex-kernel matrix (zero in the padding):
//
//     sum_p sum_{c < n2} sum_{d < ld} V[a,c] k_e(w, L[c,d]) V[b,d]  =  sum_{a<b} sum_{c != d} k_e V_ac V_bd,
//
// half the kernel value (the caller doubles it).  k_e(w, +inf) = 0 for the Dirac and Brownian length
// kernels, so the masked entries need no branch, and the inner loop runs over whole rows: contiguous
// loads of L and V and one multiply-add per entry into acc[d], which the compiler vectorises (no
// reduction inside the loop; acc is summed once per pair).

namespace GK_NS {

#define GK_KE_DIRAC(w, l, p) ((double)((w) == (l)))
#define GK_KE_BROWNIAN(w, l, p) (((p) - fabs((w) - (l))) > 0.0 ? ((p) - fabs((w) - (l))) : 0.0)

// Columns [j, j + BW) of four outer paths at once (a_i b_i w_i, i < 4): s_i[t] = sum_c V[a_i,c]
// k_e(w_i, L[c, j + t]) in registers (a constant width, so the compiler unrolls it into BW / 8
// vector accumulators per path and keeps them there: an accumulator in memory, read back for every
// c, stalled on store-to-load forwarding; four paths make four independent chains of adds and share
// the loads of L), then acc[j + t] += sum_i s_i[t] f_i V[b_i, j + t] once per block.  Past the last
// path the slots repeat it with weight f_i = 0.
#define GK_DENSE_BLOCK(BW, T, KE)                                                                       \
    for (; j + BW <= ld; j += BW) {                                                                     \
        double s0[BW], s1[BW], s2[BW], s3[BW];                                                          \
        for (int t = 0; t < BW; ++t) s0[t] = s1[t] = s2[t] = s3[t] = 0.0;                               \
        for (int64_t c = 0; c < n2; ++c) {                                                              \
            const double v0 = (double)Va0[c], v1 = (double)Va1[c], v2 = (double)Va2[c], v3 = (double)Va3[c]; \
            const double* Lc = L + c * ld + j;                                                          \
            _Pragma("omp simd")                                                                         \
            for (int t = 0; t < BW; ++t) {                                                              \
                const double l = Lc[t];                                                                 \
                s0[t] += v0 * KE(w0, l, param);                                                         \
                s1[t] += v1 * KE(w1, l, param);                                                         \
                s2[t] += v2 * KE(w2, l, param);                                                         \
                s3[t] += v3 * KE(w3, l, param);                                                         \
            }                                                                                           \
        }                                                                                               \
        _Pragma("omp simd")                                                                             \
        for (int t = 0; t < BW; ++t)                                                                    \
            acc[j + t] += s0[t] * (double)Vb0[j + t] + f1 * s1[t] * (double)Vb1[j + t]                  \
                        + f2 * s2[t] * (double)Vb2[j + t] + f3 * s3[t] * (double)Vb3[j + t];            \
    }

// The same 8 columns written with 4-double vector types, for the copies with 16 vector registers
// (AVX2: GK_VECTOR4): 8 accumulators.  The compiler left GK_DENSE_BLOCK scalar there, and the walk
// ran slower than the edge walk.
#if GK_VECTOR4
typedef double gk_v4 __attribute__((vector_size(32)));
typedef long long gk_v4i __attribute__((vector_size(32)));

static inline gk_v4 gk_load4(const double* p) {
    gk_v4 v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
static inline gk_v4 gk_vke_dirac(gk_v4 w, gk_v4 l, gk_v4) {
    const gk_v4 one = {1.0, 1.0, 1.0, 1.0};
    return (gk_v4)((gk_v4i)(w == l) & (gk_v4i)one);
}
static inline gk_v4 gk_vke_brownian(gk_v4 w, gk_v4 l, gk_v4 p) {
    const gk_v4i magnitude = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    const gk_v4 zero = {0.0, 0.0, 0.0, 0.0};
    const gk_v4 t = p - (gk_v4)((gk_v4i)(w - l) & magnitude);
    return t > zero ? t : zero;
}
#define GK_VKE_DIRAC gk_vke_dirac
#define GK_VKE_BROWNIAN gk_vke_brownian

#define GK_DENSE_VBLOCK8(T, VKE)                                                                        \
    for (; j + 8 <= ld; j += 8) {                                                                       \
        const gk_v4 zero = {0.0, 0.0, 0.0, 0.0};                                                        \
        const gk_v4 W0 = zero + w0, W1 = zero + w1, W2 = zero + w2, W3 = zero + w3, P = zero + param;   \
        gk_v4 a0 = zero, b0 = zero, a1 = zero, b1 = zero, a2 = zero, b2 = zero, a3 = zero, b3 = zero;   \
        for (int64_t c = 0; c < n2; ++c) {                                                              \
            const double* Lc = L + c * ld + j;                                                          \
            const gk_v4 lo = gk_load4(Lc), hi = gk_load4(Lc + 4);                                       \
            const gk_v4 v0 = zero + (double)Va0[c], v1 = zero + (double)Va1[c];                         \
            const gk_v4 v2 = zero + (double)Va2[c], v3 = zero + (double)Va3[c];                         \
            a0 += v0 * VKE(W0, lo, P); b0 += v0 * VKE(W0, hi, P);                                       \
            a1 += v1 * VKE(W1, lo, P); b1 += v1 * VKE(W1, hi, P);                                       \
            a2 += v2 * VKE(W2, lo, P); b2 += v2 * VKE(W2, hi, P);                                       \
            a3 += v3 * VKE(W3, lo, P); b3 += v3 * VKE(W3, hi, P);                                       \
        }                                                                                               \
        for (int t = 0; t < 4; ++t) {                                                                   \
            acc[j + t] += a0[t] * (double)Vb0[j + t] + f1 * a1[t] * (double)Vb1[j + t]                  \
                        + f2 * a2[t] * (double)Vb2[j + t] + f3 * a3[t] * (double)Vb3[j + t];            \
            acc[j + 4 + t] += b0[t] * (double)Vb0[j + 4 + t] + f1 * b1[t] * (double)Vb1[j + 4 + t]      \
                            + f2 * b2[t] * (double)Vb2[j + 4 + t] + f3 * b3[t] * (double)Vb3[j + 4 + t]; \
        }                                                                                               \
    }

#endif  // GK_VECTOR4

// Blocks of 32, 16 and 8 columns with 32 vector registers (AVX-512: at most 16 accumulators of 8
// doubles); with 16, AVX2's vector-typed block of 8, and the baseline's plain one.  ld is a
// multiple of 8.
#if GK_WIDE_REGISTERS
#define GK_DENSE_BLOCKS(T, KE, VKE) GK_DENSE_BLOCK(32, T, KE) GK_DENSE_BLOCK(16, T, KE) GK_DENSE_BLOCK(8, T, KE)
#elif GK_VECTOR4
#define GK_DENSE_BLOCKS(T, KE, VKE) GK_DENSE_VBLOCK8(T, VKE)
#else
#define GK_DENSE_BLOCKS(T, KE, VKE) GK_DENSE_BLOCK(8, T, KE)
#endif

#define GK_DENSE_PATH(i, T)                                                                              \
    const int64_t p##i = p + i < n_paths1 ? p + i : p;                                                  \
    const double f##i = p + i < n_paths1 ? 1.0 : 0.0;                                                   \
    const T* Va##i = V + (int64_t)ends1[2 * p##i] * ld;                                                 \
    const T* Vb##i = V + (int64_t)ends1[2 * p##i + 1] * ld;                                             \
    const double w##i = len1[p##i];                                                                     \
    (void)f##i;

#define GK_DEFINE_DENSE_WALK(NAME, T, KE, VKE)                                                             \
    static double NAME(const int32_t* ends1, const double* len1, int64_t n_paths1, const double* L,     \
                       int64_t n2, int64_t ld, const void* Vv, double param, double* acc) {             \
        const T* V = (const T*)Vv;                                                                      \
        for (int64_t d = 0; d < ld; ++d) acc[d] = 0.0;                                                  \
        for (int64_t p = 0; p < n_paths1; p += 4) {                                                     \
            GK_DENSE_PATH(0, T) GK_DENSE_PATH(1, T) GK_DENSE_PATH(2, T) GK_DENSE_PATH(3, T)                      \
            int64_t j = 0;                                                                              \
            GK_DENSE_BLOCKS(T, KE, VKE)                                                                 \
        }                                                                                               \
        double total = 0.0;                                                                             \
        for (int64_t d = 0; d < ld; ++d) total += acc[d];                                               \
        return total;                                                                                   \
    }

// exp(-y) for y >= 0 (+inf included) with no branch and no library call, so that a row of vertex
// kernels runs in vector registers: y clamped to 745.5 (beyond, exp(-y) rounds to 0 or the least
// subnormal), k = round(-y / ln 2), r = -y - k ln 2 in two parts (fdlibm's split, exact for
// |k| < 2^11), exp(r) by its Taylor polynomial of degree 13 (|r| <= 0.347: truncation below
// 4e-18), times 2^k built in two normal factors (k >= -1076) from the bits of k + 1023 made exact
// by the 2^52 + 2^51 rounding constant.  Within 2 ulp of the C library's exp.
static inline double exp_neg(double y) {
    const double x = y < 745.5 ? -y : -745.5;
    // round to the nearest integer by the 2^52 + 2^51 constant (floor would not vectorise: it may
    // raise "inexact"); |x / ln 2| <= 1076
    const double kf = (x * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
    const double r = (x - kf * 6.93147180369123816490e-01) - kf * 1.90821492927058770002e-10;
    double p = 1.6059043836821613e-10;                // 1/13!
    p = p * r + 2.08767569878680990e-09;              // 1/12!
    p = p * r + 2.50521083854417188e-08;              // 1/11!
    p = p * r + 2.75573192239858907e-07;              // 1/10!
    p = p * r + 2.75573192239858907e-06;              // 1/9!
    p = p * r + 2.48015873015873016e-05;              // 1/8!
    p = p * r + 1.98412698412698413e-04;              // 1/7!
    p = p * r + 1.38888888888888889e-03;              // 1/6!
    p = p * r + 8.33333333333333333e-03;              // 1/5!
    p = p * r + 4.16666666666666667e-02;              // 1/4!
    p = p * r + 1.66666666666666667e-01;              // 1/3!
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    const double k1 = (kf * 0.5 + 6755399441055744.0) - 6755399441055744.0, k2 = kf - k1;
    const double m1 = (k1 + 1023.0) + 6755399441055744.0, m2 = (k2 + 1023.0) + 6755399441055744.0;
    int64_t b1, b2;
    __builtin_memcpy(&b1, &m1, 8);
    __builtin_memcpy(&b2, &m2, 8);
    b1 <<= 52;
    b2 <<= 52;
    double s1, s2;
    __builtin_memcpy(&s1, &b1, 8);
    __builtin_memcpy(&s2, &b2, 8);
    return y < 745.5 ? p * s1 * s2 : 0.0;
}

// Rows of the dense walk's vertex-kernel matrix: V[a, c] = prod_k [x_a,k == y_c,k] *
// exp(-sum_k gamma_k (x_a,k - y_c,k)^2) for a < n1, c < n2, zero for n2 <= c < ld; the exponents of
// a row first (a mismatch and the padding as an exponent of +inf), then their exps in one vector loop.
#define GK_DEFINE_VERTEX_ROWS(NAME, T)                                                                  \
    static void NAME(const int64_t* disc1, const double* cont1, int64_t n1, const int64_t* disc2,     \
                     const double* cont2, int64_t n2, int32_t nd, int32_t nc, const double* gamma,    \
                     int64_t ld, void* Vv) {                                                           \
        T* V = (T*)Vv;                                                                                 \
        double e[GK_DENSE_MAX_LD];                                                                     \
        for (int64_t a = 0; a < n1; ++a) {                                                             \
            for (int64_t c = 0; c < n2; ++c) {                                                         \
                int match = 1;                                                                         \
                for (int32_t k = 0; k < nd; ++k) match &= disc1[a * nd + k] == disc2[c * nd + k];      \
                double d2 = 0.0;                                                                       \
                for (int32_t k = 0; k < nc; ++k) {                                                     \
                    const double t = cont1[a * nc + k] - cont2[c * nc + k];                            \
                    d2 += gamma[k] * t * t;                                                            \
                }                                                                                      \
                e[c] = match ? d2 : __builtin_inf();                                                   \
            }                                                                                          \
            for (int64_t c = n2; c < ld; ++c) e[c] = __builtin_inf();                                  \
            T* row = V + a * ld;                                                                       \
            _Pragma("omp simd")                                                                        \
            for (int64_t c = 0; c < ld; ++c) row[c] = (T)exp_neg(e[c]);                                \
        }                                                                                              \
    }

GK_DEFINE_VERTEX_ROWS(vertex_rows_f64, double)
GK_DEFINE_VERTEX_ROWS(vertex_rows_f32, float)
#undef GK_DEFINE_VERTEX_ROWS

GK_DEFINE_DENSE_WALK(walk_dirac_f64, double, GK_KE_DIRAC, GK_VKE_DIRAC)
GK_DEFINE_DENSE_WALK(walk_dirac_f32, float, GK_KE_DIRAC, GK_VKE_DIRAC)
GK_DEFINE_DENSE_WALK(walk_brownian_f64, double, GK_KE_BROWNIAN, GK_VKE_BROWNIAN)
GK_DEFINE_DENSE_WALK(walk_brownian_f32, float, GK_KE_BROWNIAN, GK_VKE_BROWNIAN)

#undef GK_DEFINE_DENSE_WALK
#undef GK_DENSE_BLOCK
#undef GK_DENSE_PATH
#undef GK_DENSE_BLOCKS
#undef GK_DENSE_VBLOCK8
#undef GK_VKE_DIRAC
#undef GK_VKE_BROWNIAN
#undef GK_KE_DIRAC
#undef GK_KE_BROWNIAN

}  // namespace GK_NS

#undef GK_VECTOR4
#undef GK_WIDE_REGISTERS
#undef GK_NS
