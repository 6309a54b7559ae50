"""Base kernels of both graph kernels, in one vocabulary.

* The marginalized graph kernel (:mod:`graphkern.basekernels.marginalized`): ``Constant``,
  ``KroneckerDelta``, ``SquareExponential``, combined over named label columns by
  ``TensorProduct`` (a product) or ``Additive`` (a mean); hyperparameters with bounds, so
  scikit-learn can tune them.
* The shortest-path graph kernel (:mod:`graphkern.basekernels.shortest_path`): on vertices
  ``DiracNode`` (equal categories), ``GaussianNode`` (a float column), ``ProductNode``
  (``k1 * k2``); on path lengths ``DiracEdge``, ``GaussianEdge``, ``BrownianBridgeEdge``.

The two families name the same ideas twice (each graph kernel takes its own family;
``graphkern.spgk`` re-exports the shortest-path names):

=====================================  ==================================================
shortest path                          marginalized
=====================================  ==================================================
``DiracNode("c")``                      ``TensorProduct(c=KroneckerDelta(h))``, h > 0 for
                                        vertices (the solver divides by vertex values)
``GaussianNode("x", sigma=s)``          ``TensorProduct(x=SquareExponential(s))``
``ProductNode(k1, k2)``, ``k1 * k2``    ``TensorProduct(c1=..., c2=...)``
``DiracEdge()`` / ``GaussianEdge(s)``   ``KroneckerDelta(0.0)`` / ``SquareExponential(s)``
                                        on an edge label column
=====================================  ==================================================
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
