// Octiles of the tiled marginalized-graph-kernel solver (cuda_src/mgk_tiled.cu): the dataset
// layout the host builds (graphkern/mgk/tiled.py), the shared-memory slot an octile is staged
// into, and the three octile-pair products.
//
// An octile pair (t1 of G1 at tile (R1, C1), t2 of G2 at (R2, C2)) adds to the output block
// O = y[8 R1 .. 8 R1 + 8, 8 R2 .. 8 R2 + 8] (y viewed as an n1 x n2 matrix)
//
//     O[a][b] += sum_{c,d} W1[a][c] W2[b][d] kappa(E1[a][c], E2[b][d]) X[c][d],
//     X = p[8 C1 .. 8 C1 + 8, 8 C2 .. 8 C2 + 8],
//
// 4096 terms of which only nnz(t1) * nnz(t2) are not zero.  Three ways to compute it:
//   dense x dense  (dd): lane (a, b) owns O[a][b] and O[a + 4][b] and sums all 128 of their
//                        terms, zeros included (the core solver's product);
//   dense x sparse (ds): the sparser octile as the list of its nonzeros, cut into 4 runs;
//                        lane (r, part) sums, for each nonzero of its run, the 8 terms it meets
//                        in row r of the other octile;
//   sparse x sparse (ss): the same with only the nonzeros of row r: lane (r, part) sums, for
//                        each nonzero of its run of the denser octile, the terms it meets among
//                        the nonzeros in row r of the sparser one.
// ds and ss add each sum into O with a shared-memory atomic (lanes of one row can meet one
// output).  On sm_90 a float atomicAdd to shared memory is a compare-and-swap loop
// (ATOMS.CAST.SPIN), so the products sum along a row first and the runs are contiguous
// (neighbouring nonzeros of a list share a row: spreading them over the parts would make the
// parts' atomics collide).  Which product runs is decided per octile pair from the two nonzero
// counts (octile_pair).
#pragma once

#include <cstdint>

#include "common/kernel_program.cuh"
#include "common/octile_product.cuh"
#include "common/reductions.cuh"

namespace mgk_tiled {

using namespace mgk;
using gk::kFullMask;
using gk::kWarp;


// One list of graphs, as graphkern/mgk/tiled.py (TiledData.descriptor) lays it out in device
// memory: 13 eight-byte fields.  Tiles of a graph are consecutive, sorted by tile row then tile
// column; tile_rowptr holds the global index of each tile row's first tile (n_tile_rows + 1 per
// graph, from rowptr_off[g]).  An octile stores `channels` values per element: the weight, then
// the edge features the edge kernel reads.  Compact storage keeps only the elements whose
// bitmap bit is set, element-major ([nonzero][channel], from nz_off[t]); full storage keeps all
// 64 ([tile][channel][64]).  degree and node_feat are in the reordered vertex order.
template <typename T>
struct TiledSet {
    const int64_t* node_off;
    const int64_t* tile_off;
    const int64_t* rowptr_off;
    const int32_t* tile_rowptr;
    const int32_t* tile_row;
    const int32_t* tile_col;
    const uint64_t* bitmap;
    const int64_t* nz_off;
    const T* values;
    const T* degree;
    const T* node_feat;
    int64_t n_feat;
    int64_t channels;
};

__host__ __device__ constexpr size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

constexpr int kSlotMetaInts = 8;  // nnz, tile row, tile column, unused, the bitmap (two words), unused

// Bytes of one octile slot with `planes` values per element (graphkern/mgk/tiled.py: slot_bytes).
template <typename T>
__host__ __device__ constexpr size_t slot_bytes(int planes) {
    return align16(2 * (size_t)planes * kOctileSize * sizeof(T) + kSlotMetaInts * sizeof(int) + kOctileSize);
}

// An octile staged in shared memory in both forms: dense planes (what dd reads, zeros included)
// and the list of its nonzeros in element order (what ds and ss read).
template <typename T>
struct Slot {
    T* dense;            // [planes][64]: plane 0 the weights, plane 1 + f edge feature f
    T* list;             // [planes][64]: entry k of every plane is the k-th nonzero element
    int* meta;           // nnz, tile row, tile column, -, bitmap
    unsigned char* pos;  // element index 8 r + s of list entry k
    __device__ __forceinline__ Slot(unsigned char* base, int planes) {
        dense = reinterpret_cast<T*>(base);
        list = dense + planes * kOctileSize;
        meta = reinterpret_cast<int*>(list + planes * kOctileSize);
        pos = reinterpret_cast<unsigned char*>(meta + kSlotMetaInts);
    }
    __device__ __forceinline__ uint64_t bitmap() const { return *reinterpret_cast<const uint64_t*>(meta + 4); }
    // list entries [first, first + count) are the nonzeros of row r (the list is row-major)
    __device__ __forceinline__ int row_first(int r) const { return __popcll(bitmap() & ((1ull << (8 * r)) - 1ull)); }
    __device__ __forceinline__ int row_count(int r) const { return __popc((unsigned)(bitmap() >> (8 * r)) & 0xffu); }
};

// A warp copies octile t into slot s.  Lane l handles elements l and l + 32; the rank of an
// element among the set bits below it is its index in the compact store and in the list.
template <typename T, bool COMPACT>
__device__ __forceinline__ void stage_octile(const Slot<T>& s, const TiledSet<T>& g, int64_t t, int planes,
                                             int lane) {
    const uint64_t bitmap = g.bitmap[t];
    const T* vals = COMPACT ? g.values + g.nz_off[t] * planes : g.values + t * planes * kOctileSize;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int e = lane + half * kWarp;
        const bool stored = (bitmap >> e) & 1ull;
        const int k = __popcll(bitmap & ((1ull << e) - 1ull));
        for (int c = 0; c < planes; ++c) {
            T v = T(0);
            if (stored) v = COMPACT ? vals[(int64_t)k * planes + c] : vals[c * kOctileSize + e];
            s.dense[c * kOctileSize + e] = v;
            if (stored) s.list[c * kOctileSize + k] = v;
        }
        if (stored) s.pos[k] = (unsigned char)e;
    }
    if (lane == 0) {
        s.meta[0] = __popcll(bitmap);
        s.meta[1] = g.tile_row[t];
        s.meta[2] = g.tile_col[t];
        *reinterpret_cast<uint64_t*>(s.meta + 4) = bitmap;
    }
}

