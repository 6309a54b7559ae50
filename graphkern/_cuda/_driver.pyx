# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: language = c++
"""The only module that talks to the CUDA driver (through cuda-python's cydriver).

Every driver call runs without the GIL and its status is checked right after by
``_check``, which raises :class:`graphkern.errors.CudaError` carrying the driver's
error name and message.  Objects that own driver resources (contexts, buffers,
streams, events, pinned memory) release them when collected.
"""

cimport cython
from cuda.bindings cimport cydriver
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from libcpp.utility cimport pair
from libcpp.vector cimport vector
from cython.parallel cimport prange
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer

import numpy as np

from graphkern.errors import CudaError

cdef extern from *:
    """
    #include <stdint.h>
    """

# --------------------------------------------------------------------------- errors

cdef object _error(cydriver.CUresult status, str call):
    cdef const char* name = NULL
    cdef const char* text = NULL
    cydriver.cuGetErrorName(status, &name)
    cydriver.cuGetErrorString(status, &text)
    py_name = name.decode() if name != NULL else f"CUDA_ERROR_{<int>status}"
    py_text = text.decode() if text != NULL else "unknown error"
    return CudaError(py_name, py_text, <int>status, call)


cdef inline int _check(cydriver.CUresult status, str call) except -1:
    if status != cydriver.CUDA_SUCCESS:
        raise _error(status, call)
    return 0


_initialised = False


def init():
    """Initialise the driver once.  Raises RuntimeError if libcuda cannot be loaded."""
    global _initialised
    cdef cydriver.CUresult st
    if _initialised:
        return
    with nogil:
        st = cydriver.cuInit(0)
    _check(st, "cuInit")
    _initialised = True


def driver_version():
    cdef int v = 0
    init()
    _check(cydriver.cuDriverGetVersion(&v), "cuDriverGetVersion")
    return v


def device_count():
    cdef int n = 0
    init()
    _check(cydriver.cuDeviceGetCount(&n), "cuDeviceGetCount")
    return n

# --------------------------------------------------------------------------- devices


# bytes held by this process's live DeviceBuffers, per device ordinal: unlike the device's free
# memory, other processes on the same GPU do not move it
cdef enum:
    _MAX_ORDINALS = 256
cdef size_t _allocated[_MAX_ORDINALS]

# Freed buffers keep their memory for the next allocation of about their size.  cuMemAlloc and
# cuMemFree each cost from tens of microseconds to a millisecond (the driver maps or unmaps pages),
# and a call that allocates a dozen buffers would pay that every time.  A freed block may still be
# read by work queued on any stream, so the free waits for the device as cuMemFree does (one context
# synchronization, microseconds when the device is idle) before the block joins ``cached``: an
# allocation then takes a block without waiting.  The list is touched only with the GIL held.  It
# holds at most a quarter of a device's memory in at most _MAX_BLOCKS blocks; an allocation the
# driver refuses returns every cached block and tries once more; memory_info counts cached bytes
# as free.
ctypedef pair[size_t, cydriver.CUdeviceptr] Block
cdef vector[vector[Block]] _cached = vector[vector[Block]](_MAX_ORDINALS)
cdef size_t _cached_bytes[_MAX_ORDINALS]
cdef size_t _cache_limit[_MAX_ORDINALS]
cdef enum:
    _SMALL_BLOCK = 1 << 20  # below: sizes rounded to 512 bytes, above to the driver's 2 MiB pages
    _MAX_BLOCKS = 256


cdef inline size_t _block_size(size_t n) noexcept nogil:
    if n < _SMALL_BLOCK:
        return (n + 511) & ~(<size_t>511)
    return (n + (<size_t>2 << 20) - 1) & ~((<size_t>2 << 20) - 1)


cdef cydriver.CUdeviceptr _take(vector[Block]& blocks, size_t want, size_t* got) noexcept nogil:
    """The smallest block of ``blocks`` from ``want`` to 1.25 ``want`` bytes, removed; 0 if none."""
    cdef Py_ssize_t i, best = -1
    cdef size_t size
    cdef cydriver.CUdeviceptr ptr
    for i in range(<Py_ssize_t>blocks.size()):
        size = blocks[i].first
        if want <= size <= want + want // 4 and (best < 0 or size < blocks[best].first):
            best = i
    if best < 0:
        return 0
    ptr, got[0] = blocks[best].second, blocks[best].first
    blocks[best] = blocks.back()
    blocks.pop_back()
    return ptr


