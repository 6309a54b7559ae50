"""Jaccard, Sorensen and overlap similarity of the endpoints of every stored edge, on the CPU
and the GPU (see :mod:`graphkern.similarity.api` for the conventions and the GPU variants)."""

from graphkern.similarity.api import SimilarityInfo, SymmetricPattern, jaccard, overlap, sorensen, symmetric_pattern
from graphkern.similarity.gpu import DeviceSimilarity
from graphkern.similarity.plan import VARIANTS, auto_variant, choose_variant
# the name graphkern/bench/suites/jaccard.py imports; it goes once the suite imports cpu_values
# from graphkern.similarity.cpu
from graphkern.similarity.cpu import cpu_values as _cpu_values  # noqa: F401

__all__ = ["jaccard", "sorensen", "overlap", "choose_variant", "VARIANTS", "SimilarityInfo"]
