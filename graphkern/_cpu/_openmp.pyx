# cython: language_level=3
"""The OpenMP runtime the Cython kernels are built against: this module imports only when it links."""

cimport openmp


def max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS."""
    return openmp.omp_get_max_threads()
