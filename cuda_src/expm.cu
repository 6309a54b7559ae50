// Lanczos for f(beta A) x on the GPU: fused SpMV variants, the vector update, device reductions,
// the final basis combination and the output scaling (driven by graphkern/expm/gpu.py).
//
// Conventions shared with the CPU kernels (graphkern/_cpu/expm.pyx):
// * Lanczos vectors are stored unnormalised, w_k = beta_{k-1} q_k, with q_k = rscale_k * w_k, so that
//   normalising never costs a pass over memory: the next SpMV scales its output instead.
// * coef (float64) holds alpha[cap], beta[cap], rscale[cap + 1] back to back.  The host writes
//   rscale[0] = 1/||x||; every later entry is written on the device, so a step never waits for the host.
// * A step is two kernels.  lanczos_spmv_*: v = rscale_k (A w_k) - beta_{k-1} rscale_{k-1} w_{k-1}
//   written into w_{k+1}, plus partial sums of alpha_k = v . q_k; lanczos_update_*: w_{k+1} = v -
//   alpha_k q_k plus partial sums of ||w_{k+1}||^2.  The last block to finish (atomic ticket) adds the
//   block partials in block order (then each long row's share of alpha, in row order), so a reduction
//   needs no extra launch and is deterministic: the same inputs give the same bits on every run.  An
//   SpMV launched with a block per task (far more blocks than fit at once) has no ticket: its blocks
//   write their partials and lanczos_sum_partials adds them in the same order (grid_sum).
// * Several devices: each owns a row range [row0, row0 + nrows) of A (global column indices) and a
//   full copy of the vectors.  A reduction writes this device's share into its slot of a per-device
//   array of n_dev slots, and the consumer adds all slots in slot order (the same sum, bit for bit,
//   on every device).  The share and the device's rows of w_{k+1} reach the other devices either
//   by copies the host queues after the kernel, or -- where every pair of devices has peer access --
//   by the kernels themselves: the reduction's last block also stores the share into the other
//   devices' slots (peer_outs) and the update stores each row it forms into the other devices'
//   copies of w_{k+1} (row_peer*), so the exchange runs at the same time as the update and no copy
//   launch, with its own latency, sits between two kernels.  Kernel completion makes those stores
//   visible to the other devices' work that waits on this device's event.
// * The second pass of the basis-free mode reruns the same steps with the coefficients already in
//   coef (no reductions: null slot pointers), regenerating bit-identical vectors.
// Dot products and norms accumulate in float64 also for float32 vectors; row sums accumulate in the
// vector type.
//
// Memory traffic.  An SpMV is bound by memory, not flops: it streams the column indices (and values)
// once and gathers x at random.  On power-law and mesh graphs with random vertex order the gathers
// dominate: every one moves a 32-byte sector from L2 (x fits in L2: 33 MB for 4M float64 rows), so
// x must stay there.  Hence (1) the index, value and w_{k-1} streams are read with evict-first loads
// (an L2 evict-first cache policy), which keeps the once-read stream from pushing x out of L2, while
// x goes through the read-only path (__ldg; in a degree-ordered matrix only the hub columns' gathers
// allocate in L1, see gather_x); (2) the nonzero-balanced kernels read the indices as
// aligned int4 quads
// (the index and value arrays are padded to a multiple of 4 on the device) and issue
// kQuadsPerThread quads, i.e. 4 * kQuadsPerThread gathers, before using any of them, so each thread
// keeps several gathers in flight instead of one dependent load chain per nonzero; (3) task-driven
// kernels take tasks blockIdx.x, blockIdx.x + gridDim.x, ...: the host launches a block per task
// (graphkern/expm/plans.py: TASK_GRIDS; the block scheduler then balances them, at one alpha partial
// per task) or only the resident blocks (persistent, a few hundred partials).
#include <cstdint>
#include <type_traits>

#include "common/csr_check.cuh"
#include "common/exports.cuh"
#include "common/reductions.cuh"
#include "common/search.cuh"

namespace {

using gk::kFullMask;
using gk::kWarp;

constexpr int kBlock = 256;
// Products staged in shared memory by one row block of the rowblock variant (16 KiB in float64), and
// the most rows such a block may have.  The host builds row blocks within both limits (longer rows
// become long-row segments); a block beyond them falls back to a warp per row.
constexpr int kStreamCapacity = 2048;
constexpr int kStreamRows = 1023;
constexpr int kRowPointersPerThread = (kStreamRows + 1 + kBlock - 1) / kBlock;
constexpr int kTaskWidth = 8;
// int4 index loads each thread issues before it uses their gathers.
constexpr int kQuadsPerThread = 2;

// Work item of the task-driven kernel (rowblock and hybrid plans); block b takes tasks b,
// b + gridDim.x, ... (one of them when the grid is a block per task).
enum TaskType : int64_t {
    kTaskStream = 0,      // {type, r0, r1, e0, e1}: rows [r0, r1), entries [e0, e1), via shared memory
    kTaskThreadList = 1,  // {type, l0, l1}: rows rowlist[l0..l1), one thread per row
    kTaskWarpList = 2,    // {type, l0, l1}: rows rowlist[l0..l1), one warp per row
    kTaskLongSegment = 3, // {type, row, e0, e1, seg_base, seg_index, n_seg, long_index}: part of one long row
};

struct Coefficients {
    double* alpha;
    double* beta;
    double* rscale;
    __device__ Coefficients(double* base, int64_t cap) : alpha(base), beta(base + cap), rscale(base + 2 * cap) {}
};

// Scalars of step k: q_k = rscale * w_k and v = A q_k - sub * w_{k-1}.
struct StepScalars {
    double rscale;
    double sub;
};

// beta_{k-1} comes from the per-device slots of ||w_k||^2 (first pass) or from coef (second pass).
// A breakdown (beta_{k-1} <= breakdown: an invariant subspace) sets rscale_k = 0, which makes every
// later vector exactly zero; the host truncates the Krylov space at the first zero rscale.
__device__ StepScalars step_scalars(double* coef, int64_t cap, int64_t k, const double* beta_slots, int n_dev,
                                    double breakdown) {
    Coefficients c(coef, cap);
    if (k == 0) return {c.rscale[0], 0.0};
    const double rs_prev = c.rscale[k - 1];
    double b, rs;
    if (beta_slots != nullptr) {
        double s = 0.0;
        for (int d = 0; d < n_dev; ++d) s += beta_slots[d];
        b = sqrt(s);
        rs = (b > breakdown && rs_prev != 0.0) ? 1.0 / b : 0.0;
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            c.beta[k - 1] = b;
            c.rscale[k] = rs;
        }
    } else {
        b = c.beta[k - 1];
        rs = c.rscale[k];
    }
    return {rs, rs != 0.0 ? b * rs_prev : 0.0};
}

