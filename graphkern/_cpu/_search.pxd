# cython: language_level=3
"""Searches in sorted CSR rows shared by the Cython kernels."""

from libc.stdint cimport int32_t, int64_t

ctypedef fused sorted_index_t:
    int32_t
    int64_t


cdef inline int64_t lower_bound(const sorted_index_t* idx, int64_t lo, int64_t hi, int64_t x) noexcept nogil:
    """The first position in the sorted idx[lo:hi] holding a value >= x (hi if none)."""
    cdef int64_t mid
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if idx[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo
