"""Jaccard, Sorensen and overlap similarity of the endpoints of every stored edge, on the CPU
and the GPU (see :mod:`graphkern.similarity.api` for the conventions and the GPU variants)."""

from graphkern.similarity.api import SimilarityInfo, jaccard, overlap, sorensen
from graphkern.similarity.plan import VARIANTS, choose_variant

__all__ = ["jaccard", "sorensen", "overlap", "choose_variant", "VARIANTS", "SimilarityInfo"]