def release_cached(Device device):
    """Give the device's cached blocks back to the driver."""
    cdef int o = device.ordinal
    cdef Block b
    if o >= _MAX_ORDINALS:
        return
    device.activate()
    while _cached[o].size():
        b = _cached[o].back()
        _cached[o].pop_back()
        _cached_bytes[o] -= b.first
        with nogil:
            cydriver.cuMemFree(b.second)


def cached_bytes(Device device):
    """Bytes of freed blocks this process keeps on the device for its next allocations."""
    return int(_cached_bytes[device.ordinal]) if device.ordinal < _MAX_ORDINALS else 0


cdef class Device:
    """One GPU with its retained primary context and its loaded modules."""

    cdef readonly int ordinal
    cdef cydriver.CUdevice dev
    cdef cydriver.CUcontext ctx
    cdef dict _modules
    cdef object _props

    def __cinit__(self, int ordinal):
        cdef cydriver.CUresult st
        init()
        n = device_count()
        if ordinal < 0 or ordinal >= n:
            raise ValueError(f"device {ordinal} does not exist: this machine has {n} CUDA device(s)")
        self.ordinal = ordinal
        self.ctx = NULL
        _check(cydriver.cuDeviceGet(&self.dev, ordinal), "cuDeviceGet")
        with nogil:
            st = cydriver.cuDevicePrimaryCtxRetain(&self.ctx, self.dev)
        _check(st, "cuDevicePrimaryCtxRetain")
        self._modules = {}
        self._props = None
        self.activate()

    def __dealloc__(self):
        if self.ctx != NULL:
            cydriver.cuDevicePrimaryCtxRelease(self.dev)

    cpdef activate(self):
        """Make this device's primary context current on the calling thread."""
        cdef cydriver.CUresult st
        with nogil:
            st = cydriver.cuCtxSetCurrent(self.ctx)
        _check(st, "cuCtxSetCurrent")

    cdef int _attr(self, cydriver.CUdevice_attribute a) except? -1:
        cdef int v = 0
        _check(cydriver.cuDeviceGetAttribute(&v, a, self.dev), "cuDeviceGetAttribute")
        return v

    @property
    def properties(self):
        """Name, compute capability, SM count, memory and limits, read once."""
        cdef char name[256]
        cdef size_t total = 0
        if self._props is None:
            _check(cydriver.cuDeviceGetName(name, 256, self.dev), "cuDeviceGetName")
            _check(cydriver.cuDeviceTotalMem(&total, self.dev), "cuDeviceTotalMem")
            self._props = dict(
                ordinal=self.ordinal,
                name=name.decode(),
                compute_capability=(self._attr(cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                    self._attr(cydriver.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
                multiprocessor_count=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                total_memory=int(total),
                max_threads_per_block=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
                max_shared_memory_per_block_optin=self._attr(
                    cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                shared_memory_per_multiprocessor=self._attr(
                    cydriver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
                l2_cache_size=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
                warp_size=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
                memory_clock_khz=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
                memory_bus_width=self._attr(cydriver.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            )
        return dict(self._props)

    def allocated_bytes(self):
        """Bytes of device memory this process holds in live :class:`DeviceBuffer` objects here."""
        return int(_allocated[self.ordinal]) if self.ordinal < _MAX_ORDINALS else 0

    def memory_info(self):
        """``(free, total)`` bytes on the device now; free counts the blocks this process keeps
        cached for its next allocations."""
        cdef size_t free = 0, total = 0
        self.activate()
        _check(cydriver.cuMemGetInfo(&free, &total), "cuMemGetInfo")
        return int(free) + cached_bytes(self), int(total)

    def synchronize(self):
        cdef cydriver.CUresult st
        self.activate()
        with nogil:
            st = cydriver.cuCtxSynchronize()
        _check(st, "cuCtxSynchronize")

    def can_access_peer(self, Device other):
        cdef int ok = 0
        _check(cydriver.cuDeviceCanAccessPeer(&ok, self.dev, other.dev), "cuDeviceCanAccessPeer")
        return bool(ok)

    def native_peer_atomics(self, Device other):
        """Whether atomics by this device's kernels on ``other``'s memory are native (NVLink):
        what a work counter shared across devices needs."""
        cdef int ok = 0
        _check(cydriver.cuDeviceGetP2PAttribute(&ok, cydriver.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                                                self.dev, other.dev), "cuDeviceGetP2PAttribute")
        return bool(ok)

    def enable_peer_access(self, Device other):
        """Let kernels on this device read ``other``'s memory; idempotent."""
        cdef cydriver.CUresult st
        self.activate()
        st = cydriver.cuCtxEnablePeerAccess(other.ctx, 0)
        if st != cydriver.CUDA_SUCCESS and st != cydriver.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            _check(st, "cuCtxEnablePeerAccess")

    def load_module(self, str key, bytes image):
        """Load a cubin/fatbin/PTX image once per device; later calls return the cached module."""
        mod = self._modules.get(key)
        if mod is None:
            self.activate()
            mod = Module(self, key, image)
            self._modules[key] = mod
        return mod

    def __repr__(self):
        p = self.properties
        return f"<Device {self.ordinal}: {p['name']} sm_{p['compute_capability'][0]}{p['compute_capability'][1]}>"


# --------------------------------------------------------------------------- modules


cdef class Module:
    cdef cydriver.CUmodule mod
    cdef readonly Device device
    cdef readonly str key
    cdef dict _functions

    def __cinit__(self, Device device, str key, bytes image):
        cdef const char* data = image
        cdef cydriver.CUresult st
        self.device = device
        self.key = key
        self._functions = {}
        with nogil:
            st = cydriver.cuModuleLoadData(&self.mod, <const void*>data)
        _check(st, f"cuModuleLoadData({key})")

    def function(self, str name):
        """The kernel ``name`` (an extern "C" entry point) of this module."""
        cdef cydriver.CUfunction f
        cdef bytes bname
        fn = self._functions.get(name)
        if fn is None:
            bname = name.encode()
            st = cydriver.cuModuleGetFunction(&f, self.mod, bname)
            if st == cydriver.CUDA_ERROR_NOT_FOUND:
                raise CudaError("CUDA_ERROR_NOT_FOUND", f"kernel {name!r} is not in module {self.key!r}",
                                <int>st, "cuModuleGetFunction")
            _check(st, "cuModuleGetFunction")
            fn = Function()
            (<Function>fn).f = f
            (<Function>fn).name = name
            (<Function>fn).device = self.device
            self._functions[name] = fn
        return fn


cdef class Function:
    cdef cydriver.CUfunction f
    cdef readonly str name
    cdef readonly Device device

    # Each query activates the device first: a thread that never launched on it (a Dask worker's task
    # thread, a staging thread) has no current context, and the driver answers INVALID_CONTEXT.

    cdef int _attr(self, cydriver.CUfunction_attribute a) except? -1:
        cdef int v = 0
        self.device.activate()
        _check(cydriver.cuFuncGetAttribute(&v, a, self.f), "cuFuncGetAttribute")
        return v

    @property
    def attributes(self):
        return dict(
            max_threads_per_block=self._attr(cydriver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            num_regs=self._attr(cydriver.CU_FUNC_ATTRIBUTE_NUM_REGS),
            shared_size_bytes=self._attr(cydriver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            local_size_bytes=self._attr(cydriver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
        )

    def set_max_dynamic_shared_memory(self, int nbytes):
        self.device.activate()
        _check(cydriver.cuFuncSetAttribute(self.f, cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                           nbytes), "cuFuncSetAttribute")

    def set_preferred_shared_carveout(self, int percent):
        """Ask for ``percent`` of the SM's L1/shared storage as shared memory (the rest is L1)."""
        if not 0 <= percent <= 100:
            raise ValueError(f"shared-memory carveout must be a percentage in [0, 100], got {percent}")
        self.device.activate()
        _check(cydriver.cuFuncSetAttribute(self.f, cydriver.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                           percent), "cuFuncSetAttribute")

    def max_active_blocks_per_sm(self, int block_size, size_t dynamic_shared=0):
        cdef int n = 0
        self.device.activate()
        _check(cydriver.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, self.f, block_size, dynamic_shared),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n

    def __repr__(self):
        return f"<Function {self.name} on device {self.device.ordinal}>"


# --------------------------------------------------------------------------- memory


@cython.no_gc_clear
cdef class DeviceBuffer:
    """``nbytes`` of device memory, freed when the last reference goes.

    ``dtype`` and ``shape`` are optional annotations used by :meth:`to_host`.
    A view (:meth:`view`) shares its parent's memory and keeps the parent alive.
    """

    cdef cydriver.CUdeviceptr ptr
    cdef cydriver.CUcontext ctx  # kept as a C field: __dealloc__ must not touch Python attributes
    cdef int ordinal  # likewise, for the count of allocated bytes and the block cache
    cdef size_t block  # the bytes of the block behind ptr (nbytes rounded up)
    cdef readonly size_t nbytes
    cdef readonly Device device
    cdef object _parent
    cdef public object dtype
    cdef public object shape

    def __cinit__(self, Device device, size_t nbytes, *, dtype=None, shape=None, _view_of=None,
                  size_t _offset=0):
        cdef cydriver.CUresult st
        self.device = device
        self.ctx = device.ctx
        self.nbytes = nbytes
        self.ptr = 0
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.shape = shape
        if _view_of is not None:
            self._parent = _view_of
            self.ptr = (<DeviceBuffer>_view_of).ptr + _offset
            return
        self._parent = None
        if nbytes == 0:
            return
        self.ordinal = device.ordinal
        self.block = _block_size(nbytes)
        device.activate()
        if self.ordinal < _MAX_ORDINALS:
            self.ptr = self._from_cache(device)
            if self.ptr != 0:
                _allocated[self.ordinal] += nbytes
                return
        with nogil:
            st = cydriver.cuMemAlloc(&self.ptr, self.block)
        if st == cydriver.CUDA_ERROR_OUT_OF_MEMORY and self.ordinal < _MAX_ORDINALS and _cached_bytes[self.ordinal]:
            release_cached(device)
            device.activate()
            with nogil:
                st = cydriver.cuMemAlloc(&self.ptr, self.block)
        if st == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            free, total = device.memory_info()
            raise CudaError("CUDA_ERROR_OUT_OF_MEMORY",
                            f"out of memory allocating {nbytes:,} bytes on device {device.ordinal} "
                            f"({free:,} of {total:,} bytes free)", <int>st, "cuMemAlloc")
        _check(st, "cuMemAlloc")
        if self.ordinal < _MAX_ORDINALS:
            _allocated[self.ordinal] += nbytes
            if _cache_limit[self.ordinal] == 0:
                _cache_limit[self.ordinal] = <size_t>device.properties["total_memory"] // 4

    cdef cydriver.CUdeviceptr _from_cache(self, Device device) except? 0:
        """A cached block for this buffer, or 0."""
        cdef int o = self.ordinal
        cdef size_t got = 0
        cdef cydriver.CUdeviceptr ptr = _take(_cached[o], self.block, &got)
        if ptr != 0:
            _cached_bytes[o] -= got
            self.block = got
        return ptr

    def __dealloc__(self):
        cdef int o = self.ordinal
        cdef cydriver.CUresult st = cydriver.CUDA_ERROR_UNKNOWN
        cdef bint keep
        if self._parent is None and self.ptr != 0:
            keep = (o < _MAX_ORDINALS and _cached_bytes[o] + self.block <= _cache_limit[o]
                    and _cached[o].size() < _MAX_BLOCKS)
            with nogil:  # a free waits for the device: other threads go on meanwhile
                cydriver.cuCtxSetCurrent(self.ctx)
                if keep:
                    st = cydriver.cuCtxSynchronize()
                if st != cydriver.CUDA_SUCCESS:
                    cydriver.cuMemFree(self.ptr)
            if o < _MAX_ORDINALS:
                _allocated[o] -= self.nbytes
                if st == cydriver.CUDA_SUCCESS:
                    _cached[o].push_back(Block(self.block, self.ptr))
                    _cached_bytes[o] += self.block

    @property
    def ptr(self):
        return <uintptr_t>self.ptr

    def view(self, size_t offset, size_t nbytes, *, dtype=None, shape=None):
        if offset + nbytes > self.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) outside a buffer of {self.nbytes} bytes")
        return DeviceBuffer(self.device, nbytes, dtype=dtype, shape=shape, _view_of=self, _offset=offset)

    def copy_from_host(self, host, Stream stream=None, size_t offset=0):
        """Copy a C-contiguous host array (or buffer) into this buffer at ``offset``.

        With a stream the copy is asynchronous; the host memory must then stay alive
        and unchanged until the stream reaches it (use pinned memory for overlap).
        """
        cdef const unsigned char[::1] src
        cdef size_t n
        cdef cydriver.CUresult st
        mv = memoryview(host)
        if mv.nbytes == 0:  # cast() refuses shapes with a zero extent
            return
        src = mv.cast("B")
        n = src.shape[0]
        cdef cydriver.CUstream s = _stream_handle(stream)
        if offset + n > self.nbytes:
            raise ValueError(f"copy of {n} bytes at offset {offset} overflows a device buffer of {self.nbytes} bytes")
        if n == 0:
            return
        self.device.activate()
        with nogil:
            if stream is None:
                # from pageable memory the driver returns once the source is staged, before the DMA
                # ends; the kernels that read this buffer run on non-blocking streams, not ordered
                # after the legacy one: wait for it, as the synchronous memsets and copies here do
                st = cydriver.cuMemcpyHtoD(self.ptr + offset, &src[0], n)
                if st == cydriver.CUDA_SUCCESS:
                    st = cydriver.cuStreamSynchronize(NULL)
            else:
                st = cydriver.cuMemcpyHtoDAsync(self.ptr + offset, &src[0], n, s)
        _check(st, "cuMemcpyHtoD")

    def copy_to_host(self, out, Stream stream=None, size_t offset=0):
        """Copy ``len(out)`` bytes from ``offset`` into the writable host buffer ``out``."""
        cdef unsigned char[::1] dst
        cdef size_t n
        cdef cydriver.CUresult st
        mv = memoryview(out)
        if mv.nbytes == 0:
            return out
        dst = mv.cast("B")
        n = dst.shape[0]
        cdef cydriver.CUstream s = _stream_handle(stream)
        if offset + n > self.nbytes:
            raise ValueError(f"copy of {n} bytes at offset {offset} overflows a device buffer of {self.nbytes} bytes")
        if n == 0:
            return out
        self.device.activate()
        with nogil:
            if stream is None:
                st = cydriver.cuMemcpyDtoH(&dst[0], self.ptr + offset, n)
            else:
                st = cydriver.cuMemcpyDtoHAsync(&dst[0], self.ptr + offset, n, s)
        _check(st, "cuMemcpyDtoH")
        return out

    def copy_from_device(self, DeviceBuffer src, nbytes=None, Stream stream=None,
                         size_t dst_offset=0, size_t src_offset=0):
        """Device-to-device copy (peer copy when ``src`` lives on another device).

        ``nbytes=None`` copies the rest of ``src`` from ``src_offset``; 0 copies nothing.
        """
        cdef cydriver.CUresult st
        cdef cydriver.CUstream s = _stream_handle(stream)
        cdef size_t n
        if nbytes is None:
            nbytes = src.nbytes - src_offset
        n = nbytes
        if n == 0:
            return
        if dst_offset + n > self.nbytes or src_offset + n > src.nbytes:
            raise ValueError("device-to-device copy out of bounds")
        self.device.activate()
        with nogil:
            st = cydriver.cuMemcpyAsync(self.ptr + dst_offset, src.ptr + src_offset, n, s)
            if stream is None and st == cydriver.CUDA_SUCCESS:
                st = cydriver.cuStreamSynchronize(NULL)
        _check(st, "cuMemcpyAsync")

    def memset32(self, uint32_t value, Stream stream=None):
        """Fill with a 32-bit pattern (e.g. a NaN bit pattern to poison outputs)."""
        cdef cydriver.CUresult st
        cdef cydriver.CUstream s = _stream_handle(stream)
        self.device.activate()
        with nogil:
            st = cydriver.cuMemsetD32Async(self.ptr, value, self.nbytes // 4, s)
            if stream is None and st == cydriver.CUDA_SUCCESS:
                st = cydriver.cuStreamSynchronize(NULL)
        _check(st, "cuMemsetD32")

    def zero(self, Stream stream=None):
        cdef cydriver.CUresult st
        cdef cydriver.CUstream s = _stream_handle(stream)
        self.device.activate()
        with nogil:
            st = cydriver.cuMemsetD8Async(self.ptr, 0, self.nbytes, s)
            if stream is None and st == cydriver.CUDA_SUCCESS:
                st = cydriver.cuStreamSynchronize(NULL)
        _check(st, "cuMemsetD8")

    def to_host(self, dtype=None, shape=None):
        """A new NumPy array with this buffer's contents (synchronous)."""
        dtype = np.dtype(dtype if dtype is not None else (self.dtype if self.dtype is not None else np.uint8))
        if shape is None:
            shape = self.shape if self.shape is not None else (self.nbytes // dtype.itemsize,)
        out = np.empty(shape, dtype=dtype)
        if out.nbytes > self.nbytes:
            raise ValueError(f"shape {shape} of {dtype} needs {out.nbytes} bytes; buffer has {self.nbytes}")
        self.copy_to_host(out)
        return out

    def __repr__(self):
        return f"<DeviceBuffer {self.nbytes} bytes on device {self.device.ordinal} dtype={self.dtype} shape={self.shape}>"


cdef class PinnedBuffer:
    """Page-locked host memory (for asynchronous copies); exposes the buffer protocol.

    ``mapped``: also map it into the devices' address space, so that kernels read and write it
    directly (over the host link, for flags shared with a running kernel); see device_pointer.
    """

    cdef void* ptr
    cdef readonly size_t nbytes
    cdef readonly bint mapped

    def __cinit__(self, size_t nbytes, bint mapped=False):
        cdef cydriver.CUresult st
        cdef unsigned int flags = cydriver.CU_MEMHOSTALLOC_PORTABLE
        self.ptr = NULL
        self.nbytes = nbytes
        self.mapped = mapped
        if mapped:
            flags |= cydriver.CU_MEMHOSTALLOC_DEVICEMAP
        init()
        if nbytes:
            with nogil:
                st = cydriver.cuMemHostAlloc(&self.ptr, nbytes, flags)
            _check(st, "cuMemHostAlloc")

    def device_pointer(self, Device device not None):
        """This memory's address in kernels on ``device`` (a mapped buffer only)."""
        cdef cydriver.CUdeviceptr p = 0
        if not self.mapped or self.ptr == NULL:
            raise ValueError("device_pointer needs a non-empty PinnedBuffer created with mapped=True")
        device.activate()
        _check(cydriver.cuMemHostGetDevicePointer(&p, self.ptr, 0), "cuMemHostGetDevicePointer")
        return <uintptr_t>p

    def __dealloc__(self):
        if self.ptr != NULL:
            with nogil:
                cydriver.cuMemFreeHost(self.ptr)

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.ptr, self.nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def array(self, dtype, shape=None):
        """A NumPy view of this memory (keeps the buffer alive)."""
        a = np.frombuffer(self, dtype=dtype)
        return a if shape is None else a[: int(np.prod(shape))].reshape(shape)


# --------------------------------------------------------------------------- streams, events


cdef inline cydriver.CUstream _stream_handle(Stream stream):
    if stream is None:
        return <cydriver.CUstream>NULL
    return stream.s


@cython.no_gc_clear
cdef class Stream:
    cdef cydriver.CUstream s
    cdef readonly Device device

    def __cinit__(self, Device device not None):
        self.device = device
        self.s = NULL
        device.activate()
        _check(cydriver.cuStreamCreate(&self.s, cydriver.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def __dealloc__(self):
        if self.s != NULL:
            with nogil:
                cydriver.cuStreamDestroy(self.s)

    def synchronize(self):
        cdef cydriver.CUresult st
        with nogil:
            st = cydriver.cuStreamSynchronize(self.s)
        _check(st, "cuStreamSynchronize")

    def wait_event(self, Event event):
        _check(cydriver.cuStreamWaitEvent(self.s, event.e, 0), "cuStreamWaitEvent")

    def query(self):
        """True when all work on the stream has finished."""
        st = cydriver.cuStreamQuery(self.s)
        if st == cydriver.CUDA_ERROR_NOT_READY:
            return False
        _check(st, "cuStreamQuery")
        return True

    @property
    def handle(self):
        return <uintptr_t>self.s


@cython.no_gc_clear
cdef class Event:
    cdef cydriver.CUevent e
    cdef readonly Device device

    def __cinit__(self, Device device not None, bint timing=True):
        self.device = device
        self.e = NULL
        device.activate()
        _check(cydriver.cuEventCreate(&self.e, cydriver.CU_EVENT_DEFAULT if timing
                                      else cydriver.CU_EVENT_DISABLE_TIMING), "cuEventCreate")

    def __dealloc__(self):
        if self.e != NULL:
            cydriver.cuEventDestroy(self.e)

    def record(self, Stream stream=None):
        # with no stream the legacy default stream of the *current* context is meant: make it ours
        self.device.activate()
        _check(cydriver.cuEventRecord(self.e, _stream_handle(stream)), "cuEventRecord")

    def synchronize(self):
        cdef cydriver.CUresult st
        with nogil:
            st = cydriver.cuEventSynchronize(self.e)
        _check(st, "cuEventSynchronize")

    def query(self):
        """True when the work recorded before this event has finished."""
        st = cydriver.cuEventQuery(self.e)
        if st == cydriver.CUDA_ERROR_NOT_READY:
            return False
        _check(st, "cuEventQuery")
        return True

    def elapsed_ms(self, Event end):
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        cdef float ms = 0
        end.synchronize()
        _check(cydriver.cuEventElapsedTime(&ms, self.e, end.e), "cuEventElapsedTime")
        return ms


# --------------------------------------------------------------------------- launch

cdef enum:
    MAX_ARGS = 128  # the gradient solver passes ~60; parameter space (4 KiB) allows far more

cdef object _np_int32 = np.int32
cdef object _np_uint32 = np.uint32
cdef object _np_int64 = np.int64
cdef object _np_uint64 = np.uint64
cdef object _np_float32 = np.float32
cdef object _np_float64 = np.float64


def launch(Function fn, grid, block, args, unsigned int shared_mem=0, Stream stream=None):
    """Launch ``fn`` with ``grid``/``block`` (int or up to 3-tuple) on ``stream``.

    ``args`` is a sequence of kernel arguments, each a :class:`DeviceBuffer` (passed as
    its device pointer), ``None`` (a null pointer) or a NumPy scalar of type int32,
    uint32, int64, uint64, float32 or float64: plain Python numbers are refused because
    their C type would be a guess.
    """
    cdef uint64_t storage[MAX_ARGS]
    cdef void* params[MAX_ARGS]
    cdef unsigned int g[3]
    cdef unsigned int b[3]
    cdef Py_ssize_t i, n = len(args)
    cdef cydriver.CUresult st
    cdef cydriver.CUstream s = _stream_handle(stream)
    cdef int32_t v_i32
    cdef uint32_t v_u32
    cdef int64_t v_i64
    cdef float v_f32
    cdef double v_f64
    if n > MAX_ARGS:
        raise ValueError(f"at most {MAX_ARGS} kernel arguments, got {n}")
    _dims(grid, g, "grid")
    _dims(block, b, "block")
    for i in range(n):
        a = args[i]
        params[i] = &storage[i]
        if isinstance(a, DeviceBuffer):
            storage[i] = <uint64_t>(<DeviceBuffer>a).ptr
        elif a is None:
            storage[i] = 0
        else:
            t = type(a)
            if t is _np_int32:
                v_i32 = a
                memcpy(&storage[i], &v_i32, 4)
            elif t is _np_uint32:
                v_u32 = a
                memcpy(&storage[i], &v_u32, 4)
            elif t is _np_int64:
                v_i64 = a
                memcpy(&storage[i], &v_i64, 8)
            elif t is _np_uint64:
                storage[i] = <uint64_t>a
            elif t is _np_float32:
                v_f32 = a
                memcpy(&storage[i], &v_f32, 4)
            elif t is _np_float64:
                v_f64 = a
                memcpy(&storage[i], &v_f64, 8)
            else:
                raise TypeError(f"kernel {fn.name}: argument {i} has type {t.__name__}; pass a DeviceBuffer "
                                "or a NumPy scalar (np.int32, np.int64, np.float32, ...)")
    fn.device.activate()
    with nogil:
        st = cydriver.cuLaunchKernel(fn.f, g[0], g[1], g[2], b[0], b[1], b[2], shared_mem, s, params, NULL)
    _check(st, f"cuLaunchKernel({fn.name})")


cdef int _dims(object v, unsigned int* out, str what) except -1:
    out[0] = out[1] = out[2] = 1
    if isinstance(v, (tuple, list)):
        if not 1 <= len(v) <= 3:
            raise ValueError(f"{what} must have 1 to 3 dimensions")
        for k, x in enumerate(v):
            if x < 1:
                raise ValueError(f"{what} dimension {k} must be >= 1, got {x}")
            out[k] = x
    else:
        if v < 1:
            raise ValueError(f"{what} must be >= 1, got {v}")
        out[0] = v
    return 0


# --------------------------------------------------------------------------- staged copies

cdef cydriver.CUresult _lane_copy(cydriver.CUdeviceptr dst, unsigned char* data, size_t lo, size_t hi,
                                   size_t size, void** chunks, cydriver.CUevent* done, cydriver.CUstream stream,
                                   bint upload) noexcept nogil:
    """One lane's bytes ``[lo, hi)``: the memcpy of one pinned chunk runs while the other's DMA is
    in flight (``done[0]``/``done[1]`` mark them); returns when its last memcpy is done (an upload's
    last DMA may still be in flight on ``stream``)."""
    cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
    cdef size_t a = lo, b, pa = 0, pb = 0
    cdef int slot, i = 0
    while a < hi and st == cydriver.CUDA_SUCCESS:
        b, slot = min(a + size, hi), i % 2
        if upload:
            if i >= 2:  # the chunk's previous DMA has finished
                st = cydriver.cuEventSynchronize(done[slot])
            if st == cydriver.CUDA_SUCCESS:
                memcpy(chunks[slot], data + a, b - a)
                st = cydriver.cuMemcpyHtoDAsync(dst + a, chunks[slot], b - a, stream)
        else:
            st = cydriver.cuMemcpyDtoHAsync(chunks[slot], dst + a, b - a, stream)
        if st == cydriver.CUDA_SUCCESS:
            st = cydriver.cuEventRecord(done[slot], stream)
        if not upload and i >= 1 and st == cydriver.CUDA_SUCCESS:  # the chunk before this one is in
            st = cydriver.cuEventSynchronize(done[1 - slot])
            if st == cydriver.CUDA_SUCCESS:
                memcpy(data + pa, chunks[1 - slot], pb - pa)
        pa, pb, a, i = a, b, b, i + 1
    if not upload and i >= 1 and st == cydriver.CUDA_SUCCESS:
        st = cydriver.cuEventSynchronize(done[(i - 1) % 2])
        if st == cydriver.CUDA_SUCCESS:
            memcpy(data + pa, chunks[(i - 1) % 2], pb - pa)
    return st


def staged_copy(DeviceBuffer buf not None, size_t offset, host, list bounds, list lanes, bint upload):
    """The contiguous host buffer ``host`` to (``upload``) or from the device buffer ``buf`` at
    ``offset``, lane ``k`` of ``lanes`` moving bytes ``[bounds[k], bounds[k + 1])`` through its two
    pinned chunks on its stream (``lane.chunks``, ``lane.stream``, ``lane.done``).  The lanes run on
    a team of native threads, one each, in one call without the GIL: no lane waits for the
    interpreter to start.  Returns when every lane's last memcpy is done; raises the first error."""
    cdef Py_buffer view
    cdef int n = len(lanes), k, j
    cdef vector[void*] chunks
    cdef vector[cydriver.CUevent] done
    cdef vector[cydriver.CUstream] streams
    cdef vector[size_t] edges
    cdef vector[cydriver.CUresult] status
    cdef size_t size = <size_t>-1  # the smallest chunk of any lane
    if len(bounds) != n + 1:
        raise ValueError(f"staged copy: {n} lanes need {n + 1} bounds, got {len(bounds)}")
    chunks.resize(2 * n)
    done.resize(2 * n)
    streams.resize(n)
    edges.resize(n + 1)
    status.resize(n, cydriver.CUDA_SUCCESS)
    for k in range(n):
        lane = lanes[k]
        for j in range(2):
            chunks[2 * k + j] = (<PinnedBuffer>lane.chunks[j]).ptr
            done[2 * k + j] = (<Event>lane.done[j]).e
            size = min(size, (<PinnedBuffer>lane.chunks[j]).nbytes)
        streams[k] = (<Stream>lane.stream).s
    for k in range(n + 1):
        edges[k] = bounds[k]
    cdef cydriver.CUdeviceptr dst = buf.ptr + offset
    cdef cydriver.CUcontext ctx = buf.ctx
    cdef unsigned char* data
    PyObject_GetBuffer(host, &view, PyBUF_WRITABLE if not upload else PyBUF_SIMPLE)
    try:
        if n and (edges[n] > <size_t>view.len or offset + edges[n] > buf.nbytes):
            raise ValueError(f"staged copy of {edges[n]} bytes overflows its buffers")
        data = <unsigned char*>view.buf
        with nogil:
            for k in prange(n, num_threads=max(n, 1), schedule="static", chunksize=1, use_threads_if=n > 1):
                status[k] = cydriver.cuCtxSetCurrent(ctx)
                if status[k] == cydriver.CUDA_SUCCESS:
                    status[k] = _lane_copy(dst, data, edges[k], edges[k + 1], size, &chunks[2 * k], &done[2 * k],
                                           streams[k], upload)
    finally:
        PyBuffer_Release(&view)
    for k in range(n):
        _check(status[k], "cuMemcpyHtoDAsync" if upload else "cuMemcpyDtoHAsync")
