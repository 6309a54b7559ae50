"""Python face of the CUDA runtime layer: availability, devices, packaged kernels.

Capabilities use only this module (never the driver directly)::

    from graphkern._cuda import runtime as rt
    dev = rt.get_device(0)
    fn = rt.kernel(dev, "jaccard", "jaccard_merge_f32")   # cuda_src/jaccard.cu
    buf = rt.to_device(dev, array)
    rt.launch(fn, grid, block, (buf, np.int32(n)))

A machine without a driver, without a device, or a build without CUDA makes
:func:`gpu_available` False and :func:`require_gpu` raise
:class:`~graphkern.errors.GPUUnavailableError` with the reason.
"""

from __future__ import annotations

import math
import os
import queue
import struct
import threading
import types
from concurrent.futures import ThreadPoolExecutor, wait
from importlib import resources

import numpy as np

from graphkern.errors import CudaError, GPUUnavailableError, GraphTooLargeError

try:
    import graphkern._build_info as build_info
except ImportError:  # a source tree that was never built
    build_info = None

_lock = threading.RLock()
_state = {"checked": False, "reason": None}
_devices: dict[int, object] = {}
_images: dict[str, bytes] = {}

_driver = None
_driver_import_error = None


def _built_with_cuda():
    return build_info is not None and getattr(build_info, "CUDA_BUILT", False)


def _load_driver_module():
    """Import the compiled driver wrapper, checking the cuda-bindings pin first."""
    global _driver, _driver_import_error
    if _driver is not None or _driver_import_error is not None:
        return _driver
    if not _built_with_cuda():
        why = getattr(build_info, "CUDA_SKIP_REASON", "no build information (the package was never compiled)")
        _driver_import_error = f"built without CUDA: {why}"
        return None
    want = build_info.CUDA_HEADER_VERSION  # "13.0"
    try:
        from cuda.bindings import __version__ as have
    except ImportError:
        _driver_import_error = (f"cuda-bindings is not installed; graphkern was built against CUDA {want} headers: "
                                f"pip install 'graphkern[cuda]' (brings cuda-bindings=={want}.*)")
        return None
    if ".".join(have.split(".")[:2]) != want:
        _driver_import_error = (f"cuda-bindings {have} is installed but graphkern was built against CUDA {want} "
                                f"headers: pip install 'graphkern[cuda]' (brings cuda-bindings=={want}.*)")
        return None
    try:
        from graphkern._cuda import _driver as drv
    except ImportError as exc:  # pragma: no cover - depends on the install
        _driver_import_error = f"the compiled CUDA layer failed to import ({exc}); reinstall graphkern"
        return None
    _driver = drv
    return drv


def unavailable_reason():
    """Why the GPU cannot be used, or None when it can."""
    with _lock:
        if _state["checked"]:
            return _state["reason"]
        reason = None
        drv = _load_driver_module()
        if drv is None:
            reason = _driver_import_error
        else:
            try:
                drv.init()
                if drv.device_count() == 0:
                    reason = "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
            except RuntimeError as exc:  # cuda-bindings raises this when libcuda.so.1 cannot be loaded
                reason = (f"the CUDA driver failed to initialise: {exc}" if isinstance(exc, CudaError)
                          else f"no NVIDIA driver: {exc}")
        _state.update(checked=True, reason=reason)
        return reason


def gpu_available():
    """True when the package was built with CUDA and a device with a driver is present."""
    return unavailable_reason() is None


def require_gpu():
    reason = unavailable_reason()
    if reason is not None:
        raise GPUUnavailableError(f"a GPU was requested but cannot be used: {reason}")
    return _driver


def device_count():
    return 0 if not gpu_available() else _driver.device_count()


def get_device(ordinal=0):
    """The :class:`Device` (primary context retained once per process) for ``ordinal``."""
    drv = require_gpu()
    ordinal = int(ordinal)
    with _lock:
        dev = _devices.get(ordinal)
        if dev is None:
            dev = _devices[ordinal] = drv.Device(ordinal)
            _warm_staging(dev)
        return dev


def devices_info():
    """Properties of every visible device (empty when no GPU is usable)."""
    if not gpu_available():
        return []
    return [get_device(i).properties for i in range(device_count())]