// Sum over the block, valid in thread 0.  Starts with a barrier so consecutive calls can share scratch.
__device__ double block_sum(double v) {
    __shared__ double scratch[kBlock / kWarp];
    return gk::block_sum_to_first<true>(v, scratch, threadIdx.x, (int)(blockDim.x / kWarp));
}

// The partials[0..n_partials) in order, then extra[0..n_extra), summed by one block into *out and
// into the n_peer_outs doubles whose addresses peer_outs lists (other devices' slots).
__device__ void sum_partials(const double* partials, int64_t n_partials, const double* extra, int64_t n_extra,
                             double* out, const uint64_t* peer_outs, int32_t n_peer_outs) {
    // Each thread adds b = threadIdx.x, + blockDim.x, ... in that order, with kLoads loads in flight
    // at a time: one block summing 1e5 partials is latency-bound with one load per add.
    constexpr int kLoads = 8;
    double acc = 0.0;
    const int64_t total = n_partials + n_extra;
    for (int64_t b0 = threadIdx.x; b0 < total; b0 += (int64_t)kLoads * blockDim.x) {
        double v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int64_t b = b0 + (int64_t)u * blockDim.x;
            v[u] = b < n_partials ? __ldcg(partials + b) : b < total ? __ldcg(extra + (b - n_partials)) : 0.0;
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
            if (b0 + (int64_t)u * blockDim.x < total) acc += v[u];
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
        *out = acc;
        for (int32_t p = 0; p < n_peer_outs; ++p) *reinterpret_cast<double*>(peer_outs[p]) = acc;
    }
}

// Grid-wide sum of v into *out (and into peer_outs): block partials, then the last block (atomic
// ticket) adds them in block order, followed by the n_extra values of `extra` (written before their
// blocks took a ticket), and re-arms the counter for the next launch.  Without a counter the blocks
// only write their partials, and lanczos_sum_partials adds them (the same sum, bit for bit) in a
// launch of its own: with a block per task (10^5 blocks on R-MAT) the tickets and fences cost far
// more than that launch.  Every thread of every block must call it.
__device__ void grid_sum(double v, double* partials, unsigned* counter, double* out, const uint64_t* peer_outs,
                         int32_t n_peer_outs, const double* extra, int64_t n_extra) {
    __shared__ bool is_last;
    const double s = block_sum(v);
    if (counter == nullptr) {
        if (threadIdx.x == 0) partials[blockIdx.x] = s;
        return;
    }
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = s;
        __threadfence();
        is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (is_last) {
        sum_partials(partials, gridDim.x, extra, n_extra, out, peer_outs, n_peer_outs);
        if (threadIdx.x == 0) *counter = 0u;
    }
}

// ------------------------------------------------------------------------------- streamed loads
// Data read once per SpMV (column indices, values, w_{k-1}, the task table) is loaded with an L2
// evict-first policy (sm_80+), so that the stream does not push x out of L2; scalar loads keep L1's
// normal policy because a thread reading a row one entry at a time reuses each sector a few loads
// later, while the vector loads (quads), which nobody reads twice, skip L1.  Older devices use
// __ldg / __ldcs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GK_L2_HINTS 1
#endif

__device__ __forceinline__ uint64_t stream_policy() {
#ifdef GK_L2_HINTS
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
#else
    return 0;
#endif
}

#ifdef GK_L2_HINTS
#define DEFINE_LD_ONCE(TYPE, PTX, REG)                                                                    \
    __device__ __forceinline__ TYPE ld_once(const TYPE* p, uint64_t policy) {                             \
        TYPE v;                                                                                           \
        asm("ld.global.nc.L2::cache_hint." PTX " %0, [%1], %2;" : "=" REG(v) : "l"(p), "l"(policy));      \
        return v;                                                                                         \
    }
