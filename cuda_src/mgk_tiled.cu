// The tiled marginalized-graph-kernel solver: the core solver's preconditioned CG (mgk.cu) with
// sparsity, reordering, tile sharing, clusters and dynamic scheduling, each switchable
// (graphkern/mgk/tiled.py picks the entry point and the run-time parameters):
//
//   inter-tile sparsity  the host streams only non-empty octiles, or every octile ("dense" mode);
//   reordering           the host renumbers the vertices (PBR / RCM) before cutting octiles;
//   intra-tile sparsity  per octile pair, dense x dense / dense x sparse / sparse x sparse from the
//                        two nonzero counts (ss_max, ds_max; mgk_tiled_octile.cuh), on octiles
//                        stored fully (64 values) or compactly (nonzeros + a 64-bit bitmap);
//   tile sharing         TEAM_BLOCK: the warps of a block solve one pair together, each warp
//                        staging octiles into shared memory for all of them, the outputs
//                        accumulated with shared-memory atomics; otherwise a warp per pair;
//   clusters (sm_90+)    the block team spread over a thread-block cluster of kClusterBlocks
//                        blocks: each block takes every kClusterBlocks-th group of G1 tile rows
//                        of the XMV (disjoint outputs, so no inter-block atomics), the CG vector
//                        loops are split over the whole cluster, and the reductions go through
//                        distributed shared memory.  A few large pairs (protein-sized graphs)
//                        then fill the GPU: a block per pair leaves most SMs idle below one
//                        pair per resident block.
//   dynamic scheduling   teams take the next pair from a global atomic counter (the host sorts
//                        the pairs by predicted cost, largest first); otherwise a static stride.
//                        Several devices may share one counter (peer access, system-scope
//                        atomics): each takes the next pair of one common list when it is free.
//
// A team (one warp, or one block) computes the XMV  y = (A1 (x) A2 (.) E) p  of its pair by
// groups of consecutive tile rows of G1 whose octiles fit the team's `row_slots` shared slots.
// The group's octiles are staged once (and stay staged while consecutive XMVs, and pairs, need
// the same ones: a G1 of at most row_slots octiles is staged once for the whole solve); every
// octile of G2 is then staged once per group by one warp and multiplied with all staged octiles
// of G1.  The products accumulate into a slab of y in shared memory (the group's rows times a
// window of G2's columns, `slab_cap` values), which is flushed to Ap = diag p - y once complete;
// the flush also accumulates p . Ap.  CG vectors live in a global scratch slot per team; CG
// scalars are accumulated in double in both precisions, as in mgk.cu.
#include <cstdint>

#include "common/cg.cuh"
#include "common/exports.cuh"
#include "common/kernel_program.cuh"
#include "common/teams.cuh"
#include "mgk_tiled_octile.cuh"

