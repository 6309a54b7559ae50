# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""PBR's recursive bisection: balanced splits into parts of 8 vertices that join few parts.

A segment of ``s`` vertices is split into a left side of exactly ``8 * floor(ceil(s / 8) / 2)``
vertices and the rest (explicit stack), so every segment but the rightmost has a multiple
of 8 vertices and the small part lands last.  The bisection objective is a hypergraph cut:
each vertex's closed neighbourhood is a net (a tile row seen from that vertex), a cut net
costs ``NET_WEIGHT`` and each cut edge 1 (edge cut breaks ties and guides growth).  Nets of
vertices outside the segment count too: a vertex already separated whose neighbours
straddle the cut would touch two parts instead of one.

Each bisection: ``N_TRIES`` initial partitions by greedy graph growing from a
pseudo-peripheral vertex (frontier vertices only, so the region stays connected while it
can), each improved by Fiduccia-Mattheyses passes with gain buckets.  Moves may leave
balance by ``tol`` vertices, but a pass rolls back to its best *perfectly* balanced
prefix, so each bisection ends exactly balanced.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t

cdef inline uint64_t next_random(Work* w) noexcept nogil:
    # splitmix64: tiny, good enough for seeds and tie-breaking
    w.rng += <uint64_t>0x9E3779B97F4A7C15
    cdef uint64_t z = w.rng
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline int32_t random_below(Work* w, int32_t bound) noexcept nogil:
    return <int32_t>(next_random(w) % <uint64_t>bound)


# ---------------------------------------------------------------- gain buckets

cdef inline void bucket_insert(Work* w, int32_t v, int side) noexcept nogil:
    cdef int64_t b = w.gain[v] + w.boffset
    cdef int32_t* head = w.bhead + side * w.bucket_span
    w.bprev[v] = -1
    w.bnext[v] = head[b]
    if head[b] >= 0:
        w.bprev[head[b]] = v
    head[b] = v
    w.inb[v] = 1
    if b > w.bmax[side]:
        w.bmax[side] = b


cdef inline void bucket_remove(Work* w, int32_t v, int side) noexcept nogil:
    cdef int64_t b = w.gain[v] + w.boffset
    cdef int32_t* head = w.bhead + side * w.bucket_span
    if w.bprev[v] >= 0:
        w.bnext[w.bprev[v]] = w.bnext[v]
    else:
        head[b] = w.bnext[v]
    if w.bnext[v] >= 0:
        w.bprev[w.bnext[v]] = w.bprev[v]
    w.inb[v] = 0


cdef inline int32_t bucket_top(Work* w, int side) noexcept nogil:
    """The vertex of highest gain on ``side`` (-1 if none); lowers bmax past empty buckets."""
    cdef int32_t* head = w.bhead + side * w.bucket_span
    while w.bmax[side] > 0 and head[w.bmax[side]] < 0:
        w.bmax[side] -= 1
    return head[w.bmax[side]]


cdef inline void adjust_gain(Work* w, int32_t x, int32_t delta) noexcept nogil:
    cdef int side = w.where[x]
    bucket_remove(w, x, side)
    w.gain[x] += delta
    bucket_insert(w, x, side)


# ---------------------------------------------------------------- bisection objective

cdef inline int32_t net_term(int32_t same, int32_t other) noexcept nogil:
    """What one net adds to the gain of moving a pin, given the pin counts on its side and the other."""
    if same == 1 and other > 0:
        return 1
    if other == 0 and same > 1:
        return -1
    return 0


cdef inline int32_t* net_count(Work* w, int side) noexcept nogil:
    return w.cnt0 if side == 0 else w.cnt1


cdef int32_t compute_gain(Work* w, int32_t v) noexcept nogil:
    cdef int a = w.where[v]
    cdef int32_t* ca = net_count(w, a)
    cdef int32_t* cb = net_count(w, 1 - a)
    cdef int32_t nets = net_term(ca[v], cb[v])
    cdef int32_t edges = 0
    cdef int64_t k
    cdef int32_t x, s
    for k in range(w.indptr[v], w.indptr[v + 1]):
        x = w.indices[k]
        if x == v:
            continue
        nets += net_term(ca[x], cb[x])
        s = w.where[x]
        if s == a:
            edges -= 1
        elif s >= 0:
            edges += 1
    return NET_WEIGHT * nets + edges


cdef void update_net_pins(Work* w, int32_t net, int32_t moved, int a, int32_t delta_a, int32_t delta_b) noexcept nogil:
    """Adjust the gains of the bucketed pins of ``net`` (other than ``moved``) by side."""
    cdef int64_t k
    cdef int32_t x
    if net != moved and w.inb[net]:
        adjust_gain(w, net, delta_a if w.where[net] == a else delta_b)
    for k in range(w.indptr[net], w.indptr[net + 1]):
        x = w.indices[k]
        if x != moved and x != net and w.inb[x]:
            adjust_gain(w, x, delta_a if w.where[x] == a else delta_b)