def _module_image(name):
    img = _images.get(name)
    if img is None:
        path = resources.files("graphkern._cuda").joinpath("kernels", f"{name}.fatbin")
        try:
            img = _images[name] = path.read_bytes()
        except FileNotFoundError:
            raise GPUUnavailableError(f"kernel module {name!r} was not built (no {name}.fatbin in the package); "
                                      "rebuild graphkern with a CUDA toolkit") from None
    return img


def kernel(device, module, name):
    """The kernel ``name`` from the packaged ``cuda_src/<module>.cu``, loaded once per device."""
    mod = device.load_module(module, _module_image(module))
    return mod.function(name)


# a row of a module's export table (cuda_src/common/exports.cuh: gk::ExportRow)
_EXPORT_ROW = np.dtype([("name", "S40"), ("value", "<i8")])
_exports: dict[str, types.SimpleNamespace] = {}
# the ``agree`` mappings found in agreement, by (module, id): held, so that no other takes their ids
_agreed: dict[tuple[str, int], dict] = {}


def exports(device, module, agree=None):
    """The sizes and limits ``cuda_src/<module>.cu`` exports to its callers (its ``graphkern_exports``
    table) as attributes, ``rt.exports(dev, "mgk_csr").threads``: read from the image loaded on
    ``device`` once per process (every device loads the same image), so launch code never restates
    them.  ``agree``: what planning done without a device holds (name -> value), checked against the
    table once per mapping; a RuntimeError names any value that differs (a build whose kernels and
    Python disagree would otherwise size its launches wrongly)."""
    table = _exports.get(module)
    if table is None:
        raw = device.load_module(module, _module_image(module)).global_bytes("graphkern_exports")
        rows = np.frombuffer(raw, _EXPORT_ROW)
        table = _exports[module] = types.SimpleNamespace(**{r["name"].decode(): int(r["value"]) for r in rows})
    if agree is not None and (module, id(agree)) not in _agreed:
        wrong = [f"{name} = {getattr(table, name, 'nothing')} (graphkern plans with {value})"
                 for name, value in agree.items() if getattr(table, name, None) != value]
        if wrong:
            raise RuntimeError(f"the kernels of cuda_src/{module}.cu do not match graphkern's Python: they export "
                               + ", ".join(wrong) + "; rebuild graphkern from one source tree")
        _agreed[module, id(agree)] = agree
    return table


class Packed(bytes):
    """A struct argument's bytes, as a launch passes them by value; ``fields`` holds the values they
    were packed from (by field name)."""

    fields: dict