#define DEFINE_LD_ONCE_V4(TYPE, PTX, REG)                                                                 \
    __device__ __forceinline__ TYPE ld_once(const TYPE* p, uint64_t policy) {                             \
        TYPE v;                                                                                           \
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4." PTX " {%0, %1, %2, %3}, [%4], %5;"          \
            : "=" REG(v.x), "=" REG(v.y), "=" REG(v.z), "=" REG(v.w) : "l"(p), "l"(policy));              \
        return v;                                                                                         \
    }
#define DEFINE_LD_ONCE_V2(TYPE, PTX, REG)                                                                 \
    __device__ __forceinline__ TYPE ld_once(const TYPE* p, uint64_t policy) {                             \
        TYPE v;                                                                                           \
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2." PTX " {%0, %1}, [%2], %3;"                  \
            : "=" REG(v.x), "=" REG(v.y) : "l"(p), "l"(policy));                                          \
        return v;                                                                                         \
    }
#else
#define DEFINE_LD_ONCE(TYPE, PTX, REG) \
    __device__ __forceinline__ TYPE ld_once(const TYPE* p, uint64_t) { return __ldg(p); }
#define DEFINE_LD_ONCE_V4(TYPE, PTX, REG) \
    __device__ __forceinline__ TYPE ld_once(const TYPE* p, uint64_t) { return __ldcs(p); }
#define DEFINE_LD_ONCE_V2 DEFINE_LD_ONCE_V4
#endif
DEFINE_LD_ONCE(int32_t, "s32", "r")
DEFINE_LD_ONCE(int64_t, "s64", "l")
DEFINE_LD_ONCE(float, "f32", "f")
DEFINE_LD_ONCE(double, "f64", "d")
DEFINE_LD_ONCE_V4(int4, "s32", "r")
DEFINE_LD_ONCE_V4(float4, "f32", "f")
DEFINE_LD_ONCE_V2(double2, "f64", "d")

// Gather of x[col].  Hot columns go through L1 (__ldg); the others skip it (__ldcg, L2 only), so
// that they do not evict the hot ones.  In a degree-ordered matrix the low columns are the hubs'
// and take a large share of the gathers of a power-law graph; the host sizes the range to about
// what L1 holds beside the staged products.  In A's own order len is INT32_MAX: every gather uses
// L1, which keeps the reuse of meshes and grids.
//
// Hot are [0, len) and [start1, start1 + len); start1 = 2^31 leaves the second range empty (the
// unsigned difference of a column and 2^31 is never below len).  With the rows dealt to several
// devices, each device's block of rows (and of columns) starts with its share of the hubs, so the
// hubs sit at the start of every block: the host puts the second range at the second block (one
// range would hold only the even-ranked hubs).
struct HotColumns {
    int32_t len;
    uint32_t start1;
};

template <typename T>
__device__ __forceinline__ T gather_x(const T* __restrict__ x, int32_t col, HotColumns hot) {
    const bool in_l1 = col < hot.len || (uint32_t)col - hot.start1 < (uint32_t)hot.len;
    return in_l1 ? __ldg(x + col) : __ldcg(x + col);
}

// Four consecutive values starting at a multiple of 4 (the value arrays are padded and 16-byte aligned).
__device__ __forceinline__ void load_quad(const float* __restrict__ p, int64_t q, float v[4], uint64_t policy) {
    const float4 f = ld_once(reinterpret_cast<const float4*>(p) + q, policy);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}
__device__ __forceinline__ void load_quad(const double* __restrict__ p, int64_t q, double v[4], uint64_t policy) {
    const double2* d = reinterpret_cast<const double2*>(p) + 2 * q;
    const double2 lo = ld_once(d, policy), hi = ld_once(d + 1, policy);
    v[0] = lo.x; v[1] = lo.y; v[2] = hi.x; v[3] = hi.y;
}

// One stored entry's product a_ij x_j, loaded one at a time (scalar, vector and thread-list rows).
template <typename T, bool kWeighted, typename P>
__device__ __forceinline__ T entry(const T* __restrict__ values, const int32_t* __restrict__ indices,
                                   const T* __restrict__ x, HotColumns hot, P e, uint64_t policy) {
    const T xv = gather_x(x, ld_once(indices + e, policy), hot);
    if constexpr (kWeighted) {
        return ld_once(values + e, policy) * xv;
    } else {
        return xv;
    }
}

// Calls use(e, a_e x_col(e)) for every entry e in [e0, e1), shared by `count` threads of which this
// is number `rank`.  Indices are read as the aligned int4 quads that cover [e0, e1) (entries outside
// it are masked), kQuadsPerThread quads per thread at a time, and all their gathers are issued
// before the first use.
template <typename T, bool kWeighted, typename Use>
__device__ __forceinline__ void for_each_product(const int32_t* __restrict__ indices, const T* __restrict__ values,
                                                 const T* __restrict__ x, HotColumns hot, int64_t e0, int64_t e1,
                                                 int rank, int count, uint64_t policy, Use use) {
    const int4* __restrict__ quads = reinterpret_cast<const int4*>(indices);
    const int64_t q_end = (e1 + 3) >> 2;
    for (int64_t q_base = (e0 >> 2) + rank; q_base < q_end; q_base += (int64_t)kQuadsPerThread * count) {
        int col[kQuadsPerThread][4];
        T val[kQuadsPerThread][4];
#pragma unroll
        for (int u = 0; u < kQuadsPerThread; ++u) {
            const int64_t q = q_base + (int64_t)u * count;
            int4 c = make_int4(0, 0, 0, 0);
            if (q < q_end) {
                c = ld_once(quads + q, policy);
                if constexpr (kWeighted) load_quad(values, q, val[u], policy);
            }
            col[u][0] = c.x; col[u][1] = c.y; col[u][2] = c.z; col[u][3] = c.w;
        }
        T prod[kQuadsPerThread][4];
#pragma unroll
        for (int u = 0; u < kQuadsPerThread; ++u) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t e = 4 * (q_base + (int64_t)u * count) + i;
                prod[u][i] = 0;
                if (e >= e0 && e < e1) {
                    prod[u][i] = gather_x(x, col[u][i], hot);
                    if constexpr (kWeighted) prod[u][i] *= val[u][i];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kQuadsPerThread; ++u) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int64_t e = 4 * (q_base + (int64_t)u * count) + i;
                if (e >= e0 && e < e1) use(e, prod[u][i]);
            }
        }
    }
}

// Finish local row i: v = rscale * dot - sub * w_prev, store it, return its share of alpha.
template <typename T>
__device__ __forceinline__ double finish_row(T dot, int64_t r, StepScalars s, const T* __restrict__ w_cur,
                                             const T* __restrict__ w_prev, T* __restrict__ w_out, uint64_t policy) {
    T v = static_cast<T>(s.rscale) * dot;
    if (w_prev != nullptr) v -= static_cast<T>(s.sub) * ld_once(w_prev + r, policy);
    w_out[r] = v;
    return static_cast<double>(v) * (static_cast<double>(w_cur[r]) * s.rscale);
}

template <typename T, typename P>
struct SpmvArgs {
    const P* __restrict__ indptr;       // local row pointers (nrows + 1, starting at 0)
    const int32_t* __restrict__ indices;  // global column indices, padded to a multiple of 4
    const T* __restrict__ values;       // null for an unweighted graph; padded like indices
    const int64_t* __restrict__ tasks;  // kTaskWidth per task (rowblock, hybrid)
    int64_t n_tasks;
    const int32_t* __restrict__ rowlist;  // local row ids for list tasks (hybrid)
    const T* __restrict__ w_cur;        // w_k, full length
    const T* __restrict__ w_prev;       // w_{k-1}, full length, or null on the first step
    T* __restrict__ w_out;              // receives v in rows [row0, row0 + nrows)
    int64_t row0, nrows;
    StepScalars s;
    double* seg_partials;               // one per long-row segment
    unsigned* seg_counters;             // one per long row, zero between launches
    double* long_alpha;                 // one per long row: its share of alpha
    uint64_t policy;                    // L2 evict-first, for the streamed loads
    HotColumns hot;                     // gathers of these columns use L1 (gather_x)
};

// ---------------------------------------------------------------------------------------- variants

// One thread per row.
template <typename T, typename P, bool kWeighted>
__device__ double rows_scalar(const SpmvArgs<T, P>& a) {
    double part = 0.0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.nrows; i += stride) {
        T dot = 0;
        const P end = a.indptr[i + 1];
        for (P e = a.indptr[i]; e < end; ++e)
            dot += entry<T, kWeighted>(a.values, a.indices, a.w_cur, a.hot, e, a.policy);
        part += finish_row(dot, a.row0 + i, a.s, a.w_cur, a.w_prev, a.w_out, a.policy);
    }
    return part;
}

