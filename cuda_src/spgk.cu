// Shortest-path graph kernel (graphkern.spgk) on the GPU.
//
// Every graph of a batch lives on the device once: its vertices' label features
// (discrete int64 rows, continuous T rows) and its shortest-path graph as unordered
// paths (a, b), a < b, stored as int2 endpoints plus float64 lengths.  For a pair of
// graphs with vertex-kernel matrix V (n1 x n2),
//
//     K = 2 * sum_{p=(a,b)} sum_{q=(c,d)} k_e(l_p, l_q) * (V[a,c] V[b,d] + V[a,d] V[b,c])
//
// which equals the ordered-pair definition (see graphkern/spgk.py).  Graph 1 is the
// one with more paths (the host or the batched kernel orders each pair).
//
// Entry points, each in _f32 and _f64 (T = the type of V and of the products; sums
// are always accumulated in double):
//   spgk_vertex_matrix_*   V for one pair, grid-stride over n1 * n2
//   spgk_walk_1d_*         a thread per path of graph 1, looping over graph 2's paths
//   spgk_walk_2d_*         a thread per (path, path) pair, 2-D grid-stride
//   spgk_reduce_partials   the walk kernels' per-block sums into one kernel value
//   spgk_batched_*         a block per pair from a pair list (taken by an atomic
//                          counter), V in shared memory when it fits, the walk over
//                          the flattened path pairs; many small pairs in one launch.
//                          With `limit` (the hybrid backend) the CPU takes pairs from the
//                          list's far end while the kernel runs: it lowers *limit (device
//                          memory, by copies on another stream) and a block stops at a pair
//                          index >= *limit; `progress` (host memory mapped into the device)
//                          tells the host, every 32 pairs, how far the blocks have got.
// The length kernel (Dirac, Gaussian, Brownian bridge) is a template parameter chosen
// by a switch at kernel entry, so no loop carries a branch on it.
#include <cstdint>

#include "common/exports.cuh"
#include "common/reductions.cuh"

namespace {

enum { EDGE_DIRAC = 0, EDGE_GAUSSIAN = 1, EDGE_BROWNIAN = 2 };

constexpr int MAX_WARPS = 32;  // 1024 threads per block at most

template <int KIND, typename T>
__device__ __forceinline__ T length_kernel(double w1, double w2, T param) {
    if (KIND == EDGE_DIRAC) {
        return w1 == w2 ? T(1) : T(0);
    } else if (KIND == EDGE_GAUSSIAN) {
        T t = T(w1 - w2);
        return exp(-param * t * t);
    } else {
        return fmax(T(0), param - T(fabs(w1 - w2)));
    }
}

// k_v of vertex u (a global row of batch 1) and vertex v (a global row of batch 2)
template <typename T>
__device__ __forceinline__ T vertex_kernel(const int64_t* __restrict__ disc1, const T* __restrict__ cont1, int64_t u,
                                           const int64_t* __restrict__ disc2, const T* __restrict__ cont2, int64_t v,
                                           int n_disc, int n_cont, const T* __restrict__ weights) {
    bool match = true;
    for (int k = 0; k < n_disc; ++k) match &= disc1[u * n_disc + k] == disc2[v * n_disc + k];
    T d2 = T(0);
    for (int k = 0; k < n_cont; ++k) {
        T t = cont1[u * n_cont + k] - cont2[v * n_cont + k];
        d2 += weights[k] * t * t;
    }
    return match ? exp(-d2) : T(0);
}

// Sum of v over the block; the result is valid in thread 0.  scratch holds MAX_WARPS
// doubles; the caller syncs before reusing it.
__device__ double block_sum(double v, double* scratch) {
    const int tid = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
    const int n_threads = blockDim.x * blockDim.y * blockDim.z;
    return gk::block_sum_to_first(v, scratch, tid, (n_threads + gk::kWarp - 1) / gk::kWarp);
}

template <typename T>
__device__ void vertex_matrix(const int64_t* disc1, const T* cont1, int64_t off1, int64_t n1,
                              const int64_t* disc2, const T* cont2, int64_t off2, int64_t n2,
                              int n_disc, int n_cont, const T* weights, T* V) {
    const int64_t total = n1 * n2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t a = i / n2, c = i - a * n2;
        V[i] = vertex_kernel(disc1, cont1, off1 + a, disc2, cont2, off2 + c, n_disc, n_cont, weights);
    }
}