cdef inline void move_net(Work* w, int32_t net, int32_t v, int a, bint update) noexcept nogil:
    cdef int32_t* ca = net_count(w, a)
    cdef int32_t* cb = net_count(w, 1 - a)
    cdef int32_t before_a = ca[net], before_b = cb[net]
    cdef int32_t da, db
    ca[net] = before_a - 1
    cb[net] = before_b + 1
    if update:
        da = net_term(before_a - 1, before_b + 1) - net_term(before_a, before_b)
        db = net_term(before_b + 1, before_a - 1) - net_term(before_b, before_a)
        if da != 0 or db != 0:
            update_net_pins(w, net, v, a, NET_WEIGHT * da, NET_WEIGHT * db)


cdef void move_vertex(Work* w, int32_t v, bint update) noexcept nogil:
    """Move ``v`` to the other side; with ``update`` keep the bucketed gains exact."""
    cdef int a = w.where[v]
    cdef int64_t k
    cdef int32_t x
    w.where[v] = 1 - a
    move_net(w, v, v, a, update)
    for k in range(w.indptr[v], w.indptr[v + 1]):
        x = w.indices[k]
        if x != v:
            move_net(w, x, v, a, update)
    if update:
        for k in range(w.indptr[v], w.indptr[v + 1]):
            x = w.indices[k]
            if x != v and w.inb[x]:
                adjust_gain(w, x, 2 if w.where[x] == a else -2)


cdef void segment_enter(Work* w, int64_t lo, int64_t hi) noexcept nogil:
    """Put every vertex of the segment on the right and count net pins."""
    cdef int64_t i, k
    cdef int32_t v, maxdeg = 0
    for i in range(lo, hi):
        w.where[w.order[i]] = 1
    for i in range(lo, hi):
        v = w.order[i]
        w.cnt1[v] += 1
        for k in range(w.indptr[v], w.indptr[v + 1]):
            if w.indices[k] != v:
                w.cnt1[w.indices[k]] += 1
        if w.indptr[v + 1] - w.indptr[v] > maxdeg:
            maxdeg = <int32_t>(w.indptr[v + 1] - w.indptr[v])
    w.boffset = <int64_t>NET_WEIGHT * (maxdeg + 1) + maxdeg
    w.cost = 0


cdef void segment_clear_counts(Work* w, int64_t lo, int64_t hi) noexcept nogil:
    cdef int64_t i, k
    cdef int32_t v
    for i in range(lo, hi):
        v = w.order[i]
        w.cnt0[v] = 0
        w.cnt1[v] = 0
        for k in range(w.indptr[v], w.indptr[v + 1]):
            w.cnt0[w.indices[k]] = 0
            w.cnt1[w.indices[k]] = 0


cdef void empty_buckets(Work* w, int64_t lo, int64_t hi) noexcept nogil:
    """Empty the segment's buckets and reset bmax: grow_left and fm_pass start from this state."""
    cdef int64_t i
    cdef int32_t v
    for i in range(lo, hi):
        v = w.order[i]
        if w.inb[v]:
            bucket_remove(w, v, w.where[v])
    w.bmax[0] = 0
    w.bmax[1] = 0


cdef int32_t bfs_farthest(Work* w, int32_t start, int only_side) noexcept nogil:
    """The last vertex reached by BFS from ``start`` inside the segment (one pseudo-peripheral sweep).

    ``only_side`` >= 0 restricts the search to vertices on that side.
    """
    cdef int64_t head = 0, tail = 1, k
    cdef int32_t v, x
    w.stamp += 1
    w.queue[0] = start
    w.mark[start] = w.stamp
    while head < tail:
        v = w.queue[head]
        head += 1
        for k in range(w.indptr[v], w.indptr[v + 1]):
            x = w.indices[k]
            if w.mark[x] != w.stamp and w.where[x] >= 0 and (only_side < 0 or w.where[x] == only_side):
                w.mark[x] = w.stamp
                w.queue[tail] = x
                tail += 1
    return w.queue[tail - 1]


cdef void grow_left(Work* w, int64_t lo, int64_t hi, int64_t target_left, int32_t seed) noexcept nogil:
    """Greedy graph growing: move the best-gain frontier vertex to the left until it has ``target_left``."""
    cdef int64_t left = 0, i, k
    cdef int32_t v = seed, x
    while True:
        w.cost -= compute_gain(w, v)
        move_vertex(w, v, True)
        left += 1
        if left == target_left:
            break
        for k in range(w.indptr[v], w.indptr[v + 1]):
            x = w.indices[k]
            if w.where[x] == 1 and not w.inb[x]:
                w.gain[x] = compute_gain(w, x)
                bucket_insert(w, x, 1)
        v = bucket_top(w, 1)
        if v >= 0:
            bucket_remove(w, v, 1)
        else:
            # the grown region is a whole component: restart from a far vertex of what is left
            i = lo + random_below(w, <int32_t>(hi - lo))
            while w.where[w.order[i]] != 1:
                i += 1
                if i == hi:
                    i = lo
            v = bfs_farthest(w, w.order[i], 1)
    empty_buckets(w, lo, hi)