// kGroup (2..32) consecutive lanes per row.  The row loop is strided per warp so that every lane of
// a warp runs the same number of iterations and the shuffles see the whole warp.
template <typename T, typename P, bool kWeighted, int kGroup>
__device__ double rows_vector(const SpmvArgs<T, P>& a) {
    constexpr int kGroupsPerWarp = kWarp / kGroup;
    const int lane = threadIdx.x % kGroup;
    const int group_in_warp = (threadIdx.x % kWarp) / kGroup;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / kWarp;
    double part = 0.0;
    for (int64_t base = warp * kGroupsPerWarp; base < a.nrows; base += n_warps * kGroupsPerWarp) {
        const int64_t i = base + group_in_warp;
        const bool active = i < a.nrows;
        T dot = 0;
        if (active) {
            const P end = a.indptr[i + 1];
            for (P e = a.indptr[i] + lane; e < end; e += kGroup)
                dot += entry<T, kWeighted>(a.values, a.indices, a.w_cur, a.hot, e, a.policy);
        }
        dot = gk::group_sum_down(dot, kGroup);
        if (active && lane == 0) part += finish_row(dot, a.row0 + i, a.s, a.w_cur, a.w_prev, a.w_out, a.policy);
    }
    return part;
}

// One warp per row, rows t in [t0, t1) (through rowlist when given).
template <typename T, typename P, bool kWeighted>
__device__ double warp_rows(const SpmvArgs<T, P>& a, int64_t t0, int64_t t1, const int32_t* __restrict__ list) {
    const int lane = threadIdx.x % kWarp;
    const int64_t warps = blockDim.x / kWarp;
    double part = 0.0;
    for (int64_t t = t0 + threadIdx.x / kWarp; t < t1; t += warps) {
        const int64_t i = list != nullptr ? (int64_t)list[t] : t;
        T dot = 0;
        for_each_product<T, kWeighted>(a.indices, a.values, a.w_cur, a.hot, (int64_t)a.indptr[i],
                                       (int64_t)a.indptr[i + 1], lane, kWarp, a.policy,
                                       [&](int64_t, T p) { dot += p; });
        dot = gk::group_sum_down(dot, kWarp);
        if (lane == 0) part += finish_row(dot, a.row0 + i, a.s, a.w_cur, a.w_prev, a.w_out, a.policy);
    }
    return part;
}

// Rows [r0, r1) with entries [e0, e1) within kStreamRows and kStreamCapacity: products are gathered
// with coalesced index loads over the block's whole entry range and staged in shared memory, with
// the row pointers (loaded alongside, so no second round trip); then each row is summed from shared
// memory by a group of threads sized to the block's row count (CSR-stream of Greathouse and Daga's
// CSR-Adaptive).
template <typename T, typename P, bool kWeighted>
__device__ double stream_rows(const SpmvArgs<T, P>& a, int64_t r0, int64_t r1, int64_t e0, int64_t e1) {
    __shared__ T staged[kStreamCapacity];
    __shared__ int32_t row_start[kStreamRows + 1];
    const int64_t rows = r1 - r0;
    P pointer[kRowPointersPerThread];
#pragma unroll
    for (int j = 0; j < kRowPointersPerThread; ++j) {
        const int64_t t = threadIdx.x + (int64_t)j * kBlock;
        pointer[j] = t <= rows ? a.indptr[r0 + t] : P(0);
    }
    for_each_product<T, kWeighted>(a.indices, a.values, a.w_cur, a.hot, e0, e1, threadIdx.x, blockDim.x, a.policy,
                                   [&](int64_t e, T p) { staged[e - e0] = p; });
#pragma unroll
    for (int j = 0; j < kRowPointersPerThread; ++j) {
        const int64_t t = threadIdx.x + (int64_t)j * kBlock;
        if (t <= rows) row_start[t] = (int32_t)((int64_t)pointer[j] - e0);
    }
    __syncthreads();
    int group = 1;
    while (group < kWarp && (int64_t)group * 2 * rows <= (int64_t)blockDim.x) group *= 2;
    const int lane = threadIdx.x % group;
    const int64_t groups = blockDim.x / group;
    const int64_t my_group = threadIdx.x / group;
    double part = 0.0;
    for (int64_t base = 0; base < rows; base += groups) {
        const int64_t local = base + my_group;
        const bool active = local < rows;
        T dot = 0;
        if (active) {
            const int32_t end = row_start[local + 1];
            for (int32_t j = row_start[local] + lane; j < end; j += group) dot += staged[j];
        }
        dot = gk::group_sum_down(dot, group);
        if (active && lane == 0) {
            part += finish_row(dot, a.row0 + r0 + local, a.s, a.w_cur, a.w_prev, a.w_out, a.policy);
        }
    }
    return part;
}

// One thread per row, rows rowlist[t0..t1) (at most one per thread).
template <typename T, typename P, bool kWeighted>
__device__ double thread_rows(const SpmvArgs<T, P>& a, int64_t t0, int64_t t1) {
    const int64_t t = t0 + threadIdx.x;
    if (t >= t1) return 0.0;
    const int64_t i = a.rowlist[t];
    T dot = 0;
    const P end = a.indptr[i + 1];
    for (P e = a.indptr[i]; e < end; ++e)
        dot += entry<T, kWeighted>(a.values, a.indices, a.w_cur, a.hot, e, a.policy);
    return finish_row(dot, a.row0 + i, a.s, a.w_cur, a.w_prev, a.w_out, a.policy);
}

// A segment [e0, e1) of long row i summed by the whole block; the last segment of the row to finish
// (atomic ticket per row) adds the segment sums in segment order, finishes the row and writes its
// share of alpha to long_alpha (which block finishes the row varies, so it joins no block partial).
template <typename T, typename P, bool kWeighted>
__device__ void long_segment(const SpmvArgs<T, P>& a, int64_t i, int64_t e0, int64_t e1, int64_t seg_base,
                               int64_t seg_index, int64_t n_seg, int64_t long_index) {
    __shared__ bool is_last;
    T dot = 0;
    for_each_product<T, kWeighted>(a.indices, a.values, a.w_cur, a.hot, e0, e1, threadIdx.x, blockDim.x, a.policy,
                                   [&](int64_t, T p) { dot += p; });
    const double s = block_sum(static_cast<double>(dot));
    if (threadIdx.x == 0) {
        a.seg_partials[seg_base + seg_index] = s;
        __threadfence();
        is_last = atomicAdd(a.seg_counters + long_index, 1u) == (unsigned)(n_seg - 1);
    }
    __syncthreads();
    if (is_last) {
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < n_seg; j += blockDim.x) acc += __ldcg(a.seg_partials + seg_base + j);
        acc = block_sum(acc);
        if (threadIdx.x == 0) {
            a.seg_counters[long_index] = 0u;
            a.long_alpha[long_index] = finish_row(static_cast<T>(acc), a.row0 + i, a.s, a.w_cur, a.w_prev, a.w_out,
                                                  a.policy);
        }
    }
}

