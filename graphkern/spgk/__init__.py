"""The shortest-path graph kernel on multicore CPUs and NVIDIA GPUs (see :mod:`graphkern.spgk.api`)."""

from graphkern.spgk.api import CPU_METHODS, GPU_METHODS, ShortestPathKernel
from graphkern.spgk.batch import shortest_path_graph
from graphkern.basekernels.shortest_path import (BrownianBridgeEdge, DiracEdge, DiracNode, GaussianEdge, GaussianNode,
                                    ProductNode)

__all__ = ["ShortestPathKernel", "DiracNode", "GaussianNode", "ProductNode", "DiracEdge", "GaussianEdge",
           "BrownianBridgeEdge", "shortest_path_graph", "CPU_METHODS", "GPU_METHODS"]
