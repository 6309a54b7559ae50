"""Gram matrices on a Dask cluster: tiles of equal predicted cost, one worker per GPU, results in
NumPy or in a Zarr store that a killed run resumes (``pip install graphkern[distributed]``)."""

from graphkern.distributed.api import gram

__all__ = ["gram"]