// The general form: e1 and e2 point at feature 0 of an element, features 64 apart.
template <typename T>
__device__ __forceinline__ T kappa_program(const T* e1, const T* e2, const EdgeKernel<T>& ek) {
    return eval_program(ek.code, ek.par, e1, kOctileSize, e2, kOctileSize);
}

// dense x dense: out[a][b] (row stride ld) += the product, lane (a, b) owning rows a and a + 4.
template <typename T, int FORM>
__device__ __forceinline__ void product_dd(const Slot<T>& s1, const Slot<T>& s2, const T* __restrict__ xs, T* out,
                                           int ld, int lane, const EdgeKernel<T>& ek) {
    const int a = lane / kOctile, b = lane % kOctile;
    const T* __restrict__ t1 = s1.dense;
    const T* __restrict__ t2 = s2.dense;
    T acc_u = 0, acc_l = 0;
    if (FORM == EDGE_CONSTANT) {
        // no labels: the block is W1 X W2^T
        T w2[kOctile];
#pragma unroll
        for (int d = 0; d < kOctile; ++d) w2[d] = t2[b * kOctile + d];
#pragma unroll 2
        for (int c = 0; c < kOctile; ++c) {
            T s = 0;
#pragma unroll
            for (int d = 0; d < kOctile; ++d) s += w2[d] * xs[c * kOctile + d];
            acc_u += t1[a * kOctile + c] * s;
            acc_l += t1[(a + 4) * kOctile + c] * s;
        }
    } else if (single_feature<FORM>()) {
        T w2[kOctile], e2[kOctile];
#pragma unroll
        for (int d = 0; d < kOctile; ++d) {
            w2[d] = t2[b * kOctile + d];
            e2[d] = t2[kOctileSize + b * kOctile + d];
        }
#pragma unroll 1
        for (int c = 0; c < kOctile; ++c) {
            const T w1u = t1[a * kOctile + c], w1l = t1[(a + 4) * kOctile + c];
            const T e1u = t1[kOctileSize + a * kOctile + c], e1l = t1[kOctileSize + (a + 4) * kOctile + c];
            T su = 0, sl = 0;
#pragma unroll
            for (int d = 0; d < kOctile; ++d) {
                const T s = w2[d] * xs[c * kOctile + d];
                su += edge_shortcut<T, FORM, true>(e1u, e2[d], ek.theta, ek.aux) * s;
                sl += edge_shortcut<T, FORM, true>(e1l, e2[d], ek.theta, ek.aux) * s;
            }
            acc_u += w1u * su;
            acc_l += w1l * sl;
        }
    } else {
        for (int c = 0; c < kOctile; ++c) {
            const int iu = a * kOctile + c, il = (a + 4) * kOctile + c;
            T su = 0, sl = 0;
            for (int d = 0; d < kOctile; ++d) {
                const int j = b * kOctile + d;
                const T s = t2[j] * xs[c * kOctile + d];
                su += kappa_program(t1 + kOctileSize + iu, t2 + kOctileSize + j, ek) * s;
                sl += kappa_program(t1 + kOctileSize + il, t2 + kOctileSize + j, ek) * s;
            }
            acc_u += t1[iu] * su;
            acc_l += t1[il] * sl;
        }
    }
    atomicAdd(out + a * ld + b, acc_u);
    atomicAdd(out + (a + 4) * ld + b, acc_l);
}

// The run of list entries lane part (0..3) takes: [first, last).
__device__ __forceinline__ void list_run(int length, int part, int& first, int& last) {
    const int per = (length + 3) >> 2;
    first = min(length, part * per);
    last = min(length, first + per);
}