// An outer path (a, b) of length w: the rows V[a, :] and V[b, :] it reads
template <typename T>
struct OuterPath {
    const T* Va;
    const T* Vb;
    double w;

    __device__ __forceinline__ OuterPath(const int2* ends, const double* lengths, int64_t p, const T* V, int64_t n2) {
        const int2 e = ends[p];
        Va = V + e.x * n2;
        Vb = V + e.y * n2;
        w = lengths[p];
    }

    // its contribution with inner path (c, d) of length w2
    template <int KIND>
    __device__ __forceinline__ double with(int2 cd, double w2, T param) const {
        return double(length_kernel<KIND, T>(w, w2, param) * (Va[cd.x] * Vb[cd.y] + Va[cd.y] * Vb[cd.x]));
    }
};

template <int KIND, typename T>
__device__ void walk_1d(const int2* __restrict__ ends1, const double* __restrict__ len1, int64_t P1,
                        const int2* __restrict__ ends2, const double* __restrict__ len2, int64_t P2,
                        const T* __restrict__ V, int64_t n2, T param, double* __restrict__ partials) {
    __shared__ double scratch[MAX_WARPS];
    double acc = 0.0;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P1; p += (int64_t)gridDim.x * blockDim.x) {
        const OuterPath<T> outer(ends1, len1, p, V, n2);
        double inner = 0.0;
        // every thread of a warp reads the same inner path: one broadcast load
        for (int64_t q = 0; q < P2; ++q) inner += outer.template with<KIND>(ends2[q], len2[q], param);
        acc += inner;
    }
    const double s = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

template <int KIND, typename T>
__device__ void walk_2d(const int2* __restrict__ ends1, const double* __restrict__ len1, int64_t P1,
                        const int2* __restrict__ ends2, const double* __restrict__ len2, int64_t P2,
                        const T* __restrict__ V, int64_t n2, T param, double* __restrict__ partials) {
    __shared__ double scratch[MAX_WARPS];
    double acc = 0.0;
    for (int64_t p = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; p < P1; p += (int64_t)gridDim.y * blockDim.y) {
        const OuterPath<T> outer(ends1, len1, p, V, n2);
        for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < P2; q += (int64_t)gridDim.x * blockDim.x)
            acc += outer.template with<KIND>(ends2[q], len2[q], param);
    }
    const double s = block_sum(acc, scratch);
    if (threadIdx.x == 0 && threadIdx.y == 0) partials[blockIdx.y * (int64_t)gridDim.x + blockIdx.x] = s;
}

}  // namespace

// A batch of graphs as the device holds it (graphkern.spgk.gpu._DeviceBatch): per graph its first
// vertex row and first path; per vertex its discrete (int64) and continuous (T) label rows; per path
// its ends and length.
struct BatchArrays {
    const int64_t* node_offsets;
    const int64_t* disc;
    const void* cont;
    const int64_t* path_offsets;
    const int2* ends;
    const double* lengths;
};
#define SPGK_BATCH_FIELDS(X, N, S) \
    X(N, S, node_offsets) X(N, S, disc) X(N, S, cont) X(N, S, path_offsets) X(N, S, ends) X(N, S, lengths)

// One graph of a batch as the per-pair kernels (spgk_vertex_matrix, spgk_walk_*) take it, graph 1 of
// a pair the one with more paths: the batch's label rows (discrete int64, continuous T) with the
// graph's first row and its n vertices, and its paths (ends and lengths from its first) and their
// number.  graphkern.spgk.gpu packs one per graph of a batch in one pass.
struct GraphPaths {
    const int64_t* disc;
    const void* cont;
    int64_t first, n;
    const int2* ends;
    const double* lengths;
    int64_t P;
};
#define SPGK_GRAPH_PATHS_FIELDS(X, N, S) \
    X(N, S, disc) X(N, S, cont) X(N, S, first) X(N, S, n) X(N, S, ends) X(N, S, lengths) X(N, S, P)