class Layout:
    """A struct parameter of a module's kernels as the module lays it out: its export rows ``<name>``
    (the size) and ``<name>.<field>`` (offset, width and C kind, cuda_src/common/exports.cuh).
    ``pack(field=value, ...)`` writes every field where the kernel reads it, so the host never
    restates a device struct; a pointer takes a DeviceBuffer, None or an address as np.uint64 (as
    :func:`launch` does), an integer an int, a floating-point field a number."""

    # (kind, width) -> struct code; kinds as cuda_src/common/exports.cuh numbers them
    _CODES = {(0, 8): "Q", (1, 4): "i", (1, 8): "q", (2, 4): "I", (2, 8): "Q", (3, 4): "f", (3, 8): "d"}

    def __init__(self, module, name, size, fields):
        """``fields``: field name -> (offset, width, kind)."""
        self.name, self.size = f"{module}:{name}", size
        self.fields = tuple(sorted(fields, key=lambda f: fields[f][0]))
        if not self.fields:
            raise RuntimeError(f"cuda_src/{module}.cu exports no struct {name}")
        self._names = frozenset(self.fields)
        self._pointer_slots = tuple((i, f) for i, f in enumerate(self.fields) if fields[f][2] == 0)
        fmt, pos, self._codes, types = ["<"], 0, {}, []
        for f in self.fields:
            offset, width, kind = fields[f]
            code = self._CODES.get((kind, width))
            if code is None or offset < pos:
                raise RuntimeError(f"{self.name}.{f}: a field of kind {kind}, {width} bytes at offset {offset}, "
                                   "is not one a launch can write")
            fmt.append(f"{offset - pos}x{code}" if offset > pos else code)
            types.append("<" + np.dtype(code).str[1:])
            pos = offset + width
            if kind != 0:
                self._codes[f] = code
        fmt.append(f"{size - pos}x" if size > pos else "")
        self._struct = struct.Struct("".join(fmt))
        assert self._struct.size == size
        # the same layout as a NumPy record, for many structs at once (pack_rows)
        self._record = np.dtype({"names": list(self.fields), "formats": types,
                                 "offsets": [fields[f][0] for f in self.fields], "itemsize": size})

    def pack(self, **values):
        if values.keys() != self._names:
            missing = [f for f in self.fields if f not in values]
            unknown = [f for f in values if f not in self._names]
            raise TypeError(f"{self.name}: " + "; ".join(
                part for part in (missing and f"missing {', '.join(missing)}",
                                  unknown and f"no field {', '.join(unknown)}") if part))
        try:
            row = [values[f] for f in self.fields]
            for i, f in self._pointer_slots:  # inline: a launch packs several structs a step
                v = row[i]
                if v is None:
                    row[i] = 0
                elif type(v) is np.uint64:  # an address already (mapped host memory's device pointer)
                    row[i] = int(v)
                else:
                    try:
                        row[i] = v.ptr
                    except AttributeError:
                        raise TypeError(f"{self.name}.{f} is a device pointer: pass a device buffer, None or an "
                                        f"np.uint64 address, not {type(v).__name__}") from None
            data = Packed(self._struct.pack(*row))
        except (struct.error, OverflowError):
            for f, code in self._codes.items():  # name the field
                try:
                    struct.pack("<" + code, values[f])
                except struct.error as e:
                    raise TypeError(f"{self.name}.{f} = {values[f]!r}: {e}") from None
                except OverflowError as e:  # a float beyond the field's precision
                    raise ValueError(f"{self.name}.{f} = {values[f]!r}: {e}") from None
            raise
        data.fields = values
        return data

    def pack_rows(self, count, /, **values):
        """``count`` structs, as a list of their bytes (each one launch argument): a field's value is
        an array of ``count`` values or one value for every struct (a field may be named ``count``);
        a pointer field takes a device buffer, None, an address or an array of them (np.uint64).
        One pass of NumPy for all of them, where :meth:`pack` costs microseconds a struct."""
        if values.keys() != self._names:
            self.pack(**values)  # raises, naming the missing and unknown fields
        rows = np.zeros(count, self._record)
        for i, f in self._pointer_slots:
            v = values[f]
            rows[f] = 0 if v is None else v if isinstance(v, (np.ndarray, np.uint64)) else v.ptr
        for f in self._codes:
            rows[f] = values[f]
        blob, size = rows.tobytes(), self.size
        return [blob[k:k + size] for k in range(0, count * size, size)]


_layouts: dict[tuple[str, str], Layout] = {}


def precision(dtype):
    """The suffix of the kernels and struct layouts made for values of ``dtype``: "f32" or "f64"."""
    return "f32" if np.dtype(dtype) == np.float32 else "f64"


def layout(device, module, name):
    """The :class:`Layout` of struct ``name`` that ``cuda_src/<module>.cu`` exports, read once per
    process."""
    key = module, name
    found = _layouts.get(key)
    if found is None:
        table = vars(exports(device, module))
        prefix = name + "."
        fields = {k[len(prefix):]: (v & 0xFFFFFFFF, (v >> 32) & 0xFFFF, v >> 48)
                  for k, v in table.items() if k.startswith(prefix)}
        if name not in table:
            raise RuntimeError(f"cuda_src/{module}.cu exports no struct {name}")
        found = _layouts[key] = Layout(module, name, table[name], fields)
    return found


def launch(fn, grid, block, args, shared_mem=0, stream=None):
    _driver.launch(fn, grid, block, args, shared_mem, stream)


def alloc(device, shape, dtype):
    """An uninitialised device array of ``shape`` and ``dtype``."""
    dtype = np.dtype(dtype)
    shape = tuple(np.atleast_1d(shape).tolist()) if not isinstance(shape, tuple) else shape
    nbytes = math.prod(map(int, shape)) * dtype.itemsize  # exact: a NumPy product could wrap
    return _driver.DeviceBuffer(device, nbytes, dtype=dtype, shape=shape)


def release_cached(device=None):
    """Give the device memory of freed buffers, which this process keeps for its next allocations
    (graphkern._cuda._driver), back to the driver: on ``device`` (an ordinal), or on every device
    opened when None.  Returns the bytes given back."""
    with _lock:
        devices = list(_devices.values()) if device is None else [_devices.get(int(device))]
    given = 0
    for dev in devices:
        if dev is not None:
            given += _driver.cached_bytes(dev)
            _driver.release_cached(dev)
    return given