// dense x sparse.  SPARSE_IS_2: the list is t2's (entries (b, d)) and D is t1 (rows a, columns
// c); otherwise the list is t1's (entries (a, c)) and D is t2 (rows b, columns d).  Lane
// (r, part) keeps row r of D in registers and walks its run of the list.
template <typename T, int FORM, bool SPARSE_IS_2>
__device__ __forceinline__ void product_ds(const Slot<T>& D, const Slot<T>& S, const T* __restrict__ xs, T* out,
                                           int ld, int lane, const EdgeKernel<T>& ek) {
    const int r = lane >> 2;
    int first, last;
    list_run(S.meta[0], lane & 3, first, last);
    T wd[kOctile], ed[kOctile];
#pragma unroll
    for (int c = 0; c < kOctile; ++c) {
        wd[c] = D.dense[r * kOctile + c];
        ed[c] = single_feature<FORM>() ? D.dense[kOctileSize + r * kOctile + c] : T(0);
    }
    for (int j = first; j < last; ++j) {
        const int where = S.pos[j];
        const int rs = where >> 3, cs = where & 7;
        const T ws = S.list[j];
        const T es = single_feature<FORM>() ? S.list[kOctileSize + j] : T(0);
        T acc = 0;
#pragma unroll
        for (int c = 0; c < kOctile; ++c) {
            const T xv = SPARSE_IS_2 ? xs[c * kOctile + cs] : xs[cs * kOctile + c];
            T term = wd[c] * xv;
            if (single_feature<FORM>()) {
                term *= edge_shortcut<T, FORM, true>(ed[c], es, ek.theta, ek.aux);
            } else if (FORM == EDGE_GENERAL) {
                const T* ef_d = D.dense + kOctileSize + r * kOctile + c;
                const T* ef_s = S.list + kOctileSize + j;
                term *= SPARSE_IS_2 ? kappa_program(ef_d, ef_s, ek) : kappa_program(ef_s, ef_d, ek);
            }
            acc += term;
        }
        atomicAdd(out + (SPARSE_IS_2 ? r * ld + rs : rs * ld + r), ws * acc);
    }
}

// sparse x sparse.  ROWS_OF_1: R (walked by rows) is t1, L (the list cut into runs) is t2;
// otherwise R is t2 and L is t1.  Lane (r, part): for each entry of its run of L, the sum
// over the nonzeros in row r of R.
template <typename T, int FORM, bool ROWS_OF_1>
__device__ __forceinline__ void product_ss(const Slot<T>& R, const Slot<T>& L, const T* __restrict__ xs, T* out,
                                           int ld, int lane, const EdgeKernel<T>& ek) {
    const int r = lane >> 2;
    const int row_first = R.row_first(r), row_last = row_first + R.row_count(r);
    if (row_first == row_last) return;
    int first, last;
    list_run(L.meta[0], lane & 3, first, last);
    for (int j = first; j < last; ++j) {
        const int where = L.pos[j];
        const int rl = where >> 3, cl = where & 7;
        const T el = single_feature<FORM>() ? L.list[kOctileSize + j] : T(0);
        T acc = 0;
        for (int i = row_first; i < row_last; ++i) {
            const int cr = R.pos[i] & 7;
            T term = R.list[i] * (ROWS_OF_1 ? xs[cr * kOctile + cl] : xs[cl * kOctile + cr]);
            if (single_feature<FORM>()) {
                term *= edge_shortcut<T, FORM, true>(R.list[kOctileSize + i], el, ek.theta, ek.aux);
            } else if (FORM == EDGE_GENERAL) {
                const T* ef_r = R.list + kOctileSize + i;
                const T* ef_l = L.list + kOctileSize + j;
                term *= ROWS_OF_1 ? kappa_program(ef_r, ef_l, ek) : kappa_program(ef_l, ef_r, ek);
            }
            acc += term;
        }
        atomicAdd(out + (ROWS_OF_1 ? r * ld + rl : rl * ld + r), L.list[j] * acc);
    }
}

// One octile pair with the primitive its nonzero counts call for: sparse x sparse while both
// have at most ss_max nonzeros (the sparser walked by rows, the denser cut into runs), dense x
// sparse while the sparser has at most ds_max (it becomes the list), dense x dense otherwise.
// ss_max = ds_max = -1 always runs dense x dense.
template <typename T, int FORM>
__device__ __forceinline__ void octile_pair(const Slot<T>& s1, const Slot<T>& s2, const T* __restrict__ xs, T* out,
                                            int ld, int lane, const EdgeKernel<T>& ek, int ss_max, int ds_max) {
    const int k1 = s1.meta[0], k2 = s2.meta[0];
    if (max(k1, k2) <= ss_max) {
        if (k1 <= k2) {
            product_ss<T, FORM, true>(s1, s2, xs, out, ld, lane, ek);
        } else {
            product_ss<T, FORM, false>(s2, s1, xs, out, ld, lane, ek);
        }
    } else if (min(k1, k2) <= ds_max) {
        if (k2 <= k1) {
            product_ds<T, FORM, true>(s1, s2, xs, out, ld, lane, ek);
        } else {
            product_ds<T, FORM, false>(s2, s1, xs, out, ld, lane, ek);
        }
    } else {
        product_dd<T, FORM>(s1, s2, xs, out, ld, lane, ek);
    }
}

}  // namespace mgk_tiled
