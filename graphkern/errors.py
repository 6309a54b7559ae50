"""Exceptions raised by graphkern.

Input problems raise ``ValueError``/``TypeError`` subclasses that name the offending
input; device problems raise :class:`CudaError` with the driver's error name.
"""


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    ``name`` is the driver's error name (e.g. ``CUDA_ERROR_OUT_OF_MEMORY``), ``message``
    its description, ``code`` the numeric ``CUresult`` and ``call`` the driver function.
    """

    def __init__(self, name, message="", code=None, call=None):
        self.name = str(name)
        self.message = str(message)
        self.code = code
        self.call = call
        where = f" in {call}" if call else ""
        super().__init__(f"{self.name}{where}: {self.message}" if self.message else self.name + where)

    def __reduce__(self):
        return (CudaError, (self.name, self.message, self.code, self.call))


class GPUUnavailableError(RuntimeError):
    """A GPU was asked for but cannot be used (no driver, no device, or built without CUDA)."""


class GraphTooLargeError(MemoryError):
    """The data does not fit in the device's memory; the message gives the bytes needed."""


class NotConvergedError(ArithmeticError):
    """An iterative solver did not reach its tolerance; the message names the pairs."""