// The rest of a spgk_batched launch: the vertex kernel (label columns, gammas), the pair list, the
// length kernel, where V goes (shared memory up to shared_capacity values, else scratch_V, a
// stride a block), the pair counter, the hybrid's limit and progress (null without a CPU beside),
// and the output (one value a pair, in list order).
template <typename T>
struct BatchedJob {
    int32_t n_disc, n_cont;
    const T* __restrict__ weights;
    const int64_t* __restrict__ pair_a;
    const int64_t* __restrict__ pair_b;
    int64_t n_pairs;
    int32_t kind;
    T param;
    int64_t shared_capacity;
    T* __restrict__ scratch_V;
    int64_t scratch_stride;
    unsigned long long* __restrict__ next_pair;
    const volatile long long* limit;
    volatile long long* progress;
    double* __restrict__ out;
};
#define SPGK_BATCHED_FIELDS(X, N, S)                                                                       \
    X(N, S, n_disc) X(N, S, n_cont) X(N, S, weights) X(N, S, pair_a) X(N, S, pair_b) X(N, S, n_pairs)     \
    X(N, S, kind) X(N, S, param) X(N, S, shared_capacity) X(N, S, scratch_V) X(N, S, scratch_stride)      \
    X(N, S, next_pair) X(N, S, limit) X(N, S, progress) X(N, S, out)

GRAPHKERN_EXPORTS = {
    GK_STRUCT("batch", BatchArrays, SPGK_BATCH_FIELDS)
    GK_STRUCT("graph_paths", GraphPaths, SPGK_GRAPH_PATHS_FIELDS)
    GK_STRUCT("batched_f32", BatchedJob<float>, SPGK_BATCHED_FIELDS)
    GK_STRUCT("batched_f64", BatchedJob<double>, SPGK_BATCHED_FIELDS)
};

namespace {

template <int KIND, typename T>
__device__ void batched(BatchArrays A, BatchArrays B, int n_disc, int n_cont, const T* __restrict__ weights,
                        const int64_t* __restrict__ pair_a, const int64_t* __restrict__ pair_b, int64_t n_pairs,
                        T param, int64_t shared_capacity, T* __restrict__ scratch_V, int64_t scratch_stride,
                        unsigned long long* __restrict__ next_pair, const volatile long long* limit,
                        volatile long long* progress, double* __restrict__ out) {
    extern __shared__ double shared[];  // [MAX_WARPS] reduction scratch, then V (shared_capacity values)
    double* red = shared;
    T* V_shared = reinterpret_cast<T*>(shared + MAX_WARPS);
    __shared__ int64_t current;
    for (;;) {
        // dynamic assignment: pair costs span orders of magnitude in mixed sets
        if (threadIdx.x == 0) {
            int64_t k = (int64_t)atomicAdd(next_pair, 1ull);
            if (limit != nullptr && k < n_pairs) {
                // progress is a hint (posted writes over the host link, from any block, in any
                // order; one pair in 32 keeps them few: host-memory traffic per pair from every
                // block slows the kernel); the limit, read from L2, decides: a pair at or past it
                // is the CPU's
                if ((k & 31) == 0) *progress = k;
                if (k >= *limit) k = n_pairs;
            }
            current = k;
        }
        __syncthreads();
        const int64_t k = current;
        if (k >= n_pairs) break;
        BatchArrays G1 = A, G2 = B;
        int64_t g1 = pair_a[k], g2 = pair_b[k];
        int64_t P1 = G1.path_offsets[g1 + 1] - G1.path_offsets[g1];
        int64_t P2 = G2.path_offsets[g2 + 1] - G2.path_offsets[g2];
        if (P2 > P1) {  // graph 1 is the one with more paths
            BatchArrays t = G1; G1 = G2; G2 = t;
            int64_t g = g1; g1 = g2; g2 = g;
            int64_t P = P1; P1 = P2; P2 = P;
        }
        const int64_t off1 = G1.node_offsets[g1], n1 = G1.node_offsets[g1 + 1] - off1;
        const int64_t off2 = G2.node_offsets[g2], n2 = G2.node_offsets[g2 + 1] - off2;
        T* V = n1 * n2 <= shared_capacity ? V_shared : scratch_V + blockIdx.x * scratch_stride;
        for (int64_t i = threadIdx.x; i < n1 * n2; i += blockDim.x) {
            const int64_t a = i / n2, c = i - a * n2;
            V[i] = vertex_kernel(G1.disc, static_cast<const T*>(G1.cont), off1 + a,
                                 G2.disc, static_cast<const T*>(G2.cont), off2 + c, n_disc, n_cont, weights);
        }
        __syncthreads();
        const int2* ends1 = G1.ends + G1.path_offsets[g1];
        const double* len1 = G1.lengths + G1.path_offsets[g1];
        const int2* ends2 = G2.ends + G2.path_offsets[g2];
        const double* len2 = G2.lengths + G2.path_offsets[g2];
        double acc = 0.0;
        if (P2 > 0) {
            // thread t takes flattened path pairs t, t + blockDim, ...; (p, q) advance without a division
            const int64_t step = blockDim.x, step_p = step / P2, step_q = step - step_p * P2;
            int64_t p = threadIdx.x / P2, q = threadIdx.x - (threadIdx.x / P2) * P2;
            if (p < P1) {
                OuterPath<T> outer(ends1, len1, p, V, n2);
                for (;;) {
                    acc += outer.template with<KIND>(ends2[q], len2[q], param);
                    int64_t next = p + step_p;
                    q += step_q;
                    if (q >= P2) { q -= P2; ++next; }
                    if (next >= P1) break;
                    // with blockDim < P2 the outer path changes only every few steps: reload it then
                    if (next != p) outer = OuterPath<T>(ends1, len1, next, V, n2);
                    p = next;
                }
            }
        }
        const double s = block_sum(acc, red);
        if (threadIdx.x == 0) out[k] = 2.0 * s;
        __syncthreads();  // V, red and current are reused by the next pair
    }
}

}  // namespace

