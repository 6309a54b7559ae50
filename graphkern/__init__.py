"""graphkern: graph similarity kernels and graph centrality on NVIDIA GPUs and multicore CPUs.

Capabilities (each with ``backend="auto" | "cpu" | "gpu"``):

* :func:`jaccard`, :func:`sorensen`, :func:`overlap` -- edge similarity weights
  (module ``graphkern.similarity``);
* :func:`expm_multiply`, :func:`total_communicability`, :func:`funm_multiply` --
  exp(beta A) x by Lanczos;
* :class:`ShortestPathKernel` -- the shortest-path graph kernel (FCSP);
* :class:`MarginalizedGraphKernel` -- the marginalized graph kernel.

Device memory that a call frees stays with the process for the next call's allocations (up to a
quarter of each GPU's memory); :func:`release_gpu_memory` gives it back to the driver, for another
library in the same process.
"""

from importlib import import_module

from graphkern.errors import CudaError, GPUUnavailableError, GraphTooLargeError, NotConvergedError
from graphkern.graph import Graph, pack_graphs
from graphkern._cuda.runtime import gpu_available, release_cached as release_gpu_memory
from graphkern._cuda.runtime import unavailable_reason as gpu_unavailable_reason

__version__ = "0.1.0"

# Public names provided by capability modules, imported on first use so that
# `import graphkern` stays fast and one capability's import problem cannot hide the rest.
_LAZY = {
    "jaccard": "graphkern.similarity",
    "sorensen": "graphkern.similarity",
    "overlap": "graphkern.similarity",
    "expm": "graphkern.expm",
    "expm_multiply": "graphkern.expm",
    "funm_multiply": "graphkern.expm",
    "total_communicability": "graphkern.expm",
    "ShortestPathKernel": "graphkern.spgk",
    "MarginalizedGraphKernel": "graphkern.mgk",
    "basekernels": "graphkern.basekernels",
    "similarity": "graphkern.similarity",
    "spgk": "graphkern.spgk",
    "mgk": "graphkern.mgk",
    "io": "graphkern.io",
    "generators": "graphkern.generators",
    "distributed": "graphkern.distributed",
}

__all__ = ["Graph", "pack_graphs", "CudaError", "GPUUnavailableError", "GraphTooLargeError",
           "NotConvergedError", "gpu_available", "gpu_unavailable_reason", "release_gpu_memory", "devices",
           *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphkern' has no attribute {name!r}")
    mod = import_module(module)
    value = getattr(mod, name, mod) if not module.endswith("." + name) else mod
    globals()[name] = value
    return value


def __dir__():
    """The public API, the lazily imported names included (for dir() and tab completion)."""
    return sorted(set(__all__) | {"__version__"})


def devices():
    """Properties of every usable CUDA device (an empty list without a GPU)."""
    from graphkern._cuda.runtime import devices_info
    return devices_info()
