# cython: language_level=3
"""The work arrays of one graph, shared by PBR's bisection (pbr_bisect) and its K-way refinement (pbr)."""

from libc.stdint cimport int32_t, int64_t, uint64_t

cdef enum:
    PBR_PART = 8                # octile side: a part of the partition is one tile row
    # chosen on the reorder benchmark's sets
    N_TRIES = 2                 # initial partitions per bisection
    NET_WEIGHT = 8              # cost of a cut net in cut edges (0 and 1 were 1-12% worse, 3-32 alike)
    MAX_REFINE_PASSES = 16
    REFINE_STOP = 200           # a refinement pass removing under 1/REFINE_STOP of the pairs is the last
    N_RESTARTS = 4              # most recursive bisections per graph ...
    RESTART_BUDGET = 512        # ... as many as RESTART_BUDGET // n, at least one
    INPUT_SLACK_PERCENT = 125   # refine the input and RCM orders only within this % of the best pairs


cdef struct Work:
    int32_t n
    int32_t n_parts       # ceil(n / PBR_PART)
    const int64_t* indptr
    const int32_t* indices
    uint64_t rng
    int64_t* stack        # recursion stack of segments (lo, hi)
    int32_t* order        # the vertex order being built; segment [lo, hi) is one subset
    int32_t* best_order   # the best candidate order so far
    int32_t* where        # side of a vertex in the current segment (0 left, 1 right), -1 outside
    int32_t* cnt0         # pins of net w (closed neighbourhood of w) on the left
    int32_t* cnt1         # ... and on the right
    int32_t* gain
    int32_t* bnext        # doubly linked gain buckets
    int32_t* bprev
    int32_t* bhead        # 2 * bucket_span heads, one row per side
    int64_t bucket_span
    int64_t boffset       # gain g lives in bucket g + boffset (set per segment)
    int64_t bmax[2]       # no bucket above bmax[side] is occupied
    char* inb             # in a bucket
    int32_t* movelog
    int32_t* queue        # BFS queue, also scratch for stable partitioning
    int32_t* mark         # BFS visit stamps
    int32_t stamp
    char* best_side       # by position in the segment
    int64_t cost          # net_weight * cut nets + cut edges of the current bisection
    # K-way refinement
    int32_t* part         # part of each vertex
    int32_t* pos          # position of each vertex in order
    int32_t* row_a        # edges from part a to each part
    int32_t* row_b
    int32_t* touched_row_a
    int32_t* touched_row_b
    int32_t n_touched_row_a
    int32_t n_touched_row_b
    int32_t* tally        # per-part edge counts of one vertex (zero between uses)
    int32_t* touched_tally
    int32_t* part_size
    char* active_now      # parts whose pairs this refinement pass tries
    char* active_next
    int64_t* sort_keys    # (degree << 32 | vertex) of one vertex's neighbours, maxdeg slots
    # what score_members knows of the 16 members of parts a and b (slots 0-7 a's, 8-15 b's)
    int32_t* member_mask  # per part: bit s set when slot s has an edge to it
    int32_t* touched_mask
    int32_t* critical     # per slot, the parts it alone joins to its own part
    int64_t critical_start[2 * PBR_PART + 1]
    int32_t lone_score[2 * PBR_PART]  # pairs created minus pairs dropped by moving the slot alone
    int32_t to_a[2 * PBR_PART]        # edges from the slot to parts a and b
    int32_t to_b[2 * PBR_PART]
    int32_t overlap[PBR_PART][PBR_PART]  # corrections for parts both swapped vertices reach
    char adjacent[PBR_PART][PBR_PART]


cdef inline void identity_order(Work* w) noexcept nogil:
    cdef int64_t i
    for i in range(w.n):
        w.order[i] = <int32_t>i


cdef int32_t bfs_farthest(Work* w, int32_t start, int only_side) noexcept nogil
cdef void recursive_bisection(Work* w) noexcept nogil