// Blocks over the task table, in task order per block (so alpha's block partials, and therefore
// alpha, do not depend on scheduling).
template <typename T, typename P, bool kWeighted>
__device__ double rows_tasks(const SpmvArgs<T, P>& a) {
    __shared__ int64_t task[kTaskWidth];
    double part = 0.0;
    for (int64_t t = blockIdx.x; t < a.n_tasks; t += gridDim.x) {
        __syncthreads();  // the previous task's readers of `task` and of the staged products are done
        if (threadIdx.x < kTaskWidth) task[threadIdx.x] = ld_once(a.tasks + t * kTaskWidth + threadIdx.x, a.policy);
        __syncthreads();
        const int64_t kind = task[0], f1 = task[1], f2 = task[2], f3 = task[3], f4 = task[4];
        const int64_t f5 = task[5], f6 = task[6], f7 = task[7];
        switch (kind) {
            case kTaskStream:
                if (f2 - f1 <= kStreamRows && f4 - f3 <= kStreamCapacity) {
                    part += stream_rows<T, P, kWeighted>(a, f1, f2, f3, f4);
                } else {
                    part += warp_rows<T, P, kWeighted>(a, f1, f2, nullptr);
                }
                break;
            case kTaskThreadList: part += thread_rows<T, P, kWeighted>(a, f1, f2); break;
            case kTaskWarpList: part += warp_rows<T, P, kWeighted>(a, f1, f2, a.rowlist); break;
            case kTaskLongSegment: long_segment<T, P, kWeighted>(a, f1, f2, f3, f4, f5, f6, f7); break;
            default: break;
        }
    }
    return part;
}

}  // namespace

// ------------------------------------------------------------------------------------ entry points

// One device's share of a solve, the same from its first step to its last (graphkern.expm.gpu packs it
// once): its rows of A and the plan's task table, row list and long-row scratch, the coefficients, the
// block partials of its reductions, and the hot columns of gather_x.  Taken by value and copied into
// SpmvArgs at entry: a reference into the parameter space would make the loops' reads of its fields
// indexed parameter loads.
template <typename T, typename P>
struct SpmvShare {
    const P* indptr;
    const int32_t* indices;
    const T* values;
    const int64_t* tasks;
    int64_t n_tasks;
    const int32_t* rowlist;
    double* coef;
    int64_t cap;
    int32_t n_dev;
    int64_t row0, nrows;
    double* partials;
    double* seg_partials;
    unsigned* seg_counters;
    double* long_alpha;
    int64_t n_long;
    int32_t hot_len;
    uint32_t hot_start1;
};
#define EXPM_SPMV_SHARE_FIELDS(X, N, S)                                                                             \
    X(N, S, indptr) X(N, S, indices) X(N, S, values) X(N, S, tasks) X(N, S, n_tasks) X(N, S, rowlist) X(N, S, coef) \
    X(N, S, cap) X(N, S, n_dev) X(N, S, row0) X(N, S, nrows) X(N, S, partials) X(N, S, seg_partials)              \
    X(N, S, seg_counters) X(N, S, long_alpha) X(N, S, n_long) X(N, S, hot_len) X(N, S, hot_start1)

// Every SpMV entry point takes the same arguments (unused ones null) so the host launches them alike:
// the share, then what changes from step to step.
#define LANCZOS_SPMV_PARAMS(T, P)                                                                             \
    const SpmvShare<T, P> share, const T *w_cur, const T *w_prev, T *w_out, int64_t k, const double *beta_slots, \
        double breakdown, unsigned *counter, double *alpha_out, const uint64_t *alpha_peers,                 \
        int32_t n_alpha_peers, const int32_t *skip

#define LANCZOS_SPMV_BODY(T, P, ROWS)                                                                          \
    if (skip != nullptr && *skip) return;                                                                      \
    SpmvArgs<T, P> a{share.indptr, share.indices, share.values, share.tasks, share.n_tasks, share.rowlist,     \
                     w_cur, w_prev, w_out, share.row0, share.nrows,                                            \
                     step_scalars(share.coef, share.cap, k, beta_slots, share.n_dev, breakdown),               \
                     share.seg_partials, share.seg_counters, share.long_alpha, stream_policy(),                \
                     {share.hot_len, share.hot_start1}};                                                       \
    const double part = ROWS(a);                                                                               \
    if (alpha_out != nullptr)                                                                                  \
        grid_sum(part, share.partials, counter, alpha_out, alpha_peers, n_alpha_peers, share.long_alpha,       \
                 share.n_long);

// Blocks per SM the SpMV kernels are compiled for: 5 (48 registers) keeps the unweighted kernels
// from spilling (their local-memory traffic would go to L2 beside the gathers); the weighted ones
// need 64 registers (4 blocks).
#define SPMV_MIN_BLOCKS(W) ((W) ? 4 : 5)

#define DEFINE_SPMV(NAME, ROWS, T, TN, P, PN, W, WN)                                              \
    extern "C" __global__ void __launch_bounds__(kBlock, SPMV_MIN_BLOCKS(W))                   \
        lanczos_spmv_##NAME##_##TN##_##WN##_##PN(LANCZOS_SPMV_PARAMS(T, P)) {                   \
        LANCZOS_SPMV_BODY(T, P, (ROWS<T, P, W>))                                               \
    }

#define DEFINE_SPMV_ALL_TYPES(NAME, ROWS)                                   \
    DEFINE_SPMV(NAME, ROWS, float, f32, int32_t, i32, true, w)           \
    DEFINE_SPMV(NAME, ROWS, float, f32, int32_t, i32, false, u)          \
    DEFINE_SPMV(NAME, ROWS, float, f32, int64_t, i64, true, w)           \
    DEFINE_SPMV(NAME, ROWS, float, f32, int64_t, i64, false, u)          \
    DEFINE_SPMV(NAME, ROWS, double, f64, int32_t, i32, true, w)          \
    DEFINE_SPMV(NAME, ROWS, double, f64, int32_t, i32, false, u)         \
    DEFINE_SPMV(NAME, ROWS, double, f64, int64_t, i64, true, w)          \
    DEFINE_SPMV(NAME, ROWS, double, f64, int64_t, i64, false, u)