#define SPGK_DISPATCH(KIND_VAR, CALL)                          \
    switch (KIND_VAR) {                                        \
        case EDGE_DIRAC: { constexpr int K = EDGE_DIRAC; CALL; break; }       \
        case EDGE_GAUSSIAN: { constexpr int K = EDGE_GAUSSIAN; CALL; break; } \
        default: { constexpr int K = EDGE_BROWNIAN; CALL; break; }            \
    }

#define SPGK_ENTRY_POINTS(SUFFIX, T)                                                                                  \
    extern "C" __global__ void spgk_vertex_matrix_##SUFFIX(const GraphPaths g1, const GraphPaths g2, int n_disc,      \
                                                         int n_cont, const T* weights, T* V) {                         \
        vertex_matrix<T>(g1.disc, static_cast<const T*>(g1.cont), g1.first, g1.n, g2.disc,                             \
                         static_cast<const T*>(g2.cont), g2.first, g2.n, n_disc, n_cont, weights, V);                  \
    }                                                                                                                  \
    extern "C" __global__ void spgk_walk_1d_##SUFFIX(const GraphPaths g1, const GraphPaths g2, const T* V, int kind,  \
                                                   T param, double* partials) {                                        \
        SPGK_DISPATCH(kind, (walk_1d<K, T>(g1.ends, g1.lengths, g1.P, g2.ends, g2.lengths, g2.P, V, g2.n, param,      \
                                           partials)))                                                                 \
    }                                                                                                                  \
    extern "C" __global__ void spgk_walk_2d_##SUFFIX(const GraphPaths g1, const GraphPaths g2, const T* V, int kind,  \
                                                   T param, double* partials) {                                        \
        SPGK_DISPATCH(kind, (walk_2d<K, T>(g1.ends, g1.lengths, g1.P, g2.ends, g2.lengths, g2.P, V, g2.n, param,      \
                                           partials)))                                                                 \
    }                                                                                                                  \
    /* by value, not __grid_constant__: a reference into the parameter space would make the pair */                 \
    /* loop read the job's fields by indexed loads */                                                                 \
    extern "C" __global__ void spgk_batched_##SUFFIX(const BatchArrays A, const BatchArrays B,                        \
                                                    const BatchedJob<T> job) {                                       \
        SPGK_DISPATCH(job.kind, (batched<K, T>(A, B, job.n_disc, job.n_cont, job.weights, job.pair_a, job.pair_b,     \
                                               job.n_pairs, job.param, job.shared_capacity, job.scratch_V,           \
                                               job.scratch_stride, job.next_pair, job.limit, job.progress, job.out))) \
    }

SPGK_ENTRY_POINTS(f32, float)
SPGK_ENTRY_POINTS(f64, double)

// out[slot] = scale * sum(partials[0:n]); one block
extern "C" __global__ void spgk_reduce_partials(const double* __restrict__ partials, int64_t n, double* __restrict__ out,
                                                int64_t slot, double scale) {
    __shared__ double scratch[MAX_WARPS];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    const double s = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[slot] = scale * s;
}