def to_device(device, array, stream=None, dtype=None):
    """Copy a host array to a new device buffer annotated with its dtype and shape (without a
    stream, a large array goes through pinned staging: :func:`copy_from_pageable`)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    buf = alloc(device, array.shape, array.dtype)
    if stream is None and array.nbytes >= STAGED_MIN_UPLOAD_BYTES:
        copy_from_pageable(buf, array)
    else:
        buf.copy_from_host(array, stream)
    return buf


def check_fits(device, nbytes, what):
    """Raise GraphTooLargeError naming ``what`` when ``nbytes`` cannot fit in the free device memory."""
    free, total = device.memory_info()
    if nbytes > free:
        raise GraphTooLargeError(
            f"{what} needs {nbytes / 2**30:.2f} GiB on device {device.ordinal} "
            f"({device.properties['name']}) but only {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB is free")


def Stream(device):
    return _driver.Stream(device)


def Event(device, timing=True):
    return _driver.Event(device, timing)


def hold_stream(stream, seconds):
    """Keep ``stream`` busy for ``seconds`` on the device (work enqueued after it waits)."""
    fn = kernel(stream.device, "timing", "hold_stream")
    launch(fn, 1, 1, (np.uint64(max(0, int(seconds * 1e9))),), stream=stream)


def PinnedBuffer(nbytes, mapped=False):
    require_gpu()
    return _driver.PinnedBuffer(int(nbytes), bool(mapped))


# Large copies between a device and pageable host memory go through page-locked staging chunks on
# several host threads: the driver's own staging of a pageable copy runs at a few GB/s, paced by one
# host thread's memcpy and the first touch of the destination's pages, and both spread over threads:
# one per core, up to STAGING_THREADS_MAX (docs/performance.md has the rates).  Each thread is a
# lane: two pinned chunks, a stream and two events, so its memcpy of one chunk runs while the DMA of
# the other is in flight; the lanes run on a team of native threads in one compiled call without the
# GIL (_driver.staged_copy), so a copy started beside busy Python threads does not wait for them.
# Small chunks keep the link busy; page-locking memory costs far more per byte than copying it, so
# the lanes are made once, in the background when the device is opened, and shared: at most
# STAGING_LANES_MAX per device (a copy beside one that holds them all waits for them, on the same
# link anyway).
STAGING_CHUNK = 1 << 20
# smaller copies go directly: below these sizes the lanes cost as much as the driver's own copy (about
# 2 MB out of the device, 4 MB into it; docs/performance.md)
STAGED_MIN_BYTES = 2 << 20
STAGED_MIN_UPLOAD_BYTES = 4 << 20
STAGING_THREADS_MAX = 16
STAGING_THREADS = max(1, min(STAGING_THREADS_MAX, os.cpu_count() or 1))
STAGING_LANES_MAX = STAGING_THREADS_MAX
_staging = {"free": {}, "made": 0, "lanes": {}, "pool": None}
_warming = {}  # device ordinal -> the future of its first lanes (made in the background)


class _Lane:
    """One staging thread's pinned double buffer, its stream and the events of its two chunks."""

    def __init__(self, device):
        self.chunks = [_driver.PinnedBuffer(STAGING_CHUNK, False) for _ in range(2)]
        self.stream = _driver.Stream(device)
        self.done = [_driver.Event(device, False), _driver.Event(device, False)]


def _staging_pool():
    with _lock:
        if _staging["pool"] is None:
            _staging["pool"] = ThreadPoolExecutor(max_workers=4,
                                                  thread_name_prefix="graphkern-staging")
        return _staging["pool"]


def _warm_staging(device):
    """Make STAGING_THREADS lanes of ``device`` on a background thread (a first copy waits for them);
    a failure there leaves the lanes to be made, and the error raised, by the copy."""
    def make():
        device.activate()
        lanes = _take_lanes(device, STAGING_THREADS, wait_warm=False)
        for lane in lanes:
            _staging["free"][device.ordinal].put(lane)

    with _lock:
        if device.ordinal not in _warming:
            _warming[device.ordinal] = _staging_pool().submit(make)