namespace mgk_tiled {

using namespace gk;  // the teams and their cluster helpers

constexpr int kMaxParams = 96;   // params per program
constexpr int kMaxCode = 256;    // code of both programs
constexpr int kWarpTeamsPerBlock = 4;
// Launch bounds: warp teams run blocks of 4 warps, block teams up to 16 warps (the host checks).
constexpr int kWarpTeamThreads = kWarpTeamsPerBlock * kWarp;
constexpr int kMaxBlockTeamThreads = 16 * kWarp;
// The warp teams need 160-170 registers (sm_90, f32) not to spill; their shared
// memory allows about 3 blocks of 4 teams per SM anyway.
constexpr int kWarpTeamMinBlocks = 3;
constexpr int kClusterBlocks = 8;  // the portable cluster size

enum : int { VEC_X = 0, VEC_R = 1, VEC_P = 2, VEC_AP = 3, VEC_DIAG = 4, N_VECTORS = 5 };

// f(r, c) for every r < rows, c < cols, spread over threads tid of size with consecutive threads
// on consecutive c (coalesced along rows of the n1 x n2 vectors).
template <typename F>
__device__ __forceinline__ void for_each_2d(int tid, int size, int rows, int cols, F&& f) {
    if (cols <= 0 || rows <= 0) return;
    if (cols >= size) {
        for (int r = 0; r < rows; ++r)
            for (int c = tid; c < cols; c += size) f(r, c);
    } else {
        const int per = size / cols;
        const int r0 = tid / cols, c = tid - r0 * cols;
        if (r0 < per)
            for (int r = r0; r < rows; r += per) f(r, c);
    }
}

// A team's shared working space (the layout is mirrored by graphkern/mgk/tiled.py: shared_bytes).
template <typename T>
struct TeamSpace {
    unsigned char* slots1;  // row_slots octiles of G1
    unsigned char* slot2;   // this warp's octile of G2
    T* xs;                  // this warp's 8 x 8 slice of p
    T* slab;                // slab_cap values of y
    size_t slot_size;
    int planes, row_slots, slab_cap;
    int loaded_lo, loaded_hi;  // the G1 octiles now in slots1 (global indices; team-uniform)
};

// The 8 x 8 slice of p at tile (C1, C2) for lane's elements lane and lane + 32 (0 outside).
template <typename T>
__device__ __forceinline__ void load_slice(const T* __restrict__ p, int n1, int n2, int C1, int C2, int lane, T& lo,
                                           T& hi) {
    const int j1 = C1 * kOctile + lane / kOctile, j2 = C2 * kOctile + lane % kOctile;
    lo = (j1 < n1 && j2 < n2) ? p[(int64_t)j1 * n2 + j2] : T(0);
    hi = (j1 + 4 < n1 && j2 < n2) ? p[(int64_t)(j1 + 4) * n2 + j2] : T(0);
}

// This warp's share of one window: G2 octiles [lo2, hi2) cut into contiguous runs, one per warp,
// each multiplied with the k1 staged octiles of G1.  The slice of p for the next product is
// loaded into registers while the current one runs.
template <typename T, int FORM, bool BLOCK, bool COMPACT>
__device__ __forceinline__ void multiply_window(const Team<BLOCK>& team, TeamSpace<T>& sp, const TiledSet<T>& g2,
                                                int lo2, int hi2, int k1, int Ra, int W0, int ld, int n1, int n2,
                                                const T* __restrict__ p, const EdgeKernel<T>& ek, int ss_max,
                                                int ds_max) {
    const int64_t len = hi2 - lo2;
    const int mine_lo = lo2 + (int)(len * team.warp / team.n_warps);
    const int mine_hi = lo2 + (int)(len * (team.warp + 1) / team.n_warps);
    const int lane = team.lane;
    const Slot<T> s2(sp.slot2, sp.planes);
    for (int t2 = mine_lo; t2 < mine_hi; ++t2) {
        __syncwarp();  // the previous octile of G2 is no longer read
        stage_octile<T, COMPACT>(s2, g2, t2, sp.planes, lane);
        __syncwarp();
        const int R2 = s2.meta[1], C2 = s2.meta[2];
        T* out_window = sp.slab + kOctile * (R2 - W0);
        T x_lo, x_hi;
        load_slice(p, n1, n2, Slot<T>(sp.slots1, sp.planes).meta[2], C2, lane, x_lo, x_hi);
        for (int s = 0; s < k1; ++s) {
            const Slot<T> s1(sp.slots1 + s * sp.slot_size, sp.planes);
            __syncwarp();  // the previous product is done with xs
            sp.xs[lane] = x_lo;
            sp.xs[lane + kWarp] = x_hi;
            __syncwarp();
            if (s + 1 < k1)
                load_slice(p, n1, n2, Slot<T>(sp.slots1 + (s + 1) * sp.slot_size, sp.planes).meta[2], C2, lane, x_lo,
                           x_hi);
            T* out = out_window + (int64_t)kOctile * (s1.meta[1] - Ra) * ld;
            octile_pair<T, FORM>(s1, s2, sp.xs, out, ld, lane, ek, ss_max, ds_max);
        }
    }
}

// Ap = diag .* p - ek_scale (A1 (x) A2 (.) E) p for one pair; returns this thread's share of p . Ap.
template <typename T, int FORM, bool BLOCK, bool COMPACT>
__device__ double xmv(const Team<BLOCK>& team, TeamSpace<T>& sp, const TiledSet<T>& g1, const TiledSet<T>& g2,
                      const int32_t* __restrict__ trp1, const int32_t* __restrict__ trp2, int n1, int n2,
                      const T* __restrict__ p, const T* __restrict__ diag, T* __restrict__ Ap, T ek_scale,
                      const EdgeKernel<T>& ek, int ss_max, int ds_max) {
    const int nb1 = (n1 + kOctile - 1) / kOctile, nb2 = (n2 + kOctile - 1) / kOctile;
    const int max_rows = sp.slab_cap / kOctileSize;  // >= 1 (the host sizes the slab)
    double pap = 0;
    int group = 0;
    for (int Ra = 0; Ra < nb1; ++group) {
        // the next group: consecutive tile rows whose octiles fit the slots (at least one row)
        int Rb = Ra + 1;
        while (Rb < nb1 && Rb - Ra < max_rows && trp1[Rb + 1] - trp1[Ra] <= sp.row_slots) ++Rb;
        if (group % team.ranks != team.rank) {  // another block of the cluster computes it
            Ra = Rb;
            continue;
        }
        const int rows = Rb - Ra;
        const int t_lo = trp1[Ra], t_hi = trp1[Rb];
        const int win = max(1, sp.slab_cap / (kOctileSize * rows));
        for (int W0 = 0; W0 < nb2; W0 += win) {
            const int W1 = min(nb2, W0 + win);
            const int ld = kOctile * (W1 - W0);
            // a row with more octiles than slots is taken in chunks, all adding to the same slab
            for (int c0 = t_lo; c0 < t_hi; c0 += sp.row_slots) {
                const int c1 = min(t_hi, c0 + sp.row_slots);
                if (c0 != sp.loaded_lo || c1 != sp.loaded_hi) {
                    team.block_sync();  // every warp is done with the octiles staged before
                    for (int s = team.warp; s < c1 - c0; s += team.n_warps)
                        stage_octile<T, COMPACT>(Slot<T>(sp.slots1 + s * sp.slot_size, sp.planes), g1, c0 + s,
                                                 sp.planes, team.lane);
                    sp.loaded_lo = c0;
                    sp.loaded_hi = c1;
                    team.block_sync();
                }
                multiply_window<T, FORM, BLOCK, COMPACT>(team, sp, g2, trp2[W0], trp2[W1], c1 - c0, Ra, W0, ld,
                                                         n1, n2, p, ek, ss_max, ds_max);
            }
            team.block_sync();  // the slab is complete
            const int out_rows = min(kOctile * rows, n1 - kOctile * Ra);
            const int out_cols = min(ld, n2 - kOctile * W0);
            for_each_2d(team.btid, team.bsize, kOctile * rows, ld, [&](int r, int c) {
                T& cell = sp.slab[r * ld + c];
                if (r < out_rows && c < out_cols) {
                    const int64_t i = (int64_t)(kOctile * Ra + r) * n2 + kOctile * W0 + c;
                    const T pi = p[i];
                    const T ap = diag[i] * pi - ek_scale * cell;
                    Ap[i] = ap;
                    pap += (double)pi * ap;
                }
                cell = T(0);
            });
            team.block_sync();  // the slab is zero again before the next products
        }
        Ra = Rb;
    }
    return pap;
}

// Everything one launch shares: the two graph sets, the programs, the hyperparameters.
template <typename T>
struct Problem {
    const TiledSet<T>* g1;  // in shared memory
    const TiledSet<T>* g2;
    const int* ncode;
    const T* npar;
    EdgeKernel<T> ek;
    T ek_scale, q, p2;
    double tol;
    int max_iter, ss_max, ds_max;
};

// The CG operator of one pair (common/cg.cuh): the team's XMV, the vector loops strided over the
// team's threads; the team's barrier orders a new direction before the next XMV reads it.
template <typename T, int FORM, bool BLOCK, bool COMPACT>
struct TiledOperator {
    const Team<BLOCK>& team;
    TeamSpace<T>& sp;
    const Problem<T>& pb;
    const TiledSet<T>&g1, &g2;
    const int32_t *trp1, *trp2;
    int n1, n2;
    int64_t N;
    T *__restrict__ x, *__restrict__ r, *__restrict__ p, *__restrict__ Ap;
    const T* __restrict__ diag;
    __device__ __forceinline__ double product() {
        return xmv<T, FORM, BLOCK, COMPACT>(team, sp, g1, g2, trp1, trp2, n1, n2, p, diag, Ap, pb.ek_scale, pb.ek,
                                            pb.ss_max, pb.ds_max);
    }
    __device__ __forceinline__ void step(T a, double& rr, double& rz) {
        cg_update(x, r, p, Ap, diag, a, (int64_t)team.tid, (int64_t)team.size, N, rr, rz);
    }
    __device__ __forceinline__ void new_direction(T beta) {
        for (int64_t i = team.tid; i < N; i += team.size) p[i] = r[i] / diag[i] + beta * p[i];
        team.sync();  // the next XMV reads p across the team
    }
};

template <typename T, int FORM, bool BLOCK, bool COMPACT>
__device__ void solve_pair(const Team<BLOCK>& team, TeamSpace<T>& sp, const Problem<T>& pb, int64_t ga, int64_t gb,
                           T* __restrict__ work, int64_t stride, double* k_out, int32_t* it_out, double* res_out,
                           T* nodal) {
    const TiledSet<T>& g1 = *pb.g1;
    const TiledSet<T>& g2 = *pb.g2;
    T* __restrict__ x = work + VEC_X * stride;
    T* __restrict__ r = work + VEC_R * stride;
    T* __restrict__ p = work + VEC_P * stride;
    T* __restrict__ Ap = work + VEC_AP * stride;
    T* __restrict__ diag = work + VEC_DIAG * stride;
    const int64_t v1 = g1.node_off[ga], v2 = g2.node_off[gb];
    const int n1 = (int)(g1.node_off[ga + 1] - v1), n2 = (int)(g2.node_off[gb + 1] - v2);
    const int64_t N = (int64_t)n1 * n2;
    const int32_t* trp1 = g1.tile_rowptr + g1.rowptr_off[ga];
    const int32_t* trp2 = g2.tile_rowptr + g2.rowptr_off[gb];
    const T q = pb.q;

    // x0 = 0, r0 = b = D q_x, z0 = p0 = r0 / diag with diag = D / V (the preconditioner)
    double rz = 0, bb = 0;
    for_each_2d(team.tid, team.size, n1, n2, [&](int i1, int i2) {
        const int64_t i = (int64_t)i1 * n2 + i2;
        T d;
        const T m = system_diagonal(g1.degree[v1 + i1], g2.degree[v2 + i2], g1.node_feat + (v1 + i1) * g1.n_feat,
                                    g2.node_feat + (v2 + i2) * g2.n_feat, pb.ncode, pb.npar, q, d);
        const T bi = d * q * q;
        const T z = bi / m;
        diag[i] = m;
        x[i] = 0;
        r[i] = bi;
        p[i] = z;
        rz += (double)bi * z;
        bb += (double)bi * bi;
    });
    team.sum2(rz, bb);
    CGState cg{rz, sqrt(bb), sqrt(bb), 0, true};
    TiledOperator<T, FORM, BLOCK, COMPACT> op{team, sp, pb, g1, g2, trp1, trp2, n1, n2, N, x, r, p, Ap, diag};
    preconditioned_cg<T>(team, op, cg, pb.tol, pb.max_iter);
    double total = 0;
    for (int64_t i = team.tid; i < N; i += team.size) {
        total += (double)x[i];
        if (nodal != nullptr) nodal[i] = (T)((double)pb.p2 * x[i]);
    }
    total = team.sum(total);
    if (team.tid == 0) {
        *k_out = (double)pb.p2 * total;
        *it_out = cg.it;
        *res_out = cg.bnorm > 0 ? cg.rnorm / cg.bnorm : 0.0;
    }
}

__device__ __forceinline__ unsigned dynamic_smem_size() {
    unsigned n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

template <typename T, int FORM, bool BLOCK, bool COMPACT>
__device__ void tiled_solve(const TiledSet<T>* __restrict__ set1, const TiledSet<T>* __restrict__ set2,
                            const int64_t* __restrict__ pair_g1, const int64_t* __restrict__ pair_g2, int64_t n_pairs,
                            const int* __restrict__ code, const T* __restrict__ params, int ncode_len, int nparam_len,
                            int ecode_len, int eparam_len, T ek_scale, T ek_theta, T ek_aux, T q, T p2, double tol,
                            int max_iter, int ss_max, int ds_max, int row_slots, int slab_cap, int dynamic,
                            unsigned long long* __restrict__ counter, T* __restrict__ scratch, int64_t stride,
                            double* __restrict__ k_out, int32_t* __restrict__ it_out, double* __restrict__ res_out,
                            T* __restrict__ nodal, const int64_t* __restrict__ nodal_off) {
    extern __shared__ __align__(16) unsigned char smem[];
    // Block header: the two graph sets, the programs, the reduction partials, the next pair and
    // the block's two totals for its cluster; then one TeamSpace per team: [row_slots slots]
    // [per warp: slot, slice][slab].
    const int warps_in_block = blockDim.x / kWarp;
    const int teams_per_block = BLOCK ? 1 : warps_in_block;
    const int warps_per_team = BLOCK ? warps_in_block : 1;
    const int planes = (int)set1->channels;
    const size_t sb = slot_bytes<T>(planes);
    const size_t header = 256 + align16(2 * kMaxParams * sizeof(T)) + kMaxCode * sizeof(int) +
                          2 * kMaxWarps * sizeof(double) + 32;
    const size_t team_bytes = row_slots * sb + warps_per_team * (sb + kOctileSize * sizeof(T)) +
                              align16((size_t)slab_cap * sizeof(T));
    // The host sizes the launch with the same formula; a mismatch leaves the outputs unwritten
    // (NaN), which the host reports, rather than overrunning shared memory.
    if (header + teams_per_block * team_bytes > dynamic_smem_size() || row_slots < 1 || slab_cap < kOctileSize ||
        warps_in_block > kMaxWarps)
        return;

    TiledSet<T>* s_sets = reinterpret_cast<TiledSet<T>*>(smem);
    T* s_par = reinterpret_cast<T*>(smem + 256);
    int* s_code = reinterpret_cast<int*>(smem + 256 + align16(2 * kMaxParams * sizeof(T)));
    double* s_red = reinterpret_cast<double*>(s_code + kMaxCode);
    unsigned long long* s_next = reinterpret_cast<unsigned long long*>(s_red + 2 * kMaxWarps);
    double* s_cred = s_red + 2 * kMaxWarps + 2;  // after s_next and its padding
    if (threadIdx.x == 0) {
        s_sets[0] = *set1;
        s_sets[1] = *set2;
    }
    for (int i = threadIdx.x; i < ncode_len + ecode_len; i += blockDim.x) s_code[i] = code[i];
    for (int i = threadIdx.x; i < nparam_len + eparam_len; i += blockDim.x) s_par[i] = params[i];

    const int warp_in_block = threadIdx.x / kWarp;
    Team<BLOCK> team;
    team.tid = BLOCK ? threadIdx.x : threadIdx.x % kWarp;
    team.size = BLOCK ? blockDim.x : kWarp;
    team.warp = BLOCK ? warp_in_block : 0;
    team.n_warps = warps_per_team;
    team.lane = threadIdx.x % kWarp;
    team.btid = team.tid;
    team.bsize = team.size;
    team.rank = BLOCK ? cluster_rank() : 0;
    team.ranks = BLOCK ? cluster_blocks() : 1;
    team.tid += team.rank * team.bsize;
    team.size *= team.ranks;
    team.red = s_red;
    team.cred = s_cred;

    const int team_in_block = BLOCK ? 0 : warp_in_block;
    unsigned char* team_base = smem + header + team_in_block * team_bytes;
    TeamSpace<T> sp;
    sp.slot_size = sb;
    sp.planes = planes;
    sp.row_slots = row_slots;
    sp.slab_cap = slab_cap;
    sp.slots1 = team_base;
    sp.slot2 = team_base + row_slots * sb + team.warp * (sb + kOctileSize * sizeof(T));
    sp.xs = reinterpret_cast<T*>(sp.slot2 + sb);
    sp.slab = reinterpret_cast<T*>(team_base + row_slots * sb + warps_per_team * (sb + kOctileSize * sizeof(T)));
    sp.loaded_lo = sp.loaded_hi = -1;
    for (int i = team.btid; i < slab_cap; i += team.bsize) sp.slab[i] = T(0);
    __syncthreads();

    const EdgeKernel<T> ek{ek_scale, ek_theta, ek_aux, 0, s_code + ncode_len, s_par + nparam_len};
    const Problem<T> pb{s_sets, s_sets + 1, s_code, s_par, ek, ek_scale, q, p2, tol, max_iter, ss_max, ds_max};

    // a cluster's blocks are consecutive in the (one-dimensional) grid
    const int64_t team_global = (int64_t)(blockIdx.x / team.ranks) * teams_per_block + team_in_block;
    const int64_t n_teams = (int64_t)(gridDim.x / team.ranks) * teams_per_block;
    T* work = scratch + team_global * N_VECTORS * stride;
    // dynamic == 1: the first n_teams pairs go to the teams in order, the rest are claimed from
    // the counter.  dynamic == 2 (a queue shared by several devices, the counter in one device's
    // memory and reached over peer access by the others): every pair is claimed.  System-scope
    // atomics, so that claims from every device are one sequence.
    const unsigned long long claim_offset = dynamic == 2 ? 0ull : (unsigned long long)n_teams;
    auto claim = [&]() -> int64_t {
        if (BLOCK) {
            if (team.tid == 0) *s_next = atomicAdd_system(counter, 1ull) + claim_offset;
            team.sync();
            const int64_t next = (int64_t)*cluster_peer(s_next, 0);  // block 0's claim (its own without clusters)
            team.sync();  // read before the next claim overwrites it
            return next;
        }
        unsigned long long claimed = 0;
        if (team.lane == 0) claimed = atomicAdd_system(counter, 1ull);
        return (int64_t)__shfl_sync(kFullMask, claimed, 0) + (int64_t)claim_offset;
    };
    int64_t k = dynamic == 2 ? claim() : team_global;
    while (k < n_pairs) {
        solve_pair<T, FORM, BLOCK, COMPACT>(team, sp, pb, pair_g1[k], pair_g2[k], work, stride, k_out + k, it_out + k,
                                            res_out + k, nodal != nullptr ? nodal + nodal_off[k] : nullptr);
        if (dynamic) {
            k = claim();
        } else {
            k += n_teams;
            team.sync();  // the next pair reuses the scratch vectors
        }
    }
}

}  // namespace mgk_tiled

using namespace mgk_tiled;

// How a launch's teams take its pairs (graphkern/mgk/tiled.py: TiledGPUEngine._solve_on): the
// octile-pair products' thresholds, the team space, and the schedule with its counter (dynamic 0:
// a static stride over the pairs; 1: the first pair of each team in order, the rest claimed from
// the counter; 2: every pair claimed, from a counter the devices of a call share).
struct TiledSchedule {
    int ss_max, ds_max;
    int row_slots, slab_cap;
    int dynamic;
    unsigned long long* counter;
};
#define TILED_SCHEDULE_FIELDS(X, N, S) \
    X(N, S, ss_max) X(N, S, ds_max) X(N, S, row_slots) X(N, S, slab_cap) X(N, S, dynamic) X(N, S, counter)

// Entry points mgk_tiled_<form>_<team>_<storage>_<f32|f64>, every one with the same parameters: the
// two sets' descriptors (device memory), the job (its edge slot unused: the tiled solver stages the
// compared plane first), the schedule and the outputs.
#define MGK_TILED_ENTRY(NAME, T, FORM, BLOCK, COMPACT, THREADS, MIN_BLOCKS)                                           \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                                                  \
        NAME(const TiledSet<T>* set1, const TiledSet<T>* set2, __grid_constant__ const mgk::PairJob<T> job, __grid_constant__ const TiledSchedule sched, \
             __grid_constant__ const mgk::SolveOutputs<T> out) {                                                                      \
        tiled_solve<T, FORM, BLOCK, COMPACT>(set1, set2, job.pair_g1, job.pair_g2, job.n_pairs, job.code, job.params, \
                                             job.ncode_len, job.nparam_len, job.ecode_len, job.eparam_len,            \
                                             job.ek_scale, job.ek_theta, job.ek_aux, job.q, job.p2, job.tol,          \
                                             job.max_iter, sched.ss_max, sched.ds_max, sched.row_slots,               \
                                             sched.slab_cap, sched.dynamic, sched.counter, job.scratch, job.stride,   \
                                             out.k, out.iterations, out.residuals, out.nodal, out.nodal_off);         \
    }

// Cluster teams: block teams whose kernels carry a compile-time cluster size, so a plain launch (a
// grid of a multiple of kClusterBlocks blocks) forms the clusters.  They exist from sm_90 on; older
// targets leave them out (the host asks for them only on devices of compute capability 9+), which
// also spares the build a third of this module's entry points there.
#if GK_CLUSTERS
#define MGK_TILED_CLUSTER_TEAMS(FORM_NAME, FORM, T, TN)                                                          \
    MGK_TILED_ENTRY(__cluster_dims__(kClusterBlocks, 1, 1) mgk_tiled_##FORM_NAME##_cluster_full_##TN, T, FORM,  \
                    true, false, kMaxBlockTeamThreads, 1)                                                        \
    MGK_TILED_ENTRY(__cluster_dims__(kClusterBlocks, 1, 1) mgk_tiled_##FORM_NAME##_cluster_compact_##TN, T,     \
                    FORM, true, true, kMaxBlockTeamThreads, 1)
#else
#define MGK_TILED_CLUSTER_TEAMS(FORM_NAME, FORM, T, TN)
#endif

#define MGK_TILED_TEAMS(FORM_NAME, FORM, T, TN)                                                                 \
    MGK_TILED_ENTRY(mgk_tiled_##FORM_NAME##_warp_full_##TN, T, FORM, false, false, kWarpTeamThreads, kWarpTeamMinBlocks)            \
    MGK_TILED_ENTRY(mgk_tiled_##FORM_NAME##_warp_compact_##TN, T, FORM, false, true, kWarpTeamThreads, kWarpTeamMinBlocks)          \
    MGK_TILED_ENTRY(mgk_tiled_##FORM_NAME##_block_full_##TN, T, FORM, true, false, kMaxBlockTeamThreads, 1)        \
    MGK_TILED_ENTRY(mgk_tiled_##FORM_NAME##_block_compact_##TN, T, FORM, true, true, kMaxBlockTeamThreads, 1)      \
    MGK_TILED_CLUSTER_TEAMS(FORM_NAME, FORM, T, TN)

#define MGK_TILED_FORMS(T, TN)                                \
    MGK_TILED_TEAMS(general, EDGE_GENERAL, T, TN)             \
    MGK_TILED_TEAMS(constant, EDGE_CONSTANT, T, TN)           \
    MGK_TILED_TEAMS(kronecker, EDGE_KRONECKER, T, TN)         \
    MGK_TILED_TEAMS(sqexp, EDGE_SQEXP, T, TN)

#ifndef MGK_TILED_SELECTED_ENTRIES  // defined: a build of a few entry points, to inspect them
MGK_TILED_FORMS(float, f32)
MGK_TILED_FORMS(double, f64)
#endif

// The block layout above (header, slots, teams) and the launch bounds that graphkern/mgk/tiled.py
// plans with, and the scratch vectors of a team
GRAPHKERN_EXPORTS = {
    {"max_params", mgk_tiled::kMaxParams},
    {"max_code", mgk_tiled::kMaxCode},
    {"max_warps", gk::kMaxWarps},
    {"cluster_blocks", mgk_tiled::kClusterBlocks},
    {"max_block_warps", mgk_tiled::kMaxBlockTeamThreads / gk::kWarp},
    {"warp_teams_per_block", mgk_tiled::kWarpTeamsPerBlock},
    {"slot_meta_ints", mgk_tiled::kSlotMetaInts},
    {"octile_size", mgk::kOctileSize},
    {"vectors", mgk_tiled::N_VECTORS},
    GK_STRUCT("schedule", TiledSchedule, TILED_SCHEDULE_FIELDS)
    MGK_JOB_EXPORTS
    GK_STRUCT("out_f32", mgk::SolveOutputs<float>, MGK_SOLVE_OUTPUT_FIELDS)
    GK_STRUCT("out_f64", mgk::SolveOutputs<double>, MGK_SOLVE_OUTPUT_FIELDS)
};
