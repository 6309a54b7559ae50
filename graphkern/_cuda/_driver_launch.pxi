# Included by _driver.pyx (one extension module): kernel launches and the staged copies between
# pageable host memory and the device.

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
    its device pointer), ``None`` (a null pointer), a NumPy scalar of type int32, uint32,
    int64, uint64, float32 or float64 (plain Python numbers are refused because their C
    type would be a guess) or ``bytes``, a struct passed by value (a packed
    ``graphkern._cuda.runtime.Layout``).  The count and widths of the arguments are checked
    against the kernel's parameters: a caller out of step with the module gets a TypeError,
    never a launch that reads garbage.
    """
    cdef uint64_t storage[MAX_ARGS]
    cdef void* params[MAX_ARGS]
    cdef unsigned int g[3]
    cdef unsigned int b[3]
    cdef Py_ssize_t i, width, n = len(args)
    cdef tuple widths
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
    widths = fn._widths if fn._widths is not None else fn.parameter_widths
    if widths and n != len(widths):
        raise TypeError(f"kernel {fn.name} takes {len(widths)} arguments, got {n}")
    for i in range(n):
        a = args[i]
        params[i] = &storage[i]
        if isinstance(a, DeviceBuffer):
            storage[i] = <uint64_t>(<DeviceBuffer>a).ptr
            width = 8
        elif a is None:
            storage[i] = 0
            width = 8
        elif isinstance(a, bytes):
            params[i] = PyBytes_AS_STRING(a)
            width = PyBytes_GET_SIZE(a)
        else:
            t = type(a)
            width = 4
            if t is _np_int32:
                v_i32 = a
                memcpy(&storage[i], &v_i32, 4)
            elif t is _np_uint32:
                v_u32 = a
                memcpy(&storage[i], &v_u32, 4)
            elif t is _np_float32:
                v_f32 = a
                memcpy(&storage[i], &v_f32, 4)
            else:
                width = 8
                if t is _np_int64:
                    v_i64 = a
                    memcpy(&storage[i], &v_i64, 8)
                elif t is _np_uint64:
                    storage[i] = <uint64_t>a
                elif t is _np_float64:
                    v_f64 = a
                    memcpy(&storage[i], &v_f64, 8)
                else:
                    raise TypeError(f"kernel {fn.name}: argument {i} has type {t.__name__}; pass a DeviceBuffer, "
                                    "a NumPy scalar (np.int32, np.int64, np.float32, ...) or a packed struct")
        if widths and width != widths[i]:
            raise TypeError(f"kernel {fn.name}: argument {i} is {width} bytes wide where the kernel's parameter "
                            f"is {widths[i]}")
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