def _take_lanes(device, want, wait_warm=True):
    """Up to ``want`` lanes of ``device``: free ones, new ones while fewer than STAGING_LANES_MAX
    exist, and at least one (waiting for a copy beside this one to return it)."""
    warming = _warming.get(device.ordinal) if wait_warm else None
    if warming is not None:
        wait([warming])
    with _lock:
        free = _staging["free"].setdefault(device.ordinal, queue.SimpleQueue())
    lanes = []
    while len(lanes) < want:
        try:
            lanes.append(free.get_nowait())
            continue
        except queue.Empty:
            pass
        with _lock:
            made = _staging["lanes"].get(device.ordinal, 0)
            if made < STAGING_LANES_MAX:
                _staging["lanes"][device.ordinal] = made + 1
                _staging["made"] += 1
        if made >= STAGING_LANES_MAX:
            if lanes:
                break
            lanes.append(free.get())
            continue
        try:
            lanes.append(_Lane(device))
        except BaseException:
            with _lock:
                _staging["lanes"][device.ordinal] -= 1
            raise
    return lanes


def _staged_copy(buf, flat, offset, upload, threads=STAGING_THREADS, started=None):
    """Copy the bytes ``flat`` of a contiguous host array into (``upload``) or out of the device
    buffer ``buf`` from byte ``offset``, synchronously; under STAGED_MIN_BYTES (STAGED_MIN_UPLOAD_BYTES
    for an upload) directly, else split into one contiguous part per lane (whole chunks), on up to
    ``threads`` native threads (:func:`_driver.staged_copy`; ``started``, a threading.Event, is set as
    they start).  Each lane's stream first waits for the work queued on the legacy stream (a copy is
    ordered after it, as the driver's synchronous copies are), and the lanes go back to the pool when
    every part has finished; the first error is raised."""
    if flat.nbytes < (STAGED_MIN_UPLOAD_BYTES if upload else STAGED_MIN_BYTES):
        if started is not None:
            started.set()
        (buf.copy_from_host if upload else buf.copy_to_host)(flat, offset=offset)
        return
    device, nbytes = buf.device, flat.nbytes
    threads = max(1, min(int(threads), STAGING_THREADS_MAX))
    device.activate()
    chunks = -(-nbytes // STAGING_CHUNK)
    lanes = _take_lanes(device, min(threads, chunks))
    per_lane = -(-chunks // len(lanes)) * STAGING_CHUNK
    bounds = list(range(0, nbytes, per_lane)) + [nbytes]
    errors = []
    try:
        legacy = _driver.Event(device, False)
        legacy.record()
        used = lanes[:len(bounds) - 1]
        for lane in used:
            lane.stream.wait_event(legacy)
        if started is not None:
            started.set()
        _driver.staged_copy(buf, offset, flat, bounds, used, upload)
    finally:
        for lane in lanes:  # every lane goes back, its copies finished (or its stream failed)
            try:
                lane.stream.synchronize()
            except CudaError as exc:
                errors.append(exc)
            _staging["free"][device.ordinal].put(lane)
    if errors:
        raise errors[0]


def copy_to_pageable(buf, out, offset=0, threads=STAGING_THREADS):
    """Copy ``out.nbytes`` bytes of the device buffer ``buf`` from byte ``offset`` into the contiguous
    host array ``out`` (pageable memory) through pinned chunks (:func:`_staged_copy`, each thread
    copying one chunk out while the next comes in); order it after the producing stream's work by
    synchronizing first."""
    _staged_copy(buf, out.reshape(-1).view(np.uint8), offset, False, threads)
    return out


def copy_from_pageable(buf, array, offset=0, started=None):
    """Copy the contiguous host array ``array`` (pageable memory) into the device buffer ``buf`` at
    byte ``offset`` through pinned chunks (:func:`_staged_copy`, each thread filling one chunk while
    the other crosses): the driver's own staging of a pageable upload runs at a few GB/s."""
    _staged_copy(buf, np.ascontiguousarray(array).reshape(-1).view(np.uint8), offset, True, started=started)
    return buf


def driver_version():
    return None if not gpu_available() else _driver.driver_version()


def build_summary():
    """What the installed package was built with (for headers and bug reports)."""
    if build_info is None:
        return {"cuda_built": False, "reason": "never compiled"}
    return {
        "cuda_built": _built_with_cuda(),
        "cuda_header_version": getattr(build_info, "CUDA_HEADER_VERSION", None),
        "cuda_archs": getattr(build_info, "CUDA_ARCHS", None),
        "nvcc": getattr(build_info, "NVCC_VERSION", None),
        "reason": getattr(build_info, "CUDA_SKIP_REASON", None),
    }


if os.environ.get("GRAPHKERN_DISABLE_GPU"):
    _state.update(checked=True, reason="disabled by GRAPHKERN_DISABLE_GPU")
