"""The CUDA runtime layer: the only package that talks to the driver (see runtime.py)."""
