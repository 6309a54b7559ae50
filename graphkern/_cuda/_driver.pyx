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
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer

import threading

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

# Freed buffers keep their memory for the next allocation of about their size: cuMemAlloc and
# cuMemFree map and unmap pages, and a call that allocates a dozen buffers would pay that every time
# (docs/performance.md, "Device memory between calls", has the costs).  A freed block may still be
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
    cdef object _load_lock
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
        self._load_lock = threading.Lock()
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
        """Load a cubin/fatbin/PTX image once per device; later calls return the cached module.  The
        load releases the GIL: a lock keeps two threads' first calls from loading it twice (the copy
        one of them kept would never be unloaded, and each copy's kernels have limits of their own)."""
        mod = self._modules.get(key)
        if mod is None:
            with self._load_lock:
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

    def global_bytes(self, str name):
        """The bytes of this module's global variable ``name`` (``__device__`` or ``__constant__``,
        declared ``extern "C"``), copied to the host on a stream of its own that waits for no other
        work (a copy on the legacy stream would wait for every kernel and copy in flight)."""
        cdef cydriver.CUdeviceptr ptr = 0
        cdef size_t size = 0
        cdef bytes bname = name.encode()
        cdef const char* cname = bname
        cdef cydriver.CUresult st, st2
        cdef cydriver.CUstream stream = NULL
        self.device.activate()
        with nogil:
            st = cydriver.cuModuleGetGlobal(&ptr, &size, self.mod, cname)
        if st == cydriver.CUDA_ERROR_NOT_FOUND:
            raise CudaError("CUDA_ERROR_NOT_FOUND", f"global {name!r} is not in module {self.key!r}",
                            <int>st, "cuModuleGetGlobal")
        _check(st, "cuModuleGetGlobal")
        out = bytearray(size)
        cdef unsigned char[::1] dst = out
        if size:
            _check(cydriver.cuStreamCreate(&stream, cydriver.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            with nogil:
                st = cydriver.cuMemcpyDtoHAsync(&dst[0], ptr, size, stream)
                if st == cydriver.CUDA_SUCCESS:
                    st = cydriver.cuStreamSynchronize(stream)
                st2 = cydriver.cuStreamDestroy(stream)
            _check(st, "cuMemcpyDtoHAsync")
            _check(st2, "cuStreamDestroy")
        return bytes(out)


cdef class Function:
    cdef cydriver.CUfunction f
    cdef readonly str name
    cdef readonly Device device
    cdef tuple _widths  # the bytes of each parameter, read on first launch (None: not yet)
    cdef int _max_dynamic  # the largest dynamic shared memory allowed so far (bytes)

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
        """Let launches of this kernel use up to ``nbytes`` of dynamic shared memory.  The limit only
        grows: threads launching the kernel with different sizes on one device share it, and a
        lowered limit would fail another thread's launch (CUDA_ERROR_INVALID_VALUE).  The check and
        the update run with the GIL held and nothing between them that could release it."""
        cdef cydriver.CUresult st
        self.device.activate()
        if nbytes <= self._max_dynamic:
            return
        st = cydriver.cuFuncSetAttribute(self.f, cydriver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        if st == cydriver.CUDA_SUCCESS:
            self._max_dynamic = nbytes
        _check(st, "cuFuncSetAttribute")

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

    @property
    def parameter_widths(self):
        """The bytes of each of the kernel's parameters, in order, as the module declares them
        (``cuFuncGetParamInfo``); ``()`` where the driver cannot say."""
        cdef size_t i = 0, offset = 0, size = 0
        cdef cydriver.CUresult st
        if self._widths is None:
            widths = []
            self.device.activate()
            while True:
                st = cydriver.cuFuncGetParamInfo(self.f, i, &offset, &size)
                if st == cydriver.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                    break
                if st == cydriver.CUDA_ERROR_NOT_SUPPORTED:  # a driver older than the query
                    widths = []
                    break
                _check(st, f"cuFuncGetParamInfo({self.name})")
                widths.append(size)
                i += 1
            self._widths = tuple(widths)
        return self._widths

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


# --------------------------------------------------------------------------- launch, staged copies

include "_driver_launch.pxi"
