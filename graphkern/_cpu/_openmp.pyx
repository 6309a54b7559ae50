# cython: language_level=3
"""OpenMP facts for the thread-count helper in graphkern._backend."""

cimport openmp


def max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS."""
    return openmp.omp_get_max_threads()


def openmp_enabled():
    return True
