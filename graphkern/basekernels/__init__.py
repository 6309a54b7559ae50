"""Base kernels of both graph kernels, in one vocabulary.

* The marginalized graph kernel (:mod:`graphkern.basekernels.marginalized`): ``Constant``,
  ``KroneckerDelta``, ``SquareExponential``, combined over named label columns by
  ``TensorProduct`` (a product) or ``Additive`` (a mean); hyperparameters with bounds, so
  scikit-learn can tune them.
* The shortest-path graph kernel (:mod:`graphkern.basekernels.shortest_path`): on vertices
  ``DiracNode`` (equal categories), ``GaussianNode`` (a float column), ``ProductNode``
  (``k1 * k2``); on path lengths ``DiracEdge``, ``GaussianEdge``, ``BrownianBridgeEdge``.

The two families name the same ideas twice: ``DiracNode("element")`` is what
``TensorProduct(element=KroneckerDelta(h))`` is at ``h = 0`` (1 for equal labels, else 0), and
``GaussianNode(c, sigma=s)`` what ``TensorProduct(c=SquareExponential(s))`` computes.  Each
graph kernel takes its own family (``graphkern.spgk`` re-exports the shortest-path names).
"""

from graphkern.basekernels.marginalized import (KIND_CONSTANT, KIND_KRONECKER_DELTA,
                                                KIND_KRONECKER_DELTA_DERIVATIVE, KIND_SQUARE_EXPONENTIAL,
                                                KIND_SQUARE_EXPONENTIAL_DERIVATIVE, Additive, BaseKernel,
                                                Constant, Kernel, KernelProgram, KroneckerDelta,
                                                SquareExponential, TensorProduct)
from graphkern.basekernels.shortest_path import (BrownianBridgeEdge, DiracEdge, DiracNode, EdgeKernel,
                                                 GaussianEdge, GaussianNode, NodeKernel, ProductNode)

__all__ = ["Kernel", "BaseKernel", "Constant", "KroneckerDelta", "SquareExponential", "TensorProduct",
           "Additive", "KernelProgram", "KIND_CONSTANT", "KIND_KRONECKER_DELTA", "KIND_SQUARE_EXPONENTIAL",
           "KIND_KRONECKER_DELTA_DERIVATIVE", "KIND_SQUARE_EXPONENTIAL_DERIVATIVE",
           "NodeKernel", "DiracNode", "GaussianNode", "ProductNode",
           "EdgeKernel", "DiracEdge", "GaussianEdge", "BrownianBridgeEdge"]
