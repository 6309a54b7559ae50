"""The marginalized graph kernel (graphkern.mgk.kernel has the mathematics and the options)."""

from graphkern.mgk.kernel import MarginalizedGraphKernel
from graphkern.mgk.results import MGKInfo

__all__ = ["MarginalizedGraphKernel", "MGKInfo"]
