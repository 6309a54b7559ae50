// The dense walk of graphkern/_cpu/spgk.pyx (see spgk_dense_impl.h), compiled for AVX-512, for
// AVX2 + FMA and for the baseline x86-64 (or whatever the compiler targets elsewhere), and picked
// once per call by the running CPU: a wheel built for the baseline still runs the inner loop
// eight doubles wide where the CPU can.
#ifndef GRAPHKERN_SPGK_DENSE_H
#define GRAPHKERN_SPGK_DENSE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef double (*gk_dense_walk_fn)(const int32_t*, const double*, int64_t, const double*, int64_t, int64_t,
                                   const void*, double, double*);

typedef void (*gk_vertex_rows_fn)(const int64_t*, const double*, int64_t, const int64_t*, const double*, int64_t,
                                  int32_t, int32_t, const double*, int64_t, void*);

// the widest row (a graph's vertices rounded up to the row alignment): must match spgk.pyx
#define GK_DENSE_MAX_LD 256

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define GK_X86_DISPATCH 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
#define GK_NS gk_dense_avx512
#define GK_WIDE_REGISTERS 1
#define GK_VECTOR4 0
#include "spgk_dense_impl.h"
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define GK_NS gk_dense_avx2
#define GK_WIDE_REGISTERS 0
#define GK_VECTOR4 1
#include "spgk_dense_impl.h"
#pragma GCC pop_options
#endif
#define GK_NS gk_dense_base
#define GK_WIDE_REGISTERS 0
#define GK_VECTOR4 0
#include "spgk_dense_impl.h"

// The widest instruction set this CPU runs the dense walk with: 2 AVX-512, 1 AVX2 + FMA, 0 baseline;
// GRAPHKERN_DENSE_ISA ("baseline", "avx2") lowers it, so that the tests run every copy anywhere.
static inline int gk_dense_level(void) {
    int level = 0;
#ifdef GK_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        level = 2;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        level = 1;
#endif
    const char* cap = getenv("GRAPHKERN_DENSE_ISA");
    if (cap != NULL && strcmp(cap, "baseline") == 0) level = 0;
    if (cap != NULL && strcmp(cap, "avx2") == 0 && level > 1) level = 1;
    return level;
}

#ifdef GK_X86_DISPATCH
#define GK_DISPATCH(PICK)                        \
    switch (gk_dense_level()) {                  \
        case 2: PICK(gk_dense_avx512);           \
        case 1: PICK(gk_dense_avx2);             \
        default: PICK(gk_dense_base);            \
    }
#else
#define GK_DISPATCH(PICK) PICK(gk_dense_base);
#endif

// kind: 0 Dirac, 2 Brownian bridge (graphkern/basekernels/shortest_path.py's codes); is_float: V in float32.
// Returns NULL for a kind the dense walk does not do (the Gaussian length kernel).
#define GK_PICK(NS)                                                                                     \
    return kind == 0 ? (is_float ? (gk_dense_walk_fn)NS::walk_dirac_f32 : (gk_dense_walk_fn)NS::walk_dirac_f64) \
         : kind == 2 ? (is_float ? (gk_dense_walk_fn)NS::walk_brownian_f32                              \
                                 : (gk_dense_walk_fn)NS::walk_brownian_f64)                             \
                     : (gk_dense_walk_fn)0
#define GK_PICK_ROWS(NS) return is_float ? (gk_vertex_rows_fn)NS::vertex_rows_f32 : (gk_vertex_rows_fn)NS::vertex_rows_f64

static inline gk_dense_walk_fn gk_dense_walk_for(int kind, int is_float) { GK_DISPATCH(GK_PICK) }

static inline gk_vertex_rows_fn gk_vertex_rows_for(int is_float) { GK_DISPATCH(GK_PICK_ROWS) }

// Which instruction set the dense walk runs with on this CPU (for the benchmark's record).
static inline const char* gk_dense_isa(void) {
    static const char* const names[] = {"baseline", "avx2", "avx512"};
    return names[gk_dense_level()];
}

#undef GK_DISPATCH
#undef GK_PICK_ROWS
#undef GK_PICK
#endif
