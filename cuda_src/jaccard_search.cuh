// Searches and row hash tables used by the Jaccard kernels (cuda_src/jaccard.cu); the plain binary
// searches and the block-wide scan are the shared ones (common/search.cuh, common/scan.cuh).
#pragma once

#include <cstdint>

#include "common/scan.cuh"
#include "common/search.cuh"

namespace jaccard {

constexpr unsigned kFullMask = 0xffffffffu;

using gk::block_entry_row;
using gk::last_not_above;
using gk::lower_bound;

// lower_bound, probing lo, lo+1, lo+3, lo+7, ... first: O(log(answer - lo)) loads, so that a
// sorted run of keys walks a long list at the cost of the gaps between them, not of its length.
__device__ __forceinline__ int64_t gallop_lower_bound(const int32_t* __restrict__ idx, int64_t lo, int64_t hi,
                                                      int32_t x) {
    if (lo >= hi || idx[lo] >= x) return lo;
    int64_t base = lo;  // invariant: idx[base] < x
    int64_t step = 1;
    while (base + step < hi && idx[base + step] < x) {
        base += step;
        step <<= 1;
    }
    return lower_bound(idx, base + 1, base + step < hi ? base + step : hi, x);
}

using gk::block_exclusive_scan;

// ------------------------------------------------------------------ row hash tables
//
// An open-addressing table of a row's columns: 2^b int32 slots, b = max(2, ceil(log2(2 d))) for
// a row of d entries (load factor at most 1/2), in buckets of 4 slots (16 bytes, one vector load)
// probed linearly from the bucket of slot (x * 0x9E3779B1) >> (32 - b), the top bits of a
// Fibonacci hash: on the top bits, columns that differ only in their low bits (neighbours
// numbered close together) still spread over the table.  An insert takes the first empty slot
// of the first bucket that has one, so a bucket fills from its first slot on, and a lookup stops
// at the first bucket whose last slot is empty: the column would sit there or before.  At load
// 1/2 about one lookup of an absent column in six reads a second bucket (of a present one, one
// in twenty); at the loads of 1/4 to 1/2 of most rows, under one in ten.  The build and the
// lookups both derive b from the row's length, so a table needs no stored size; tables start at
// multiples of 4 slots (their sizes are), as the vector loads need.

constexpr int32_t kHashEmpty = -1;                 // no vertex has this index
constexpr uint32_t kHashMultiplier = 0x9E3779B1u;  // about 2^32 / golden ratio, odd
constexpr uint32_t kHashBucket = 4;                // slots per bucket: one int4 load

// 32 - b for a row of d >= 1 entries: 2^b is the smallest power of two >= 2 d, and 2 d - 1 has
// exactly ceil(log2(2 d)) significant bits (d < 2^31, so 2 d - 1 fits 32 bits unsigned); at
// least one bucket (b >= 2).
__device__ __forceinline__ int32_t hash_shift(int64_t d) {
    const int32_t shift = __clz((int32_t)(uint32_t)(2 * d - 1));
    return shift < 30 ? shift : 30;
}

// The first slot of x's home bucket.
__device__ __forceinline__ uint32_t hash_home(int32_t x, int32_t shift) {
    return (((uint32_t)x * kHashMultiplier) >> shift) & ~(kHashBucket - 1);  // shift <= 30
}

// Inserts x into a table cleared to kHashEmpty.  A row stores distinct columns, so the first
// empty slot of x's probe sequence is x's.
__device__ __forceinline__ void hash_insert(int32_t* __restrict__ table, int32_t shift, int32_t x) {
    const uint32_t mask = 0xffffffffu >> shift;
    for (uint32_t h = hash_home(x, shift);; h = (h + kHashBucket) & mask)
        for (uint32_t q = 0; q < kHashBucket; ++q)
            if (atomicCAS(table + h + q, kHashEmpty, x) == kHashEmpty) return;
}

// Whether the table holds x: mostly one 16-byte load and four compares, where a search through
// a sorted row costs O(log d) dependent loads whose count differs from lane to lane.
__device__ __forceinline__ bool hash_contains(const int32_t* __restrict__ table, int32_t shift, int32_t x) {
    const uint32_t mask = 0xffffffffu >> shift;
    for (uint32_t h = hash_home(x, shift);; h = (h + kHashBucket) & mask) {
        const int4 b = *reinterpret_cast<const int4*>(table + h);
        if (b.x == x || b.y == x || b.z == x || b.w == x) return true;
        if (b.w == kHashEmpty) return false;
    }
}

}  // namespace jaccard
