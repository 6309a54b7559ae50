# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Partitioning-based reordering (PBR): vertex orders whose 8x8 adjacency tiles are few.

The order numbers the parts of a balanced K-way partition (K = ceil(n / 8), every
part of exactly 8 vertices except one smaller part, which goes last) consecutively,
so the non-empty off-diagonal octiles are the pairs of parts joined by an edge.  The
partition is built in two steps, both per graph and single-threaded; graphs run in
parallel over an OpenMP ``prange``:

1. Recursive bisection on a neighbourhood-hypergraph cut, each split by greedy growing
   and Fiduccia-Mattheyses passes (:mod:`graphkern._cpu.pbr_bisect`).
2. K-way refinement on the exact objective: swaps of two vertices between two joined
   parts (sizes are kept) accepted when they lower the number of joined part pairs, or
   keep it and lower the edge cut.  Every swap of a pair of parts is scored in O(1)
   after one scan of their 16 members (see ``score_members``).  The input order and a
   reverse Cuthill-McKee order, refined the same way, are candidates too; the best one
   is returned, so PBR never gives more off-diagonal tiles than the order it was handed.

Every random choice comes from a per-graph splitmix64 stream, so the result depends on
the seed only, not on the thread count.
"""

from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, qsort

from graphkern._cpu.pbr_bisect cimport (INPUT_SLACK_PERCENT, MAX_REFINE_PASSES, N_RESTARTS, NET_WEIGHT, PBR_PART,
                                        REFINE_STOP, RESTART_BUDGET, Work, bfs_farthest, identity_order,
                                        recursive_bisection)

import numpy as np

cdef int compare_int64(const void* x, const void* y) noexcept nogil:
    cdef int64_t a = (<const int64_t*>x)[0], b = (<const int64_t*>y)[0]
    return (a > b) - (a < b)


cdef void reverse_cuthill_mckee(Work* w) noexcept nogil:
    """Reverse Cuthill-McKee into ``order``: BFS from a pseudo-peripheral vertex of each
    component, neighbours by ascending degree, then reversed.  Narrow bands tile grids
    well, where bisection's ragged parts do not."""
    cdef int64_t head = 0, tail = 0, k, m, i
    cdef int32_t v, x, start
    for i in range(w.n):
        w.where[i] = 0  # bfs_farthest walks vertices with where >= 0
        w.part[i] = -1  # not yet placed
    for i in range(w.n):
        if w.part[i] >= 0:
            continue
        start = bfs_farthest(w, bfs_farthest(w, <int32_t>i, -1), -1)
        w.part[start] = 0
        w.order[tail] = start
        tail += 1
        while head < tail:
            v = w.order[head]
            head += 1
            m = 0
            for k in range(w.indptr[v], w.indptr[v + 1]):
                x = w.indices[k]
                if w.part[x] < 0:
                    w.part[x] = 0
                    w.sort_keys[m] = ((w.indptr[x + 1] - w.indptr[x]) << 32) | x
                    m += 1
            qsort(w.sort_keys, m, sizeof(int64_t), compare_int64)
            for k in range(m):
                w.order[tail] = <int32_t>(w.sort_keys[k] & <int64_t>0x7FFFFFFF)
                tail += 1
    for i in range(w.n // 2):
        w.order[i], w.order[w.n - 1 - i] = w.order[w.n - 1 - i], w.order[i]
    for i in range(w.n):
        w.where[i] = -1


# ---------------------------------------------------------------- K-way refinement on octiles

cdef int32_t load_row(Work* w, int32_t p, int32_t* row, int32_t* touched) noexcept nogil:
    """Edge counts from part ``p`` to every part into ``row``; returns how many parts it touches."""
    cdef int64_t i, k, end = min(<int64_t>(p + 1) * PBR_PART, <int64_t>w.n)
    cdef int32_t v, q, n_touched = 0
    for i in range(<int64_t>p * PBR_PART, end):
        v = w.order[i]
        for k in range(w.indptr[v], w.indptr[v + 1]):
            q = w.part[w.indices[k]]
            if row[q] == 0:
                touched[n_touched] = q
                n_touched += 1
            row[q] += 1
    return n_touched


cdef inline void clear_row(int32_t* row, int32_t* touched, int32_t n_touched) noexcept nogil:
    cdef int32_t i
    for i in range(n_touched):
        row[touched[i]] = 0


cdef void score_members(Work* w, int32_t a, int32_t b) noexcept nogil:
    """Everything needed to score any swap between parts a and b in O(1) (rows loaded).

    Swapping u (in a) and v (in b) changes the edge counts of pairs {a, q} and {b, q}:
    by -cu[q] + cv[q] and +cu[q] - cv[q].  For a part q reached by only one of them the
    change is that vertex's own: u drops {a, q} when it alone joins a to q and creates
    {b, q} when b had no edge to q (``lone_score``).  A q reached by both keeps both
    pairs joined, so the two lone terms are taken back (``overlap``).  The pair {a, b}
    and the edge cut depend only on the edges of u and v to a and b.
    """
    cdef int32_t slot, home, member, q, c, t, n_tally, n_masks = 0, i, j, bits, shift, step
    cdef int32_t* cell
    cdef int32_t* row_home
    cdef int32_t* row_other
    cdef int64_t k, fill = 0
    cdef int32_t v, y
    for i in range(PBR_PART):
        for j in range(PBR_PART):
            w.adjacent[i][j] = 0
            w.overlap[i][j] = 0
    for slot in range(2 * PBR_PART):
        w.critical_start[slot] = fill
        w.lone_score[slot] = 0
        w.to_a[slot] = 0
        w.to_b[slot] = 0
        home = a if slot < PBR_PART else b
        row_home = w.row_a if slot < PBR_PART else w.row_b
        row_other = w.row_b if slot < PBR_PART else w.row_a
        member = slot % PBR_PART
        if member >= w.part_size[home]:
            continue
        v = w.order[<int64_t>home * PBR_PART + member]
        n_tally = 0
        for k in range(w.indptr[v], w.indptr[v + 1]):
            y = w.indices[k]
            if y == v:
                continue
            q = w.part[y]
            if w.tally[q] == 0:
                w.touched_tally[n_tally] = q
                n_tally += 1
            w.tally[q] += 1
            if slot < PBR_PART and q == b:
                w.adjacent[member][w.pos[y] - <int64_t>b * PBR_PART] = 1
        for t in range(n_tally):
            q = w.touched_tally[t]
            c = w.tally[q]
            w.tally[q] = 0
            if q == a:
                w.to_a[slot] = c
            elif q == b:
                w.to_b[slot] = c
            else:
                w.lone_score[slot] += (row_other[q] == 0) - (row_home[q] == c)
                if row_home[q] == c:
                    w.critical[fill] = q
                    fill += 1
                if w.member_mask[q] == 0:
                    w.touched_mask[n_masks] = q
                    n_masks += 1
                w.member_mask[q] |= 1 << slot
    w.critical_start[2 * PBR_PART] = fill
    for slot in range(2 * PBR_PART):
        # a's slot meets b's members along its row of overlap, b's slot a's members along its column
        cell = &w.overlap[slot][0] if slot < PBR_PART else &w.overlap[0][slot - PBR_PART]
        step = 1 if slot < PBR_PART else PBR_PART
        shift = PBR_PART if slot < PBR_PART else 0
        for k in range(w.critical_start[slot], w.critical_start[slot + 1]):
            bits = (w.member_mask[w.critical[k]] >> shift) & 0xFF
            for j in range(PBR_PART):
                if (bits >> j) & 1:
                    cell[j * step] += 1
    for t in range(n_masks):
        w.member_mask[w.touched_mask[t]] = 0


cdef inline void swap_effect(Work* w, int32_t i, int32_t j, int32_t b, int64_t* d_pairs, int64_t* d_cut) noexcept nogil:
    """Change in joined part pairs and in cut edges if a's i-th and b's j-th members swap parts."""
    cdef int32_t u = i, v = PBR_PART + j
    cdef int32_t joint = 2 if w.adjacent[i][j] else 0  # the u-v edge stays between a and b
    cdef int32_t ab = w.row_a[b]
    cdef int32_t ab_after = ab - w.to_b[u] - w.to_a[v] + w.to_a[u] + w.to_b[v] + joint
    d_pairs[0] = w.lone_score[u] + w.lone_score[v] + w.overlap[i][j] + (ab_after > 0) - (ab > 0)
    d_cut[0] = w.to_a[u] - w.to_b[u] + w.to_b[v] - w.to_a[v] + joint


cdef void mark_active(Work* w, int32_t v) noexcept nogil:
    """A swap moved ``v``: every part it touches has a changed row."""
    cdef int64_t k
    w.active_next[w.part[v]] = 1
    for k in range(w.indptr[v], w.indptr[v + 1]):
        w.active_next[w.part[w.indices[k]]] = 1


cdef int64_t improve_pair(Work* w, int32_t a, int32_t b) noexcept nogil:
    """Apply the best improving swap between parts a and b, if any (rows of a and b are loaded).

    Returns -1 when no swap improves, else the number of joined pairs the swap removed (>= 0).
    """
    cdef int32_t i, j, best_i = -1, best_j = -1
    cdef int64_t best_pairs = 0, best_cut = 0, d_pairs, d_cut
    cdef int64_t pos_u, pos_v
    cdef int32_t u, v
    score_members(w, a, b)
    for i in range(w.part_size[a]):
        for j in range(w.part_size[b]):
            swap_effect(w, i, j, b, &d_pairs, &d_cut)
            if d_pairs < best_pairs or (d_pairs == best_pairs and d_cut < best_cut):
                best_pairs = d_pairs
                best_cut = d_cut
                best_i = i
                best_j = j
    if best_i < 0:
        return -1
    pos_u = <int64_t>a * PBR_PART + best_i
    pos_v = <int64_t>b * PBR_PART + best_j
    u = w.order[pos_u]
    v = w.order[pos_v]
    w.order[pos_u] = v
    w.order[pos_v] = u
    w.pos[v] = <int32_t>pos_u
    w.pos[u] = <int32_t>pos_v
    w.part[u] = b
    w.part[v] = a
    mark_active(w, u)
    mark_active(w, v)
    return -best_pairs


cdef void refine_kway(Work* w) noexcept nogil:
    """Swap passes over pairs of joined parts until a pass changes little (or the pass limit).

    Each unordered pair is tried once a pass, and only while one of its parts is active:
    a part becomes active for the next pass when a swap changes its row.  Passes stop
    once one removes under 1/REFINE_STOP of the joined pairs: on expanders (Barabasi-
    Albert) later passes cost as much as the first and remove almost nothing.
    """
    cdef int32_t n_parts = w.n_parts
    cdef int32_t a, b, idx, n_nbr, rounds
    cdef int passes = 0
    cdef int64_t pairs = joined_pairs(w), removed, pass_removed = pairs
    for a in range(n_parts):
        w.active_now[a] = 1
        w.active_next[a] = 0
    while pass_removed > 0 and pass_removed * REFINE_STOP >= pairs and passes < MAX_REFINE_PASSES:
        pass_removed = 0
        passes += 1
        for a in range(n_parts):
            w.n_touched_row_a = load_row(w, a, w.row_a, w.touched_row_a)
            # a snapshot of a's later neighbour parts: swaps below may change the row
            n_nbr = 0
            for idx in range(w.n_touched_row_a):
                b = w.touched_row_a[idx]
                if b > a and (w.active_now[a] or w.active_now[b]):
                    w.queue[n_nbr] = b
                    n_nbr += 1
            for idx in range(n_nbr):
                b = w.queue[idx]
                rounds = 0
                while rounds < PBR_PART:
                    w.n_touched_row_b = load_row(w, b, w.row_b, w.touched_row_b)
                    removed = improve_pair(w, a, b)
                    clear_row(w.row_b, w.touched_row_b, w.n_touched_row_b)
                    if removed < 0:
                        break
                    pass_removed += removed
                    pairs -= removed
                    rounds += 1
                    clear_row(w.row_a, w.touched_row_a, w.n_touched_row_a)
                    w.n_touched_row_a = load_row(w, a, w.row_a, w.touched_row_a)
            clear_row(w.row_a, w.touched_row_a, w.n_touched_row_a)
        w.active_now, w.active_next = w.active_next, w.active_now
        for a in range(n_parts):
            w.active_next[a] = 0


cdef int64_t joined_pairs(Work* w) noexcept nogil:
    """Unordered pairs of distinct parts joined by an edge (= off-diagonal octiles / 2), once
    ``part`` and ``pos`` are set from ``order``."""
    cdef int32_t a, n_touched
    cdef int64_t i, total = 0
    for i in range(w.n):
        w.pos[w.order[i]] = <int32_t>i
        w.part[w.order[i]] = <int32_t>(i // PBR_PART)
    for a in range(w.n_parts):
        n_touched = load_row(w, a, w.row_a, w.touched_row_a)
        for i in range(n_touched):
            total += w.touched_row_a[i] > a
        clear_row(w.row_a, w.touched_row_a, n_touched)
    return total


cdef int64_t joined_cut(Work* w) noexcept nogil:
    cdef int64_t v, k, total = 0
    for v in range(w.n):
        for k in range(w.indptr[v], w.indptr[v + 1]):
            if w.part[w.indices[k]] != w.part[v]:
                total += 1
    return total


cdef int compare_int32(const void* x, const void* y) noexcept nogil:
    cdef int32_t a = (<const int32_t*>x)[0], b = (<const int32_t*>y)[0]
    return (a > b) - (a < b)


cdef void sort_within_parts(int32_t* order, int64_t n) noexcept nogil:
    """Ascending vertex ids inside each part (any order is equivalent; this one is canonical)."""
    cdef int64_t part
    for part in range((n + PBR_PART - 1) // PBR_PART):
        qsort(order + part * PBR_PART, min(PBR_PART, n - part * PBR_PART), sizeof(int32_t), compare_int32)


# ---------------------------------------------------------------- one graph

cdef inline int32_t* carve32(char** cursor, int64_t count) noexcept nogil:
    cdef int32_t* out = <int32_t*>cursor[0]
    cursor[0] += count * sizeof(int32_t)
    return out


cdef char* work_init(Work* w, int32_t n, const int64_t* indptr, const int32_t* indices, uint64_t seed) noexcept nogil:
    """Carve every work array of one graph (n > 8) out of one allocation; NULL if out of memory."""
    cdef int64_t i, maxdeg = 0, n_parts = (n + PBR_PART - 1) // PBR_PART, critical_span, nbytes
    cdef char* block
    cdef char* cursor
    for i in range(n):
        if indptr[i + 1] - indptr[i] > maxdeg:
            maxdeg = indptr[i + 1] - indptr[i]
    w.n = n
    w.indptr = indptr
    w.indices = indices
    w.n_parts = <int32_t>n_parts
    w.rng = seed
    w.bucket_span = 2 * (<int64_t>NET_WEIGHT * (maxdeg + 1) + maxdeg) + 1
    critical_span = min(2 * indptr[n], 2 * PBR_PART * maxdeg) + 1
    # int64 arrays first keep every array aligned, bytes last
    nbytes = ((2 * (n_parts + 2) + maxdeg + 1) * sizeof(int64_t)
              + (13 * <int64_t>n + 9 * n_parts + 2 * w.bucket_span + critical_span) * sizeof(int32_t)
              + 2 * <int64_t>n + 2 * n_parts)
    block = <char*>calloc(nbytes, 1)  # zero: the pin counts, marks, rows, masks and tallies start empty
    if block == NULL:
        return NULL
    w.stack = <int64_t*>block
    w.sort_keys = w.stack + 2 * (n_parts + 2)
    cursor = <char*>(w.sort_keys + maxdeg + 1)
    w.order = carve32(&cursor, n)
    w.where = carve32(&cursor, n)
    w.cnt0 = carve32(&cursor, n)
    w.cnt1 = carve32(&cursor, n)
    w.gain = carve32(&cursor, n)
    w.bnext = carve32(&cursor, n)
    w.bprev = carve32(&cursor, n)
    w.movelog = carve32(&cursor, n)
    w.queue = carve32(&cursor, n)
    w.mark = carve32(&cursor, n)
    w.part = carve32(&cursor, n)
    w.pos = carve32(&cursor, n)
    w.best_order = carve32(&cursor, n)
    w.row_a = carve32(&cursor, n_parts)
    w.row_b = carve32(&cursor, n_parts)
    w.member_mask = carve32(&cursor, n_parts)
    w.touched_mask = carve32(&cursor, n_parts)
    w.touched_row_a = carve32(&cursor, n_parts)
    w.touched_row_b = carve32(&cursor, n_parts)
    w.tally = carve32(&cursor, n_parts)
    w.touched_tally = carve32(&cursor, n_parts)
    w.part_size = carve32(&cursor, n_parts)
    w.bhead = carve32(&cursor, 2 * w.bucket_span)
    w.critical = carve32(&cursor, critical_span)
    w.inb = cursor
    w.best_side = w.inb + n
    w.active_now = w.best_side + n
    w.active_next = w.active_now + n_parts
    for i in range(n):
        w.where[i] = -1
    for i in range(n_parts):
        w.part_size[i] = PBR_PART
    w.part_size[n_parts - 1] = <int32_t>(n - (n_parts - 1) * PBR_PART)
    for i in range(2 * w.bucket_span):
        w.bhead[i] = -1
    w.stamp = 0
    w.bmax[0] = 0
    w.bmax[1] = 0
    return block


cdef int pbr_one(int32_t n, const int64_t* indptr, const int32_t* indices, uint64_t seed, int64_t* perm_out,
                 int64_t* pairs_out) noexcept nogil:
    """PBR order of one graph into ``perm_out`` and its joined part pairs into ``pairs_out[0]``.

    Returns 0 on success, -1 if out of memory.

    Candidates: refined recursive bisections (small graphs get more for the same time), then
    the input order and reverse Cuthill-McKee, each refined only when it is close to the
    best (swaps remove 10-20% of the pairs; refining an order far worse is wasted time);
    the fewest joined pairs win.
    """
    cdef Work w
    cdef int64_t i, k, pairs, cut, best_pairs = -1, best_cut = -1
    cdef int32_t n_restarts
    cdef char* block
    if n <= PBR_PART:
        for i in range(n):
            perm_out[i] = i
        pairs_out[0] = 0
        return 0
    block = work_init(&w, n, indptr, indices, seed)
    if block == NULL:
        return -1
    n_restarts = max(min(N_RESTARTS, RESTART_BUDGET // n), 1)
    for k in range(n_restarts + 2):
        if k < n_restarts:
            recursive_bisection(&w)
        elif k == n_restarts:
            identity_order(&w)
        else:
            reverse_cuthill_mckee(&w)
        if k < n_restarts or joined_pairs(&w) * 100 <= best_pairs * INPUT_SLACK_PERCENT:
            refine_kway(&w)
        pairs = joined_pairs(&w)
        cut = joined_cut(&w)
        if best_pairs < 0 or pairs < best_pairs or (pairs == best_pairs and cut < best_cut):
            best_pairs = pairs
            best_cut = cut
            for i in range(n):
                w.best_order[i] = w.order[i]
    sort_within_parts(w.best_order, n)
    for i in range(n):
        perm_out[i] = w.best_order[i]
    pairs_out[0] = best_pairs
    free(block)
    return 0


def pbr_many(const int64_t[::1] node_offsets, const int64_t[::1] indptr, const int64_t[::1] entry_offsets,
             const int32_t[::1] indices, const uint64_t[::1] seeds, int64_t[::1] perm_out,
             int64_t[::1] pairs_out, *, int n_threads=1):
    """PBR orders of a packed batch of graphs (the layout of graphkern.graph.pack_graphs).

    Graph ``g`` has ``node_offsets[g+1] - node_offsets[g]`` vertices, local row pointers
    at ``indptr[node_offsets[g] + g :]`` and local column indices from ``entry_offsets[g]``;
    its order is written to ``perm_out[node_offsets[g] : node_offsets[g+1]]`` and the pairs of
    its parts joined by an edge (half its off-diagonal octiles) to ``pairs_out[g]``.  Graphs are
    handed to threads largest first (dynamic schedule: sizes differ by orders of magnitude).
    """
    cdef Py_ssize_t n_graphs = node_offsets.shape[0] - 1
    cdef Py_ssize_t idx
    cdef int64_t g, failed = 0
    cdef int64_t[::1] by_size
    if n_graphs <= 0:
        return
    if (seeds.shape[0] != n_graphs or pairs_out.shape[0] != n_graphs or entry_offsets.shape[0] != n_graphs + 1
            or perm_out.shape[0] != node_offsets[n_graphs] or indptr.shape[0] != node_offsets[n_graphs] + n_graphs
            or indices.shape[0] != entry_offsets[n_graphs]):
        raise ValueError("pbr_many: array lengths do not describe one packed batch")
    sizes = np.diff(np.asarray(entry_offsets)) + np.diff(np.asarray(node_offsets))
    by_size = np.ascontiguousarray(np.argsort(-sizes, kind="stable"), dtype=np.int64)
    with nogil:
        for idx in prange(n_graphs, schedule="dynamic", chunksize=1, num_threads=n_threads):
            g = by_size[idx]
            if pbr_one(<int32_t>(node_offsets[g + 1] - node_offsets[g]), &indptr[node_offsets[g] + g],
                       &indices[entry_offsets[g]] if entry_offsets[g] < indices.shape[0] else NULL,
                       seeds[g],
                       &perm_out[node_offsets[g]] if node_offsets[g] < perm_out.shape[0] else NULL,
                       &pairs_out[g]) != 0:
                failed += 1
    if failed:
        raise MemoryError(f"PBR: out of memory for the work arrays of {failed} graph(s)")
