// The teams of threads that solve one pair of the tiled MGK solver (mgk_tiled.cu) together: a
// warp, a whole block, or the blocks of a thread-block cluster, and their sums.
#pragma once

#include "common/reductions.cuh"

// Thread-block clusters exist from sm_90 on.  On older targets a block team is a cluster of one rank
// (the cluster entry points are left out there: the host asks for them only on compute capability 9+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GK_CLUSTERS 1
#include <cooperative_groups.h>
#else
#define GK_CLUSTERS 0
#endif

namespace gk {

constexpr int kMaxWarps = 32;  // per block

// This block's rank in its cluster, the cluster's blocks, a barrier over them (it also orders
// their global and shared memory accesses: arrive has release, wait acquire semantics at cluster
// scope), and `ptr` (this block's shared memory) as it lies in block `rank`.
#if GK_CLUSTERS
__device__ __forceinline__ int cluster_rank() { return (int)cooperative_groups::this_cluster().block_rank(); }
__device__ __forceinline__ int cluster_blocks() { return (int)cooperative_groups::this_cluster().num_blocks(); }
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
template <typename P>
__device__ __forceinline__ P* cluster_peer(P* ptr, int rank) {
    return cooperative_groups::this_cluster().map_shared_rank(ptr, (unsigned)rank);
}
#else
__device__ __forceinline__ int cluster_rank() { return 0; }
__device__ __forceinline__ int cluster_blocks() { return 1; }
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
template <typename P>
__device__ __forceinline__ P* cluster_peer(P* ptr, int) {
    return ptr;
}
#endif

// The threads that solve one pair together: a warp, a whole block, or (block teams launched in
// clusters) the blocks of a cluster.  Every thread of a team gets the same sums (the butterfly,
// the per-warp partials and the per-block totals are added in one order), so the CG's branches
// agree across the team.  tid/size number the team's threads (the CG vector loops), btid/bsize
// the block's (its shared memory: the XMV's staging and slab).
template <bool BLOCK>
struct Team {
    int tid, size, warp, n_warps, lane;
    int btid, bsize;
    int rank, ranks;  // this block in the cluster, and the cluster's blocks (1 without clusters)
    double* red;      // block teams: 2 kMaxWarps partial sums
    double* cred;     // cluster teams: this block's 2 totals, read by the other blocks

    // the whole team (a cluster barrier when the team spans several blocks)
    __device__ __forceinline__ void sync() const {
        if (!BLOCK) {
            __syncwarp();
        } else if (ranks > 1) {
            cluster_sync();
        } else {
            __syncthreads();
        }
    }

    // this block's share of the team (its shared memory)
    __device__ __forceinline__ void block_sync() const {
        if (BLOCK) {
            __syncthreads();
        } else {
            __syncwarp();
        }
    }

    __device__ void sum2(double& a, double& b) const {
        block_sync();
        a = warp_sum(a);
        b = warp_sum(b);
        if (!BLOCK) return;
        if (lane == 0) {
            red[warp] = a;
            red[kMaxWarps + warp] = b;
        }
        __syncthreads();
        double ta = 0, tb = 0;
        for (int w = 0; w < n_warps; ++w) {
            ta += red[w];
            tb += red[kMaxWarps + w];
        }
        if (ranks > 1) {
            if (btid == 0) {
                cred[0] = ta;
                cred[1] = tb;
            }
            // publishes cred and every vector the team wrote before the reduction; red is
            // read by then too
            cluster_sync();
            ta = 0;
            tb = 0;
            for (int r = 0; r < ranks; ++r) {
                const double* peer = cluster_peer(cred, r);
                ta += peer[0];
                tb += peer[1];
            }
            cluster_sync();  // every block has read cred before it is written again
        } else {
            __syncthreads();  // everyone has read red before it is written again
        }
        a = ta;
        b = tb;
    }

    __device__ double sum(double v) const {
        double unused = 0;
        sum2(v, unused);
        return v;
    }

    // the CG template's form (common/cg.cuh)
    template <int K>
    __device__ __forceinline__ void sum(double (&v)[K]) const {
        static_assert(K == 1 || K == 2, "one or two values");
        if constexpr (K == 1) {
            v[0] = sum(v[0]);
        } else {
            sum2(v[0], v[1]);
        }
    }
};

}  // namespace gk
