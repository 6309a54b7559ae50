"""Cython OpenMP kernels, one module per capability (compiled by setup.py)."""