namespace {
template <typename T, typename P, bool W> __device__ double rows_vector2(const SpmvArgs<T, P>& a) { return rows_vector<T, P, W, 2>(a); }
template <typename T, typename P, bool W> __device__ double rows_vector4(const SpmvArgs<T, P>& a) { return rows_vector<T, P, W, 4>(a); }
template <typename T, typename P, bool W> __device__ double rows_vector8(const SpmvArgs<T, P>& a) { return rows_vector<T, P, W, 8>(a); }
template <typename T, typename P, bool W> __device__ double rows_vector16(const SpmvArgs<T, P>& a) { return rows_vector<T, P, W, 16>(a); }
template <typename T, typename P, bool W> __device__ double rows_vector32(const SpmvArgs<T, P>& a) { return rows_vector<T, P, W, 32>(a); }
}  // namespace

DEFINE_SPMV_ALL_TYPES(scalar, rows_scalar)
DEFINE_SPMV_ALL_TYPES(vector2, rows_vector2)
DEFINE_SPMV_ALL_TYPES(vector4, rows_vector4)
DEFINE_SPMV_ALL_TYPES(vector8, rows_vector8)
DEFINE_SPMV_ALL_TYPES(vector16, rows_vector16)
DEFINE_SPMV_ALL_TYPES(vector32, rows_vector32)
DEFINE_SPMV_ALL_TYPES(tasks, rows_tasks)

namespace {

// Other devices an update stores its rows into (peer access): up to kMaxRowPeers, one kernel
// parameter each (they change every step, so they are not worth a table in device memory).
constexpr int kMaxRowPeers = 7;

// w_out = v - alpha_k q_k over this device's rows, also stored into row_peers (the other devices'
// copies of w_out) where bit p of peer_mask[i] says that peer p's rows of A read column row0 + i
// (null: every row), ||w_out||^2 into *beta_out and beta_peers (first pass), and in the second pass of
// the basis-free mode y += g[k + 1] w_out (y holds this device's rows, float64).
template <typename T>
__device__ void update(const T* __restrict__ w_cur, T* __restrict__ w_out, double* coef, int64_t cap, int64_t k,
                       const double* alpha_slots, int32_t n_dev, int64_t row0, int64_t nrows, double* partials,
                       unsigned* counter, double* beta_out, const uint64_t* beta_peers, int32_t n_beta_peers,
                       double* __restrict__ y, const double* __restrict__ g, int32_t n_row_peers,
                       const uint8_t* __restrict__ peer_mask, T* const (&row_peers)[kMaxRowPeers]) {
    Coefficients c(coef, cap);
    double alpha;
    if (alpha_slots != nullptr) {
        alpha = 0.0;
        for (int d = 0; d < n_dev; ++d) alpha += alpha_slots[d];
        if (blockIdx.x == 0 && threadIdx.x == 0) c.alpha[k] = alpha;
    } else {
        alpha = c.alpha[k];
    }
    const T scale = static_cast<T>(alpha * c.rscale[k]);
    const double gk = y != nullptr ? g[k + 1] : 0.0;
    double part = 0.0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
        const int64_t r = row0 + i;
        const T w = w_out[r] - scale * w_cur[r];
        w_out[r] = w;
        if (n_row_peers > 0) {
            const unsigned wanted = peer_mask != nullptr ? peer_mask[i] : 0xffu;
#pragma unroll
            for (int p = 0; p < kMaxRowPeers; ++p) {
                if (p < n_row_peers && ((wanted >> p) & 1u)) row_peers[p][r] = w;
            }
        }
        part += static_cast<double>(w) * static_cast<double>(w);
        if (y != nullptr) y[i] += gk * static_cast<double>(w);
    }
    if (beta_out != nullptr) grid_sum(part, partials, counter, beta_out, beta_peers, n_beta_peers, nullptr, 0);
}

// y[i] = sum_j g[j] * column_j[row0 + i] over the stored basis columns (pointer table), in float64.
template <typename T>
__device__ void combine(const uint64_t* __restrict__ columns, const double* __restrict__ g, int64_t n_cols,
                        int64_t row0, int64_t nrows, double* __restrict__ y) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
        double acc = 0.0;
        for (int64_t j = 0; j < n_cols; ++j) acc += g[j] * static_cast<double>(reinterpret_cast<const T*>(columns[j])[row0 + i]);
        y[i] = acc;
    }
}

template <typename T>
__device__ void fill_ones(T* __restrict__ x, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = T(1);
}

// out = y * f0 * f1 * f2 in the output type: the answer's scale exp(log_factor) applied in the same
// steps as on the host (each factor finite), so y never crosses the host in float64.
template <typename T>
__device__ void scale_out(const double* __restrict__ y, int64_t nrows, double f0, double f1, double f2,
                          T* __restrict__ out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
        double v = y[i];
        v = __dmul_rn(v, f0);
        v = __dmul_rn(v, f1);
        v = __dmul_rn(v, f2);
        out[i] = static_cast<T>(v);
    }
}

}  // namespace

// An update's share of a solve, the same at every step (graphkern.expm.gpu packs it once): the
// coefficients, the device count, its rows, the block partials and ticket of its reduction.
struct UpdateShare {
    double* coef;
    int64_t cap;
    int32_t n_dev;
    int64_t row0, nrows;
    double* partials;
    unsigned* counter;
};
#define EXPM_UPDATE_SHARE_FIELDS(X, N, S) \
    X(N, S, coef) X(N, S, cap) X(N, S, n_dev) X(N, S, row0) X(N, S, nrows) X(N, S, partials) X(N, S, counter)

// The other devices' copies of w_{k+1} an update stores its rows into (n of them, mask as in update;
// all null and n = 0 on one device or without peer access).
template <typename T>
struct RowPeers {
    T *peer0, *peer1, *peer2, *peer3, *peer4, *peer5, *peer6;
    const uint8_t* mask;
    int32_t n;
};
#define EXPM_ROW_PEERS_FIELDS(X, N, S)                                                                            \
    X(N, S, peer0) X(N, S, peer1) X(N, S, peer2) X(N, S, peer3) X(N, S, peer4) X(N, S, peer5) X(N, S, peer6) \
    X(N, S, mask) X(N, S, n)