cdef int64_t fm_pass(Work* w, int64_t lo, int64_t hi, int64_t target_left, int64_t tol) noexcept nogil:
    """One Fiduccia-Mattheyses pass; ends on its best perfectly balanced state.  Returns the gain."""
    cdef int64_t left = 0, i, n_moves = 0, best_moves = 0
    cdef int64_t cum = 0, best_cum = 0, since_best = 0
    cdef int64_t patience = max(64, (hi - lo) // 4)
    cdef int32_t v, v0, v1, g0, g1
    cdef int side
    cdef bint ok0, ok1
    for i in range(lo, hi):
        v = w.order[i]
        if w.where[v] == 0:
            left += 1
        w.gain[v] = compute_gain(w, v)
        bucket_insert(w, v, w.where[v])
    while True:
        ok0 = left - 1 >= target_left - tol
        ok1 = left + 1 <= target_left + tol
        v0 = bucket_top(w, 0) if ok0 else -1
        v1 = bucket_top(w, 1) if ok1 else -1
        if v0 < 0 and v1 < 0:
            break
        if v0 >= 0 and v1 >= 0:
            g0 = w.gain[v0]
            g1 = w.gain[v1]
            if g0 != g1:
                side = 0 if g0 > g1 else 1
            else:
                side = 0 if left > target_left else 1  # on a tie, move toward balance
        else:
            side = 0 if v0 >= 0 else 1
        v = v0 if side == 0 else v1
        bucket_remove(w, v, side)
        cum += w.gain[v]
        move_vertex(w, v, True)
        w.movelog[n_moves] = v
        n_moves += 1
        left += -1 if side == 0 else 1
        if left == target_left and cum > best_cum:
            best_cum = cum
            best_moves = n_moves
            since_best = 0
        else:
            since_best += 1
            if since_best > patience:
                break
    empty_buckets(w, lo, hi)
    while n_moves > best_moves:
        n_moves -= 1
        move_vertex(w, w.movelog[n_moves], False)
    w.cost -= best_cum
    return best_cum


cdef void bisect(Work* w, int64_t lo, int64_t hi, int64_t target_left) noexcept nogil:
    """Split segment [lo, hi) so that its first ``target_left`` positions are the left side."""
    cdef int64_t s = hi - lo, i, n_left, n_right
    cdef int64_t best_cost = -1
    cdef int64_t tol = max(2, min(PBR_PART, s // 16))
    cdef int32_t t, v, seed
    cdef int passes
    for t in range(N_TRIES):
        segment_enter(w, lo, hi)
        seed = bfs_farthest(w, w.order[lo + random_below(w, <int32_t>s)], -1)
        grow_left(w, lo, hi, target_left, seed)
        passes = 0
        while passes < 12 and fm_pass(w, lo, hi, target_left, tol) > 0:
            passes += 1
        if best_cost < 0 or w.cost < best_cost:
            best_cost = w.cost
            for i in range(lo, hi):
                w.best_side[i - lo] = <char>w.where[w.order[i]]
        segment_clear_counts(w, lo, hi)
    # stable partition of the segment by the best sides found
    n_left = 0
    n_right = target_left
    for i in range(lo, hi):
        v = w.order[i]
        w.where[v] = -1
        if w.best_side[i - lo] == 0:
            w.queue[n_left] = v
            n_left += 1
        else:
            w.queue[n_right] = v
            n_right += 1
    for i in range(s):
        w.order[lo + i] = w.queue[i]


cdef void recursive_bisection(Work* w) noexcept nogil:
    """Recursive bisection of the whole graph into ``order`` (parts are consecutive runs of 8)."""
    cdef int64_t top = 1, lo, hi, n_parts, target_left
    cdef int64_t* stack = w.stack
    identity_order(w)
    stack[0] = 0
    stack[1] = w.n
    while top > 0:
        top -= 1
        lo = stack[2 * top]
        hi = stack[2 * top + 1]
        if hi - lo <= PBR_PART:
            continue
        n_parts = (hi - lo + PBR_PART - 1) // PBR_PART
        target_left = PBR_PART * (n_parts // 2)
        bisect(w, lo, hi, target_left)
        stack[2 * top] = lo + target_left
        stack[2 * top + 1] = hi
        stack[2 * top + 2] = lo
        stack[2 * top + 3] = lo + target_left
        top += 2