#define DEFINE_VECTOR_KERNELS(T, TN)                                                                          \
    extern "C" __global__ void __launch_bounds__(kBlock) lanczos_update_##TN(                                 \
        const UpdateShare share, const T *w_cur, T *w_out, int64_t k, const double *alpha_slots,              \
        double *beta_out, const uint64_t *beta_peers, int32_t n_beta_peers, double *y, const double *g,       \
        const RowPeers<T> peers, const int32_t *skip) {                                                       \
        if (skip != nullptr && *skip) return;                                                                 \
        T *const row_peers[kMaxRowPeers] = {peers.peer0, peers.peer1, peers.peer2, peers.peer3,               \
                                            peers.peer4, peers.peer5, peers.peer6};                           \
        update<T>(w_cur, w_out, share.coef, share.cap, k, alpha_slots, share.n_dev, share.row0, share.nrows,  \
                  share.partials, share.counter, beta_out, beta_peers, n_beta_peers, y, g, peers.n, peers.mask, \
                  row_peers);                                                                                 \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(kBlock) lanczos_combine_##TN(                                \
        const uint64_t *columns, const double *g, int64_t n_cols, int64_t row0, int64_t nrows, double *y) {   \
        combine<T>(columns, g, n_cols, row0, nrows, y);                                                       \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(kBlock) lanczos_fill_ones_##TN(T *x, int64_t n) {           \
        fill_ones<T>(x, n);                                                                                   \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(kBlock) lanczos_scale_out_##TN(                              \
        const double *y, int64_t nrows, double f0, double f1, double f2, T *out) {                            \
        scale_out<T>(y, nrows, f0, f1, f2, out);                                                              \
    }

DEFINE_VECTOR_KERNELS(float, f32)
DEFINE_VECTOR_KERNELS(double, f64)

// ------------------------------------------------------------------------------- locality reordering
// The operator of a skewed graph may be relabelled by decreasing degree (graphkern.expm.order.
// DeviceOrder): A' = P A P^T with new row i = old row order[i] and old column j = new column
// inverse[j].  The device builds order, inverse and A''s row pointers (expm_order.cuh); these
// kernels move the nonzeros, so the host never passes over them.

#include "expm_order.cuh"

namespace {

// New local row i (of nrows) receives old row order[i]: dst[new_indptr[i] + t] = src[old_indptr[old] + t],
// mapped through `inverse` when it is given (column indices).  Each warp moves runs of kMoveRun
// entries of dst, whichever rows they fall in: rows come sorted by decreasing degree, and a warp per
// row would leave a hub of 10^5 entries to one warp long after the others end.  A lane finds its
// entries' rows by walking forward from the run's first row.  The order of entries within a row is
// kept, though the mapped column ids are no longer sorted (no SpMV variant needs them sorted: a
// row's products are only summed).
//
// Mapping column ids also checks them: an id outside [0, n_cols) is written as 0 and the smallest
// such entry (its place in A as given) is left in *bad (the host's ULLONG_MAX when none), which the
// host reads before any kernel gathers through the moved ids.
constexpr int64_t kMoveRun = 1024;

template <typename V, typename P>
__device__ void permute_rows(const int64_t* __restrict__ old_indptr, const int32_t* __restrict__ order,
                             const P* __restrict__ new_indptr, int64_t nrows, const V* __restrict__ src,
                             const int32_t* __restrict__ inverse, int64_t n_cols, unsigned long long* bad,
                             V* __restrict__ dst) {
    const int lane = threadIdx.x % kWarp;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / kWarp;
    const int64_t nnz = (int64_t)new_indptr[nrows] - (int64_t)new_indptr[0];
    for (int64_t p0 = warp * kMoveRun; p0 < nnz; p0 += n_warps * kMoveRun) {
        const int64_t p1 = p0 + kMoveRun < nnz ? p0 + kMoveRun : nnz;
        int64_t row = gk::last_not_above(new_indptr, 0, nrows, p0);
        for (int64_t p = p0 + lane; p < p1; p += kWarp) {
            while ((int64_t)new_indptr[row + 1] <= p) ++row;
            const int64_t s = old_indptr[order[row]] + (p - (int64_t)new_indptr[row]);
            const V v = src[s];
            if constexpr (std::is_integral_v<V>) {
                if (inverse == nullptr) {
                    dst[p] = v;
                } else if (v >= 0 && v < n_cols) {
                    dst[p] = static_cast<V>(inverse[v]);
                } else {
                    dst[p] = 0;
                    atomicMin(bad, (unsigned long long)s);
                }
            } else {
                dst[p] = v;
            }
        }
    }
}

// dst[i] = src[index[i]], i < n: x into the new order (index = order), y back (index = inverse).
template <typename T>
__device__ void gather(const T* __restrict__ src, const int32_t* __restrict__ index, int64_t n, T* __restrict__ dst) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[index[i]];
}

}  // namespace

// A move of rows (permute_rows, graphkern.expm.device packs it): the old row pointers, the new rows'
// old rows, the new row pointers (P), the rows, the inverse order with the columns' count (inverse
// null: values, moved as they are) and where the first bad column id goes.
struct RowMove {
    const int64_t* __restrict__ old_indptr;
    const int32_t* __restrict__ order;
    const void* __restrict__ new_indptr;
    int64_t nrows;
    const int32_t* __restrict__ inverse;
    int64_t n_cols;
    unsigned long long* __restrict__ bad;
};
#define EXPM_ROW_MOVE_FIELDS(X, N, S)                                                                        \
    X(N, S, old_indptr) X(N, S, order) X(N, S, new_indptr) X(N, S, nrows) X(N, S, inverse) X(N, S, n_cols) \
    X(N, S, bad)

#define DEFINE_PERMUTE(V, VN, P, PN)                                                                           \
    extern "C" __global__ void __launch_bounds__(kBlock)                                                       \
        lanczos_permute_rows_##VN##_##PN(const RowMove move, const V *src, V *dst) {                           \
        permute_rows<V, P>(move.old_indptr, move.order, static_cast<const P *>(move.new_indptr), move.nrows,   \
                           src, move.inverse, move.n_cols, move.bad, dst);                                     \
    }

DEFINE_PERMUTE(int32_t, idx, int32_t, i32)
DEFINE_PERMUTE(int32_t, idx, int64_t, i64)
DEFINE_PERMUTE(float, f32, int32_t, i32)
DEFINE_PERMUTE(float, f32, int64_t, i64)
DEFINE_PERMUTE(double, f64, int32_t, i32)
DEFINE_PERMUTE(double, f64, int64_t, i64)

// A's content check after its upload (cuda_src/common/csr_check.cuh): the whole matrix as given
// (int64 row pointers) before it is reordered, or one device's row block (local row pointers).
GK_CSR_CHECK_ENTRY(csr_check_i32, int32_t)
GK_CSR_CHECK_ENTRY(csr_check_i64, int64_t)

extern "C" __global__ void __launch_bounds__(kBlock) lanczos_gather_f32(const float *src, const int32_t *index,
                                                                         int64_t n, float *dst) {
    gather<float>(src, index, n, dst);
}
extern "C" __global__ void __launch_bounds__(kBlock) lanczos_gather_f64(const double *src, const int32_t *index,
                                                                         int64_t n, double *dst) {
    gather<double>(src, index, n, dst);
}

// reads[indices[e]] = 1 for every stored entry e < nnz: the columns of A (entries of x) that one
// device's rows read, from which the host builds the other devices' peer masks (only rows some
// device reads cross to it).  Concurrent writes store the same byte.
extern "C" __global__ void __launch_bounds__(kBlock) lanczos_mark_columns(const int32_t *indices, int64_t nnz,
                                                                           uint8_t *reads) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nnz; e += stride) reads[indices[e]] = 1;
}

// max_i |y_i| over rows [0, nrows) into *peak_bits, as the bit pattern of a non-negative double: for
// those the integer order is the numeric order, and a NaN (exponent all ones, non-zero mantissa)
// sorts above inf, so a NaN anywhere shows in the peak.  *peak_bits must be zero before the launch.
extern "C" __global__ void __launch_bounds__(kBlock) lanczos_peak(const double *y, int64_t nrows,
                                                                   unsigned long long *peak_bits) {
    unsigned long long m = 0ull;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nrows; i += stride) {
        const unsigned long long bits = (unsigned long long)__double_as_longlong(fabs(y[i]));
        m = bits > m ? bits : m;
    }
    for (int o = kWarp / 2; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_down_sync(kFullMask, m, o);
        m = other > m ? other : m;
    }
    if ((threadIdx.x & (kWarp - 1)) == 0 && m != 0ull) atomicMax(peak_bits, m);
}

// The second half of grid_sum for kernels launched without a counter (one block).
extern "C" __global__ void __launch_bounds__(kBlock) lanczos_sum_partials(const double *partials, int64_t n_partials,
                                                                        const double *extra, int64_t n_extra,
                                                                        double *out, const uint64_t *peer_outs,
                                                                        int32_t n_peer_outs, const int32_t *skip) {
    if (skip != nullptr && *skip) return;
    sum_partials(partials, n_partials, extra, n_extra, out, peer_outs, n_peer_outs);
}

// The gate before step k's kernels (first pass): *skip = k >= *stop_at, read by every block of the
// step's SpMV, sum and update, which then return at once.  The host writes stop_at (mapped host
// memory) once it has decided the Krylov dimension m, so that the steps queued ahead of the check
// point (the engine's lookahead) cost a launch instead of an SpMV each; reading it once per step
// in one thread makes the decision the same for every block of the step.  *ran = k + 1 for a step
// that runs (mapped too: the host counts the SpMVs done).  Steps at or past m produce nothing the
// answer reads, and every block of a skipped kernel returns before its tickets, so no counter is
// left armed.
extern "C" __global__ void lanczos_gate(const volatile int64_t *stop_at, int64_t k, int32_t *skip,
                                        volatile int64_t *ran) {
    const int32_t s = k >= *stop_at ? 1 : 0;
    *skip = s;
    if (!s) *ran = k + 1;
}

// The launch shapes, row-block limits, task table and peer slots graphkern/expm/plans.py,
// order.py and device.py plan with, and the layouts of the struct parameters (graphkern/expm/gpu.py);
// the SpMV share by value and index type, named once here (a template's comma cannot pass through
// GK_STRUCT)
using SpmvShareF32I32 = SpmvShare<float, int32_t>;
using SpmvShareF32I64 = SpmvShare<float, int64_t>;
using SpmvShareF64I32 = SpmvShare<double, int32_t>;
using SpmvShareF64I64 = SpmvShare<double, int64_t>;
GRAPHKERN_EXPORTS = {
    {"block", kBlock},
    {"warp", gk::kWarp},
    {"stream_capacity", kStreamCapacity},
    {"stream_rows", kStreamRows},
    {"task_width", kTaskWidth},
    {"task_stream", kTaskStream},
    {"task_thread_list", kTaskThreadList},
    {"task_warp_list", kTaskWarpList},
    {"task_long", kTaskLongSegment},
    {"max_row_peers", kMaxRowPeers},
    {"scan_chunk", kScanChunk},
    GK_STRUCT("spmv_share_f32_i32", SpmvShareF32I32, EXPM_SPMV_SHARE_FIELDS)
    GK_STRUCT("spmv_share_f32_i64", SpmvShareF32I64, EXPM_SPMV_SHARE_FIELDS)
    GK_STRUCT("spmv_share_f64_i32", SpmvShareF64I32, EXPM_SPMV_SHARE_FIELDS)
    GK_STRUCT("spmv_share_f64_i64", SpmvShareF64I64, EXPM_SPMV_SHARE_FIELDS)
    GK_STRUCT("update_share", UpdateShare, EXPM_UPDATE_SHARE_FIELDS)
    GK_STRUCT("row_move", RowMove, EXPM_ROW_MOVE_FIELDS)
    GK_STRUCT("degree_order", DegreeOrder, EXPM_DEGREE_ORDER_FIELDS)
    GK_STRUCT("rowblock_rule", RowblockRule, EXPM_ROWBLOCK_RULE_FIELDS)
    GK_STRUCT("row_peers_f32", RowPeers<float>, EXPM_ROW_PEERS_FIELDS)
    GK_STRUCT("row_peers_f64", RowPeers<double>, EXPM_ROW_PEERS_FIELDS)
    GK_CSR_CHECK_STRUCT(csr_check_i32, int32_t)
    GK_CSR_CHECK_STRUCT(csr_check_i64, int64_t)
};
